//! Inputs and outputs of a scheduling cycle: workload specs, inventory,
//! placements, preemptions, burst wishes and pending reasons.

use std::fmt;
use std::sync::Arc;

use axle_policy::Milli;
use serde::{Deserialize, Serialize};

/// A part of a pending reason that every request of one shape and team
/// shares within a cycle: cloning a reason for each of many thousands of
/// waiting requests copies a pointer, not its strings (the copies were a
/// tenth of an explained cycle). Reads, prints and serializes as `T`.
#[derive(Debug, PartialEq, Eq)]
pub struct Shared<T: ?Sized>(Arc<T>);

impl<T: ?Sized> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(Arc::clone(&self.0))
    }
}

impl<T: ?Sized> std::ops::Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> From<T> for Shared<T> {
    fn from(v: T) -> Self {
        Shared(Arc::new(v))
    }
}

impl From<String> for Shared<str> {
    fn from(v: String) -> Self {
        Shared(Arc::from(v))
    }
}

impl From<&str> for Shared<str> {
    fn from(v: &str) -> Self {
        Shared(Arc::from(v))
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: ?Sized + Serialize> Serialize for Shared<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Shared<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(Shared::from)
    }
}

impl<'de> Deserialize<'de> for Shared<str> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Shared::from)
    }
}

/// Workload ids are assigned by the hub in submit order; the scheduler uses
/// them as the last tie-breaker so ordering never depends on hashing.
pub type WorkloadId = u64;

/// What a workload asks for. Times are milliseconds on the caller's clock
/// (wall clock in the hub, simulated clock in the simulator).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    pub id: WorkloadId,
    pub team: String,
    pub priority_class: String,
    /// GPUs of each replica: a fraction below one GPU (multiple of the
    /// policy's granularity) or a whole number.
    pub gpus_per_replica: Milli,
    /// Gang size: replicas that start together in one cluster or not at all.
    pub replicas: u32,
    /// Required GPU model; `None` takes any model the team has quota for.
    pub gpu_model: Option<String>,
    /// Allowed regions; empty means any.
    pub regions: Vec<String>,
    /// May the GPUs of one replica span nodes (within one cluster).
    pub allow_spread: bool,
    /// May this workload overflow to a cloud provider.
    pub burst_allowed: bool,
    /// Original submit time; a preempted workload keeps it.
    pub submit_time_ms: u64,
    /// `Some(interval)`: the workload checkpoints every `interval` seconds
    /// (and on its preemption signal), so a preemption costs it at most the
    /// work since its last checkpoint. `None`: it restarts from zero.
    pub checkpoint_interval_s: Option<u64>,
    /// The most a run may take (the hub stops it then); used for start
    /// estimates and reservations, never trusted beyond that.
    pub max_runtime_s: Option<u64>,
    /// It names a container image (clusters that run Jobs need one, or a
    /// default image of their own).
    #[serde(default)]
    pub has_image: bool,
    /// Without a max runtime: what its run is expected to take, from the
    /// earlier runs of its kind ([`crate::RuntimeStats`]); start estimates
    /// only.
    #[serde(default)]
    pub expected_runtime: Option<crate::RuntimeEstimate>,
}

impl WorkloadSpec {
    pub fn total_gpus(&self) -> Milli {
        Milli(self.gpus_per_replica.0 * u64::from(self.replicas))
    }

    /// Milli-GPU·milliseconds of work a preemption at `now_ms` throws away
    /// for a run that started at `start_ms`: everything since the start
    /// without checkpoints, else what was done since the last checkpoint.
    pub fn lost_work_milli_ms(&self, start_ms: u64, now_ms: u64) -> u128 {
        lost_work(
            now_ms.saturating_sub(start_ms),
            self.checkpoint_ms(),
            self.total_gpus().0,
        )
    }

    /// The checkpoint interval in ms; 0 without checkpoints.
    pub(crate) fn checkpoint_ms(&self) -> u64 {
        self.checkpoint_interval_s
            .filter(|&i| i > 0)
            .map_or(0, |i| i.saturating_mul(1000))
    }
}

/// Milli-GPU·ms lost by a run of `milli` GPUs that ran `ran_ms`: all of it
/// without checkpoints (`checkpoint_ms` 0), else what it did since its
/// last one.
pub(crate) fn lost_work(ran_ms: u64, checkpoint_ms: u64, milli: u64) -> u128 {
    let lost_ms = if checkpoint_ms > 0 {
        ran_ms % checkpoint_ms
    } else {
        ran_ms
    };
    u128::from(lost_ms) * u128::from(milli)
}

/// Live (or declared) GPU inventory of every cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub clusters: Vec<ClusterInventory>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterInventory {
    pub name: String,
    pub region: String,
    /// A cluster that is not schedulable (spoke lost, draining) gets no new work.
    pub schedulable: bool,
    /// It runs container images and has no default image: workloads
    /// without an image cannot run there.
    #[serde(default)]
    pub needs_image: bool,
    /// What a GPU-hour here costs (the policy's internal
    /// `priceUsdPerGpuHour`, or a burst instance's price per GPU).
    #[serde(default)]
    pub price_per_gpu_hour: axle_policy::Usd,
    /// Only this team's workloads run here: a burst instance its budget pays for.
    #[serde(default)]
    pub owner_team: Option<String>,
    pub nodes: Vec<NodeInventory>,
}

impl Inventory {
    /// Puts cheaper clusters first (stable: equal prices keep their order).
    /// Placement breaks ties between clusters that fit equally well by
    /// their order, so among equals the lower price wins.
    pub fn order_by_price(&mut self) {
        self.clusters.sort_by_key(|c| c.price_per_gpu_hour);
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeInventory {
    pub name: String,
    pub gpu_model: String,
    pub gpu_count: u32,
    pub gpu_memory_mb: u64,
    /// Its GPUs are partitioned (MIG) or time-sliced: only fractional
    /// requests fit, never a whole GPU. (A spoke that reports `units` says
    /// which of each instead.)
    #[serde(default)]
    pub fractions_only: bool,
    /// Its whole GPUs are never split between workloads: a Kubernetes node
    /// without time-slicing, where a pod gets whole devices or nothing.
    #[serde(default)]
    pub whole_only: bool,
    /// What each GPU index of the node is, when not all are whole GPUs:
    /// `units[i]` is GPU index i (then `units.len() == gpu_count`).
    #[serde(default)]
    pub units: Vec<GpuUnit>,
    /// The topology domain the node is in (a rack, an NVLink or InfiniBand
    /// block): the replicas of a job larger than one node, and of a gang,
    /// prefer nodes of one domain. From the Cluster document's node group,
    /// or a Kubernetes node label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
}

/// One schedulable device of a node: a whole GPU, or a fractional unit the
/// hardware or the device plugin hands out whole — a MIG device or one
/// time-sliced replica. A unit serves one fraction at a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUnit {
    /// `MIG 2g.20gb`, `time-slice 1/4`; empty for a whole GPU.
    pub name: String,
    /// The share of a GPU the unit is, in milli-GPUs (a MIG device:
    /// compute slices / 7; a time-sliced replica: 1 / replicas); 0 for a
    /// whole GPU. What the cluster's capacity counts.
    pub share_milli: u16,
    /// The largest fraction it serves, in milli-GPUs: a MIG device's memory
    /// over a whole GPU's (0.25 of an 80 GB H100 needs 20 GB: `2g.20gb` or
    /// larger, never `1g.10gb`), a replica's share.
    pub fits_milli: u16,
}

impl GpuUnit {
    pub fn whole() -> GpuUnit {
        GpuUnit {
            name: String::new(),
            share_milli: 0,
            fits_milli: 0,
        }
    }

    pub fn is_whole(&self) -> bool {
        self.share_milli == 0
    }
}

/// One slice of one GPU given to a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Shard {
    /// Node index within the cluster.
    pub node: u32,
    /// GPU index within the node (what `CUDA_VISIBLE_DEVICES` gets).
    pub gpu: u32,
    pub milli: Milli,
}

/// Where a workload runs: one cluster, and per replica its GPU shards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub cluster: u32,
    /// `replicas[r]` are the shards of replica `r`.
    pub replicas: Vec<Vec<Shard>>,
}

impl Allocation {
    pub fn shards(&self) -> impl Iterator<Item = &Shard> {
        self.replicas.iter().flatten()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub workload: WorkloadId,
    pub allocation: Allocation,
    /// Workloads that must stop (see `Decisions::preemptions`) before this one
    /// starts on the freed GPUs.
    pub after_preempting: Vec<WorkloadId>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preemption {
    pub workload: WorkloadId,
    /// The workload that needs the GPUs.
    pub for_workload: WorkloadId,
    pub reason: PreemptReason,
    pub grace_period_s: u64,
    /// Work the victim loses, in GPU-milliseconds: all of this run without
    /// checkpoints, else what it did since its last checkpoint.
    pub lost_gpu_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PreemptReason {
    /// A higher priority class that may preempt this one needs the GPUs.
    Priority {
        victim_class: String,
        preemptor_class: String,
        victim_team: String,
        preemptor_team: String,
    },
    /// The preemptor's team is reclaiming its guarantee from a borrower.
    QuotaReclaim {
        victim_team: String,
        preemptor_team: String,
        gpu_class: String,
        guaranteed: Milli,
    },
}

impl fmt::Display for PreemptReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PreemptReason::Priority {
                victim_class,
                preemptor_class,
                victim_team,
                preemptor_team,
            } if victim_team == preemptor_team => write!(
                f,
                "preempted by higher priority {preemptor_class} work of its own team {preemptor_team} ({victim_class} may be preempted by {preemptor_class})"
            ),
            PreemptReason::Priority {
                victim_class,
                preemptor_class,
                victim_team,
                preemptor_team,
            } => write!(
                f,
                "preempted by higher priority {preemptor_class} work of team {preemptor_team} ({victim_class} may be preempted by {preemptor_class}; team {victim_team} ran above its guarantee)"
            ),
            PreemptReason::QuotaReclaim {
                victim_team,
                preemptor_team,
                gpu_class,
                guaranteed,
            } => write!(
                f,
                "team {preemptor_team} reclaims its guarantee of {guaranteed} {gpu_class} lent to team {victim_team}, which runs above its own guarantee"
            ),
        }
    }
}

/// A workload that waited past the burst threshold, may burst and whose team
/// has budget headroom; the burst controller acts on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BurstWanted {
    pub workload: WorkloadId,
    pub team: String,
    pub gpus_per_replica: Milli,
    pub replicas: u32,
    pub gpu_model: Option<String>,
    /// Burst providers allowed to this team, in policy order.
    pub providers: Vec<String>,
    pub waited_ms: u64,
}

/// Amounts in pending reasons serialize as GPUs (`0.25`, `8`), with `_gpus`
/// in the field name, for people and scripts reading `-o json`.
mod as_gpus {
    use axle_policy::Milli;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &Milli, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(m.as_gpus_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Milli, D::Error> {
        let g = f64::deserialize(d)?;
        Milli::from_gpus_f64(g)
            .ok_or_else(|| serde::de::Error::custom(format!("bad GPU amount {g}")))
    }
}

/// GPUs one team holds where a waiting request could run, and on what terms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holding {
    pub team: String,
    #[serde(with = "as_gpus")]
    pub gpus: Milli,
    /// The team runs above its guarantee in that quota class: what it holds
    /// there is (in part) borrowed.
    pub borrowing: bool,
    /// How much of `gpus` is above the team's guarantee (what it borrows,
    /// at most what it holds here); the rest is within its guarantee.
    #[serde(default, rename = "borrowed_gpus", with = "as_gpus")]
    pub borrowed: Milli,
    /// The waiting request may preempt some of it (by priority, or to
    /// reclaim its own guarantee).
    pub preemptible_by_it: bool,
}

/// The capacity a waiting request could use: where, how much, who holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityDetail {
    /// A cluster name, or `N clusters` when several could hold it.
    pub scope: String,
    /// GPU models (`A100`, `H100|A100`).
    pub gpu_model: String,
    #[serde(rename = "total_gpus", with = "as_gpus")]
    pub total: Milli,
    #[serde(rename = "free_gpus", with = "as_gpus")]
    pub free: Milli,
    /// Largest holders first.
    pub holders: Vec<Holding>,
}

/// Why a workload is still waiting, in words a person understands (each
/// says what blocks it and a way out), with the numbers as fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PendingReason {
    TeamAtLimit {
        team: String,
        gpu_class: String,
        #[serde(rename = "limit_gpus", with = "as_gpus")]
        limit: Milli,
        #[serde(rename = "used_gpus", with = "as_gpus")]
        used: Milli,
        #[serde(rename = "requested_gpus", with = "as_gpus")]
        requested: Milli,
        /// The cap is the team's guarantee: the class is never preempted,
        /// so it never borrows; `used` is the team's never-preempted work.
        within_guarantee_only: bool,
        /// The team's own running work this request may preempt there.
        #[serde(rename = "own_preemptible_gpus", with = "as_gpus")]
        own_preemptible: Milli,
    },
    NoQuotaForModel {
        team: String,
        gpu_model: String,
    },
    NoMatchingCluster {
        gpu_model: Option<String>,
        regions: Vec<String>,
    },
    /// The only clusters that could hold it run container images and have
    /// no default image, and it names none.
    NeedsImage {
        clusters: Vec<String>,
    },
    /// No node (or, for a gang, no cluster) is big enough even when empty.
    NeverFits {
        need: String,
        largest: String,
    },
    /// Capacity exists but is busy now.
    NoFreeCapacity {
        need: Shared<str>,
        #[serde(rename = "largest_free_gpus", with = "as_gpus")]
        largest_free: Milli,
        largest_free_at: Option<Shared<str>>,
        idle_only: bool,
        /// The requesting team.
        team: Shared<str>,
        /// Placing it would take its team above its guarantee: it may use
        /// idle GPUs, and preempt only by priority.
        borrowing: bool,
        /// Its team's guarantee in that quota class.
        #[serde(rename = "guaranteed_gpus", with = "as_gpus")]
        guaranteed: Milli,
        /// Who holds the GPUs it could use.
        capacity: Option<Shared<CapacityDetail>>,
        /// Its team's own running lower-priority work it may preempt.
        #[serde(rename = "own_preemptible_gpus", with = "as_gpus")]
        own_preemptible: Milli,
        /// 1-based position among the waiting requests of the same shape and
        /// priority, in the order the scheduler serves them.
        queue_position: Option<u32>,
        /// When enough capacity frees at the earliest, if running work that
        /// holds it carries a max runtime (caller's clock, ms).
        estimated_start_ms: Option<u64>,
        /// The same, from the cycle's `now`.
        estimated_wait_ms: Option<u64>,
        /// What the estimate rests on when some work in the way has no max
        /// runtime: `212 earlier runs of sweep-*` (its kind's median run).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        estimate_basis: Option<String>,
        /// Why it has not burst to a cloud provider, when it may (the hub's
        /// burst controller fills it in; the scheduler leaves it `None`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        burst: Option<String>,
    },
    /// Left for the next cycle because this cycle's preemption budget is spent.
    PreemptionDeferred,
    /// Not evaluated in detail this cycle (the simulator's fast path).
    NotEvaluated,
}

/// `90 s`, `12 min`, `3.5 h`, `2.0 d`.
fn fmt_wait(ms: u64) -> String {
    let s = ms / 1000;
    if s < 120 {
        format!("{s} s")
    } else if s < 2 * 3600 {
        format!("{} min", s / 60)
    } else if s < 2 * 86_400 {
        format!("{:.1} h", s as f64 / 3600.0)
    } else {
        format!("{:.1} d", s as f64 / 86_400.0)
    }
}

fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, 11) | (2, 12) | (3, 13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

impl fmt::Display for CapacityDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = if self.scope.ends_with(" clusters") {
            "have"
        } else {
            "has"
        };
        write!(f, "{} {verb} {} {}", self.scope, self.total, self.gpu_model)?;
        let mut parts: Vec<String> = self
            .holders
            .iter()
            .map(|h| {
                if h.borrowed == Milli::ZERO {
                    format!("{} held by {} within its guarantee", h.gpus, h.team)
                } else if h.borrowed >= h.gpus {
                    format!("{} borrowed by {}", h.gpus, h.team)
                } else {
                    format!(
                        "{} held by {} ({} within its guarantee, {} borrowed)",
                        h.gpus,
                        h.team,
                        h.gpus.saturating_sub(h.borrowed),
                        h.borrowed
                    )
                }
            })
            .collect();
        let held: Milli = self.holders.iter().map(|h| h.gpus).sum();
        let placing = self.total.saturating_sub(held + self.free);
        if placing > Milli::ZERO {
            parts.push(format!("{placing} being placed now"));
        }
        parts.push(format!("{} free", self.free));
        write!(f, ": {}", parts.join(", "))
    }
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PendingReason::TeamAtLimit {
                team,
                gpu_class,
                limit,
                used,
                requested,
                within_guarantee_only,
                own_preemptible,
            } => {
                if *within_guarantee_only {
                    write!(
                        f,
                        "team {team}'s never-preempted work would exceed its guarantee of {limit} {gpu_class} GPUs ({used} in use by such work, this needs {requested} more), and it runs only within the guarantee; it starts when that work ends, or submit it in a preemptible class to borrow idle GPUs"
                    )?;
                } else {
                    write!(
                        f,
                        "team {team} is at its limit of {limit} {gpu_class} GPUs ({used} in use, this needs {requested} more); it starts when the team's work there ends, or ask the platform team to raise the limit"
                    )?;
                }
                if *own_preemptible > Milli::ZERO {
                    write!(
                        f,
                        " (its lower priority work this class may preempt holds only {own_preemptible} GPUs)"
                    )?;
                }
                Ok(())
            }
            PendingReason::NoQuotaForModel { team, gpu_model } => write!(
                f,
                "team {team} has no quota for {gpu_model} GPUs (no {gpu_model} or any entry in its quotas); ask the platform team for one, or ask for a GPU model the team has quota for"
            ),
            PendingReason::NoMatchingCluster { gpu_model, regions } => {
                let gpus = match gpu_model {
                    Some(m) => format!("{m} GPUs"),
                    None => "GPUs".to_string(),
                };
                if regions.is_empty() {
                    write!(f, "no schedulable cluster has {gpus}")?;
                } else {
                    write!(
                        f,
                        "no schedulable cluster in region {} has {gpus}",
                        regions.join("|")
                    )?;
                }
                match (gpu_model, regions.is_empty()) {
                    (None, true) => write!(
                        f,
                        "; it starts when a cluster's spoke connects (axle get clusters shows them)"
                    ),
                    _ => write!(
                        f,
                        "; it starts when such a cluster's spoke connects, or drop the GPU model or region"
                    ),
                }
            }
            PendingReason::NeedsImage { clusters } => write!(
                f,
                "the clusters that could hold it ({}) run container images and have no defaultImage; submit it with --image, or give the Cluster a defaultImage",
                clusters.join(", ")
            ),
            PendingReason::NeverFits { need, largest } => {
                write!(
                    f,
                    "needs {need}; the largest is {largest}, so this can never fit; ask for fewer GPUs, or allow spreading across nodes"
                )
            }
            PendingReason::NoFreeCapacity {
                need,
                largest_free,
                largest_free_at,
                idle_only,
                team,
                borrowing,
                guaranteed,
                capacity,
                own_preemptible,
                queue_position,
                estimated_start_ms: _,
                estimated_wait_ms,
                estimate_basis,
                burst,
            } => {
                write!(
                    f,
                    "needs {need}; the largest free block is {largest_free} GPUs"
                )?;
                if let Some(at) = largest_free_at {
                    write!(f, " ({at})")?;
                }
                if *idle_only {
                    write!(
                        f,
                        "; this class runs only on idle capacity and never preempts"
                    )?;
                }
                if let Some(c) = capacity {
                    write!(f, ". {c}")?;
                }
                if *borrowing {
                    write!(
                        f,
                        "; {team} is past its guarantee of {guaranteed} here, so it may borrow only idle GPUs (and preempt lower priority work of teams that borrow)"
                    )?;
                } else if !*idle_only {
                    write!(
                        f,
                        "; {team} is within its guarantee of {guaranteed}, but no GPUs it may reclaim would make room"
                    )?;
                }
                if *own_preemptible > Milli::ZERO {
                    write!(
                        f,
                        "; its own lower priority work holds {own_preemptible} GPUs it may preempt, not where this fits"
                    )?;
                }
                if let Some(p) = queue_position {
                    write!(f, "; {} in line for this shape", ordinal(*p))?;
                }
                match (estimated_wait_ms, estimate_basis) {
                    (Some(w), None) => write!(
                        f,
                        "; estimated start in {} (when the work holding the GPUs reaches its max runtime, if nothing ahead takes them)",
                        fmt_wait(*w)
                    ),
                    (Some(w), Some(b)) => write!(
                        f,
                        "; estimated start in about {}, from {b} (if nothing ahead takes the GPUs)",
                        fmt_wait(*w)
                    ),
                    (None, _) => write!(
                        f,
                        "; no estimate (the work holding the GPUs has no max runtime and no earlier runs of its kind to go by, or more work waits before it than that work frees)"
                    ),
                }?;
                match burst {
                    Some(b) => write!(f, "; cloud burst: {b}"),
                    None => Ok(()),
                }
            }
            PendingReason::PreemptionDeferred => write!(
                f,
                "needs GPUs held by preemptible work; preemption is deferred to the next cycle (within a second)"
            ),
            PendingReason::NotEvaluated => write!(f, "queued; not evaluated in detail this cycle"),
        }
    }
}

/// Everything one cycle decided. Applying it is the caller's job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Decisions {
    pub placements: Vec<Placement>,
    pub preemptions: Vec<Preemption>,
    pub burst_wanted: Vec<BurstWanted>,
    /// A reason for every workload left waiting (when the cycle explains).
    pub pending: Vec<(WorkloadId, PendingReason)>,
}

#[cfg(test)]
mod reason_text_tests {
    use super::PendingReason;

    #[test]
    fn a_request_without_a_model_waiting_for_any_cluster_reads_plainly() {
        // Observed: "no schedulable cluster has GPU GPUs".
        let r = PendingReason::NoMatchingCluster {
            gpu_model: None,
            regions: Vec::new(),
        };
        assert_eq!(
            r.to_string(),
            "no schedulable cluster has GPUs; it starts when a cluster's spoke connects (axle get clusters shows them)"
        );
        let r = PendingReason::NoMatchingCluster {
            gpu_model: Some("H100".into()),
            regions: vec!["eu-west".into()],
        };
        assert!(
            r.to_string()
                .starts_with("no schedulable cluster in region eu-west has H100 GPUs; ")
        );
    }
}
