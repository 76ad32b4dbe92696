//! What a driver's tasks tell the agent: a workload started, a chunk of its
//! output, it finished; the inventory changed. Shared by the drivers and the
//! log pumps.

use axle_proto::pb;

/// What a workload's supervisor tells the agent.
#[derive(Debug)]
pub enum Event {
    /// Every replica has been spawned.
    Started {
        workload_id: u64,
        epoch: u64,
    },
    Log(pb::LogChunk),
    /// Every process of the workload is gone (its GPUs are free) and its log
    /// is flushed; carries the terminal status.
    Finished(pb::WorkloadStatus),
    /// The driver's inventory changed (or became known).
    Inventory,
    /// The provider reclaims this machine (an EC2 spot interruption notice).
    Interruption(pb::InterruptionNotice),
}
