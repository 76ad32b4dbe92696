//! What a replay measured: utilization, queueing delay, preemptions and the
//! work they cost, guarantee violations, and each team's share, overall and
//! per team and priority class.

use std::collections::BTreeMap;

use axle_policy::{Milli, Policy};
use serde::Serialize;

use crate::baseline::Mode;
use crate::replay::SimJob;

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

/// One priority class's figures: its jobs' queueing, and the churn it
/// suffered.
#[derive(Debug, Clone, Serialize)]
pub struct ClassReport {
    pub queue_delay_s: DelayStats,
    /// Times workloads of the class were preempted.
    pub preemptions: u64,
    /// GPU-hours of work its preempted workloads threw away.
    pub gpu_hours_lost_to_preemption: f64,
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
    pub per_priority_class: BTreeMap<String, ClassReport>,
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

/// What happened to one job in a replay.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct JobOutcome {
    /// Time spent waiting, all waits together.
    pub waited_ms: u64,
    pub finished: bool,
    /// GPU·ms it ran (GPUs × ms).
    pub gpu_ms: f64,
    pub lost_gpu_ms: f64,
    pub preemptions: u64,
}

/// The fleet-wide figures a replay measured itself.
pub(crate) struct Totals {
    pub capacity: Milli,
    pub gpu_utilization: f64,
    pub idle_while_waiting_gpu_hours: f64,
    pub preemptions: u64,
    pub guarantee_violations: u64,
    pub violations_per_team: BTreeMap<String, u64>,
    pub makespan_s: u64,
    pub cycles: u64,
    pub rejected_reasons: BTreeMap<String, u64>,
    pub start_estimates: Option<EstimateReport>,
}

/// The report of a replay: per-job outcomes folded per team and per
/// priority class (under the names the trace gave them), beside the totals.
pub(crate) fn summarize(
    policy: &Policy,
    jobs: &[SimJob],
    outcomes: &[JobOutcome],
    mode: Mode,
    t: Totals,
) -> SimReport {
    #[derive(Default)]
    struct Acc {
        delays: Vec<f64>,
        finished: u64,
        gpu_hours: f64,
        preemptions: u64,
        lost: f64,
    }
    let mut teams: BTreeMap<&str, Acc> = BTreeMap::new();
    let mut classes: BTreeMap<&str, Acc> = BTreeMap::new();
    let mut all = Vec::new();
    let mut lost_total = 0f64;
    for (j, o) in jobs.iter().zip(outcomes) {
        let lost = o.lost_gpu_ms / 3.6e6;
        lost_total += lost;
        for acc in [
            teams.entry(&j.team).or_default(),
            classes.entry(&j.priority_class).or_default(),
        ] {
            acc.gpu_hours += o.gpu_ms / 3.6e6;
            acc.preemptions += o.preemptions;
            acc.lost += lost;
            if o.finished {
                acc.finished += 1;
                acc.delays.push(o.waited_ms as f64 / 1000.0);
            }
        }
        if o.finished {
            all.push(o.waited_ms as f64 / 1000.0);
        }
    }
    let cap = t.capacity.0 as f64;
    let total_hours: f64 = teams.values().map(|a| a.gpu_hours).sum();
    let per_team = teams
        .into_iter()
        .map(|(team, a)| {
            let entitlement = policy
                .teams
                .get(team)
                .map(|t| {
                    t.quotas.values().map(|q| q.guaranteed.0).sum::<u64>() as f64 / cap.max(1.0)
                })
                .unwrap_or(0.0);
            (
                team.to_string(),
                TeamReport {
                    jobs_finished: a.finished,
                    gpu_hours: a.gpu_hours,
                    share: if total_hours > 0.0 {
                        a.gpu_hours / total_hours
                    } else {
                        0.0
                    },
                    entitlement,
                    queue_delay_s: DelayStats::of(a.delays),
                    preemptions: a.preemptions,
                    gpu_hours_lost_to_preemption: a.lost,
                    guarantee_violations: t.violations_per_team.get(team).copied().unwrap_or(0),
                },
            )
        })
        .collect();
    let per_priority_class = classes
        .into_iter()
        .map(|(class, a)| {
            (
                class.to_string(),
                ClassReport {
                    queue_delay_s: DelayStats::of(a.delays),
                    preemptions: a.preemptions,
                    gpu_hours_lost_to_preemption: a.lost,
                },
            )
        })
        .collect();
    let finished = all.len() as u64;
    SimReport {
        mode,
        capacity_gpus: t.capacity.as_gpus_f64(),
        jobs_submitted: jobs.len() as u64,
        jobs_rejected: t.rejected_reasons.values().sum(),
        jobs_finished: finished,
        gpu_utilization: t.gpu_utilization,
        queue_delay_s: DelayStats::of(all),
        idle_while_waiting_gpu_hours: t.idle_while_waiting_gpu_hours,
        preemptions: t.preemptions,
        gpu_hours_lost_to_preemption: lost_total,
        guarantee_violations: t.guarantee_violations,
        makespan_s: t.makespan_s,
        cycles: t.cycles,
        per_team,
        per_priority_class,
        rejected_reasons: t.rejected_reasons,
        start_estimates: t.start_estimates,
    }
}
