//! The `Store` contract, one suite for both backends: every test below runs
//! once on the embedded `RedbStore` and once on `EtcdStore` against a real
//! single-member etcd on loopback (Debian `etcd-server`, started by the
//! test and killed after it). Revisions are checked relative to the
//! store's revision when the test starts: etcd begins at 1, redb at 0.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axle_hub::store::{
    Compare, KeyValue, MAX_KEY_BYTES, Op, RedbStore, Store, StoreError, Txn, WatchEvent, get_json,
    put_json, range_json,
};
use common::{put, put_plain, value_of};
use serde::{Deserialize, Serialize};

/// Longest wait for a watch event or a lease-driven deletion: etcd's
/// lessor checks expiry every 500 ms, and a loaded machine is slow.
const DEADLINE: Duration = Duration::from_secs(10);

/// A store under test, with what keeps it alive.
struct Backend {
    store: Arc<dyn Store>,
    /// A TTL short enough for tests: etcd's leases are whole seconds, and
    /// it refuses TTLs below its minimum (1.5 s with default timings).
    short_ttl_ms: u64,
    _keep: Box<dyn std::any::Any + Send>,
}

async fn redb() -> Backend {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let store = RedbStore::open(&dir.path().join("state.redb")).expect("open");
    Backend {
        store,
        short_ttl_ms: 300,
        _keep: Box::new(dir),
    }
}

async fn etcd() -> Backend {
    let etcd = common::Etcd::start().await;
    let store = Arc::new(etcd.store("/axle-contract/").await);
    Backend {
        store,
        short_ttl_ms: 2_000,
        _keep: Box::new(etcd),
    }
}

macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod on_redb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::redb().await).await;
                }
            )*
        }
        mod on_etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::etcd().await).await;
                }
            )*
        }
    };
}

contract!(
    cas_on_absent_present_mod_rev_version_and_value,
    range_is_sorted_and_bounded_by_prefix_and_delete_works,
    paginated_and_tail_ranges_stay_inside_the_prefix,
    an_atomic_group_is_all_or_nothing,
    txns_in_one_call_apply_in_order,
    watch_delivers_prefix_events_in_commit_order,
    leases_expire_and_delete_their_keys,
    keepalive_extends_and_revoke_deletes,
    overwriting_a_leased_key_detaches_it,
    limits_reject_bad_requests_without_writing,
    json_helpers_round_trip,
    ranges_read_a_past_revision_page_by_page,
    watch_from_a_revision_replays_then_follows,
    compaction_forgets_older_revisions,
    a_range_larger_than_one_etcd_response_comes_back_whole,
);

async fn keys(store: &dyn Store, prefix: &str) -> Vec<String> {
    store
        .range(prefix)
        .await
        .unwrap()
        .into_iter()
        .map(|kv| kv.key)
        .collect()
}

async fn next_event(rx: &mut tokio::sync::mpsc::Receiver<WatchEvent>) -> WatchEvent {
    tokio::time::timeout(DEADLINE, rx.recv())
        .await
        .expect("watch event in time")
        .expect("watch still open")
}

async fn cas_on_absent_present_mod_rev_version_and_value(b: Backend) {
    let store = &*b.store;
    let base = store.rev().await.unwrap();

    // Create-if-absent succeeds once.
    let create = || {
        Txn::new()
            .when("jobs/a", Compare::Absent)
            .and_then(put("jobs/a", "v1"))
            .or_else(put("conflicts/a", "lost"))
    };
    let first = store.txn(create()).await.unwrap();
    assert!(first.succeeded);
    assert_eq!(first.rev, base + 1);
    let second = store.txn(create()).await.unwrap();
    assert!(!second.succeeded, "Absent must fail on an existing key");
    assert_eq!(second.rev, base + 2, "the failure branch wrote");
    assert_eq!(value_of(store, "jobs/a").await.as_deref(), Some("v1"));
    assert_eq!(
        value_of(store, "conflicts/a").await.as_deref(),
        Some("lost")
    );

    // Compare-and-swap on the revision.
    let kv = store.get("jobs/a").await.unwrap().unwrap();
    assert_eq!(
        (kv.mod_rev, kv.create_rev, kv.version),
        (base + 1, base + 1, 1)
    );
    let stale = store
        .txn(
            Txn::new()
                .when("jobs/a", Compare::ModRev(kv.mod_rev + 7))
                .and_then(put("jobs/a", "stale")),
        )
        .await
        .unwrap();
    assert!(!stale.succeeded);
    assert_eq!(
        stale.rev,
        base + 2,
        "a txn that writes nothing takes no revision"
    );
    let swap = store
        .txn(
            Txn::new()
                .when("jobs/a", Compare::ModRev(kv.mod_rev))
                .and_then(put("jobs/a", "v2")),
        )
        .await
        .unwrap();
    assert!(swap.succeeded);
    assert_eq!(swap.rev, base + 3);
    let kv = store.get("jobs/a").await.unwrap().unwrap();
    assert_eq!(
        (kv.mod_rev, kv.create_rev, kv.version),
        (base + 3, base + 1, 2)
    );

    // Version and value compares.
    let on = |c: Compare| Txn::new().when("jobs/a", c).and_then(put("seen", "x"));
    assert!(!store.txn(on(Compare::Version(1))).await.unwrap().succeeded);
    assert!(store.txn(on(Compare::Version(2))).await.unwrap().succeeded);
    assert!(
        !store
            .txn(on(Compare::Value(b"v1".to_vec())))
            .await
            .unwrap()
            .succeeded
    );
    assert!(
        store
            .txn(on(Compare::Value(b"v2".to_vec())))
            .await
            .unwrap()
            .succeeded
    );

    // On a missing key only Absent holds.
    for c in [
        Compare::Present,
        Compare::ModRev(0),
        Compare::Version(0),
        Compare::Value(Vec::new()),
    ] {
        let missing = store
            .txn(
                Txn::new()
                    .when("jobs/none", c.clone())
                    .and_then(put("x", "1")),
            )
            .await
            .unwrap();
        assert!(!missing.succeeded, "{c:?} held on a missing key");
    }
    assert_eq!(store.get("x").await.unwrap(), None);

    // All compares must hold; one txn takes one revision.
    let both = store
        .txn(
            Txn::new()
                .when("jobs/a", Compare::Present)
                .when("jobs/none", Compare::Absent)
                .and_then(put("x", "1"))
                .and_then(put("y", "2")),
        )
        .await
        .unwrap();
    assert!(both.succeeded);
    assert_eq!(store.get("x").await.unwrap().unwrap().mod_rev, both.rev);
    assert_eq!(store.get("y").await.unwrap().unwrap().mod_rev, both.rev);
    assert_eq!(store.rev().await.unwrap(), both.rev);

    // Deleted and created again: a new creation revision, version 1.
    store
        .txn(Txn::new().and_then(Op::delete("jobs/a")))
        .await
        .unwrap();
    let again = put_plain(store, "jobs/a", "v3").await;
    let kv = store.get("jobs/a").await.unwrap().unwrap();
    assert_eq!((kv.create_rev, kv.version), (again, 1));
}

async fn range_is_sorted_and_bounded_by_prefix_and_delete_works(b: Backend) {
    let store = &*b.store;
    for key in ["w/c", "w/a", "x/a", "w0", "w/b/1", "v/z", "w/b"] {
        put_plain(store, key, key).await;
    }
    assert_eq!(keys(store, "w/").await, ["w/a", "w/b", "w/b/1", "w/c"]);
    assert_eq!(keys(store, "").await.len(), 7);
    assert!(keys(store, "nothing/").await.is_empty());

    let rev = store.rev().await.unwrap();
    let deleted = store
        .txn(Txn::new().and_then(Op::delete("w/b")))
        .await
        .unwrap();
    assert_eq!(deleted.rev, rev + 1);
    assert_eq!(store.get("w/b").await.unwrap(), None);
    assert_eq!(keys(store, "w/").await, ["w/a", "w/b/1", "w/c"]);
    // Deleting a missing key changes nothing, so it takes no revision.
    let noop = store
        .txn(Txn::new().and_then(Op::delete("w/b")))
        .await
        .unwrap();
    assert_eq!(noop.rev, rev + 1);
}

async fn paginated_and_tail_ranges_stay_inside_the_prefix(b: Backend) {
    let store = &*b.store;
    for key in ["e/1", "e/2", "e/3", "e/4", "e0", "d/9", "f/1"] {
        put_plain(store, key, key).await;
    }
    let names = |kvs: Vec<KeyValue>| kvs.into_iter().map(|kv| kv.key).collect::<Vec<_>>();
    let page = |after: Option<&'static str>, limit| store.range_page("e/", after, limit);
    assert_eq!(names(page(None, 2).await.unwrap()), ["e/1", "e/2"]);
    assert_eq!(names(page(Some("e/2"), 10).await.unwrap()), ["e/3", "e/4"]);
    assert!(page(Some("e/4"), 10).await.unwrap().is_empty());
    assert!(page(None, 0).await.unwrap().is_empty());
    // A cursor before the prefix starts at the prefix.
    assert_eq!(names(page(Some("a"), 1).await.unwrap()), ["e/1"]);
    assert_eq!(
        names(store.range_tail("e/", 3).await.unwrap()),
        ["e/2", "e/3", "e/4"]
    );
    assert_eq!(names(store.range_tail("f/", 3).await.unwrap()), ["f/1"]);
    assert!(store.range_tail("g/", 3).await.unwrap().is_empty());
}

async fn an_atomic_group_is_all_or_nothing(b: Backend) {
    let store = &*b.store;
    let group: Vec<Txn> = (0..3)
        .map(|t| Txn {
            compares: Vec::new(),
            success: (0..40)
                .map(|i| put(&format!("a/{t}/{i:03}"), "v"))
                .collect(),
            failure: Vec::new(),
        })
        .collect();
    let results = store.txn_atomic(group).await.unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(keys(store, "a/").await.len(), 120);
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
    assert!(keys(store, "b/").await.is_empty());
    // A key written twice in one group ends with its last value.
    store
        .txn_atomic(vec![
            Txn::new().and_then(put("c/k", "first")),
            Txn::new()
                .and_then(put("c/k", "last"))
                .and_then(Op::delete("c/gone")),
        ])
        .await
        .unwrap();
    assert_eq!(value_of(store, "c/k").await.as_deref(), Some("last"));
}

async fn txns_in_one_call_apply_in_order(b: Backend) {
    let store = &*b.store;
    let claim = |who: &str| {
        Txn::new()
            .when("leader", Compare::Absent)
            .and_then(put("leader", who))
    };
    let results = store
        .txn_many(vec![claim("a"), claim("b"), claim("c")])
        .await;
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        results.iter().map(|r| r.succeeded).collect::<Vec<_>>(),
        [true, false, false],
        "exactly the first claim wins"
    );
    assert_eq!(value_of(store, "leader").await.as_deref(), Some("a"));
    // Revisions stay per txn.
    let base = store.rev().await.unwrap();
    let results = store
        .txn_many(
            (0..5)
                .map(|i| Txn::new().and_then(put(&format!("n/{i}"), "x")))
                .collect(),
        )
        .await;
    let revs: Vec<u64> = results.into_iter().map(|r| r.unwrap().rev).collect();
    assert_eq!(revs, (base + 1..=base + 5).collect::<Vec<_>>());
}

async fn watch_delivers_prefix_events_in_commit_order(b: Backend) {
    let store = &*b.store;
    let mut jobs = store.watch("jobs/").await.unwrap();
    let mut all = store.watch("").await.unwrap();

    let r1 = put_plain(store, "jobs/1", "a").await;
    put_plain(store, "spokes/1", "up").await;
    let r3 = put_plain(store, "jobs/2", "b").await;
    let r4 = store
        .txn(Txn::new().and_then(Op::delete("jobs/1")))
        .await
        .unwrap()
        .rev;
    let results = store
        .txn_many(
            (0..50)
                .map(|i| Txn::new().and_then(put(&format!("jobs/m/{i:02}"), "x")))
                .collect(),
        )
        .await;
    assert!(results.iter().all(|r| r.is_ok()));

    assert_eq!(
        next_event(&mut jobs).await,
        WatchEvent::Put(KeyValue {
            key: "jobs/1".into(),
            value: b"a".to_vec(),
            mod_rev: r1,
            create_rev: r1,
            version: 1,
            lease: None
        })
    );
    let second = next_event(&mut jobs).await;
    assert_eq!((second.key(), second.rev()), ("jobs/2", r3));
    assert_eq!(
        next_event(&mut jobs).await,
        WatchEvent::Delete {
            key: "jobs/1".into(),
            rev: r4
        }
    );
    let mut last = r4;
    for i in 0..50 {
        let event = next_event(&mut jobs).await;
        assert_eq!(event.key(), format!("jobs/m/{i:02}"));
        assert!(event.rev() > last, "revisions increase in commit order");
        last = event.rev();
    }
    assert!(jobs.try_recv().is_err(), "no event outside the prefix");

    let keys: Vec<String> = [next_event(&mut all).await, next_event(&mut all).await]
        .iter()
        .map(|e| e.key().to_owned())
        .collect();
    assert_eq!(keys, ["jobs/1", "spokes/1"]);
}

async fn leases_expire_and_delete_their_keys(b: Backend) {
    let store = &*b.store;
    let mut watch = store.watch("nodes/").await.unwrap();
    let lease = store.lease_grant(b.short_ttl_ms).await.unwrap();
    store
        .txn(Txn::new().and_then(Op::put_with_lease("nodes/n1", b"up".to_vec(), lease)))
        .await
        .unwrap();
    put_plain(store, "nodes/static", "kept").await;
    let put = next_event(&mut watch).await;
    assert!(matches!(put, WatchEvent::Put(ref kv) if kv.lease == Some(lease)));
    assert_eq!(
        store.get("nodes/n1").await.unwrap().unwrap().lease,
        Some(lease)
    );
    next_event(&mut watch).await;

    let started = Instant::now();
    let deleted = next_event(&mut watch).await;
    assert_eq!(deleted.key(), "nodes/n1");
    assert!(matches!(deleted, WatchEvent::Delete { .. }));
    assert!(started.elapsed() < DEADLINE);
    assert_eq!(store.get("nodes/n1").await.unwrap(), None);
    assert_eq!(
        value_of(store, "nodes/static").await.as_deref(),
        Some("kept")
    );
    assert_eq!(
        store.lease_keepalive(lease).await,
        Err(StoreError::LeaseNotFound(lease))
    );
    // A put on an expired lease fails and writes nothing.
    let late = store
        .txn(Txn::new().and_then(Op::put_with_lease("nodes/n1", b"again".to_vec(), lease)))
        .await;
    assert_eq!(late, Err(StoreError::LeaseNotFound(lease)));
    assert_eq!(store.get("nodes/n1").await.unwrap(), None);
}

async fn keepalive_extends_and_revoke_deletes(b: Backend) {
    let store = &*b.store;
    let lease = store.lease_grant(b.short_ttl_ms).await.unwrap();
    let other = store.lease_grant(60_000).await.unwrap();
    assert_ne!(lease, other);
    let mut watch = store.watch("hb/").await.unwrap();
    store
        .txn(
            Txn::new()
                .and_then(Op::put_with_lease("hb/a", b"1".to_vec(), lease))
                .and_then(Op::put_with_lease("hb/b", b"1".to_vec(), other))
                .and_then(Op::put_with_lease("hb/c", b"1".to_vec(), other)),
        )
        .await
        .unwrap();

    // Three TTLs long, kept alive every quarter TTL: the key stays.
    let until = Instant::now() + Duration::from_millis(3 * b.short_ttl_ms);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(b.short_ttl_ms / 4)).await;
        store.lease_keepalive(lease).await.unwrap();
        assert!(
            store.get("hb/a").await.unwrap().is_some(),
            "kept-alive key vanished"
        );
    }
    for key in ["hb/a", "hb/b", "hb/c"] {
        assert_eq!(next_event(&mut watch).await.key(), key);
    }
    // Stop: it expires, and the expiry deletes the key (not only hides it).
    let expired = next_event(&mut watch).await;
    assert!(matches!(expired, WatchEvent::Delete { ref key, .. } if key == "hb/a"));
    assert_eq!(store.get("hb/a").await.unwrap(), None);

    // Revoke deletes every key of the lease at once, as one revision.
    let before = store.rev().await.unwrap();
    store.lease_revoke(other).await.unwrap();
    assert_eq!(store.get("hb/b").await.unwrap(), None);
    assert_eq!(store.get("hb/c").await.unwrap(), None);
    let (e1, e2) = (next_event(&mut watch).await, next_event(&mut watch).await);
    assert_eq!((e1.key(), e2.key()), ("hb/b", "hb/c"));
    assert_eq!((e1.rev(), e2.rev()), (before + 1, before + 1));
    assert_eq!(
        store.lease_revoke(other).await,
        Err(StoreError::LeaseNotFound(other))
    );
    assert_eq!(
        store.lease_keepalive(999).await,
        Err(StoreError::LeaseNotFound(999))
    );
}

async fn overwriting_a_leased_key_detaches_it(b: Backend) {
    let store = &*b.store;
    let lease = store.lease_grant(60_000).await.unwrap();
    store
        .txn(Txn::new().and_then(Op::put_with_lease("k", b"leased".to_vec(), lease)))
        .await
        .unwrap();
    put_plain(store, "k", "plain").await;
    store.lease_revoke(lease).await.unwrap();
    assert_eq!(value_of(store, "k").await.as_deref(), Some("plain"));
}

async fn limits_reject_bad_requests_without_writing(b: Backend) {
    let store = &*b.store;
    let before = store.rev().await.unwrap();
    let long_key = "k".repeat(MAX_KEY_BYTES + 1);
    let err = store.txn(Txn::new().and_then(put(&long_key, "x"))).await;
    assert!(matches!(err, Err(StoreError::InvalidRequest(_))));
    let err = store.txn(Txn::new().and_then(put("", "x"))).await;
    assert!(matches!(err, Err(StoreError::InvalidRequest(_))));
    assert!(matches!(
        store.lease_grant(0).await,
        Err(StoreError::InvalidRequest(_))
    ));
    assert_eq!(store.rev().await.unwrap(), before);
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct JobRecord {
    team: String,
    gpus: u32,
}

async fn json_helpers_round_trip(b: Backend) {
    let store = &*b.store;
    let job = JobRecord {
        team: "ml".into(),
        gpus: 4,
    };
    let result = store
        .txn(
            Txn::new()
                .when("jobs/j1", Compare::Absent)
                .and_then(put_json("jobs/j1", &job).unwrap()),
        )
        .await
        .unwrap();
    let (read, rev) = get_json::<JobRecord, _>(store, "jobs/j1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((read, rev), (job.clone(), result.rev));
    let all = range_json::<JobRecord, _>(store, "jobs/").await.unwrap();
    assert_eq!(all, vec![("jobs/j1".to_owned(), job, result.rev)]);
    assert!(
        get_json::<JobRecord, _>(store, "jobs/none")
            .await
            .unwrap()
            .is_none()
    );
    store
        .txn(Txn::new().and_then(put("jobs/bad", "not json")))
        .await
        .unwrap();
    assert!(matches!(
        get_json::<JobRecord, _>(store, "jobs/bad").await,
        Err(StoreError::Decode { .. })
    ));
}

async fn ranges_read_a_past_revision_page_by_page(b: Backend) {
    let store = &*b.store;
    put_plain(store, "r/a", "1").await;
    put_plain(store, "r/b", "1").await;
    let then = put_plain(store, "r/c", "1").await;
    put_plain(store, "r/b", "2").await;
    store
        .txn(
            Txn::new()
                .and_then(Op::delete("r/c"))
                .and_then(put("r/d", "1"))
                .and_then(put("r/0", "1")),
        )
        .await
        .unwrap();
    let now = store.rev().await.unwrap();
    let show = |kvs: &[KeyValue]| {
        kvs.iter()
            .map(|kv| format!("{}={}", kv.key, String::from_utf8_lossy(&kv.value)))
            .collect::<Vec<_>>()
    };

    let current = store.range_at("r/", None, 10, None).await.unwrap();
    assert_eq!(current.rev, now);
    assert_eq!(show(&current.kvs), ["r/0=1", "r/a=1", "r/b=2", "r/d=1"]);
    let past = store.range_at("r/", None, 10, Some(then)).await.unwrap();
    assert_eq!(past.rev, then);
    assert_eq!(show(&past.kvs), ["r/a=1", "r/b=1", "r/c=1"]);
    assert_eq!(past.kvs[1].mod_rev, then - 1, "metadata as of then");

    // Pages at the first page's revision show one state, whatever is written meanwhile.
    let first = store.range_at("r/", None, 2, Some(then)).await.unwrap();
    put_plain(store, "r/bb", "new").await;
    store
        .txn(Txn::new().and_then(Op::delete("r/a")))
        .await
        .unwrap();
    let after = first.kvs.last().map(|kv| kv.key.clone());
    let second = store
        .range_at("r/", after.as_deref(), 2, Some(first.rev))
        .await
        .unwrap();
    assert_eq!(show(&first.kvs), ["r/a=1", "r/b=1"]);
    assert_eq!(show(&second.kvs), ["r/c=1"]);

    let future = store.rev().await.unwrap() + 100;
    assert!(
        matches!(
            store.range_at("r/", None, 10, Some(future)).await,
            Err(StoreError::FutureRevision { rev, .. }) if rev == future
        ),
        "a revision not yet written is refused"
    );
    assert!(
        matches!(
            store.range_at("none/", None, 10, Some(future)).await,
            Err(StoreError::FutureRevision { rev, current }) if rev == future && current + 100 == future
        ),
        "also where the range is empty, with the current revision"
    );
}

async fn watch_from_a_revision_replays_then_follows(b: Backend) {
    let store = &*b.store;
    put_plain(store, "w/1", "a").await;
    let from = put_plain(store, "w/2", "b").await;
    put_plain(store, "other/1", "x").await;
    let deleted = store
        .txn(Txn::new().and_then(Op::delete("w/1")))
        .await
        .unwrap()
        .rev;
    let mut rx = store.watch_from("w/", Some(from)).await.unwrap();
    let live = put_plain(store, "w/3", "c").await;
    let seen: Vec<(String, u64)> = [
        next_event(&mut rx).await,
        next_event(&mut rx).await,
        next_event(&mut rx).await,
    ]
    .iter()
    .map(|e| (e.key().to_owned(), e.rev()))
    .collect();
    assert_eq!(
        seen,
        [
            ("w/2".to_owned(), from),
            ("w/1".to_owned(), deleted),
            ("w/3".to_owned(), live)
        ]
    );
    assert!(rx.try_recv().is_err(), "nothing more");

    // Range at R, then watch from R + 1: every later change, none twice.
    let page = store.range_at("w/", None, 100, None).await.unwrap();
    put_plain(store, "w/4", "d").await;
    let mut rx = store.watch_from("w/", Some(page.rev + 1)).await.unwrap();
    assert_eq!(next_event(&mut rx).await.key(), "w/4");

    // From a revision not written yet: its changes, not those before it.
    let ahead = store.rev().await.unwrap() + 2;
    let mut rx = store.watch_from("w/", Some(ahead)).await.unwrap();
    put_plain(store, "w/5", "skipped").await;
    let at = put_plain(store, "w/6", "seen").await;
    assert_eq!(at, ahead);
    let e = next_event(&mut rx).await;
    assert_eq!((e.key(), e.rev()), ("w/6", ahead));
}

async fn compaction_forgets_older_revisions(b: Backend) {
    let store = &*b.store;
    let old = put_plain(store, "c/a", "1").await;
    put_plain(store, "c/a", "2").await;
    let kept = put_plain(store, "c/b", "1").await;
    let last = put_plain(store, "c/c", "1").await;
    store.compact(kept).await.unwrap();
    assert!(matches!(
        store.range_at("c/", None, 10, Some(old)).await,
        Err(StoreError::Compacted { rev }) if rev == old
    ));
    assert!(matches!(
        store.watch_from("c/", Some(old)).await,
        Err(StoreError::Compacted { .. })
    ));
    // After the compacted revision everything is still there.
    let at_kept = store.range_at("c/", None, 10, Some(kept)).await.unwrap();
    assert_eq!(at_kept.kvs.len(), 2);
    let mut rx = store.watch_from("c/", Some(kept + 1)).await.unwrap();
    assert_eq!(next_event(&mut rx).await.rev(), last);
    // Compacting again at or before is no error; past the end is.
    store.compact(old).await.unwrap();
    assert!(matches!(
        store.compact(last + 100).await,
        Err(StoreError::FutureRevision { .. })
    ));
}

async fn a_range_larger_than_one_etcd_response_comes_back_whole(b: Backend) {
    // 48 values of 128 KiB: 6 MiB, above gRPC's default 4 MiB message. A hub with ~6,000
    // workload records needs such a range to restore.
    let store = &*b.store;
    let value = vec![b'v'; 128 * 1024];
    let txns = (0..48)
        .map(|i| Txn::new().and_then(Op::put(format!("big/{i:02}"), value.clone())))
        .collect();
    assert!(store.txn_many(txns).await.iter().all(|r| r.is_ok()));
    let all = store.range("big/").await.unwrap();
    assert_eq!(all.len(), 48);
    assert!(all.iter().all(|kv| kv.value.len() == value.len()));
    assert_eq!(store.range_tail("big/", 40).await.unwrap().len(), 40);
    assert_eq!(
        store
            .range_page("big/", Some("big/09"), 100)
            .await
            .unwrap()
            .len(),
        38
    );
}
