//! Tests of the `axle-spoke` binary: workloads die with a SIGKILLed spoke
//! (the shim), and bad flags are clear errors.

mod common;

use std::process::Stdio;
use std::time::Duration;

use axle_proto::pb;
use common::{TestHub, assign, wait_file, wait_gone};

const SPOKE: &str = env!("CARGO_BIN_EXE_axle-spoke");

#[tokio::test]
async fn workloads_die_with_a_killed_spoke() {
    let hub = TestHub::start().await;
    let data_dir = tempfile::tempdir().expect("tempdir");
    let mut spoke = tokio::process::Command::new(SPOKE)
        .args([
            "--hub",
            &hub.url(),
            "--cluster",
            "shim-test",
            "--gpus",
            "4xH100",
            "--node",
            common::NODE,
        ])
        .arg("--data-dir")
        .arg(data_dir.path())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn axle-spoke");
    let register = hub.wait_register().await;
    assert_eq!(register.nodes[0].gpus.len(), 4);

    // Both a plain command and one that ignores SIGTERM (which needs the
    // shim's SIGKILL after the grace period).
    hub.assign(assign(
        1,
        1,
        "echo $$ > pid; exec sleep 300",
        &[&[(0, 1000)]],
        1,
    ))
    .await;
    hub.assign(assign(
        2,
        1,
        r#"trap "" TERM; echo $$ > pid; sleep 300"#,
        &[&[(1, 1000)]],
        1,
    ))
    .await;
    let work = data_dir.path().join("work");
    let plain = wait_file(&work.join("1-1").join("pid")).await;
    let stubborn = wait_file(&work.join("2-1").join("pid")).await;
    hub.wait_status(2, 1, pb::Phase::Started).await;
    assert!(!common::process_gone(&plain));

    spoke.kill().await.expect("SIGKILL the spoke");
    wait_gone(&plain, Duration::from_secs(3)).await;
    wait_gone(&stubborn, Duration::from_secs(4)).await;
    hub.stop().await;
}

#[test]
fn malformed_gpu_flag_is_a_clear_error() {
    let out = std::process::Command::new(SPOKE)
        .args(["--cluster", "c", "--gpus", "8H100"])
        .output()
        .expect("run axle-spoke");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("8H100"), "{stderr}");
    assert!(stderr.contains("COUNTxMODEL[:MEMGB]"), "{stderr}");

    let out = std::process::Command::new(SPOKE)
        .args(["--gpus", "1xH100"])
        .output()
        .expect("run axle-spoke");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cluster"));

    let out = std::process::Command::new(SPOKE)
        .args(["--cluster", "c", "--label", "novalue"])
        .output()
        .expect("run axle-spoke");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("KEY=VALUE"));
}
