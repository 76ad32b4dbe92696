//! Helpers for Axle end-to-end tests: free ports, process handles, HTTP client.
//!
//! Every test starts its own `axle-hub` and `axle-spoke` processes on
//! 127.0.0.1 with free ports and temp dirs. Process handles kill (SIGKILL) and
//! reap their process when dropped, also while a failing test unwinds, and
//! then print the tail of the process's log so the failure can be diagnosed.
//! Workloads die with their spoke (the spoke's shim sees its stdin close).
//!
//! Workloads that the tests inspect from the spokes' side run
//! [`traced_script`]: a shell script that appends one `start` and one `end`
//! line per replica to a shared trace file ([`Mark`], [`read_trace`]).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::Read as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod ha;
pub mod kube;
pub mod lambda_fake;

use axle_proto::api::{ClusterView, EventView, LogsView, SubmitRequest, WorkloadView};
use serde_json::Value;

/// How long one HTTP request may take: the hub answers in milliseconds; a
/// debug build on a busy 2-core machine still stays far below this.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(20);
/// Below the hub's shortest connection timeout (its 10 s header-read
/// timeout, which also ends keep-alive waits).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Poll period of [`wait_until`]: short next to the hub's 1 s tick, long
/// enough not to load a 2-core machine.
pub const POLL_PERIOD: Duration = Duration::from_millis(100);

/// How long a hub gets to answer /healthz and see its spokes Ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes of a process log printed when a test fails.
const LOG_TAIL_BYTES: usize = 6000;

/// The directory holding the workspace binaries (`target/debug`): the test
/// executable is `target/debug/deps/<test>-<hash>`.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let deps = exe.parent().expect("the deps dir");
    deps.parent().expect("the target profile dir").to_path_buf()
}

/// Path of a workspace binary (`axle-hub`, `axle-spoke`, `axle`).
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} does not exist; build the workspace first (cargo build --workspace)",
        path.display()
    );
    path
}

/// Ports this test process has handed out: the kernel may give a port
/// released by one `bind(0)` to the next before the first process bound
/// it (observed: two HA replicas started on the same HTTP port).
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A TCP port that was free a moment ago on 127.0.0.1 (bind port 0, read
/// it, close), never one this process handed out before.
pub fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("local addr").port();
        if HANDED_OUT
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(port)
        {
            return port;
        }
    }
}

/// The hub's two ports.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub http: u16,
    pub grpc: u16,
}

impl Ports {
    pub fn free() -> Ports {
        Ports {
            http: free_port(),
            grpc: free_port(),
        }
    }
}

/// Installs rustls' ring provider (reqwest is built without one); idempotent.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Polls `f` every [`POLL_PERIOD`] until it returns `Ok`, and panics with
/// `what` and the last `Err` (what was seen instead) after `timeout`.
pub async fn wait_until<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(last) => {
                if Instant::now() >= deadline {
                    panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
                }
            }
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
}

/// A policy repository in a temp dir, written from YAML documents.
pub struct TempPolicy {
    dir: tempfile::TempDir,
}

impl TempPolicy {
    /// Writes each `(file name, YAML)` pair into a fresh directory.
    pub fn new(files: &[(&str, &str)]) -> TempPolicy {
        let dir = tempfile::Builder::new()
            .prefix("axle-e2e-policy")
            .tempdir()
            .expect("temp dir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write policy file");
        }
        TempPolicy { dir }
    }

    /// Copies the `*.yaml` files of `tests/fixtures/<name>/` for each name
    /// (e.g. `["common", "two-clusters"]`: shared classes and settings, then
    /// the scenario's clusters and teams).
    pub fn fixture(names: &[&str]) -> TempPolicy {
        let mut files = Vec::new();
        for name in names {
            let src = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures")
                .join(name);
            let mut found = 0;
            for entry in
                std::fs::read_dir(&src).unwrap_or_else(|e| panic!("fixture {}: {e}", src.display()))
            {
                let path = entry.expect("dir entry").path();
                if path.extension().is_some_and(|e| e == "yaml") {
                    let text = std::fs::read_to_string(&path).expect("read fixture");
                    let file = path.file_name().expect("name").to_string_lossy();
                    files.push((format!("{name}-{file}"), text));
                    found += 1;
                }
            }
            assert!(found > 0, "fixture {} has no .yaml files", src.display());
        }
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(n, t)| (n.as_str(), t.as_str()))
            .collect();
        TempPolicy::new(&refs)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A temp directory for a test's data (hub store, spoke dirs, traces, logs).
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("temp dir")
}

/// The last [`LOG_TAIL_BYTES`] of a file, lossily decoded.
pub fn tail(path: &Path) -> String {
    let mut buf = Vec::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_end(&mut buf);
    }
    let start = buf.len().saturating_sub(LOG_TAIL_BYTES);
    String::from_utf8_lossy(&buf[start..]).into_owned()
}

/// A child process that is SIGKILLed and reaped on drop.
pub(crate) struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    pub(crate) fn spawn(name: &str, mut cmd: Command, log: &Path) -> Proc {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("open process log");
        let err = out.try_clone().expect("clone log handle");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .env(
                "RUST_LOG",
                std::env::var("E2E_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("NO_COLOR", "1");
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .map(Child::id)
            .expect("process is running")
    }

    /// Sends `signal` (e.g. `STOP`, `CONT`) with kill(1).
    pub(crate) fn signal(&self, signal: &str) {
        let Some(c) = &self.child else { return };
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(c.id().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} {} failed", self.name);
    }

    /// SIGKILL and reap.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Err with the exit status and log tail if the process has exited.
    pub(crate) fn check_alive(&mut self) -> Result<(), String> {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => Ok(()),
            Some(Ok(Some(status))) => Err(format!(
                "{} exited ({status}); log:\n{}",
                self.name,
                tail(&self.log)
            )),
            Some(Err(e)) => Err(format!("{}: {e}", self.name)),
            None => Err(format!("{} is not running", self.name)),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "---- {} log ({}), last bytes ----\n{}",
                self.name,
                self.log.display(),
                tail(&self.log)
            );
        }
    }
}

/// An `axle-hub` process.
pub struct HubProc {
    proc_: Proc,
    pub ports: Ports,
    policy_dir: PathBuf,
    data_dir: PathBuf,
    log: PathBuf,
    /// More flags (e.g. `--store etcd://…`), kept for restarts.
    extra_args: Vec<String>,
}

impl HubProc {
    /// Starts `axle-hub --http 127.0.0.1:P --grpc 127.0.0.1:Q --data-dir D
    /// --policy DIR`, logging to `<data_dir>/../hub-<port>.log`.
    pub fn start(policy_dir: &Path, data_dir: &Path, ports: Ports) -> HubProc {
        Self::start_with(policy_dir, data_dir, ports, Vec::new())
    }

    /// [`HubProc::start`] with more flags.
    pub fn start_with(
        policy_dir: &Path,
        data_dir: &Path,
        ports: Ports,
        extra_args: Vec<String>,
    ) -> HubProc {
        std::fs::create_dir_all(data_dir).expect("create hub data dir");
        let log = data_dir
            .parent()
            .unwrap_or(data_dir)
            .join(format!("hub-{}.log", ports.http));
        let proc_ = Self::spawn(policy_dir, data_dir, ports, &log, &extra_args);
        HubProc {
            proc_,
            ports,
            policy_dir: policy_dir.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            log,
            extra_args,
        }
    }

    fn spawn(
        policy_dir: &Path,
        data_dir: &Path,
        ports: Ports,
        log: &Path,
        extra_args: &[String],
    ) -> Proc {
        let mut cmd = Command::new(bin("axle-hub"));
        cmd.arg("--http")
            .arg(format!("127.0.0.1:{}", ports.http))
            .arg("--grpc")
            .arg(format!("127.0.0.1:{}", ports.grpc))
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--policy")
            .arg(policy_dir)
            .args(extra_args)
            .env_remove("AXLE_SPOKE_TOKEN")
            .env_remove("AXLE_STORE")
            .env_remove("AXLE_AUTH");
        // Scenarios about scheduling and faults run without users; those about
        // users pass `--auth tokens`.
        if !extra_args.iter().any(|a| a.starts_with("--auth")) {
            cmd.args(["--auth", "none"]);
        }
        // Likewise plaintext on loopback, unless the scenario is about TLS.
        let tls = ["--tls-cert", "--tls-san", "--spoke-ca-cert"];
        if !extra_args
            .iter()
            .any(|a| tls.iter().any(|t| a.starts_with(t)))
        {
            cmd.arg("--insecure-no-tls");
        }
        Proc::spawn(&format!("axle-hub :{}", ports.http), cmd, log)
    }

    /// Starts the hub again on the same ports, data dir and policy (after
    /// [`HubProc::kill9`]).
    pub fn restart(&mut self) {
        self.proc_.kill9();
        self.proc_ = Self::spawn(
            &self.policy_dir,
            &self.data_dir,
            self.ports,
            &self.log,
            &self.extra_args,
        );
    }

    pub fn pid(&self) -> u32 {
        self.proc_.pid()
    }

    /// Sends `signal` (`STOP`, `CONT`) to the hub.
    pub fn signal(&self, signal: &str) {
        self.proc_.signal(signal);
    }

    /// Err with the exit status and log tail if the hub has exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        self.proc_.check_alive()
    }

    /// SIGKILL the hub (and reap it).
    pub fn kill9(&mut self) {
        self.proc_.kill9();
    }

    pub fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.http)
    }

    /// What spokes dial.
    pub fn grpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.grpc)
    }

    pub fn api(&self) -> Api {
        Api::new(&self.http_url())
    }

    pub fn log(&self) -> String {
        tail(&self.log)
    }

    /// Waits until /healthz answers and every cluster in `clusters` is
    /// `Ready` in /api/v1/clusters. Fails fast if the hub exits.
    pub async fn wait_ready(&mut self, clusters: &[&str]) {
        let api = self.api();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Err(e) = self.proc_.check_alive() {
                panic!("hub is not running: {e}");
            }
            let last = match api.try_get("/healthz").await {
                Ok((200, _)) => match api.try_get("/api/v1/clusters").await {
                    Ok((200, body)) => {
                        let views: Vec<ClusterView> =
                            serde_json::from_value(body).expect("cluster views");
                        let not_ready: Vec<String> = clusters
                            .iter()
                            .filter(|c| !views.iter().any(|v| v.name == **c && v.state == "Ready"))
                            .map(|c| c.to_string())
                            .collect();
                        if not_ready.is_empty() {
                            return;
                        }
                        format!(
                            "not Ready: {not_ready:?}; clusters: {:?}",
                            views
                                .iter()
                                .map(|v| (&v.name, &v.state))
                                .collect::<Vec<_>>()
                        )
                    }
                    other => format!("/api/v1/clusters: {other:?}"),
                },
                other => format!("/healthz: {other:?}"),
            };
            if Instant::now() >= deadline {
                panic!(
                    "hub not ready after {READY_TIMEOUT:?}: {last}\nhub log:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(POLL_PERIOD).await;
        }
    }
}

/// How to start one `axle-spoke`.
#[derive(Debug, Clone)]
pub struct SpokeSpec {
    pub cluster: String,
    /// `--region`; empty: none is given.
    pub region: String,
    /// `--gpus` values, one node each, e.g. `4xH100:80GB`.
    pub gpus: Vec<String>,
    /// `--node` names (empty: node-0, node-1, ...).
    pub nodes: Vec<String>,
    pub data_dir: PathBuf,
    /// More flags (e.g. `--driver kubernetes --kubeconfig F`).
    pub extra_args: Vec<String>,
}

impl SpokeSpec {
    pub fn new(cluster: &str, region: &str, gpus: &[&str], data_dir: &Path) -> SpokeSpec {
        SpokeSpec {
            cluster: cluster.to_string(),
            region: region.to_string(),
            gpus: gpus.iter().map(|g| g.to_string()).collect(),
            nodes: Vec::new(),
            data_dir: data_dir.to_path_buf(),
            extra_args: Vec::new(),
        }
    }
}

/// An `axle-spoke` process. Its workloads see `E2E_CLUSTER=<cluster>` (the
/// spoke's environment is inherited by its workloads).
pub struct SpokeProc {
    proc_: Proc,
    pub spec: SpokeSpec,
    hub_grpc: String,
    log: PathBuf,
}

impl SpokeProc {
    /// Starts `axle-spoke --hub URL --cluster C --region R --gpus ... --data-dir D`.
    pub fn start(hub_grpc: &str, spec: SpokeSpec) -> SpokeProc {
        std::fs::create_dir_all(&spec.data_dir).expect("create spoke data dir");
        let log = spec
            .data_dir
            .parent()
            .unwrap_or(&spec.data_dir)
            .join(format!("spoke-{}.log", spec.cluster));
        let proc_ = Self::spawn(hub_grpc, &spec, &log);
        SpokeProc {
            proc_,
            spec,
            hub_grpc: hub_grpc.to_string(),
            log,
        }
    }

    fn spawn(hub_grpc: &str, spec: &SpokeSpec, log: &Path) -> Proc {
        let mut cmd = Command::new(bin("axle-spoke"));
        cmd.arg("--hub")
            .arg(hub_grpc)
            .arg("--cluster")
            .arg(&spec.cluster)
            .args(
                // An empty region: the spoke leaves it to the policy.
                (!spec.region.is_empty())
                    .then_some(["--region", spec.region.as_str()])
                    .into_iter()
                    .flatten(),
            )
            .arg("--data-dir")
            .arg(&spec.data_dir)
            .env("E2E_CLUSTER", &spec.cluster)
            .env_remove("AXLE_SPOKE_TOKEN")
            .env_remove("AXLE_HUB_GRPC")
            .env_remove("AXLE_SPOKE_DRIVER")
            .env_remove("KUBECONFIG")
            .args(&spec.extra_args);
        for g in &spec.gpus {
            cmd.arg("--gpus").arg(g);
        }
        for n in &spec.nodes {
            cmd.arg("--node").arg(n);
        }
        Proc::spawn(&format!("axle-spoke {}", spec.cluster), cmd, log)
    }

    /// Starts the spoke again with the same cluster, flags and data dir.
    pub fn restart(&mut self) {
        self.proc_.kill9();
        self.proc_ = Self::spawn(&self.hub_grpc, &self.spec, &self.log);
    }

    pub fn pid(&self) -> u32 {
        self.proc_.pid()
    }

    /// Sends `signal` (`STOP`, `CONT`) to the spoke agent alone (its
    /// workloads run in process groups of their own).
    pub fn signal(&self, signal: &str) {
        self.proc_.signal(signal);
    }

    /// SIGKILL the spoke (and reap it).
    pub fn kill9(&mut self) {
        self.proc_.kill9();
    }

    pub fn log(&self) -> String {
        tail(&self.log)
    }
}

/// Whether a process is gone: no `/proc/<pid>`, or a zombie waiting to be reaped.
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // `pid (comm) S ...`: the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|s| s == "Z" || s == "X"),
    }
}

/// A status code and a JSON body (a non-JSON body becomes a JSON string).
pub type Reply = (u16, Value);

/// A client of the hub's HTTP API.
#[derive(Clone)]
pub struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    pub fn new(base: &str) -> Api {
        install_crypto();
        let http = reqwest::Client::builder()
            .timeout(HTTP_TIMEOUT)
            // Drop pooled connections before the hub closes them as idle,
            // so a request never goes out on one it is closing.
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .no_proxy()
            .build()
            .expect("HTTP client");
        Api {
            base: base.trim_end_matches('/').to_string(),
            http,
        }
    }

    async fn reply(r: reqwest::Response) -> Result<Reply, reqwest::Error> {
        let status = r.status().as_u16();
        let text = r.text().await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, body))
    }

    /// POST a submit with a 3 s timeout (a paused hub must not hold a client for
    /// long); Err when the hub cannot be reached or does not answer in time.
    pub async fn try_submit(&self, req: &SubmitRequest) -> Result<Reply, reqwest::Error> {
        let r = self
            .http
            .post(format!("{}/api/v1/workloads", self.base))
            .timeout(Duration::from_secs(3))
            .json(req)
            .send()
            .await?;
        Self::reply(r).await
    }

    /// GET `path` within `timeout`; Err when the hub cannot be reached in time.
    pub async fn try_get_within(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<Reply, reqwest::Error> {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .timeout(timeout)
            .send()
            .await?;
        Self::reply(r).await
    }

    /// GET `path`; Err when the hub cannot be reached.
    pub async fn try_get(&self, path: &str) -> Result<Reply, reqwest::Error> {
        Self::reply(self.http.get(format!("{}{path}", self.base)).send().await?).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.try_get(path)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// Any method on `path` with a raw body.
    pub async fn send_raw(&self, method: reqwest::Method, path: &str, body: Vec<u8>) -> Reply {
        let r = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        Self::reply(r)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// POST a raw body (content type JSON).
    pub async fn post_raw(&self, path: &str, body: &str) -> Reply {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        Self::reply(r)
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    }

    /// DELETE `path` with a 3 s timeout; Err when the hub cannot be reached in time.
    pub async fn try_delete(&self, path: &str) -> Result<Reply, reqwest::Error> {
        let r = self
            .http
            .delete(format!("{}{path}", self.base))
            .timeout(Duration::from_secs(3))
            .send()
            .await?;
        Self::reply(r).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        let r = self
            .http
            .delete(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("DELETE {path}: {e}"));
        Self::reply(r)
            .await
            .unwrap_or_else(|e| panic!("DELETE {path}: {e}"))
    }

    /// POST /api/v1/workloads.
    pub async fn submit(&self, req: &SubmitRequest) -> Reply {
        let body = serde_json::to_string(req).expect("encode submit");
        self.post_raw("/api/v1/workloads", &body).await
    }

    /// Submits and asserts it was accepted (201 created or 200 for a repeat).
    pub async fn submit_ok(&self, req: &SubmitRequest) -> WorkloadView {
        let (status, body) = self.submit(req).await;
        assert!(
            status == 201 || status == 200,
            "submit {req:?} refused: {status} {body}"
        );
        serde_json::from_value(body).expect("workload view")
    }

    /// GET /api/v1/workloads?<query>.
    pub async fn list(&self, query: &str) -> Reply {
        if query.is_empty() {
            self.get("/api/v1/workloads").await
        } else {
            self.get(&format!("/api/v1/workloads?{query}")).await
        }
    }

    /// All workloads, page by page; Err when the hub cannot be reached or
    /// refuses.
    pub async fn try_workloads(&self) -> Result<Vec<WorkloadView>, String> {
        let mut all = Vec::new();
        let mut path = "/api/v1/workloads?limit=5000".to_string();
        loop {
            let page: axle_proto::api::WorkloadList = match self.try_get(&path).await {
                Ok((200, body)) => serde_json::from_value(body).map_err(|e| e.to_string())?,
                Ok((status, body)) => return Err(format!("{status} {body}")),
                Err(e) => return Err(e.to_string()),
            };
            all.extend(page.items);
            match page.continue_token {
                Some(t) => path = format!("/api/v1/workloads?limit=5000&continue={t}"),
                None => return Ok(all),
            }
        }
    }

    pub async fn workloads(&self) -> Vec<WorkloadView> {
        self.try_workloads()
            .await
            .unwrap_or_else(|e| panic!("GET /api/v1/workloads: {e}"))
    }

    /// GET /api/v1/workloads/{id} (raw id text, to test bad ids too).
    pub async fn get_workload(&self, id: &str) -> Reply {
        self.get(&format!("/api/v1/workloads/{id}")).await
    }

    pub async fn workload(&self, id: u64) -> WorkloadView {
        let (status, body) = self.get_workload(&id.to_string()).await;
        assert_eq!(status, 200, "GET workload {id}: {body}");
        serde_json::from_value(body).expect("workload view")
    }

    /// Polls workload `id` until it is in `state`; panics after `timeout`
    /// with what it was instead (state, pending reason, last transition).
    pub async fn wait_state(&self, id: u64, state: &str, timeout: Duration) -> WorkloadView {
        wait_until(
            timeout,
            &format!("workload {id} to be {state}"),
            || async move {
                let w = self.workload(id).await;
                if w.state == state {
                    Ok(w)
                } else {
                    Err(format!(
                        "{} ({}), last: {:?}",
                        w.state,
                        w.pending_reason.clone().unwrap_or_default(),
                        w.history.last()
                    ))
                }
            },
        )
        .await
    }

    /// DELETE /api/v1/workloads/{id}.
    pub async fn cancel(&self, id: u64) -> Reply {
        self.delete(&format!("/api/v1/workloads/{id}")).await
    }

    pub async fn logs(&self, id: u64, offset: u64) -> LogsView {
        let (status, body) = self
            .get(&format!("/api/v1/workloads/{id}/logs?offset={offset}"))
            .await;
        assert_eq!(status, 200, "logs of {id}: {body}");
        serde_json::from_value(body).expect("logs view")
    }

    pub async fn clusters(&self) -> Vec<ClusterView> {
        let (status, body) = self.get("/api/v1/clusters").await;
        assert_eq!(status, 200, "clusters: {body}");
        serde_json::from_value(body).expect("cluster views")
    }

    pub async fn events(&self) -> Vec<EventView> {
        let (status, body) = self.get("/api/v1/events?limit=10000").await;
        assert_eq!(status, 200, "events: {body}");
        serde_json::from_value(body).expect("event views")
    }

    /// Waits until every workload in `ids` is in a terminal state and returns
    /// all workloads; the error names the ones still going.
    pub async fn wait_all_finished(&self, ids: &[u64], timeout: Duration) -> Vec<WorkloadView> {
        wait_until(timeout, "all workloads to finish", || async {
            let all = self.try_workloads().await?;
            let going: Vec<String> = all
                .iter()
                .filter(|w| ids.contains(&w.id) && !is_terminal(&w.state))
                .map(|w| {
                    format!(
                        "{}:{}{}",
                        w.id,
                        w.state,
                        w.pending_reason
                            .as_ref()
                            .map(|r| format!(" ({r})"))
                            .unwrap_or_default()
                    )
                })
                .collect();
            if going.is_empty() {
                Ok(all)
            } else {
                Err(format!("{} still going: {}", going.len(), going.join(", ")))
            }
        })
        .await
    }
}

pub fn is_terminal(state: &str) -> bool {
    matches!(state, "Succeeded" | "Failed" | "Cancelled")
}

/// A submit request with the defaults filled in.
pub fn request(team: &str, gpus: f64, command: Vec<String>) -> SubmitRequest {
    SubmitRequest {
        team: team.to_string(),
        command,
        gpus,
        ..SubmitRequest::default()
    }
}

/// `sh -c <script>` as a command.
pub fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.to_string()]
}

/// A shell script that appends `start` and (on exit or SIGTERM) `end` lines
/// to `trace` around `sleep <sleep_s>`. Each line is one `echo >>` (one
/// O_APPEND write, far below PIPE_BUF, so lines never interleave):
/// `<start|end> <ts_ns> <node> <cluster> <CUDA_VISIBLE_DEVICES> <fraction>
/// <id> <epoch> <replica> <pid> <ppid>`. The sleep runs in the background
/// with `wait`, so a SIGTERM runs the trap at once. SIGPIPE is ignored: when
/// the spoke dies, the script's stdout and stderr (pipes to the spoke) have
/// no reader, and the shell's own "Terminated" notice for the killed sleep
/// would otherwise kill it before the trap writes the `end` line.
pub fn traced_script(trace: &Path, sleep_s: &str) -> String {
    format!(
        r#"trap '' PIPE
T='{trace}'
mark() {{ echo "$1 $(date +%s%N) $AXLE_NODE ${{E2E_CLUSTER:-none}} $CUDA_VISIBLE_DEVICES ${{AXLE_GPU_FRACTION:-1}} $AXLE_WORKLOAD_ID $AXLE_EPOCH $AXLE_REPLICA $$ $PPID" >> "$T"; }}
trap 'mark end; exit 143' TERM
mark start
sleep {sleep_s} &
wait $!
mark end
echo "workload $AXLE_WORKLOAD_ID epoch $AXLE_EPOCH done"
"#,
        trace = trace.display()
    )
}

/// One line of a trace file.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    pub start: bool,
    pub ts_ns: u128,
    pub node: String,
    pub cluster: String,
    pub devices: Vec<u32>,
    /// Milli-GPUs per device (1000 for whole GPUs).
    pub milli: u32,
    pub id: u64,
    pub epoch: u64,
    pub replica: u32,
    pub pid: u32,
    pub ppid: u32,
}

/// Parses a trace file written by [`traced_script`]; panics on a malformed line.
pub fn read_trace(path: &Path) -> Vec<Mark> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(f.len(), 11, "malformed trace line {line:?}");
            let num = |i: usize| -> u64 {
                f[i].parse()
                    .unwrap_or_else(|_| panic!("field {i} of trace line {line:?}"))
            };
            let frac: f64 = f[5].parse().expect("fraction");
            Mark {
                start: match f[0] {
                    "start" => true,
                    "end" => false,
                    other => panic!("unknown mark {other:?} in {line:?}"),
                },
                ts_ns: f[1].parse().expect("timestamp"),
                node: f[2].to_string(),
                cluster: f[3].to_string(),
                devices: f[4]
                    .split(',')
                    .map(|d| d.parse().expect("device index"))
                    .collect(),
                milli: (frac * 1000.0).round() as u32,
                id: num(6),
                epoch: num(7),
                replica: num(8) as u32,
                pid: num(9) as u32,
                ppid: num(10) as u32,
            }
        })
        .collect()
}

/// One replica run: its start mark and, if it was written, its end.
#[derive(Debug, Clone)]
pub struct Interval {
    pub start: Mark,
    pub end_ns: Option<u128>,
}

/// Pairs start and end marks by (workload, epoch, replica). Panics if one
/// replica run has two starts (it ran twice under one epoch).
pub fn intervals(marks: &[Mark]) -> BTreeMap<(u64, u64, u32), Interval> {
    let mut out: BTreeMap<(u64, u64, u32), Interval> = BTreeMap::new();
    for m in marks.iter().filter(|m| m.start) {
        let key = (m.id, m.epoch, m.replica);
        let prev = out.insert(
            key,
            Interval {
                start: m.clone(),
                end_ns: None,
            },
        );
        assert!(
            prev.is_none(),
            "workload {} epoch {} replica {} started twice: {prev:?} and {m:?}",
            m.id,
            m.epoch,
            m.replica
        );
    }
    for m in marks.iter().filter(|m| !m.start) {
        let key = (m.id, m.epoch, m.replica);
        let i = out
            .get_mut(&key)
            .unwrap_or_else(|| panic!("end without start: {m:?}"));
        assert!(i.end_ns.is_none(), "two ends for {key:?}: {m:?}");
        i.end_ns = Some(m.ts_ns);
    }
    out
}

/// (cluster, node, GPU index).
type GpuKey = (String, String, u32);
/// (time in ns, +/- milli-GPUs, which replica run).
type ShareChange = (u128, i64, String);

/// Replays the intervals per (cluster, node, GPU) and returns every instant
/// at which the summed shares exceed one GPU, as readable lines. Intervals
/// without an end are a failure of the caller's expectations: pass only
/// complete ones.
pub fn overcommits(intervals: &[Interval]) -> Vec<String> {
    // (time, +/-milli, who); at equal times ends go first (they are other
    // processes that exited; the order of equal timestamps is unknowable).
    let mut per_gpu: BTreeMap<GpuKey, Vec<ShareChange>> = BTreeMap::new();
    for i in intervals {
        let end = i.end_ns.expect("complete interval");
        let s = &i.start;
        let who = format!("w{}e{}r{}", s.id, s.epoch, s.replica);
        for d in &s.devices {
            let e = per_gpu
                .entry((s.cluster.clone(), s.node.clone(), *d))
                .or_default();
            e.push((s.ts_ns, i64::from(s.milli), who.clone()));
            e.push((end, -i64::from(s.milli), who.clone()));
        }
    }
    let mut bad = Vec::new();
    for (gpu, mut evs) in per_gpu {
        evs.sort_by_key(|(t, delta, _)| (*t, *delta));
        let mut sum = 0i64;
        let mut holders: Vec<String> = Vec::new();
        for (t, delta, who) in evs {
            sum += delta;
            if delta > 0 {
                holders.push(who);
            } else {
                holders.retain(|h| *h != who);
            }
            if sum > 1000 {
                bad.push(format!(
                    "{gpu:?} at {t} ns holds {sum} milli-GPUs: {holders:?}"
                ));
            }
        }
    }
    bad
}

/// A hub and its spokes on one temp dir. Fields drop in order: spokes (and
/// with them their workloads), then the hub, then the directories.
pub struct Env {
    pub spokes: Vec<SpokeProc>,
    pub hub: HubProc,
    pub policy: TempPolicy,
    pub dir: tempfile::TempDir,
}

impl Env {
    /// Starts a hub on the fixture policy `fixtures` and one spoke per
    /// `(cluster, region, --gpus values)`, and waits until all are Ready.
    pub async fn start(fixtures: &[&str], spokes: &[(&str, &str, &[&str])]) -> Env {
        let dir = temp_dir("axle-e2e");
        let policy = TempPolicy::fixture(fixtures);
        let mut hub = HubProc::start(policy.path(), &dir.path().join("hub"), Ports::free());
        let spokes: Vec<SpokeProc> = spokes
            .iter()
            .map(|(cluster, region, gpus)| {
                let data = dir.path().join(format!("spoke-{cluster}"));
                SpokeProc::start(
                    &hub.grpc_url(),
                    SpokeSpec::new(cluster, region, gpus, &data),
                )
            })
            .collect();
        let names: Vec<&str> = spokes.iter().map(|s| s.spec.cluster.as_str()).collect();
        hub.wait_ready(&names).await;
        Env {
            spokes,
            hub,
            policy,
            dir,
        }
    }

    pub fn api(&self) -> Api {
        self.hub.api()
    }

    /// A path inside the temp dir (e.g. the trace file).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn spoke(&mut self, cluster: &str) -> &mut SpokeProc {
        self.spokes
            .iter_mut()
            .find(|s| s.spec.cluster == cluster)
            .unwrap_or_else(|| panic!("no spoke {cluster}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(start: bool, ts_ns: u128, devices: &[u32], milli: u32, id: u64) -> Mark {
        Mark {
            start,
            ts_ns,
            node: "node-0".into(),
            cluster: "c".into(),
            devices: devices.to_vec(),
            milli,
            id,
            epoch: 1,
            replica: 0,
            pid: 1,
            ppid: 1,
        }
    }

    #[test]
    fn the_replay_finds_overcommitment_and_only_that() {
        // 0.5 + 0.5 on GPU 0 is full, not over; a whole GPU 1 beside it is fine.
        let ok = [
            mark(true, 10, &[0], 500, 1),
            mark(true, 11, &[0], 500, 2),
            mark(true, 12, &[1], 1000, 3),
            mark(false, 20, &[0], 500, 1),
            // Back to back: the next starts the instant the last ends.
            mark(true, 20, &[0], 500, 4),
            mark(false, 30, &[0], 500, 2),
            mark(false, 30, &[0], 500, 4),
            mark(false, 30, &[1], 1000, 3),
        ];
        let runs: Vec<Interval> = intervals(&ok).into_values().collect();
        assert!(overcommits(&runs).is_empty());

        // A 0.25 share landing on GPU 1 while a whole-GPU gang replica holds 1 and 2.
        let bad = [
            mark(true, 10, &[1, 2], 1000, 1),
            mark(true, 15, &[1], 250, 2),
            mark(false, 16, &[1], 250, 2),
            mark(false, 20, &[1, 2], 1000, 1),
        ];
        let runs: Vec<Interval> = intervals(&bad).into_values().collect();
        let found = overcommits(&runs);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("1250"), "{found:?}");
    }

    #[test]
    fn trace_lines_parse() {
        let dir = temp_dir("axle-e2e-trace");
        let path = dir.path().join("t");
        std::fs::write(
            &path,
            "start 100 node-1 eu-1 2,3 1 7 2 1 4242 4241\nend 200 node-1 eu-1 0 0.25 8 1 0 5 4\n",
        )
        .unwrap();
        let m = read_trace(&path);
        assert_eq!(m[0].devices, [2, 3]);
        assert_eq!(
            (m[0].id, m[0].epoch, m[0].replica, m[0].milli),
            (7, 2, 1, 1000)
        );
        assert!(!m[1].start);
        assert_eq!(m[1].milli, 250);
    }
}

/// What one run of the `axle` CLI printed and returned.
#[derive(Debug)]
pub struct CliOut {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the `axle` binary with `AXLE_HUB=<hub_url>` and `args`.
pub async fn axle_cli(hub_url: &str, args: &[&str]) -> CliOut {
    let out = tokio::process::Command::new(bin("axle"))
        .args(args)
        .env("AXLE_HUB", hub_url)
        .env_remove("AXLE_TEAM")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run axle {args:?}: {e}"));
    CliOut {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
