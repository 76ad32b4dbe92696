//! Warm followers and compaction: a replica's mirror of the store (listed at one revision,
//! then kept by a watch) equals the store key for key on both backends, lists again when
//! its watch ends, and is what a follower restores from when it takes the lead; the
//! leader compacts etcd's history every interval.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axle_hub::ha::{HaOptions, Mirror};
use axle_hub::store::{
    BoxFuture, KeyValue, LeaseId, Op, Page, RedbStore, Rev, Store, StoreError, Txn, TxnResult,
    WatchEvent,
};
use axle_proto::pb;
use axle_proto::pb::user_service_client::UserServiceClient;
use tokio::sync::{mpsc, watch};

/// Key, value, mod revision and version of every key: what a copy must equal.
async fn dump(store: &dyn Store) -> Vec<(String, Vec<u8>, Rev, u64)> {
    store
        .range("")
        .await
        .unwrap()
        .into_iter()
        .map(|kv| (kv.key, kv.value, kv.mod_rev, kv.version))
        .collect()
}

/// Puts, overwrites, deletes, a batch above one etcd txn, and a key that goes with its
/// lease: what the hub writes, in kind.
async fn write_a_mix(store: &dyn Store, round: usize) {
    for chunk in 0..25 {
        let mut t = Txn::new();
        for i in 0..100 {
            let key = format!("workloads/r{round}/{:05}", chunk * 100 + i);
            t = t.and_then(Op::put(key, format!("v{chunk}-{i}")));
        }
        store.txn(t).await.unwrap();
    }
    let mut t = Txn::new();
    for i in 0..100 {
        t = t.and_then(Op::put(format!("workloads/r{round}/{i:05}"), "again"));
    }
    store.txn(t).await.unwrap();
    let mut t = Txn::new();
    for i in 100..200 {
        t = t.and_then(Op::delete(format!("workloads/r{round}/{i:05}")));
    }
    store.txn(t).await.unwrap();
    let batch: Vec<Txn> = (0..3)
        .map(|part| {
            (0..100).fold(Txn::new(), |t, i| {
                t.and_then(Op::put(format!("events/r{round}/{part}/{i:03}"), "e"))
            })
        })
        .collect();
    store.txn_atomic(batch).await.unwrap();
    let lease = store.lease_grant(60_000).await.unwrap();
    store
        .txn(Txn::new().and_then(Op::put_with_lease(format!("hubs/r{round}"), "me", lease)))
        .await
        .unwrap();
    store.lease_revoke(lease).await.unwrap();
}

/// The mirror once it has caught up with the store.
async fn caught_up(mirror: &Mirror, store: &dyn Store) -> axle_hub::ha::MirrorView {
    let rev = store.rev().await.unwrap();
    mirror
        .view_at(rev, Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("the mirror did not reach revision {rev}"))
}

async fn a_mirror_equals_its_store(store: Arc<dyn Store>) {
    write_a_mix(store.as_ref(), 0).await;
    let shown = Arc::new(AtomicU64::new(0));
    // Listed in pages (2,400 keys), then followed.
    let mirror = Mirror::start(store.clone(), shown.clone());
    let view = caught_up(&mirror, store.as_ref()).await;
    assert_eq!(dump(&view).await, dump(store.as_ref()).await);
    write_a_mix(store.as_ref(), 1).await;
    let view = caught_up(&mirror, store.as_ref()).await;
    let all = dump(store.as_ref()).await;
    assert_eq!(all.len(), 2 * (2500 - 100) + 2 * 300);
    assert_eq!(dump(&view).await, all);
    assert_eq!(shown.load(Ordering::Relaxed), view.revision());
    // The view stays as it was while the mirror goes on.
    store
        .txn(Txn::new().and_then(Op::put("later", "x")))
        .await
        .unwrap();
    assert!(view.get("later").await.unwrap().is_none());
    drop(mirror);
    assert_eq!(
        shown.load(Ordering::Relaxed),
        0,
        "a dropped mirror shows cold"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_equals_its_store_on_redb() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = RedbStore::open(&dir.path().join("m.redb")).unwrap();
    a_mirror_equals_its_store(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_equals_its_store_on_etcd() {
    let etcd = common::Etcd::start().await;
    a_mirror_equals_its_store(Arc::new(etcd.store("/mirror/").await)).await;
}

/// A store whose watches the test can end, as a lost etcd member or a watcher that fell
/// behind would; everything else is the real store's.
struct Cuttable {
    inner: Arc<dyn Store>,
    cut: watch::Sender<u64>,
    watches: AtomicUsize,
}

impl Store for Cuttable {
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>, StoreError>> {
        self.inner.get(key)
    }
    fn range_at(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        rev: Option<Rev>,
    ) -> BoxFuture<'_, Result<Page, StoreError>> {
        self.inner.range_at(prefix, after, limit, rev)
    }
    fn range_tail(
        &self,
        prefix: &str,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<KeyValue>, StoreError>> {
        self.inner.range_tail(prefix, limit)
    }
    fn rev(&self) -> BoxFuture<'_, Result<Rev, StoreError>> {
        self.inner.rev()
    }
    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, StoreError>> {
        self.inner.txn(txn)
    }
    fn txn_many(&self, txns: Vec<Txn>) -> BoxFuture<'_, Vec<Result<TxnResult, StoreError>>> {
        self.inner.txn_many(txns)
    }
    fn txn_atomic(&self, txns: Vec<Txn>) -> BoxFuture<'_, Result<Vec<TxnResult>, StoreError>> {
        self.inner.txn_atomic(txns)
    }
    fn watch_from(
        &self,
        prefix: &str,
        start: Option<Rev>,
    ) -> BoxFuture<'_, Result<mpsc::Receiver<WatchEvent>, StoreError>> {
        let inner = self.inner.watch_from(prefix, start);
        let mut cut = self.cut.subscribe();
        cut.mark_unchanged();
        self.watches.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let mut from = inner.await?;
            let (tx, rx) = mpsc::channel(1024);
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        e = from.recv() => match e {
                            Some(e) => if tx.send(e).await.is_err() { return },
                            None => return,
                        },
                        _ = cut.changed() => return,
                    }
                }
            });
            Ok(rx)
        })
    }
    fn compact(&self, rev: Rev) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.compact(rev)
    }
    fn lease_grant(&self, ttl_ms: u64) -> BoxFuture<'_, Result<LeaseId, StoreError>> {
        self.inner.lease_grant(ttl_ms)
    }
    fn lease_keepalive(&self, id: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.lease_keepalive(id)
    }
    fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.lease_revoke(id)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_whose_watch_ends_lists_again_and_misses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Cuttable {
        inner: RedbStore::open(&dir.path().join("m.redb")).unwrap(),
        cut: watch::channel(0).0,
        watches: AtomicUsize::new(0),
    });
    write_a_mix(store.as_ref(), 0).await;
    let mirror = Mirror::start(store.clone(), Arc::default());
    caught_up(&mirror, store.as_ref()).await;
    assert_eq!(store.watches.load(Ordering::SeqCst), 1);
    store.cut.send_modify(|n| *n += 1);
    // Written while the mirror has no watch: found by listing again.
    write_a_mix(store.as_ref(), 1).await;
    let view = caught_up(&mirror, store.as_ref()).await;
    assert_eq!(dump(&view).await, dump(store.as_ref()).await);
    assert_eq!(
        store.watches.load(Ordering::SeqCst),
        2,
        "listed and watched again"
    );
}

/// A replica on `store`, in this process, on free loopback ports.
struct Replica {
    http: std::net::SocketAddr,
    grpc: String,
    stop: tokio::sync::oneshot::Sender<()>,
    run: tokio::task::JoinHandle<anyhow::Result<()>>,
    _data: tempfile::TempDir,
}

async fn replica(etcd: &common::Etcd, id: &str, compaction_interval: Duration) -> Replica {
    let listeners = axle_hub::server::Listeners::bind(
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let http = listeners.http.local_addr().unwrap();
    let grpc = format!("http://{}", listeners.grpc.local_addr().unwrap());
    let data = tempfile::tempdir().unwrap();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(axle_hub::ha::run(
        data.path().to_path_buf(),
        axle_hub::dev::example_policy().unwrap(),
        None,
        listeners,
        etcd.store("/ha/").await,
        HaOptions {
            replica_id: id.into(),
            advertise_http: format!("http://{http}"),
            advertise_grpc: grpc.clone(),
            lease_ttl: Duration::from_secs(2),
            compaction_interval,
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    Replica {
        http,
        grpc,
        stop,
        run,
        _data: data,
    }
}

/// `GET path` on `addr`: status line and body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let out = common::http_get(&addr.to_string(), path).await;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head.lines().next().unwrap_or("").to_string();
    (status, body.to_string())
}

async fn wait_ready(r: &Replica) {
    for _ in 0..300 {
        if http_get(r.http, "/readyz").await.0.contains(" 200 ") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("replica at {} never led", r.http);
}

/// The `state` of `GET /api/v1/hubs` as the replica answers it.
async fn state_of(r: &Replica) -> String {
    let (_, body) = http_get(r.http, "/api/v1/hubs").await;
    let v: axle_proto::api::HubsView = serde_json::from_str(&body).unwrap();
    v.state.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_takes_the_lead_from_its_warm_mirror_and_the_leader_compacts() {
    let etcd = common::Etcd::start().await;
    let interval = Duration::from_secs(1);
    let r0 = replica(&etcd, "r0", interval).await;
    wait_ready(&r0).await;
    let r1 = replica(&etcd, "r1", interval).await;
    let mut c = UserServiceClient::connect(r0.grpc.clone()).await.unwrap();
    for i in 0..300 {
        c.submit(pb::SubmitRequest {
            team: "nlp".into(),
            name: format!("warm-{i}"),
            command: vec!["true".into()],
            gpus: 1.0,
            ..Default::default()
        })
        .await
        .expect("submit");
    }
    drop(c);
    // The follower's mirror reads along.
    let store = etcd.store("/ha/").await;
    let written = store.rev().await.unwrap();
    // One more revision, so a compaction after this one reaches past `written`.
    store
        .txn(Txn::new().and_then(Op::put("poke", "x")))
        .await
        .unwrap();
    let mut state = String::new();
    for _ in 0..200 {
        state = state_of(&r1).await;
        let rev = state
            .rsplit(' ')
            .next()
            .and_then(|r| r.parse::<Rev>().ok())
            .unwrap_or(0);
        if state.contains("mirror is at revision") && rev >= written {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        state.contains("follows; its mirror is at revision"),
        "{state}"
    );

    // The leader compacts its history: a read before the last interval is refused.
    tokio::time::sleep(interval * 3).await;
    assert!(
        matches!(
            store.range_at("", None, 1, Some(written)).await,
            Err(StoreError::Compacted { .. })
        ),
        "revision {written} is still kept after three compaction intervals"
    );

    // r0 stops (and resigns): r1 leads from its mirror, with every workload.
    let _ = r0.stop.send(());
    r0.run.await.unwrap().unwrap();
    wait_ready(&r1).await;
    let state = state_of(&r1).await;
    assert!(
        state.contains("restored from its mirror at revision"),
        "{state}"
    );
    let mut c = UserServiceClient::connect(r1.grpc.clone()).await.unwrap();
    let listed = c
        .list_workloads(pb::ListWorkloadsRequest {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut names: Vec<String> = listed.workloads.into_iter().map(|w| w.name).collect();
    names.sort();
    let mut want: Vec<String> = (0..300).map(|i| format!("warm-{i}")).collect();
    want.sort();
    assert_eq!(names, want);
    drop(c);
    let _ = r1.stop.send(());
    r1.run.await.unwrap().unwrap();
}
