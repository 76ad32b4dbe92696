//! The hub killed with SIGKILL mid-run and restarted on the same data dir and
//! ports: no accepted workload is lost (each keeps its history), running
//! workloads are adopted rather than restarted (one `start` line each, same
//! epoch) and finish Succeeded, and queued work still runs.

use std::collections::BTreeMap;
use std::time::Duration;

use axle_e2e::{
    Env, Interval, intervals, overcommits, read_trace, request, sh, traced_script, wait_until,
};
use axle_proto::api::WorkloadView;

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_hub_restarts_from_its_store_and_adopts_running_workloads() {
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

    // Finished before the kill.
    let mut done = Vec::new();
    for team in ["alpha", "beta"] {
        done.push(
            api.submit_ok(&request(team, 0.5, sh(&traced_script(&trace, "0.1"))))
                .await
                .id,
        );
    }
    api.wait_all_finished(&done, Duration::from_secs(30)).await;

    // Running across the kill: two on each cluster.
    let mut running = Vec::new();
    for (team, model) in [
        ("alpha", "H100"),
        ("beta", "H100"),
        ("gamma", "A100"),
        ("alpha", "A100"),
    ] {
        let mut r = request(team, 1.0, sh(&traced_script(&trace, "6")));
        r.gpu_model = Some(model.into());
        running.push(api.submit_ok(&r).await.id);
    }
    // Queued across the kill: all four A100s, two of which are busy.
    let mut big = request("gamma", 4.0, sh(&traced_script(&trace, "0.5")));
    big.gpu_model = Some("A100".into());
    big.idempotency_key = Some("big-a100".into());
    let queued = api.submit_ok(&big).await.id;

    wait_until(Duration::from_secs(30), "the four to run", || {
        let api = api.clone();
        let trace = trace.clone();
        let running = running.clone();
        async move {
            let ws = api.try_workloads().await?;
            let n = ws
                .iter()
                .filter(|w| running.contains(&w.id) && w.state == "Running")
                .count();
            let starts = read_trace(&trace)
                .iter()
                .filter(|m| m.start && running.contains(&m.id))
                .count();
            if n == running.len() && starts == running.len() {
                Ok(())
            } else {
                Err(format!("{n} Running, {starts} start lines"))
            }
        }
    })
    .await;
    let before: BTreeMap<u64, WorkloadView> = api
        .workloads()
        .await
        .into_iter()
        .map(|w| (w.id, w))
        .collect();
    assert_eq!(before[&queued].state, "Pending", "{:#?}", before[&queued]);

    env.hub.kill9();
    assert!(
        api.try_get("/healthz").await.is_err(),
        "the killed hub still answers"
    );
    env.hub.restart();
    env.hub.wait_ready(&["eu-1", "us-1"]).await;

    // Nothing lost: every workload is there with its history so far.
    let after: BTreeMap<u64, WorkloadView> = api
        .workloads()
        .await
        .into_iter()
        .map(|w| (w.id, w))
        .collect();
    for (id, b) in &before {
        let a = after
            .get(id)
            .unwrap_or_else(|| panic!("workload {id} lost by the restart"));
        assert_eq!(
            (&a.team, &a.name, &a.command),
            (&b.team, &b.name, &b.command)
        );
        assert_eq!(a.submitted_at_ms, b.submitted_at_ms, "workload {id}");
        assert!(
            a.history.len() >= b.history.len() && a.history[..b.history.len()] == b.history[..],
            "workload {id}: history before the kill {:#?} is not a prefix of {:#?}",
            b.history,
            a.history
        );
    }
    // The idempotency key survived too.
    let (status, again) = api.submit(&big).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"], queued);

    let mut all_ids = done.clone();
    all_ids.extend(&running);
    all_ids.push(queued);
    let finished: BTreeMap<u64, WorkloadView> = api
        .wait_all_finished(&all_ids, Duration::from_secs(60))
        .await
        .into_iter()
        .map(|w| (w.id, w))
        .collect();
    assert_eq!(
        finished.len(),
        all_ids.len(),
        "no workload appeared or vanished"
    );
    for id in &all_ids {
        let w = &finished[id];
        assert_eq!(w.state, "Succeeded", "{w:#?}");
        assert_eq!(w.preemptions, 0, "{w:#?}");
    }
    for id in &done {
        assert_eq!(
            finished[id].history, before[id].history,
            "finished workload {id} changed"
        );
    }

    // Adopted, not restarted: one start line each, under the epoch it had.
    let marks = read_trace(&trace);
    for id in &running {
        let w = &finished[id];
        assert_eq!(
            w.epoch, before[id].epoch,
            "workload {id} got a new epoch: {w:#?}"
        );
        let starts: Vec<_> = marks.iter().filter(|m| m.start && m.id == *id).collect();
        assert_eq!(
            starts.len(),
            1,
            "workload {id} started {} times: {starts:#?}",
            starts.len()
        );
        assert_eq!(starts[0].epoch, w.epoch);
        let states: Vec<&str> = w.history.iter().map(|h| h.to.as_str()).collect();
        assert_eq!(
            states,
            ["Placed", "Running", "Succeeded"],
            "workload {id} history: {:#?}",
            w.history
        );
    }
    let runs = intervals(&marks);
    assert_eq!(runs.len(), all_ids.len(), "one run per workload: {runs:#?}");
    let complete: Vec<Interval> = runs.into_values().collect();
    assert!(complete.iter().all(|i| i.end_ns.is_some()), "{complete:#?}");
    let bad = overcommits(&complete);
    assert!(bad.is_empty(), "over-committed: {bad:?}");
    let starts = api
        .events()
        .await
        .iter()
        .filter(|e| e.kind == "hub_started")
        .count();
    assert_eq!(starts, 2, "the audit log should show both hub starts");
}
