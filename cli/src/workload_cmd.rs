//! `axle submit`, `describe workload`, `cancel` and `logs`: one workload at a
//! time through the hub's HTTP API.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axle_proto::api::{LogTimeView, SubmitRequest, WorkloadView};
use clap::{Args, Subcommand};

use crate::args::{
    ObjectFormat, env_map, parse_duration_s, parse_env, parse_gpus, parse_workload_id, to_text,
};
use crate::client::Client;
use crate::describe::describe_workload;
use crate::exit::{Failed, UsageError};

/// `submit --wait` and `logs -f` poll at this period: fast enough to feel
/// live, 2 requests/s per terminal is nothing for the hub.
const POLL_PERIOD: Duration = Duration::from_millis(500);

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

#[derive(Args)]
pub struct LogsArgs {
    #[arg(value_parser = parse_workload_id)]
    id: u64,
    /// Keep printing new output until the workload finishes; then exit
    /// with its outcome (0 if it succeeded, 1 if not).
    #[arg(short = 'f', long)]
    follow: bool,
    /// Only the last N lines of the output so far (then follow, with -f).
    #[arg(long, value_name = "N")]
    tail: Option<usize>,
    /// Only output that reached the hub in this last stretch (90s, 10m, 2h).
    #[arg(long, value_name = "DURATION", value_parser = crate::args::parse_duration_s)]
    since: Option<u64>,
    /// Start every line with the time it reached the hub (RFC 3339, to the
    /// second).
    #[arg(long)]
    timestamps: bool,
}

/// Puts the arrival time in front of every line of a log read piece by
/// piece.
#[derive(Debug)]
pub struct Stamper {
    at_line_start: bool,
    /// The time of the latest index entry passed.
    last_ms: Option<u64>,
}

impl Default for Stamper {
    fn default() -> Stamper {
        Stamper::new()
    }
}

impl Stamper {
    pub fn new() -> Stamper {
        Stamper {
            at_line_start: true,
            last_ms: None,
        }
    }

    /// `data` as read from `offset`, with `times` (offset, at_ms) ascending.
    pub fn stamp(&mut self, data: &str, offset: u64, times: &[LogTimeView]) -> String {
        let mut out = String::with_capacity(data.len() + data.len() / 8);
        let mut next = times.iter().peekable();
        for (i, c) in data.char_indices() {
            let at = offset + i as u64;
            while let Some(t) = next.peek() {
                if t.offset > at {
                    break;
                }
                self.last_ms = Some(t.at_ms);
                next.next();
            }
            if self.at_line_start {
                match self.last_ms {
                    Some(ms) => {
                        out.push_str(&crate::table::fmt_timestamp(ms).replacen(' ', "T", 1));
                        out.push(' ');
                    }
                    None => out.push_str("-                        "),
                }
            }
            out.push(c);
            self.at_line_start = c == '\n';
        }
        out
    }
}

/// The last `n` lines of `text` (a trailing newline ends the last line).
pub fn last_lines(text: &str, n: usize) -> &str {
    if n == 0 {
        return "";
    }
    let body = text.strip_suffix('\n').unwrap_or(text);
    match body.rmatch_indices('\n').nth(n - 1) {
        Some((i, _)) => &text[i + 1..],
        None => text,
    }
}

fn write_out(data: &str) -> std::io::Result<bool> {
    let mut out = std::io::stdout().lock();
    match out.write_all(data.as_bytes()).and_then(|()| out.flush()) {
        // `axle logs 3 | head`: the reader left; that is not a failure.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        other => other.map(|()| true),
    }
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
        None => print!("{}", describe_workload(&w, now_ms())),
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

pub async fn logs(client: &Client, a: LogsArgs) -> anyhow::Result<ExitCode> {
    let mut offset = 0;
    let mut since_ms = a
        .since
        .map(|s| now_ms().saturating_sub(s.saturating_mul(1000)));
    let mut stamper = a.timestamps.then(Stamper::new);
    // With --tail, what exists now is gathered first and only its end shown.
    let mut held: Option<String> = a.tail.map(|_| String::new());
    loop {
        let chunk = client
            .logs(a.id, offset, since_ms.take(), a.timestamps)
            .await?;
        let offset_read = chunk.offset;
        let data = match &mut stamper {
            Some(s) => s.stamp(&chunk.data, chunk.offset, &chunk.times),
            None => chunk.data.clone(),
        };
        if !data.is_empty() {
            match &mut held {
                Some(buf) => buf.push_str(&data),
                None => {
                    if !write_out(&data)? {
                        return Ok(ExitCode::SUCCESS);
                    }
                }
            }
        }
        let advanced = chunk.next_offset > offset_read;
        offset = chunk.next_offset;
        if advanced {
            // More may already be there: read on without waiting.
            continue;
        }
        if let (Some(buf), Some(n)) = (held.take(), a.tail)
            && !write_out(last_lines(&buf, n))?
        {
            return Ok(ExitCode::SUCCESS);
        }
        if !a.follow {
            return Ok(ExitCode::SUCCESS);
        }
        if chunk.complete {
            let w = client.workload(a.id).await?;
            return Ok(if w.state == "Succeeded" {
                ExitCode::SUCCESS
            } else {
                eprintln!("workload {} ended {}", a.id, w.state);
                ExitCode::from(crate::exit::REFUSED_OR_FAILED)
            });
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests::{running_workload, workload};

    #[test]
    fn every_line_gets_the_time_its_bytes_reached_the_hub() {
        let t = |offset, at_ms| LogTimeView { offset, at_ms };
        let mut s = Stamper::new();
        // Bytes 0.. arrived at :20, bytes 4.. ("two" on) at :21.
        let out = s.stamp(
            "one\ntwo\nthr",
            0,
            &[t(0, 1_700_000_000_000), t(4, 1_700_000_001_000)],
        );
        assert_eq!(
            out,
            "2023-11-14T22:13:20.000Z one\n2023-11-14T22:13:21.000Z two\n2023-11-14T22:13:21.000Z thr"
        );
        // The next piece continues the line: no stamp in the middle of it.
        let out = s.stamp(
            "ee\nfour\n",
            11,
            &[t(6, 1_700_000_001_000), t(14, 1_700_000_002_000)],
        );
        assert_eq!(out, "ee\n2023-11-14T22:13:22.000Z four\n");
    }

    #[test]
    fn last_lines_of_a_log() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(last_lines("a\nb\nc", 2), "b\nc");
        assert_eq!(last_lines("a\nb\n", 5), "a\nb\n");
        assert_eq!(last_lines("a\nb\n", 0), "");
        assert_eq!(last_lines("", 3), "");
    }

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
