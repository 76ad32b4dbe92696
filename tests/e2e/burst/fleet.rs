//! 200 burst wishes across five teams against moto: no budget passed by a
//! cent, checked against EC2's own instance list; no orphan after cancelling.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::harness::*;

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
    let endpoint = moto.endpoint();
    let envs = moto.hub_envs();
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
    // Each of team-0's waiting workloads says why: the instance launched for
    // it, or the budget. (Which ones got an instance is a race of the
    // concurrent submissions, so every one is checked.)
    let with_instance: std::collections::BTreeMap<u64, String> = view2["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] == "joining")
        .map(|i| {
            (
                i["workload"].as_u64().unwrap(),
                i["cluster"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let (mut waiting_on_budget, mut waiting_on_instance) = (0, 0);
    for id in &ids[..PER_TEAM] {
        let w = env.workload(*id).await;
        let reason = w["pending_reason"].as_str().unwrap_or_default();
        match with_instance.get(id) {
            Some(cluster) => {
                assert!(
                    reason.contains(&format!("cloud burst: waiting for {cluster} (joining")),
                    "{w}"
                );
                waiting_on_instance += 1;
            }
            None => {
                if !reason.contains("cloud burst: team team-0 burst budget") {
                    let bursts: Vec<&Value> = view2["instances"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|i| i["workload"] == *id)
                        .collect();
                    let events: Vec<Value> = env
                        .get("/api/v1/events?tail=1000")
                        .await
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|e| e["workload"] == *id)
                        .collect();
                    panic!("{w}\nits bursts: {bursts:?}\nits events: {events:?}");
                }
                waiting_on_budget += 1;
            }
        }
    }
    assert_eq!(waiting_on_instance as u64, expected[0]);
    assert_eq!(waiting_on_budget as u64, PER_TEAM as u64 - expected[0]);

    // Cancel everything: every instance is terminated, none is left.
    for id in &ids {
        env.cancel(*id).await;
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
