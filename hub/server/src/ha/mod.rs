//! A highly available hub: several replicas on one etcd, one leads.
//!
//! - `election.rs` — the replica's lease, its registration under `hubs/<id>`, the leader
//!   key and its term (the fencing token);
//! - `front.rs` — the HTTP and gRPC servers every replica runs, answering by role: the
//!   leader serves, followers redirect;
//! - `mirror.rs` — a follower's warm copy of the store, kept by a watch;
//! - `replica.rs` — the role loop: follow, campaign, lead (fence the store, finish an
//!   interrupted batch, write the term marker, restore, run the hub, compact etcd), step
//!   down on a lost lease or a failed write.
//!
//! Invariants: only the replica whose term matches the leader key's revision can write
//! (every txn compares it, see `store/etcd_store.rs`); a replica runs a [`Hub`](crate::hub::Hub)
//! only while it leads, and restores it each time it takes the lead from what is durable:
//! its mirror once that has seen the term's marker, else etcd. Workload logs stay on the disk of the replica
//! that received them (its `--data-dir`): after a failover the new leader has the logs
//! written since it took the lead.

mod election;
mod front;
mod mirror;
mod replica;

use std::time::Duration;

pub use election::{Leader, MAX_REPLICAS_LISTED, ReplicaInfo};
pub use front::{Role, Roles};
pub use mirror::{CATCH_UP_TIMEOUT, MAX_MIRROR_BYTES, MIRROR_PAGE_KEYS, Mirror, MirrorView};
pub use replica::run;

/// The key whose holder leads; its revision is the term.
pub const LEADER_KEY: &str = "leader";
/// Where replicas register themselves, each with its lease.
pub const HUBS_PREFIX: &str = "hubs/";
/// Written by a new leader (with its lease) before it restores: a follower's mirror that
/// has seen it holds everything written before.
pub const TERM_MARKER_KEY: &str = "term";
/// How often the leader compacts etcd's history (to the revision of one interval before),
/// as `etcd --auto-compaction-mode=periodic` would: etcd keeps every revision until it is
/// compacted, so its database grows with each write until then.
pub const DEFAULT_COMPACTION_INTERVAL: Duration = Duration::from_secs(300);
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
    /// See [`DEFAULT_COMPACTION_INTERVAL`].
    pub compaction_interval: Duration,
}
