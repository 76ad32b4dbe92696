//! What a workload's supervisor tells the agent: started, a chunk of output,
//! finished. Shared by the driver (which supervises) and the log pumps.

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
}
