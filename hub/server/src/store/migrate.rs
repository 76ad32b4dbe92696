//! Moving a hub from one store to another (`axle-hub migrate-store`): every record is
//! copied, key for key, into an empty destination, then counted on both sides.
//!
//! What is not copied: keys bound to a lease (replica registrations and the leader key;
//! they belong to running processes) and unfinished intents (`_batch/`, finished first when
//! the source is etcd). Revisions start afresh in the destination: the hub's records never
//! refer to store revisions.

use super::{BATCH_PREFIX, MAX_OPS_PER_TXN, Op, Store, StoreError, Txn};

/// Keys read from the source per page.
const PAGE: usize = 1_000;

/// What a migration copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migrated {
    pub keys: usize,
    pub bytes: u64,
}

/// Keys that belong to running replicas, not to the hub's state.
fn skipped(key: &str) -> bool {
    key.starts_with(BATCH_PREFIX)
        || key.starts_with(crate::ha::HUBS_PREFIX)
        || key == crate::ha::LEADER_KEY
}

/// Copies every record of `from` into `to`, which must hold none. Stop the hub (every
/// replica) first: a hub writing meanwhile would leave its last writes behind.
pub async fn migrate(from: &dyn Store, to: &dyn Store) -> Result<Migrated, StoreError> {
    if let Some(kv) = from.get(crate::ha::LEADER_KEY).await? {
        return Err(StoreError::InvalidRequest(format!(
            "a hub replica leads on the source store ({}); stop every replica first",
            String::from_utf8_lossy(&kv.value)
        )));
    }
    if let Some(kv) = to.range_page("", None, 1).await?.into_iter().next() {
        return Err(StoreError::InvalidRequest(format!(
            "the destination store is not empty (it has {:?}); migrate into an empty one",
            kv.key
        )));
    }
    let mut done = Migrated { keys: 0, bytes: 0 };
    let mut after: Option<String> = None;
    loop {
        let page = from.range_page("", after.as_deref(), PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.key.clone());
        let ops: Vec<Op> = page
            .into_iter()
            .filter(|kv| kv.lease.is_none() && !skipped(&kv.key))
            .map(|kv| {
                done.keys += 1;
                done.bytes += kv.value.len() as u64;
                Op::put(kv.key, kv.value)
            })
            .collect();
        let txns: Vec<Txn> = ops
            .chunks(MAX_OPS_PER_TXN)
            .map(|c| Txn {
                compares: Vec::new(),
                success: c.to_vec(),
                failure: Vec::new(),
            })
            .collect();
        if !txns.is_empty() {
            to.txn_atomic(txns).await?;
        }
    }
    let mut copied = 0;
    let mut after: Option<String> = None;
    loop {
        let page = to.range_page("", after.as_deref(), PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.key.clone());
        copied += page.len();
    }
    if copied != done.keys {
        return Err(StoreError::Corrupt {
            key: String::new(),
            message: format!(
                "copied {} keys but the destination holds {copied}",
                done.keys
            ),
        });
    }
    Ok(done)
}
