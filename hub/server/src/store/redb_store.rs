//! `RedbStore`: the embedded single-file `Store`, with group commit on one writer thread.
//!
//! # Write path
//! Every write (txn, lease grant, lease revoke, lease expiry) is a request on one bounded queue.
//! One OS thread drains it: it takes every request available (up to [`MAX_BATCH_TXNS`]), applies
//! them in order in ONE redb write transaction — each txn's compares see the effects of earlier
//! txns of the same batch — commits once with `Durability::Immediate` (one fsync), then publishes
//! the watch events and resolves every caller. A batch that changes nothing (only failed compares
//! with empty failure branches) is not committed: what it read was already durable.
//!
//! # Tables
//! - `kv`: key → versioned record (see `record.rs`): value, `mod_rev`, lease.
//! - `meta`: `format_version`, `rev` (latest revision), `next_lease` (next lease id).
//! - `leases`: lease id → TTL in ms.
//! - `lease_keys`: `"<lease id as 16 hex digits>/<key>"` → (), the keys attached to each lease.
//!
//! # Leases and time
//! Lease deadlines live in memory and use `tokio::time::Instant`, so tests can pause the clock.
//! They are not durable: when the store opens, every stored lease is given its full TTL again,
//! counted from the open (etcd likewise re-grants TTLs on a leader change). A holder that is gone
//! is therefore noticed at most one TTL after a restart. Expired leases are deleted by a
//! background task and, lazily, at the start of every batch; reads hide keys of expired leases
//! in between.
//!
//! Caveat for tests with a paused tokio clock: the writer is an OS thread, so while a task awaits
//! a write, tokio may see an idle runtime and auto-advance the clock to the next timer (for
//! example a lease deadline). Lease tests with a paused clock must account for that.

use std::collections::HashMap;
use std::fmt::Display;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, Table, TableDefinition};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

mod read;
mod writer;

use writer::Writer;

use super::history::{Change, History};
use super::record;
use super::{
    BoxFuture, KeyValue, LeaseId, Op, Page, Rev, Store, StoreError, Txn, TxnResult, WatchEvent,
};

/// redb's page cache. Its default (1 GiB) would let the cache alone pass
/// the hub's 300 MB memory budget; recent records are what the hub reads
/// (everything else is in memory already), so 32 MiB is plenty.
const CACHE_BYTES: usize = 32 << 20;

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const LEASES: TableDefinition<u64, u64> = TableDefinition::new("leases");
const LEASE_KEYS: TableDefinition<&str, ()> = TableDefinition::new("lease_keys");

const META_FORMAT_VERSION: &str = "format_version";
const META_REV: &str = "rev";
const META_NEXT_LEASE: &str = "next_lease";

/// Layout of the tables above. Bump it (and migrate in `init_tables`) when a table's key or value
/// type changes; records inside `kv` carry their own version (see `record.rs`).
const FORMAT_VERSION: u64 = 1;

/// File name of the database inside a data directory.
pub const DB_FILE_NAME: &str = "state.redb";

/// Most requests one group commit applies. Applying a txn in memory costs a few µs to tens of µs,
/// so 512 keep one batch's work around 10 ms (well inside the 50 ms submit→running p99), while
/// 512 × ~190 fsyncs/s ≈ 97,000 txns/s is far above the ~1,500 txns/s that 300 jobs/s with a few
/// transitions each need.
pub const MAX_BATCH_TXNS: usize = 512;

/// Requests waiting for the writer. Two full batches: one can be queued while the previous one
/// commits, so the writer never idles under load; beyond that callers wait (backpressure)
/// instead of the queue growing without bound.
pub const QUEUE_CAPACITY: usize = 2 * MAX_BATCH_TXNS;

/// Events one watcher may fall behind before it is dropped. Eight full batches of changes: a
/// consumer that is further behind than ~40 ms of peak writes is better off re-listing.
pub const WATCH_CHANNEL_CAPACITY: usize = 8 * MAX_BATCH_TXNS;

/// Open watches. The hub watches a handful of prefixes per subsystem and per API stream; 256
/// leaves room for that while bounding the work every commit does to publish events.
pub const MAX_WATCHERS: usize = 256;

/// Live leases. The hub holds about one per spoke plus one for leadership; 65,536 is far above
/// any fleet and bounds the in-memory lease map.
pub const MAX_LEASES: usize = 65_536;

/// Longest lease TTL: one day. Leases detect dead holders; a longer TTL is a mistake.
pub const MAX_LEASE_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// Wait after a failed expiry pass before the next one, so a failing disk is not hammered in a
/// tight loop.
const REAP_RETRY_DELAY_MS: u64 = 100;

/// The embedded store. Open with [`RedbStore::open`]; share the returned `Arc`. Dropping the last
/// handle finishes queued writes, stops the writer thread and closes the file.
pub struct RedbStore {
    shared: Arc<Shared>,
    /// `None` only inside `Drop`.
    requests: Option<mpsc::Sender<Request>>,
    writer: Option<JoinHandle<()>>,
    reaper_wake: Arc<Notify>,
    reaper_started: AtomicBool,
    this: Weak<RedbStore>,
}

/// State shared by callers and the writer thread.
struct Shared {
    db: Database,
    leases: Mutex<HashMap<LeaseId, LeaseState>>,
    watchers: Mutex<Watchers>,
    /// Recent changes, for reads at a past revision and watches from one.
    history: Mutex<History>,
    commits: AtomicU64,
    rev: AtomicU64,
}

struct LeaseState {
    ttl: Duration,
    deadline: Instant,
    /// Set by the writer when it starts deleting the lease; cleared if that commit fails.
    revoking: bool,
}

impl LeaseState {
    fn new(ttl_ms: u64, now: Instant) -> Self {
        let ttl = Duration::from_millis(ttl_ms);
        Self {
            ttl,
            deadline: now + ttl,
            revoking: false,
        }
    }

    fn live(&self, now: Instant) -> bool {
        !self.revoking && self.deadline > now
    }
}

struct Watcher {
    prefix: String,
    /// Only changes at this revision or later are sent (a watch from a future revision).
    from: Rev,
    events: mpsc::Sender<WatchEvent>,
}

/// The open watches and the last revision published to them.
struct Watchers {
    list: Vec<Watcher>,
    published: Rev,
}

/// A write for the writer thread. `now` is read by the caller, on its runtime's clock.
enum Request {
    Txn {
        txn: Txn,
        now: Instant,
        reply: ReplyTo,
    },
    Grant {
        ttl_ms: u64,
        now: Instant,
        reply: ReplyTo,
    },
    Revoke {
        id: LeaseId,
        now: Instant,
        reply: ReplyTo,
    },
    Reap {
        now: Instant,
        reply: ReplyTo,
    },
    /// Txns applied all together or not at all, inside one group commit.
    Atomic {
        txns: Vec<Txn>,
        now: Instant,
        reply: ReplyTo,
    },
}

enum Work {
    Txn(Txn),
    Grant { ttl_ms: u64, now: Instant },
    Revoke(LeaseId),
    Reap,
    Atomic(Vec<Txn>),
}

/// What the writer answers.
enum Reply {
    Txn(TxnResult),
    Txns(Vec<TxnResult>),
    Lease(LeaseId),
    Done,
}

type ReplyTo = oneshot::Sender<Result<Reply, StoreError>>;

/// Converts backend errors (redb, I/O) into [`StoreError::Io`] with what was being done.
trait Context<T> {
    fn ctx(self, context: &'static str) -> Result<T, StoreError>;
}

impl<T, E: Display> Context<T> for Result<T, E> {
    fn ctx(self, context: &'static str) -> Result<T, StoreError> {
        self.map_err(|e| StoreError::Io {
            context,
            message: e.to_string(),
        })
    }
}

/// Locks a mutex, also after a panic elsewhere: the guarded maps stay consistent between
/// statements, so a poisoned lock holds usable data.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn unexpected_reply() -> StoreError {
    StoreError::Io {
        context: "waiting for the writer",
        message: "the writer answered with the wrong kind of reply".to_owned(),
    }
}

impl RedbStore {
    /// Opens (or creates) the database file at `path`. Call within a tokio runtime to start the
    /// lease-expiry task at once; otherwise it starts with the first lease call.
    pub fn open(path: &Path) -> Result<Arc<Self>, StoreError> {
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .ctx("opening the database file")?;
        let Loaded {
            rev,
            next_lease,
            leases: stored_leases,
        } = init_tables(&db)?;
        // Leases get their full TTL again from now: see the module docs.
        let now = Instant::now();
        let leases = stored_leases
            .into_iter()
            .map(|(id, ttl_ms)| (id, LeaseState::new(ttl_ms, now)))
            .collect();
        let shared = Arc::new(Shared {
            db,
            leases: Mutex::new(leases),
            watchers: Mutex::new(Watchers {
                list: Vec::new(),
                published: rev,
            }),
            history: Mutex::new(History::new(rev)),
            commits: AtomicU64::new(0),
            rev: AtomicU64::new(rev),
        });
        let reaper_wake = Arc::new(Notify::new());
        let (requests, queue) = mpsc::channel(QUEUE_CAPACITY);
        let writer = Writer {
            shared: shared.clone(),
            reaper_wake: reaper_wake.clone(),
            rev,
            next_lease,
        };
        let writer = std::thread::Builder::new()
            .name("axle-store-writer".to_owned())
            .spawn(move || writer.run(queue))
            .ctx("starting the store writer thread")?;
        let store = Arc::new_cyclic(|this| RedbStore {
            shared,
            requests: Some(requests),
            writer: Some(writer),
            reaper_wake,
            reaper_started: AtomicBool::new(false),
            this: this.clone(),
        });
        store.ensure_reaper();
        tracing::info!(path = %path.display(), rev, "store opened");
        Ok(store)
    }

    /// Opens (or creates) [`DB_FILE_NAME`] inside `dir`, creating the directory if needed.
    pub fn open_in_dir(dir: &Path) -> Result<Arc<Self>, StoreError> {
        std::fs::create_dir_all(dir).ctx("creating the data directory")?;
        Self::open(&dir.join(DB_FILE_NAME))
    }

    /// Number of redb commits (fsyncs) so far: with group commit, far fewer than txns.
    pub fn commits(&self) -> u64 {
        self.shared.commits.load(Ordering::Relaxed)
    }

    /// Starts the lease-expiry task if it is not running and a tokio runtime is at hand.
    fn ensure_reaper(&self) {
        if self.reaper_started.load(Ordering::Acquire) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current()
            && !self.reaper_started.swap(true, Ordering::AcqRel)
        {
            runtime.spawn(reap_loop(self.this.clone(), self.reaper_wake.clone()));
        }
    }

    /// Queues a request; the receiver resolves once it is applied and durable.
    async fn enqueue(
        &self,
        make: impl FnOnce(ReplyTo) -> Request,
    ) -> Result<oneshot::Receiver<Result<Reply, StoreError>>, StoreError> {
        let requests = self.requests.as_ref().ok_or(StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        requests
            .send(make(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        Ok(answer)
    }

    async fn request(&self, make: impl FnOnce(ReplyTo) -> Request) -> Result<Reply, StoreError> {
        let answer = self.enqueue(make).await?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Deletes every lease expired at `now`.
    async fn reap(&self, now: Instant) -> Result<(), StoreError> {
        self.request(|reply| Request::Reap { now, reply })
            .await
            .map(|_| ())
    }

    fn decode_kv(
        &self,
        key: &str,
        bytes: &[u8],
        now: Instant,
    ) -> Result<Option<KeyValue>, StoreError> {
        let rec = record::decode(key, bytes)?;
        if !self.shared.lease_live(rec.header.lease, now) {
            return Ok(None);
        }
        Ok(Some(kv_of(key, rec)))
    }
}

impl Shared {
    /// Whether a key with this lease is visible: no lease, or a live one.
    fn lease_live(&self, lease: Option<LeaseId>, now: Instant) -> bool {
        match lease {
            None => true,
            Some(id) => lock(&self.leases).get(&id).is_some_and(|l| l.live(now)),
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        lock(&self.leases)
            .values()
            .filter(|l| !l.revoking)
            .map(|l| l.deadline)
            .min()
    }

    fn any_expired(&self, now: Instant) -> bool {
        lock(&self.leases)
            .values()
            .any(|l| !l.revoking && l.deadline <= now)
    }
}

impl Drop for RedbStore {
    fn drop(&mut self) {
        // Closing the queue lets the writer finish what is queued and exit; joining it releases
        // the database file before the drop returns, so the same file can be reopened at once.
        self.requests.take();
        if let Some(writer) = self.writer.take()
            && writer.join().is_err()
        {
            tracing::error!("store writer thread panicked");
        }
        self.reaper_wake.notify_one();
    }
}

/// What a store holds when it opens.
struct Loaded {
    rev: Rev,
    next_lease: LeaseId,
    /// `(lease id, TTL in ms)` of every stored lease.
    leases: Vec<(LeaseId, u64)>,
}

/// Creates the tables of a new file, checks the format of an existing one, and reads the
/// revision, the next lease id and the stored leases.
fn init_tables(db: &Database) -> Result<Loaded, StoreError> {
    let wtx = db.begin_write().ctx("beginning the open transaction")?;
    let loaded = {
        let mut meta = wtx.open_table(META).ctx("opening the meta table")?;
        let found = meta
            .get(META_FORMAT_VERSION)
            .ctx("reading the format version")?
            .map(|v| v.value());
        match found {
            Some(found) if found > FORMAT_VERSION => {
                return Err(StoreError::UnsupportedFormat {
                    found,
                    supported: FORMAT_VERSION,
                });
            }
            // Version 1 is the only one so far; older versions would migrate here.
            Some(_) => {}
            None => {
                meta.insert(META_FORMAT_VERSION, FORMAT_VERSION)
                    .ctx("writing the format version")?;
            }
        }
        let rev = meta
            .get(META_REV)
            .ctx("reading the revision")?
            .map_or(0, |v| v.value());
        let next_lease = meta
            .get(META_NEXT_LEASE)
            .ctx("reading the next lease id")?
            .map_or(1, |v| v.value());
        wtx.open_table(KV).ctx("opening the kv table")?;
        wtx.open_table(LEASE_KEYS)
            .ctx("opening the lease index table")?;
        let leases = wtx.open_table(LEASES).ctx("opening the lease table")?;
        let stored = leases
            .iter()
            .ctx("listing leases")?
            .map(|entry| entry.map(|(id, ttl)| (id.value(), ttl.value())))
            .collect::<Result<Vec<_>, _>>()
            .ctx("reading leases")?;
        Loaded {
            rev,
            next_lease,
            leases: stored,
        }
    };
    wtx.commit().ctx("committing the open transaction")?;
    Ok(loaded)
}

fn lease_index_prefix(id: LeaseId) -> String {
    format!("{id:016x}/")
}

/// The record a write replaces, decoded once: its lease (for the lease index) and its state
/// (for the history). A record that does not decode (damaged) is replaced as one without a
/// lease, and the history keeps it as absent: as it reads, not as it was.
fn replaced(key: &str, bytes: &[u8]) -> Option<KeyValue> {
    match record::decode(key, bytes) {
        Ok(rec) => Some(kv_of(key, rec)),
        Err(e) => {
            tracing::warn!(error = %e, "replacing an undecodable record");
            None
        }
    }
}

fn kv_of(key: &str, rec: record::Record) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: rec.value,
        mod_rev: rec.header.mod_rev,
        create_rev: rec.header.create_rev,
        version: rec.header.version,
        lease: rec.header.lease,
    }
}

fn lease_index_key(id: LeaseId, key: &str) -> String {
    format!("{id:016x}/{key}")
}

/// The lease recorded in a stored record. An undecodable record counts as having none: the
/// caller is overwriting or deleting it anyway, and `end_lease` re-checks before deleting.
fn stored_lease(key: &str, bytes: &[u8]) -> Option<LeaseId> {
    match record::decode_header(key, bytes) {
        Ok(h) => h.lease,
        Err(e) => {
            tracing::warn!(error = %e, "replacing an undecodable record");
            None
        }
    }
}

/// Deletes leases when they expire. Holds only weak references, so it never keeps the store (and
/// its file) open; it ends when the store is dropped.
async fn reap_loop(store: Weak<RedbStore>, wake: Arc<Notify>) {
    loop {
        let next = match store.upgrade() {
            Some(store) => store.shared.next_deadline(),
            None => return,
        };
        match next {
            Some(deadline) => {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
        let Some(store) = store.upgrade() else {
            return;
        };
        let now = Instant::now();
        if store.shared.any_expired(now)
            && let Err(e) = store.reap(now).await
        {
            tracing::warn!(error = %e, "lease expiry pass failed; retrying");
            drop(store);
            tokio::time::sleep(Duration::from_millis(REAP_RETRY_DELAY_MS)).await;
        }
    }
}

impl Store for RedbStore {
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>, StoreError>> {
        Box::pin(std::future::ready(self.get_now(key)))
    }

    fn range_at(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        rev: Option<Rev>,
    ) -> BoxFuture<'_, Result<Page, StoreError>> {
        Box::pin(std::future::ready(
            self.range_at_now(prefix, after, limit, rev),
        ))
    }

    fn range_tail(
        &self,
        prefix: &str,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<KeyValue>, StoreError>> {
        Box::pin(std::future::ready(self.range_tail_now(prefix, limit)))
    }

    fn rev(&self) -> BoxFuture<'_, Result<Rev, StoreError>> {
        Box::pin(std::future::ready(Ok(self
            .shared
            .rev
            .load(Ordering::Acquire))))
    }

    fn watch_from(
        &self,
        prefix: &str,
        start: Option<Rev>,
    ) -> BoxFuture<'_, Result<mpsc::Receiver<WatchEvent>, StoreError>> {
        Box::pin(std::future::ready(self.watch_now(prefix, start)))
    }

    fn compact(&self, rev: Rev) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(self.compact_now(rev)))
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, StoreError>> {
        Box::pin(async move {
            txn.validate()?;
            let now = Instant::now();
            match self
                .request(|reply| Request::Txn { txn, now, reply })
                .await?
            {
                Reply::Txn(result) => Ok(result),
                _ => Err(unexpected_reply()),
            }
        })
    }

    fn txn_many(&self, txns: Vec<Txn>) -> BoxFuture<'_, Vec<Result<TxnResult, StoreError>>> {
        Box::pin(async move {
            // Queue them all before waiting, so they can share a group commit.
            let mut answers = Vec::with_capacity(txns.len());
            for txn in txns {
                let answer = match txn.validate() {
                    Ok(()) => {
                        let now = Instant::now();
                        self.enqueue(|reply| Request::Txn { txn, now, reply }).await
                    }
                    Err(e) => Err(e),
                };
                answers.push(answer);
            }
            let mut results = Vec::with_capacity(answers.len());
            for answer in answers {
                let result = match answer {
                    Ok(answer) => match answer.await {
                        Ok(Ok(Reply::Txn(result))) => Ok(result),
                        Ok(Ok(_)) => Err(unexpected_reply()),
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(StoreError::Closed),
                    },
                    Err(e) => Err(e),
                };
                results.push(result);
            }
            results
        })
    }

    fn txn_atomic(&self, txns: Vec<Txn>) -> BoxFuture<'_, Result<Vec<TxnResult>, StoreError>> {
        Box::pin(async move {
            for txn in &txns {
                txn.validate()?;
            }
            let now = Instant::now();
            match self
                .request(|reply| Request::Atomic { txns, now, reply })
                .await?
            {
                Reply::Txns(results) => Ok(results),
                _ => Err(unexpected_reply()),
            }
        })
    }

    fn lease_grant(&self, ttl_ms: u64) -> BoxFuture<'_, Result<LeaseId, StoreError>> {
        Box::pin(async move {
            if ttl_ms == 0 || ttl_ms > MAX_LEASE_TTL_MS {
                return Err(StoreError::InvalidRequest(format!(
                    "lease TTL {ttl_ms} ms is outside 1..={MAX_LEASE_TTL_MS} ms"
                )));
            }
            self.ensure_reaper();
            let now = Instant::now();
            match self
                .request(|reply| Request::Grant { ttl_ms, now, reply })
                .await?
            {
                Reply::Lease(id) => Ok(id),
                _ => Err(unexpected_reply()),
            }
        })
    }

    fn lease_keepalive(&self, id: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            self.ensure_reaper();
            let now = Instant::now();
            let mut leases = lock(&self.shared.leases);
            match leases.get_mut(&id) {
                Some(lease) if lease.live(now) => {
                    lease.deadline = now + lease.ttl;
                    Ok(())
                }
                _ => Err(StoreError::LeaseNotFound(id)),
            }
        })
    }

    fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            self.request(|reply| Request::Revoke { id, now, reply })
                .await
                .map(|_| ())
        })
    }
}
