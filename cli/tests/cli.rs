//! End-to-end tests of the `axle` binary: policy check and simulate, run as a user would.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn axle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_axle"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run axle")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn policy_check_accepts_the_example_repo() {
    let out = axle(&["policy", "check", "deploy/examples/policy"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("policy OK: 4 teams, 4 priority classes, 2 clusters, 3 burst providers"),
        "{stdout}"
    );
}

#[test]
fn policy_check_reports_every_error_with_location_and_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("teams.yaml"),
        "apiVersion: axle.dev/v1\nkind: Team\nmetadata:\n  name: vision\nspec:\n  quotas:\n    H100: {guaranteed: 20, limit: 16}\n---\napiVersion: axle.dev/v1\nkind: Team\nmetadata:\n  name: nlp\nspec:\n  quotas:\n    H101: {guaranteed: 1, limit: 2}\n  colour: blue\n",
    )
    .expect("write");
    let out = axle(&["policy", "check", dir.path().to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("teams.yaml:7:"), "{stderr}");
    assert!(stderr.contains("exceeds limit"), "{stderr}");
    // The second document's error is reported too, not hidden by the first.
    assert!(stderr.contains("teams.yaml:16:3"), "{stderr}");
    assert!(stderr.contains("unknown field `colour`"), "{stderr}");
    assert!(stderr.contains("Team/nlp.spec"), "{stderr}");
    assert!(stderr.contains("2 errors"), "{stderr}");
}

#[test]
fn policy_check_of_a_missing_directory_is_a_usage_error() {
    let out = axle(&["policy", "check", "/nonexistent/axle-policy"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("does not exist"));
}

#[test]
fn policy_schema_is_json_schema() {
    let out = axle(&["policy", "schema"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        v.get("$schema").is_some() || v.get("oneOf").is_some() || v.get("properties").is_some()
    );
}

fn simulate_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec![
        "simulate",
        "--policy",
        "deploy/examples/policy",
        "-o",
        "json",
    ];
    all.extend_from_slice(args);
    let out = axle(&all);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json report")
}

#[test]
fn simulate_philly_sample_with_fifo_baseline() {
    let v = simulate_json(&[
        "--trace",
        "hub/sim/testdata/traces/philly-sample.csv",
        "--capacity",
        "64",
        "--baseline",
        "fifo",
    ]);
    for key in [
        "jobs_finished",
        "gpu_utilization",
        "queue_delay_s",
        "idle_while_waiting_gpu_hours",
        "preemptions",
        "per_team",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {v}");
    }
    assert_eq!(v["jobs_finished"], 200);
    let util = v["gpu_utilization"].as_f64().expect("number");
    assert!(util > 0.0 && util <= 1.0, "utilization {util}");
    assert_eq!(v["baseline"]["mode"], "fifo");
    assert_eq!(v["baseline"]["jobs_finished"], 200);
    // Axle lends idle GPUs, so it never leaves more idle-while-waiting than FIFO's head-of-line blocking.
    let axle_idle = v["idle_while_waiting_gpu_hours"].as_f64().expect("idle");
    let fifo_idle = v["baseline"]["idle_while_waiting_gpu_hours"]
        .as_f64()
        .expect("idle");
    assert!(
        axle_idle <= fifo_idle + 1e-9,
        "axle {axle_idle} fifo {fifo_idle}"
    );
}

#[test]
fn simulate_static_baseline_wastes_reserved_gpus() {
    let v = simulate_json(&[
        "--trace",
        "hub/sim/testdata/traces/philly-sample.csv",
        "--capacity",
        "64",
        "--baseline",
        "static",
    ]);
    let axle_idle = v["idle_while_waiting_gpu_hours"].as_f64().expect("idle");
    let static_idle = v["baseline"]["idle_while_waiting_gpu_hours"]
        .as_f64()
        .expect("idle");
    assert!(
        static_idle > axle_idle,
        "static {static_idle} axle {axle_idle}"
    );
}

#[test]
fn simulate_csv_and_openb_formats() {
    let v = simulate_json(&[
        "--trace",
        "hub/sim/testdata/traces/small.csv",
        "--format",
        "csv",
    ]);
    assert_eq!(v["jobs_submitted"], 30);
    assert!(v["per_team"].get("vision").is_some());
    assert!(v["per_priority_class"].get("production").is_some());
    let v = simulate_json(&[
        "--trace",
        "hub/sim/testdata/traces/openb-sample.csv",
        "--format",
        "alibaba-openb",
        "--capacity",
        "32",
    ]);
    assert_eq!(v["jobs_submitted"], 178);
}

#[test]
fn simulate_reports_a_malformed_row_with_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("bad.csv");
    std::fs::write(
        &f,
        "submit_time_s,duration_s,gpus,team\n0,10,1,vision\n5,ten,1,nlp\n",
    )
    .expect("write");
    let out = axle(&[
        "simulate",
        "--trace",
        f.to_str().expect("utf8"),
        "--format",
        "csv",
        "--policy",
        "deploy/examples/policy",
    ]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("bad.csv:3"), "{stderr}");
}

#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    // Observed: `axle … | head -1` panicked ("failed printing to stdout:
    // Broken pipe") once the reader had gone; `axle completion bash | head
    // -1` panicked in clap_complete ("failed to write completion file").
    for args in [&["policy", "schema"][..], &["completion", "bash"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_axle"))
            .args(args)
            .current_dir(root())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run axle");
        // The reader goes away before reading anything.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait for axle");
        let stderr = text(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: stderr: {stderr}");
        assert!(
            out.status.success(),
            "{args:?}: status {:?}, stderr: {stderr}",
            out.status
        );
    }
}

#[test]
fn completion_scripts_cover_the_commands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = axle(&["completion", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        for word in ["submit", "logs", "simulate"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
    }
    let out = axle(&["completion", "tcsh"]);
    assert!(!out.status.success());
}

#[test]
fn policy_check_of_an_empty_directory_fails() {
    // Observed: `axle policy check` of a directory without policy files
    // said "policy OK: 0 teams, …".
    let dir = tempfile::tempdir().expect("tempdir");
    let out = axle(&["policy", "check", dir.path().to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no policy files"), "{stderr}");
    assert!(!text(&out.stdout).contains("policy OK"));
}

#[test]
fn help_names_everything_get_lists() {
    // Observed: `axle --help` described `get` as "List workloads, clusters
    // or teams", though it also lists events, hub replicas and burst.
    let out = axle(&["--help"]);
    let stdout = text(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("get "))
        .unwrap_or_else(|| panic!("no get line in {stdout}"));
    for what in ["workloads", "clusters", "teams", "events", "hub", "burst"] {
        assert!(line.contains(what), "{line}");
    }
}

#[test]
fn a_usage_error_lists_only_what_was_typed() {
    // Observed: with AXLE_HUB, AXLE_CA_FILE and AXLE_TOKEN set, a
    // mistyped `submit` printed `Usage: axle submit --team <TEAM> … --hub
    // <HUB> --ca-file <CA_FILE> --token <TOKEN> -- <CMD>...`.
    let out = Command::new(env!("CARGO_BIN_EXE_axle"))
        .args(["submit", "--gpus", "1"])
        .env("AXLE_HUB", "http://127.0.0.1:9")
        .env("AXLE_CA_FILE", "/nonexistent/ca.pem")
        .env("AXLE_TOKEN", "secret")
        .output()
        .expect("run axle");
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("--team <TEAM>"), "{stderr}");
    for flag in ["--hub", "--ca-file", "--token", "secret"] {
        assert!(!stderr.contains(flag), "{flag} in: {stderr}");
    }
}

#[test]
fn connection_flags_still_come_from_the_environment() {
    // AXLE_CA_FILE is read although clap no longer reads it: a missing file
    // is named before any request is made.
    let out = Command::new(env!("CARGO_BIN_EXE_axle"))
        .args(["get", "workloads"])
        .env("AXLE_HUB", "https://127.0.0.1:9")
        .env("AXLE_CA_FILE", "/nonexistent/axle-ca.pem")
        .output()
        .expect("run axle");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("/nonexistent/axle-ca.pem"), "{stderr}");
}

#[test]
fn simulate_notes_invented_teams_once() {
    // Observed: `axle simulate` printed one `note:` per team of the trace
    // missing from the policy (15 on Philly).
    let out = axle(&[
        "simulate",
        "--policy",
        "deploy/examples/policy",
        "--trace",
        "hub/sim/testdata/traces/philly-sample.csv",
        "--capacity",
        "64",
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let notes = stderr.lines().filter(|l| l.starts_with("note: ")).count();
    assert_eq!(notes, 1, "{stderr}");
    assert!(
        stderr.contains("teams of the trace are not in the policy"),
        "{stderr}"
    );
}
