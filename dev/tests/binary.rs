//! The `axle-dev` binary refuses what it cannot start, before it binds or
//! writes anything: a broken policy repository and `--no-auth` off loopback.
//! (This package's integration test also makes `cargo test --workspace`
//! build the `axle-dev` binary that the README's e2e tests run.)

use std::process::Command;

fn axle_dev() -> Command {
    Command::new(env!("CARGO_BIN_EXE_axle-dev"))
}

#[test]
fn a_broken_policy_is_refused_with_the_file_and_line() {
    let dir = tempfile_dir();
    std::fs::write(dir.join("team.yaml"), "kind: Team\nname: x\n").unwrap();
    let out = axle_dev()
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--policy"])
        .arg(&dir)
        .env_remove("AXLE_DATA_DIR")
        .output()
        .expect("run axle-dev");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "axle-dev started on a broken policy");
    assert!(stderr.contains("team.yaml:2:1"), "{stderr}");
    assert!(stderr.contains("unknown field `name`"), "{stderr}");
    assert!(stderr.contains("has errors"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("is up"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_auth_is_refused_off_loopback() {
    let out = axle_dev()
        .args(["--no-auth", "--http", "0.0.0.0:0", "--grpc", "0.0.0.0:0"])
        .env_remove("AXLE_POLICY")
        .output()
        .expect("run axle-dev");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "axle-dev ran without auth off loopback"
    );
    assert!(stderr.contains("loopback only"), "{stderr}");
}

/// A fresh directory under the system temp dir (this package has no
/// dev-dependencies, so no `tempfile`).
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("axle-dev-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
