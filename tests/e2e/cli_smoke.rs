//! The `axle` CLI against a real hub: submit (a fraction), get, describe,
//! logs and cancel succeed with exit code 0; a refused submit exits 1 and an
//! unreachable hub exits 3, each with a message saying why. Its spoke
//! names no region: the cluster's policy document gives it.

use std::time::Duration;

use axle_e2e::{CliOut, Env, axle_cli, free_port};
use axle_proto::api::WorkloadView;

fn ok(what: &str, out: &CliOut) {
    assert_eq!(out.code, 0, "{what} failed: {out:#?}");
}

/// Runs a submit (`axle <args>`) and returns the id it printed
/// ("workload N …").
async fn submit_id(hub: &str, what: &str, args: &[&str]) -> u64 {
    let out = axle_cli(hub, args).await;
    ok(what, &out);
    out.stdout
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no id in {:?}", out.stdout))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_submits_lists_describes_prints_logs_and_cancels() {
    // The spoke is started without `--region` (an empty region here): its
    // Cluster document says eu-west. Observed: such a spoke sent "local"
    // and was refused ("start the spoke with --region eu-west or without
    // --region"), so the hub never became Ready.
    let env = Env::start(&["common", "api"], &[("lab", "", &["8xH100:80GB"])]).await;
    let api = env.api();
    let hub = env.hub.http_url();
    // Logs written to files carry no ANSI colour codes.
    for (who, log) in [("hub", env.hub.log()), ("spoke", env.spokes[0].log())] {
        assert!(!log.contains('\x1b'), "{who} log has ANSI codes:\n{log}");
    }
    let clusters = api.clusters().await;
    let lab = clusters
        .iter()
        .find(|c| c.name == "lab")
        .expect("cluster lab");
    assert_eq!(
        (lab.state.as_str(), lab.region.as_str()),
        ("Ready", "eu-west")
    );

    // submit a fractional workload, as JSON.
    let out = axle_cli(
        &hub,
        &[
            "submit",
            "--team",
            "vision",
            "--gpus",
            "0.5",
            "--name",
            "hello",
            "-o",
            "json",
            "--",
            "sh",
            "-c",
            "echo hello-from-axle $AXLE_GPU_FRACTION",
        ],
    )
    .await;
    ok("submit", &out);
    let w: WorkloadView = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("submit -o json printed no workload ({e}): {out:#?}"));
    assert_eq!(
        (w.team.as_str(), w.name.as_str(), w.gpus),
        ("vision", "hello", 0.5)
    );
    let id = w.id;
    api.wait_state(id, "Succeeded", Duration::from_secs(30))
        .await;

    // get workloads -o json
    let out = axle_cli(&hub, &["get", "workloads", "-o", "json"]).await;
    ok("get workloads", &out);
    let list: Vec<WorkloadView> = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("get -o json is not a workload list ({e}): {out:#?}"));
    assert!(
        list.iter().any(|x| x.id == id && x.state == "Succeeded"),
        "{list:#?}"
    );

    // -o name and --no-headers, for scripts.
    let out = axle_cli(&hub, &["get", "workloads", "-o", "name"]).await;
    ok("get -o name", &out);
    assert!(
        out.stdout.lines().any(|l| l == format!("workload/{id}")),
        "{out:#?}"
    );
    let out = axle_cli(&hub, &["get", "workloads", "--no-headers"]).await;
    ok("get --no-headers", &out);
    assert!(!out.stdout.contains("STATE"), "{out:#?}");
    assert!(
        out.stdout.lines().any(|l| l.starts_with(&id.to_string())),
        "{out:#?}"
    );

    // describe workload
    let out = axle_cli(&hub, &["describe", "workload", &id.to_string()]).await;
    ok("describe", &out);
    for needle in [
        id.to_string().as_str(),
        "hello",
        "vision",
        "Succeeded",
        "lab",
    ] {
        assert!(
            out.stdout.contains(needle),
            "describe lacks {needle:?}:\n{}",
            out.stdout
        );
    }

    // get events: the workload's own, as a table and as JSON.
    let out = axle_cli(&hub, &["get", "events", "--workload", &id.to_string()]).await;
    ok("get events", &out);
    let kinds: Vec<&str> = out
        .stdout
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(
        kinds,
        ["submitted", "placed", "started", "succeeded"],
        "{}",
        out.stdout
    );
    assert!(out.stdout.starts_with("TIME"), "{}", out.stdout);
    let out = axle_cli(&hub, &["get", "events", "--tail", "1", "-o", "json"]).await;
    ok("get events -o json", &out);
    let events: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).expect("events json");
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0]["at"].is_string(), "RFC 3339 twin: {events:?}");
    let out = axle_cli(&hub, &["get", "events", "--state", "Running"]).await;
    assert_eq!(out.code, 2, "--state does not apply to events: {out:#?}");

    // logs
    let out = axle_cli(&hub, &["logs", &id.to_string()]).await;
    ok("logs", &out);
    assert!(
        out.stdout.contains("hello-from-axle 0.5"),
        "logs should hold the workload's output:\n{}",
        out.stdout
    );
    // --timestamps: every line starts with when it reached the hub.
    let out = axle_cli(&hub, &["logs", "--timestamps", &id.to_string()]).await;
    ok("logs --timestamps", &out);
    let line = out
        .stdout
        .lines()
        .find(|l| l.contains("hello-from-axle"))
        .unwrap_or_else(|| panic!("{out:#?}"));
    let (stamp, rest) = line.split_once(' ').expect("a stamp, then the line");
    assert!(
        stamp.starts_with("20") && stamp.ends_with('Z') && stamp.contains('T'),
        "{line}"
    );
    assert_eq!(rest, "hello-from-axle 0.5");
    let out = axle_cli(&hub, &["logs", "--since", "1h", &id.to_string()]).await;
    ok("logs --since", &out);
    assert!(out.stdout.contains("hello-from-axle 0.5"), "{out:#?}");

    // stderr: marked by the hub, and on the CLI's own stderr (observed
    // before: both streams printed to stdout, unmarked).
    let both = submit_id(
        &hub,
        "submit a workload printing to both streams",
        &[
            "submit",
            "--team",
            "vision",
            "--gpus",
            "1",
            "--",
            "sh",
            "-c",
            "echo to-out; echo to-err >&2; sleep 0.3; echo out-again",
        ],
    )
    .await;
    api.wait_all_finished(&[both], Duration::from_secs(30))
        .await;
    let view = api.logs(both, 0).await;
    let marked: Vec<&str> = view
        .stderr
        .iter()
        .map(|[a, b]| &view.data[*a as usize..*b as usize])
        .collect();
    assert_eq!(marked, ["to-err\n"], "{view:#?}");
    let out = axle_cli(&hub, &["logs", &both.to_string()]).await;
    ok("logs of both streams", &out);
    assert_eq!(out.stdout, "to-out\nout-again\n", "{out:#?}");
    assert_eq!(out.stderr, "to-err\n", "{out:#?}");

    // --tail, and -f ending with the workload's outcome.
    let failing = submit_id(
        &hub,
        "submit a failing workload",
        &[
            "submit",
            "--team",
            "vision",
            "--gpus",
            "1",
            "--",
            "sh",
            "-c",
            "printf 'one\\ntwo\\nthree\\n'; exit 3",
        ],
    )
    .await;
    // --tail takes the last lines of what exists when it starts: wait for
    // all three (a tail started before any output follows everything).
    api.wait_state(failing, "Failed", Duration::from_secs(30))
        .await;
    let out = axle_cli(&hub, &["logs", "-f", "--tail", "2", &failing.to_string()]).await;
    assert_eq!(out.code, 1, "logs -f of a failed workload: {out:#?}");
    assert_eq!(out.stdout, "two\nthree\n", "{out:#?}");
    assert!(out.stderr.contains("Failed"), "{out:#?}");
    let out = axle_cli(&hub, &["logs", "-f", &id.to_string()]).await;
    assert_eq!(out.code, 0, "logs -f of a succeeded workload: {out:#?}");

    // cancel a running sleep
    let sleeper = submit_id(
        &hub,
        "submit sleep",
        &[
            "submit", "--team", "vision", "--gpus", "1", "--", "sleep", "60",
        ],
    )
    .await;
    api.wait_state(sleeper, "Running", Duration::from_secs(30))
        .await;
    let out = axle_cli(&hub, &["cancel", &sleeper.to_string()]).await;
    ok("cancel", &out);
    assert!(out.stdout.contains(&sleeper.to_string()), "{out:#?}");
    api.wait_state(sleeper, "Cancelled", Duration::from_secs(30))
        .await;
    let out = axle_cli(
        &hub,
        &["describe", "workload", &sleeper.to_string(), "-o", "json"],
    )
    .await;
    ok("describe -o json", &out);
    let w: WorkloadView = serde_json::from_str(&out.stdout).expect("workload JSON");
    assert_eq!(w.state, "Cancelled");
    assert!(
        w.history.iter().any(|h| h.reason.contains("cancelled")),
        "{:#?}",
        w.history
    );

    // A refused submit exits 1 and says why; nothing is stored.
    let before = api.workloads().await.len();
    let out = axle_cli(
        &hub,
        &["submit", "--team", "nobody", "--gpus", "1", "--", "true"],
    )
    .await;
    assert_eq!(out.code, 1, "refused submit: {out:#?}");
    assert!(out.stderr.contains("unknown team"), "{out:#?}");
    assert_eq!(api.workloads().await.len(), before);

    // An unreachable hub exits 3.
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let out = axle_cli(&nowhere, &["get", "workloads"]).await;
    assert_eq!(out.code, 3, "unreachable hub: {out:#?}");
    assert!(out.stderr.contains("error"), "{out:#?}");
    let out = axle_cli(
        &nowhere,
        &["submit", "--team", "vision", "--gpus", "1", "--", "true"],
    )
    .await;
    assert_eq!(out.code, 3, "submit to an unreachable hub: {out:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_waits_out_the_hubs_throttling() {
    // Observed: `axle bench submit --jobs 2000 … --rate 300` stopped after
    // ~80–200 submits with "dev made more than 200 calls in a burst (at
    // most 50 a second on average); retry in 1 s": the client did not
    // honour 429 + Retry-After. Here the hub allows 5 calls a second with a
    // burst of 5, and the bench's 30 submits plus its polling all get
    // through.
    // Anonymous callers (`--auth none`) are not rate-limited: a platform
    // admin with an API token is.
    let dir = axle_e2e::temp_dir("axle-e2e-throttle");
    let fixture = |f: &str| {
        std::fs::read_to_string(format!("{}/fixtures/{f}", env!("CARGO_MANIFEST_DIR")))
            .expect("fixture")
    };
    let settings = fixture("common/settings.yaml") + "  platformAdmins: [admin]\n";
    let policy = axle_e2e::TempPolicy::new(&[
        ("classes.yaml", &fixture("common/classes.yaml")),
        ("settings.yaml", &settings),
        ("cluster.yaml", &fixture("api/cluster.yaml")),
        ("teams.yaml", &fixture("api/teams.yaml")),
    ]);
    let out = std::process::Command::new(axle_e2e::bin("axle-hub"))
        .args(["create-token", "--user", "admin", "--print-only"])
        .output()
        .expect("axle-hub create-token");
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &token).expect("write token");
    let hub = axle_e2e::HubProc::start_with(
        policy.path(),
        &dir.path().join("hub"),
        axle_e2e::Ports::free(),
        vec![
            "--auth".into(),
            "tokens".into(),
            "--bootstrap-token-file".into(),
            token_file.display().to_string(),
            "--bootstrap-user".into(),
            "admin".into(),
            "--rate-per-user".into(),
            "5".into(),
            "--rate-burst-per-user".into(),
            "5".into(),
        ],
    );
    let _spoke = axle_e2e::SpokeProc::start(
        &hub.grpc_url(),
        axle_e2e::SpokeSpec::new(
            "lab",
            "eu-west",
            &["8xH100:80GB"],
            &dir.path().join("spoke"),
        ),
    );
    let url = hub.http_url();
    axle_e2e::wait_until(Duration::from_secs(30), "cluster lab Ready", || async {
        let out = axle_cli(&url, &["--token", &token, "get", "clusters", "-o", "json"]).await;
        let ready = serde_json::from_str::<Vec<axle_proto::api::ClusterView>>(&out.stdout)
            .is_ok_and(|c| c.iter().any(|c| c.name == "lab" && c.state == "Ready"));
        if ready {
            Ok(())
        } else {
            Err(format!("{out:?}"))
        }
    })
    .await;
    let out = axle_cli(
        &hub.http_url(),
        &[
            "--token", &token, "bench", "submit", "--jobs", "30", "--gpus", "1", "--team",
            "vision", "--rate", "300", "--", "true",
        ],
    )
    .await;
    ok("bench under throttling", &out);
    assert!(out.stdout.contains("jobs_per_s="), "{out:#?}");
    assert!(
        out.stderr.contains("throttled by the hub and sent again"),
        "the hub throttled nothing, so the test proves nothing: {out:#?}"
    );
}
