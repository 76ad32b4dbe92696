//! A spoke killed with SIGKILL mid-run: its workloads' processes die with it,
//! the hub re-queues them after `spokeLostAfterSeconds` and they finish on the
//! other spoke; when the killed spoke comes back (same cluster, same data
//! dir) nothing runs twice — checked from the workloads' own start/end lines.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axle_e2e::{
    Env, Interval, intervals, overcommits, process_gone, read_trace, request, sh, traced_script,
    wait_until,
};

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_spokes_workloads_finish_elsewhere_and_never_run_twice() {
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

    // Four 1-GPU workloads with no GPU model: either cluster can run all of them.
    let mut ids = Vec::new();
    for (i, team) in ["alpha", "beta", "gamma", "alpha"].iter().enumerate() {
        let mut r = request(team, 1.0, sh(&traced_script(&trace, "5")));
        r.name = Some(format!("survivor-{i}"));
        ids.push(api.submit_ok(&r).await.id);
    }
    let first_runs = wait_until(Duration::from_secs(30), "all four to run", || {
        let api = api.clone();
        let trace = trace.clone();
        let ids = ids.clone();
        async move {
            let ws = api.try_workloads().await?;
            let running = ws
                .iter()
                .filter(|w| ids.contains(&w.id) && w.state == "Running")
                .count();
            let runs = intervals(&read_trace(&trace));
            if running == ids.len() && runs.len() == ids.len() {
                Ok(runs)
            } else {
                Err(format!("{running} Running, {} start lines", runs.len()))
            }
        }
    })
    .await;

    // Kill the spoke that runs the most of them.
    let mut per_cluster: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for i in first_runs.values() {
        per_cluster
            .entry(i.start.cluster.clone())
            .or_default()
            .push(i.start.id);
    }
    let (victim, victim_ids) = per_cluster
        .iter()
        .max_by_key(|(_, v)| v.len())
        .map(|(c, v)| (c.clone(), v.clone()))
        .expect("runs");
    let other = if victim == "eu-1" { "us-1" } else { "eu-1" };
    let victim_pids: Vec<u32> = first_runs
        .values()
        .filter(|i| i.start.cluster == victim)
        .flat_map(|i| [i.start.pid, i.start.ppid])
        .collect();
    let killed_at_ns = now_ns();
    env.spoke(&victim).kill9();

    // Its workload processes (the script and its shim) die with it.
    wait_until(
        Duration::from_secs(15),
        "the killed spoke's workload processes to exit",
        || {
            let alive: Vec<u32> = victim_pids
                .iter()
                .copied()
                .filter(|p| !process_gone(*p))
                .collect();
            async move {
                if alive.is_empty() {
                    Ok(())
                } else {
                    Err(format!("still alive: {alive:?}"))
                }
            }
        },
    )
    .await;

    // Lost after spokeLostAfterSeconds (3 s), re-queued, and running on the other spoke.
    wait_until(
        Duration::from_secs(30),
        "the victims to run on the other spoke",
        || {
            let api = api.clone();
            let victim_ids = victim_ids.clone();
            let other = other.to_string();
            async move {
                let ws = api.try_workloads().await?;
                let moved = ws
                    .iter()
                    .filter(|w| victim_ids.contains(&w.id))
                    .filter(|w| {
                        w.cluster.as_deref() == Some(other.as_str()) || w.state == "Succeeded"
                    })
                    .count();
                if moved == victim_ids.len() {
                    Ok(())
                } else {
                    Err(format!(
                        "{:?}",
                        ws.iter()
                            .map(|w| (w.id, w.state.clone(), w.cluster.clone()))
                            .collect::<Vec<_>>()
                    ))
                }
            }
        },
    )
    .await;
    let clusters = api.clusters().await;
    let lost = clusters
        .iter()
        .find(|c| c.name == victim)
        .expect("victim cluster");
    assert_eq!(lost.state, "Lost", "{lost:#?}");

    // Bring the killed spoke back on the same data dir.
    env.spoke(&victim).restart();
    env.hub.wait_ready(&["eu-1", "us-1"]).await;
    let back_at_ms = api
        .clusters()
        .await
        .iter()
        .find(|c| c.name == victim)
        .and_then(|c| c.last_heartbeat_ms)
        .expect("heartbeat of the restarted spoke");

    let all = api.wait_all_finished(&ids, Duration::from_secs(60)).await;
    // Give the restarted spoke a few heartbeats to do anything it should not.
    wait_until(
        Duration::from_secs(20),
        "three more heartbeats from the restarted spoke",
        || {
            let api = api.clone();
            let victim = victim.clone();
            async move {
                let c = api.clusters().await;
                let hb = c
                    .iter()
                    .find(|c| c.name == victim)
                    .and_then(|c| c.last_heartbeat_ms);
                match hb {
                    Some(t) if t >= back_at_ms + 3000 => Ok(()),
                    other => Err(format!("last heartbeat {other:?}")),
                }
            }
        },
    )
    .await;

    for w in &all {
        if !ids.contains(&w.id) {
            continue;
        }
        assert_eq!(w.state, "Succeeded", "{w:#?}");
        if victim_ids.contains(&w.id) {
            assert_eq!(w.cluster.as_deref(), Some(other), "{w:#?}");
            assert!(
                w.epoch >= 2,
                "a re-queued workload gets a new epoch: {w:#?}"
            );
            let requeued = w
                .history
                .iter()
                .find(|h| h.to == "Pending" && h.reason.contains(&format!("spoke {victim} lost")))
                .unwrap_or_else(|| {
                    panic!("history should say the spoke was lost: {:#?}", w.history)
                });
            // Re-queued when the spoke was declared lost (silent 3 s since its
            // last heartbeat, at most 1 s before the kill), not on disconnect.
            let killed_at_ms = (killed_at_ns / 1_000_000) as u64;
            assert!(
                requeued.at_ms >= killed_at_ms + 1000,
                "workload {} re-queued {} ms after the kill, before the spoke could be lost",
                w.id,
                requeued.at_ms as i64 - killed_at_ms as i64
            );
            assert_eq!(
                w.history.iter().filter(|h| h.to == "Pending").count(),
                1,
                "re-queued once: {:#?}",
                w.history
            );
        } else {
            assert_eq!(w.epoch, 1, "an unaffected workload was restarted: {w:#?}");
        }
    }
    let events = api.events().await;
    assert!(
        events
            .iter()
            .any(|e| e.kind == "spoke_lost" && e.cluster.as_deref() == Some(victim.as_str())),
        "no spoke_lost event for {victim}"
    );

    // The workloads' own lines: every run ended; no workload had two
    // overlapping runs; nothing started on the victim after it was killed.
    let runs = intervals(&read_trace(&trace));
    let open: Vec<&Interval> = runs.values().filter(|i| i.end_ns.is_none()).collect();
    assert!(open.is_empty(), "runs that never ended: {open:#?}");
    for id in &ids {
        let mut spans: Vec<&Interval> = runs.values().filter(|i| i.start.id == *id).collect();
        spans.sort_by_key(|i| i.start.ts_ns);
        for pair in spans.windows(2) {
            assert!(
                pair[0].end_ns.expect("ended") <= pair[1].start.ts_ns,
                "workload {id} ran twice at once: {pair:#?}"
            );
        }
        let expected = if victim_ids.contains(id) { 2 } else { 1 };
        assert_eq!(spans.len(), expected, "workload {id} runs: {spans:#?}");
        let epochs: BTreeSet<u64> = spans.iter().map(|i| i.start.epoch).collect();
        assert_eq!(
            epochs.len(),
            spans.len(),
            "workload {id}: an epoch ran twice"
        );
    }
    let late_on_victim: Vec<&Interval> = runs
        .values()
        .filter(|i| i.start.cluster == victim && i.start.ts_ns > killed_at_ns)
        .collect();
    assert!(
        late_on_victim.is_empty(),
        "the restarted spoke ran old work: {late_on_victim:#?}"
    );
    let complete: Vec<Interval> = runs.into_values().collect();
    let bad = overcommits(&complete);
    assert!(bad.is_empty(), "over-committed: {bad:?}");
}
