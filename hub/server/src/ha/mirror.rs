//! A follower's warm copy of the hub's keys: listed once, page by page at one revision,
//! then kept by a watch from the next revision. A follower that wins an election restores
//! its hub from this copy instead of reading every key from etcd again: it writes a marker
//! (fenced on its new term) and waits until the copy has seen the marker, so the copy holds
//! every write of the terms before.
//!
//! The copy is an [`imbl::OrdMap`], so a [`MirrorView`] of it costs nothing to take and
//! stays fixed while the watch goes on. A watch that ends (the follower fell behind, etcd
//! compacted past it, a member went away) makes the copy cold until it is listed again; a
//! promotion with a cold copy restores from etcd, as a replica without a mirror would.

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::RETRY_DELAY;
use crate::store::{
    BATCH_PREFIX, BoxFuture, KeyValue, LeaseId, Page, Rev, Store, StoreError, Txn, TxnResult,
    WatchEvent,
};

/// Keys read per page when listing: etcd answers a page in a few ms, and a page stays far
/// below its response limit.
pub const MIRROR_PAGE_KEYS: usize = 1024;

/// Most key and value bytes a copy holds: etcd's default backend quota (2 GiB), which the
/// live keys of a hub on a default etcd cannot exceed. A bigger copy is dropped (the
/// replica restores from etcd when it leads) and listed again only after
/// [`OVERSIZE_RETRY`].
pub const MAX_MIRROR_BYTES: usize = 2 << 30;

/// Wait before listing a copy that was too big again.
pub const OVERSIZE_RETRY: Duration = Duration::from_secs(60);

/// How long a new leader waits for its copy to reach its marker before it restores from
/// etcd instead: a warm copy is milliseconds behind.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(2);

/// The keys as of `rev` (and, while the watch runs, parts of later revisions).
#[derive(Clone, Default)]
struct Copy {
    kvs: imbl::OrdMap<String, KeyValue>,
    rev: Rev,
    bytes: usize,
}

impl Copy {
    fn apply(&mut self, e: WatchEvent) {
        self.rev = self.rev.max(e.rev());
        match e {
            WatchEvent::Put(kv) => self.put(kv),
            WatchEvent::Delete { key, .. } => {
                if let Some(old) = self.kvs.remove(&key) {
                    self.bytes -= old.key.len() + old.value.len();
                }
            }
        }
    }

    fn put(&mut self, kv: KeyValue) {
        // The parts of an atomic batch are the store's, never the hub's state.
        if kv.key.starts_with(BATCH_PREFIX) {
            return;
        }
        self.bytes += kv.key.len() + kv.value.len();
        if let Some(old) = self.kvs.insert(kv.key.clone(), kv) {
            self.bytes -= old.key.len() + old.value.len();
        }
    }
}

/// Why one listing and its watch ended.
enum Ended {
    /// The watch ended: list again at once.
    Watch,
    /// The copy passed [`MAX_MIRROR_BYTES`].
    Oversize,
}

/// The copy, kept in the background until dropped.
pub struct Mirror {
    copy: Arc<Mutex<Option<Copy>>>,
    /// The copy's revision after each change applied; 0 while cold.
    rev: watch::Receiver<Rev>,
    /// The same, for whoever shows it (0 again once the mirror is dropped).
    shown: Arc<AtomicU64>,
    /// Set when the mirror is dropped, under the lock `shown` is written
    /// under: the task, until its abort takes effect, publishes no more.
    closed: Arc<Mutex<bool>>,
    task: JoinHandle<()>,
}

impl Mirror {
    /// Starts listing `store` and following it; `shown` gets the copy's revision too.
    pub fn start(store: Arc<dyn Store>, shown: Arc<AtomicU64>) -> Mirror {
        let copy: Arc<Mutex<Option<Copy>>> = Arc::default();
        let (tx, rev) = watch::channel(0);
        let (shared, sent) = (copy.clone(), shown.clone());
        let closed = Arc::new(Mutex::new(false));
        let done = closed.clone();
        let task = tokio::spawn(async move {
            let publish = |r: Rev| {
                let done = done.lock().unwrap_or_else(|p| p.into_inner());
                if !*done {
                    tx.send_replace(r);
                    sent.store(r, Ordering::Relaxed);
                }
            };
            loop {
                let pause = match keep(store.as_ref(), &shared, &publish).await {
                    Ok(Ended::Watch) => {
                        info!("the mirror's watch ended; listing the store again");
                        Duration::ZERO
                    }
                    Ok(Ended::Oversize) => {
                        warn!(
                            "the mirror passed {MAX_MIRROR_BYTES} bytes: dropped; this replica \
                             restores from the store if it leads"
                        );
                        OVERSIZE_RETRY
                    }
                    Err(e) => {
                        warn!("the mirror cannot follow the store: {e}; listing again");
                        RETRY_DELAY
                    }
                };
                *lock(&shared) = None;
                publish(0);
                tokio::time::sleep(pause).await;
            }
        });
        Mirror {
            copy,
            rev,
            shown,
            closed,
            task,
        }
    }

    /// The copy once it has applied revision `rev`, or `None` when it does not within
    /// `timeout` (cold, or behind).
    pub async fn view_at(&self, rev: Rev, timeout: Duration) -> Option<MirrorView> {
        let mut seen = self.rev.clone();
        let reached = tokio::time::timeout(timeout, seen.wait_for(|r| *r >= rev)).await;
        if !matches!(reached, Ok(Ok(_))) {
            return None;
        }
        let copy = lock(&self.copy).clone()?;
        (copy.rev >= rev).then_some(MirrorView {
            kvs: copy.kvs,
            rev: copy.rev,
        })
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let mut closed = self.closed.lock().unwrap_or_else(|p| p.into_inner());
        *closed = true;
        self.shown.store(0, Ordering::Relaxed);
        drop(closed);
        self.task.abort();
    }
}

fn lock(m: &Mutex<Option<Copy>>) -> MutexGuard<'_, Option<Copy>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Lists the store at one revision, then applies its changes until the watch ends.
async fn keep(
    store: &dyn Store,
    shared: &Mutex<Option<Copy>>,
    publish: &impl Fn(Rev),
) -> Result<Ended, StoreError> {
    let mut copy = Copy::default();
    let mut after: Option<String> = None;
    let mut at = None;
    loop {
        let page = store
            .range_at("", after.as_deref(), MIRROR_PAGE_KEYS, at)
            .await?;
        at = Some(page.rev);
        let full = page.kvs.len() == MIRROR_PAGE_KEYS;
        for kv in page.kvs {
            after = Some(kv.key.clone());
            copy.put(kv);
        }
        if copy.bytes > MAX_MIRROR_BYTES {
            return Ok(Ended::Oversize);
        }
        if !full {
            break;
        }
    }
    copy.rev = at.unwrap_or(0);
    let mut events = store.watch_from("", Some(copy.rev + 1)).await?;
    let listed = copy.rev;
    *lock(shared) = Some(copy);
    publish(listed);
    while let Some(first) = events.recv().await {
        let now = {
            let mut guard = lock(shared);
            let Some(copy) = guard.as_mut() else {
                return Ok(Ended::Watch);
            };
            copy.apply(first);
            // Whatever else has arrived, under the same lock.
            while let Ok(e) = events.try_recv() {
                copy.apply(e);
            }
            if copy.bytes > MAX_MIRROR_BYTES {
                return Ok(Ended::Oversize);
            }
            copy.rev
        };
        publish(now);
    }
    Ok(Ended::Watch)
}

/// A fixed copy of the keys, read as a [`Store`] by the hub's restore. Read-only: every
/// write, watch and lease call is refused.
pub struct MirrorView {
    kvs: imbl::OrdMap<String, KeyValue>,
    rev: Rev,
}

impl MirrorView {
    /// The revision the copy had reached when the view was taken.
    pub fn revision(&self) -> Rev {
        self.rev
    }

    /// Keys starting with `prefix` (after `after`, when given), in key order.
    fn under<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&str>,
    ) -> impl DoubleEndedIterator<Item = &'a KeyValue> + 'a {
        let start = match after {
            Some(a) if a >= prefix => Bound::Excluded(a.to_string()),
            _ => Bound::Included(prefix.to_string()),
        };
        let end = match prefix_end(prefix) {
            Some(e) => Bound::Excluded(e),
            None => Bound::Unbounded,
        };
        self.kvs
            .range((start, end))
            .map(|(_, kv)| kv)
            .filter(move |kv| kv.key.starts_with(prefix))
    }

    fn check(&self, rev: Option<Rev>) -> Result<(), StoreError> {
        match rev {
            None => Ok(()),
            Some(r) if r == self.rev => Ok(()),
            Some(r) if r > self.rev => Err(StoreError::FutureRevision {
                rev: r,
                current: self.rev,
            }),
            Some(r) => Err(StoreError::Compacted { rev: r }),
        }
    }
}

/// The first string after every string starting with `prefix`; `None` when there is none
/// (the range runs to the end).
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        if let Some(next) = char::from_u32(last as u32 + 1) {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

fn read_only<T: Send + 'static>(what: &str) -> BoxFuture<'static, Result<T, StoreError>> {
    let e = StoreError::InvalidRequest(format!("a mirror view is read-only: cannot {what}"));
    Box::pin(async move { Err(e) })
}

impl Store for MirrorView {
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>, StoreError>> {
        let kv = self.kvs.get(key).cloned();
        Box::pin(async move { Ok(kv) })
    }

    fn range_at(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        rev: Option<Rev>,
    ) -> BoxFuture<'_, Result<Page, StoreError>> {
        let page = self.check(rev).map(|()| Page {
            kvs: self.under(prefix, after).take(limit).cloned().collect(),
            rev: self.rev,
        });
        Box::pin(async move { page })
    }

    fn range_tail(
        &self,
        prefix: &str,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<KeyValue>, StoreError>> {
        let mut kvs: Vec<KeyValue> = self
            .under(prefix, None)
            .rev()
            .take(limit)
            .cloned()
            .collect();
        kvs.reverse();
        Box::pin(async move { Ok(kvs) })
    }

    fn rev(&self) -> BoxFuture<'_, Result<Rev, StoreError>> {
        let rev = self.rev;
        Box::pin(async move { Ok(rev) })
    }

    fn txn(&self, _: Txn) -> BoxFuture<'_, Result<TxnResult, StoreError>> {
        read_only("write")
    }

    fn txn_many(&self, txns: Vec<Txn>) -> BoxFuture<'_, Vec<Result<TxnResult, StoreError>>> {
        let e = StoreError::InvalidRequest("a mirror view is read-only: cannot write".into());
        Box::pin(async move { txns.iter().map(|_| Err(e.clone())).collect() })
    }

    fn txn_atomic(&self, _: Vec<Txn>) -> BoxFuture<'_, Result<Vec<TxnResult>, StoreError>> {
        read_only("write")
    }

    fn watch_from(
        &self,
        _: &str,
        _: Option<Rev>,
    ) -> BoxFuture<'_, Result<tokio::sync::mpsc::Receiver<WatchEvent>, StoreError>> {
        read_only("watch")
    }

    fn compact(&self, _: Rev) -> BoxFuture<'_, Result<(), StoreError>> {
        read_only("compact")
    }

    fn lease_grant(&self, _: u64) -> BoxFuture<'_, Result<LeaseId, StoreError>> {
        read_only("grant a lease")
    }

    fn lease_keepalive(&self, _: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        read_only("keep a lease alive")
    }

    fn lease_revoke(&self, _: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        read_only("revoke a lease")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, rev: Rev) -> KeyValue {
        KeyValue {
            key: key.to_string(),
            value: b"v".to_vec(),
            mod_rev: rev,
            create_rev: rev,
            version: 1,
            lease: None,
        }
    }

    fn view(keys: &[&str]) -> MirrorView {
        let mut c = Copy::default();
        for (i, k) in keys.iter().enumerate() {
            c.apply(WatchEvent::Put(kv(k, i as Rev + 1)));
        }
        MirrorView {
            kvs: c.kvs,
            rev: c.rev,
        }
    }

    fn keys(kvs: &[KeyValue]) -> Vec<&str> {
        kvs.iter().map(|kv| kv.key.as_str()).collect()
    }

    #[test]
    fn a_copy_counts_its_bytes_and_skips_batch_parts() {
        let mut c = Copy::default();
        c.apply(WatchEvent::Put(kv("a", 1)));
        c.apply(WatchEvent::Put(kv("a", 2)));
        c.apply(WatchEvent::Put(kv(&format!("{BATCH_PREFIX}1/0"), 3)));
        assert_eq!((c.kvs.len(), c.bytes, c.rev), (1, 2, 3));
        c.apply(WatchEvent::Delete {
            key: "a".into(),
            rev: 4,
        });
        assert_eq!((c.kvs.len(), c.bytes, c.rev), (0, 0, 4));
    }

    #[tokio::test]
    async fn a_view_reads_prefixes_pages_and_tails() {
        let v = view(&["a/1", "a/2", "a/3", "a0", "b/1", "events/01", "events/02"]);
        let page = v.range_at("a/", None, 2, None).await.unwrap();
        assert_eq!(keys(&page.kvs), ["a/1", "a/2"]);
        let next = v.range_at("a/", Some("a/2"), 2, Some(page.rev)).await;
        assert_eq!(keys(&next.unwrap().kvs), ["a/3"]);
        assert_eq!(
            keys(&v.range("a").await.unwrap()),
            ["a/1", "a/2", "a/3", "a0"]
        );
        assert_eq!(
            keys(&v.range_tail("events/", 1).await.unwrap()),
            ["events/02"]
        );
        assert_eq!(v.range("").await.unwrap().len(), 7);
        assert!(v.get("b/1").await.unwrap().is_some());
        assert!(v.get("b/2").await.unwrap().is_none());
        assert_eq!(Store::rev(&v).await.unwrap(), 7);
        assert_eq!(v.revision(), 7);
        assert!(matches!(
            v.range_at("a/", None, 9, Some(3)).await,
            Err(StoreError::Compacted { rev: 3 })
        ));
        assert!(matches!(
            v.range_at("a/", None, 9, Some(8)).await,
            Err(StoreError::FutureRevision { rev: 8, current: 7 })
        ));
        assert!(matches!(
            v.txn(Txn::new()).await,
            Err(StoreError::InvalidRequest(m)) if m.contains("read-only")
        ));
    }

    #[test]
    fn a_prefix_ends_after_its_last_key() {
        assert_eq!(prefix_end("events/").as_deref(), Some("events0"));
        assert_eq!(prefix_end("").as_deref(), None);
    }
}
