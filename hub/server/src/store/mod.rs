//! Durable hub state: the `Store` trait (shaped after etcd's KV, txn, watch and lease APIs) and its embedded redb implementation.
//!
//! Everything the hub accepts goes through [`Store::txn`], which resolves only once the write is
//! fsynced. The embedded implementation, [`RedbStore`], funnels all writes into one writer thread
//! that applies every queued txn in one redb write transaction and commits once (group commit),
//! because one fsync costs ~5 ms on the target machine: committing each transition on its own
//! caps the hub at ~190 durable writes/s.
//!
//! The trait is etcd-shaped (revisions, compares on value, version and revision, prefix watch,
//! leases with a TTL) and async throughout, so both backends — the embedded [`RedbStore`] and
//! [`EtcdStore`] — implement one contract, checked by the same tests (`tests/store_contract.rs`).

mod etcd_batch;
mod etcd_retry;
mod etcd_store;
mod history;
mod json;
mod location;
mod migrate;
mod record;
mod redb_store;

use std::future::Future;
use std::pin::Pin;

use tokio::sync::mpsc;

pub use etcd_batch::{BATCH_PREFIX, MAX_OPS_PER_CHUNK, MAX_TXN_BYTES, Recovered};
pub use etcd_store::{EtcdOptions, EtcdStore, MAX_RESPONSE_BYTES, RANGE_CHUNK_KEYS};
pub use history::{MAX_HISTORY_BYTES, MAX_HISTORY_CHANGES};
pub use json::{decode_json, get_json, put_json, put_json_with_lease, range_json};
pub use location::{MAX_ETCD_ENDPOINTS, StoreLocation};
pub use migrate::{Migrated, migrate};
pub use redb_store::{
    DB_FILE_NAME, MAX_BATCH_TXNS, MAX_LEASE_TTL_MS, MAX_LEASES, MAX_WATCHERS, QUEUE_CAPACITY,
    RedbStore, WATCH_CHANNEL_CAPACITY,
};

/// Store-wide revision. Every committed txn that changes at least one key takes the next
/// revision, and all its changes carry it (like etcd's `mod_revision`). Revision 0 means "nothing
/// written yet".
pub type Rev = u64;

/// Identifies a lease. Ids start at 1 and are never reused within one data directory.
pub type LeaseId = u64;

/// The boxed future the object-safe [`Store`] methods return, so the hub can hold `Arc<dyn Store>`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Longest key, in bytes. Keys are paths like `workloads/<team>/<id>`; 1 KiB is ten times the
/// longest path the hub builds, and keeps index entries small.
pub const MAX_KEY_BYTES: usize = 1024;

/// Largest value, in bytes: etcd's default request limit (1.5 MiB), so data that fits here also
/// fits an etcd backend.
pub const MAX_VALUE_BYTES: usize = 1536 * 1024;

/// Most compares plus ops in one txn: etcd's default `--max-txn-ops` (128), for the same reason.
pub const MAX_OPS_PER_TXN: usize = 128;

/// One key with its value and metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// Revision of the txn that last wrote this key.
    pub mod_rev: Rev,
    /// Revision of the txn that created it (its first put since it was last absent).
    pub create_rev: Rev,
    /// Puts since it was created: 1 after the first (etcd's `version`).
    pub version: u64,
    /// The lease the key is attached to: the key is deleted when the lease expires or is revoked.
    pub lease: Option<LeaseId>,
}

/// A condition on one key, checked when the txn is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key does not exist.
    Absent,
    /// The key exists (any revision).
    Present,
    /// The key exists and was last written at exactly this revision (compare-and-swap).
    ModRev(Rev),
    /// The key exists and has exactly this many puts since its creation.
    Version(u64),
    /// The key exists and holds exactly these bytes.
    Value(Vec<u8>),
}

impl Compare {
    /// Whether the condition holds for the key's current state (`None`: absent).
    pub fn holds(&self, kv: Option<&KeyValue>) -> bool {
        match (self, kv) {
            (Compare::Absent, kv) => kv.is_none(),
            (_, None) => false,
            (Compare::Present, Some(_)) => true,
            (Compare::ModRev(r), Some(kv)) => kv.mod_rev == *r,
            (Compare::Version(v), Some(kv)) => kv.version == *v,
            (Compare::Value(v), Some(kv)) => &kv.value == v,
        }
    }
}

/// One write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    },
    Delete {
        key: String,
    },
}

impl Op {
    /// A put without a lease.
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease: None,
        }
    }

    /// A put attached to a lease.
    pub fn put_with_lease(
        key: impl Into<String>,
        value: impl Into<Vec<u8>>,
        lease: LeaseId,
    ) -> Self {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease: Some(lease),
        }
    }

    /// A delete (a no-op if the key is absent).
    pub fn delete(key: impl Into<String>) -> Self {
        Op::Delete { key: key.into() }
    }

    /// The key this op writes.
    pub fn key(&self) -> &str {
        match self {
            Op::Put { key, .. } | Op::Delete { key } => key,
        }
    }
}

/// An etcd-like transaction: if every compare holds, apply `success`, else apply `failure`.
/// Ops apply in order; all changes of one txn share one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<(String, Compare)>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a compare.
    pub fn when(mut self, key: impl Into<String>, compare: Compare) -> Self {
        self.compares.push((key.into(), compare));
        self
    }

    /// Adds an op to the success branch.
    pub fn and_then(mut self, op: Op) -> Self {
        self.success.push(op);
        self
    }

    /// Adds an op to the failure branch.
    pub fn or_else(mut self, op: Op) -> Self {
        self.failure.push(op);
        self
    }

    /// Checks the txn against the store's limits; the same check for every backend.
    pub fn validate(&self) -> Result<(), StoreError> {
        let ops = self.compares.len() + self.success.len() + self.failure.len();
        if ops > MAX_OPS_PER_TXN {
            return Err(StoreError::InvalidRequest(format!(
                "txn has {ops} compares and ops, more than the limit of {MAX_OPS_PER_TXN}"
            )));
        }
        let keys = self
            .compares
            .iter()
            .map(|(key, _)| key.as_str())
            .chain(self.success.iter().chain(&self.failure).map(Op::key));
        for key in keys {
            validate_key(key)?;
        }
        for op in self.success.iter().chain(&self.failure) {
            if let Op::Put { key, value, .. } = op
                && value.len() > MAX_VALUE_BYTES
            {
                return Err(StoreError::InvalidRequest(format!(
                    "value of {key:?} has {} bytes, more than the limit of {MAX_VALUE_BYTES}",
                    value.len()
                )));
            }
        }
        Ok(())
    }
}

fn validate_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() {
        return Err(StoreError::InvalidRequest("empty key".to_owned()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(StoreError::InvalidRequest(format!(
            "key of {} bytes is longer than the limit of {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    Ok(())
}

/// Keys of a range read at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub kvs: Vec<KeyValue>,
    /// The revision the keys were read at: pass it to the next page's
    /// [`Store::range_at`] so every page shows one state.
    pub rev: Rev,
}

/// The outcome of a txn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnResult {
    /// Whether all compares held (the success branch was applied).
    pub succeeded: bool,
    /// The txn's revision if it changed a key, else the store's revision when it was evaluated.
    pub rev: Rev,
}

/// A change seen by a watcher. Delivered in commit order, after the commit is durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    Put(KeyValue),
    Delete { key: String, rev: Rev },
}

impl WatchEvent {
    pub fn key(&self) -> &str {
        match self {
            WatchEvent::Put(kv) => &kv.key,
            WatchEvent::Delete { key, .. } => key,
        }
    }

    pub fn rev(&self) -> Rev {
        match self {
            WatchEvent::Put(kv) => kv.mod_rev,
            WatchEvent::Delete { rev, .. } => *rev,
        }
    }
}

/// Store failures. Messages are strings so one failed group commit can be reported to every
/// caller in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The storage backend failed (disk, file lock, commit). The write did not happen.
    #[error("store I/O error while {context}: {message}")]
    Io {
        context: &'static str,
        message: String,
    },
    /// Stored bytes could not be decoded: a broken invariant or a damaged file.
    #[error("corrupt store record {key:?}: {message}")]
    Corrupt { key: String, message: String },
    /// The data was written by a newer store format than this binary understands.
    #[error("store format version {found} is newer than the supported version {supported}")]
    UnsupportedFormat { found: u64, supported: u64 },
    /// The store is shut down.
    #[error("store is closed")]
    Closed,
    /// The lease does not exist, has expired or was revoked.
    #[error("lease {0} not found (expired, revoked or never granted)")]
    LeaseNotFound(LeaseId),
    /// The revision was compacted away: its state and its changes are no longer kept. Read at
    /// the current revision (re-list) and watch from there.
    #[error(
        "revision {rev} is compacted (its changes are no longer kept); re-list at the current revision"
    )]
    Compacted { rev: Rev },
    /// The revision is newer than anything committed.
    #[error("revision {rev} is in the future (the store is at revision {current})")]
    FutureRevision { rev: Rev, current: Rev },
    /// The request breaks a limit or is malformed. Nothing was written.
    #[error("invalid store request: {0}")]
    InvalidRequest(String),
    /// Too many open watches.
    #[error("too many watchers (limit {0})")]
    TooManyWatchers(usize),
    /// This hub's fencing token no longer holds: another replica leads now, so nothing was
    /// written and nothing this hub writes will be until it is elected again.
    #[error("fenced: this hub no longer leads (the leader key's revision is no longer {rev})")]
    Fenced { rev: Rev },
    /// A typed value could not be serialized.
    #[error("cannot encode value for {key:?}: {message}")]
    Encode { key: String, message: String },
    /// A stored value did not deserialize into the requested type.
    #[error("cannot decode value of {key:?}: {message}")]
    Decode { key: String, message: String },
}

impl StoreError {
    /// Whether retrying the same request may succeed (the backend, not the request, failed).
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Io { .. })
    }
}

/// The hub's durable state: an ordered key space with revisions, CAS txns, prefix watches and
/// leases. Object safe: hold it as `Arc<dyn Store>`. Every call is async: the embedded backend
/// answers reads at once, etcd over the network.
pub trait Store: Send + Sync + 'static {
    /// The current value of a key. Reads see only durable commits.
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>, StoreError>>;

    /// All keys starting with `prefix`, sorted by key, as of one revision. The result is
    /// unbounded: callers range over prefixes whose size the hub's admission limits already
    /// bound (a backend reads it in chunks if it must, at one revision).
    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<KeyValue>, StoreError>> {
        self.range_page(prefix, None, usize::MAX)
    }

    /// At most `limit` keys starting with `prefix` and sorting after `after`
    /// (from the first key when `None`), sorted by key: a paginated range.
    fn range_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<KeyValue>, StoreError>> {
        let fut = self.range_at(prefix, after, limit, None);
        Box::pin(async move { fut.await.map(|page| page.kvs) })
    }

    /// Like [`Store::range_page`], as of revision `rev` (the current one when `None`), and
    /// says which revision it read: a paginated read whose pages all show one state passes
    /// the first page's revision to the next ones. A revision older than the store keeps
    /// fails with [`StoreError::Compacted`], one not yet committed with
    /// [`StoreError::FutureRevision`].
    fn range_at(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        rev: Option<Rev>,
    ) -> BoxFuture<'_, Result<Page, StoreError>>;

    /// The last `limit` keys starting with `prefix`, sorted by key.
    fn range_tail(
        &self,
        prefix: &str,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<KeyValue>, StoreError>>;

    /// Revision of the latest durable commit.
    fn rev(&self) -> BoxFuture<'_, Result<Rev, StoreError>>;

    /// Applies a txn. Resolves once the change is durable (fsynced).
    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, StoreError>>;

    /// Applies txns in order, as if each were passed to [`Store::txn`] in turn, typically in one
    /// group commit. One result per txn, in order.
    fn txn_many(&self, txns: Vec<Txn>) -> BoxFuture<'_, Vec<Result<TxnResult, StoreError>>>;

    /// Applies txns in order as ONE atomic, durable change: after a crash
    /// either all of them are there or none. This is how the hub commits a
    /// batch larger than [`MAX_OPS_PER_TXN`]. Each txn is validated first;
    /// if one fails, none is applied.
    fn txn_atomic(&self, txns: Vec<Txn>) -> BoxFuture<'_, Result<Vec<TxnResult>, StoreError>>;

    /// Subscribes to changes of keys starting with `prefix`, from the next commit on, in commit
    /// order. A watcher that falls [`WATCH_CHANNEL_CAPACITY`] events behind is dropped: its
    /// receiver then ends, and the consumer must re-list with [`Store::range`] and watch again
    /// (watch first, then range, so no change falls in between).
    fn watch(&self, prefix: &str) -> BoxFuture<'_, Result<mpsc::Receiver<WatchEvent>, StoreError>> {
        self.watch_from(prefix, None)
    }

    /// Like [`Store::watch`], starting at revision `start`: the changes committed at `start`
    /// and after are delivered first (in commit order), then the new ones, so range at `R`
    /// then watch from `R + 1` misses nothing. `None` starts at the next commit; a revision
    /// not yet committed, at that revision. A start whose changes are compacted away fails with
    /// [`StoreError::Compacted`].
    fn watch_from(
        &self,
        prefix: &str,
        start: Option<Rev>,
    ) -> BoxFuture<'_, Result<mpsc::Receiver<WatchEvent>, StoreError>>;

    /// Forgets the changes at and before `rev`: reads at older revisions and watches from
    /// them fail with [`StoreError::Compacted`] from then on. Bounds the history a backend
    /// keeps (etcd keeps every revision until compacted).
    fn compact(&self, rev: Rev) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Grants a lease that expires `ttl_ms` after the grant unless kept alive.
    fn lease_grant(&self, ttl_ms: u64) -> BoxFuture<'_, Result<LeaseId, StoreError>>;

    /// Restarts the lease's TTL. Fails with [`StoreError::LeaseNotFound`] if it already expired.
    fn lease_keepalive(&self, id: LeaseId) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Ends the lease now and deletes the keys attached to it.
    fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'_, Result<(), StoreError>>;
}
