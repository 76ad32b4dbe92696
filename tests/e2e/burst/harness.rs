//! What the burst scenarios share: a hub with `--burst` and its own CA, an
//! on-prem spoke joined with a join token, a booter that runs a launched
//! instance's user-data as cloud-init would, and `moto_server`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axle_e2e::lambda_fake::{FakeLambda, FakeType, KEY};
use axle_e2e::{Ports, bin, install_crypto};
use serde_json::{Value, json};

/// The scenarios run one at a time: each starts a hub and spokes, and on two
/// cores a parallel one would starve it past its timeouts.
pub(crate) static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub(crate) struct Killed(pub(crate) Vec<Child>);
impl Drop for Killed {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(crate) const POLICY: &str = r#"
apiVersion: axle.dev/v1
kind: Settings
metadata: {name: default}
spec:
  burstWaitThresholdSeconds: 1
  defaultBurstRuntimeSeconds: 600
  spokeLostAfterSeconds: 30
  platformAdmins: [platform-admin]
---
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: onprem}
spec:
  region: us-east-1
  priceUsdPerGpuHour: 1.1
  nodes:
    - {count: 1, gpuModel: H100, gpusPerNode: 1, gpuMemoryGb: 80}
---
apiVersion: axle.dev/v1
kind: Team
metadata: {name: vision}
spec:
  quotas:
    H100: {guaranteed: 1, limit: 4}
  burst:
    budgetUsdPerMonth: 50
    providers: [lambda-us]
    regions: [us-east-1]
---
apiVersion: axle.dev/v1
kind: BurstProvider
metadata: {name: lambda-us}
spec:
  type: lambda
  regions: [us-east-1]
  gpuModels: [H100]
  maxInstances: 4
  joinTimeoutSeconds: 8
  idleTimeoutSeconds: 2
"#;

pub(crate) struct Env {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
    pub(crate) grpc: u16,
    pub(crate) procs: Killed,
    pub(crate) ports: Ports,
    pub(crate) envs: Vec<(String, String)>,
}

pub(crate) fn spawn_hub(dir: &std::path::Path, ports: Ports, envs: &[(String, String)]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("hub.log"))
        .unwrap();
    Command::new(bin("axle-hub"))
        .arg("--policy")
        .arg(dir.join("policy"))
        .arg("--data-dir")
        .arg(dir.join("hub"))
        .args(["--http", &format!("127.0.0.1:{}", ports.http)])
        .args(["--grpc", &format!("127.0.0.1:{}", ports.grpc)])
        .args(["--auth", "none", "--burst", "--burst-list-every-s", "1"])
        .args(["--burst-orphan-grace-s", "2", "--burst-spoke-command"])
        .arg(bin("axle-spoke"))
        .env_remove("AXLE_SPOKE_TOKEN")
        .env_remove("AXLE_STORE")
        .env_remove("AXLE_INSECURE_NO_TLS")
        // A scenario's own environment (credentials, endpoints, `AXLE_STORE`).
        .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start axle-hub")
}

impl Env {
    /// Kills the hub with SIGKILL and starts it again on the same store.
    pub(crate) async fn kill9_and_restart(&mut self) {
        self.kill9();
        self.restart().await;
    }

    /// Kills the hub with SIGKILL (nothing listens on its ports until
    /// [`Env::restart`]).
    pub(crate) fn kill9(&mut self) {
        let mut hub = std::mem::replace(
            &mut self.procs.0[0],
            Command::new("true").spawn().expect("a placeholder"),
        );
        let _ = hub.kill();
        let _ = hub.wait();
    }

    /// Starts the hub again on the same store and ports.
    pub(crate) async fn restart(&mut self) {
        let mut gone = std::mem::replace(
            &mut self.procs.0[0],
            spawn_hub(self.dir.path(), self.ports, &self.envs),
        );
        let _ = gone.kill();
        let _ = gone.wait();
        wait("the restarted hub", self, 30, async || {
            self.http
                .get(format!("{}/healthz", self.base))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
        })
        .await;
        // On etcd it leads once the killed one's lease has run out; until
        // then it sends callers to the leader.
        wait("the restarted hub to lead", self, 60, async || {
            self.http
                .get(format!("{}/api/v1/clusters", self.base))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
        })
        .await;
    }

    pub(crate) async fn get(&self, path: &str) -> Value {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        r.json().await.unwrap()
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub(crate) async fn submit(
        &self,
        name: &str,
        command: &str,
        burst: bool,
        max_runtime_s: u64,
    ) -> u64 {
        let (status, v) = self
            .post(
                "/api/v1/workloads",
                json!({
                    "team": "vision", "name": name, "gpus": 1.0, "gpu_model": "H100",
                    "priority": "training", "command": ["sh", "-c", command],
                    "burst_allowed": burst, "max_runtime_s": max_runtime_s,
                }),
            )
            .await;
        assert!(status < 300, "submit {name}: {status} {v}");
        v["id"].as_u64().unwrap()
    }

    /// Takes the on-prem H100: submits `blocker` (no burst) running
    /// `command` and waits until it runs on `onprem`; its id.
    pub(crate) async fn fill_onprem(&self, command: &str) -> u64 {
        let blocker = self.submit("blocker", command, false, 600).await;
        wait("the blocker to run on-prem", self, 30, async || {
            let w = self.workload(blocker).await;
            (w["state"] == "Running" && w["cluster"] == "onprem").then_some(())
        })
        .await;
        blocker
    }

    /// Cancels workload `id` (DELETE), whatever it is doing.
    pub(crate) async fn cancel(&self, id: u64) {
        self.http
            .delete(format!("{}/api/v1/workloads/{id}", self.base))
            .send()
            .await
            .unwrap();
    }

    pub(crate) async fn workload(&self, id: u64) -> Value {
        self.get(&format!("/api/v1/workloads/{id}")).await
    }

    /// The last lines of every spoke's log (on-prem and booted instances).
    pub(crate) fn spoke_logs(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = e.path();
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            if name.ends_with(".log") && name != "hub.log" {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n");
                out.push_str(&format!("== {name}\n{tail}\n"));
            }
        }
        out
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("hub.log")).unwrap_or_default()
    }

    pub(crate) async fn events(&self, kind: &str) -> Vec<Value> {
        let v = self.get("/api/v1/events?tail=1000").await;
        v.as_array()
            .or_else(|| v["events"].as_array())
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["kind"] == kind)
            .collect()
    }
}

pub(crate) async fn wait<T>(
    what: &str,
    env: &Env,
    secs: u64,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > deadline {
            let events = env.get("/api/v1/events?tail=60").await;
            let lines: Vec<String> = events
                .as_array()
                .or_else(|| events["events"].as_array())
                .into_iter()
                .flatten()
                .map(|e| format!("{} {}", e["kind"], e["message"]))
                .collect();
            panic!(
                "timed out waiting for {what}\n--- events ---\n{}\n--- burst ---\n{}\n--- spoke logs ---\n{}\n--- hub log ---\n{}",
                lines.join("\n"),
                env.get("/api/v1/burst").await,
                env.spoke_logs(),
                env.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs a launched instance's user-data with `sh`, as cloud-init would; its
/// spoke keeps its identity in `dir/<instance id>`.
pub(crate) fn booter(
    dir: PathBuf,
    boot: Arc<Mutex<bool>>,
    machines: Arc<Mutex<Vec<Child>>>,
    hub_tag: Arc<Mutex<String>>,
) -> impl Fn(&axle_e2e::lambda_fake::Launched) + Send + Sync {
    move |l| {
        if let Some(t) = l.tags.get("axle-hub") {
            *hub_tag.lock().unwrap() = t.clone();
        }
        if !*boot.lock().unwrap() {
            return;
        }
        machines
            .lock()
            .unwrap()
            .push(boot_machine(&dir, &l.id, &l.user_data));
    }
}

/// Boots machine `id`: runs its boot script `user_data` with `sh`, as
/// cloud-init (or a pod's entrypoint) would.
pub(crate) fn boot_machine(dir: &std::path::Path, id: &str, user_data: &str) -> Child {
    boot_command(dir, id, user_data)
        .spawn()
        .expect("boot the machine")
}

/// The command [`boot_machine`] runs: its spoke keeps its identity in
/// `dir/<id>` and its log in `dir/<id>.log`.
pub(crate) fn boot_command(dir: &std::path::Path, id: &str, user_data: &str) -> Command {
    let log = std::fs::File::create(dir.join(format!("{id}.log"))).unwrap();
    let mut boot = Command::new("sh");
    boot.arg("-c")
        .arg(user_data)
        .env("AXLE_DATA_DIR", dir.join(id))
        .env_remove("AXLE_JOIN_TOKEN")
        .env_remove("AXLE_CA_FILE")
        .stdout(Stdio::null())
        .stderr(log);
    boot
}

pub(crate) async fn start(fake: &FakeLambda) -> Env {
    start_on(fake, None).await
}

/// [`start`], on the store at `store` (`etcd://…`; `None`: the embedded one).
pub(crate) async fn start_on(fake: &FakeLambda, store: Option<String>) -> Env {
    let mut envs: Vec<(String, String)> = [
        ("LAMBDA_API_KEY", KEY),
        ("LAMBDA_SSH_KEY_NAME", "axle-ops"),
        ("AXLE_BURST_ENDPOINT_LAMBDA_US", fake.url()),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if let Some(url) = store {
        envs.push(("AXLE_STORE".into(), url));
    }
    start_with(POLICY, envs).await
}

pub(crate) async fn start_with(policy_yaml: &str, envs: Vec<(String, String)>) -> Env {
    install_crypto();
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy");
    std::fs::create_dir_all(&policy).unwrap();
    std::fs::write(policy.join("policy.yaml"), policy_yaml).unwrap();
    let data = dir.path().join("hub");
    let ports = Ports::free();
    let hub = spawn_hub(dir.path(), ports, &envs);
    let ca_path = data.join("spoke-ca.pem");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ca_path.exists() {
        assert!(Instant::now() < deadline, "the hub wrote no spoke-ca.pem");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&ca_path).unwrap()).unwrap();
    let http = reqwest::Client::builder()
        .add_root_certificate(ca)
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let env = Env {
        dir,
        http,
        base: format!("https://127.0.0.1:{}", ports.http),
        grpc: ports.grpc,
        procs: Killed(vec![hub]),
        ports,
        envs,
    };
    wait("the hub's API", &env, 30, async || {
        env.http
            .get(format!("{}/healthz", env.base))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
    env
}

/// The on-prem spoke: one H100, joined with a join token.
pub(crate) async fn onprem_spoke(env: &mut Env) {
    onprem_spoke_with(env, "1xH100:80GB").await
}

pub(crate) async fn onprem_spoke_with(env: &mut Env, gpus: &str) {
    let token = join_token(env, "onprem").await;
    spawn_onprem_spoke(env, gpus, &token);
    wait("the on-prem spoke", env, 30, async || {
        let cs = env.get("/api/v1/clusters").await;
        cs.as_array()?
            .iter()
            .any(|c| c["name"] == "onprem" && c["state"] == "Ready")
            .then_some(())
    })
    .await;
}

/// A one-time join token for `cluster`.
pub(crate) async fn join_token(env: &Env, cluster: &str) -> String {
    let (status, v) = env
        .post(
            &format!("/api/v1/clusters/{cluster}/join-tokens"),
            json!({}),
        )
        .await;
    assert!(status < 300, "{status} {v}");
    v["token"].as_str().expect("a join token").to_string()
}

/// Starts the on-prem spoke with `token` (it joins on its own time).
pub(crate) fn spawn_onprem_spoke(env: &mut Env, gpus: &str, token: &str) {
    let log = std::fs::File::create(env.dir.path().join("onprem.log")).unwrap();
    let spoke = Command::new(bin("axle-spoke"))
        .args(["--hub", &format!("https://127.0.0.1:{}", env.grpc)])
        .args([
            "--cluster",
            "onprem",
            "--region",
            "us-east-1",
            "--gpus",
            gpus,
        ])
        .arg("--data-dir")
        .arg(env.dir.path().join("onprem"))
        .args(["--join-token", token])
        .env_remove("AXLE_CA_FILE")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    env.procs.0.push(spoke);
}

pub(crate) fn micro(v: &Value) -> u64 {
    v.as_u64().unwrap_or_default()
}

pub(crate) fn view_team(view: &Value, team: &str) -> Value {
    view["teams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["team"] == team)
        .cloned()
        .unwrap()
}

pub(crate) fn scopeguard(m: Arc<Mutex<Vec<Child>>>) -> impl Drop {
    struct G(Arc<Mutex<Vec<Child>>>);
    impl Drop for G {
        fn drop(&mut self) {
            for c in self.0.lock().unwrap().iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    G(m)
}

pub(crate) fn h100_pcie() -> FakeType {
    FakeType {
        name: "gpu_1x_h100_pcie".into(),
        gpu_description: "H100 (80 GB PCIe)".into(),
        gpus: 1,
        cents_per_hour: 249,
        regions: vec!["us-east-1".into()],
    }
}

/// `moto_server` (PyPI `moto[server]`, installed by `scripts/prereqs.sh test`)
/// on a free loopback port, killed when dropped.
pub(crate) struct Moto(Child, pub(crate) u16);
impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Moto {
    /// The hub's environment for BurstProvider `aws-us` against this moto:
    /// dummy credentials and the endpoint override.
    pub(crate) fn hub_envs(&self) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "dummy-secret"),
            ("AWS_REGION", "us-east-1"),
            ("AXLE_BURST_ENDPOINT_AWS_US", self.endpoint().as_str()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.1)
    }
}

pub(crate) async fn moto() -> Moto {
    let port = axle_e2e::free_port();
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("moto_server (pip install 'moto[server]'; scripts/prereqs.sh test installs it)");
    let m = Moto(child, port);
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("moto_server did not start on port {port}");
}
