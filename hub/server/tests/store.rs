//! Tests of the embedded store (`RedbStore`) beyond the shared contract (`store_contract.rs`): batches past the txn limit, durability across reopen and `kill -9`, group commit.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use axle_hub::store::{Compare, Op, RedbStore, Store, StoreError, Txn};
use common::{put, put_plain, value_of};
use tempfile::TempDir;

/// Env var that turns the `crash_child` test into the child process of `kill9_loses_no_acked_write`.
const CRASH_CHILD_ENV: &str = "STORE_CRASH_CHILD";

/// Acknowledged writes the crash test waits for before killing the child: enough to span many
/// group commits, few enough to take about a second.
const CRASH_ACKS_BEFORE_KILL: usize = 400;

/// Longest wait for a lease-driven deletion to show: generous, so a loaded machine does not fail
/// the test; deletions normally show within a few ms of the TTL.
const LEASE_DEADLINE: Duration = Duration::from_secs(5);

/// Temp dirs on the real disk (the target dir), not a tmpfs, so fsync costs what it costs.
fn temp_dir() -> TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

fn db_path(dir: &TempDir) -> PathBuf {
    dir.path().join("state.redb")
}

#[tokio::test]
async fn an_atomic_group_beyond_the_txn_limit_is_all_or_nothing() {
    // Observed: "one store txn per batch" was one per 128 operations, each
    // its own unit: a crash could keep part of a batch.
    let dir = temp_dir();
    let store = RedbStore::open(&db_path(&dir)).unwrap();
    let group: Vec<Txn> = (0..3)
        .map(|t| Txn {
            compares: Vec::new(),
            success: (0..100)
                .map(|i| put(&format!("a/{t}/{i:03}"), "v"))
                .collect(),
            failure: Vec::new(),
        })
        .collect();
    let results = store.txn_atomic(group).await.unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(store.range("a/").await.unwrap().len(), 300);
    // One bad txn (over the op limit) and nothing of the group is written.
    let bad = vec![
        Txn::new().and_then(put("b/ok", "v")),
        Txn {
            compares: Vec::new(),
            success: (0..200).map(|i| put(&format!("b/{i}"), "v")).collect(),
            failure: Vec::new(),
        },
    ];
    assert!(matches!(
        store.txn_atomic(bad).await,
        Err(StoreError::InvalidRequest(_))
    ));
    assert!(store.range("b/").await.unwrap().is_empty());
    drop(store);
    let store = RedbStore::open(&db_path(&dir)).unwrap();
    assert_eq!(store.range("a/").await.unwrap().len(), 300, "durable");
}

#[tokio::test]
async fn reopen_keeps_keys_revisions_and_leases() {
    let dir = temp_dir();
    let path = db_path(&dir);
    let mut expected = BTreeMap::new();
    let lease;
    {
        let store = RedbStore::open(&path).unwrap();
        for i in 0..100 {
            let key = format!("jobs/{i:03}");
            let rev = put_plain(&*store, &key, &format!("v{i}")).await;
            expected.insert(key, rev);
        }
        store
            .txn(Txn::new().and_then(Op::delete("jobs/050")))
            .await
            .unwrap();
        expected.remove("jobs/050");
        lease = store.lease_grant(300).await.unwrap();
        store
            .txn(Txn::new().and_then(Op::put_with_lease("live/x", b"1".to_vec(), lease)))
            .await
            .unwrap();
    }
    let store = RedbStore::open(&path).unwrap();
    assert_eq!(store.rev().await.unwrap(), 102);
    let got: BTreeMap<String, u64> = store
        .range("jobs/")
        .await
        .unwrap()
        .into_iter()
        .map(|kv| (kv.key, kv.mod_rev))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(value_of(&*store, "jobs/007").await.as_deref(), Some("v7"));
    // The next write continues the revision sequence; lease ids are not reused.
    assert_eq!(put_plain(&*store, "after", "x").await, 103);
    assert!(store.lease_grant(1000).await.unwrap() > lease);
    // The lease survived the restart with a fresh TTL, and still expires.
    assert!(store.get("live/x").await.unwrap().is_some());
    let deadline = Instant::now() + LEASE_DEADLINE;
    while store.get("live/x").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "reopened lease never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn open_without_runtime_and_second_open_fails_cleanly() {
    let dir = temp_dir();
    let store = RedbStore::open(&db_path(&dir)).unwrap();
    // The file is locked by the first handle: a second open is an error, not a panic.
    let second = RedbStore::open(&db_path(&dir));
    assert!(
        matches!(second, Err(StoreError::Io { .. })),
        "{:?}",
        second.err()
    );
    drop(store);
    assert!(
        RedbStore::open(&db_path(&dir)).is_ok(),
        "drop releases the file"
    );
}

/// Group commit: 2,000 concurrent txns from 64 tasks need far fewer than 2,000 fsyncs.
/// Also prints durable txns/s, sequential vs concurrent (no timing assertions).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_batches_concurrent_txns() {
    const SEQUENTIAL_TXNS: usize = 200;
    const CONCURRENT_TXNS: usize = 2_000;
    const TASKS: usize = 64;
    let dir = temp_dir();
    let store = RedbStore::open(&db_path(&dir)).unwrap();

    let started = Instant::now();
    for i in 0..SEQUENTIAL_TXNS {
        put_plain(&*store, &format!("seq/{i}"), "x").await;
    }
    let sequential_per_s = SEQUENTIAL_TXNS as f64 / started.elapsed().as_secs_f64();
    let sequential_commits = store.commits();
    assert_eq!(
        sequential_commits, SEQUENTIAL_TXNS as u64,
        "one commit per lone txn"
    );

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..TASKS {
        let store = store.clone();
        tasks.spawn(async move {
            for i in (task..CONCURRENT_TXNS).step_by(TASKS) {
                let key = format!("gc/{i:04}");
                let result = store
                    .txn(
                        Txn::new()
                            .when(&key, Compare::Absent)
                            .and_then(put(&key, "x")),
                    )
                    .await
                    .unwrap();
                assert!(result.succeeded);
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.unwrap();
    }
    let concurrent_per_s = CONCURRENT_TXNS as f64 / started.elapsed().as_secs_f64();
    let commits = store.commits() - sequential_commits;
    println!(
        "store throughput: sequential {sequential_per_s:.0} durable txns/s; \
         {TASKS} tasks {concurrent_per_s:.0} durable txns/s in {commits} commits \
         ({:.1} txns per commit)",
        CONCURRENT_TXNS as f64 / commits as f64
    );
    assert_eq!(store.range("gc/").await.unwrap().len(), CONCURRENT_TXNS);
    assert!(
        commits <= (CONCURRENT_TXNS / 8) as u64,
        "{commits} commits for {CONCURRENT_TXNS} concurrent txns: group commit is not batching"
    );
    assert_eq!(
        store.rev().await.unwrap(),
        (SEQUENTIAL_TXNS + CONCURRENT_TXNS) as u64
    );
}

/// `kill -9` while writing: every write the child saw acknowledged survives.
#[test]
fn kill9_loses_no_acked_write() {
    let dir = temp_dir();
    let path = db_path(&dir);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "crash_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            // A line cut short by the kill was never fully acknowledged.
            if line.ends_with('\n') && lines_tx.send(line.trim_end().to_owned()).is_err() {
                break;
            }
            line.clear();
        }
    });

    let mut acked = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.len() < CRASH_ACKS_BEFORE_KILL {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines_rx.recv_timeout(left) {
            Ok(line) => acked.extend(line.strip_prefix("ACK ").map(str::to_owned)),
            Err(e) => {
                let _ = child.kill();
                panic!(
                    "child stopped acknowledging after {} acks: {e}",
                    acked.len()
                );
            }
        }
    }
    child.kill().unwrap(); // SIGKILL: no destructor, no flush, no clean shutdown.
    child.wait().unwrap();
    reader.join().unwrap();
    // Acks written before the kill are acknowledged writes too.
    acked.extend(
        lines_rx
            .try_iter()
            .filter_map(|l| l.strip_prefix("ACK ").map(str::to_owned)),
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = RedbStore::open(&path).unwrap();
        for key in &acked {
            assert_eq!(
                value_of(&*store, key).await.as_deref(),
                Some(key.as_str()),
                "acknowledged key {key} lost after kill -9"
            );
        }
        assert!(store.rev().await.unwrap() >= acked.len() as u64);
    });
    println!("kill -9: all {} acknowledged writes survived", acked.len());
}

/// The child side of `kill9_loses_no_acked_write`; does nothing unless `STORE_CRASH_CHILD` is set.
#[test]
#[ignore = "helper process of kill9_loses_no_acked_write"]
fn crash_child() {
    /// Concurrent writers in the child, so kills land mid group commit.
    const WRITERS: usize = 8;
    /// The child stops on its own after this long if nobody kills it.
    const MAX_RUN: Duration = Duration::from_secs(60);
    let Some(path) = std::env::var_os(CRASH_CHILD_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let store = RedbStore::open(Path::new(&path)).unwrap();
        let stop = Instant::now() + MAX_RUN;
        let mut tasks = tokio::task::JoinSet::new();
        for writer in 0..WRITERS {
            let store = store.clone();
            tasks.spawn(async move {
                let mut i = 0u64;
                while Instant::now() < stop {
                    let key = format!("crash/{writer}/{i}");
                    let result = store
                        .txn(
                            Txn::new()
                                .when(&key, Compare::Absent)
                                .and_then(put(&key, &key)),
                        )
                        .await
                        .unwrap();
                    assert!(result.succeeded);
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ACK {key}").unwrap();
                    out.flush().unwrap();
                    i += 1;
                }
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined.unwrap();
        }
    });
}
