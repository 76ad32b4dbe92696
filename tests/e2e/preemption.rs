//! Preemption end to end: a batch workload borrowing every GPU of a cluster
//! is preempted when the owning team submits training work within its
//! guarantee; the history and the audit log say why (with the policy
//! revision), the training job runs, and the batch workload runs again under
//! a later epoch once capacity frees, then succeeds.

use std::time::Duration;

use axle_e2e::{
    Env, Interval, intervals, overcommits, read_trace, request, sh, traced_script, wait_until,
};

#[tokio::test(flavor = "multi_thread")]
async fn batch_is_preempted_for_guaranteed_training_and_runs_again_later() {
    let env = Env::start(
        &["common", "preemption"],
        &[("solo", "eu-west", &["4xH100:80GB"])],
    )
    .await;
    let api = env.api();
    let trace = env.path("trace.log");

    let mut batch = request("batchers", 4.0, sh(&traced_script(&trace, "3")));
    batch.name = Some("nightly-batch".into());
    batch.priority = Some("batch".into());
    let batch = api.submit_ok(&batch).await;

    // Wait until it really runs on the spoke (its start line is written).
    wait_until(
        Duration::from_secs(30),
        "the batch workload to start",
        || {
            let trace = trace.clone();
            let api = api.clone();
            async move {
                let started = read_trace(&trace)
                    .iter()
                    .any(|m| m.id == batch.id && m.start);
                let w = api.workload(batch.id).await;
                if started && w.state == "Running" {
                    Ok(())
                } else {
                    Err(format!("state {}, started line: {started}", w.state))
                }
            }
        },
    )
    .await;
    let clusters = api.clusters().await;
    assert_eq!(
        clusters[0].gpus_allocated, 4.0,
        "the batch workload holds every GPU"
    );

    let mut train = request("trainers", 2.0, sh(&traced_script(&trace, "1")));
    train.name = Some("finetune".into());
    train.priority = Some("training".into());
    let train = api.submit_ok(&train).await;

    let all = api
        .wait_all_finished(&[batch.id, train.id], Duration::from_secs(60))
        .await;
    let b = all.iter().find(|w| w.id == batch.id).expect("batch");
    let t = all.iter().find(|w| w.id == train.id).expect("training");
    assert_eq!(t.state, "Succeeded", "training: {t:#?}");
    assert_eq!(b.state, "Succeeded", "batch: {b:#?}");
    assert_eq!(b.preemptions, 1, "batch: {b:#?}");
    assert!(
        b.epoch >= 2,
        "the batch workload should run again under a later epoch: {b:#?}"
    );

    // Its history shows the preemption with a reason naming the preemptor.
    let pre = b
        .history
        .iter()
        .find(|h| h.from == "Running" && h.to == "Preempting")
        .unwrap_or_else(|| panic!("no Running -> Preempting transition: {:#?}", b.history));
    assert!(
        pre.reason.contains("preempted") && pre.reason.contains(&train.id.to_string()),
        "preemption reason should name the preemptor: {pre:?}"
    );
    let states: Vec<&str> = b.history.iter().map(|h| h.to.as_str()).collect();
    assert_eq!(
        states,
        [
            "Placed",
            "Running",
            // Re-queued only once its stop was confirmed.
            "Preempting",
            "Pending",
            "Placed",
            "Running",
            "Succeeded"
        ],
        "batch history: {:#?}",
        b.history
    );
    let placed = t
        .history
        .iter()
        .find(|h| h.to == "Placed")
        .expect("training was placed");
    assert!(
        placed
            .reason
            .contains(&format!("after preempting {}", batch.id)),
        "training placement should name its victim: {placed:?}"
    );

    // The audit log has the preemption, its reason and the policy revision.
    let (status, policy) = api.get("/api/v1/policy").await;
    assert_eq!(status, 200);
    let revision = policy["revision"]
        .as_str()
        .expect("policy revision")
        .to_string();
    let events = api.events().await;
    let ev = events
        .iter()
        .find(|e| e.kind == "preempted" && e.workload == Some(batch.id))
        .unwrap_or_else(|| panic!("no preempted event for {}: {events:#?}", batch.id));
    assert_eq!(ev.message, pre.reason, "event message vs history reason");
    assert_eq!(ev.cluster.as_deref(), Some("solo"));
    assert!(!ev.policy_revision.is_empty());
    assert_eq!(ev.policy_revision, revision);

    // The spoke's side: the victim stopped before the training job started,
    // and ran again only after it; nothing over-committed.
    let runs = intervals(&read_trace(&trace));
    let run = |id: u64, epoch: u64| -> Interval {
        runs.get(&(id, epoch, 0))
            .cloned()
            .unwrap_or_else(|| panic!("no run of {id} epoch {epoch}: {runs:#?}"))
    };
    let first = run(batch.id, 1);
    let last = run(batch.id, b.epoch);
    let tr = run(train.id, t.epoch);
    let first_end = first
        .end_ns
        .expect("the preempted run wrote its end line (SIGTERM)");
    assert!(
        first_end <= tr.start.ts_ns,
        "training started before the victim stopped"
    );
    assert!(
        tr.end_ns.expect("training ended") <= last.start.ts_ns,
        "the batch workload ran again before the training job ended"
    );
    assert_eq!(runs.len(), 3, "exactly three runs: {runs:#?}");
    let complete: Vec<Interval> = runs.into_values().collect();
    let bad = overcommits(&complete);
    assert!(bad.is_empty(), "over-committed: {bad:?}");
}
