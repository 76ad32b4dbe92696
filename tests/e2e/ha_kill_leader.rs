//! The leading hub replica killed with SIGKILL under a 64-client submit load, on a real
//! 3-member etcd: a follower leads within the lease TTL + 2 s, every acknowledged submit
//! and cancel is there exactly once, every completion stays, and running workloads are adopted, not restarted
//! (one `start` line each, same epoch), never running twice at once.

use std::time::{Duration, Instant};

use axle_e2e::ha::{HaEnv, Load, check_history, totals};
use axle_e2e::{Interval, intervals, overcommits, read_trace, request, sh, traced_script};

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_leader_under_load_loses_nothing_and_adopts_running_work() {
    let ttl = Duration::from_secs(5);
    let mut env = HaEnv::start(
        &["ha", "two-clusters"],
        3,
        ttl,
        &[("eu-1", "eu-west", &["4xH100:80GB", "4xH100:80GB"])],
    )
    .await;
    let leader = env.leader().await.expect("a leader");
    let api = env.hubs[leader].api();
    let trace = env.path("trace.log");

    // Running across the kill.
    let mut running = Vec::new();
    for team in ["alpha", "beta", "gamma", "alpha"] {
        let mut r = request(team, 1.0, sh(&traced_script(&trace, "12")));
        r.gpu_model = Some("H100".into());
        running.push(api.submit_ok(&r).await.id);
    }
    let epochs = axle_e2e::wait_until(Duration::from_secs(30), "the four to run", || {
        let api = api.clone();
        let trace = trace.clone();
        let running = running.clone();
        async move {
            let ws = api.try_workloads().await?;
            let up: Vec<_> = ws
                .iter()
                .filter(|w| running.contains(&w.id) && w.state == "Running")
                .map(|w| (w.id, w.epoch))
                .collect();
            let starts = read_trace(&trace).iter().filter(|m| m.start).count();
            if up.len() == running.len() && starts == running.len() {
                Ok(up)
            } else {
                Err(format!("{} Running, {starts} start lines", up.len()))
            }
        }
    })
    .await;

    // Completed before the kill: the hub showed them Succeeded, so they stay so.
    let mut completed = Vec::new();
    for team in ["alpha", "beta", "gamma", "beta"] {
        let mut r = request(team, 1.0, sh("true"));
        r.gpu_model = Some("H100".into());
        completed.push(api.submit_ok(&r).await.id);
    }
    axle_e2e::wait_until(Duration::from_secs(30), "the four to complete", || {
        let api = api.clone();
        let completed = completed.clone();
        async move {
            let ws = api.try_workloads().await?;
            let done = ws
                .iter()
                .filter(|w| completed.contains(&w.id) && w.state == "Succeeded")
                .count();
            if done == completed.len() {
                Ok(())
            } else {
                Err(format!("{done} Succeeded"))
            }
        }
    })
    .await;

    let apis: Vec<_> = env.hubs.iter().map(|h| h.api()).collect();
    let load = Load::start(apis, 64, leader, "kill");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let killed = Instant::now();
    env.hubs[leader].kill9();
    let next = loop {
        if let Some(i) = env.leader().await {
            break i;
        }
        assert!(
            killed.elapsed() < ttl + Duration::from_secs(10),
            "no follower leads {:?} after the kill",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let failover = killed.elapsed();
    eprintln!("failover: replica r{next} leads {failover:?} after r{leader} was killed");
    assert_ne!(next, leader);
    assert!(
        failover <= ttl + Duration::from_secs(2),
        "failover took {failover:?}, more than the lease TTL + 2 s"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let histories = load.stop().await;
    let (acked, cancelled, retries, unacked) = totals(&histories);
    eprintln!(
        "load: {acked} submits and {cancelled} cancels acknowledged, {retries} retried attempts, {unacked} never acknowledged"
    );
    assert!(acked > 64, "the load barely ran: {acked} acknowledged");
    assert_eq!(unacked, 0, "every submit is acknowledged eventually");

    let next = env
        .wait_leader_ready(&["eu-1"], Duration::from_secs(30))
        .await;
    let api = env.hubs[next].api();
    let workloads = api.workloads().await;
    let bad = check_history(&histories, &completed, &workloads);
    assert!(bad.is_empty(), "{} problems: {bad:#?}", bad.len());

    // Adopted, not restarted: one start line each, the same epoch, Succeeded.
    let finished: Vec<_> = api
        .wait_all_finished(&running, Duration::from_secs(60))
        .await
        .into_iter()
        .filter(|w| running.contains(&w.id))
        .collect();
    assert_eq!(finished.len(), running.len());
    let marks = read_trace(&trace);
    for w in &finished {
        assert_eq!(w.state, "Succeeded", "{w:#?}");
        let before = epochs.iter().find(|(id, _)| *id == w.id).expect("ran").1;
        assert_eq!(w.epoch, before, "workload {} got a new epoch", w.id);
        let starts = marks.iter().filter(|m| m.start && m.id == w.id).count();
        assert_eq!(starts, 1, "workload {} started {starts} times", w.id);
    }
    let runs: Vec<Interval> = intervals(&marks).into_values().collect();
    assert_eq!(runs.len(), running.len(), "{runs:#?}");
    assert!(runs.iter().all(|i| i.end_ns.is_some()), "{runs:#?}");
    let over = overcommits(&runs);
    assert!(over.is_empty(), "ran twice at once: {over:?}");

    // The audit log shows both leaders' starts, and `axle get hubs` the new one.
    let view = env.hubs_view(next).await.expect("hubs view");
    assert_eq!(view.leader.as_deref(), Some(format!("r{next}").as_str()));
    // The follower kept a warm copy and took the lead from it, not from etcd.
    let state = view.state.clone().unwrap_or_default();
    assert!(
        state.contains("restored from its mirror at revision"),
        "{state}"
    );
    assert!(
        !view.replicas.iter().any(|r| r.id == format!("r{leader}")),
        "{view:?}"
    );
    let out = axle_e2e::axle_cli(&env.hub_urls(), &["get", "hubs"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.contains(&format!("r{next}"))
            && out.stdout.contains("leader")
            && out.stdout.contains("answered by"),
        "{}",
        out.stdout
    );
}
