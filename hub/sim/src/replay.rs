//! The trace simulator: replays jobs through the same `cycle` the hub runs,
//! on a simulated clock, and measures utilization, queueing, preemptions and
//! each team's share. Also models today's alternatives as baselines.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use axle_policy::{ANY_GPU_CLASS, MILLI_PER_GPU, Milli, Policy, Quota, Team, TeamBurst};
use serde::Serialize;

use axle_scheduler::validate::round_to_granularity;
use axle_scheduler::{
    CycleOptions, Inventory, RequestError, State, WorkloadId, WorkloadSpec, cycle,
};

/// How the simulated fleet is governed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Axle: quotas with borrowing, reclaim, priorities, fair share, backfill.
    Axle,
    /// Today's manual allocation: each team only on its own guaranteed GPUs.
    Static,
    /// One FIFO queue, no quotas, no backfill (head-of-line blocking).
    Fifo,
}

/// One job to replay. Times in seconds from the trace start.
#[derive(Debug, Clone, PartialEq)]
pub struct SimJob {
    pub name: String,
    pub submit_time_s: u64,
    pub duration_s: u64,
    pub gpus_per_replica: Milli,
    pub replicas: u32,
    pub allow_spread: bool,
    pub team: String,
    pub priority_class: String,
    pub gpu_model: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DelayStats {
    pub mean: f64,
    pub p95: f64,
    pub jobs: u64,
}

impl DelayStats {
    fn of(mut v: Vec<f64>) -> DelayStats {
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
    pub makespan_s: u64,
    pub cycles: u64,
    pub per_team: BTreeMap<String, TeamReport>,
    pub per_priority_class: BTreeMap<String, DelayStats>,
    /// Why jobs were refused at submit, with counts.
    pub rejected_reasons: BTreeMap<String, u64>,
}

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

/// A FIFO policy: one team `fifo` with the whole capacity on `any`, and every job's team
/// renamed. Per-team figures keep the original names.
fn fifo_policy(policy: &Policy, capacity: Milli) -> Policy {
    let mut p = policy.clone();
    p.teams = BTreeMap::from([(
        "fifo".to_string(),
        Team {
            name: "fifo".to_string(),
            quotas: BTreeMap::from([(
                ANY_GPU_CLASS.to_string(),
                Quota {
                    guaranteed: capacity,
                    limit: capacity,
                },
            )]),
            weight: 1.0,
            members: Vec::new(),
            burst: TeamBurst::default(),
        },
    )]);
    p
}

struct JobRun {
    remaining_ms: u64,
    started_ms: Option<u64>,
    waited_ms: u64,
    pending_since_ms: u64,
    gpu_ms: f64,
    finished: bool,
}

/// Replays `jobs` (sorted by submit time) on `inventory` under `policy`.
/// `policy` must already contain every team (see [`complete_policy`]).
pub fn simulate(policy: &Policy, inventory: &Inventory, jobs: &[SimJob], mode: Mode) -> SimReport {
    let base = State::new(Arc::new(policy.clone()), inventory);
    let capacity = base.capacity();
    let effective = match mode {
        Mode::Axle => policy.clone(),
        Mode::Static => static_policy(policy),
        Mode::Fifo => fifo_policy(policy, capacity),
    };
    let granularity = effective.settings.fraction_granularity;
    let mut state = State::new(Arc::new(effective), inventory);
    let opts = CycleOptions {
        explain: false,
        ..CycleOptions::default()
    };

    let mut runs: Vec<JobRun> = Vec::with_capacity(jobs.len());
    let mut specs: Vec<Arc<WorkloadSpec>> = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        let submit_ms = j.submit_time_s * 1000;
        runs.push(JobRun {
            remaining_ms: j.duration_s.max(1) * 1000,
            started_ms: None,
            waited_ms: 0,
            pending_since_ms: submit_ms,
            gpu_ms: 0.0,
            finished: false,
        });
        specs.push(Arc::new(WorkloadSpec {
            id: i as WorkloadId,
            team: if mode == Mode::Fifo {
                "fifo".to_string()
            } else {
                j.team.clone()
            },
            priority_class: j.priority_class.clone(),
            gpus_per_replica: round_to_granularity(j.gpus_per_replica, granularity),
            replicas: j.replicas.max(1),
            gpu_model: j.gpu_model.clone(),
            regions: Vec::new(),
            allow_spread: j.allow_spread,
            burst_allowed: false,
            submit_time_ms: submit_ms,
            checkpoint_interval_s: policy
                .priority_classes
                .get(&j.priority_class)
                .filter(|c| c.checkpointable)
                .map(|c| c.checkpoint_interval_s),
            max_runtime_s: None,
        }));
    }

    let mut rejected: BTreeMap<String, u64> = BTreeMap::new();
    let mut completions: BTreeSet<(u64, WorkloadId)> = BTreeSet::new();
    let mut fifo: VecDeque<WorkloadId> = VecDeque::new();
    let mut next = 0usize;
    let mut now = jobs.first().map(|j| j.submit_time_s * 1000).unwrap_or(0);
    let start = now;
    let mut last_t = now;
    let mut alloc_integral = 0f64; // milli-GPU·ms
    let mut idle_waiting_integral = 0f64;
    let mut preemptions = 0u64;
    let mut cycles = 0u64;
    let cap = capacity.0 as f64;
    // Demand (milli) of pending workloads, for the idle-while-waiting figure.
    let mut waiting_demand: u64 = 0;

    loop {
        let next_arrival = specs.get(next).map(|s| s.submit_time_ms);
        let next_done = completions.first().map(|&(t, _)| t);
        let t = match (next_arrival, next_done) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(d)) => d,
            (Some(a), Some(d)) => a.min(d),
        };
        // Integrate over [last_t, t) with the allocation as it stood.
        let dt = (t - last_t) as f64;
        let allocated = state.allocated().0 as f64;
        alloc_integral += allocated * dt;
        let idle = (cap - allocated).max(0.0);
        idle_waiting_integral += idle.min(waiting_demand as f64) * dt;
        last_t = t;
        now = t;

        while let Some(&(d, id)) = completions.first() {
            if d != t {
                break;
            }
            completions.pop_first();
            let r = &mut runs[id as usize];
            if let Some(s) = r.started_ms.take() {
                r.gpu_ms += specs[id as usize].total_gpus().as_gpus_f64() * (t - s) as f64;
            }
            r.remaining_ms = 0;
            r.finished = true;
            state.remove(id);
        }
        while next < specs.len() && specs[next].submit_time_ms == t {
            let spec = specs[next].clone();
            next += 1;
            if mode == Mode::Fifo {
                match state.validate(&spec) {
                    Ok(()) => {
                        waiting_demand += spec.total_gpus().0;
                        fifo.push_back(spec.id);
                    }
                    Err(e) => *rejected.entry(reject_key(&e)).or_default() += 1,
                }
                continue;
            }
            let demand = spec.total_gpus().0;
            match state.submit((*spec).clone()) {
                Ok(()) => waiting_demand += demand,
                Err(e) => *rejected.entry(reject_key(&e)).or_default() += 1,
            }
        }

        if mode == Mode::Fifo {
            // Strict FIFO: start jobs from the head while the head fits.
            while let Some(&head) = fifo.front() {
                let spec = specs[head as usize].clone();
                if state.submit((*spec).clone()).is_err() {
                    fifo.pop_front();
                    continue;
                }
                cycles += 1;
                let d = cycle(&state, t, &opts);
                if d.placements.is_empty() {
                    state.remove(head);
                    break;
                }
                let _ = state.apply(&d, t);
                fifo.pop_front();
                waiting_demand -= spec.total_gpus().0;
                let r = &mut runs[head as usize];
                r.waited_ms += t - r.pending_since_ms;
                r.started_ms = Some(t);
                completions.insert((t + r.remaining_ms, head));
            }
            continue;
        }

        cycles += 1;
        let d = cycle(&state, t, &opts);
        if d.placements.is_empty() && d.preemptions.is_empty() {
            continue;
        }
        // Decisions from our own cycle on our own state always apply.
        let _ = state.apply(&d, t);
        for p in &d.preemptions {
            preemptions += 1;
            let id = p.workload;
            let r = &mut runs[id as usize];
            if let Some(s) = r.started_ms.take() {
                let ran = t - s;
                r.gpu_ms += specs[id as usize].total_gpus().as_gpus_f64() * ran as f64;
                completions.remove(&(s + r.remaining_ms, id));
                // Checkpointed: the job resumes with the work it has left.
                r.remaining_ms -= ran.min(r.remaining_ms.saturating_sub(1));
            }
            r.pending_since_ms = t;
            waiting_demand += specs[id as usize].total_gpus().0;
        }
        for p in &d.placements {
            let id = p.workload;
            let r = &mut runs[id as usize];
            r.waited_ms += t - r.pending_since_ms;
            r.started_ms = Some(t);
            completions.insert((t + r.remaining_ms, id));
            waiting_demand -= specs[id as usize].total_gpus().0;
        }
    }

    let span = (now - start).max(1) as f64;
    let mut per_team_delay: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut per_class_delay: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut per_team_hours: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    let mut all = Vec::new();
    let mut finished = 0u64;
    for (i, r) in runs.iter().enumerate() {
        let j = &jobs[i];
        let e = per_team_hours.entry(j.team.clone()).or_default();
        e.1 += r.gpu_ms / 3.6e6;
        if !r.finished {
            continue;
        }
        finished += 1;
        e.0 += 1;
        let wait_s = r.waited_ms as f64 / 1000.0;
        all.push(wait_s);
        per_team_delay
            .entry(j.team.clone())
            .or_default()
            .push(wait_s);
        per_class_delay
            .entry(j.priority_class.clone())
            .or_default()
            .push(wait_s);
    }
    let total_hours: f64 = per_team_hours.values().map(|v| v.1).sum();
    let per_team = per_team_hours
        .into_iter()
        .map(|(team, (n, h))| {
            let entitlement = policy
                .teams
                .get(&team)
                .map(|t| {
                    t.quotas.values().map(|q| q.guaranteed.0).sum::<u64>() as f64 / cap.max(1.0)
                })
                .unwrap_or(0.0);
            let delays = per_team_delay.remove(&team).unwrap_or_default();
            (
                team,
                TeamReport {
                    jobs_finished: n,
                    gpu_hours: h,
                    share: if total_hours > 0.0 {
                        h / total_hours
                    } else {
                        0.0
                    },
                    entitlement,
                    queue_delay_s: DelayStats::of(delays),
                },
            )
        })
        .collect();
    SimReport {
        mode,
        capacity_gpus: capacity.as_gpus_f64(),
        jobs_submitted: jobs.len() as u64,
        jobs_rejected: rejected.values().sum(),
        jobs_finished: finished,
        gpu_utilization: if cap > 0.0 {
            alloc_integral / (cap * span)
        } else {
            0.0
        },
        queue_delay_s: DelayStats::of(all),
        idle_while_waiting_gpu_hours: idle_waiting_integral / MILLI_PER_GPU as f64 / 3.6e6,
        preemptions,
        makespan_s: (now - start) / 1000,
        cycles,
        per_team,
        per_priority_class: per_class_delay
            .into_iter()
            .map(|(k, v)| (k, DelayStats::of(v)))
            .collect(),
        rejected_reasons: rejected,
    }
}

fn reject_key(e: &RequestError) -> String {
    use RequestError as E;
    match e {
        E::AboveLimit { .. } => "request above the team's limit".into(),
        E::NeverFitsNode { .. } => "larger than any node".into(),
        E::NoQuota { .. } => "team has no quota for the GPU model".into(),
        E::UnknownGpuModel { .. } => "no cluster has the GPU model".into(),
        other => other.to_string(),
    }
}
