//! The validated policy model: what the scheduler, hub and simulator consume.
//!
//! These are domain types, not file types: every value here has already passed
//! validation (see `load.rs`), names are resolved and quantities are exact
//! fixed-point numbers. File types with source spans live in `file.rs`.

use crate::money::Usd;
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The GPU class name that a team's quota may use to cover every model it has
/// no model-specific quota for.
pub const ANY_GPU_CLASS: &str = "any";

/// GPU models Axle knows without configuration. `Settings.gpuClasses` adds more.
pub const BUILTIN_GPU_CLASSES: &[&str] = &[
    "B200", "H200", "H100", "GH200", "A100", "A10G", "A10", "A6000", "A40", "L40S", "L40", "L4",
    "T4", "V100", "P100", "RTX4090", "RTX3090", "MI300X", "MI250",
];

/// Milli-GPUs in one whole GPU.
pub const MILLI_PER_GPU: u64 = 1000;

/// An amount of GPU in thousandths of a GPU. Exact arithmetic keeps the
/// scheduler deterministic and free of float rounding: 0.25 GPU is `Milli(250)`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Milli(pub u64);

impl Milli {
    pub const ZERO: Milli = Milli(0);

    pub const fn gpus(n: u64) -> Milli {
        Milli(n * MILLI_PER_GPU)
    }

    /// Converts a non-negative, finite GPU amount with at most three decimals.
    /// Returns `None` for negative, non-finite or finer-than-milli values.
    pub fn from_gpus_f64(gpus: f64) -> Option<Milli> {
        if !gpus.is_finite() || !(0.0..=1e12).contains(&gpus) {
            return None;
        }
        let scaled = gpus * MILLI_PER_GPU as f64;
        let rounded = scaled.round();
        if (scaled - rounded).abs() > 1e-6 {
            return None;
        }
        Some(Milli(rounded as u64))
    }

    pub fn as_gpus_f64(self) -> f64 {
        self.0 as f64 / MILLI_PER_GPU as f64
    }

    pub fn is_whole(self) -> bool {
        self.0.is_multiple_of(MILLI_PER_GPU)
    }

    pub fn whole_gpus(self) -> u64 {
        self.0 / MILLI_PER_GPU
    }

    pub fn saturating_sub(self, other: Milli) -> Milli {
        Milli(self.0.saturating_sub(other.0))
    }
}

impl std::ops::Add for Milli {
    type Output = Milli;
    fn add(self, rhs: Milli) -> Milli {
        Milli(self.0 + rhs.0)
    }
}

impl std::ops::AddAssign for Milli {
    fn add_assign(&mut self, rhs: Milli) {
        self.0 += rhs.0;
    }
}

impl std::ops::SubAssign for Milli {
    fn sub_assign(&mut self, rhs: Milli) {
        self.0 -= rhs.0;
    }
}

impl std::iter::Sum for Milli {
    fn sum<I: Iterator<Item = Milli>>(iter: I) -> Milli {
        Milli(iter.map(|m| m.0).sum())
    }
}

/// Prints GPUs the way people write them: `8`, `0.25`, `2.5`.
impl fmt::Display for Milli {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / MILLI_PER_GPU;
        let frac = self.0 % MILLI_PER_GPU;
        if frac == 0 {
            write!(f, "{whole}")
        } else {
            let s = format!("{frac:03}");
            write!(f, "{whole}.{}", s.trim_end_matches('0'))
        }
    }
}

/// A validated policy revision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// Where this revision came from: a Git commit id, or a content hash of the
    /// files for a plain directory.
    pub revision: String,
    pub teams: BTreeMap<String, Team>,
    pub priority_classes: BTreeMap<String, PriorityClass>,
    pub clusters: BTreeMap<String, Cluster>,
    pub burst_providers: BTreeMap<String, BurstProvider>,
    pub settings: Settings,
}

/// Guaranteed and limit GPUs of one team for one GPU class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// Never taken away by other teams; reclaimed by preemption when lent out.
    pub guaranteed: Milli,
    /// The most the team may hold by borrowing idle capacity.
    pub limit: Milli,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Team {
    pub name: String,
    /// Per GPU class (`H100`, `A100`, …, or `any`).
    pub quotas: BTreeMap<String, Quota>,
    /// Fair-share weight (> 0); a team with weight 2 is entitled to twice the
    /// share of idle capacity of a team with weight 1.
    pub weight: f64,
    pub members: Vec<Member>,
    /// Groups of the company's single sign-on whose users have a role here.
    #[serde(default)]
    pub groups: Vec<GroupMember>,
    pub burst: TeamBurst,
}

impl Team {
    /// The quota class that a GPU of `model` is charged to for this team: the
    /// model's own class if the team has one, else `any`, else none.
    pub fn quota_class_for(&self, model: &str) -> Option<&str> {
        if let Some((k, _)) = self.quotas.get_key_value(model) {
            Some(k.as_str())
        } else if let Some((k, _)) = self.quotas.get_key_value(ANY_GPU_CLASS) {
            Some(k.as_str())
        } else {
            None
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Admin,
    Member,
    Viewer,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub user: String,
    pub role: Role,
}

/// A single sign-on group (from the ID token's groups claim) with a role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMember {
    pub group: String,
    pub role: Role,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TeamBurst {
    /// Cloud spend allowed per calendar month (UTC); zero: no bursting.
    pub monthly_budget: Usd,
    /// Names of `BurstProvider` documents this team may burst to.
    pub providers: Vec<String>,
    /// Regions the team's data may go to; empty means any region of the providers.
    pub regions: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PriorityClass {
    pub name: String,
    /// Higher runs first.
    pub value: i32,
    /// Classes whose workloads may preempt this class. Empty means never
    /// preempted, not even to reclaim a guarantee (production).
    pub preemptible_by: Vec<String>,
    /// SIGTERM → SIGKILL grace period when preempted.
    pub grace_period_s: u64,
    /// Runs only on capacity no other class wants (batch): never preempts, and
    /// is never placed through preemption.
    pub idle_only: bool,
    /// May this class burst to cloud providers at all.
    pub burst_allowed: bool,
    /// Workloads of this class save their progress: on preemption they get
    /// `checkpoint_signal` and their grace period to save, and every run
    /// resumes from the checkpoint directory. A workload may override it.
    pub checkpointable: bool,
    /// How often a checkpointable workload saves on its own; what a
    /// preemption costs it is at most this much work.
    pub checkpoint_interval_s: u64,
    /// The signal a checkpointable workload gets at preemption (`SIGTERM`,
    /// `SIGUSR1`, ...); SIGKILL follows after the grace period.
    pub checkpoint_signal: String,
    /// How a replica larger than one node is laid out over nodes.
    pub placement: GangPlacement,
    /// Once started, a workload of this class is not preempted by priority
    /// before it has run this long (a reclaim of a guarantee still may: a
    /// guarantee is never held back).
    pub min_runtime_s: u64,
    /// A wait its workloads tolerate: a waiting workload that its start
    /// estimate says will fit within it does not preempt by priority.
    pub tolerable_wait_s: u64,
}

/// How a replica larger than one node is laid out over nodes
/// (`PriorityClass.placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GangPlacement {
    /// Whole free nodes only (the rest, best fit, on one more node), from
    /// one topology domain when one holds it: a large job never fragments
    /// nodes that others could use whole, and may wait longer for them.
    WholeNodes,
    /// The largest free blocks first, partly used nodes included: the
    /// fewest nodes that are free now. The default: on Philly at 512 GPUs
    /// Axle's mean delay is 54,476 s with it against 63,342 s with
    /// `wholeNodes` (p95 251,005 s against 261,990 s): with preemption and
    /// reclaim a large job that waits for whole nodes waits longer than
    /// the fragments it leaves cost (README, "Replay a GPU trace").
    #[default]
    Packed,
    /// The smallest free blocks first: fills partly used nodes and keeps
    /// whole nodes for others.
    Spread,
}

impl GangPlacement {
    pub const ALL: [GangPlacement; 3] = [
        GangPlacement::WholeNodes,
        GangPlacement::Packed,
        GangPlacement::Spread,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            GangPlacement::WholeNodes => "wholeNodes",
            GangPlacement::Packed => "packed",
            GangPlacement::Spread => "spread",
        }
    }
}

/// Default `checkpointIntervalSeconds`: half an hour, the interval training
/// frameworks' checkpoint callbacks are commonly set to.
pub const DEFAULT_CHECKPOINT_INTERVAL_S: u64 = 1800;

/// Signals a workload may ask for at preemption. SIGKILL and SIGSTOP cannot
/// be caught, so they cannot ask a workload to save.
pub const CHECKPOINT_SIGNALS: &[&str] = &[
    "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2",
];

impl PriorityClass {
    pub fn is_preemptible(&self) -> bool {
        !self.preemptible_by.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    pub name: String,
    pub region: String,
    pub business_unit: String,
    pub labels: BTreeMap<String, String>,
    /// Internal chargeback price.
    pub price_per_gpu_hour: Usd,
    /// Declared capacity for planning and simulation, and the most a spoke may report:
    /// the live inventory is used, within these models and counts (none: any).
    pub nodes: Vec<NodeGroup>,
    /// Image for workloads that name none on a Kubernetes cluster.
    pub default_image: Option<String>,
}

impl Cluster {
    /// Declared GPUs per model.
    pub fn declared_gpus(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for g in &self.nodes {
            *out.entry(g.gpu_model.clone()).or_insert(0) += g.count * g.gpus_per_node;
        }
        out
    }
}

/// `count` identical nodes with `gpus_per_node` GPUs of one model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGroup {
    pub count: u64,
    pub gpu_model: String,
    pub gpus_per_node: u64,
    pub gpu_memory_gb: u64,
    /// Topology domain of the group's nodes (rack, NVLink/IB block).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderType {
    Aws,
    Runpod,
    Lambda,
}

impl fmt::Display for ProviderType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProviderType::Aws => "aws",
            ProviderType::Runpod => "runpod",
            ProviderType::Lambda => "lambda",
        })
    }
}

/// Whether region `pattern` (from a team's or workload's regions) admits
/// `region`: `eu-*` matches `eu-west-1`; a pattern with no `*` must be equal.
pub fn region_matches(pattern: &str, region: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => region.starts_with(prefix),
        None => pattern == region,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BurstProvider {
    pub name: String,
    pub provider_type: ProviderType,
    pub regions: Vec<String>,
    /// Allowed instance types (AWS) or GPU types (RunPod, Lambda).
    pub instance_types: Vec<String>,
    pub gpu_models: Vec<String>,
    pub max_instances: u64,
    /// Hourly prices per instance type.
    pub prices: BTreeMap<String, Price>,
    pub allow_spot: bool,
    /// Boot images by region (AMIs) or one container image (`default`).
    pub images: BTreeMap<String, String>,
    pub join_timeout_s: u64,
    pub idle_timeout_s: u64,
}

/// Default `joinTimeoutSeconds`: ten minutes, a GPU instance's boot with room to spare.
pub const DEFAULT_BURST_JOIN_TIMEOUT_S: u64 = 600;
/// Default `idleTimeoutSeconds`: five minutes without work.
pub const DEFAULT_BURST_IDLE_TIMEOUT_S: u64 = 300;
/// Default `defaultBurstRuntimeSeconds`: an hour is reserved for a workload
/// without a maximum run time.
pub const DEFAULT_BURST_RUNTIME_S: u64 = 3600;

fn default_burst_runtime_s() -> u64 {
    DEFAULT_BURST_RUNTIME_S
}

/// Hourly prices of one instance type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Price {
    pub on_demand: Usd,
    pub spot: Option<Usd>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Fractional requests must be a multiple of this (default 0.25 GPU).
    pub fraction_granularity: Milli,
    /// A workload that may burst waits this long on-prem before a burst is wanted.
    pub burst_wait_threshold_s: u64,
    /// All teams' cloud spend together per month, at most (none: no cap).
    #[serde(default)]
    pub burst_budget_per_month: Option<Usd>,
    /// Reserved run time of a burst whose workload names no maximum.
    #[serde(default = "default_burst_runtime_s")]
    pub default_burst_runtime_s: u64,
    /// A spoke silent this long is lost and its workloads are re-queued.
    pub spoke_lost_after_s: u64,
    /// Priority class of a workload that names none.
    pub default_priority_class: String,
    /// Whose workloads a team's work may preempt (ARCHITECTURE.md, invariant 3).
    pub cross_team_preemption: CrossTeamPreemption,
    /// Known GPU classes (built-ins plus `gpuClasses` from the file).
    pub gpu_classes: Vec<String>,
    /// Finished workloads are deleted (record and logs) this long after they
    /// finish (`retainFinishedHours`).
    pub retain_finished_ms: u64,
    /// Events older than this are deleted (`retainEventsDays`).
    pub retain_events_ms: u64,
    /// Log bytes kept per workload run (head and most recent tail).
    pub max_log_bytes_per_workload: u64,
    /// Users who may do anything on the hub (`platformAdmins`).
    pub platform_admins: Vec<String>,
    /// GPU model → the memory (GB) a whole GPU means when a fraction is
    /// sized on a MIG device (`fractionMemoryGb`).
    #[serde(default)]
    pub fraction_memory_gb: BTreeMap<String, u64>,
    /// What a spoke may report for a Cluster that declares no `nodes`
    /// (`maxNodesPerCluster`, `maxGpusPerNode`, `maxGpuMemoryGb`).
    #[serde(default)]
    pub undeclared: InventoryBounds,
}

/// Bounds on what a spoke may report for a cluster whose shape the policy
/// does not declare: nothing to hold the claims against but these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryBounds {
    pub max_nodes: u64,
    pub max_gpus_per_node: u64,
    pub max_gpu_memory_gb: u64,
}

/// Most nodes per cluster, by default and at most: the hub's promise
/// (ten times the largest single GPU clusters run today).
pub const MAX_NODES_PER_CLUSTER: u64 = 10_000;
/// Most GPUs a node may report on an undeclared cluster, at most: MIG
/// instances and time-sliced shares are devices too, but a node holds 16
/// GPUs at most today; 64 leaves room for what comes next.
pub const MAX_GPUS_PER_NODE: u64 = 64;
/// Default `maxGpusPerNode`: the largest servers sold (16 GPUs).
pub const DEFAULT_MAX_GPUS_PER_NODE: u64 = 16;
/// Default `maxGpuMemoryGb`: the largest GPU memory sold (288 GB).
pub const DEFAULT_MAX_GPU_MEMORY_GB: u64 = 288;

impl Default for InventoryBounds {
    fn default() -> Self {
        InventoryBounds {
            max_nodes: MAX_NODES_PER_CLUSTER,
            max_gpus_per_node: DEFAULT_MAX_GPUS_PER_NODE,
            max_gpu_memory_gb: DEFAULT_MAX_GPU_MEMORY_GB,
        }
    }
}

/// Default `retainFinishedHours`: a week, long enough to look back at last
/// week's failures, short enough that a hub running 100 workloads/s keeps
/// about 60 million records at most.
pub const DEFAULT_RETAIN_FINISHED_HOURS: u64 = 168;

/// Default `retainEventsDays`: a quarter of audit history.
pub const DEFAULT_RETAIN_EVENTS_DAYS: u64 = 90;

/// Default `maxLogBytesPerWorkload`: 64 MiB — every traceback and far more
/// than anyone reads in a terminal.
pub const DEFAULT_MAX_LOG_BYTES_PER_WORKLOAD: u64 = 64 << 20;

/// Shortest retention window: a minute, so a typo cannot delete work as
/// it finishes.
pub const MIN_RETENTION_MS: u64 = 60_000;

/// Smallest `maxLogBytesPerWorkload`: room for a head and a tail worth reading.
pub const MIN_LOG_BYTES_PER_WORKLOAD: u64 = 4096;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            fraction_granularity: Milli(250),
            burst_wait_threshold_s: 300,
            burst_budget_per_month: None,
            default_burst_runtime_s: DEFAULT_BURST_RUNTIME_S,
            spoke_lost_after_s: 30,
            default_priority_class: "development".to_string(),
            cross_team_preemption: CrossTeamPreemption::BorrowedOnly,
            gpu_classes: BUILTIN_GPU_CLASSES.iter().map(|s| s.to_string()).collect(),
            retain_finished_ms: DEFAULT_RETAIN_FINISHED_HOURS * 3_600_000,
            retain_events_ms: DEFAULT_RETAIN_EVENTS_DAYS * 86_400_000,
            max_log_bytes_per_workload: DEFAULT_MAX_LOG_BYTES_PER_WORKLOAD,
            platform_admins: Vec::new(),
            fraction_memory_gb: BTreeMap::new(),
            undeclared: InventoryBounds::default(),
        }
    }
}

/// Whose workloads a team's work may preempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CrossTeamPreemption {
    /// Guarantees are hard: another team's work is preempted only from the
    /// capacity that team borrows (it runs above its guarantee and stays at
    /// or above it), and non-preemptible work runs only within its own
    /// team's guarantee, since nothing could take it back.
    #[default]
    BorrowedOnly,
    /// Priority is global: a class may preempt any workload of a class it
    /// may preempt, whoever's guarantee it runs on. Guarantees only bound
    /// reclaim and fair share.
    Any,
}

impl CrossTeamPreemption {
    pub const ALL: [CrossTeamPreemption; 2] =
        [CrossTeamPreemption::BorrowedOnly, CrossTeamPreemption::Any];

    pub fn as_str(self) -> &'static str {
        match self {
            CrossTeamPreemption::BorrowedOnly => "borrowedOnly",
            CrossTeamPreemption::Any => "any",
        }
    }
}

/// The priority classes a policy gets when it defines none: production >
/// training > development (notebooks) > batch (idle capacity only).
pub fn default_priority_classes() -> BTreeMap<String, PriorityClass> {
    let class =
        |name: &str, value: i32, by: &[&str], idle_only: bool, burst_allowed: bool| PriorityClass {
            name: name.to_string(),
            value,
            preemptible_by: by.iter().map(|s| s.to_string()).collect(),
            grace_period_s: 30,
            idle_only,
            burst_allowed,
            checkpointable: false,
            checkpoint_interval_s: DEFAULT_CHECKPOINT_INTERVAL_S,
            checkpoint_signal: "SIGTERM".to_string(),
            placement: GangPlacement::default(),
            min_runtime_s: 0,
            tolerable_wait_s: 0,
        };
    [
        class("production", 1000, &[], false, true),
        class("training", 100, &["production"], false, true),
        class("development", 10, &["training", "production"], false, true),
        class(
            "batch",
            0,
            &["development", "training", "production"],
            true,
            false,
        ),
    ]
    .into_iter()
    .map(|c| (c.name.clone(), c))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milli_display_and_parse() {
        assert_eq!(Milli(250).to_string(), "0.25");
        assert_eq!(Milli(8000).to_string(), "8");
        assert_eq!(Milli(2500).to_string(), "2.5");
        assert_eq!(Milli::from_gpus_f64(0.25), Some(Milli(250)));
        assert_eq!(Milli::from_gpus_f64(-1.0), None);
        assert_eq!(Milli::from_gpus_f64(f64::NAN), None);
        assert_eq!(Milli::from_gpus_f64(0.0001), None);
    }
}
