//! `Snapshot`: a read-only [`Store`] over keys held in memory at one revision, such as the
//! copy a follower replica keeps warm (see `crate::ha::mirror`). The hub restores from it
//! as from the store itself; every write, watch or lease call is refused.

use std::collections::BTreeMap;
use std::ops::Bound;

use tokio::sync::mpsc;

use super::{
    BoxFuture, KeyValue, LeaseId, Page, Rev, Store, StoreError, Txn, TxnResult, WatchEvent,
};

/// Keys at one revision.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub kvs: BTreeMap<String, KeyValue>,
    pub rev: Rev,
}

fn read_only<T>() -> Result<T, StoreError> {
    Err(StoreError::InvalidRequest(
        "a snapshot is read-only".to_string(),
    ))
}

impl Snapshot {
    fn check(&self, rev: Option<Rev>) -> Result<(), StoreError> {
        match rev {
            Some(r) if r < self.rev => Err(StoreError::Compacted { rev: r }),
            Some(r) if r > self.rev => Err(StoreError::FutureRevision {
                rev: r,
                current: self.rev,
            }),
            _ => Ok(()),
        }
    }

    fn in_prefix<'a>(
        &'a self,
        prefix: &'a str,
        start: Bound<&'a str>,
    ) -> impl Iterator<Item = &'a KeyValue> + 'a {
        self.kvs
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(_, kv)| kv)
    }
}

impl Store for Snapshot {
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>, StoreError>> {
        let kv = self.kvs.get(key).cloned();
        Box::pin(std::future::ready(Ok(kv)))
    }

    fn range_at(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        rev: Option<Rev>,
    ) -> BoxFuture<'_, Result<Page, StoreError>> {
        let result = self.check(rev).map(|()| {
            let start = match after {
                Some(a) if a >= prefix => Bound::Excluded(a),
                _ => Bound::Included(prefix),
            };
            Page {
                kvs: self.in_prefix(prefix, start).take(limit).cloned().collect(),
                rev: self.rev,
            }
        });
        Box::pin(std::future::ready(result))
    }

    fn range_tail(
        &self,
        prefix: &str,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<KeyValue>, StoreError>> {
        let all: Vec<&KeyValue> = self.in_prefix(prefix, Bound::Included(prefix)).collect();
        let skip = all.len().saturating_sub(limit);
        let out = all[skip..].iter().map(|kv| (*kv).clone()).collect();
        Box::pin(std::future::ready(Ok(out)))
    }

    fn rev(&self) -> BoxFuture<'_, Result<Rev, StoreError>> {
        Box::pin(std::future::ready(Ok(self.rev)))
    }

    fn txn(&self, _: Txn) -> BoxFuture<'_, Result<TxnResult, StoreError>> {
        Box::pin(std::future::ready(read_only()))
    }

    fn txn_many(&self, txns: Vec<Txn>) -> BoxFuture<'_, Vec<Result<TxnResult, StoreError>>> {
        Box::pin(std::future::ready(
            txns.iter().map(|_| read_only()).collect(),
        ))
    }

    fn txn_atomic(&self, _: Vec<Txn>) -> BoxFuture<'_, Result<Vec<TxnResult>, StoreError>> {
        Box::pin(std::future::ready(read_only()))
    }

    fn watch_from(
        &self,
        _: &str,
        _: Option<Rev>,
    ) -> BoxFuture<'_, Result<mpsc::Receiver<WatchEvent>, StoreError>> {
        Box::pin(std::future::ready(read_only()))
    }

    fn compact(&self, _: Rev) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(read_only()))
    }

    fn lease_grant(&self, _: u64) -> BoxFuture<'_, Result<LeaseId, StoreError>> {
        Box::pin(std::future::ready(read_only()))
    }

    fn lease_keepalive(&self, _: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(read_only()))
    }

    fn lease_revoke(&self, _: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(read_only()))
    }
}
