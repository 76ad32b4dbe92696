//! Cloud burst end to end, with the binaries: a hub (`--burst`, TLS from its
//! own CA), an on-prem spoke that joins with a join token, and a loopback
//! fake of Lambda Cloud's API (every request and answer checked against the
//! saved OpenAPI spec) whose instances "boot" by running their user-data —
//! which starts a real `axle-spoke` with its one-time join token.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axle_e2e::lambda_fake::{FakeLambda, FakeType, KEY};
use axle_e2e::{Ports, bin, bin_dir, install_crypto};
use serde_json::{Value, json};

/// The scenarios run one at a time: each starts a hub and spokes, and on two
/// cores a parallel one would starve it past its timeouts.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Killed(Vec<Child>);
impl Drop for Killed {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

const POLICY: &str = r#"
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

struct Env {
    dir: tempfile::TempDir,
    http: reqwest::Client,
    base: String,
    grpc: u16,
    procs: Killed,
    ports: Ports,
    envs: Vec<(String, String)>,
}

fn spawn_hub(dir: &std::path::Path, ports: Ports, envs: &[(String, String)]) -> Child {
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
        .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("RUST_LOG", "info")
        .env_remove("AXLE_SPOKE_TOKEN")
        .env_remove("AXLE_STORE")
        .env_remove("AXLE_INSECURE_NO_TLS")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start axle-hub")
}

impl Env {
    /// Kills the hub with SIGKILL and starts it again on the same store.
    async fn kill9_and_restart(&mut self) {
        let mut hub = self.procs.0.remove(0);
        let _ = hub.kill();
        let _ = hub.wait();
        self.procs
            .0
            .insert(0, spawn_hub(self.dir.path(), self.ports, &self.envs));
        wait("the restarted hub", self, 30, async || {
            self.http
                .get(format!("{}/healthz", self.base))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
        })
        .await;
    }

    async fn get(&self, path: &str) -> Value {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        r.json().await.unwrap()
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
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

    async fn submit(&self, name: &str, command: &str, burst: bool, max_runtime_s: u64) -> u64 {
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

    async fn workload(&self, id: u64) -> Value {
        self.get(&format!("/api/v1/workloads/{id}")).await
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("hub.log")).unwrap_or_default()
    }

    async fn events(&self, kind: &str) -> Vec<Value> {
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

async fn wait<T>(what: &str, env: &Env, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
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
                "timed out waiting for {what}\n--- events ---\n{}\n--- burst ---\n{}\n--- hub log ---\n{}",
                lines.join("\n"),
                env.get("/api/v1/burst").await,
                env.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs a launched instance's user-data with `sh`, as cloud-init would; its
/// spoke keeps its identity in `dir/<instance id>`.
fn booter(
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
        let data = dir.join(&l.id);
        let log = std::fs::File::create(dir.join(format!("{}.log", l.id))).unwrap();
        let child = Command::new("sh")
            .arg("-c")
            .arg(&l.user_data)
            .env("AXLE_DATA_DIR", &data)
            .env_remove("AXLE_JOIN_TOKEN")
            .env_remove("AXLE_CA_FILE")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("boot the instance");
        machines.lock().unwrap().push(child);
    }
}

async fn start(fake: &FakeLambda) -> Env {
    let envs = [
        ("LAMBDA_API_KEY", KEY),
        ("LAMBDA_SSH_KEY_NAME", "axle-ops"),
        ("AXLE_BURST_ENDPOINT_LAMBDA_US", fake.url()),
    ];
    start_with(
        POLICY,
        envs.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
    .await
}

async fn start_with(policy_yaml: &str, envs: Vec<(String, String)>) -> Env {
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
async fn onprem_spoke(env: &mut Env) {
    onprem_spoke_with(env, "1xH100:80GB").await
}

async fn onprem_spoke_with(env: &mut Env, gpus: &str) {
    let (status, v) = env
        .post("/api/v1/clusters/onprem/join-tokens", json!({}))
        .await;
    assert!(status < 300, "{status} {v}");
    let token = v["token"].as_str().expect("a join token").to_string();
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
        .args(["--join-token", &token])
        .env_remove("AXLE_CA_FILE")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    env.procs.0.push(spoke);
    wait("the on-prem spoke", env, 30, async || {
        let cs = env.get("/api/v1/clusters").await;
        cs.as_array()?
            .iter()
            .any(|c| c["name"] == "onprem" && c["state"] == "Ready")
            .then_some(())
    })
    .await;
}

fn micro(v: &Value) -> u64 {
    v.as_u64().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn on_prem_full_bursts_to_the_cheapest_offer_runs_and_settles_to_the_second() {
    let _serial = SERIAL.lock().await;
    assert!(
        bin_dir().join("axle-spoke").exists(),
        "build the workspace first"
    );
    let fake = FakeLambda::start(vec![
        FakeType {
            name: "gpu_1x_h100_sxm5".into(),
            gpu_description: "H100 (80 GB SXM5)".into(),
            gpus: 1,
            cents_per_hour: 199,
            regions: vec!["us-east-1".into()],
        },
        FakeType {
            name: "gpu_1x_h100_pcie".into(),
            gpu_description: "H100 (80 GB PCIe)".into(),
            gpus: 1,
            cents_per_hour: 249,
            regions: vec!["us-east-1".into()],
        },
        // Cheaper, but in a region the team's data may not go to.
        FakeType {
            name: "gpu_1x_h100_eu".into(),
            gpu_description: "H100 (80 GB PCIe)".into(),
            gpus: 1,
            cents_per_hour: 99,
            regions: vec!["europe-central-1".into()],
        },
    ])
    .await;
    // The cheapest in-region offer has no capacity when launched.
    fake.refuse_launches_of("gpu_1x_h100_sxm5");
    let machines = Arc::new(Mutex::new(Vec::new()));
    let boot = Arc::new(Mutex::new(true));
    let mut env = start(&fake).await;
    let hub_tag = Arc::new(Mutex::new(String::new()));
    fake.on_launch(booter(
        env.dir.path().to_path_buf(),
        boot.clone(),
        machines.clone(),
        hub_tag.clone(),
    ));
    let _machines = scopeguard(machines.clone());
    onprem_spoke(&mut env).await;

    // The on-prem GPU is taken; the next workload may burst.
    let blocker = env.submit("blocker", "sleep 120", false, 600).await;
    wait("the blocker to run on-prem", &env, 30, async || {
        let w = env.workload(blocker).await;
        (w["state"] == "Running" && w["cluster"] == "onprem").then_some(())
    })
    .await;
    let submitted = Instant::now();
    let bursty = env.submit("bursty", "sleep 2", true, 600).await;
    let w = wait("the burst workload to succeed", &env, 60, async || {
        let w = env.workload(bursty).await;
        (w["state"] == "Succeeded").then_some(w)
    })
    .await;
    let cluster = w["cluster"].as_str().unwrap_or_default().to_string();
    assert!(cluster.starts_with("burst-lambda-us-"), "{w}");
    let done_s = submitted.elapsed().as_secs_f64();

    // Capacity fell through to the next-cheapest in-region offer; the EU one was never tried.
    assert_eq!(
        fake.capacity_errors(),
        1,
        "the SXM5 launch was refused once"
    );
    let view = env.get("/api/v1/burst").await;
    let instances = view["instances"].as_array().unwrap().clone();
    let failed: Vec<&Value> = instances
        .iter()
        .filter(|i| i["state"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1, "{view}");
    assert_eq!(failed[0]["instance_type"], "gpu_1x_h100_sxm5");
    assert_eq!(
        micro(&failed[0]["cost_micro_usd"]),
        0,
        "a launch that failed costs nothing"
    );
    let ran = instances
        .iter()
        .find(|i| i["cluster"] == cluster.as_str())
        .unwrap()
        .clone();
    assert_eq!(ran["instance_type"], "gpu_1x_h100_pcie");
    assert_eq!(ran["region"], "us-east-1");
    assert!(
        instances.iter().all(|i| i["region"] == "us-east-1"),
        "data residency: {view}"
    );

    // Idle for 2 s after its work: terminated, and the spend settled to the second.
    let id = ran["id"].as_str().unwrap().to_string();
    let settled = wait(
        "the instance to be terminated and settled",
        &env,
        30,
        async || {
            let v = env.get("/api/v1/burst").await;
            v["instances"]
                .as_array()?
                .iter()
                .find(|i| {
                    i["id"] == id.as_str() && i["state"] == "terminated" && i["settled"] == true
                })
                .cloned()
        },
    )
    .await;
    assert!(
        fake.instances().is_empty(),
        "nothing left running at the provider: {:?}",
        fake.instances()
    );
    let launched = micro(&settled["launched_at_ms"]);
    let joined = micro(&settled["joined_at_ms"]);
    let ended = micro(&settled["ended_at_ms"]);
    let seconds = (ended - launched).div_ceil(1000);
    let price = micro(&settled["price_per_hour_micro_usd"]);
    assert_eq!(price, 2_490_000);
    let expected = (u128::from(price) * u128::from(seconds)).div_ceil(3600) as u64;
    let cost = micro(&settled["cost_micro_usd"]);
    assert_eq!(cost, expected, "{seconds} s at $2.49/h: {settled}");
    assert!(cost <= micro(&settled["reserved_micro_usd"]));
    let team = view_team(&env.get("/api/v1/burst").await, "vision");
    assert_eq!(micro(&team["spent_micro_usd"]), cost);
    assert_eq!(
        micro(&team["committed_micro_usd"]),
        cost,
        "the rest was released"
    );
    // `axle get burst` shows the instance and the team's spend.
    let out = Command::new(bin("axle"))
        .arg("--ca-file")
        .arg(env.dir.path().join("hub").join("spoke-ca.pem"))
        .args(["get", "burst"])
        .env("AXLE_HUB", &env.base)
        .env_remove("AXLE_CA_FILE")
        .env_remove("AXLE_TOKEN")
        .env("NO_COLOR", "1")
        .output()
        .expect("run axle");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains(&id)
            && text.contains("terminated")
            && text.contains("gpu_1x_h100_pcie")
            && text.contains("$2.49")
            && text.contains("spend in ")
            && text.contains("$50.00"),
        "{text}"
    );
    eprintln!(
        "FIGURES burst: submit-to-succeeded {done_s:.1} s; launch-to-joined {} ms (Lambda paces launches 10 s apart, after the refused one); instance lived {seconds} s, settled {cost} micro-USD; capacity errors 1",
        joined - launched
    );

    // A workload whose reservation the budget cannot hold does not launch, and says why.
    let launches = fake.launches();
    let big = env.submit("big", "sleep 1", true, 100 * 3600).await;
    let reason = wait("the budget reason", &env, 30, async || {
        let w = env.workload(big).await;
        let r = w["pending_reason"].as_str().unwrap_or_default().to_string();
        r.contains("burst budget").then_some(r)
    })
    .await;
    assert!(
        reason.contains("team vision burst budget")
            && reason.contains("of $50.00 used")
            && reason.contains("this needs"),
        "{reason}"
    );
    assert_eq!(
        fake.launches(),
        launches,
        "nothing launched past the budget"
    );
    env.http
        .delete(format!("{}/api/v1/workloads/{big}", env.base))
        .send()
        .await
        .unwrap();

    // An instance whose spoke never joins is terminated after the join timeout.
    *boot.lock().unwrap() = false;
    let silent = env.submit("silent", "sleep 1", true, 600).await;
    let t0 = Instant::now();
    wait("a launch that never joins", &env, 30, async || {
        (fake.launches() > launches).then_some(())
    })
    .await;
    let note = wait(
        "the unjoined instance to be terminated",
        &env,
        40,
        async || {
            let v = env.get("/api/v1/burst").await;
            v["instances"].as_array()?.iter().find_map(|i| {
                (i["workload"] == silent && i["state"] == "terminated")
                    .then(|| i["note"].as_str().unwrap_or_default().to_string())
            })
        },
    )
    .await;
    assert!(note.contains("did not join within 8 s"), "{note}");
    eprintln!(
        "FIGURES burst: never-joined instance terminated {:.1} s after its launch",
        t0.elapsed().as_secs_f64()
    );
    env.http
        .delete(format!("{}/api/v1/workloads/{silent}", env.base))
        .send()
        .await
        .unwrap();

    // An instance with this hub's tags that no burst claims is reaped after the grace period.
    let hub_tag = hub_tag.lock().unwrap().clone();
    assert_eq!(hub_tag.len(), 16, "launches carry this hub's tag");
    let orphan = fake.seed(
        "gpu_1x_h100_pcie",
        "us-east-1",
        &[
            ("axle-managed-by", "axle"),
            ("axle-hub", &hub_tag),
            ("axle-burst-id", "0000deadbeef"),
        ],
    );
    // Someone else's instance in the same account is left alone.
    let theirs = fake.seed("gpu_1x_h100_pcie", "us-east-1", &[("team", "ml")]);
    wait("the orphan to be terminated", &env, 30, async || {
        let ids: Vec<String> = fake.instances().into_iter().map(|i| i.0).collect();
        (!ids.contains(&orphan)).then_some(())
    })
    .await;
    let reaped = wait("the reaper's event", &env, 10, async || {
        let e = env.events("burst_orphan_terminated").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert!(
        reaped[0]["message"].as_str().unwrap().contains(&orphan),
        "{reaped:?}"
    );
    let left: Vec<String> = fake.instances().into_iter().map(|i| i.0).collect();
    assert_eq!(left, vec![theirs], "only the other team's instance is left");

    // Every spend stays within the budget, checked against the provider's own list.
    let view = env.get("/api/v1/burst").await;
    let team = view_team(&view, "vision");
    assert!(micro(&team["committed_micro_usd"]) <= micro(&team["budget_micro_usd"]));
    let live: Vec<&Value> = view["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] != "terminated" && i["state"] != "failed")
        .collect();
    assert!(live.is_empty(), "no live bursts at the end: {view}");
    fake.assert_clean();
}

fn view_team(view: &Value, team: &str) -> Value {
    view["teams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["team"] == team)
        .cloned()
        .unwrap()
}

fn scopeguard(m: Arc<Mutex<Vec<Child>>>) -> impl Drop {
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

fn h100_pcie() -> FakeType {
    FakeType {
        name: "gpu_1x_h100_pcie".into(),
        gpu_description: "H100 (80 GB PCIe)".into(),
        gpus: 1,
        cents_per_hour: 249,
        regions: vec!["us-east-1".into()],
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hub_killed_mid_launch_adopts_its_instance_and_a_reclaimed_instance_requeues_its_work() {
    let _serial = SERIAL.lock().await;
    assert!(
        bin_dir().join("axle-spoke").exists(),
        "build the workspace first"
    );
    let fake = FakeLambda::start(vec![h100_pcie()]).await;
    let machines = Arc::new(Mutex::new(Vec::new()));
    let boot = Arc::new(Mutex::new(true));
    let hub_tag = Arc::new(Mutex::new(String::new()));
    let mut env = start(&fake).await;
    fake.on_launch(booter(
        env.dir.path().to_path_buf(),
        boot.clone(),
        machines.clone(),
        hub_tag.clone(),
    ));
    let _machines = scopeguard(machines.clone());
    onprem_spoke(&mut env).await;
    let blocker = env.submit("blocker", "sleep 300", false, 600).await;
    wait("the blocker to run on-prem", &env, 30, async || {
        let w = env.workload(blocker).await;
        (w["state"] == "Running").then_some(())
    })
    .await;

    // The provider makes the instance, and the hub dies before it hears so.
    fake.hang_launches(true);
    let long = env.submit("long", "sleep 300", true, 600).await;
    wait("the launch to reach the provider", &env, 30, async || {
        (fake.launches() == 1).then_some(())
    })
    .await;
    env.kill9_and_restart().await;
    fake.hang_launches(false);
    let w = wait(
        "the workload to run on the adopted instance",
        &env,
        60,
        async || {
            let w = env.workload(long).await;
            (w["state"] == "Running").then_some(w)
        },
    )
    .await;
    assert!(
        w["cluster"]
            .as_str()
            .unwrap()
            .starts_with("burst-lambda-us-"),
        "{w}"
    );
    assert_eq!(
        fake.launches(),
        1,
        "adopted by its tag, never launched twice"
    );
    assert_eq!(fake.instances().len(), 1);
    let view = env.get("/api/v1/burst").await;
    let live: Vec<&Value> = view["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] == "ready")
        .collect();
    assert_eq!(live.len(), 1, "one burst, one reservation: {view}");
    let reserved = micro(&live[0]["reserved_micro_usd"]);
    assert_eq!(
        micro(&view_team(&view, "vision")["committed_micro_usd"]),
        reserved,
        "charged once"
    );

    // The provider takes the instance back (a reclaim): its work is re-queued.
    let (instance, _, _, _, _) = fake.instances().remove(0);
    *boot.lock().unwrap() = false;
    fake.hang_launches(true);
    fake.take_back(&instance);
    wait(
        "the reclaimed instance's work to be re-queued",
        &env,
        30,
        async || {
            let e = env.events("requeued").await;
            e.iter().any(|e| e["workload"] == long).then_some(())
        },
    )
    .await;
    assert!(!env.events("burst_interrupted").await.is_empty());

    // It wants a burst again, and the provider now takes launches and never
    // answers. On-prem placement does not wait on it: the GPU the blocker
    // frees goes to the waiting workload at once.
    wait(
        "the second launch to hang at the provider",
        &env,
        30,
        async || (fake.launches() == 2).then_some(()),
    )
    .await;
    let t0 = Instant::now();
    env.http
        .delete(format!("{}/api/v1/workloads/{blocker}", env.base))
        .send()
        .await
        .unwrap();
    wait(
        "the waiting workload to be placed on-prem",
        &env,
        30,
        async || {
            let w = env.workload(long).await;
            (w["cluster"] == "onprem").then_some(())
        },
    )
    .await;
    let placed_ms = t0.elapsed().as_millis();
    let t1 = Instant::now();
    let quick = env.submit("quick", "sleep 1", false, 600).await;
    let submit_ms = t1.elapsed().as_millis();
    let _ = quick;
    eprintln!(
        "FIGURES burst: with a launch hanging at the provider, cancel-to-placed on-prem {placed_ms} ms (includes the blocker's stop), submit answered in {submit_ms} ms"
    );
    fake.assert_clean();
}

/// `moto_server` (PyPI `moto[server]`, installed by `scripts/prereqs.sh test`)
/// on a free loopback port, killed when dropped.
struct Moto(Child, u16);
impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn moto() -> Moto {
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

const TEAMS: usize = 5;
const PER_TEAM: usize = 40;

fn fleet_policy() -> String {
    let mut p = String::from(
        r#"
apiVersion: axle.dev/v1
kind: Settings
metadata: {name: default}
spec:
  burstWaitThresholdSeconds: 1
  defaultBurstRuntimeSeconds: 600
  platformAdmins: [platform-admin]
---
apiVersion: axle.dev/v1
kind: BurstProvider
metadata: {name: aws-us}
spec:
  type: aws
  regions: [us-east-1]
  instanceTypes: [g5.xlarge]
  gpuModels: [A10G]
  maxInstances: 1000
  prices:
    g5.xlarge: {onDemand: 1.006}
  images: {us-east-1: ami-axle-spoke}
  joinTimeoutSeconds: 600
  idleTimeoutSeconds: 2
---
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: onprem}
spec:
  region: us-east-1
  nodes:
    - {count: 1, gpuModel: A10G, gpusPerNode: 1, gpuMemoryGb: 24}
"#,
    );
    for t in 0..TEAMS {
        p.push_str(&format!(
            r#"---
apiVersion: axle.dev/v1
kind: Team
metadata: {{name: team-{t}}}
spec:
  quotas:
    A10G: {{guaranteed: 0, limit: 100}}
  burst:
    budgetUsdPerMonth: {budget}
    providers: [aws-us]
"#,
            budget = 2 + t
        ));
    }
    p
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_burst_wishes_across_five_teams_never_pass_a_budget_by_a_cent() {
    let _serial = SERIAL.lock().await;
    let moto = moto().await;
    let endpoint = format!("http://127.0.0.1:{}", moto.1);
    let envs: Vec<(String, String)> = [
        ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
        ("AWS_SECRET_ACCESS_KEY", "dummy-secret"),
        ("AWS_REGION", "us-east-1"),
        ("AXLE_BURST_ENDPOINT_AWS_US", endpoint.as_str()),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut env = start_with(&fleet_policy(), envs).await;
    onprem_spoke_with(&mut env, "1xA10G:24GB").await;
    let (status, v) = env
        .post(
            "/api/v1/workloads",
            json!({
                "team": "team-4", "name": "on-prem", "gpus": 1.0, "gpu_model": "A10G",
                "priority": "training", "command": ["sleep", "600"],
            }),
        )
        .await;
    assert!(status < 300, "{status} {v}");
    // All at once, from many clients, with on-prem full: every one wants a burst.
    let t0 = Instant::now();
    let env = Arc::new(env);
    let mut ids = Vec::new();
    let mut tasks = Vec::new();
    for t in 0..TEAMS {
        for i in 0..PER_TEAM {
            let env = env.clone();
            tasks.push(tokio::spawn(async move {
                let (status, v) = env
                    .post(
                        "/api/v1/workloads",
                        json!({
                            "team": format!("team-{t}"), "name": format!("w{t}-{i}"),
                            "gpus": 1.0, "gpu_model": "A10G", "priority": "training",
                            "command": ["sleep", "600"], "burst_allowed": true,
                            "max_runtime_s": 600,
                        }),
                    )
                    .await;
                assert!(status < 300, "{status} {v}");
                v["id"].as_u64().unwrap()
            }));
        }
    }
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    // g5.xlarge at $1.006/h, reserved for 600 s + 2 s idle: $0.168226 each,
    // so team-t's budget of $(2+t) holds floor((2+t) / 0.168226) launches.
    let per = 168_226u64;
    let expected: Vec<u64> = (0..TEAMS as u64)
        .map(|t| (2 + t) * 1_000_000 / per)
        .collect();
    let want: u64 = expected.iter().sum();
    let view = wait("every budget to fill", &env, 120, async || {
        let v = env.get("/api/v1/burst").await;
        let live = v["instances"]
            .as_array()?
            .iter()
            .filter(|i| i["state"] == "joining")
            .count() as u64;
        (live == want).then_some(v)
    })
    .await;
    let filled_s = t0.elapsed().as_secs_f64();
    // A little longer: nothing more launches.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let view2 = env.get("/api/v1/burst").await;
    let live_of = |v: &Value| {
        v["instances"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["state"] != "failed" && i["state"] != "terminated")
            .count()
    };
    let states: Vec<String> = view2["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] != "joining")
        .map(|i| format!("{} {} {}", i["team"], i["state"], i["note"]))
        .collect();
    assert_eq!(
        live_of(&view),
        live_of(&view2),
        "nothing launched past the budgets: {states:?}"
    );
    // The provider's own list: every instance Axle launched, by team.
    let aws = axle_burst::aws::Aws::new(axle_burst::aws::AwsConfig {
        regions: vec!["us-east-1".into()],
        prices: Default::default(),
        image_ids: Default::default(),
        endpoint: Some(endpoint.clone()),
        credentials: Some((
            axle_burst::credentials::Secret::new("AKIDEXAMPLE"),
            axle_burst::credentials::Secret::new("dummy-secret"),
        )),
    })
    .await
    .unwrap();
    use axle_burst::Provider;
    let listed = aws.list(axle_burst::TAG_MANAGED_BY, "axle").await.unwrap();
    let team_of: std::collections::BTreeMap<String, String> = view2["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["id"].as_str().unwrap().to_string(),
                i["team"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut running = [0u64; TEAMS];
    for i in listed
        .iter()
        .filter(|i| i.state != axle_burst::InstanceState::Terminated)
    {
        let bid = &i.tags[axle_burst::TAG_BURST_ID];
        let team = team_of
            .get(bid)
            .unwrap_or_else(|| panic!("an orphan: {i:?}"));
        let t: usize = team.trim_start_matches("team-").parse().unwrap();
        running[t] += 1;
    }
    let mut over_cents = 0i64;
    for t in 0..TEAMS {
        let spend = view_team(&view2, &format!("team-{t}"));
        let budget = micro(&spend["budget_micro_usd"]);
        let committed = micro(&spend["committed_micro_usd"]);
        // What the provider runs for the team, at the reserved window.
        let at_provider = running[t] * per;
        over_cents = over_cents.max((committed as i64 - budget as i64) / 10_000);
        over_cents = over_cents.max((at_provider as i64 - budget as i64) / 10_000);
        assert!(committed <= budget, "team-{t}: {committed} > {budget}");
        assert!(
            at_provider <= budget,
            "team-{t}: the provider runs {}; the ledger: {:?}",
            running[t],
            view2["instances"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|i| i["team"] == format!("team-{t}").as_str())
                .map(|i| format!(
                    "{} {} {} {}",
                    i["id"], i["state"], i["reserved_micro_usd"], i["note"]
                ))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            running[t], expected[t],
            "team-{t}: launches the budget holds"
        );
    }
    // The rest wait, and say it is the budget.
    let w = env.workload(ids[PER_TEAM - 1]).await;
    let reason = w["pending_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("team team-0 burst budget"), "{w}");

    // Cancel everything: every instance is terminated, none is left.
    for id in &ids {
        env.http
            .delete(format!("{}/api/v1/workloads/{id}", env.base))
            .send()
            .await
            .unwrap();
    }
    wait("every instance to be terminated", &env, 120, async || {
        let listed = aws.list(axle_burst::TAG_MANAGED_BY, "axle").await.ok()?;
        listed
            .iter()
            .all(|i| i.state == axle_burst::InstanceState::Terminated)
            .then_some(())
    })
    .await;
    let end = env.get("/api/v1/burst").await;
    let orphans = end["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] != "terminated" && i["state"] != "failed")
        .count();
    assert_eq!(orphans, 0, "{end}");
    eprintln!(
        "FIGURES burst fleet: {} workloads across {TEAMS} teams; {want} instances launched on moto in {filled_s:.1} s (budgets held {:?}); cents over budget: {over_cents}; orphans after cancelling all: 0",
        ids.len(),
        expected
    );
}
