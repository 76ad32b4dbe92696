//! etcd faults under a replicated hub, on a real 3-member cluster, in sequence:
//! one member killed (a minority) under load: nothing acknowledged is lost, at most a
//! retry; two members killed (the majority): writes get a clear 503, running workloads
//! keep running, and the hub recovers by itself once etcd is back; then every process
//! (etcd, hubs, spokes) restarted at once: the fleet comes back with its state.

use std::time::{Duration, Instant};

use axle_e2e::ha::{HaEnv, Load, check_history, totals};
use axle_e2e::{read_trace, request, sh, traced_script, wait_until};

#[tokio::test(flavor = "multi_thread")]
async fn etcd_minority_and_majority_loss_and_a_full_restart_lose_nothing() {
    let ttl = Duration::from_secs(5);
    let mut env = HaEnv::start(
        &["ha", "two-clusters"],
        2,
        ttl,
        &[("eu-1", "eu-west", &["4xH100:80GB"])],
    )
    .await;
    let leader = env.leader().await.expect("a leader");
    let api = env.hubs[leader].api();
    let trace = env.path("trace.log");
    let mut r = request("alpha", 1.0, sh(&traced_script(&trace, "25")));
    r.gpu_model = Some("H100".into());
    let long = api.submit_ok(&r).await.id;
    api.wait_state(long, "Running", Duration::from_secs(30))
        .await;

    // 1. A minority: one member of three.
    let apis: Vec<_> = env.hubs.iter().map(|h| h.api()).collect();
    let load = Load::start(apis.clone(), 32, leader, "minority");
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.etcd.kill9(0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let histories = load.stop().await;
    let (acked, _, retries, unacked) = totals(&histories);
    eprintln!("minority loss: {acked} acknowledged, {retries} retried, {unacked} unacknowledged");
    assert_eq!(unacked, 0);
    let leader = env
        .wait_leader_ready(&["eu-1"], Duration::from_secs(30))
        .await;
    let mut all = histories;
    let bad = check_history(&all, &[], &env.hubs[leader].api().workloads().await);
    assert!(bad.is_empty(), "{bad:#?}");

    // 2. The majority: two of three (the first is still down, kill one more).
    env.etcd.kill9(1);
    let cut = Instant::now();
    let mut probe = request("beta", 1.0, sh("true"));
    probe.gpu_model = Some("A100".into());
    let refused = wait_until(
        Duration::from_secs(30),
        "writes to be refused with 503",
        || {
            let apis = apis.clone();
            let probe = probe.clone();
            async move {
                let mut seen = Vec::new();
                for a in &apis {
                    match a.try_submit(&probe).await {
                        Ok((503, body)) => return Ok(body),
                        other => seen.push(format!("{other:?}")),
                    }
                }
                Err(seen.join("; "))
            }
        },
    )
    .await;
    eprintln!(
        "majority loss: writes refused {:?} after the cut: {refused}",
        cut.elapsed()
    );
    assert!(
        refused["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{refused}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The workload still runs on its spoke: no end line.
    assert!(
        read_trace(&trace).iter().all(|m| m.start),
        "the running workload was stopped during the etcd outage"
    );
    env.etcd.restart(0);
    env.etcd.restart(1);
    env.etcd.wait_healthy(3);
    let healed = Instant::now();
    let leader = env
        .wait_leader_ready(&["eu-1"], Duration::from_secs(40))
        .await;
    eprintln!(
        "majority loss: r{leader} leads again {:?} after etcd came back",
        healed.elapsed()
    );
    let api = env.hubs[leader].api();
    let after = api.workload(long).await;
    assert_eq!(after.state, "Running", "{after:#?}");
    let load = Load::start(apis.clone(), 8, leader, "healed");
    tokio::time::sleep(Duration::from_secs(1)).await;
    all.extend(load.stop().await);
    let bad = check_history(&all, &[], &api.workloads().await);
    assert!(bad.is_empty(), "{bad:#?}");
    api.wait_all_finished(&[long], Duration::from_secs(60))
        .await;
    let done = api.workload(long).await;
    assert_eq!(done.state, "Succeeded", "{done:#?}");
    let starts = read_trace(&trace).iter().filter(|m| m.start).count();
    assert_eq!(starts, 1, "the long workload ran once");

    // 3. Everything at once: spokes, hubs and etcd killed, then started again.
    let before = api.workloads().await;
    for s in &mut env.spokes {
        s.kill9();
    }
    for h in &mut env.hubs {
        h.kill9();
    }
    for i in 0..3 {
        env.etcd.kill9(i);
    }
    for i in 0..3 {
        env.etcd.restart(i);
    }
    for h in &mut env.hubs {
        h.restart();
    }
    for s in &mut env.spokes {
        s.restart();
    }
    let leader = env
        .wait_leader_ready(&["eu-1"], Duration::from_secs(60))
        .await;
    let after = env.hubs[leader].api().workloads().await;
    assert_eq!(after.len(), before.len(), "every workload came back");
    for b in &before {
        let a = after.iter().find(|a| a.id == b.id).expect("present");
        assert_eq!((&a.name, &a.team, &a.state), (&b.name, &b.team, &b.state));
    }
    let bad = check_history(&all, &[], &after);
    assert!(bad.is_empty(), "{bad:#?}");
}
