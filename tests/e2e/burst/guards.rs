//! What holds a burst back, on the Lambda fake: data residency (a team held
//! to `europe-*` never gets the cheaper US instance), the budget's 80 % and
//! 100 % thresholds (events), and a provider answering 500 to every launch
//! (on-prem placement does not wait on it, measured).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axle_e2e::bin_dir;
use axle_e2e::lambda_fake::{FakeLambda, FakeType, KEY};
use serde_json::Value;

use super::harness::*;

/// $3.60/h is $0.001 a second: a reservation of `maxRuntime + 2` s (the
/// idle timeout) costs that many tenths of a cent.
const POLICY_EU: &str = r#"
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
    budgetUsdPerMonth: 1
    providers: [lambda]
    regions: [europe-*]
---
apiVersion: axle.dev/v1
kind: BurstProvider
metadata: {name: lambda}
spec:
  type: lambda
  regions: [us-east-1, europe-central-1]
  gpuModels: [H100]
  maxInstances: 4
  joinTimeoutSeconds: 20
  idleTimeoutSeconds: 2
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_team_held_to_europe_never_bursts_to_the_us_its_thresholds_are_told_and_a_failing_provider_delays_no_on_prem_placement()
 {
    let _serial = SERIAL.lock().await;
    assert!(
        bin_dir().join("axle-spoke").exists(),
        "build the workspace first"
    );
    let fake = FakeLambda::start(vec![
        // Cheaper, with capacity, in the US: the team's data may not go there.
        FakeType {
            name: "gpu_1x_h100_pcie".into(),
            gpu_description: "H100 (80 GB PCIe)".into(),
            gpus: 1,
            cents_per_hour: 99,
            regions: vec!["us-east-1".into()],
        },
        // In Europe, with no capacity at first.
        FakeType {
            name: "gpu_1x_h100_sxm5".into(),
            gpu_description: "H100 (80 GB SXM5)".into(),
            gpus: 1,
            cents_per_hour: 360,
            regions: vec![],
        },
    ])
    .await;
    let envs = [
        ("LAMBDA_API_KEY", KEY),
        ("LAMBDA_SSH_KEY_NAME", "axle-ops"),
        ("AXLE_BURST_ENDPOINT_LAMBDA", fake.url()),
    ];
    let mut env = start_with(
        POLICY_EU,
        envs.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
    .await;
    let machines = Arc::new(Mutex::new(Vec::new()));
    let boot = Arc::new(Mutex::new(true));
    let hub_tag = Arc::new(Mutex::new(String::new()));
    let regions = Arc::new(Mutex::new(Vec::<String>::new()));
    let boot_one = booter(
        env.dir.path().to_path_buf(),
        boot.clone(),
        machines.clone(),
        hub_tag,
    );
    let seen = regions.clone();
    fake.on_launch(move |l| {
        seen.lock().unwrap().push(l.region.clone());
        boot_one(l)
    });
    let _machines = scopeguard(machines.clone());
    onprem_spoke(&mut env).await;

    // Baseline: submit to running on an idle on-prem cluster.
    let t0 = Instant::now();
    let blocker = env.fill_onprem("sleep 300").await;
    let baseline_ms = t0.elapsed().as_millis();

    // Residency: only the US offer has capacity, and it is not taken.
    let a = env.submit("a", "sleep 300", true, 798).await;
    let reason = wait("the residency reason", &env, 30, async || {
        let w = env.workload(a).await;
        let r = w["pending_reason"].as_str().unwrap_or_default().to_string();
        // (First it may wait for the catalog.)
        r.contains("cloud burst: no offer").then_some(r)
    })
    .await;
    assert!(
        reason.contains("no offer of lambda has 1 H100 GPU(s) in europe-*"),
        "{reason}"
    );
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        fake.launches(),
        0,
        "the cheaper US offer was never launched"
    );

    // Capacity in Europe: it launches there. $0.80 of $1: the 80 % threshold.
    fake.set_capacity("gpu_1x_h100_sxm5", "europe-central-1", true);
    let w = wait("a to run in Europe", &env, 60, async || {
        let w = env.workload(a).await;
        (w["state"] == "Running").then_some(w)
    })
    .await;
    assert!(
        w["cluster"].as_str().unwrap().starts_with("burst-lambda-"),
        "{w}"
    );
    let eighty = wait("the 80 % event", &env, 10, async || {
        let e = env.events("burst_budget_threshold").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    let msg = eighty[0]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("team vision burst budget: $0.80 of $1.00") && msg.contains("(80%)"),
        "{msg}"
    );

    // $0.20 more fills the budget to the cent: the 100 % threshold.
    let b = env.submit("b", "sleep 1", true, 198).await;
    wait("b to succeed", &env, 60, async || {
        let w = env.workload(b).await;
        (w["state"] == "Succeeded").then_some(())
    })
    .await;
    let thresholds = env.events("burst_budget_threshold").await;
    assert_eq!(thresholds.len(), 2, "{thresholds:?}");
    let msg = thresholds[1]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("$1.00 of $1.00") && msg.contains("(100%)"),
        "{msg}"
    );
    // b's instance ends idle and settles: the budget has room again.
    wait("b's burst to settle", &env, 30, async || {
        let v = env.get("/api/v1/burst").await;
        v["instances"]
            .as_array()?
            .iter()
            .any(|i| i["workload"] == b && i["state"] == "terminated" && i["settled"] == true)
            .then_some(())
    })
    .await;

    // The provider answers 500 to every launch. c wants a burst and keeps
    // failing at it; the on-prem GPU the blocker frees goes to c at once.
    fake.fail_launches(1000, false);
    let c = env.submit("c", "sleep 300", true, 98).await;
    let note = wait("c's launch to fail with a 500", &env, 30, async || {
        let v = env.get("/api/v1/burst").await;
        v["instances"].as_array()?.iter().find_map(|i| {
            let note = i["note"].as_str().unwrap_or_default();
            (i["workload"] == c && note.contains("launch try")).then(|| note.to_string())
        })
    })
    .await;
    let t1 = Instant::now();
    env.cancel(blocker).await;
    wait("c to be placed on-prem", &env, 30, async || {
        let w = env.workload(c).await;
        (w["cluster"] == "onprem").then_some(())
    })
    .await;
    let placed_ms = t1.elapsed().as_millis();
    // Nobody waits for c's burst now: it ends without an instance, uncharged.
    let runs_on = format!("workload {c} runs on onprem");
    let ended = wait("c's burst to end", &env, 30, async || {
        let v = env.get("/api/v1/burst").await;
        v["instances"].as_array()?.iter().find_map(|i| {
            (i["workload"] == c
                && i["state"] == "failed"
                && i["settled"] == true
                && i["note"].as_str().unwrap_or_default().contains(&runs_on))
            .then(|| i.clone())
        })
    })
    .await;
    assert_eq!(micro(&ended["cost_micro_usd"]), 0, "{ended}");
    assert!(
        env.get("/api/v1/burst").await["instances"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["workload"] != c || i["state"] == "failed"),
        "no burst of c is left"
    );

    // Every launch went to Europe; the ledger agrees with the provider.
    let regions = regions.lock().unwrap().clone();
    assert_eq!(
        regions,
        vec!["europe-central-1"; 2],
        "launched in {regions:?}"
    );
    let view = env.get("/api/v1/burst").await;
    let all: &Vec<Value> = view["instances"].as_array().unwrap();
    assert!(
        all.iter().all(|i| i["region"] == "europe-central-1"),
        "{view}"
    );
    let team = view_team(&view, "vision");
    assert!(micro(&team["committed_micro_usd"]) <= micro(&team["budget_micro_usd"]));
    for id in [a, c] {
        env.cancel(id).await;
    }
    wait("every instance to end", &env, 30, async || {
        fake.instances().is_empty().then_some(())
    })
    .await;
    eprintln!(
        "FIGURES burst guards: launches outside europe-*: 0 (of {}); thresholds 80 % and 100 % told; with every launch answered 500 ({note}), cancel-to-placed on-prem {placed_ms} ms (baseline submit-to-running on idle on-prem {baseline_ms} ms)",
        regions.len()
    );
    fake.assert_clean();
}
