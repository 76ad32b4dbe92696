//! `axle submit`, `describe workload` and `cancel`: one workload at a
//! time through the hub's HTTP API.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axle_proto::api::{SubmitRequest, WorkloadView};
use clap::{Args, Subcommand};

use crate::args::{
    ObjectFormat, env_map, parse_duration_s, parse_env, parse_gpus, parse_workload_id, to_text,
};
use crate::client::Client;
use crate::describe::describe_workload;
use crate::exit::{Failed, UsageError};

/// `submit --wait` and `logs -f` poll at this period: fast enough to feel
/// live, 2 requests/s per terminal is nothing for the hub.
pub const POLL_PERIOD: Duration = Duration::from_millis(500);

#[derive(Args)]
pub struct SubmitArgs {
    /// Team that owns the workload (its quota is charged).
    #[arg(long, env = "AXLE_TEAM")]
    team: String,
    /// GPUs per replica: a fraction (0.25, 0.5) or a whole number.
    #[arg(long, value_parser = parse_gpus)]
    gpus: f64,
    /// GPU model, e.g. H100 (default: any).
    #[arg(long)]
    gpu_model: Option<String>,
    /// Priority class (default: the policy's default class).
    #[arg(long)]
    priority: Option<String>,
    /// Gang size: replicas that start together or not at all.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    gang: Option<u32>,
    /// Workload name (default: w-<id>).
    #[arg(long)]
    name: Option<String>,
    /// Allowed region; repeat for several (default: any).
    #[arg(long = "region", value_name = "REGION")]
    regions: Vec<String>,
    /// Allow a gang to spread across clusters.
    #[arg(long)]
    spread: bool,
    /// Allow bursting to cloud capacity.
    #[arg(long)]
    burst: bool,
    /// Environment variable for the command; repeatable.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Kill the workload after this long: 90s, 45m, 1h30m, 2d.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_s)]
    max_runtime: Option<u64>,
    /// The workload saves its progress and resumes after preemption: it gets
    /// the checkpoint signal and its grace period to save into
    /// $AXLE_CHECKPOINT_DIR, which every run of it sees (default: its
    /// priority class decides).
    #[arg(long, conflicts_with = "no_checkpoint")]
    checkpointable: bool,
    /// The workload does not checkpoint, whatever its priority class says.
    #[arg(long)]
    no_checkpoint: bool,
    /// How often it saves on its own, e.g. 10m (default: the class's).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_s)]
    checkpoint_interval: Option<u64>,
    /// Signal sent at preemption, e.g. SIGUSR1 (default: the class's, SIGTERM).
    #[arg(long, value_name = "SIGNAL")]
    checkpoint_signal: Option<String>,
    /// Container image, for clusters that run Kubernetes Jobs (default: the
    /// cluster's defaultImage).
    #[arg(long)]
    image: Option<String>,
    /// Key that makes a retried submit return the first workload (default:
    /// generated from the process id and time).
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Wait until the workload runs (or finishes), showing its progress.
    #[arg(long)]
    wait: bool,
    /// Print the workload as JSON or YAML instead of a sentence.
    #[arg(short = 'o', long = "output", value_enum)]
    output: Option<ObjectFormat>,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Subcommand)]
pub enum DescribeCommand {
    /// One workload: placement, times, exit code and state history.
    #[command(alias = "wl")]
    Workload {
        #[arg(value_parser = parse_workload_id)]
        id: u64,
        /// Print the raw view as JSON or YAML instead.
        #[arg(short = 'o', long = "output", value_enum)]
        output: Option<ObjectFormat>,
    },
}

#[derive(Args)]
pub struct CancelArgs {
    #[arg(value_parser = parse_workload_id)]
    id: u64,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A key unique to this call: pid + wall-clock nanoseconds + a per-process
/// sequence number (two calls within one clock tick still differ).
pub fn default_idempotency_key(prefix: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{nanos}-{seq}", std::process::id())
}

pub fn is_terminal(state: &str) -> bool {
    matches!(state, "Succeeded" | "Failed" | "Cancelled")
}

/// One line on where a workload stands, for progress output.
pub fn status_line(w: &WorkloadView) -> String {
    let on = w
        .cluster
        .as_deref()
        .map(|c| format!(" on {c}"))
        .unwrap_or_default();
    match w.state.as_str() {
        "Pending" | "Preempting" => match &w.pending_reason {
            Some(r) => format!("{}: {r}", w.state),
            None => w.state.clone(),
        },
        "Placed" | "Running" | "Cancelling" | "Cancelled" => format!("{}{on}", w.state),
        "Succeeded" | "Failed" => match w.exit_code {
            Some(c) => format!("{}{on} (exit code {c})", w.state),
            None => format!("{}{on}", w.state),
        },
        other => other.to_string(),
    }
}

/// The sentence `axle submit` prints.
pub fn submitted_line(w: &WorkloadView, created: bool, key: &str) -> String {
    if !created {
        return format!(
            "workload {} was already submitted with idempotency key {key} ({})",
            w.id,
            status_line(w)
        );
    }
    match (&w.state[..], &w.pending_reason) {
        ("Pending", None) => format!("workload {} submitted", w.id),
        _ => format!("workload {} submitted ({})", w.id, status_line(w)),
    }
}

fn build_request(a: &SubmitArgs, key: String) -> Result<SubmitRequest, UsageError> {
    Ok(SubmitRequest {
        team: a.team.clone(),
        name: a.name.clone(),
        command: a.command.clone(),
        gpus: a.gpus,
        gpu_model: a.gpu_model.clone(),
        priority: a.priority.clone(),
        gang: a.gang,
        regions: a.regions.clone(),
        allow_spread: a.spread,
        burst_allowed: a.burst,
        idempotency_key: Some(key),
        env: env_map(&a.env).map_err(UsageError)?,
        max_runtime_s: a.max_runtime,
        checkpointable: if a.checkpointable {
            Some(true)
        } else if a.no_checkpoint {
            Some(false)
        } else {
            None
        },
        checkpoint_interval_s: a.checkpoint_interval,
        checkpoint_signal: a.checkpoint_signal.clone(),
        image: a.image.clone(),
    })
}

pub async fn submit(client: &Client, a: SubmitArgs) -> anyhow::Result<ExitCode> {
    let key = a
        .idempotency_key
        .clone()
        .unwrap_or_else(|| default_idempotency_key("axle"));
    let req = build_request(&a, key.clone())?;
    let submitted = client.submit(&req).await?;
    let mut view = submitted.view;
    if a.output.is_none() {
        println!("{}", submitted_line(&view, submitted.created, &key));
    }
    if a.wait {
        view = wait_until_started(client, view).await?;
    }
    if let Some(format) = a.output {
        print!("{}", to_text(&view, format)?);
    } else if a.wait {
        println!("workload {} {}", view.id, status_line(&view));
    }
    if a.wait && matches!(view.state.as_str(), "Failed" | "Cancelled") {
        return Err(Failed(format!("workload {} {}", view.id, status_line(&view))).into());
    }
    Ok(ExitCode::SUCCESS)
}

/// Polls until the workload is Running or finished, printing each change of
/// status (with the time waited) to stderr.
async fn wait_until_started(client: &Client, mut w: WorkloadView) -> anyhow::Result<WorkloadView> {
    let start = tokio::time::Instant::now();
    let mut last = status_line(&w);
    eprintln!("  [0.0s] {last}");
    while !(w.state == "Running" || is_terminal(&w.state)) {
        tokio::time::sleep(POLL_PERIOD).await;
        w = client.workload(w.id).await?;
        let line = status_line(&w);
        if line != last {
            eprintln!("  [{:.1}s] {line}", start.elapsed().as_secs_f64());
            last = line;
        }
    }
    Ok(w)
}

pub async fn describe(client: &Client, cmd: DescribeCommand) -> anyhow::Result<ExitCode> {
    let DescribeCommand::Workload { id, output } = cmd;
    let w = client.workload(id).await?;
    match output {
        Some(format) => print!("{}", to_text(&w, format)?),
        // Arguments, node names and messages are shown, never obeyed by
        // the terminal (escape sequences, bidi overrides).
        None => print!(
            "{}",
            axle_policy::text::for_terminal(&describe_workload(&w, now_ms()))
        ),
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn cancel(client: &Client, a: CancelArgs) -> anyhow::Result<ExitCode> {
    let w = client.cancel(a.id).await?;
    if w.state == "Running" {
        println!("workload {} is being stopped (still Running)", w.id);
    } else {
        println!("workload {} {}", w.id, w.state);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests::{running_workload, workload};

    #[test]
    fn submit_sentences() {
        let mut w = workload(42);
        assert_eq!(submitted_line(&w, true, "k"), "workload 42 submitted");
        w.pending_reason = Some("team vision is at its limit of 16 H100".into());
        assert_eq!(
            submitted_line(&w, true, "k"),
            "workload 42 submitted (Pending: team vision is at its limit of 16 H100)"
        );
        let r = running_workload(43);
        assert_eq!(
            submitted_line(&r, true, "k"),
            "workload 43 submitted (Running on gpu-east-1)"
        );
        assert_eq!(
            submitted_line(&r, false, "k1"),
            "workload 43 was already submitted with idempotency key k1 (Running on gpu-east-1)"
        );
        let mut f = r.clone();
        f.state = "Failed".into();
        f.exit_code = Some(2);
        assert_eq!(status_line(&f), "Failed on gpu-east-1 (exit code 2)");
    }

    #[test]
    fn generated_keys_differ() {
        let a = default_idempotency_key("axle");
        let b = default_idempotency_key("axle");
        assert!(a.starts_with(&format!("axle-{}-", std::process::id())));
        assert_ne!(a, b);
    }
}
