//! Spot capacity on EC2 (moto): a checkpointable workload bursts to a spot
//! instance (InstanceMarketOptions), the instance boots from the user-data
//! EC2 holds for it (the spoke joins with its one-time join token), and when
//! EC2 takes the instance back the workload is re-queued.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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

async fn submit(env: &Env, name: &str, burst: bool) -> u64 {
    let (status, v) = env
        .post(
            "/api/v1/workloads",
            json!({
                "team": "vision", "name": name, "gpus": 1.0, "gpu_model": "A10G",
                "priority": "training", "command": ["sleep", "300"],
                "burst_allowed": burst, "max_runtime_s": 600,
            }),
        )
        .await;
    assert!(status < 300, "submit {name}: {status} {v}");
    v["id"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpointable_workload_bursts_to_spot_boots_from_its_user_data_and_is_requeued_when_ec2_takes_it_back()
 {
    let _serial = SERIAL.lock().await;
    let moto = moto().await;
    let endpoint = moto.endpoint();
    let envs = moto.hub_envs();
    let mut env = start_with(POLICY_SPOT, envs).await;
    onprem_spoke_with(&mut env, "1xA10G:24GB").await;
    let machines = Arc::new(Mutex::new(Vec::new()));
    let _machines = scopeguard(machines.clone());
    let blocker = submit(&env, "blocker", false).await;
    wait("the blocker to run on-prem", &env, 30, async || {
        let w = env.workload(blocker).await;
        (w["state"] == "Running").then_some(())
    })
    .await;

    // On-prem is full: the checkpointable workload bursts, on spot.
    let submitted = Instant::now();
    let s = submit(&env, "spot", true).await;
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

    // EC2's own view: a spot instance, carrying a boot script with a join token.
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
        script.contains("--join-token '") && script.contains(&format!("--cluster '{cluster}'")),
        "{script}"
    );
    let token = script
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

    // The instance boots: cloud-init runs the user-data.
    let log = std::fs::File::create(env.dir.path().join(format!("{instance}.log"))).unwrap();
    let child = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .env("AXLE_DATA_DIR", env.dir.path().join(&instance))
        .env_remove("AXLE_JOIN_TOKEN")
        .env_remove("AXLE_CA_FILE")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    machines.lock().unwrap().push(child);
    let w = wait("the workload to run on spot", &env, 60, async || {
        let w = env.workload(s).await;
        (w["state"] == "Running" && w["cluster"] == cluster.as_str()).then_some(w)
    })
    .await;
    let running_s = submitted.elapsed().as_secs_f64();
    assert_eq!(w["checkpointable"], true, "{w}");

    // EC2 takes the spot instance back: the workload is re-queued, and the
    // burst ends, settled to what it ran.
    let t0 = Instant::now();
    ec2.terminate_instances()
        .instance_ids(&instance)
        .send()
        .await
        .unwrap();
    wait("the workload to be re-queued", &env, 30, async || {
        let e = env.events("requeued").await;
        e.iter().any(|e| e["workload"] == s).then_some(())
    })
    .await;
    let requeued_ms = t0.elapsed().as_millis();
    let ended = wait("the burst to settle", &env, 30, async || {
        let v = env.get("/api/v1/burst").await;
        v["instances"].as_array()?.iter().find_map(|i| {
            (i["cluster"] == cluster.as_str() && i["settled"] == true).then(|| i.clone())
        })
    })
    .await;
    assert_eq!(ended["state"], "terminated", "{ended}");
    assert_eq!(ended["note"], "interrupted by the provider", "{ended}");
    let cost = micro(&ended["cost_micro_usd"]);
    assert!(
        cost > 0 && cost <= micro(&ended["reserved_micro_usd"]),
        "{ended}"
    );
    assert!(!env.events("burst_interrupted").await.is_empty());

    // Cancel everything: nothing is left running at EC2.
    for id in [s, blocker] {
        env.cancel(id).await;
    }
    wait("every instance to end at EC2", &env, 60, async || {
        let out = ec2.describe_instances().send().await.ok()?;
        out.reservations()
            .iter()
            .flat_map(|r| r.instances())
            .all(|i| i.state().and_then(|s| s.name()).map(|n| n.as_str()) == Some("terminated"))
            .then_some(())
    })
    .await;
    let view: Value = env.get("/api/v1/burst").await;
    let team = view_team(&view, "vision");
    assert!(micro(&team["committed_micro_usd"]) <= micro(&team["budget_micro_usd"]));
    eprintln!(
        "FIGURES burst spot: submit-to-launched on moto {launched_s:.1} s, submit-to-running on spot {running_s:.1} s; reclaim-to-requeued {requeued_ms} ms; the interrupted instance settled at {cost} micro-USD"
    );
}
