//! What a replay measured: utilization, queueing delay, preemptions and the
//! work they cost, guarantee violations, and each team's share, overall and
//! per team and priority class.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::baseline::Mode;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DelayStats {
    pub mean: f64,
    pub p95: f64,
    pub jobs: u64,
}

impl DelayStats {
    pub(crate) fn of(mut v: Vec<f64>) -> DelayStats {
        if v.is_empty() {
            return DelayStats {
                mean: 0.0,
                p95: 0.0,
                jobs: 0,
            };
        }
        v.sort_by(f64::total_cmp);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let idx = ((v.len() as f64) * 0.95).ceil() as usize;
        let p95 = v[idx.clamp(1, v.len()) - 1];
        DelayStats {
            mean,
            p95,
            jobs: v.len() as u64,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TeamReport {
    pub jobs_finished: u64,
    pub gpu_hours: f64,
    /// Share of all GPU-hours used in the run.
    pub share: f64,
    /// Guaranteed GPUs over capacity: what the team is entitled to.
    pub entitlement: f64,
    pub queue_delay_s: DelayStats,
    /// Times the team's workloads were preempted.
    pub preemptions: u64,
    /// GPU-hours of work its preempted workloads threw away.
    pub gpu_hours_lost_to_preemption: f64,
    /// Workloads of the team that waited although they fitted its
    /// guarantee and other teams held borrowed GPUs they could have used.
    pub guarantee_violations: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    pub mode: Mode,
    pub capacity_gpus: f64,
    pub jobs_submitted: u64,
    pub jobs_rejected: u64,
    pub jobs_finished: u64,
    /// Time-weighted allocated / total GPUs from the first submit to the last finish.
    pub gpu_utilization: f64,
    pub queue_delay_s: DelayStats,
    /// GPU-hours idle while waiting work could have used them.
    pub idle_while_waiting_gpu_hours: f64,
    pub preemptions: u64,
    /// GPU-hours of work thrown away by preemptions: all of a run for a
    /// workload without checkpoints, else what it did since its last one.
    pub gpu_hours_lost_to_preemption: f64,
    /// Workloads that waited after a cycle although they fitted their team's
    /// guarantee and other teams held borrowed, preemptible GPUs on which
    /// they would have fitted (see `guarantee.rs`). Axle must keep it at 0.
    pub guarantee_violations: u64,
    pub makespan_s: u64,
    pub cycles: u64,
    pub per_team: BTreeMap<String, TeamReport>,
    pub per_priority_class: BTreeMap<String, DelayStats>,
    /// Why jobs were refused at submit, with counts.
    pub rejected_reasons: BTreeMap<String, u64>,
    /// How good the start estimates of waiting jobs were (Axle only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_estimates: Option<EstimateReport>,
}

/// Start estimates against real starts: for every job that waited, the
/// estimate its pending reason gave when it first waited (from the max
/// runtimes, else the observed run times of the work in the way).
#[derive(Debug, Clone, Default, Serialize)]
pub struct EstimateReport {
    /// Jobs that waited before they started.
    pub waited: u64,
    /// Of those, jobs that got an estimate.
    pub estimated: u64,
    /// Estimates within ±25 % of the real wait.
    pub within_25pct: u64,
    pub fraction_within_25pct: f64,
}
