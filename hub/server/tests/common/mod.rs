//! One in-process hub on loopback (free ports, a temporary data dir) for
//! the hub's integration tests; each test file uses what it needs.
#![allow(dead_code)]

use std::net::SocketAddr;

use axle_hub::http_serve::HttpLimits;
use axle_hub::server;
use axle_hub::store::{Op, Store, Txn};
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

/// A single-member etcd on loopback (free ports, a temporary data dir),
/// started from Debian's `etcd-server` (which `scripts/test.sh` installs);
/// killed when dropped.
pub struct Etcd {
    pub endpoint: String,
    child: std::process::Child,
    _data: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

impl Etcd {
    /// Starts a one-member etcd on free loopback ports. Ports are picked free and then
    /// bound by etcd, so a parallel test can take one in between: an etcd that exits is
    /// started again on other ports (three tries).
    pub async fn start() -> Etcd {
        let mut last_log = String::new();
        for _ in 0..3 {
            match Self::try_start().await {
                Ok(etcd) => return etcd,
                Err(log) => last_log = log,
            }
        }
        panic!("etcd did not start in three tries; its last log:\n{last_log}");
    }

    async fn try_start() -> Result<Etcd, String> {
        let data = tempfile::tempdir().expect("tempdir");
        let (client, peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log_path = data.path().join("etcd.log");
        let log = std::fs::File::create(&log_path).expect("etcd log");
        let child = std::process::Command::new("etcd")
            .args(["--name", "n1", "--data-dir"])
            .arg(data.path().join("member"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("n1={peer_url}")])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd (Debian etcd-server; scripts/test.sh installs it)");
        let mut etcd = Etcd {
            endpoint: client_url,
            child,
            _data: data,
        };
        // A loaded 2-core machine starting many etcds at once is slow.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let o = axle_hub::store::EtcdOptions::new(vec![etcd.endpoint.clone()]);
            if axle_hub::store::EtcdStore::connect(o).await.is_ok() {
                return Ok(etcd);
            }
            let exited = matches!(etcd.child.try_wait(), Ok(Some(_)));
            if exited || std::time::Instant::now() >= deadline {
                return Err(std::fs::read_to_string(&log_path).unwrap_or_default());
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// A store on this etcd, under `prefix`.
    pub async fn store(&self, prefix: &str) -> axle_hub::store::EtcdStore {
        let mut o = axle_hub::store::EtcdOptions::new(vec![self.endpoint.clone()]);
        o.prefix = prefix.to_string();
        axle_hub::store::EtcdStore::connect(o)
            .await
            .expect("connect to etcd")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain put of a UTF-8 value.
pub fn put(key: &str, value: &str) -> Op {
    Op::put(key, value.as_bytes().to_vec())
}

/// Puts `value` at `key` in a txn of its own; its revision.
pub async fn put_plain(store: &dyn Store, key: &str, value: &str) -> u64 {
    let result = store
        .txn(Txn::new().and_then(put(key, value)))
        .await
        .unwrap();
    assert!(result.succeeded);
    result.rev
}

/// The value at `key` as UTF-8, if any.
pub async fn value_of(store: &dyn Store, key: &str) -> Option<String> {
    store
        .get(key)
        .await
        .unwrap()
        .map(|kv| String::from_utf8(kv.value).unwrap())
}
