//! Start-up time of a hub with many finished workloads stored, before and
//! after retention deletes them, and how fast retention deletes.
//!
//! `cargo bench --workspace --bench restore` (AXLE_BENCH_FINISHED sets how
//! many, default 1,000,000). Prints `key=value` lines.

mod common;

use std::time::{Duration, Instant};

use axle_hub::hub::Clock;
use common::{fill, record, rss_mb, start};

fn main() {
    let n: u64 = std::env::var("AXLE_BENCH_FINISHED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let db = dir.path().join(axle_hub::store::DB_FILE_NAME);
    rt.block_on(async {
        // Finished 30 days ago: all past a one-week window.
        let now = Clock::system().now_ms();
        let finished_at = now - 30 * 24 * 3_600_000;
        let t = Instant::now();
        fill(dir.path(), n, |i| record(i, finished_at)).await;
        let size = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
        println!(
            "finished_stored={n} fill_s={:.1} store_mb={:.0}",
            t.elapsed().as_secs_f64(),
            size as f64 / 1e6
        );

        let (hub, tasks, took) = start(dir.path()).await;
        println!(
            "startup_before_retention_ms={} rss_mb={:.0} workloads_in_memory={}",
            took.as_millis(),
            rss_mb(),
            hub.read().workloads.len()
        );
        let t = Instant::now();
        while !hub.read().workloads.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "retention_deleted={n} retention_s={secs:.1} deleted_per_s={:.0}",
            n as f64 / secs.max(1e-9)
        );
        tasks.abort();
        drop(hub);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (hub, tasks, took) = start(dir.path()).await;
        let size = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
        println!(
            "startup_after_retention_ms={} workloads_in_memory={} store_mb={:.0}",
            took.as_millis(),
            hub.read().workloads.len(),
            size as f64 / 1e6
        );
        tasks.abort();
    });
}
