//! The local driver's supervisor of one workload: runs each replica of an
//! assignment as a child process behind the shim (see `shim.rs`), in its own
//! process group, pipes its output to the workload log, enforces stops,
//! failures and the max runtime, and reports what happened to the agent.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use axle_proto::pb;
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::DriverCtx;
use super::shim::{SHIM_ARG, SHIM_EXEC_FAILED_EXIT_CODE, SHIM_READY_MARKER, SIGNAL_EXIT_BASE};
use crate::driver::{StopCause, StopRequest};
use crate::event::Event;
use crate::logs::{LOG_PIPE_CHANNEL_CAPACITY, pump, write_log};

/// Exit code reported when a replica could not be started at all (the shell's
/// "command not found / cannot execute" convention).
pub const SPAWN_FAILED_EXIT_CODE: i32 = SHIM_EXEC_FAILED_EXIT_CODE;
/// How long to wait for the output pipes to drain once every replica has
/// exited. A background process that kept a pipe open was killed with its
/// group, so the pipes close at once; this only bounds the pathological case.
pub const LOG_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a shim may take to install its signal handler and say so: it
/// is a fresh process doing nothing else (milliseconds); the bound only
/// matters on a machine so overloaded that waiting longer would not help.
pub const SHIM_READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Stand-in deadline for timers that are off.
const FAR_FUTURE: Duration = Duration::from_secs(365 * 24 * 3600);
/// Longest a lease renewal may wait to be written to one shim.
const RENEW_WRITE_TIMEOUT: Duration = Duration::from_millis(50);
/// Highest signal number Linux uses, to recognise `128 + signal` exit codes.
const MAX_SIGNAL: i32 = 64;

pub use crate::logs::log_path;

pub use crate::logs::work_dir;

/// `<data_dir>/checkpoints/<workload_id>`: the same for every epoch of a
/// workload on this spoke, so a run resumes where the last one saved.
pub fn checkpoint_dir(data_dir: &Path, workload_id: u64) -> PathBuf {
    data_dir.join("checkpoints").join(workload_id.to_string())
}

/// The signal that asks a workload to stop: its checkpoint signal when it
/// saves its progress, else SIGTERM. SIGKILL follows after the grace period.
pub fn stop_signal(assign: &pb::Assign) -> Signal {
    assign
        .checkpoint_signal
        .parse::<Signal>()
        .ok()
        .filter(|s| *s != Signal::SIGKILL && *s != Signal::SIGSTOP)
        .unwrap_or(Signal::SIGTERM)
}

/// `AXLE_GPU_FRACTION` for a share below a whole GPU: 250 → `0.25`.
fn gpu_fraction(milli: u32) -> String {
    let digits = format!("{milli:03}");
    format!("0.{}", digits.trim_end_matches('0'))
}

/// The environment of one replica: the assignment's env, then Axle's
/// variables (which win, so a workload cannot lie about its own GPUs).
pub fn replica_env(
    assign: &pb::Assign,
    index: usize,
    replica: &pb::Replica,
    checkpoints: Option<&Path>,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = assign
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let devices: Vec<String> = replica.gpus.iter().map(|g| g.index.to_string()).collect();
    env.insert("CUDA_VISIBLE_DEVICES".into(), devices.join(","));
    match replica.gpus.as_slice() {
        [only] if only.milli < super::ledger::MILLI_PER_GPU => {
            env.insert("AXLE_GPU_FRACTION".into(), gpu_fraction(only.milli));
        }
        _ => {
            env.remove("AXLE_GPU_FRACTION");
        }
    }
    env.insert("AXLE_WORKLOAD_ID".into(), assign.workload_id.to_string());
    env.insert("AXLE_EPOCH".into(), assign.epoch.to_string());
    env.insert("AXLE_REPLICA".into(), index.to_string());
    env.insert("AXLE_REPLICAS".into(), assign.replicas.len().to_string());
    env.insert("AXLE_NODE".into(), replica.node.clone());
    env.insert(
        "AXLE_RESTART_COUNT".into(),
        assign.restart_count.to_string(),
    );
    match checkpoints {
        Some(dir) => {
            env.insert(
                "AXLE_CHECKPOINT_DIR".into(),
                dir.to_string_lossy().into_owned(),
            );
        }
        None => {
            env.remove("AXLE_CHECKPOINT_DIR");
        }
    }
    env
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Checks that the command can be executed before anything starts, so a typo
/// is a clear FAILED instead of STARTED followed by exit 127.
fn check_command(
    command: &[String],
    env: &HashMap<String, String>,
    work_dir: &Path,
) -> Result<(), String> {
    let Some(program) = command.first().filter(|p| !p.is_empty()) else {
        return Err("the command is empty".into());
    };
    if program.contains('/') {
        // `join` keeps an absolute path as it is; a relative one is relative
        // to the working directory, as for the child.
        return if is_executable(&work_dir.join(program)) {
            Ok(())
        } else {
            Err(format!(
                "command {program:?} does not exist or is not executable"
            ))
        };
    }
    let path_var = env
        .get("PATH")
        .cloned()
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_default();
    let found = path_var.split(':').any(|dir| {
        let dir = if dir.is_empty() { "." } else { dir };
        is_executable(&work_dir.join(dir).join(program))
    });
    if found {
        Ok(())
    } else {
        Err(format!("command {program:?} not found on PATH"))
    }
}

/// Sends `sig` to a replica's process group; a group that is already gone is fine.
fn signal_group(pgid: i32, sig: Signal) {
    // pgid 0 or 1 would mean our own group or init's: never a replica's.
    if pgid <= 1 {
        return;
    }
    match killpg(Pid::from_raw(pgid), sig) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => {
            tracing::warn!(pgid, signal = %sig, error = %e, "cannot signal replica process group")
        }
    }
}

/// Exit code as reported to the hub: the code, or `-signal` when the replica's
/// shim itself was killed.
fn reported_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => -sig,
        (None, None) => -1,
    }
}

fn describe_exit(index: usize, code: i32) -> String {
    if code < 0 {
        format!("replica {index} was killed by signal {}", -code)
    } else if code > SIGNAL_EXIT_BASE && code <= SIGNAL_EXIT_BASE + MAX_SIGNAL {
        format!(
            "replica {index} exited with code {code} (128+{}: the command was likely killed by signal {})",
            code - SIGNAL_EXIT_BASE,
            code - SIGNAL_EXIT_BASE
        )
    } else {
        format!("replica {index} exited with code {code}")
    }
}

fn status(
    assign: &pb::Assign,
    phase: pb::Phase,
    exit_code: i32,
    message: String,
) -> pb::WorkloadStatus {
    pb::WorkloadStatus {
        workload_id: assign.workload_id,
        epoch: assign.epoch,
        phase: phase as i32,
        exit_code,
        message,
    }
}

/// Runs one assignment to its end and reports `Started` and `Finished`.
pub async fn supervise(
    ctx: DriverCtx,
    assign: pb::Assign,
    grace: Duration,
    stop_rx: watch::Receiver<Option<StopRequest>>,
) {
    let status = run_workload(&ctx, &assign, grace, stop_rx).await;
    tracing::info!(
        workload_id = status.workload_id,
        epoch = status.epoch,
        phase = ?pb::Phase::try_from(status.phase).unwrap_or(pb::Phase::Unspecified),
        exit_code = status.exit_code,
        message = %status.message,
        "workload finished"
    );
    // The agent outlives every supervisor; if it is gone, nobody is left to tell.
    let _ = ctx.events.send(Event::Finished(status)).await;
}

/// How the workload is ending, decided by the first thing that happened.
struct Ending {
    phase: pb::Phase,
    message: String,
}

async fn run_workload(
    ctx: &DriverCtx,
    assign: &pb::Assign,
    grace: Duration,
    mut stop_rx: watch::Receiver<Option<StopRequest>>,
) -> pb::WorkloadStatus {
    let (workload_id, epoch) = (assign.workload_id, assign.epoch);
    let work = work_dir(&ctx.data_dir, workload_id, epoch);
    if let Err(e) = tokio::fs::create_dir_all(&work).await {
        let msg = format!("cannot create working directory {}: {e}", work.display());
        return status(assign, pb::Phase::Failed, SPAWN_FAILED_EXIT_CODE, msg);
    }
    if let Err(msg) = check_command(&assign.command, &assign.env, &work) {
        return status(assign, pb::Phase::Failed, SPAWN_FAILED_EXIT_CODE, msg);
    }
    let term = stop_signal(assign);
    let checkpoints =
        (!assign.checkpoint_signal.is_empty()).then(|| checkpoint_dir(&ctx.data_dir, workload_id));
    if let Some(dir) = &checkpoints
        && let Err(e) = tokio::fs::create_dir_all(dir).await
    {
        let msg = format!("cannot create checkpoint directory {}: {e}", dir.display());
        return status(assign, pb::Phase::Failed, SPAWN_FAILED_EXIT_CODE, msg);
    }
    let log_file_path = log_path(&ctx.data_dir, workload_id, epoch);
    let log_file = match tokio::fs::File::create(&log_file_path).await {
        Ok(f) => f,
        Err(e) => {
            let msg = format!("cannot create log file {}: {e}", log_file_path.display());
            return status(assign, pb::Phase::Failed, SPAWN_FAILED_EXIT_CODE, msg);
        }
    };
    let (log_tx, log_rx) = mpsc::channel(LOG_PIPE_CHANNEL_CAPACITY);
    let writer = tokio::spawn(write_log(
        log_file,
        log_rx,
        workload_id,
        epoch,
        ctx.events.clone(),
    ));

    let multi = assign.replicas.len() > 1;
    let mut pumps = JoinSet::new();
    let mut waits = JoinSet::new();
    // Written one byte per renewal of the lease (`lease.rs`); closing them
    // tells the shims the spoke is gone.
    let mut stdins = Vec::new();
    let lease_ttl = ctx.lease.ttl();
    // Replica index → process group of the replicas still running.
    let mut live: BTreeMap<usize, i32> = BTreeMap::new();
    let mut ending: Option<Ending> = None;
    let mut first_bad_exit: Option<i32> = None;
    let mut kill_at: Option<Instant> = None;
    let mut readiness = Vec::new();

    for (i, replica) in assign.replicas.iter().enumerate() {
        let mut cmd = tokio::process::Command::new(&ctx.shim_exe);
        cmd.arg(SHIM_ARG).arg(grace.as_secs().to_string());
        if term != Signal::SIGTERM {
            cmd.arg("--signal").arg(term.as_str());
        }
        if let Some(ttl) = lease_ttl {
            cmd.arg("--lease-ms").arg(ttl.as_millis().to_string());
        }
        cmd.arg("--")
            .args(&assign.command)
            .env_remove("AXLE_GPU_FRACTION")
            .envs(replica_env(assign, i, replica, checkpoints.as_deref()))
            .current_dir(&work)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group, so a stop reaches everything the replica started
            // and nothing else (not the spoke, not other replicas).
            .process_group(0);
        match cmd.spawn() {
            Ok(mut child) => {
                let prefix = multi.then(|| format!("[r{i}] "));
                let (ready_tx, ready_rx) = oneshot::channel();
                readiness.push(ready_rx);
                if let Some(out) = child.stdout.take() {
                    let ready = Some((SHIM_READY_MARKER, ready_tx));
                    pumps.spawn(pump(out, prefix.clone(), false, log_tx.clone(), ready));
                }
                if let Some(err) = child.stderr.take() {
                    pumps.spawn(pump(err, prefix, true, log_tx.clone(), None));
                }
                if let Some(stdin) = child.stdin.take() {
                    stdins.push(stdin);
                }
                // The shim leads its group, so its pid is the group id.
                if let Some(pgid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                    live.insert(i, pgid);
                }
                waits.spawn(async move { (i, child.wait().await) });
            }
            Err(e) => {
                first_bad_exit = Some(SPAWN_FAILED_EXIT_CODE);
                let mut message = format!("could not spawn replica {i}: {e}");
                if i > 0 {
                    message.push_str("; stopped the other replicas");
                }
                ending = Some(Ending {
                    phase: pb::Phase::Failed,
                    message,
                });
                break;
            }
        }
    }
    // The pumps hold the only senders now: the writer ends when they do.
    drop(log_tx);

    // Until a shim has its SIGTERM handler, a group SIGTERM would kill the
    // shim instead of reaching the command; so nothing is signalled (and
    // STARTED not sent) before every shim is ready or gone. A shim that dies
    // early closes its stdout, which also ends the wait.
    let ready_deadline = Instant::now() + SHIM_READY_TIMEOUT;
    for ready in readiness {
        if tokio::time::timeout_at(ready_deadline, ready)
            .await
            .is_err()
        {
            tracing::warn!(
                workload_id,
                epoch,
                "a replica's shim did not report ready in time"
            );
            break;
        }
    }
    if ending.is_none() {
        tracing::info!(
            workload_id,
            epoch,
            replicas = assign.replicas.len(),
            "workload started"
        );
        let _ = ctx.events.send(Event::Started { workload_id, epoch }).await;
    } else {
        for pgid in live.values() {
            signal_group(*pgid, term);
        }
        kill_at = Some(Instant::now() + grace);
    }

    // A run time too long for the clock to add means no deadline (the hub
    // bounds it; an older hub might not).
    let runtime_deadline = (assign.max_runtime_s > 0)
        .then(|| Instant::now().checked_add(Duration::from_secs(assign.max_runtime_s)))
        .flatten();
    let far = Instant::now() + FAR_FUTURE;
    let mut renew = tokio::time::interval(crate::lease::LEASE_RENEW_EVERY);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop_open = true;
    let mut cancelled = false;
    while !waits.is_empty() {
        tokio::select! {
            joined = waits.join_next() => {
                let Some(joined) = joined else { break };
                let (i, result) = match joined {
                    Ok(pair) => pair,
                    Err(e) => {
                        // A wait task cannot panic; if it was cancelled the
                        // replica is unobservable, so stop the rest.
                        tracing::error!(workload_id, epoch, error = %e, "lost a replica's wait task");
                        continue;
                    }
                };
                if let Some(pgid) = live.remove(&i) {
                    // Anything the command left behind in its group dies with it.
                    signal_group(pgid, Signal::SIGKILL);
                }
                let code = match result {
                    Ok(exit) => reported_code(exit),
                    Err(e) => {
                        tracing::error!(workload_id, epoch, replica = i, error = %e, "cannot wait for replica");
                        -1
                    }
                };
                if code != 0 {
                    first_bad_exit.get_or_insert(code);
                    if ending.is_none() {
                        let mut message = describe_exit(i, code);
                        if !live.is_empty() {
                            message.push_str("; stopped the other replicas");
                        }
                        ending = Some(Ending { phase: pb::Phase::Failed, message });
                        for pgid in live.values() {
                            signal_group(*pgid, term);
                        }
                        kill_at = Some(Instant::now() + grace);
                    }
                }
            }
            changed = stop_rx.changed(), if stop_open => {
                if changed.is_err() {
                    stop_open = false;
                    continue;
                }
                let Some(request) = stop_rx.borrow_and_update().clone() else { continue };
                let deadline = Instant::now() + request.grace;
                cancelled |= matches!(request.cause, StopCause::Cancelled(_));
                if ending.is_none() {
                    let message = request.cause.describe();
                    ending = Some(Ending { phase: pb::Phase::Stopped, message });
                    for pgid in live.values() {
                        signal_group(*pgid, term);
                    }
                }
                // A second request may only shorten the grace.
                kill_at = Some(kill_at.map_or(deadline, |k| k.min(deadline)));
            }
            _ = renew.tick(), if lease_ttl.is_some() => {
                // Only while the hub confirms us: once it stops, the shims
                // stop their workloads by themselves (the agent may be hung).
                // A stop under way is the supervisor's to finish.
                if ending.is_some() || ctx.lease.renewable() {
                    for stdin in &mut stdins {
                        // A shim reads at once; one that does not is hung or
                        // gone, and its write must not hold the others.
                        let _ = tokio::time::timeout(RENEW_WRITE_TIMEOUT, stdin.write_all(b".")).await;
                    }
                }
            }
            () = tokio::time::sleep_until(kill_at.unwrap_or(far)), if kill_at.is_some() => {
                for pgid in live.values() {
                    signal_group(*pgid, Signal::SIGKILL);
                }
                kill_at = None;
            }
            () = tokio::time::sleep_until(runtime_deadline.unwrap_or(far)), if runtime_deadline.is_some() && ending.is_none() => {
                let message = format!("exceeded max runtime of {} s", assign.max_runtime_s);
                tracing::info!(workload_id, epoch, "{message}");
                ending = Some(Ending { phase: pb::Phase::Failed, message });
                for pgid in live.values() {
                    signal_group(*pgid, term);
                }
                kill_at = Some(Instant::now() + grace);
            }
        }
    }

    drop(stdins);
    let drained = tokio::time::timeout(LOG_DRAIN_TIMEOUT, async {
        while pumps.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            workload_id,
            epoch,
            "output pipes still open after the workload ended; cutting its log short"
        );
        pumps.abort_all();
        while pumps.join_next().await.is_some() {}
    }
    // The writer ends once the pumps are gone, after its last chunk.
    let _ = writer.await;

    // A workload that ended (or was cancelled) will not run again: its
    // checkpoints go. One stopped otherwise (preempted, fenced, superseded,
    // the spoke shutting down) keeps them for its next run.
    let over = match &ending {
        None => true,
        Some(e) => e.phase != pb::Phase::Stopped || cancelled,
    };
    if over && let Some(dir) = &checkpoints {
        match tokio::fs::remove_dir_all(dir).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(workload_id, error = %e, "cannot remove checkpoint directory {}", dir.display())
            }
        }
    }

    match ending {
        None => status(
            assign,
            pb::Phase::Succeeded,
            0,
            if multi {
                format!("all {} replicas exited 0", assign.replicas.len())
            } else {
                "exited 0".into()
            },
        ),
        Some(Ending { phase, message }) => {
            let code = first_bad_exit.unwrap_or(if phase == pb::Phase::Failed { -1 } else { 0 });
            status(assign, phase, code, message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assign_with(replicas: Vec<pb::Replica>) -> pb::Assign {
        pb::Assign {
            workload_id: 42,
            epoch: 3,
            command: vec!["true".into()],
            env: HashMap::from([
                ("FOO".to_string(), "bar".to_string()),
                ("CUDA_VISIBLE_DEVICES".to_string(), "7".to_string()),
                ("AXLE_GPU_FRACTION".to_string(), "0.9".to_string()),
            ]),
            replicas,
            ..Default::default()
        }
    }

    fn replica(node: &str, shares: &[(u32, u32)]) -> pb::Replica {
        pb::Replica {
            node: node.into(),
            gpus: shares
                .iter()
                .map(|&(index, milli)| pb::GpuShare { index, milli })
                .collect(),
        }
    }

    #[test]
    fn whole_gpus_in_order_without_fraction() {
        let a = assign_with(vec![
            replica("n0", &[]),
            replica("n1", &[(3, 1000), (1, 1000)]),
        ]);
        let env = replica_env(&a, 1, &a.replicas[1], None);
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "3,1");
        assert!(!env.contains_key("AXLE_GPU_FRACTION"));
        assert_eq!(env["FOO"], "bar");
        assert_eq!(env["AXLE_WORKLOAD_ID"], "42");
        assert_eq!(env["AXLE_EPOCH"], "3");
        assert_eq!(env["AXLE_REPLICA"], "1");
        assert_eq!(env["AXLE_REPLICAS"], "2");
        assert_eq!(env["AXLE_NODE"], "n1");
        let env0 = replica_env(&a, 0, &a.replicas[0], None);
        assert_eq!(env0["CUDA_VISIBLE_DEVICES"], "");
    }

    #[test]
    fn single_fractional_share_sets_fraction() {
        for (milli, text) in [
            (250, "0.25"),
            (500, "0.5"),
            (125, "0.125"),
            (100, "0.1"),
            (1, "0.001"),
        ] {
            let a = assign_with(vec![replica("n0", &[(2, milli)])]);
            let env = replica_env(&a, 0, &a.replicas[0], None);
            assert_eq!(env["AXLE_GPU_FRACTION"], text);
            assert_eq!(env["CUDA_VISIBLE_DEVICES"], "2");
        }
    }

    #[test]
    fn checkpoints_and_restarts_in_the_environment_and_the_stop_signal() {
        let mut a = assign_with(vec![replica("n0", &[(0, 1000)])]);
        a.restart_count = 2;
        a.env
            .insert("AXLE_CHECKPOINT_DIR".into(), "/elsewhere".into());
        let dir = checkpoint_dir(Path::new("/data"), 42);
        assert_eq!(dir, Path::new("/data/checkpoints/42"));
        let env = replica_env(&a, 0, &a.replicas[0], Some(&dir));
        assert_eq!(env["AXLE_CHECKPOINT_DIR"], "/data/checkpoints/42");
        assert_eq!(env["AXLE_RESTART_COUNT"], "2");
        // Not checkpointable: no directory, and the request cannot fake one.
        let env = replica_env(&a, 0, &a.replicas[0], None);
        assert!(!env.contains_key("AXLE_CHECKPOINT_DIR"));
        assert_eq!(stop_signal(&a), Signal::SIGTERM);
        a.checkpoint_signal = "SIGUSR1".into();
        assert_eq!(stop_signal(&a), Signal::SIGUSR1);
        a.checkpoint_signal = "SIGKILL".into();
        assert_eq!(stop_signal(&a), Signal::SIGTERM);
    }

    #[test]
    fn command_check_finds_path_programs_and_rejects_typos() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = HashMap::new();
        assert!(check_command(&["sh".into()], &env, dir.path()).is_ok());
        assert!(check_command(&["/bin/sh".into()], &env, dir.path()).is_ok());
        let err =
            check_command(&["no-such-program-xyz".into()], &env, dir.path()).expect_err("typo");
        assert!(err.contains("not found"), "{err}");
        assert!(check_command(&[], &env, dir.path()).is_err());
        assert!(check_command(&["./missing.sh".into()], &env, dir.path()).is_err());
    }

    #[test]
    fn exit_descriptions() {
        assert_eq!(describe_exit(0, 3), "replica 0 exited with code 3");
        assert!(describe_exit(1, -9).contains("killed by signal 9"));
        assert!(describe_exit(0, 143).contains("signal 15"));
    }
}
