//! `EtcdStore`: the [`Store`] contract on an etcd v3 cluster (etcd-client over tonic, TLS by
//! rustls), for hubs whose state must outlive one machine.
//!
//! # Keys
//! Every key is stored under [`EtcdOptions::prefix`] (default `/axle/`), so several Axle
//! installations, or tests, can share one etcd cluster; the prefix never appears in what the
//! store returns.
//!
//! # Semantics, as the contract says
//! - Revisions, `create_rev`, `version` and leases are etcd's own.
//! - [`Compare`] maps to etcd compares: `Absent` is `version == 0`, `Present` is `version > 0`,
//!   `ModRev`, `Version` and `Value` compare the same field (etcd fails a value compare on an
//!   absent key, as the contract does).
//! - A watch is created (etcd confirmed it) before [`Store::watch`] returns, so a change
//!   committed after the call is always delivered. A watcher that falls
//!   [`WATCH_CHANNEL_CAPACITY`] events behind is dropped, as with the embedded store.
//! - Lease TTLs are whole seconds in etcd: a TTL in ms is rounded up.
//! - At most [`MAX_WATCHERS`] watches are open at once, as with the embedded store.
//!
//! # Fencing
//! A hub replica that leads holds a fencing token: the revision of the leader key it created
//! (see `crate::ha`). [`EtcdStore::fence`] makes every txn this store sends conditional on
//! the key still having that revision, as an outer etcd txn around the caller's, so a deposed
//! leader (paused, partitioned, slow) can never write: its txns fail with
//! [`StoreError::Fenced`] and it steps down.
//!
//! # Batches larger than one etcd txn
//! etcd refuses a txn with more than `--max-txn-ops` operations (128 by default, our
//! [`MAX_OPS_PER_TXN`](super::MAX_OPS_PER_TXN)) or more than `--max-request-bytes` (1.5 MiB). [`Store::txn_atomic`]
//! folds the batch to the last write of each key (etcd also refuses two writes of one key in
//! one txn) and commits it as one etcd txn when it fits. A batch that does not fit is committed
//! through a durable intent (`etcd_batch.rs`): its ops are written as parts under
//! `_batch/<id>/`, then a commit marker (the commit point), then the ops themselves in
//! chunks, then the intent is deleted. A crash before the marker leaves parts that restore
//! drops; a crash after it leaves a marker that restore replays
//! ([`EtcdStore::recover_batches`], run by a new leader before it loads its state), so a
//! batch is all there or not at all.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, CompareOp, ConnectOptions, EventType, GetOptions, Identity, KvClient,
    PutOptions, SortOrder, SortTarget, TlsOptions, TxnOp, WatchClient, WatchOptions,
};
use tokio::sync::mpsc;

use super::etcd_retry::{retry_fenced, retry_while, unsent_retry};
use super::{
    BoxFuture, Compare, KeyValue, LeaseId, MAX_LEASE_TTL_MS, MAX_WATCHERS, Op, Page, Rev, Store,
    StoreError, Txn, TxnResult, WATCH_CHANNEL_CAPACITY, WatchEvent,
};

/// Largest etcd response this store accepts (gRPC's default is 4 MiB, which ~6,000 workload
/// records exceed: a hub could not restore from a range answered in one message). Ranges
/// are read in chunks of [`RANGE_CHUNK_KEYS`]; 64 MiB holds a chunk of records of ~64 KiB
/// each, and a chunk that is larger is read again in halves.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Keys one etcd range call asks for: a range over more keys is several calls at one
/// revision, so it shows one state however large it is.
pub const RANGE_CHUNK_KEYS: usize = 1024;

/// Time to connect to an etcd member: members are in the same region as the hub; beyond a few
/// seconds the member is down and the client tries the next endpoint.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest wait for one etcd call: a healthy cluster answers in milliseconds and a leader
/// election takes about a second; past 10 s the hub reports the store unavailable.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/2 keep-alive to the members, so a partitioned connection is noticed and replaced
/// (tonic does not notice by itself).
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// How to reach the etcd cluster.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Client URLs of the members, e.g. `http://10.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Every key is kept under this prefix.
    pub prefix: String,
    /// PEM of the CA that signed the members' certificates (TLS when set).
    pub ca_pem: Option<Vec<u8>>,
    /// PEM certificate and key this hub presents to etcd (client certificate auth).
    pub client_cert_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl EtcdOptions {
    /// Plain connections to `endpoints` under the default prefix `/axle/`.
    pub fn new(endpoints: Vec<String>) -> EtcdOptions {
        EtcdOptions {
            endpoints,
            prefix: "/axle/".to_string(),
            ca_pem: None,
            client_cert_pem: None,
        }
    }
}

/// See the module documentation.
pub struct EtcdStore {
    pub(super) client: Client,
    /// Reads and txns, accepting responses up to [`MAX_RESPONSE_BYTES`].
    kv: KvClient,
    /// Watches, likewise (a watch from a past revision replays in large responses).
    watch: WatchClient,
    pub(super) prefix: String,
    /// Open watches (each a task and an etcd stream), at most [`MAX_WATCHERS`].
    watchers: Arc<AtomicUsize>,
    /// The fencing token every txn is conditional on, while this hub leads.
    fence: std::sync::RwLock<Option<Fence>>,
    /// Atomic batches committed through an intent, for their ids.
    pub(super) batches: std::sync::atomic::AtomicU64,
    /// Test hook: the number of etcd writes an intent batch may still make before it acts as
    /// if the hub crashed (see [`EtcdStore::crash_after_writes`]).
    pub(super) crash_after: std::sync::Mutex<Option<usize>>,
}

/// A leader's fencing token: the full leader key and the revision it was created at.
#[derive(Debug, Clone)]
struct Fence {
    key: Vec<u8>,
    rev: Rev,
}

fn io(context: &'static str) -> impl Fn(etcd_client::Error) -> StoreError {
    move |e| StoreError::Io {
        context,
        message: e.to_string(),
    }
}

/// An etcd key-value as the contract's, its key without Axle's `prefix`.
fn key_value(prefix: &str, kv: &etcd_client::KeyValue) -> Result<KeyValue, StoreError> {
    Ok(KeyValue {
        key: unprefixed(prefix, kv)?.to_string(),
        value: kv.value().to_vec(),
        mod_rev: kv.mod_revision() as Rev,
        create_rev: kv.create_revision() as Rev,
        version: kv.version() as u64,
        lease: (kv.lease() != 0).then_some(kv.lease() as LeaseId),
    })
}

/// The key of `kv` without Axle's `prefix`.
fn unprefixed<'k>(prefix: &str, kv: &'k etcd_client::KeyValue) -> Result<&'k str, StoreError> {
    kv.key()
        .strip_prefix(prefix.as_bytes())
        .and_then(|k| std::str::from_utf8(k).ok())
        .ok_or_else(|| StoreError::Corrupt {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            message: "a key outside Axle's prefix, or not UTF-8".to_string(),
        })
}

/// The first key after every key starting with `prefix` (etcd's range end for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: the range runs to the end of the key space.
    vec![0]
}

impl EtcdStore {
    /// Connects to the cluster (one member answering is enough).
    pub async fn connect(o: EtcdOptions) -> Result<EtcdStore, StoreError> {
        if o.endpoints.is_empty() {
            return Err(StoreError::InvalidRequest(
                "no etcd endpoints given".to_string(),
            ));
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if o.ca_pem.is_some() || o.client_cert_pem.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &o.ca_pem {
                tls = tls.ca_certificate(Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = &o.client_cert_pem {
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            options = options.with_tls(tls);
        }
        let client = Client::connect(&o.endpoints, Some(options))
            .await
            .map_err(io("connecting to etcd"))?;
        let store = EtcdStore {
            kv: client
                .kv_client()
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
            watch: client
                .watch_client()
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
            client,
            prefix: o.prefix,
            watchers: Arc::default(),
            fence: std::sync::RwLock::new(None),
            batches: Default::default(),
            crash_after: std::sync::Mutex::new(None),
        };
        // A first call, so a cluster that is not there (or refuses this hub's TLS) fails
        // here, not at the first write.
        store.current_rev().await.map_err(|e| match e {
            StoreError::Io { message, .. } => StoreError::Io {
                context: "connecting to etcd",
                message,
            },
            e => e,
        })?;
        Ok(store)
    }

    /// From now on every txn writes only while `key` was last written at `rev`: this hub's
    /// fencing token as leader. Replaces any earlier token.
    pub fn fence(&self, key: &str, rev: Rev) {
        let fence = Fence {
            key: self.full(key),
            rev,
        };
        *self.fence.write().unwrap_or_else(|p| p.into_inner()) = Some(fence);
    }

    /// Txns are no longer conditional on a fencing token (the hub stepped down).
    pub fn unfence(&self) {
        *self.fence.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The fencing token's revision, if any.
    pub fn fenced_at(&self) -> Option<Rev> {
        self.fence
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|f| f.rev)
    }

    /// Test hook: an intent batch (one above one etcd txn) makes at most `writes` more etcd
    /// writes, then fails as if the hub had died there; `None` turns it off. Tests use it to
    /// show that a crash between a batch's parts loses nothing acknowledged.
    #[doc(hidden)]
    pub fn crash_after_writes(&self, writes: Option<usize>) {
        *self.crash_after.lock().unwrap_or_else(|p| p.into_inner()) = writes;
    }

    pub(super) fn full(&self, key: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(self.prefix.as_bytes());
        k.extend_from_slice(key.as_bytes());
        k
    }

    fn kv_of(&self, kv: &etcd_client::KeyValue) -> Result<KeyValue, StoreError> {
        key_value(&self.prefix, kv)
    }

    async fn current_rev(&self) -> Result<Rev, StoreError> {
        let key = self.full("");
        let resp = unsent_retry(|| {
            let (mut c, key) = (self.kv.clone(), key.clone());
            async move { c.get(key, Some(GetOptions::new().with_count_only())).await }
        })
        .await
        .map_err(io("reading the revision"))?;
        Ok(resp.header().map_or(0, |h| h.revision()) as Rev)
    }

    /// Up to `limit` keys in `[start, end)`, in `order`, at revision `rev` (the current one
    /// when `None`), read in chunks at one revision; returns the revision read.
    async fn range_opts(
        &self,
        mut start: Vec<u8>,
        mut end: Vec<u8>,
        limit: usize,
        order: SortOrder,
        rev: Option<Rev>,
    ) -> Result<Page, StoreError> {
        if limit == 0 {
            // Nothing to read: answer for the revision as a read would.
            let current = self.current_rev().await?;
            return match rev {
                Some(rev) if rev > current => Err(StoreError::FutureRevision { rev, current }),
                rev => Ok(Page {
                    kvs: Vec::new(),
                    rev: rev.unwrap_or(current),
                }),
            };
        }
        let mut out = Vec::new();
        let mut at = rev;
        let mut chunk = RANGE_CHUNK_KEYS;
        while out.len() < limit {
            let want = chunk.min(limit - out.len());
            let mut opts = GetOptions::new()
                .with_range(end.clone())
                .with_sort(SortTarget::Key, order)
                .with_limit(i64::try_from(want).unwrap_or(i64::MAX));
            if let Some(r) = at {
                opts = opts.with_revision(i64::try_from(r).unwrap_or(i64::MAX));
            }
            let resp = unsent_retry(|| {
                let (mut c, start, opts) = (self.kv.clone(), start.clone(), opts.clone());
                async move { c.get(start, Some(opts)).await }
            })
            .await;
            let resp = match resp {
                Ok(r) => r,
                Err(e) if too_large(&e) && chunk > 1 => {
                    chunk /= 2;
                    continue;
                }
                Err(e) => {
                    return Err(match at {
                        Some(rev) => self.revision_error(e, rev, "ranging over keys").await,
                        None => io("ranging over keys")(e),
                    });
                }
            };
            let read_at = resp.header().map_or(0, |h| h.revision()) as Rev;
            let read_at = *at.get_or_insert(read_at);
            let kvs = resp.kvs();
            for kv in kvs {
                out.push(self.kv_of(kv)?);
            }
            match kvs.last() {
                Some(last) if resp.more() => match order {
                    SortOrder::Ascend => {
                        start = last.key().to_vec();
                        start.push(0);
                    }
                    _ => end = last.key().to_vec(),
                },
                _ => {
                    return Ok(Page {
                        kvs: out,
                        rev: read_at,
                    });
                }
            }
        }
        // Full after at least one read, which set `at`.
        Ok(Page {
            kvs: out,
            rev: at.unwrap_or_default(),
        })
    }

    /// A call at revision `rev` that etcd refused: the revision is compacted away or not
    /// written yet (then with the current revision); anything else is I/O.
    async fn revision_error(
        &self,
        e: etcd_client::Error,
        rev: Rev,
        context: &'static str,
    ) -> StoreError {
        let text = e.to_string();
        if text.contains("required revision has been compacted") {
            StoreError::Compacted { rev }
        } else if text.contains("required revision is a future revision") {
            match self.current_rev().await {
                Ok(current) => StoreError::FutureRevision { rev, current },
                Err(e) => e,
            }
        } else {
            io(context)(e)
        }
    }

    fn etcd_txn(&self, txn: &Txn) -> etcd_client::Txn {
        // etcd compares an absent key as one with zero revisions and version, so
        // `ModRev(0)` or `Version(0)` would hold on it; the contract wants the key
        // present for every compare but `Absent`, hence the extra `version > 0`.
        let mut compares: Vec<etcd_client::Compare> = Vec::new();
        for (key, c) in &txn.compares {
            let k = self.full(key);
            let present = || etcd_client::Compare::version(k.clone(), CompareOp::Greater, 0);
            match c {
                Compare::Absent => {
                    compares.push(etcd_client::Compare::version(k, CompareOp::Equal, 0));
                }
                Compare::Present => compares.push(present()),
                Compare::ModRev(r) => {
                    compares.push(present());
                    compares.push(etcd_client::Compare::mod_revision(
                        k,
                        CompareOp::Equal,
                        *r as i64,
                    ));
                }
                Compare::Version(v) => {
                    compares.push(present());
                    compares.push(etcd_client::Compare::version(
                        k,
                        CompareOp::Equal,
                        *v as i64,
                    ));
                }
                Compare::Value(v) => {
                    compares.push(etcd_client::Compare::value(k, CompareOp::Equal, v.clone()));
                }
            }
        }
        let ops = |ops: &[Op]| -> Vec<TxnOp> { ops.iter().map(|op| self.etcd_op(op)).collect() };
        etcd_client::Txn::new()
            .when(compares)
            .and_then(ops(&txn.success))
            .or_else(ops(&txn.failure))
    }

    fn etcd_op(&self, op: &Op) -> TxnOp {
        match op {
            Op::Put { key, value, lease } => TxnOp::put(
                self.full(key),
                value.clone(),
                lease.map(|l| PutOptions::new().with_lease(l as i64)),
            ),
            Op::Delete { key } => TxnOp::delete(self.full(key), None),
        }
    }

    pub(super) async fn run_txn(&self, txn: Txn) -> Result<TxnResult, StoreError> {
        txn.validate()?;
        let t = self.etcd_txn(&txn);
        self.send_txn(t, &txn).await
    }

    /// Sends an etcd txn, inside the fence while there is one: the outer txn compares the
    /// leader key's revision and runs the caller's txn nested in its success branch, so a
    /// fenced-out hub changes nothing, not even a failure branch.
    pub(super) async fn send_txn(
        &self,
        t: etcd_client::Txn,
        txn: &Txn,
    ) -> Result<TxnResult, StoreError> {
        let fence = self.fence.read().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(fence) = fence else {
            let resp = unsent_retry(|| {
                let (mut c, t) = (self.kv.clone(), t.clone());
                async move { c.txn(t).await }
            })
            .await
            .map_err(|e| txn_error(txn, e))?;
            return Ok(TxnResult {
                succeeded: resp.succeeded(),
                rev: resp.header().map_or(0, |h| h.revision()) as Rev,
            });
        };
        let outer = etcd_client::Txn::new()
            .when(vec![etcd_client::Compare::mod_revision(
                fence.key,
                CompareOp::Equal,
                fence.rev as i64,
            )])
            .and_then(vec![TxnOp::txn(t)]);
        let resp = retry_while(retry_fenced, || {
            let (mut c, t) = (self.kv.clone(), outer.clone());
            async move { c.txn(t).await }
        })
        .await
        .map_err(|e| txn_error(txn, e))?;
        if !resp.succeeded() {
            return Err(StoreError::Fenced { rev: fence.rev });
        }
        let succeeded = resp.op_responses().into_iter().any(|r| match r {
            etcd_client::TxnOpResponse::Txn(inner) => inner.succeeded(),
            _ => false,
        });
        Ok(TxnResult {
            succeeded,
            rev: resp.header().map_or(0, |h| h.revision()) as Rev,
        })
    }
}

/// One of the [`MAX_WATCHERS`] open watches, given back when dropped.
struct WatchSlot(Arc<AtomicUsize>);

impl WatchSlot {
    fn take(open: &Arc<AtomicUsize>) -> Result<WatchSlot, StoreError> {
        let taken = open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < MAX_WATCHERS).then_some(n + 1)
        });
        match taken {
            Ok(_) => Ok(WatchSlot(open.clone())),
            Err(_) => Err(StoreError::TooManyWatchers(MAX_WATCHERS)),
        }
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a response was refused for its size ([`MAX_RESPONSE_BYTES`]).
fn too_large(e: &etcd_client::Error) -> bool {
    e.to_string().contains("message length too large")
}

/// A txn refused for a lease names the lease; anything else is the backend's failure.
fn txn_error(txn: &Txn, e: etcd_client::Error) -> StoreError {
    let text = e.to_string();
    if text.contains("requested lease not found") {
        let lease = txn
            .success
            .iter()
            .chain(&txn.failure)
            .find_map(|op| match op {
                Op::Put { lease, .. } => *lease,
                Op::Delete { .. } => None,
            })
            .unwrap_or(0);
        return StoreError::LeaseNotFound(lease);
    }
    StoreError::Io {
        context: "committing a txn",
        message: text,
    }
}

impl Store for EtcdStore {
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>, StoreError>> {
        let k = self.full(key);
        Box::pin(async move {
            let resp = unsent_retry(|| {
                let (mut c, k) = (self.kv.clone(), k.clone());
                async move { c.get(k, None).await }
            })
            .await
            .map_err(io("reading a key"))?;
            resp.kvs().first().map(|kv| self.kv_of(kv)).transpose()
        })
    }

    fn range_at(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        rev: Option<Rev>,
    ) -> BoxFuture<'_, Result<Page, StoreError>> {
        let p = self.full(prefix);
        let end = prefix_end(&p);
        let start = match after {
            Some(a) if a >= prefix => {
                let mut s = self.full(a);
                s.push(0);
                s
            }
            _ => p,
        };
        Box::pin(async move {
            self.range_opts(start, end, limit, SortOrder::Ascend, rev)
                .await
        })
    }

    fn range_tail(
        &self,
        prefix: &str,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<KeyValue>, StoreError>> {
        let p = self.full(prefix);
        let end = prefix_end(&p);
        Box::pin(async move {
            if limit == 0 {
                return Ok(Vec::new());
            }
            let mut out = self
                .range_opts(p, end, limit, SortOrder::Descend, None)
                .await?
                .kvs;
            out.reverse();
            Ok(out)
        })
    }

    fn rev(&self) -> BoxFuture<'_, Result<Rev, StoreError>> {
        Box::pin(self.current_rev())
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnResult, StoreError>> {
        Box::pin(self.run_txn(txn))
    }

    fn txn_many(&self, txns: Vec<Txn>) -> BoxFuture<'_, Vec<Result<TxnResult, StoreError>>> {
        Box::pin(async move {
            // In order, one after the other: each txn's compares see the ones before it.
            let mut out = Vec::with_capacity(txns.len());
            for txn in txns {
                out.push(self.run_txn(txn).await);
            }
            out
        })
    }

    fn txn_atomic(&self, txns: Vec<Txn>) -> BoxFuture<'_, Result<Vec<TxnResult>, StoreError>> {
        Box::pin(async move {
            for txn in &txns {
                txn.validate()?;
                if !txn.compares.is_empty() || !txn.failure.is_empty() {
                    return Err(StoreError::InvalidRequest(
                        "an atomic batch on etcd takes unconditional txns only".to_string(),
                    ));
                }
            }
            // Only the last write of each key counts for the batch's end state.
            let mut last: BTreeMap<&str, &Op> = BTreeMap::new();
            for op in txns.iter().flat_map(|t| &t.success) {
                last.insert(op.key(), op);
            }
            let ops: Vec<Op> = last.into_values().cloned().collect();
            let result = self.commit_batch(ops).await?;
            Ok(vec![result; txns.len()])
        })
    }

    fn watch_from(
        &self,
        prefix: &str,
        start: Option<Rev>,
    ) -> BoxFuture<'_, Result<mpsc::Receiver<WatchEvent>, StoreError>> {
        let p = self.full(prefix);
        Box::pin(async move {
            // Counted from here; the count drops when the watch's task ends
            // (or if it is never started).
            let slot = WatchSlot::take(&self.watchers)?;
            let end = prefix_end(&p);
            let mut opts = WatchOptions::new().with_range(end.clone());
            if let Some(start) = start {
                // etcd reports a compacted start only inside the stream, after confirming
                // the watch; a read at that revision answers at once (a future start is
                // fine: the watch waits for it).
                match self
                    .range_opts(p.clone(), end.clone(), 1, SortOrder::Ascend, Some(start))
                    .await
                {
                    Ok(_) | Err(StoreError::FutureRevision { .. }) => {}
                    Err(e) => return Err(e),
                }
                opts = opts.with_start_revision(i64::try_from(start).unwrap_or(i64::MAX));
            }
            let mut stream = self
                .watch
                .clone()
                .watch(p, Some(opts))
                .await
                .map_err(io("creating a watch"))?;
            // The first answer confirms the watch: from here on no commit is missed.
            match stream.message().await.map_err(io("creating a watch"))? {
                Some(r) if r.created() => {}
                _ => {
                    return Err(StoreError::Io {
                        context: "creating a watch",
                        message: "etcd did not confirm the watch".to_string(),
                    });
                }
            }
            let (tx, rx) = mpsc::channel(WATCH_CHANNEL_CAPACITY);
            let prefix = self.prefix.clone();
            tokio::spawn(async move {
                let _slot = slot;
                loop {
                    // A watcher whose receiver is gone ends here, not at
                    // the next event.
                    let next = tokio::select! {
                        next = stream.message() => next,
                        () = tx.closed() => return,
                    };
                    let Ok(Some(resp)) = next else { break };
                    if resp.canceled() {
                        break;
                    }
                    for e in resp.events() {
                        let Some(kv) = e.kv() else { continue };
                        let event = match e.event_type() {
                            EventType::Put => match key_value(&prefix, kv) {
                                Ok(kv) => WatchEvent::Put(kv),
                                Err(_) => continue,
                            },
                            EventType::Delete => match unprefixed(&prefix, kv) {
                                Ok(key) => WatchEvent::Delete {
                                    key: key.to_string(),
                                    rev: kv.mod_revision() as Rev,
                                },
                                Err(_) => continue,
                            },
                        };
                        // Full: the watcher fell behind and is dropped (it re-lists).
                        if tx.try_send(event).is_err() {
                            return;
                        }
                    }
                }
            });
            Ok(rx)
        })
    }

    fn compact(&self, rev: Rev) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let r = i64::try_from(rev).unwrap_or(i64::MAX);
            let resp = unsent_retry(|| {
                let mut c = self.kv.clone();
                async move { c.compact(r, None).await }
            })
            .await;
            let Err(e) = resp else { return Ok(()) };
            match self.revision_error(e, rev, "compacting").await {
                // Compacting again at or before the last compaction is a no-op.
                StoreError::Compacted { .. } => Ok(()),
                e => Err(e),
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
            let ttl_s = ttl_ms.div_ceil(1000) as i64;
            // A grant retried after it was applied leaves a lease nobody keeps alive: it
            // expires after its TTL.
            let resp = unsent_retry(|| {
                let mut c = self.client.clone();
                async move { c.lease_grant(ttl_s, None).await }
            })
            .await
            .map_err(io("granting a lease"))?;
            Ok(resp.id() as LeaseId)
        })
    }

    fn lease_keepalive(&self, id: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let not_found = |e: etcd_client::Error| match e {
                // etcd-client reports an expired or unknown lease as a keep-alive error.
                etcd_client::Error::LeaseKeepAliveError(m) if m.contains("lease not found") => {
                    StoreError::LeaseNotFound(id)
                }
                e => io("keeping a lease alive")(e),
            };
            let answer = unsent_retry(|| async {
                let mut c = self.client.clone();
                let (mut keeper, mut stream) = c.lease_keep_alive(id as i64).await?;
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await
            .map_err(not_found)?;
            match answer {
                Some(r) if r.ttl() > 0 => Ok(()),
                _ => Err(StoreError::LeaseNotFound(id)),
            }
        })
    }

    fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            match unsent_retry(|| {
                let mut c = self.client.clone();
                async move { c.lease_revoke(id as i64).await }
            })
            .await
            {
                Ok(_) => Ok(()),
                Err(e) if e.to_string().contains("requested lease not found") => {
                    Err(StoreError::LeaseNotFound(id))
                }
                Err(e) => Err(io("revoking a lease")(e)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_bounded_and_given_back() {
        let open = Arc::new(AtomicUsize::new(0));
        let slots: Vec<WatchSlot> = (0..MAX_WATCHERS)
            .map(|_| WatchSlot::take(&open).unwrap())
            .collect();
        assert!(matches!(
            WatchSlot::take(&open),
            Err(StoreError::TooManyWatchers(MAX_WATCHERS))
        ));
        drop(slots);
        assert_eq!(open.load(Ordering::Acquire), 0);
        assert!(WatchSlot::take(&open).is_ok());
    }

    #[test]
    fn a_prefix_ends_after_its_last_key() {
        assert_eq!(prefix_end(b"/axle/"), b"/axle0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }
}
