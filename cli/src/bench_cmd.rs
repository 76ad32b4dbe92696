//! `axle bench submit`: a load generator that submits N workloads through the
//! HTTP API with bounded concurrency, waits for all of them to finish, and
//! prints throughput and submit→running latency as `key=value` lines.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axle_proto::api::{SubmitRequest, WorkloadView};
use clap::{Args, Subcommand};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::args::{parse_duration_s, parse_gpus};
use crate::client::{Client, WorkloadFilter};
use crate::exit::Failed;
use crate::workload_cmd::default_idempotency_key;

/// Most concurrent submitters: each holds one HTTP connection, and 512 stays
/// well inside the common 1024 open-file limit with room for the rest.
const MAX_CONCURRENCY: u64 = 512;
/// Most list pollers: each holds one connection, like a submitter.
const MAX_POLLERS: u64 = 256;
/// Most jobs per run: the bench keeps every view in memory, and a million
/// covers any realistic hub test while bounding that.
const MAX_JOBS: u64 = 1_000_000;
/// The wait loop polls the team's active lists at this period (the brief:
/// 200 ms). It bounds how late we notice the end, not the measured figures,
/// which come from hub timestamps.
const POLL_PERIOD: Duration = Duration::from_millis(200);
/// Progress lines on stderr: when the counts change, at most this often…
const PROGRESS_PERIOD: Duration = Duration::from_secs(1);
/// …and at least this often while nothing changes, to show it is alive.
const PROGRESS_IDLE_PERIOD: Duration = Duration::from_secs(10);

const ACTIVE_STATES: &[&str] = &["Pending", "Placed", "Running", "Preempting", "Cancelling"];
const TERMINAL_STATES: &[&str] = &["Succeeded", "Failed", "Cancelled"];

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Submit N workloads, wait for them all, print jobs/s and latency.
    Submit(BenchSubmitArgs),
    /// A steady mixed load for a duration, printing the hub's resources
    /// every minute (see scripts/soak.sh).
    Soak(crate::bench_soak::BenchSoakArgs),
}

#[derive(Args)]
pub struct BenchSubmitArgs {
    /// How many workloads to submit.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_JOBS))]
    jobs: u64,
    /// GPUs per workload (0.25, 1, …).
    #[arg(long, value_parser = parse_gpus)]
    gpus: f64,
    /// Concurrent submitters (HTTP requests in flight).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=MAX_CONCURRENCY))]
    concurrency: u64,
    /// Offered load in jobs/s: job k is submitted no earlier than k/RATE
    /// seconds after the start (open loop). 0 submits as fast as possible.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Team to submit as (default: the first team the hub lists).
    #[arg(long)]
    team: Option<String>,
    /// Priority class (default: the policy's default).
    #[arg(long)]
    priority: Option<String>,
    /// GPU model (default: any).
    #[arg(long)]
    gpu_model: Option<String>,
    /// Clients listing every workload page by page, as fast as they can,
    /// while the submits run: reads must not slow writes down.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=MAX_POLLERS))]
    pollers: u64,
    /// Items per page the pollers ask for.
    #[arg(long, default_value_t = 500)]
    poll_limit: usize,
    /// Only submit: print the acknowledged submit rate and do not wait for
    /// the jobs to run (for filling a hub, or a hub without spokes).
    #[arg(long)]
    no_wait: bool,
    /// Give up waiting for the jobs after this long.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_s, default_value = "30m")]
    timeout: u64,
    /// The program every workload runs, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "CMD")]
    command: Vec<String>,
}

/// Nearest-rank percentile (`p` in 0..=100) of an ascending slice.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Hub time the workload first became Running: the first history transition
/// into Running, else `started_at_ms`, else — a run so short that its
/// spoke reported the end before it saw the start (a Kubernetes Job can
/// complete between two observations) — the time it left Placed, when it
/// had started at the latest.
pub fn running_at_ms(w: &WorkloadView) -> Option<u64> {
    w.history
        .iter()
        .find(|t| t.to == "Running")
        .map(|t| t.at_ms)
        .or(w.started_at_ms)
        .or_else(|| {
            w.history
                .iter()
                .find(|t| t.from == "Placed" && TERMINAL_STATES.contains(&t.to.as_str()))
                .map(|t| t.at_ms)
        })
}

/// The figures of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub submitted: usize,
    pub succeeded: usize,
    pub failed: usize,
    pub cancelled: usize,
    /// An id of a job that did not succeed, for the error message.
    pub example_failure: Option<u64>,
    /// Hub time from the first submit to the last finish.
    pub wall_s: f64,
    pub client_wall_s: f64,
    pub jobs_per_s: f64,
    pub submit_p50_ms: f64,
    pub submit_p99_ms: f64,
    /// Submit→running, hub timestamps.
    pub p50_ms: f64,
    pub p99_ms: f64,
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Figures from the finished views (hub clock) and the client-side submit
/// latencies.
pub fn summarize(
    done: &[WorkloadView],
    submit_latencies_ms: &[f64],
    client_wall: Duration,
) -> Summary {
    let count = |s: &str| done.iter().filter(|w| w.state == s).count();
    let first_submit = done.iter().map(|w| w.submitted_at_ms).min().unwrap_or(0);
    let last_finish = done
        .iter()
        .filter_map(|w| w.finished_at_ms.or(w.history.last().map(|t| t.at_ms)))
        .max()
        .unwrap_or(first_submit);
    // At least 1 ms so a run faster than the hub's clock resolution still
    // yields a finite rate.
    let wall_ms = last_finish.saturating_sub(first_submit).max(1);
    let latencies = sorted(
        done.iter()
            .filter_map(|w| running_at_ms(w).map(|r| r.saturating_sub(w.submitted_at_ms) as f64))
            .collect(),
    );
    let submits = sorted(submit_latencies_ms.to_vec());
    Summary {
        submitted: done.len(),
        succeeded: count("Succeeded"),
        failed: count("Failed"),
        cancelled: count("Cancelled"),
        example_failure: done.iter().find(|w| w.state != "Succeeded").map(|w| w.id),
        wall_s: wall_ms as f64 / 1000.0,
        client_wall_s: client_wall.as_secs_f64(),
        jobs_per_s: done.len() as f64 * 1000.0 / wall_ms as f64,
        submit_p50_ms: percentile(&submits, 50.0).unwrap_or(0.0),
        submit_p99_ms: percentile(&submits, 99.0).unwrap_or(0.0),
        p50_ms: percentile(&latencies, 50.0).unwrap_or(0.0),
        p99_ms: percentile(&latencies, 99.0).unwrap_or(0.0),
    }
}

impl Summary {
    /// The stdout lines; the last is the one scripts parse.
    pub fn lines(&self) -> Vec<String> {
        vec![
            format!(
                "submitted={} succeeded={} failed={} cancelled={}",
                self.submitted, self.succeeded, self.failed, self.cancelled
            ),
            format!(
                "wall_s={:.3} client_wall_s={:.3} submit_p50_ms={:.1} submit_p99_ms={:.1}",
                self.wall_s, self.client_wall_s, self.submit_p50_ms, self.submit_p99_ms
            ),
            format!(
                "jobs_per_s={:.1} p50_ms={:.1} p99_ms={:.1}",
                self.jobs_per_s, self.p50_ms, self.p99_ms
            ),
        ]
    }
}

pub async fn run(client: &Client, cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    let a = match cmd {
        BenchCommand::Submit(a) => a,
        BenchCommand::Soak(a) => return crate::bench_soak::run(client, a).await,
    };
    let team = match &a.team {
        Some(t) => t.clone(),
        None => client
            .teams()
            .await?
            .into_iter()
            .next()
            .map(|t| t.name)
            .ok_or_else(|| Failed("the hub has no teams; pass --team".into()))?,
    };
    let template = SubmitRequest {
        team: team.clone(),
        command: a.command.clone(),
        gpus: a.gpus,
        gpu_model: a.gpu_model.clone(),
        priority: a.priority.clone(),
        ..SubmitRequest::default()
    };
    if !a.rate.is_finite() || a.rate < 0.0 {
        return Err(Failed(format!(
            "--rate must be a non-negative number of jobs/s, got {}",
            a.rate
        ))
        .into());
    }
    eprintln!(
        "bench: submitting {} jobs of {} GPU as team {team} with {} submitters{}",
        a.jobs,
        a.gpus,
        a.concurrency,
        if a.rate > 0.0 {
            format!(" at {} jobs/s", a.rate)
        } else {
            String::new()
        }
    );
    let stop_polling = Arc::new(AtomicBool::new(false));
    let polling = Polling::default();
    let mut pollers = start_pollers(
        client,
        a.pollers,
        a.poll_limit,
        &polling,
        stop_polling.clone(),
    );
    if a.pollers > 0 {
        // Steady state, not a cold start: every poller walks the whole list
        // once before the submits (and the page timings) begin.
        let warm = Instant::now();
        while polling.walked.load(Ordering::Relaxed) < a.pollers {
            if let Some(done) = pollers.try_join_next() {
                done??;
                return Err(Failed("a poller stopped during its first walk".into()).into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!(
            "bench: {} pollers walked the list once in {:.2}s; submitting",
            a.pollers,
            warm.elapsed().as_secs_f64()
        );
        polling.measuring.store(true, Ordering::Relaxed);
    }
    let start = Instant::now();
    let submitted = submit_all(client, &template, a.jobs, a.concurrency, a.rate, start).await;
    let submit_s = start.elapsed().as_secs_f64();
    stop_polling.store(true, Ordering::Relaxed);
    let polls = pollers.join_all().await;
    let (ids, submit_latencies_ms) = submitted?;
    if a.pollers > 0 {
        let mut pages = Vec::new();
        for p in polls {
            pages.extend(p?);
        }
        let pages = sorted(pages);
        println!(
            "pollers={} pages={} page_p50_ms={:.1} page_p99_ms={:.1} page_max_ms={:.1}",
            a.pollers,
            pages.len(),
            percentile(&pages, 50.0).unwrap_or(0.0),
            percentile(&pages, 99.0).unwrap_or(0.0),
            pages.last().copied().unwrap_or(0.0)
        );
    }
    if a.no_wait {
        let lat = sorted(submit_latencies_ms);
        println!(
            "submitted={} submit_s={submit_s:.3} submits_per_s={:.1} submit_p50_ms={:.1} submit_p99_ms={:.1}",
            ids.len(),
            ids.len() as f64 / submit_s.max(1e-9),
            percentile(&lat, 50.0).unwrap_or(0.0),
            percentile(&lat, 99.0).unwrap_or(0.0)
        );
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "bench: submitted {} in {submit_s:.2}s ({:.1}/s){}; waiting for them to finish",
        ids.len(),
        ids.len() as f64 / submit_s.max(1e-9),
        match client.throttled() {
            0 => String::new(),
            n => format!(", {n} calls throttled by the hub and sent again after its Retry-After"),
        }
    );
    let deadline = start + Duration::from_secs(a.timeout);
    let done = wait_all(client, &team, &ids, deadline).await?;
    let summary = summarize(&done, &submit_latencies_ms, start.elapsed());
    for line in summary.lines() {
        println!("{line}");
    }
    let bad = summary.failed + summary.cancelled;
    if bad > 0 {
        return Err(Failed(format!(
            "{bad} of {} jobs did not succeed ({} failed, {} cancelled), e.g. workload {}",
            summary.submitted,
            summary.failed,
            summary.cancelled,
            summary.example_failure.unwrap_or_default()
        ))
        .into());
    }
    Ok(ExitCode::SUCCESS)
}

/// What the pollers share with the bench: how many finished a first walk of
/// the whole list, and whether page timings count yet.
#[derive(Default, Clone)]
struct Polling {
    walked: Arc<AtomicU64>,
    measuring: Arc<AtomicBool>,
}

/// `n` tasks that walk the whole workload list page by page, over and over,
/// until `stop`; each returns its page latencies in ms, timed only while
/// `polling.measuring`.
fn start_pollers(
    client: &Client,
    n: u64,
    limit: usize,
    polling: &Polling,
    stop: Arc<AtomicBool>,
) -> JoinSet<anyhow::Result<Vec<f64>>> {
    let mut set = JoinSet::new();
    for _ in 0..n {
        let (client, stop, polling) = (client.clone(), stop.clone(), polling.clone());
        set.spawn(async move {
            let mut out = Vec::new();
            let mut token: Option<String> = None;
            let mut first_walk = true;
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                // Not decoded: the pollers measure the hub, and decoding
                // 300 KB pages would take the CPU the hub runs on.
                let (_, next) = client.workload_page_raw(limit, token.as_deref()).await?;
                if polling.measuring.load(Ordering::Relaxed) {
                    out.push(sent.elapsed().as_secs_f64() * 1000.0);
                }
                token = next;
                if token.is_none() && first_walk {
                    first_walk = false;
                    polling.walked.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(out)
        });
    }
    set
}

/// Submits `jobs` copies of `template` with `concurrency` tasks sharing one
/// client; each job gets its own idempotency key so retries are safe. The
/// first refusal stops all submitters. Returns ids and per-request latencies.
async fn submit_all(
    client: &Client,
    template: &SubmitRequest,
    jobs: u64,
    concurrency: u64,
    rate: f64,
    start: Instant,
) -> anyhow::Result<(Vec<u64>, Vec<f64>)> {
    let next = Arc::new(AtomicU64::new(0));
    let abort = Arc::new(AtomicBool::new(false));
    let mut set = JoinSet::new();
    for _ in 0..concurrency.min(jobs) {
        let (client, template) = (client.clone(), template.clone());
        let (next, abort) = (next.clone(), abort.clone());
        set.spawn(async move {
            let mut out = Vec::new();
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if abort.load(Ordering::Relaxed) || k >= jobs {
                    break;
                }
                if rate > 0.0 {
                    tokio::time::sleep_until(start + Duration::from_secs_f64(k as f64 / rate))
                        .await;
                }
                let mut req = template.clone();
                req.idempotency_key = Some(default_idempotency_key("bench"));
                let sent = Instant::now();
                match client.submit(&req).await {
                    Ok(s) => out.push((s.view.id, sent.elapsed().as_secs_f64() * 1000.0)),
                    Err(e) => {
                        abort.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
            }
            Ok(out)
        });
    }
    let mut ids = Vec::with_capacity(jobs as usize);
    let mut latencies = Vec::with_capacity(jobs as usize);
    let mut first_error = None;
    while let Some(joined) = set.join_next().await {
        match joined? {
            Ok(results) => {
                for (id, ms) in results {
                    ids.push(id);
                    latencies.push(ms);
                }
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        eprintln!("bench: stopped after {} submits", ids.len());
        return Err(e.into());
    }
    Ok((ids, latencies))
}

/// Polls the team's live lists (Pending … Cancelling) (small: only live jobs)
/// until none of `ids` is in them, then reads the terminal lists once and
/// checks every id is there (a job requeued between two list reads is caught
/// by that check and the poll goes on).
async fn wait_all(
    client: &Client,
    team: &str,
    ids: &[u64],
    deadline: Instant,
) -> anyhow::Result<Vec<WorkloadView>> {
    let ours: BTreeSet<u64> = ids.iter().copied().collect();
    let filter = |state: &str| WorkloadFilter {
        team: Some(team.to_string()),
        state: Some(state.to_string()),
        cluster: None,
    };
    let mut last_progress = Instant::now();
    let mut last_line = String::new();
    loop {
        // A job that moves between two list reads can show up in both:
        // count each id once, in the first state it was seen in.
        let mut live_ids = BTreeSet::new();
        let mut active: BTreeMap<&str, usize> = BTreeMap::new();
        for state in ACTIVE_STATES {
            let n = client
                .workloads(&filter(state))
                .await?
                .iter()
                .filter(|w| ours.contains(&w.id) && live_ids.insert(w.id))
                .count();
            active.insert(state, n);
        }
        let live = live_ids.len();
        if live == 0 {
            let mut done: BTreeMap<u64, WorkloadView> = BTreeMap::new();
            for state in TERMINAL_STATES {
                for w in client.workloads(&filter(state)).await? {
                    if ours.contains(&w.id) {
                        done.insert(w.id, w);
                    }
                }
            }
            if done.len() == ours.len() {
                return Ok(done.into_values().collect());
            }
        }
        if Instant::now() >= deadline {
            return Err(Failed(format!(
                "timed out: {live} of {} jobs still not finished",
                ours.len()
            ))
            .into());
        }
        let line = format!(
            "bench: pending={} placed={} running={} finished={}/{}",
            active["Pending"],
            active["Placed"],
            active["Running"],
            ours.len() - live,
            ours.len()
        );
        let since = last_progress.elapsed();
        if (line != last_line && since >= PROGRESS_PERIOD) || since >= PROGRESS_IDLE_PERIOD {
            eprintln!("{line}");
            last_progress = Instant::now();
            last_line = line;
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests::workload;
    use axle_proto::api::TransitionView;

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        let small = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&small, 50.0), Some(2.0));
        assert_eq!(percentile(&small, 99.0), Some(4.0));
    }

    fn finished(id: u64, submitted: u64, running: u64, finished: u64, state: &str) -> WorkloadView {
        let mut w = workload(id);
        w.state = state.into();
        w.submitted_at_ms = submitted;
        w.started_at_ms = Some(running);
        w.finished_at_ms = Some(finished);
        w.history = vec![
            TransitionView {
                at_ms: submitted + 1,
                from: "Pending".into(),
                to: "Placed".into(),
                reason: String::new(),
            },
            TransitionView {
                at_ms: running,
                from: "Placed".into(),
                to: "Running".into(),
                reason: String::new(),
            },
        ];
        w
    }

    #[test]
    fn summary_uses_hub_timestamps() {
        let done = vec![
            finished(1, 1_000, 1_010, 1_500, "Succeeded"),
            finished(2, 1_100, 1_130, 2_000, "Succeeded"),
            finished(3, 1_200, 1_220, 1_800, "Failed"),
        ];
        let s = summarize(&done, &[2.0, 4.0, 3.0], Duration::from_millis(2500));
        assert_eq!(s.submitted, 3);
        assert_eq!((s.succeeded, s.failed, s.cancelled), (2, 1, 0));
        assert_eq!(s.example_failure, Some(3));
        // 3 jobs over 1000..2000 ms of hub time.
        assert_eq!(s.wall_s, 1.0);
        assert_eq!(s.jobs_per_s, 3.0);
        // Latencies 10, 30, 20 ms.
        assert_eq!(s.p50_ms, 20.0);
        assert_eq!(s.p99_ms, 30.0);
        assert_eq!(s.submit_p99_ms, 4.0);
    }

    #[test]
    fn the_first_run_counts_after_a_preemption() {
        let mut w = finished(1, 1_000, 1_010, 1_500, "Succeeded");
        w.history.push(TransitionView {
            at_ms: 1_200,
            from: "Running".into(),
            to: "Pending".into(),
            reason: "preempted".into(),
        });
        w.history.push(TransitionView {
            at_ms: 1_300,
            from: "Placed".into(),
            to: "Running".into(),
            reason: String::new(),
        });
        w.started_at_ms = Some(1_300);
        assert_eq!(running_at_ms(&w), Some(1_010));
        w.history.clear();
        assert_eq!(running_at_ms(&w), Some(1_300));
    }

    #[test]
    fn the_last_line_is_the_parseable_figures() {
        let done = vec![finished(1, 1_000, 1_008, 1_010, "Succeeded")];
        let lines = summarize(&done, &[1.3], Duration::from_millis(40)).lines();
        assert_eq!(lines[0], "submitted=1 succeeded=1 failed=0 cancelled=0");
        assert_eq!(
            lines[1],
            "wall_s=0.010 client_wall_s=0.040 submit_p50_ms=1.3 submit_p99_ms=1.3"
        );
        let last = lines.last().unwrap();
        assert_eq!(last, "jobs_per_s=100.0 p50_ms=8.0 p99_ms=8.0");
        // Shape: exactly three key=value pairs with one-decimal numbers.
        let keys: Vec<&str> = last
            .split(' ')
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                let (_, frac) = v.split_once('.').unwrap();
                assert_eq!(frac.len(), 1, "{kv}");
                assert!(v.parse::<f64>().is_ok(), "{kv}");
                k
            })
            .collect();
        assert_eq!(keys, ["jobs_per_s", "p50_ms", "p99_ms"]);
    }

    #[test]
    fn a_run_that_ended_before_its_start_was_seen_counts_from_its_end() {
        let mut w = workload(1);
        w.state = "Succeeded".into();
        w.submitted_at_ms = 1_000;
        w.history = vec![
            TransitionView {
                at_ms: 1_001,
                from: "Pending".into(),
                to: "Placed".into(),
                reason: String::new(),
            },
            TransitionView {
                at_ms: 1_040,
                from: "Placed".into(),
                to: "Succeeded".into(),
                reason: String::new(),
            },
        ];
        assert_eq!(running_at_ms(&w), Some(1_040));
        let s = summarize(&[w], &[], Duration::from_millis(50));
        assert_eq!(s.p50_ms, 40.0);
    }

    #[test]
    fn an_instant_run_still_has_a_finite_rate() {
        let done = vec![finished(1, 1_000, 1_000, 1_000, "Succeeded")];
        let s = summarize(&done, &[], Duration::ZERO);
        assert!(s.jobs_per_s.is_finite());
        assert_eq!(s.submit_p99_ms, 0.0);
    }
}
