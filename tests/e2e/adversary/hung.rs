//! A hung spoke agent (SIGSTOP of the agent process alone): its workloads
//! must stop by themselves before the hub runs them elsewhere.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axle_e2e::{Env, intervals, read_trace, request, sh, traced_script, wait_until};

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_agents_workloads_stop_before_they_run_elsewhere() {
    let mut env = Env::start(
        &["common", "two-clusters"],
        &[
            ("eu-1", "eu-west", &["4xH100:80GB", "4xH100:80GB"]),
            ("us-1", "us-east", &["4xA100:80GB"]),
        ],
    )
    .await;
    let api = env.api();
    let trace = env.path("trace.log");
    let mut ids = Vec::new();
    for (i, team) in ["alpha", "beta", "gamma", "alpha"].iter().enumerate() {
        let mut r = request(team, 1.0, sh(&traced_script(&trace, "120")));
        r.name = Some(format!("hung-{i}"));
        ids.push(api.submit_ok(&r).await.id);
    }
    let first = wait_until(Duration::from_secs(30), "all four to run", || {
        let trace = trace.clone();
        let n = ids.len();
        async move {
            let runs = intervals(&read_trace(&trace));
            if runs.len() == n {
                Ok(runs)
            } else {
                Err(format!("{} start lines", runs.len()))
            }
        }
    })
    .await;
    let mut per_cluster: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for i in first.values() {
        per_cluster
            .entry(i.start.cluster.clone())
            .or_default()
            .push(i.start.id);
    }
    let (victim, victims) = per_cluster
        .iter()
        .max_by_key(|(_, v)| v.len())
        .map(|(c, v)| (c.clone(), v.clone()))
        .expect("runs");
    // Observed: SIGSTOP of the agent alone for 65 s; the hub re-queued its
    // work elsewhere after ~45 s while the original processes kept running
    // under their shims: 16 of 16 workloads ran twice at once for ~24 s.
    let t0 = Instant::now();
    env.spoke(&victim).signal("STOP");
    let moved = wait_until(
        Duration::from_secs(40),
        "the hung spoke's work to run elsewhere",
        || {
            let trace = trace.clone();
            let victims = victims.clone();
            async move {
                let runs = intervals(&read_trace(&trace));
                let again = victims
                    .iter()
                    .filter(|id| runs.keys().filter(|(w, _, _)| w == *id).count() >= 2)
                    .count();
                if again == victims.len() {
                    Ok(runs)
                } else {
                    Err(format!("{again} of {} started again", victims.len()))
                }
            }
        },
    )
    .await;
    let moved_after = t0.elapsed();
    // Hold the agent a while longer, as the probe did, then let it go.
    tokio::time::sleep(Duration::from_secs(3)).await;
    env.spoke(&victim).signal("CONT");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let runs = intervals(&read_trace(&trace));
    let _ = moved;
    let mut overlaps = Vec::new();
    let mut gaps_ms = Vec::new();
    for id in &victims {
        let mut of: Vec<_> = runs.iter().filter(|((w, _, _), _)| w == id).collect();
        of.sort_by_key(|((_, e, _), _)| *e);
        let (old, new) = (of[0].1, of[1].1);
        match old.end_ns {
            Some(end) if end < new.start.ts_ns => {
                gaps_ms.push(((new.start.ts_ns - end) / 1_000_000) as u64);
            }
            end => overlaps.push(format!(
                "workload {id}: old run ended {end:?}, new one started {}",
                new.start.ts_ns
            )),
        }
    }
    assert!(overlaps.is_empty(), "ran twice at once: {overlaps:?}");
    eprintln!(
        "adversary: agent SIGSTOPped with {} workloads: re-queued elsewhere after {moved_after:?}; \
         0 of {} ran twice at once (old run ended {gaps_ms:?} ms before the new one started)",
        victims.len(),
        victims.len()
    );
}
