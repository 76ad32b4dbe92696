//! The leading replica paused (SIGSTOP) for longer than its lease, then resumed: a
//! follower leads meanwhile, the paused one writes nothing (its term is fenced), steps
//! down when it wakes and rejoins as a follower, and no acknowledged operation is lost
//! or doubled.

use std::time::{Duration, Instant};

use axle_e2e::ha::{HaEnv, Load, check_history, totals};

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_leader_is_fenced_steps_down_and_rejoins_as_follower() {
    let ttl = Duration::from_secs(5);
    let env = HaEnv::start(
        &["ha", "two-clusters"],
        3,
        ttl,
        &[("eu-1", "eu-west", &["4xH100:80GB"])],
    )
    .await;
    let old = env.leader().await.expect("a leader");
    let term_before = env.hubs_view(old).await.expect("hubs").term.expect("term");
    let apis: Vec<_> = env.hubs.iter().map(|h| h.api()).collect();
    let load = Load::start(apis, 16, old, "pause");
    tokio::time::sleep(Duration::from_secs(1)).await;

    env.hubs[old].signal("STOP");
    let stopped = Instant::now();
    let new = loop {
        if let Some(i) = env.leader().await
            && i != old
        {
            break i;
        }
        assert!(
            stopped.elapsed() < ttl + Duration::from_secs(10),
            "no follower took over from the paused leader"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!(
        "r{new} leads {:?} after r{old} was paused",
        stopped.elapsed()
    );
    let view = env.hubs_view(new).await.expect("hubs");
    let term = view.term.expect("term");
    assert!(term > term_before, "a new term: {term} after {term_before}");
    // Paused past its lease, then resumed.
    tokio::time::sleep((ttl + Duration::from_secs(3)).saturating_sub(stopped.elapsed())).await;
    env.hubs[old].signal("CONT");

    // It steps down and follows the new leader, whose term did not change.
    axle_e2e::wait_until(Duration::from_secs(15), "the old leader to follow", || {
        let env = &env;
        async move {
            let (code, body) = env.hubs[old]
                .api()
                .try_get("/readyz")
                .await
                .map_err(|e| e.to_string())?;
            let v = env.hubs_view(old).await?;
            if code == 503 && v.leader.as_deref() == Some(format!("r{new}").as_str()) {
                Ok(())
            } else {
                Err(format!("readyz {code} {body}; it sees {v:?}"))
            }
        }
    })
    .await;
    assert_eq!(env.leader().await, Some(new), "one leader, the new one");
    let view = env.hubs_view(new).await.expect("hubs");
    assert_eq!(
        view.term,
        Some(term),
        "the paused replica took nothing back"
    );
    assert!(
        view.replicas
            .iter()
            .any(|r| r.id == format!("r{old}") && !r.leader),
        "it rejoined as a follower: {view:?}"
    );
    let log = env.hubs[old].log();
    assert!(log.contains("steps down"), "{log}");

    tokio::time::sleep(Duration::from_secs(1)).await;
    let histories = load.stop().await;
    let (acked, cancelled, retries, unacked) = totals(&histories);
    eprintln!(
        "load: {acked} acknowledged, {cancelled} cancels, {retries} retried, {unacked} unacknowledged"
    );
    assert_eq!(unacked, 0);
    let workloads = env.hubs[new].api().workloads().await;
    let bad = check_history(&histories, &[], &workloads);
    assert!(bad.is_empty(), "{} problems: {bad:#?}", bad.len());
    // A request to the old replica is redirected to the leader and served there.
    let (code, _) = env.hubs[old].api().get("/api/v1/teams").await;
    assert_eq!(code, 200);
}
