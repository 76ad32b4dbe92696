//! A highly available hub: several replicas on one etcd, one leads.
//!
//! - `election.rs` — the replica's lease, its registration under `hubs/<id>`, the leader
//!   key and its term (the fencing token);
//! - `front.rs` — the HTTP and gRPC servers every replica runs, answering by role: the
//!   leader serves, followers redirect;
//! - `replica.rs` — the role loop: follow, campaign, lead (fence the store, finish an
//!   interrupted batch, restore, run the hub), step down on a lost lease or a failed write.
//!
//! Invariants: only the replica whose term matches the leader key's revision can write
//! (every txn compares it, see `store/etcd_store.rs`); a replica runs a [`Hub`](crate::hub::Hub)
//! only while it leads, and restores it from the store each time it takes the lead, so
//! what it serves is exactly what is durable. Workload logs stay on the disk of the replica
//! that received them (its `--data-dir`): after a failover the new leader has the logs
//! written since it took the lead.

mod election;
mod front;
mod replica;

use std::time::Duration;

pub use election::{Leader, MAX_REPLICAS_LISTED, ReplicaInfo};
pub use front::{Role, Roles};
pub use replica::run;

/// The key whose holder leads; its revision is the term.
pub const LEADER_KEY: &str = "leader";
/// Where replicas register themselves, each with its lease.
pub const HUBS_PREFIX: &str = "hubs/";
/// A lease's default TTL: a dead leader is replaced within about this long. Shorter
/// makes failover faster and a GC-like stall or a slow etcd more likely to depose a
/// healthy leader; etcd itself refuses TTLs under ~1.5 s.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);
/// How often a follower reads the leader key: what an election adds to failover.
pub const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// Wait before retrying when etcd cannot be reached or the hub failed to start.
pub const RETRY_DELAY: Duration = Duration::from_secs(1);

/// How this replica takes part.
#[derive(Debug, Clone)]
pub struct HaOptions {
    /// Unique among the replicas (default: the host name and the HTTP port).
    pub replica_id: String,
    /// The URLs other replicas redirect clients to.
    pub advertise_http: String,
    pub advertise_grpc: String,
    pub lease_ttl: Duration,
}
