//! The fleets a trace is replayed on: Axle's policy as written (with teams
//! the trace names and the policy lacks), and today's alternatives: static
//! per-team allocation and a greedy first-fit queue that lets large jobs
//! spread over partly used nodes, as policies the same core runs, and the
//! textbook first-fit and FIFO queues (`textbook.rs`), written apart from it.

use std::collections::BTreeMap;

use axle_policy::{
    ANY_GPU_CLASS, MILLI_PER_GPU, Milli, Policy, PriorityClass, Quota, Team, TeamBurst,
};
use serde::Serialize;

use crate::replay::SimJob;

/// How the simulated fleet is governed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Axle: quotas with borrowing, reclaim, priorities, fair share, backfill.
    Axle,
    /// Today's manual allocation: each team only on its own guaranteed GPUs.
    Static,
    /// Textbook FIFO: one queue in arrival order, no quotas, no backfill
    /// (the head of the line blocks everything behind it).
    Fifo,
    /// Textbook first-fit: one queue in arrival order scanned whole at every
    /// arrival and finish, starting whatever fits (greedy backfill); best
    /// fit for jobs of one node, whole free nodes for larger ones. Never
    /// preempts.
    #[serde(rename = "firstfit")]
    FirstFit,
    /// First-fit through Axle's core with one team and one class: a job
    /// larger than one node may spread over partly used nodes.
    #[serde(rename = "firstfit-spread")]
    FirstFitSpread,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Axle => "axle",
            Mode::Static => "static",
            Mode::Fifo => "fifo",
            Mode::FirstFit => "firstfit",
            Mode::FirstFitSpread => "firstfit-spread",
        }
    }
}

/// The team every job belongs to under the single-queue baselines.
pub(crate) const ONE_QUEUE_TEAM: &str = "fifo";
/// The one priority class of the first-fit baseline: never preempted, so
/// the baseline never preempts.
pub(crate) const FIRST_FIT_CLASS: &str = "firstfit";

/// Makes a policy able to run `jobs`: teams named in the jobs but absent from
/// the policy get guarantees in proportion to their share of the jobs'
/// GPU-hours (limit = the whole capacity) on the `any` class. Returns the
/// policy and one note per created team.
pub fn complete_policy(policy: &Policy, jobs: &[SimJob], capacity: Milli) -> (Policy, Vec<String>) {
    let mut p = policy.clone();
    let mut gpu_hours: BTreeMap<&str, f64> = BTreeMap::new();
    for j in jobs {
        *gpu_hours.entry(&j.team).or_default() +=
            j.gpus_per_replica.as_gpus_f64() * f64::from(j.replicas) * j.duration_s as f64 / 3600.0;
    }
    let missing: Vec<(&str, f64)> = gpu_hours
        .iter()
        .filter(|(t, _)| !p.teams.contains_key(**t))
        .map(|(t, h)| (*t, *h))
        .collect();
    let total: f64 = missing.iter().map(|(_, h)| h).sum();
    let trace_total: f64 = gpu_hours.values().sum();
    // Guarantees already promised by the policy's own teams.
    let promised: u64 = p
        .teams
        .values()
        .flat_map(|t| t.quotas.values())
        .map(|q| q.guaranteed.0)
        .sum();
    let free_for_new = capacity.0.saturating_sub(promised);
    let mut notes = Vec::new();
    for (t, h) in missing {
        let share = if total > 0.0 { h / total } else { 0.0 };
        // Whole GPUs, rounded down, so the guarantees never over-commit capacity.
        let g = ((free_for_new as f64 * share) / MILLI_PER_GPU as f64).floor() as u64;
        let guaranteed = Milli::gpus(g);
        let of_trace = if trace_total > 0.0 {
            h / trace_total
        } else {
            0.0
        };
        notes.push(format!(
            "team {t} is not in the policy: created with {guaranteed} GPUs guaranteed ({:.1}% of the trace's GPU-hours), limit {capacity}",
            of_trace * 100.0
        ));
        p.teams.insert(
            t.to_string(),
            Team {
                name: t.to_string(),
                quotas: BTreeMap::from([(
                    ANY_GPU_CLASS.to_string(),
                    Quota {
                        guaranteed,
                        limit: capacity,
                    },
                )]),
                weight: 1.0,
                members: Vec::new(),
                groups: Vec::new(),
                burst: TeamBurst::default(),
            },
        );
    }
    (p, notes)
}

/// Turns a policy into today's static allocation: every team capped at its guarantee.
pub fn static_policy(policy: &Policy) -> Policy {
    let mut p = policy.clone();
    for t in p.teams.values_mut() {
        for q in t.quotas.values_mut() {
            q.limit = q.guaranteed;
        }
    }
    p
}

/// One queue: one team `fifo` with the whole capacity on `any`, and every job's team
/// renamed. Per-team figures keep the original names.
fn one_queue_policy(policy: &Policy, capacity: Milli) -> Policy {
    let mut p = policy.clone();
    p.teams = BTreeMap::from([(
        ONE_QUEUE_TEAM.to_string(),
        Team {
            name: ONE_QUEUE_TEAM.to_string(),
            quotas: BTreeMap::from([(
                ANY_GPU_CLASS.to_string(),
                Quota {
                    guaranteed: capacity,
                    limit: capacity,
                },
            )]),
            weight: 1.0,
            members: Vec::new(),
            groups: Vec::new(),
            burst: TeamBurst::default(),
        },
    )]);
    p
}

/// The first-fit baseline: one queue (every job in one team with the whole
/// capacity) and one priority class, so the cycle places in submit order
/// whatever fits and never preempts.
pub(crate) fn first_fit_policy(policy: &Policy, capacity: Milli) -> Policy {
    let mut p = one_queue_policy(policy, capacity);
    p.priority_classes = BTreeMap::from([(
        FIRST_FIT_CLASS.to_string(),
        PriorityClass {
            name: FIRST_FIT_CLASS.to_string(),
            value: 0,
            preemptible_by: Vec::new(),
            grace_period_s: 0,
            idle_only: false,
            burst_allowed: false,
            checkpointable: false,
            checkpoint_interval_s: axle_policy::DEFAULT_CHECKPOINT_INTERVAL_S,
            checkpoint_signal: "SIGTERM".to_string(),
            placement: axle_policy::GangPlacement::Packed,
            min_runtime_s: 0,
            tolerable_wait_s: 0,
        },
    )]);
    p.settings.default_priority_class = FIRST_FIT_CLASS.to_string();
    p
}
