//! Checkpoint-aware preemption end to end: a checkpointable workload that
//! borrows the only GPU is preempted when the GPU's owners want it back. It
//! gets its checkpoint signal (SIGUSR1 here) and its grace period, saves its
//! progress into `AXLE_CHECKPOINT_DIR`, and its next run — with the same
//! directory and `AXLE_RESTART_COUNT=1` — resumes from there: every step of
//! its work is done exactly once. `describe` shows the preemption, who
//! caused it and the work lost; the spoke removes the directory at the end.

use std::collections::BTreeMap;
use std::time::Duration;

use axle_e2e::{Env, request, sh, wait_until};

/// Steps of work the checkpointed workload does in all, 0.1 s each.
const STEPS: u32 = 40;

/// A shell workload that resumes from `$AXLE_CHECKPOINT_DIR/progress`, logs
/// every step it does to `log`, and on SIGUSR1 saves the last finished step
/// and exits.
fn resumable(log: &std::path::Path) -> String {
    let log = log.display();
    format!(
        r#"dir="$AXLE_CHECKPOINT_DIR"
i=$(cat "$dir/progress" 2>/dev/null || echo 0)
echo "run restart=$AXLE_RESTART_COUNT from=$i dir=$dir" >> {log}
trap 'echo $i > "$dir/progress"; echo "saved $i" >> {log}; exit 143' USR1
while [ "$i" -lt {STEPS} ]; do
  i=$((i+1))
  echo "step $i" >> {log}
  sleep 0.1
done
echo "done $i" >> {log}"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpointed_workload_resumes_after_preemption_and_does_its_work_once() {
    let env = Env::start(
        &["common", "checkpoint"],
        &[("solo", "eu-west", &["1xH100:80GB"])],
    )
    .await;
    let api = env.api();
    let log = env.path("work.log");

    let mut job = request("borrowers", 1.0, sh(&resumable(&log)));
    job.name = Some("resumable".into());
    job.priority = Some("training".into());
    job.checkpointable = Some(true);
    job.checkpoint_interval_s = Some(600);
    job.checkpoint_signal = Some("SIGUSR1".into());
    let job = api.submit_ok(&job).await;

    // Let it do some of its work.
    let steps = |text: &str| text.lines().filter(|l| l.starts_with("step ")).count();
    wait_until(Duration::from_secs(30), "five steps of work", || {
        let log = log.clone();
        async move {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if steps(&text) >= 5 {
                Ok(())
            } else {
                Err(format!("{} steps", steps(&text)))
            }
        }
    })
    .await;

    // The owners take their guaranteed GPU back.
    let mut owner = request("owners", 1.0, sh("sleep 1"));
    owner.name = Some("owner".into());
    owner.priority = Some("training".into());
    let owner = api.submit_ok(&owner).await;

    let all = api
        .wait_all_finished(&[job.id, owner.id], Duration::from_secs(90))
        .await;
    let w = all.iter().find(|w| w.id == job.id).expect("the workload");
    assert_eq!(w.state, "Succeeded", "{w:#?}");
    assert_eq!(w.preemptions, 1, "{w:#?}");
    assert!(w.checkpointable, "{w:#?}");

    // Two runs: the first from zero, the second resuming where it saved,
    // with the same directory; every step done exactly once.
    let text = std::fs::read_to_string(&log).expect("work log");
    let runs: Vec<&str> = text.lines().filter(|l| l.starts_with("run ")).collect();
    assert_eq!(runs.len(), 2, "{text}");
    assert!(runs[0].starts_with("run restart=0 from=0 dir="), "{text}");
    let saved: Vec<u32> = text
        .lines()
        .filter_map(|l| l.strip_prefix("saved "))
        .map(|n| n.parse().expect("a step number"))
        .collect();
    assert_eq!(saved.len(), 1, "the preempted run saved once: {text}");
    assert!(saved[0] >= 5 && saved[0] < STEPS, "saved mid-way: {text}");
    assert!(
        runs[1].starts_with(&format!("run restart=1 from={} dir=", saved[0])),
        "the second run resumes from the checkpoint: {text}"
    );
    let dir_of = |run: &str| run.split(" dir=").nth(1).unwrap_or_default().to_string();
    assert_eq!(
        dir_of(runs[0]),
        dir_of(runs[1]),
        "same checkpoint dir: {text}"
    );
    assert!(!dir_of(runs[0]).is_empty(), "{text}");
    let mut done: BTreeMap<u32, u32> = BTreeMap::new();
    for n in text.lines().filter_map(|l| l.strip_prefix("step ")) {
        *done.entry(n.parse().expect("a step number")).or_default() += 1;
    }
    let want: BTreeMap<u32, u32> = (1..=STEPS).map(|i| (i, 1)).collect();
    assert_eq!(done, want, "every step exactly once: {text}");
    assert!(text.contains(&format!("done {STEPS}")), "{text}");

    // The hub says who preempted it and what it lost.
    assert_eq!(w.preemption_log.len(), 1, "{w:#?}");
    let p = &w.preemption_log[0];
    assert_eq!(p.by_workload, owner.id);
    assert_eq!(p.by_team, "owners");
    assert_eq!(p.by_priority, "training");
    assert!(p.reason.contains("reclaims its guarantee"), "{p:?}");
    assert!(
        p.lost_gpu_hours > 0.0 && p.lost_gpu_hours < 1.0,
        "lost work is the run since its start (no periodic save yet): {p:?}"
    );
    let out = axle_e2e::axle_cli(
        &env.hub.http_url(),
        &["describe", "workload", &job.id.to_string()],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("Checkpoints:"), "{}", out.stdout);
    assert!(
        out.stdout
            .contains(&format!("by workload {} (training, team owners)", owner.id)),
        "{}",
        out.stdout
    );

    // The run is over: its checkpoints are gone from the spoke.
    let ckpt = std::path::PathBuf::from(dir_of(runs[0]));
    wait_until(
        Duration::from_secs(10),
        "the checkpoint dir to be removed",
        || {
            let ckpt = ckpt.clone();
            async move {
                if ckpt.exists() {
                    Err(format!("{} still exists", ckpt.display()))
                } else {
                    Ok(())
                }
            }
        },
    )
    .await;
}
