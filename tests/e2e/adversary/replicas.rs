//! Hub replicas on etcd with API tokens: what a follower answers itself,
//! and the CLI following its redirect to the leader.

use std::process::Command;
use std::time::Duration;

use axle_e2e::ha::EtcdCluster;
use axle_e2e::{HubProc, Ports, TempPolicy, bin, temp_dir, wait_until};

use crate::harness::{admin_token, call};

#[tokio::test(flavor = "multi_thread")]
async fn replicas_ask_for_a_token_and_the_cli_keeps_it_across_the_redirect() {
    let dir = temp_dir("axle-adversary-ha");
    let policy = TempPolicy::fixture(&["adversary"]);
    let etcd = EtcdCluster::start(1, dir.path());
    let store = etcd.store_url();
    let admin = admin_token(&["--store", &store]);
    let hubs: Vec<HubProc> = (0..2)
        .map(|i| {
            HubProc::start_with(
                policy.path(),
                &dir.path().join(format!("hub-{i}")),
                Ports::free(),
                vec![
                    "--store".into(),
                    store.clone(),
                    "--replica-id".into(),
                    format!("r{i}"),
                    "--auth".into(),
                    "tokens".into(),
                ],
            )
        })
        .collect();
    let urls: Vec<String> = hubs.iter().map(HubProc::http_url).collect();
    // Both answer /api/v1/hubs for the admin (a follower reads the token
    // from etcd), and one of them leads.
    let leader = wait_until(Duration::from_secs(40), "a replica to lead", || {
        let urls = urls.clone();
        let admin = admin.clone();
        async move {
            for (i, u) in urls.iter().enumerate() {
                let (status, v) =
                    call(u, Some(&admin), reqwest::Method::GET, "/api/v1/hubs", None).await;
                if status == 200 && v["answered_by"] == v["leader"] {
                    return Ok(i);
                }
            }
            Err("no leader yet".to_string())
        }
    })
    .await;
    let follower = 1 - leader;
    // Observed: `/api/v1/hubs` answered without a token on etcd replicas.
    for u in &urls {
        let (status, v) = call(u, None, reqwest::Method::GET, "/api/v1/hubs", None).await;
        assert_eq!(status, 401, "{u}: {v}");
    }
    let (status, v) = call(
        &urls[follower],
        Some(&admin),
        reqwest::Method::GET,
        "/api/v1/hubs",
        None,
    )
    .await;
    assert_eq!(status, 200, "the follower answers the admin: {v}");
    // Observed: `axle --hub follower,leader get workloads` failed with "no
    // credentials": following the follower's 307 to the leader's port
    // dropped Authorization.
    let out = Command::new(bin("axle"))
        .args([
            "--hub",
            &format!("{},{}", urls[follower], urls[leader]),
            "get",
            "workloads",
        ])
        .env("AXLE_TOKEN", &admin)
        .env("HOME", dir.path())
        .env_remove("AXLE_HUB")
        .env("NO_COLOR", "1")
        .output()
        .expect("axle runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "adversary: replicas on etcd: /api/v1/hubs without a token 401 on 2 of 2; the CLI \
         kept its token across the follower's redirect"
    );
    drop(hubs);
    drop(etcd);
}
