//! Atomic batches above one etcd txn, and fencing, against a real etcd on
//! loopback: a batch is all there or not at all even when the hub dies
//! between its parts, and a store fenced on a leader key writes nothing
//! once that key moved on.

mod common;

use axle_hub::store::{BATCH_PREFIX, Op, Recovered, Store, StoreError, Txn};
use common::{put, put_plain, value_of};

/// A batch of `n` writes, each key `rec/<i>` set to `tag`, in txns of
/// 100 ops as the applier hands them over (each within one etcd txn).
fn batch(n: usize, tag: &str) -> Vec<Txn> {
    let ops: Vec<Op> = (0..n).map(|i| put(&format!("rec/{i:04}"), tag)).collect();
    ops.chunks(100)
        .map(|c| Txn {
            compares: Vec::new(),
            success: c.to_vec(),
            failure: Vec::new(),
        })
        .collect()
}

async fn count(store: &dyn Store, prefix: &str, tag: &str) -> usize {
    store
        .range(prefix)
        .await
        .unwrap()
        .iter()
        .filter(|kv| kv.value == tag.as_bytes())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_above_one_txn_commits_whole_and_leaves_no_intent() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("/axle-batch/").await;
    // 1,000 ops: eight txns' worth by count.
    store.txn_atomic(batch(1_000, "a")).await.unwrap();
    assert_eq!(count(&store, "rec/", "a").await, 1_000);
    // Large values: several txns by bytes although few ops.
    let big = vec![Txn {
        compares: Vec::new(),
        success: (0..12)
            .map(|i| Op::put(format!("big/{i}"), vec![b'x'; 300 * 1024]))
            .collect(),
        failure: Vec::new(),
    }];
    store.txn_atomic(big).await.unwrap();
    assert_eq!(store.range("big/").await.unwrap().len(), 12);
    assert!(store.range(BATCH_PREFIX).await.unwrap().is_empty());
    assert_eq!(store.recover_batches().await.unwrap(), Recovered::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_commit_marker_leaves_the_old_state() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("/axle-batch/").await;
    store.txn_atomic(batch(300, "old")).await.unwrap();
    // 300 ops are 3 parts: fail after 2 part writes, before the marker.
    store.crash_after_writes(Some(2));
    let err = store.txn_atomic(batch(300, "new")).await.unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    store.crash_after_writes(None);
    // Nothing of the failed batch is visible, before or after recovery.
    assert_eq!(count(&store, "rec/", "old").await, 300);
    assert!(!store.range(BATCH_PREFIX).await.unwrap().is_empty());
    // A new leader (a fresh connection) recovers.
    let next = etcd.store("/axle-batch/").await;
    let done = next.recover_batches().await.unwrap();
    assert_eq!(
        done,
        Recovered {
            replayed: 0,
            dropped: 1
        }
    );
    assert_eq!(count(&next, "rec/", "old").await, 300);
    assert!(next.range(BATCH_PREFIX).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_commit_marker_is_replayed_whole() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("/axle-batch/").await;
    store.txn_atomic(batch(300, "old")).await.unwrap();
    // 3 parts + the marker + 1 of 3 applied chunks, then the hub dies.
    store.crash_after_writes(Some(5));
    assert!(store.txn_atomic(batch(300, "new")).await.is_err());
    store.crash_after_writes(None);
    // The first chunk landed; the rest did not.
    assert_eq!(
        count(&store, "rec/", "new").await,
        axle_hub::store::MAX_OPS_PER_CHUNK
    );
    let next = etcd.store("/axle-batch/").await;
    let done = next.recover_batches().await.unwrap();
    assert_eq!(
        done,
        Recovered {
            replayed: 1,
            dropped: 0
        }
    );
    assert_eq!(count(&next, "rec/", "new").await, 300);
    assert!(next.range(BATCH_PREFIX).await.unwrap().is_empty());
    // Recovering again changes nothing.
    assert_eq!(next.recover_batches().await.unwrap(), Recovered::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_store_writes_nothing_once_the_leader_key_moved() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("/axle-fence/").await;
    let other = etcd.store("/axle-fence/").await;
    let term = put_plain(&store, "leader", "hub-a").await;
    store.fence("leader", term);
    put_plain(&store, "k", "1").await;
    assert_eq!(value_of(&store, "k").await.as_deref(), Some("1"));
    // Another replica takes the leader key: the first is deposed.
    put_plain(&other, "leader", "hub-b").await;
    let plain = store.txn(Txn::new().and_then(put("k", "2"))).await;
    assert!(
        matches!(plain, Err(StoreError::Fenced { rev }) if rev == term),
        "{plain:?}"
    );
    // Not even the failure branch of a txn runs.
    let failing = Txn::new()
        .when("k", axle_hub::store::Compare::Absent)
        .or_else(put("k", "3"));
    assert!(matches!(
        store.txn(failing).await,
        Err(StoreError::Fenced { .. })
    ));
    // Nor a batch above one txn: its first part is refused.
    assert!(matches!(
        store.txn_atomic(batch(300, "x")).await,
        Err(StoreError::Fenced { .. })
    ));
    assert_eq!(value_of(&other, "k").await.as_deref(), Some("1"));
    assert!(other.range("rec/").await.unwrap().is_empty());
    assert!(other.range(BATCH_PREFIX).await.unwrap().is_empty());
    // Unfenced (a follower again), it reads and writes plainly.
    store.unfence();
    put_plain(&store, "k", "4").await;
    assert_eq!(value_of(&other, "k").await.as_deref(), Some("4"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_leader_commits_batches_of_every_size() {
    // Observed: a leader's batch of 128 ops (64 submits) was refused by etcd with
    // "too many operations in txn request": the fence's outer txn takes one op of the
    // nested txn's limit.
    let etcd = common::Etcd::start().await;
    let store = etcd.store("/axle-fenced-batch/").await;
    let term = put_plain(&store, "leader", "hub-a").await;
    store.fence("leader", term);
    for n in [1, 127, 128, 129, 300, 1_000] {
        let tag = format!("n{n}");
        store
            .txn_atomic(batch(n, &tag))
            .await
            .unwrap_or_else(|e| panic!("{n} ops: {e}"));
        assert_eq!(count(&store, "rec/", &tag).await, n);
    }
    assert!(store.range(BATCH_PREFIX).await.unwrap().is_empty());
}
