//! A spoke's certificate rotates before it expires without dropping its work: an
//! in-process hub issues spoke certificates that live 4 s, an in-process spoke joins
//! with a join token and runs a workload, and over three certificate lives the spoke
//! renews again and again (two thirds into each) while the workload keeps running in
//! the same epoch and the cluster stays Ready.

use std::time::Duration;

use axle_e2e::{bin, install_crypto};
use axle_hub::server::{CaSource, Listeners, SpokeMtls};
use axle_spoke_agent::{RunOptions, SpokeConfig, discover_gpus};
use serde_json::{Value, json};

/// Short enough to see several renewals in a test; a real hub's default is 30 days.
const CERT_TTL_MS: u64 = 4_000;

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = http.request(method, url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    match req.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.json().await.unwrap_or(Value::Null))
        }
        Err(e) => (0, Value::String(format!("{e:?}"))),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoke_renews_its_certificate_and_its_workload_keeps_running() {
    install_crypto();
    let dir = tempfile::tempdir().unwrap();
    let hub_dir = dir.path().join("hub");
    let policy = axle_hub::dev::example_policy().unwrap();
    let region = policy.clusters["eu-1"].region.clone();
    let mut listeners = Listeners::bind(
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    listeners.spoke_mtls = Some(SpokeMtls {
        ca: CaSource::Store,
        names: vec!["127.0.0.1".into()],
        cert_ttl_ms: CERT_TTL_MS,
    });
    let (http_addr, grpc_addr) = (
        listeners.http.local_addr().unwrap(),
        listeners.grpc.local_addr().unwrap(),
    );
    let (stop_hub, hub_stopped) = tokio::sync::oneshot::channel::<()>();
    let hub_run = tokio::spawn(axle_hub::server::run(
        hub_dir.clone(),
        policy,
        None,
        listeners,
        async move {
            let _ = hub_stopped.await;
        },
    ));

    // HTTPS trusting the CA the hub wrote.
    let ca_file = hub_dir.join(axle_hub::server::CA_CERT_FILE);
    let mut ca = Vec::new();
    for _ in 0..200 {
        ca = std::fs::read(&ca_file).unwrap_or_default();
        if !ca.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    let api = format!("https://127.0.0.1:{}", http_addr.port());
    let (status, v) = call(
        &http,
        reqwest::Method::POST,
        &format!("{api}/api/v1/clusters/eu-1/join-tokens"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let token = v["token"].as_str().unwrap().to_string();

    let spoke_dir = dir.path().join("spoke");
    let config = SpokeConfig {
        hub_url: format!("https://127.0.0.1:{}", grpc_addr.port()),
        cluster: "eu-1".into(),
        region,
        labels: Default::default(),
        nodes: discover_gpus(&["8xH100:80GB".to_string()], &[]).unwrap(),
        data_dir: spoke_dir.clone(),
        token: None,
        hub_ca_pem: None,
        join_token: Some(token),
        spot_notices: None,
        driver: Default::default(),
    };
    let (stop_spoke, spoke_stopped) = tokio::sync::oneshot::channel::<()>();
    let spoke = tokio::spawn(axle_spoke_agent::run_with(
        config,
        RunOptions {
            shim_exe: Some(bin("axle-spoke")),
        },
        async move {
            let _ = spoke_stopped.await;
        },
    ));

    let (status, v) = call(
        &http,
        reqwest::Method::POST,
        &format!("{api}/api/v1/workloads"),
        Some(json!({"team": "nlp", "name": "long", "gpus": 1, "command": ["sleep", "60"]})),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_u64().unwrap();
    let workload = |http: reqwest::Client, api: String| async move {
        call(
            &http,
            reqwest::Method::GET,
            &format!("{api}/api/v1/workloads/{id}"),
            None,
        )
        .await
        .1
    };
    let mut running = Value::Null;
    for _ in 0..300 {
        running = workload(http.clone(), api.clone()).await;
        if running["state"] == "Running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(running["state"], "Running", "{running}");
    let epoch = running["epoch"].clone();
    let first = std::fs::read_to_string(spoke_dir.join("identity/identity.json")).unwrap();

    // Three certificate lives: the first certificate is long expired by the end.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(3 * CERT_TTL_MS);
    while tokio::time::Instant::now() < deadline {
        let w = workload(http.clone(), api.clone()).await;
        assert_eq!(w["state"], "Running", "the workload was disturbed: {w}");
        assert_eq!(w["epoch"], epoch, "the workload was placed again: {w}");
        let (_, clusters) = call(
            &http,
            reqwest::Method::GET,
            &format!("{api}/api/v1/clusters"),
            None,
        )
        .await;
        let eu1 = clusters
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "eu-1").cloned())
            .unwrap_or(Value::Null);
        assert_eq!(eu1["state"], "Ready", "{eu1}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (_, events) = call(
        &http,
        reqwest::Method::GET,
        &format!("{api}/api/v1/events"),
        None,
    )
    .await;
    let renewals = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "spoke_cert_renewed")
        .count();
    assert!(
        renewals >= 3,
        "{renewals} renewals in three certificate lives: {events}"
    );
    let last = std::fs::read_to_string(spoke_dir.join("identity/identity.json")).unwrap();
    assert_ne!(
        first, last,
        "the renewed certificate is kept in the data dir"
    );

    let _ = stop_spoke.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), spoke).await;
    let _ = stop_hub.send(());
    let _ = hub_run.await;
}
