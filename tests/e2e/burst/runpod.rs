//! The burst lifecycle on RunPod: the hub's RunPod adapter against the
//! loopback fake of RunPod's REST v2 that the adapter's own tests use
//! (`burst-providers/tests/runpod/fake.rs`: every request and answer checked
//! against the saved OpenAPI spec). A pod "boots" by running the boot script
//! its `AXLE_USER_DATA` variable carries, as the spoke image does: a real
//! `axle-spoke` joins with its one-time join token. On-prem full → a pod in
//! the team's data center → the workload runs → the idle pod is deleted →
//! the spend settled to the second; a pod with this hub's tags that no burst
//! claims is reaped, another's is left alone.

use std::collections::BTreeMap;
use std::process::Child;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axle_burst::credentials::Secret;
use axle_burst::runpod::RunPod;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use axum::routing::get;
use serde_json::{Value, json};

#[path = "../../../burst-providers/tests/common/mod.rs"]
mod common;
// The scenario uses part of the adapter tests' fake.
#[path = "../../../burst-providers/tests/runpod/fake.rs"]
#[allow(dead_code)]
mod fake;

use common::openapi::Spec;
use fake::{Fake, H100, KEY};

use super::harness::*;

const POLICY_RUNPOD: &str = r#"
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
    providers: [runpod-us]
    regions: [US-*]
---
apiVersion: axle.dev/v1
kind: BurstProvider
metadata: {name: runpod-us}
spec:
  type: runpod
  # The fake also has H100s in EU-RO-1 (none free): the team may not go there.
  regions: [US-KS-2, EU-RO-1]
  gpuModels: [H100]
  maxInstances: 2
  joinTimeoutSeconds: 30
  idleTimeoutSeconds: 2
"#;

/// Boots each pod the fake makes from its `AXLE_USER_DATA`; remembers the
/// hub's tag.
fn boot_pods(
    fake: &Fake,
    dir: std::path::PathBuf,
    machines: Arc<Mutex<Vec<Child>>>,
    hub_tag: Arc<Mutex<String>>,
) {
    fake.on_create(move |id, pod| {
        let tags: BTreeMap<String, String> = pod["env"]["AXLE_TAGS"]
            .as_str()
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default();
        if let Some(t) = tags.get("axle-hub") {
            *hub_tag.lock().unwrap() = t.clone();
        }
        let Some(script) = pod["env"]["AXLE_USER_DATA"].as_str() else {
            return;
        };
        machines
            .lock()
            .unwrap()
            .push(boot_machine(&dir, id, script));
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn on_prem_full_bursts_to_a_runpod_pod_that_runs_the_work_is_deleted_when_idle_and_settles_to_the_second()
 {
    let _serial = SERIAL.lock().await;
    let fake = Fake::start().await;
    let machines = Arc::new(Mutex::new(Vec::new()));
    let _machines = scopeguard(machines.clone());
    let envs: Vec<(String, String)> = [
        ("RUNPOD_API_KEY", KEY.to_string()),
        ("AXLE_BURST_ENDPOINT_RUNPOD_US", fake.url.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut env = start_with(POLICY_RUNPOD, envs).await;
    let hub_tag = Arc::new(Mutex::new(String::new()));
    boot_pods(
        &fake,
        env.dir.path().to_path_buf(),
        machines.clone(),
        hub_tag.clone(),
    );
    onprem_spoke(&mut env).await;

    let blocker = env.fill_onprem("sleep 120").await;
    let submitted = Instant::now();
    let bursty = env.submit("bursty", "sleep 2", true, 600).await;
    let w = wait("the burst workload to succeed", &env, 60, async || {
        let w = env.workload(bursty).await;
        (w["state"] == "Succeeded").then_some(w)
    })
    .await;
    let done_s = submitted.elapsed().as_secs_f64();
    let cluster = w["cluster"].as_str().unwrap_or_default().to_string();
    assert!(cluster.starts_with("burst-runpod-us-"), "{w}");

    // The pod RunPod made: one H100 in the team's data center, with Axle's
    // tags and the boot script in its environment.
    let view = env.get("/api/v1/burst").await;
    let ran = view["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["cluster"] == cluster.as_str())
        .unwrap()
        .clone();
    assert_eq!(ran["instance_type"], format!("1x {H100}"), "{ran}");
    assert_eq!(ran["region"], "US-KS-2", "{ran}");
    let id = ran["id"].as_str().unwrap().to_string();

    // Idle for 2 s after its work: deleted, and the spend settled to the second.
    let settled = wait("the pod to be deleted and settled", &env, 30, async || {
        let v = env.get("/api/v1/burst").await;
        v["instances"]
            .as_array()?
            .iter()
            .find(|i| i["id"] == id.as_str() && i["state"] == "terminated" && i["settled"] == true)
            .cloned()
    })
    .await;
    assert!(
        fake.pod_ids().is_empty(),
        "nothing left running at RunPod: {:?}",
        fake.pod_ids()
    );
    let launched = micro(&settled["launched_at_ms"]);
    let joined = micro(&settled["joined_at_ms"]);
    let ended = micro(&settled["ended_at_ms"]);
    let seconds = (ended - launched).div_ceil(1000);
    let price = micro(&settled["price_per_hour_micro_usd"]);
    assert_eq!(price, 2_690_000, "RunPod's secure-cloud price: {settled}");
    let expected = (u128::from(price) * u128::from(seconds)).div_ceil(3600) as u64;
    let cost = micro(&settled["cost_micro_usd"]);
    assert_eq!(cost, expected, "{seconds} s at $2.69/h: {settled}");
    let team = view_team(&env.get("/api/v1/burst").await, "vision");
    assert_eq!(micro(&team["spent_micro_usd"]), cost);
    assert_eq!(
        micro(&team["committed_micro_usd"]),
        cost,
        "the rest was released"
    );

    // A pod with this hub's tags that no burst claims is reaped; a pod of
    // someone else's on the same account is left alone.
    let hub_tag = hub_tag.lock().unwrap().clone();
    assert_eq!(hub_tag.len(), 16, "launches carry this hub's tag");
    let tags = json!({
        "axle-managed-by": "axle", "axle-hub": hub_tag, "axle-burst-id": "0000deadbeef",
    });
    let orphan = fake.seed_pod(
        "orphan",
        json!({"AXLE_TAGS": tags.to_string(), "AXLE_USER_DATA": "true"}),
    );
    let theirs = fake.seed_pod("notebook", json!({"JUPYTER_TOKEN": "x"}));
    let t0 = Instant::now();
    wait("the orphan pod to be deleted", &env, 30, async || {
        let ids: Vec<String> = fake.pod_ids();
        (!ids.contains(&orphan)).then_some(())
    })
    .await;
    let reaped_ms = t0.elapsed().as_millis();
    // The event is committed after the provider call that deleted the pod.
    wait("the reaper's event", &env, 10, async || {
        let reaped = env.events("burst_orphan_terminated").await;
        reaped
            .iter()
            .any(|e| e["message"].as_str().is_some_and(|m| m.contains(&orphan)))
            .then_some(())
    })
    .await;
    let left: Vec<String> = fake.pod_ids();
    assert_eq!(left, vec![theirs], "only the other pod is left");

    env.cancel(blocker).await;
    fake.assert_clean();
    eprintln!(
        "FIGURES burst runpod: submit-to-succeeded {done_s:.1} s; launch-to-joined {} ms; pod lived {seconds} s, settled {cost} micro-USD; orphan reaped {reaped_ms} ms after it appeared (grace 2 s, listing every 1 s)",
        joined - launched
    );
}
