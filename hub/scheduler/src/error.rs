//! Errors for requests the scheduler refuses: each says what is wrong and how to fix it.

use axle_policy::Milli;
use thiserror::Error;

use crate::types::WorkloadId;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum RequestError {
    #[error("unknown team {team:?}; known teams: {known}")]
    UnknownTeam { team: String, known: String },
    #[error("unknown priority class {class:?}; known classes: {known}")]
    UnknownPriorityClass { class: String, known: String },
    #[error("gpus must be greater than 0")]
    ZeroGpus,
    #[error("replicas (gang size) must be at least 1")]
    ZeroReplicas,
    #[error(
        "a fractional request must be a multiple of {granularity} GPU (got {got}); use e.g. {granularity}"
    )]
    BadFraction { got: Milli, granularity: Milli },
    #[error("requests above 1 GPU must be whole GPUs (got {0}); ask for a whole number")]
    NotWhole(Milli),
    #[error("a gang of {replicas} replicas is too large (most {max})")]
    GangTooLarge { replicas: u32, max: u32 },
    #[error(
        "{requested} {model} GPUs on one node can never fit: the largest {model} node has {largest}; lower gpus or allow spreading across nodes"
    )]
    NeverFitsNode {
        requested: Milli,
        model: String,
        largest: u32,
    },
    #[error("no cluster is in region {region:?}; known regions: {known}")]
    UnknownRegion { region: String, known: String },
    #[error("no cluster has {model} GPUs; known models: {known}")]
    UnknownGpuModel { model: String, known: String },
    #[error("team {team} has no quota for {model} GPUs")]
    NoQuota { team: String, model: String },
    #[error(
        "{requested} GPUs exceed team {team}'s limit of {limit} {class}; it could never be admitted"
    )]
    AboveLimit {
        team: String,
        class: String,
        requested: Milli,
        limit: Milli,
    },
    /// A request naming no model, above the team's limit in every class it
    /// could use (it once named only the first class's, e.g. "4 A100" when
    /// the team may hold 16 H100).
    #[error(
        "{requested} GPUs exceed every limit of team {team} ({limits}); it could never be admitted"
    )]
    AboveEveryLimit {
        team: String,
        requested: Milli,
        /// `16 H100, 4 A100`: largest first.
        limits: String,
    },
    #[error(
        "{requested} GPUs exceed team {team}'s guarantee of {guaranteed} {class}: {priority} work is never preempted, so it runs only within its team's guarantee; ask for at most {guaranteed}, or use a preemptible priority class to borrow idle GPUs"
    )]
    AboveGuarantee {
        team: String,
        class: String,
        priority: String,
        requested: Milli,
        guaranteed: Milli,
    },
    #[error("workload id {0} already exists")]
    DuplicateId(WorkloadId),
    #[error("unknown workload id {0}")]
    UnknownWorkload(WorkloadId),
    #[error("invalid allocation: {0}")]
    BadAllocation(&'static str),
}
