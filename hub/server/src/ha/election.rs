//! Leases, registration and the leader key: how replicas find out who leads.
//!
//! Every replica holds one lease (TTL [`HaOptions::lease_ttl`]) that it keeps alive every
//! third of the TTL, and registers itself under `hubs/<id>` with it. A replica campaigns by
//! creating [`LEADER_KEY`] with its lease in a txn that requires the key to be absent; the
//! revision of that txn is the new term and the fencing token every write of the leader then
//! compares. A leader whose lease lapses (killed, paused, partitioned) loses the key when etcd
//! expires the lease; a leader that notices first (a keep-alive refused, or no successful one
//! for a TTL) steps down on its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

use super::{HUBS_PREFIX, LEADER_KEY};
use crate::store::{Compare, EtcdStore, LeaseId, Op, Rev, Store, StoreError, Txn};

/// What a replica writes about itself, under `hubs/<id>` and in [`LEADER_KEY`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaInfo {
    pub id: String,
    /// Its HTTP API's URL, e.g. `http://10.0.0.5:7070`.
    pub http: String,
    /// Its gRPC URL, e.g. `http://10.0.0.5:7071`.
    pub grpc: String,
    pub started_at_ms: u64,
}

/// The replica that leads, and since which revision (its term).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub info: ReplicaInfo,
    pub term: Rev,
}

/// One lease kept alive in the background; `lost` turns true, once, when it lapsed or
/// cannot be renewed in time.
pub(super) struct LeaseSession {
    pub id: LeaseId,
    lost: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl LeaseSession {
    pub async fn open(store: Arc<EtcdStore>, ttl: Duration) -> Result<LeaseSession, StoreError> {
        let id = store.lease_grant(ttl.as_millis() as u64).await?;
        let (tx, lost) = watch::channel(false);
        let every = ttl / 3;
        let task = tokio::spawn(async move {
            let mut renewed = Instant::now();
            loop {
                tokio::time::sleep(every).await;
                // A process paused past its TTL (SIGSTOP, a long GC-like stall) wakes here:
                // its lease may be gone already, so it does not count on it.
                if renewed.elapsed() >= ttl {
                    let _ = tx.send(true);
                    return;
                }
                match tokio::time::timeout(every, store.lease_keepalive(id)).await {
                    Ok(Ok(())) => renewed = Instant::now(),
                    Ok(Err(StoreError::LeaseNotFound(_))) => {
                        let _ = tx.send(true);
                        return;
                    }
                    Ok(Err(e)) => warn!("cannot renew this replica's lease: {e}"),
                    Err(_) => warn!("renewing this replica's lease timed out"),
                }
                // The next renewal would come too late: etcd may expire the lease first.
                if renewed.elapsed() + every >= ttl {
                    let _ = tx.send(true);
                    return;
                }
            }
        });
        Ok(LeaseSession { id, lost, task })
    }

    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Resolves once the lease is lost.
    pub async fn lost(&self) {
        let mut rx = self.lost.clone();
        let _ = rx.wait_for(|l| *l).await;
    }
}

impl Drop for LeaseSession {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Registers `me` under `hubs/<id>` with the lease (replacing an earlier registration).
pub(super) async fn register(
    store: &EtcdStore,
    me: &ReplicaInfo,
    lease: LeaseId,
) -> Result<(), StoreError> {
    let value = serde_json::to_vec(me).map_err(|e| StoreError::InvalidRequest(e.to_string()))?;
    store
        .txn(Txn::new().and_then(Op::put_with_lease(
            format!("{HUBS_PREFIX}{}", me.id),
            value,
            lease,
        )))
        .await
        .map(|_| ())
}

/// The leader key as stored: who leads and since when.
pub(super) async fn current_leader(store: &EtcdStore) -> Result<Option<Leader>, StoreError> {
    let Some(kv) = store.get(LEADER_KEY).await? else {
        return Ok(None);
    };
    let info: ReplicaInfo = serde_json::from_slice(&kv.value).map_err(|e| StoreError::Corrupt {
        key: LEADER_KEY.to_string(),
        message: e.to_string(),
    })?;
    Ok(Some(Leader {
        info,
        term: kv.mod_rev,
    }))
}

/// Tries to take the lead: creates the leader key with `lease` if nobody holds it. The
/// term when it won.
pub(super) async fn campaign(
    store: &EtcdStore,
    me: &ReplicaInfo,
    lease: LeaseId,
) -> Result<Option<Rev>, StoreError> {
    let value = serde_json::to_vec(me).map_err(|e| StoreError::InvalidRequest(e.to_string()))?;
    let r = store
        .txn(
            Txn::new()
                .when(LEADER_KEY, Compare::Absent)
                .and_then(Op::put_with_lease(LEADER_KEY, value, lease)),
        )
        .await?;
    Ok(r.succeeded.then_some(r.rev))
}

/// Gives the lead up: deletes the leader key if it is still this term's, so a follower
/// need not wait for the lease to expire.
pub(super) async fn resign(store: &EtcdStore, term: Rev) -> Result<(), StoreError> {
    store
        .txn(
            Txn::new()
                .when(LEADER_KEY, Compare::ModRev(term))
                .and_then(Op::delete(LEADER_KEY)),
        )
        .await
        .map(|_| ())
}

/// Most replicas `GET /api/v1/hubs` lists: a hub runs 3 or 5; more is a
/// misconfiguration, and the list stays small whatever registers.
pub const MAX_REPLICAS_LISTED: usize = 64;

/// The registered replicas, at most [`MAX_REPLICAS_LISTED`].
pub(super) async fn replicas(store: &EtcdStore) -> Result<Vec<ReplicaInfo>, StoreError> {
    let kvs = store
        .range_page(HUBS_PREFIX, None, MAX_REPLICAS_LISTED)
        .await?;
    Ok(kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
        .collect())
}
