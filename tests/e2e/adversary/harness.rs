//! What the adversary scenarios share: a hub on the suite's policy, users
//! with tokens, and a forged spoke that speaks gRPC by hand.

use std::process::Command;
use std::time::Duration;

use axle_e2e::{HubProc, Ports, TempPolicy, bin, temp_dir};
use axle_proto::pb;
use serde_json::{Value, json};

/// A hub on `tests/fixtures/adversary` with `extra` flags.
pub struct Hub {
    pub hub: HubProc,
    _dir: tempfile::TempDir,
    _policy: TempPolicy,
    /// The platform admin's token (`--auth tokens` only).
    pub admin: Option<String>,
    /// The hub's data dir (its spoke CA is `spoke-ca.pem` there).
    pub data: std::path::PathBuf,
    tls: bool,
}

impl Hub {
    /// Without authentication (`--auth none`).
    pub async fn open(extra: &[&str]) -> Hub {
        Self::start(false, extra).await
    }

    /// With API tokens; the platform admin's token is minted before start.
    pub async fn with_tokens(extra: &[&str]) -> Hub {
        Self::start(true, extra).await
    }

    /// With API tokens and the default TLS: spokes join with certificates
    /// from the hub's spoke CA.
    pub async fn with_tokens_tls() -> Hub {
        Self::start(true, &["--tls-san", "127.0.0.1"]).await
    }

    /// The CA clients trust on a TLS hub, PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.data.join("spoke-ca.pem")).expect("the hub wrote its CA")
    }

    async fn start(tokens: bool, extra: &[&str]) -> Hub {
        let dir = temp_dir("axle-adversary");
        let policy = TempPolicy::fixture(&["adversary"]);
        let data = dir.path().join("hub");
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let admin = tokens.then(|| {
            let token = admin_token(&["--data-dir", &data.display().to_string()]);
            args.push("--auth".into());
            args.push("tokens".into());
            token
        });
        let tls = extra.contains(&"--tls-san");
        let mut hub = HubProc::start_with(policy.path(), &data, Ports::free(), args);
        if tls {
            let ca = data.join("spoke-ca.pem");
            axle_e2e::wait_until(axle_e2e::READY_TIMEOUT, "the hub's CA", || {
                let ca = ca.clone();
                async move {
                    if ca.exists() {
                        Ok(())
                    } else {
                        Err("not yet".to_string())
                    }
                }
            })
            .await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        } else if admin.is_some() {
            let api = axle_e2e::Api::new(&hub.http_url());
            axle_e2e::wait_until(axle_e2e::READY_TIMEOUT, "the hub answers", || {
                let api = api.clone();
                async move {
                    match api.try_get("/healthz").await {
                        Ok((200, _)) => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                }
            })
            .await;
        } else {
            hub.wait_ready(&[]).await;
        }
        Hub {
            hub,
            _dir: dir,
            _policy: policy,
            admin,
            data,
            tls,
        }
    }

    pub fn http(&self) -> String {
        if self.tls {
            format!("https://127.0.0.1:{}", self.hub.ports.http)
        } else {
            self.hub.http_url()
        }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.hub.ports.http)
    }

    pub fn grpc_addr(&self) -> String {
        format!("127.0.0.1:{}", self.hub.ports.grpc)
    }

    /// A token for `user`, minted by the platform admin.
    pub async fn token_for(&self, user: &str) -> String {
        let admin = self.admin.as_deref().expect("a hub with --auth tokens");
        let ca = self.tls.then(|| self.ca_pem());
        let (status, v) = call_trusting(
            ca.as_deref(),
            &self.http(),
            Some(admin),
            reqwest::Method::POST,
            "/api/v1/tokens",
            Some(json!({"user": user})),
        )
        .await;
        assert_eq!(status, 201, "{v}");
        v["token"].as_str().expect("token").to_string()
    }
}

/// The platform admin's token, minted into a stopped hub's store
/// (`axle-hub create-token --user platform-admin` with `store`'s flags).
pub fn admin_token(store: &[&str]) -> String {
    let out = Command::new(bin("axle-hub"))
        .args(["create-token", "--user", "platform-admin"])
        .args(store)
        .env_remove("AXLE_STORE")
        .output()
        .expect("axle-hub create-token");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// One HTTP call with a bearer token: (status, JSON body or the text).
pub async fn call(
    base: &str,
    token: Option<&str>,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    call_trusting(None, base, token, method, path, body).await
}

/// [`call`] trusting `ca_pem` (a TLS hub's own CA).
pub async fn call_trusting(
    ca_pem: Option<&[u8]>,
    base: &str,
    token: Option<&str>,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    axle_e2e::install_crypto();
    let mut builder = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .no_proxy();
    if let Some(pem) = ca_pem {
        builder =
            builder.add_root_certificate(reqwest::Certificate::from_pem(pem).expect("CA PEM"));
    }
    let client = builder.build().expect("client");
    let mut req = client.request(method, format!("{base}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("the hub answers");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// `n` nodes of `gpus` H100 (80 GB each), named like a large fleet's.
pub fn nodes(n: usize, gpus: u32) -> Vec<pb::Node> {
    (0..n)
        .map(|i| pb::Node {
            name: format!("gpu-node-{i:05}.rack-{:03}.example.internal", i / 32),
            gpus: (0..gpus)
                .map(|index| pb::Gpu {
                    index,
                    model: "H100".into(),
                    memory_mb: 81_559,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect()
}

/// A forged spoke: registers `nodes` for `cluster` over a raw gRPC session
/// and keeps the stream open while the returned sender lives. Err is the
/// hub's refusal.
pub async fn register(
    grpc: &str,
    cluster: &str,
    nodes: Vec<pb::Node>,
) -> Result<tokio::sync::mpsc::Sender<pb::SpokeMessage>, tonic::Status> {
    let mut client =
        pb::spoke_service_client::SpokeServiceClient::connect(format!("http://{grpc}"))
            .await
            .expect("gRPC connects")
            .max_encoding_message_size(64 << 20)
            .max_decoding_message_size(64 << 20);
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::SpokeMessage>(16);
    tx.send(pb::SpokeMessage {
        msg: Some(pb::spoke_message::Msg::Register(pb::Register {
            cluster: cluster.into(),
            nodes,
            instance_id: format!("forged-{cluster}"),
            ..Default::default()
        })),
    })
    .await
    .expect("queued");
    let outbound =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut inbound = client.session(outbound).await?.into_inner();
    match inbound.message().await? {
        Some(pb::HubMessage {
            msg: Some(pb::hub_message::Msg::Registered(_)),
        }) => {}
        other => panic!("the first answer is Registered, not {other:?}"),
    }
    // Keep reading (heartbeats are not needed for the scenarios: a
    // forged spoke that falls silent is lost, which is what a hub does).
    tokio::spawn(async move { while let Ok(Some(_)) = inbound.message().await {} });
    Ok(tx)
}
