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
    pub grpc_limits: Option<axle_hub::grpc_serve::GrpcLimits>,
    /// TLS on both listeners.
    pub tls: Option<axle_hub::tls::ServerTls>,
    /// How user calls are authenticated (default: not at all).
    pub auth: Option<axle_hub::auth::AuthMode>,
    /// A token the hub accepts from its start.
    pub bootstrap_token: Option<axle_hub::auth::TokenRecord>,
    /// Per-user rate and calls in flight (default: the hub's defaults).
    pub rate_limits: Option<axle_hub::rate::RateLimits>,
    /// Spokes join with certificates from a spoke CA.
    pub spoke_mtls: Option<axle_hub::server::SpokeMtls>,
    /// Single sign-on with ID tokens.
    pub oidc: Option<std::sync::Arc<axle_hub::oidc::Oidc>>,
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
    if let Some(limits) = o.grpc_limits {
        listeners.grpc_limits = limits;
    }
    listeners.tls = o.tls;
    if let Some(auth) = o.auth {
        listeners.auth = auth;
    }
    listeners.bootstrap_token = o.bootstrap_token;
    listeners.spoke_mtls = o.spoke_mtls;
    listeners.oidc = o.oidc;
    if let Some(r) = o.rate_limits {
        listeners.rate_limits = r;
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

pub fn free_port() -> u16 {
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
        Self::start_with(None).await
    }

    /// Like [`Etcd::start`], serving clients over TLS with `tls`'s server certificate
    /// and asking them for a certificate signed by its CA.
    pub async fn start_tls(tls: &EtcdTls) -> Etcd {
        Self::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<&EtcdTls>) -> Etcd {
        let mut last_log = String::new();
        for _ in 0..3 {
            match Self::try_start(tls).await {
                Ok(etcd) => return etcd,
                Err(log) => last_log = log,
            }
        }
        panic!("etcd did not start in three tries; its last log:\n{last_log}");
    }

    async fn try_start(tls: Option<&EtcdTls>) -> Result<Etcd, String> {
        let data = tempfile::tempdir().expect("tempdir");
        let (client, peer) = (free_port(), free_port());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log_path = data.path().join("etcd.log");
        let log = std::fs::File::create(&log_path).expect("etcd log");
        let mut etcd = std::process::Command::new("etcd");
        if let Some(t) = tls {
            etcd.arg("--cert-file")
                .arg(&t.server_cert)
                .arg("--key-file")
                .arg(&t.server_key)
                .arg("--trusted-ca-file")
                .arg(&t.ca)
                .arg("--client-cert-auth");
        }
        let child = etcd
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
            let mut o = axle_hub::store::EtcdOptions::new(vec![etcd.endpoint.clone()]);
            if let Some(t) = tls {
                o.ca_pem = Some(t.ca_pem.clone());
                o.client_cert_pem = Some((t.client_cert_pem.clone(), t.client_key_pem.clone()));
            }
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

/// Certificates for an etcd on TLS, made by rcgen: a CA, a server certificate for
/// 127.0.0.1 and a client certificate, PEM files in a temporary dir (and in memory).
pub struct EtcdTls {
    pub dir: tempfile::TempDir,
    pub ca: std::path::PathBuf,
    pub server_cert: std::path::PathBuf,
    pub server_key: std::path::PathBuf,
    pub client_cert: std::path::PathBuf,
    pub client_key: std::path::PathBuf,
    pub ca_pem: Vec<u8>,
    pub client_cert_pem: Vec<u8>,
    pub client_key_pem: Vec<u8>,
}

/// A CA: its certificate's PEM and what signs with it.
pub struct TestCa {
    pub pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().expect("CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        TestCa {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A certificate for `names` (DNS names or IP addresses) usable by servers and
    /// clients: its PEM and its key's PEM.
    pub fn issue(&self, cn: &str, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer).expect("certificate");
        (cert.pem(), key.serialize_pem())
    }
}

impl EtcdTls {
    pub fn new(ca: &TestCa) -> EtcdTls {
        let dir = tempfile::tempdir().expect("tempdir");
        let (server_cert, server_key) = ca.issue("etcd", &["127.0.0.1", "localhost"]);
        let (client_cert, client_key) = ca.issue("axle-hub", &["axle-hub"]);
        let file = |name: &str, pem: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, pem).expect("write PEM");
            p
        };
        EtcdTls {
            ca: file("ca.pem", &ca.pem),
            server_cert: file("server.pem", &server_cert),
            server_key: file("server-key.pem", &server_key),
            client_cert: file("client.pem", &client_cert),
            client_key: file("client-key.pem", &client_key),
            ca_pem: ca.pem.clone().into_bytes(),
            client_cert_pem: client_cert.into_bytes(),
            client_key_pem: client_key.into_bytes(),
            dir,
        }
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

/// A gRPC channel to the hub at `url`, retried while it starts (at most 10 s).
pub async fn channel(url: &str) -> tonic::transport::Channel {
    for _ in 0..200 {
        if let Ok(ch) = tonic::transport::Endpoint::from_shared(url.to_string())
            .expect("valid url")
            .connect()
            .await
        {
            return ch;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("hub gRPC at {url} did not come up within 10 s");
}

/// A plain HTTP/1.1 GET of `path` on `base` (`http://host:port` or `host:port`), without
/// a client library: the whole answer, status line and headers included.
pub async fn http_get(base: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

/// One HTTP call: status and JSON body (null when not JSON).
pub async fn call(
    hub: &TestHub,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let (status, _, body) = call_full(hub, method, path, token, body).await;
    (status, body)
}

/// [`call`], with the response's head (status line and headers, lowercase).
pub async fn call_full(
    hub: &TestHub,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (u16, String, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = None;
    for _ in 0..100 {
        if let Ok(c) = tokio::net::TcpStream::connect(hub.http).await {
            s = Some(c);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let mut s = s.expect("hub up");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (
        status,
        head.to_ascii_lowercase(),
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}
