//! The HTTP/JSON API of the hub (`/api/v1/...`): request and response bodies,
//! shared by the hub (serves them) and the `axle` CLI (reads them).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /api/v1/workloads`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    pub team: String,
    /// Defaults to `w-<id>`.
    #[serde(default)]
    pub name: Option<String>,
    /// Program and arguments, run without a shell.
    pub command: Vec<String>,
    /// GPUs per replica: a fraction (0.25, 0.5, …) or a whole number.
    pub gpus: f64,
    #[serde(default)]
    pub gpu_model: Option<String>,
    /// Priority class; defaults to the policy's `defaultPriorityClass`.
    #[serde(default)]
    pub priority: Option<String>,
    /// Gang size: replicas that start together or not at all (default 1).
    #[serde(default)]
    pub gang: Option<u32>,
    #[serde(default)]
    pub regions: Vec<String>,
    #[serde(default)]
    pub allow_spread: bool,
    #[serde(default)]
    pub burst_allowed: bool,
    /// Client-chosen key: a retried submit with the same key returns the
    /// first workload instead of creating another.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub max_runtime_s: Option<u64>,
    /// Whether the workload saves its progress and resumes after preemption
    /// (default: its priority class's `checkpointable`).
    #[serde(default)]
    pub checkpointable: Option<bool>,
    /// How often it saves on its own (default: the class's).
    #[serde(default)]
    pub checkpoint_interval_s: Option<u64>,
    /// Signal it gets when preempted (default: the class's, SIGTERM).
    #[serde(default)]
    pub checkpoint_signal: Option<String>,
    /// Container image, for clusters whose spoke runs Kubernetes Jobs
    /// (default: the cluster's `defaultImage`; without either, the workload
    /// runs only on clusters that run processes).
    #[serde(default)]
    pub image: Option<String>,
}

/// A page of `GET /api/v1/workloads`: the items in id order, and the
/// token for the next page when there are more (pass it back as
/// `continue`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadList {
    pub items: Vec<WorkloadView>,
    #[serde(rename = "continue", default, skip_serializing_if = "Option::is_none")]
    pub continue_token: Option<String>,
}

/// Workload lifecycle states as the API names them.
pub const STATES: &[&str] = &[
    "Pending",
    "Placed",
    "Running",
    "Preempting",
    "Cancelling",
    "Succeeded",
    "Failed",
    "Cancelled",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuShareView {
    pub index: u32,
    /// 1.0 = the whole GPU.
    pub fraction: f64,
    /// The fractional unit it runs on (`MIG 2g.20gb`, `time-slice 1/4`);
    /// absent on a GPU shared in software or whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaView {
    pub node: String,
    pub gpus: Vec<GpuShareView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransitionView {
    pub at_ms: u64,
    pub from: String,
    pub to: String,
    pub reason: String,
}

/// One preemption of a workload: when, by whom, why, and what it cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreemptionView {
    pub at_ms: u64,
    /// The workload that needed the GPUs, its team and priority class.
    pub by_workload: u64,
    pub by_team: String,
    pub by_priority: String,
    pub reason: String,
    /// GPU-hours of work thrown away: the whole run without checkpoints,
    /// else what was done since the last one (an estimate from the interval).
    pub lost_gpu_hours: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadView {
    pub id: u64,
    pub name: String,
    pub team: String,
    pub priority: String,
    pub gpus: f64,
    pub gang: u32,
    pub gpu_model: Option<String>,
    #[serde(default)]
    pub image: Option<String>,
    pub command: Vec<String>,
    pub state: String,
    /// Why it waits, while Pending: what blocks it and a way out.
    pub pending_reason: Option<String>,
    /// The same as fields (`kind`, the numbers, who holds the capacity, its
    /// place in line, an estimated start), while Pending.
    #[serde(default)]
    pub pending_detail: Option<serde_json::Value>,
    pub cluster: Option<String>,
    pub replicas: Vec<ReplicaView>,
    /// Assignment epoch (fencing token); bumps on every placement.
    pub epoch: u64,
    pub submitted_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub finished_at_ms: Option<u64>,
    pub exit_code: Option<i32>,
    pub preemptions: u32,
    /// Saves its progress and resumes after preemption.
    #[serde(default)]
    pub checkpointable: bool,
    #[serde(default)]
    pub checkpoint_interval_s: Option<u64>,
    /// Each preemption (the most recent ones, bounded like `history`).
    #[serde(default)]
    pub preemption_log: Vec<PreemptionView>,
    /// Work lost to all its preemptions.
    #[serde(default)]
    pub lost_gpu_hours: f64,
    /// Time it ran in its runs that ended (preempted, re-queued, finished),
    /// ms; a running workload's current run adds `now - started_at_ms`.
    #[serde(default)]
    pub run_ms: u64,
    pub history: Vec<TransitionView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    pub index: u32,
    pub model: String,
    pub memory_mb: u64,
    /// GPUs allocated on this device (0..=1; a fractional unit in use
    /// counts its whole share).
    pub allocated: f64,
    /// A fractional unit (`MIG 2g.20gb`, `time-slice 1/4`); absent for a GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The GPUs the device counts for: 1 for a GPU, a unit's share.
    #[serde(default = "one")]
    pub share: f64,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    pub name: String,
    pub gpus: Vec<GpuView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterView {
    pub name: String,
    pub region: String,
    /// `Ready`, `Lost` (silent past `spokeLostAfterSeconds`) or `Declared`
    /// (in policy, no spoke connected yet).
    pub state: String,
    pub labels: BTreeMap<String, String>,
    pub nodes: Vec<NodeView>,
    pub gpus_total: f64,
    pub gpus_allocated: f64,
    pub running_workloads: u64,
    /// When the spoke was last heard from (ms since the Unix epoch).
    pub last_heartbeat_ms: Option<u64>,
    /// How its spoke runs work: `local` or `kubernetes` (empty: not yet known).
    #[serde(default)]
    pub driver: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaView {
    pub gpu_class: String,
    pub used: f64,
    pub guaranteed: f64,
    pub limit: f64,
    /// Used above the guarantee: GPUs lent to this team by others.
    pub borrowed: f64,
    /// The team's workloads running on GPUs of this class (a gang or a
    /// spread workload counts once, in the class of its first GPU).
    #[serde(default)]
    pub running: u64,
    /// The team's pending workloads that ask for this class's model (for
    /// `any`: a model the team has no class of).
    #[serde(default)]
    pub pending: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeamView {
    pub name: String,
    pub weight: f64,
    pub quotas: Vec<QuotaView>,
    /// All the team's pending workloads.
    pub pending: u64,
    /// Those that name no GPU model (any class may serve them).
    #[serde(default)]
    pub pending_any_model: u64,
    pub running: u64,
    /// The team's monthly cloud budget, in micro-dollars (exact).
    pub burst_budget_micro_usd: u64,
}

/// `GET /api/v1/burst`: cloud burst instances, reservations and spend this month.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BurstView {
    /// Whether this hub bursts at all (`axle-hub --burst`).
    pub enabled: bool,
    /// The UTC month budgets count in, `2026-12`.
    pub month: String,
    pub instances: Vec<BurstInstanceView>,
    pub teams: Vec<BurstSpendView>,
}

/// One burst instance. Money is in micro-dollars (exact).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BurstInstanceView {
    pub id: String,
    pub team: String,
    /// The BurstProvider's name, and its kind (`aws`, `runpod`, `lambda`).
    pub provider: String,
    pub kind: String,
    /// The ephemeral cluster it joins as.
    pub cluster: String,
    /// The workload it was launched for.
    pub workload: u64,
    /// `requested`, `launching`, `joining`, `ready`, `draining`,
    /// `terminating`, `terminated`, `failed`.
    pub state: String,
    pub instance_id: Option<String>,
    pub instance_type: String,
    pub region: String,
    pub gpu_model: String,
    pub gpus: u32,
    pub spot: bool,
    pub price_per_hour_micro_usd: u64,
    pub reserved_micro_usd: u64,
    /// What it has cost so far (its settlement once terminated).
    pub cost_micro_usd: u64,
    pub settled: bool,
    pub created_at_ms: u64,
    pub launched_at_ms: Option<u64>,
    pub joined_at_ms: Option<u64>,
    pub ended_at_ms: Option<u64>,
    /// When the provider takes it back, by its interruption notice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interruption_at_ms: Option<u64>,
    /// Why it is terminating or failed.
    pub note: String,
}

/// One team's burst money this month.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BurstSpendView {
    pub team: String,
    pub budget_micro_usd: u64,
    /// Held by live instances' reservations plus settled spend: what the budget check counts.
    pub committed_micro_usd: u64,
    /// Settled spend plus what live instances cost so far.
    pub spent_micro_usd: u64,
    /// Spent per provider.
    pub by_provider: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventView {
    pub seq: u64,
    pub at_ms: u64,
    /// e.g. `submitted`, `placed`, `preempted`, `started`, `succeeded`,
    /// `failed`, `cancelled`, `requeued`, `spoke_registered`, `spoke_lost`.
    pub kind: String,
    pub workload: Option<u64>,
    pub cluster: Option<String>,
    pub message: String,
    pub policy_revision: String,
    /// The user whose call caused it (absent: the hub itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// How the actor authenticated, e.g. `token 3f2a…`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
}

/// `GET /api/v1/workloads/{id}/logs?offset=N`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogsView {
    pub workload: u64,
    pub offset: u64,
    /// Log text from `offset` (lossy UTF-8).
    pub data: String,
    pub next_offset: u64,
    /// True when the workload has finished and no more output will come.
    pub complete: bool,
    /// With `timestamps=true`: when the parts of this range reached the hub
    /// (the last entry at or before `offset`, then those inside it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub times: Vec<LogTimeView>,
    /// The parts of `data` the workload wrote to stderr: [start, end) byte
    /// positions in `data` (UTF-8), ascending. Empty when all of it is
    /// stdout, or the cluster cannot tell the streams apart (Kubernetes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stderr: Vec<[u64; 2]>,
}

/// The bytes from `offset` reached the hub at `at_ms` (to the second).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogTimeView {
    pub offset: u64,
    pub at_ms: u64,
}

/// Every error body: what is wrong and what to fix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
    /// The request field at fault, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// `GET /api/v1/hubs`: the hub replicas, which one leads, and its term.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HubsView {
    /// `redb` (one hub, no replicas) or `etcd`.
    pub store: String,
    /// The replica that answered.
    pub answered_by: String,
    /// The leading replica's id, if one leads now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// The leader's term: the store revision at which it took the lead,
    /// its fencing token. Grows with every change of leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    /// The answering replica's own state: where a leader restored its
    /// state from, how far a follower's warm mirror has read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    pub replicas: Vec<HubReplicaView>,
}

/// One hub replica as it registered itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HubReplicaView {
    pub id: String,
    /// Where its HTTP API and gRPC listen, as it advertises them.
    pub http: String,
    pub grpc: String,
    pub leader: bool,
    pub started_at_ms: u64,
}
