//! `axle bench soak`: a steady mixed load for a chosen duration — fractions,
//! whole GPUs, gangs, failures, workloads that print 1 MB, and low-priority
//! batch work that others preempt — with the hub's resources printed every
//! interval (RSS, open file descriptors, store size, disk use and files of
//! the data dir, queue depth), so a run shows whether they stay flat.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axle_proto::api::SubmitRequest;
use clap::Args;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::args::parse_duration_s;
use crate::client::Client;
use crate::exit::Failed;
use crate::workload_cmd::default_idempotency_key;

/// Most concurrent submitters (each one HTTP connection).
const MAX_SUBMITTERS: usize = 256;
/// Highest offered rate: far above what one hub on this machine runs.
const MAX_RATE: f64 = 10_000.0;

#[derive(Args)]
pub struct BenchSoakArgs {
    /// Offered load, workloads per second (open loop).
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// How long to run.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_s, default_value = "30m")]
    duration: u64,
    /// How often to print the figures.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_s, default_value = "1m")]
    every: u64,
    /// The hub's process id, for RSS and open file descriptors (Linux /proc).
    #[arg(long)]
    hub_pid: Option<u32>,
    /// The hub's data directory: store size, disk use and file count.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Concurrent submitters.
    #[arg(long, default_value_t = 64)]
    submitters: usize,
}

/// The mix, per 100 workloads: (count, team, class, GPUs, gang, command).
const MIX: &[(u32, &str, &str, f64, u32, &str)] = &[
    (70, "vision", "development", 0.25, 1, "true"),
    (10, "nlp", "training", 1.0, 1, "sleep 0.2"),
    (5, "nlp", "training", 1.0, 2, "true"),
    (7, "vision", "development", 0.25, 1, "exit 3"),
    (
        2,
        "research",
        "development",
        0.25,
        1,
        "head -c 1000000 /dev/zero | tr '\\0' x | fold -w 99",
    ),
    (5, "vision", "development", 0.5, 1, "sleep 1"),
    (1, "research", "batch", 1.0, 1, "sleep 2"),
];

fn request(k: u64) -> SubmitRequest {
    let slot = (k % 100) as u32;
    let mut acc = 0;
    let &(_, team, class, gpus, gang, cmd) = MIX
        .iter()
        .find(|(n, ..)| {
            acc += n;
            slot < acc
        })
        .unwrap_or(&MIX[0]);
    SubmitRequest {
        team: team.into(),
        name: Some(format!("soak-{k}")),
        command: vec!["sh".into(), "-c".into(), cmd.into()],
        gpus,
        priority: Some(class.into()),
        gang: (gang > 1).then_some(gang),
        idempotency_key: Some(default_idempotency_key("soak")),
        ..SubmitRequest::default()
    }
}

/// One line of `/proc/<pid>/status`, in kB.
fn proc_kb(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn open_fds(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// Bytes and files under `dir` (allocated size, like `du`).
fn disk_use(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut bytes = 0;
    let mut files = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                files += 1;
                bytes += m.blocks() * 512;
            }
        }
    }
    (bytes, files)
}

fn store_bytes(dir: &Path) -> u64 {
    ["axle.redb", "state.redb"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

pub async fn run(client: &Client, a: BenchSoakArgs) -> anyhow::Result<std::process::ExitCode> {
    if !(a.rate > 0.0 && a.rate <= MAX_RATE) {
        return Err(Failed(format!("--rate must be in (0, {MAX_RATE}], got {}", a.rate)).into());
    }
    if a.submitters == 0 || a.submitters > MAX_SUBMITTERS {
        return Err(Failed(format!("--submitters must be 1..={MAX_SUBMITTERS}")).into());
    }
    let start = Instant::now();
    let end = start + Duration::from_secs(a.duration);
    let next = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = JoinSet::new();
    for _ in 0..a.submitters {
        let (client, next, accepted, refused, stop) = (
            client.clone(),
            next.clone(),
            accepted.clone(),
            refused.clone(),
            stop.clone(),
        );
        let rate = a.rate;
        set.spawn(async move {
            let mut last_error = None;
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let at = start + Duration::from_secs_f64(k as f64 / rate);
                if at >= end || stop.load(Ordering::Relaxed) {
                    break;
                }
                tokio::time::sleep_until(at).await;
                match client.submit(&request(k)).await {
                    Ok(_) => {
                        accepted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        last_error = Some(e.to_string());
                    }
                }
            }
            last_error
        });
    }
    eprintln!(
        "soak: {} workloads/s for {} s, figures every {} s",
        a.rate, a.duration, a.every
    );
    println!("minute accepted refused rate_per_s queued running rss_mb fds store_mb disk_mb files");
    let mut tick = tokio::time::interval(Duration::from_secs(a.every.max(1)));
    tick.tick().await;
    let mut last_accepted = 0;
    let mut last_at = start;
    let mut rows = Vec::new();
    loop {
        let done = tokio::select! {
            _ = tick.tick() => Instant::now() >= end,
            () = tokio::time::sleep_until(end) => true,
        };
        let now = Instant::now();
        let acc = accepted.load(Ordering::Relaxed);
        let rate =
            (acc - last_accepted) as f64 / now.duration_since(last_at).as_secs_f64().max(1e-9);
        (last_accepted, last_at) = (acc, now);
        let (queued, running) = match client.teams().await {
            Ok(teams) => (
                teams.iter().map(|t| t.pending).sum::<u64>(),
                teams.iter().map(|t| t.running).sum::<u64>(),
            ),
            Err(_) => (0, 0),
        };
        let rss = a
            .hub_pid
            .and_then(|p| proc_kb(p, "VmRSS:"))
            .map_or(0.0, |kb| kb as f64 / 1024.0);
        let fds = a.hub_pid.and_then(open_fds).unwrap_or(0);
        let (store, (disk, files)) = match &a.data_dir {
            Some(d) => (store_bytes(d), disk_use(d)),
            None => (0, (0, 0)),
        };
        let row = format!(
            "{:>6.1} {acc} {} {rate:.1} {queued} {running} {rss:.0} {fds} {:.1} {:.1} {files}",
            now.duration_since(start).as_secs_f64() / 60.0,
            refused.load(Ordering::Relaxed),
            store as f64 / 1e6,
            disk as f64 / 1e6,
        );
        println!("{row}");
        rows.push(row);
        if done {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut last_error = None;
    while let Some(r) = set.join_next().await {
        if let Ok(Some(e)) = r {
            last_error = Some(e);
        }
    }
    let refused = refused.load(Ordering::Relaxed);
    println!(
        "soak: accepted={} refused={refused} wall_s={:.0}",
        accepted.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64()
    );
    if refused > 0 {
        return Err(Failed(format!(
            "{refused} submits were refused, e.g.: {}",
            last_error.unwrap_or_default()
        ))
        .into());
    }
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_adds_up_to_a_hundred_and_every_slot_has_a_shape() {
        assert_eq!(MIX.iter().map(|m| m.0).sum::<u32>(), 100);
        let batch = (0..100).filter(|&k| request(k).priority.as_deref() == Some("batch"));
        assert_eq!(batch.count(), 1);
        let gangs = (0..100).filter(|&k| request(k).gang == Some(2)).count();
        assert_eq!(gangs, 5);
    }
}
