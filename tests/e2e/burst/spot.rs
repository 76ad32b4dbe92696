//! Spot capacity on EC2 (moto): a checkpointable workload bursts to a spot
//! instance (InstanceMarketOptions), the instance boots from the user-data
//! EC2 holds for it (the spoke joins with its one-time join token), and
//! - when EC2 takes the instance back unannounced, the workload is re-queued;
//! - when EC2 posts its two-minute interruption notice in the instance
//!   metadata service (a loopback IMDSv2 here: moto has no notices), the
//!   spoke tells the hub, which drains the instance, stops the workload with
//!   its checkpoint signal in time (it saves), re-queues it and terminates
//!   the instance itself.

use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use super::harness::*;

const POLICY_SPOT: &str = r#"
apiVersion: axle.dev/v1
kind: Settings
metadata: {name: default}
spec:
  burstWaitThresholdSeconds: 1
  defaultBurstRuntimeSeconds: 600
  spokeLostAfterSeconds: 30
  defaultPriorityClass: training
  platformAdmins: [platform-admin]
---
apiVersion: axle.dev/v1
kind: PriorityClass
metadata: {name: production}
spec:
  value: 1000
  preemptibleBy: []
---
apiVersion: axle.dev/v1
kind: PriorityClass
metadata: {name: training}
spec:
  value: 100
  preemptibleBy: [production]
  gracePeriodSeconds: 5
  checkpointable: true
  checkpointIntervalSeconds: 60
---
apiVersion: axle.dev/v1
kind: BurstProvider
metadata: {name: aws-us}
spec:
  type: aws
  regions: [us-east-1]
  instanceTypes: [g5.xlarge]
  gpuModels: [A10G]
  maxInstances: 4
  prices:
    g5.xlarge: {onDemand: 1.006, spot: 0.40}
  allowSpot: true
  images: {us-east-1: ami-axle-spoke}
  joinTimeoutSeconds: 60
  idleTimeoutSeconds: 2
---
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: onprem}
spec:
  region: us-east-1
  nodes:
    - {count: 1, gpuModel: A10G, gpusPerNode: 1, gpuMemoryGb: 24}
---
apiVersion: axle.dev/v1
kind: Team
metadata: {name: vision}
spec:
  quotas:
    A10G: {guaranteed: 1, limit: 4}
  burst:
    budgetUsdPerMonth: 10
    providers: [aws-us]
"#;

/// A plain EC2 client on moto: what the test reads and does as EC2 itself.
fn ec2(endpoint: &str) -> aws_sdk_ec2::Client {
    aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::config::Builder::new()
            .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
            .region(aws_sdk_ec2::config::Region::new("us-east-1"))
            .endpoint_url(endpoint)
            .credentials_provider(aws_sdk_ec2::config::Credentials::new(
                "AKIDEXAMPLE",
                "dummy-secret",
                None,
                None,
                "test",
            ))
            .http_client(
                aws_smithy_http_client::Builder::new()
                    .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                        aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                    ))
                    .build_https(),
            )
            .build(),
    )
}

async fn submit(env: &Env, name: &str, burst: bool, command: &[&str]) -> u64 {
    let (status, v) = env
        .post(
            "/api/v1/workloads",
            json!({
                "team": "vision", "name": name, "gpus": 1.0, "gpu_model": "A10G",
                "priority": "training", "command": command,
                "burst_allowed": burst, "max_runtime_s": 600,
            }),
        )
        .await;
    assert!(status < 300, "submit {name}: {status} {v}");
    v["id"].as_u64().unwrap()
}

/// A checkpointable workload running on a spot instance that booted from
/// its user-data, with the on-prem GPU held by `blocker`. The instance's
/// spoke is killed first, then the hub, then moto.
struct OnSpot {
    machines: Arc<Mutex<Vec<Child>>>,
    env: Env,
    _moto: Moto,
    ec2: aws_sdk_ec2::Client,
    blocker: u64,
    workload: u64,
    instance: String,
    cluster: String,
    script: String,
    launched_s: f64,
    running_s: f64,
}

/// Bursts `command` to spot and boots the instance; its spoke reads the
/// instance metadata service at `imds` (the spoke's default otherwise).
async fn run_on_spot(command: &[&str], imds: Option<&str>) -> OnSpot {
    let moto = moto().await;
    let endpoint = moto.endpoint();
    let envs = moto.hub_envs();
    let mut env = start_with(POLICY_SPOT, envs).await;
    onprem_spoke_with(&mut env, "1xA10G:24GB").await;
    let machines: Arc<Mutex<Vec<Child>>> = Arc::new(Mutex::new(Vec::new()));
    let blocker = submit(&env, "blocker", false, &["sleep", "300"]).await;
    wait("the blocker to run on-prem", &env, 30, async || {
        let w = env.workload(blocker).await;
        (w["state"] == "Running").then_some(())
    })
    .await;

    // On-prem is full: the checkpointable workload bursts, on spot.
    let submitted = Instant::now();
    let s = submit(&env, "spot", true, command).await;
    let burst = wait("a spot launch", &env, 60, async || {
        let v = env.get("/api/v1/burst").await;
        v["instances"]
            .as_array()?
            .iter()
            .find_map(|i| (i["workload"] == s && i["state"] == "joining").then(|| i.clone()))
    })
    .await;
    let launched_s = submitted.elapsed().as_secs_f64();
    assert_eq!(burst["spot"], true, "{burst}");
    assert_eq!(
        micro(&burst["price_per_hour_micro_usd"]),
        400_000,
        "the policy's spot price: {burst}"
    );
    let instance = burst["instance_id"].as_str().unwrap().to_string();
    let cluster = burst["cluster"].as_str().unwrap().to_string();

    // EC2's own view: a spot instance, carrying a boot script with a join
    // token whose spoke watches for the interruption notice.
    let ec2 = ec2(&endpoint);
    let described = ec2
        .describe_instances()
        .instance_ids(&instance)
        .send()
        .await
        .unwrap();
    let inst = described.reservations()[0].instances()[0].clone();
    assert_eq!(
        inst.instance_lifecycle().map(|l| l.as_str()),
        Some("spot"),
        "{inst:?}"
    );
    let attr = ec2
        .describe_instance_attribute()
        .instance_id(&instance)
        .attribute(aws_sdk_ec2::types::InstanceAttributeName::UserData)
        .send()
        .await
        .unwrap();
    let script = base64::engine::general_purpose::STANDARD
        .decode(attr.user_data().and_then(|u| u.value()).unwrap())
        .unwrap();
    let script = String::from_utf8(script).unwrap();
    assert!(
        script.contains("--join-token '")
            && script.contains(&format!("--cluster '{cluster}'"))
            && script.contains(" --ec2-spot-notices"),
        "{script}"
    );

    // The instance boots: cloud-init runs the user-data.
    let mut boot = boot_command(env.dir.path(), &instance, &script);
    if let Some(url) = imds {
        boot.env("AXLE_IMDS_ENDPOINT", url);
    }
    machines.lock().unwrap().push(boot.spawn().unwrap());
    let w = wait("the workload to run on spot", &env, 60, async || {
        let w = env.workload(s).await;
        (w["state"] == "Running" && w["cluster"] == cluster.as_str()).then_some(w)
    })
    .await;
    let running_s = submitted.elapsed().as_secs_f64();
    assert_eq!(w["checkpointable"], true, "{w}");
    OnSpot {
        machines,
        env,
        _moto: moto,
        ec2,
        blocker,
        workload: s,
        instance,
        cluster,
        script,
        launched_s,
        running_s,
    }
}

impl Drop for OnSpot {
    fn drop(&mut self) {
        for c in self.machines.lock().unwrap().iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl OnSpot {
    /// Cancels everything and waits until nothing is left running at EC2;
    /// the team's spend stays inside its budget.
    async fn end(&self) {
        for id in [self.workload, self.blocker] {
            self.env.cancel(id).await;
        }
        wait("every instance to end at EC2", &self.env, 60, async || {
            let out = self.ec2.describe_instances().send().await.ok()?;
            out.reservations()
                .iter()
                .flat_map(|r| r.instances())
                .all(|i| i.state().and_then(|s| s.name()).map(|n| n.as_str()) == Some("terminated"))
                .then_some(())
        })
        .await;
        let view: Value = self.env.get("/api/v1/burst").await;
        let team = view_team(&view, "vision");
        assert!(micro(&team["committed_micro_usd"]) <= micro(&team["budget_micro_usd"]));
    }

    /// The burst of the instance, once it is settled.
    async fn settled(&self) -> Value {
        wait("the burst to settle", &self.env, 30, async || {
            let v = self.env.get("/api/v1/burst").await;
            v["instances"].as_array()?.iter().find_map(|i| {
                (i["cluster"] == self.cluster.as_str() && i["settled"] == true).then(|| i.clone())
            })
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpointable_workload_bursts_to_spot_boots_from_its_user_data_and_is_requeued_when_ec2_takes_it_back()
 {
    let _serial = SERIAL.lock().await;
    let spot = run_on_spot(&["sleep", "300"], None).await;
    let env = &spot.env;
    let s = spot.workload;
    let token = spot
        .script
        .split("--join-token '")
        .nth(1)
        .and_then(|t| t.split('\'').next())
        .unwrap()
        .to_string();
    // The join token is a secret: neither the burst view nor the events carry it.
    let seen = format!(
        "{}{}",
        env.get("/api/v1/burst").await,
        env.get("/api/v1/events?tail=1000").await
    );
    assert!(!seen.contains(&token), "the join token leaked");

    // EC2 takes the spot instance back: the workload is re-queued, and the
    // burst ends, settled to what it ran.
    let t0 = Instant::now();
    spot.ec2
        .terminate_instances()
        .instance_ids(&spot.instance)
        .send()
        .await
        .unwrap();
    wait("the workload to be re-queued", env, 30, async || {
        let e = env.events("requeued").await;
        e.iter().any(|e| e["workload"] == s).then_some(())
    })
    .await;
    let requeued_ms = t0.elapsed().as_millis();
    let ended = spot.settled().await;
    assert_eq!(ended["state"], "terminated", "{ended}");
    assert_eq!(ended["note"], "interrupted by the provider", "{ended}");
    let cost = micro(&ended["cost_micro_usd"]);
    assert!(
        cost > 0 && cost <= micro(&ended["reserved_micro_usd"]),
        "{ended}"
    );
    assert!(!env.events("burst_interrupted").await.is_empty());
    spot.end().await;
    eprintln!(
        "FIGURES burst spot: submit-to-launched on moto {:.1} s, submit-to-running on spot {:.1} s; reclaim-to-requeued {requeued_ms} ms; the interrupted instance settled at {cost} micro-USD",
        spot.launched_s, spot.running_s
    );
}

/// EC2's instance metadata service as far as a spot notice goes (IMDSv2):
/// `PUT /latest/api/token` gives a session token, and
/// `GET /latest/meta-data/spot/instance-action` with it answers 404 until
/// the notice is posted.
struct Imds {
    url: String,
    notice: Arc<Mutex<Option<String>>>,
    polls: Arc<std::sync::atomic::AtomicU64>,
    _server: tokio::task::JoinHandle<()>,
}

const IMDS_TOKEN: &str = "imds-session-token";

async fn imds() -> Imds {
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::{get, put};
    let notice: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let polls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (n, p) = (notice.clone(), polls.clone());
    let app = axum::Router::new()
        .route(
            "/latest/api/token",
            put(async |h: HeaderMap| {
                match h
                    .get("x-aws-ec2-metadata-token-ttl-seconds")
                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                {
                    Some(1..=21_600) => (StatusCode::OK, IMDS_TOKEN.to_string()),
                    _ => (StatusCode::BAD_REQUEST, "token TTL missing".to_string()),
                }
            }),
        )
        .route(
            "/latest/meta-data/spot/instance-action",
            get(async move |h: HeaderMap| {
                p.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if h.get("x-aws-ec2-metadata-token")
                    .and_then(|v| v.to_str().ok())
                    != Some(IMDS_TOKEN)
                {
                    return (StatusCode::UNAUTHORIZED, String::new());
                }
                match n.lock().unwrap().clone() {
                    Some(body) => (StatusCode::OK, body),
                    None => (StatusCode::NOT_FOUND, "Not Found".to_string()),
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Imds {
        url,
        notice,
        polls,
        _server: server,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spot_interruption_notice_drains_the_instance_and_the_workload_saves_and_is_requeued_before_ec2_reclaims_it()
 {
    let _serial = SERIAL.lock().await;
    let imds = imds().await;
    // Saves its progress on the checkpoint signal (the class's: SIGTERM)
    // and stops.
    let trap = "trap 'echo saved > \"$AXLE_CHECKPOINT_DIR/step\"; exit 0' TERM; \
                while :; do sleep 0.2; done";
    let spot = run_on_spot(&["sh", "-c", trap], Some(&imds.url)).await;
    let env = &spot.env;
    let s = spot.workload;
    wait("the spoke to watch for notices", env, 30, async || {
        (imds.polls.load(std::sync::atomic::Ordering::Relaxed) > 0).then_some(())
    })
    .await;
    assert_eq!(env.workload(s).await["state"], "Running");

    // EC2 posts its notice: the instance is reclaimed in two minutes.
    let reclaim_at = std::time::SystemTime::now() + Duration::from_secs(120);
    let secs = reclaim_at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let time = jiff::Timestamp::from_second(secs as i64).unwrap();
    *imds.notice.lock().unwrap() = Some(format!(r#"{{"action":"terminate","time":"{time}"}}"#));
    let t0 = Instant::now();
    let notice = wait("the hub to take the notice", env, 30, async || {
        let e = env.events("burst_interruption_notice").await;
        e.into_iter()
            .find(|e| e["cluster"] == spot.cluster.as_str())
    })
    .await;
    let noticed_ms = t0.elapsed().as_millis();
    assert!(
        notice["message"]
            .as_str()
            .is_some_and(|m| m.contains(&spot.instance) && m.contains("its spoke (terminate)")),
        "{notice}"
    );

    // The workload is stopped with its checkpoint signal, within the class's
    // 5 s grace period (two minutes leave room for all of it), saves, and is
    // re-queued; the instance takes nothing new meanwhile.
    let preempted = wait("the workload to be preempted", env, 30, async || {
        let e = env.events("preempted").await;
        e.into_iter().find(|e| e["workload"] == s)
    })
    .await;
    assert!(
        preempted["message"]
            .as_str()
            .is_some_and(|m| m.contains("reclaimed by the provider")
                && m.contains("with a 5 s grace period")),
        "{preempted}"
    );
    wait("the workload to be re-queued", env, 30, async || {
        let e = env.events("requeued").await;
        e.iter().any(|e| e["workload"] == s).then_some(())
    })
    .await;
    let requeued_ms = t0.elapsed().as_millis();
    let saved = env
        .dir
        .path()
        .join(&spot.instance)
        .join("checkpoints")
        .join(s.to_string())
        .join("step");
    assert_eq!(
        std::fs::read_to_string(&saved)
            .map(|t| t.trim().to_string())
            .ok()
            .as_deref(),
        Some("saved"),
        "the workload saved its progress at {}",
        saved.display()
    );

    // The drained instance is terminated by the hub, before EC2 would, and
    // settled to what it ran.
    let ended = spot.settled().await;
    let ended_ms = t0.elapsed().as_millis();
    assert_eq!(ended["state"], "terminated", "{ended}");
    assert_eq!(ended["note"], "drained", "{ended}");
    assert!(ended["interruption_at_ms"].as_u64().is_some(), "{ended}");
    let cost = micro(&ended["cost_micro_usd"]);
    assert!(
        cost > 0 && cost <= micro(&ended["reserved_micro_usd"]),
        "{ended}"
    );
    let at_ec2 = spot
        .ec2
        .describe_instances()
        .instance_ids(&spot.instance)
        .send()
        .await
        .unwrap();
    let state = at_ec2.reservations()[0].instances()[0]
        .state()
        .and_then(|s| s.name())
        .map(|n| n.as_str().to_string());
    assert!(
        matches!(state.as_deref(), Some("shutting-down" | "terminated")),
        "{state:?}"
    );
    // All of it before the time EC2 named: the point of the notice.
    assert!(
        std::time::SystemTime::now() < reclaim_at,
        "the instance outlived its notice"
    );
    spot.end().await;
    eprintln!(
        "FIGURES burst spot notice: notice-to-hub {noticed_ms} ms (the spoke polls every 5 s), notice-to-requeued {requeued_ms} ms (a 5 s grace period; the workload saved), notice-to-terminated-by-the-hub {ended_ms} ms of EC2's 120 s; settled at {cost} micro-USD"
    );
}
