//! What one page of the workload list costs the hub: 100,000 stored
//! workloads (half finished with a history, half pending with a reason),
//! every page of 500 walked a few times, as `GET /api/v1/workloads` builds
//! it (`http::page_body`), for a plain client and for a gzip one.
//!
//! `cargo bench --workspace --bench list` (AXLE_BENCH_WORKLOADS sets how
//! many). Prints `key=value` lines.

mod common;

use std::time::{Duration, Instant};

use axle_hub::hub::ReadView;
use axle_hub::hub::{Clock, ListParams};
use axle_hub::lifecycle::WState;
use axle_hub::page_cache::{Encoding, PageCache, Served};
use common::{fill, record, rss_mb, start};

/// Walks over the whole list.
const WALKS: usize = 3;

fn main() {
    let n: u64 = std::env::var("AXLE_BENCH_WORKLOADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    rt.block_on(async {
        let now = Clock::system().now_ms();
        fill(dir.path(), n, |i| {
            let mut w = record(i, now - 60_000);
            if i % 2 == 0 {
                // Waiting (the cluster has no spoke): the scheduler gives
                // it a reason.
                w.state = WState::Pending;
                w.history.clear();
                w.started_at_ms = None;
                w.finished_at_ms = None;
                w.exit_code = None;
            }
            w
        })
        .await;
        let (hub, tasks, _) = start(dir.path()).await;
        // The first cycle gives the pending workloads their reasons.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let read = hub.read();
        for encoding in [Encoding::Identity, Encoding::Gzip] {
            walk(&read, encoding, n);
        }
        tasks.abort();
    });
}

/// [`WALKS`] walks of the whole list with a fresh cache: walk 1 builds
/// every page, later walks find them kept (nothing changed), as pollers of
/// a big, mostly finished hub do.
fn walk(read: &ReadView, encoding: Encoding, n: u64) {
    let pages = PageCache::new();
    let mut built: Vec<f64> = Vec::new();
    let mut kept: Vec<f64> = Vec::new();
    let mut bytes = 0usize;
    for _ in 0..WALKS {
        let mut token: Option<String> = None;
        loop {
            let q = ListParams {
                continue_token: token.take(),
                ..Default::default()
            };
            let t = Instant::now();
            let (body, served) =
                axle_hub::http::page_body(read, &q, &pages, Instant::now(), encoding)
                    .expect("page");
            let took = t.elapsed().as_secs_f64() * 1000.0;
            match served {
                Served::Kept => kept.push(took),
                Served::Built => built.push(took),
            }
            bytes += body.bytes.len();
            let json = if body.gzip {
                let mut out = Vec::new();
                std::io::Read::read_to_end(
                    &mut flate2::read::GzDecoder::new(&body.bytes[..]),
                    &mut out,
                )
                .expect("gzip");
                out
            } else {
                body.bytes.to_vec()
            };
            // The token is the page's last field; the items are not
            // decoded (that would measure serde_json, not the hub).
            let tail = String::from_utf8_lossy(&json[json.len().saturating_sub(64)..]).into_owned();
            match tail.rsplit_once("\"continue\":\"") {
                Some((_, t)) => token = Some(t.trim_end_matches(['"', '}']).to_string()),
                None => break,
            }
        }
    }
    let pct = |ms: &mut Vec<f64>, p: f64| {
        ms.sort_by(f64::total_cmp);
        ms.get(((ms.len().max(1) - 1) as f64 * p) as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let pages_n = built.len() + kept.len();
    println!(
        "encoding={encoding:?} workloads={n} pages={pages_n} page_bytes_mean={} built={} built_p50_ms={:.2} built_p99_ms={:.2} kept={} kept_p50_ms={:.3} kept_p99_ms={:.3} cache_mb={:.0} rss_mb={:.0}",
        bytes / pages_n.max(1),
        built.len(),
        pct(&mut built, 0.5),
        pct(&mut built, 0.99),
        kept.len(),
        pct(&mut kept, 0.5),
        pct(&mut kept, 0.99),
        pages.bytes() as f64 / 1e6,
        rss_mb()
    );
}
