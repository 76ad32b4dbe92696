//! End-to-end tests of the spoke agent against an in-test hub over real gRPC:
//! registration, running assignments, logs, stops, GPU waits, reconnects.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axle_proto::pb;
use common::{NODE, TestHub, assign, start_spoke, wait_file, wait_gone};

fn env_of(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn registers_with_inventory_labels_token_then_heartbeats() {
    let hub = TestHub::start().await;
    let spoke = start_spoke(&hub);
    let register = hub.wait_register().await;
    assert_eq!(register.cluster, "test-cluster");
    assert_eq!(register.region, "eu-test");
    assert_eq!(
        register.labels.get("bu").map(String::as_str),
        Some("research")
    );
    assert_eq!(register.token, "s3cret");
    assert!(!register.instance_id.is_empty());
    assert!(register.running.is_empty());
    assert_eq!(register.nodes.len(), 1);
    assert_eq!(register.nodes[0].name, NODE);
    let indices: Vec<u32> = register.nodes[0].gpus.iter().map(|g| g.index).collect();
    assert_eq!(indices, [0, 1, 2, 3]);
    assert!(
        register.nodes[0]
            .gpus
            .iter()
            .all(|g| g.model == "H100" && g.memory_mb == 81559)
    );
    let beat = hub
        .wait_for("a heartbeat", |msgs| {
            msgs.iter().find_map(|m| match &m.msg {
                Some(pb::spoke_message::Msg::Heartbeat(h)) => Some(h.clone()),
                _ => None,
            })
        })
        .await;
    assert_eq!(beat.nodes, register.nodes);
    spoke.shutdown().await.expect("clean shutdown");
    hub.stop().await;
}

#[tokio::test]
async fn runs_assignment_with_gpu_env_and_reports_started_then_succeeded() {
    let hub = TestHub::start().await;
    let spoke = start_spoke(&hub);
    hub.wait_register().await;

    hub.assign(assign(1, 7, "env > env.txt", &[&[(3, 1000), (1, 1000)]], 5))
        .await;
    hub.assign(assign(2, 1, "env > env.txt", &[&[(0, 250)]], 5))
        .await;
    let done = hub.wait_status(1, 7, pb::Phase::Succeeded).await;
    assert_eq!(done.exit_code, 0);
    hub.wait_status(2, 1, pb::Phase::Succeeded).await;
    let started = hub
        .position(1, 7, pb::Phase::Started)
        .expect("STARTED sent");
    let succeeded = hub
        .position(1, 7, pb::Phase::Succeeded)
        .expect("SUCCEEDED sent");
    assert!(started < succeeded);

    let env = env_of(&wait_file(&spoke.work_file(1, 7, "env.txt")).await);
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "3,1");
    assert!(!env.contains_key("AXLE_GPU_FRACTION"));
    assert_eq!(env["AXLE_WORKLOAD_ID"], "1");
    assert_eq!(env["AXLE_EPOCH"], "7");
    assert_eq!(env["AXLE_REPLICA"], "0");
    assert_eq!(env["AXLE_REPLICAS"], "1");
    assert_eq!(env["AXLE_NODE"], NODE);
    assert_eq!(env["FOO"], "bar");

    let env = env_of(&wait_file(&spoke.work_file(2, 1, "env.txt")).await);
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "0");
    assert_eq!(env["AXLE_GPU_FRACTION"], "0.25");

    // A re-sent assignment for an epoch that already ran is answered, not rerun.
    hub.assign(assign(1, 7, "env > env.txt", &[&[(3, 1000)]], 5))
        .await;
    hub.wait_for("the re-sent final status", |msgs| {
        let n = msgs
            .iter()
            .filter(|m| {
                matches!(&m.msg, Some(pb::spoke_message::Msg::Status(s))
                if s.workload_id == 1 && s.phase == pb::Phase::Succeeded as i32)
            })
            .count();
        (n == 2).then_some(())
    })
    .await;
    let starts = hub
        .statuses()
        .iter()
        .filter(|s| s.workload_id == 1 && s.phase == pb::Phase::Started as i32)
        .count();
    assert_eq!(starts, 1, "finished epoch must not run twice");
    spoke.shutdown().await.expect("clean shutdown");
    hub.stop().await;
}

#[tokio::test]
async fn failures_report_failed_with_exit_code() {
    let hub = TestHub::start().await;
    let spoke = start_spoke(&hub);
    hub.wait_register().await;

    hub.assign(assign(10, 1, "exit 3", &[&[(0, 1000)]], 5))
        .await;
    let failed = hub.wait_status(10, 1, pb::Phase::Failed).await;
    assert_eq!(failed.exit_code, 3);
    assert!(failed.message.contains("code 3"), "{}", failed.message);
    assert!(hub.position(10, 1, pb::Phase::Started) < hub.position(10, 1, pb::Phase::Failed));

    // A command that cannot run fails without ever starting.
    let mut missing = assign(11, 1, "", &[&[(1, 1000)]], 5);
    missing.command = vec!["no-such-program-axle".into()];
    hub.assign(missing).await;
    let failed = hub.wait_status(11, 1, pb::Phase::Failed).await;
    assert_eq!(failed.exit_code, 127);
    assert!(failed.message.contains("not found"), "{}", failed.message);
    assert_eq!(hub.position(11, 1, pb::Phase::Started), None);

    // One failing replica stops the others promptly.
    let t0 = Instant::now();
    hub.assign(assign(
        12,
        1,
        r#"if [ "$AXLE_REPLICA" = 0 ]; then exit 5; fi; exec sleep 100"#,
        &[&[(2, 1000)], &[(3, 1000)]],
        5,
    ))
    .await;
    let failed = hub.wait_status(12, 1, pb::Phase::Failed).await;
    assert_eq!(failed.exit_code, 5);
    assert!(
        failed.message.contains("stopped the other replicas"),
        "{}",
        failed.message
    );
    // The other replica sleeps 100 s: ending well before that proves it was
    // stopped (the bound leaves room for a loaded machine; it takes ~1 s).
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "other replica stopped by SIGTERM"
    );

    // An assignment this spoke cannot place is refused with the reason.
    let mut elsewhere = assign(13, 1, "true", &[&[(0, 1000)]], 5);
    elsewhere.replicas[0].node = "node-zz".into();
    hub.assign(elsewhere).await;
    let failed = hub.wait_status(13, 1, pb::Phase::Failed).await;
    assert!(failed.message.contains("node-zz"), "{}", failed.message);

    // Max runtime is enforced.
    let mut slow = assign(14, 1, "exec sleep 100", &[&[(1, 1000)]], 5);
    slow.max_runtime_s = 1;
    hub.assign(slow).await;
    let failed = hub.wait_status(14, 1, pb::Phase::Failed).await;
    assert!(failed.message.contains("max runtime"), "{}", failed.message);
    spoke.shutdown().await.expect("clean shutdown");
    hub.stop().await;
}

#[tokio::test]
async fn output_goes_to_the_log_file_and_up_as_log_chunks() {
    let hub = TestHub::start().await;
    let spoke = start_spoke(&hub);
    hub.wait_register().await;

    hub.assign(assign(
        20,
        2,
        "echo out; echo err >&2; echo more",
        &[&[(0, 1000)]],
        5,
    ))
    .await;
    hub.wait_status(20, 2, pb::Phase::Succeeded).await;
    let file = std::fs::read(spoke.log_file(20, 2)).expect("log file");
    let text = String::from_utf8_lossy(&file);
    for line in ["out", "err", "more"] {
        assert!(text.lines().any(|l| l == line), "{text:?}");
    }
    // Chunks precede the final status, so all of them are here by now.
    assert_eq!(hub.log_bytes(20, 2), file);

    hub.assign(assign(
        21,
        1,
        "echo hi $AXLE_REPLICA; echo bye $AXLE_REPLICA",
        &[&[], &[]],
        5,
    ))
    .await;
    hub.wait_status(21, 1, pb::Phase::Succeeded).await;
    let file = std::fs::read_to_string(spoke.log_file(21, 1)).expect("log file");
    let mut lines: Vec<&str> = file.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        ["[r0] bye 0", "[r0] hi 0", "[r1] bye 1", "[r1] hi 1"]
    );
    assert_eq!(hub.log_bytes(21, 1), file.as_bytes());
    spoke.shutdown().await.expect("clean shutdown");
    hub.stop().await;
}

#[tokio::test]
async fn stop_sends_sigterm_then_sigkill_after_the_grace_period() {
    let hub = TestHub::start().await;
    let spoke = start_spoke(&hub);
    hub.wait_register().await;

    // Ignores SIGTERM: only SIGKILL after the grace period ends it.
    hub.assign(assign(
        30,
        1,
        r#"trap "" TERM; echo $$ > pid; sleep 100"#,
        &[&[(0, 1000)]],
        30,
    ))
    .await;
    // Exits on SIGTERM.
    hub.assign(assign(
        31,
        1,
        "echo $$ > pid; exec sleep 100",
        &[&[(1, 1000)]],
        30,
    ))
    .await;
    let stubborn = wait_file(&spoke.work_file(30, 1, "pid")).await;
    let polite = wait_file(&spoke.work_file(31, 1, "pid")).await;
    hub.wait_status(30, 1, pb::Phase::Started).await;
    hub.wait_status(31, 1, pb::Phase::Started).await;

    let t0 = Instant::now();
    hub.stop_workload(30, 1, pb::StopReason::Preempted, 1).await;
    hub.stop_workload(31, 1, pb::StopReason::Cancelled, 10)
        .await;
    let stopped = hub.wait_status(31, 1, pb::Phase::Stopped).await;
    assert!(t0.elapsed() < Duration::from_secs(3), "SIGTERM came first");
    assert_eq!(stopped.exit_code, 128 + 15);
    let stopped = hub.wait_status(30, 1, pb::Phase::Stopped).await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "SIGKILL waited for the grace: {took:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "SIGKILL came after the grace: {took:?}"
    );
    assert_eq!(stopped.exit_code, -9);
    assert!(stopped.message.contains("preempted"), "{}", stopped.message);
    wait_gone(&stubborn, Duration::from_secs(2)).await;
    wait_gone(&polite, Duration::from_secs(2)).await;

    // Stops for what is not running are acknowledged, any epoch included.
    hub.stop_workload(99, 4, pb::StopReason::Cancelled, 1).await;
    hub.wait_status(99, 4, pb::Phase::Stopped).await;
    hub.stop_workload(98, 0, pb::StopReason::Stale, 1).await;
    hub.wait_status(98, 0, pb::Phase::Stopped).await;
    spoke.shutdown().await.expect("clean shutdown");
    hub.stop().await;
}

#[tokio::test]
async fn assignment_waits_for_gpus_held_by_a_stopping_workload() {
    let hub = TestHub::start().await;
    let spoke = start_spoke(&hub);
    hub.wait_register().await;

    hub.assign(assign(
        40,
        1,
        r#"trap "" TERM; echo $$ > pid; sleep 100"#,
        &[&[(0, 1000)]],
        30,
    ))
    .await;
    hub.wait_status(40, 1, pb::Phase::Started).await;
    // The trap is set once the pid file exists.
    wait_file(&spoke.work_file(40, 1, "pid")).await;

    // Preemption: the victim's Stop and the preemptor's Assign arrive together.
    let t0 = Instant::now();
    hub.stop_workload(40, 1, pb::StopReason::Preempted, 1).await;
    hub.assign(assign(
        41,
        1,
        "echo $CUDA_VISIBLE_DEVICES > gpus",
        &[&[(0, 500)]],
        5,
    ))
    .await;
    // Another GPU is free: no reason to wait.
    hub.assign(assign(42, 1, "true", &[&[(1, 1000)]], 5)).await;
    hub.wait_status(42, 1, pb::Phase::Succeeded).await;
    assert!(
        hub.position(41, 1, pb::Phase::Started).is_none(),
        "41 must wait for GPU 0: {:#?}",
        hub.statuses()
    );

    hub.wait_status(41, 1, pb::Phase::Succeeded).await;
    let victim_gone = hub
        .position(40, 1, pb::Phase::Stopped)
        .expect("victim stopped");
    let preemptor_started = hub
        .position(41, 1, pb::Phase::Started)
        .expect("preemptor started");
    assert!(
        victim_gone < preemptor_started,
        "GPU 0 was shared with a live process"
    );
    assert!(t0.elapsed() >= Duration::from_millis(900));
    assert_eq!(wait_file(&spoke.work_file(41, 1, "gpus")).await, "0");
    spoke.shutdown().await.expect("clean shutdown");
    hub.stop().await;
}

#[tokio::test]
async fn new_epoch_replaces_the_old_copy_after_it_stops() {
    let hub = TestHub::start().await;
    let spoke = start_spoke(&hub);
    hub.wait_register().await;

    hub.assign(assign(
        50,
        1,
        "echo $$ > pid; exec sleep 100",
        &[&[(0, 1000)]],
        5,
    ))
    .await;
    let old = wait_file(&spoke.work_file(50, 1, "pid")).await;
    hub.assign(assign(
        50,
        2,
        "echo $$ > pid; exec sleep 100",
        &[&[(2, 1000)]],
        5,
    ))
    .await;
    let stopped = hub.wait_status(50, 1, pb::Phase::Stopped).await;
    assert!(stopped.message.contains("epoch 2"), "{}", stopped.message);
    hub.wait_status(50, 2, pb::Phase::Started).await;
    assert!(common::process_gone(&old));
    assert!(hub.position(50, 1, pb::Phase::Stopped) < hub.position(50, 2, pb::Phase::Started));
    spoke.shutdown().await.expect("clean shutdown");
    hub.stop().await;
}

#[tokio::test]
async fn reconnects_after_a_hub_restart_and_delivers_what_happened_meanwhile() {
    let hub = TestHub::start().await;
    let addr = hub.addr;
    let spoke = start_spoke(&hub);
    let first = hub.wait_register().await;

    hub.assign(assign(60, 1, "exec sleep 100", &[&[(0, 1000)]], 1))
        .await;
    hub.assign(assign(61, 1, "sleep 1", &[&[(1, 1000)]], 1))
        .await;
    hub.wait_status(60, 1, pb::Phase::Started).await;
    hub.wait_status(61, 1, pb::Phase::Started).await;

    hub.stop().await;
    // 61 finishes while there is no hub.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let hub = TestHub::start_on(addr).await;

    let again = hub.wait_register().await;
    assert_eq!(
        again.instance_id, first.instance_id,
        "same process, same instance"
    );
    let running: Vec<(u64, u64)> = again
        .running
        .iter()
        .map(|r| (r.workload_id, r.epoch))
        .collect();
    assert_eq!(running, [(60, 1)]);
    let done = hub.wait_status(61, 1, pb::Phase::Succeeded).await;
    assert_eq!(done.exit_code, 0);

    // The hub re-sends its assignments: the running one is not started twice.
    hub.assign(assign(60, 1, "exec sleep 100", &[&[(0, 1000)]], 1))
        .await;
    hub.stop_workload(60, 1, pb::StopReason::Cancelled, 1).await;
    hub.wait_status(60, 1, pb::Phase::Stopped).await;
    assert_eq!(hub.position(60, 1, pb::Phase::Started), None);
    spoke.shutdown().await.expect("clean shutdown");
    hub.stop().await;
}

#[tokio::test]
async fn shutdown_stops_running_workloads() {
    let hub = TestHub::start().await;
    let spoke = start_spoke(&hub);
    hub.wait_register().await;
    hub.assign(assign(
        70,
        1,
        "echo $$ > pid; exec sleep 100",
        &[&[(0, 1000)]],
        5,
    ))
    .await;
    let pid = wait_file(&spoke.work_file(70, 1, "pid")).await;
    hub.wait_status(70, 1, pb::Phase::Started).await;
    let t0 = Instant::now();
    let data_dir = spoke.path().to_path_buf();
    spoke.shutdown().await.expect("clean shutdown");
    assert!(t0.elapsed() < Duration::from_secs(4));
    assert!(common::process_gone(&pid));
    let stopped = hub.wait_status(70, 1, pb::Phase::Stopped).await;
    assert!(
        stopped.message.contains("shutting down"),
        "{}",
        stopped.message
    );
    drop(data_dir);
    hub.stop().await;
}

#[tokio::test]
async fn a_spoke_cut_off_from_the_hub_stops_its_workloads() {
    let hub = TestHub::start().await;
    // This test hub never acknowledges heartbeats: from the spoke's side it
    // is a hub that can no longer hear it (a partition).
    hub.set_fence_after_ms(1500);
    let spoke = start_spoke(&hub);
    hub.wait_register().await;
    hub.assign(assign(
        40,
        1,
        "echo $$ > pid; exec sleep 60",
        &[&[(0, 1000)]],
        1,
    ))
    .await;
    hub.wait_status(40, 1, pb::Phase::Started).await;
    let pid = wait_file(&spoke.work_file(40, 1, "pid")).await;
    let stopped = hub.wait_status(40, 1, pb::Phase::Stopped).await;
    assert!(
        stopped.message.contains("no word from the hub"),
        "{}",
        stopped.message
    );
    wait_gone(&pid, Duration::from_secs(5)).await;
    spoke.shutdown().await.expect("clean shutdown");
    hub.stop().await;
}
