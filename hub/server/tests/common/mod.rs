//! One in-process hub on loopback (free ports, a temporary data dir) for
//! the hub's integration tests; each test file uses what it needs.
#![allow(dead_code)]

use std::net::SocketAddr;

use axle_hub::http_serve::HttpLimits;
use axle_hub::server;
use axle_policy::Policy;

pub struct TestHub {
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    /// Sending (or dropping) it is the hub's SIGTERM.
    pub stop: tokio::sync::oneshot::Sender<()>,
    /// `server::run`'s result once the hub ends.
    pub run: tokio::task::JoinHandle<anyhow::Result<()>>,
    pub data: tempfile::TempDir,
}

impl TestHub {
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    pub fn http_url(&self) -> String {
        format!("http://{}", self.http)
    }
}

/// What a test hub runs with; `Default` is the example policy, no spoke
/// token, the default HTTP limits.
#[derive(Default)]
pub struct Options {
    pub policy: Option<Policy>,
    pub spoke_token: Option<String>,
    pub http_limits: Option<HttpLimits>,
}

pub async fn start_hub(o: Options) -> TestHub {
    let data = tempfile::tempdir().expect("tempdir");
    let mut listeners = server::Listeners::bind(
        "127.0.0.1:0".parse().expect("addr"),
        "127.0.0.1:0".parse().expect("addr"),
    )
    .await
    .expect("bind");
    if let Some(limits) = o.http_limits {
        listeners.http_limits = limits;
    }
    let http = listeners.http.local_addr().expect("addr");
    let grpc = listeners.grpc.local_addr().expect("addr");
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let policy = match o.policy {
        Some(p) => p,
        None => axle_hub::dev::example_policy().expect("example policy"),
    };
    let dir = data.path().to_path_buf();
    let run = tokio::spawn(async move {
        server::run(dir, policy, o.spoke_token, listeners, async move {
            let _ = stop_rx.await;
        })
        .await
    });
    TestHub {
        http,
        grpc,
        stop,
        run,
        data,
    }
}
