//! The replay loop: jobs arrive and finish on a simulated clock, and every
//! time something changes the same `cycle` the hub runs decides. Measures
//! utilization, queueing, preemptions and the work they lose, guarantee
//! violations, and each team's share.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axle_policy::{MILLI_PER_GPU, Milli, Policy};
use axle_scheduler::validate::round_to_granularity;
use axle_scheduler::{
    CycleOptions, Decisions, Inventory, RequestError, RuntimeStats, State, WorkloadId,
    WorkloadSpec, cycle, estimate_start,
};

use crate::baseline::{FIRST_FIT_CLASS, Mode, ONE_QUEUE_TEAM, first_fit_policy, static_policy};
use crate::guarantee::{GuaranteeBook, Shape};
use crate::report::{EstimateReport, JobOutcome, SimReport, Totals, summarize};
use crate::textbook::{self, Discipline};

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

impl SimJob {
    /// GPUs of all replicas together.
    pub fn total_gpus(&self) -> Milli {
        Milli(self.gpus_per_replica.0 * u64::from(self.replicas.max(1)))
    }
}

/// How far a replay has come, for a progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub jobs_submitted: u64,
    pub jobs_total: u64,
}

/// Progress is reported every this many simulated events: often enough for
/// a smooth bar (a full trace has ~100,000 events), rarely enough to cost
/// nothing.
const PROGRESS_EVERY_EVENTS: u64 = 1024;

/// Cycles run at one simulated instant while the previous one decided
/// something. Most instants settle in two rounds; eight covers the longest
/// chains of reclaim seen in the traces, and more would only cost time.
const MAX_CYCLES_PER_INSTANT: usize = 8;

struct JobRun {
    /// Work left, in ms of running time.
    remaining_ms: u64,
    started_ms: Option<u64>,
    waited_ms: u64,
    pending_since_ms: u64,
    gpu_ms: f64,
    lost_gpu_ms: f64,
    preemptions: u64,
    finished: bool,
}

/// Replays `jobs` (sorted by submit time) on `inventory` under `policy`.
/// `policy` must already contain every team (see
/// [`crate::complete_policy`]). `progress` is called now and then.
pub fn simulate(
    policy: &Policy,
    inventory: &Inventory,
    jobs: &[SimJob],
    mode: Mode,
    progress: &mut dyn FnMut(Progress),
) -> SimReport {
    let base = State::new(Arc::new(policy.clone()), inventory);
    let capacity = base.capacity();
    let effective = match mode {
        Mode::Axle => policy.clone(),
        Mode::Static => static_policy(policy),
        Mode::FirstFitSpread => first_fit_policy(policy, capacity),
        Mode::FirstFit => {
            return textbook::replay(policy, inventory, jobs, Discipline::FirstFit, progress);
        }
        Mode::Fifo => return textbook::replay(policy, inventory, jobs, Discipline::Fifo, progress),
    };
    let granularity = effective.settings.fraction_granularity;
    let mut state = State::new(Arc::new(effective), inventory);
    let opts = CycleOptions {
        explain: false,
        ..CycleOptions::default()
    };

    let mut runs: Vec<JobRun> = Vec::with_capacity(jobs.len());
    // As the replayed policy sees them (one team under the one-queue modes).
    let mut specs: Vec<Arc<WorkloadSpec>> = Vec::with_capacity(jobs.len());
    // As the written policy sees them: for guarantees and checkpoints.
    let mut own: Vec<WorkloadSpec> = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        let submit_ms = j.submit_time_s * 1000;
        runs.push(JobRun {
            remaining_ms: j.duration_s.max(1) * 1000,
            started_ms: None,
            waited_ms: 0,
            pending_since_ms: submit_ms,
            gpu_ms: 0.0,
            lost_gpu_ms: 0.0,
            preemptions: 0,
            finished: false,
        });
        let spec = WorkloadSpec {
            id: i as WorkloadId,
            team: j.team.clone(),
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
            has_image: false,
            expected_runtime: None,
        };
        let mut replayed = spec.clone();
        if mode == Mode::FirstFitSpread {
            replayed.team = ONE_QUEUE_TEAM.to_string();
            replayed.priority_class = FIRST_FIT_CLASS.to_string();
        }
        specs.push(Arc::new(replayed));
        own.push(spec);
    }
    let models: Vec<String> = {
        let mut m: BTreeSet<String> = BTreeSet::new();
        for c in &inventory.clusters {
            for n in &c.nodes {
                m.insert(n.gpu_model.clone());
            }
        }
        m.into_iter().collect()
    };
    let mut book = GuaranteeBook::new(policy, own.iter().map(Shape::from).collect(), &models);

    let mut rejected: BTreeMap<String, u64> = BTreeMap::new();
    let mut completions: BTreeSet<(u64, WorkloadId)> = BTreeSet::new();
    let mut next = 0usize;
    let mut now = jobs.first().map(|j| j.submit_time_s * 1000).unwrap_or(0);
    let start = now;
    let mut last_t = now;
    let mut alloc_integral = 0f64; // milli-GPU·ms
    let mut idle_waiting_integral = 0f64;
    let mut preemptions = 0u64;
    let mut violations = 0u64;
    let mut cycles = 0u64;
    let mut events = 0u64;
    let cap = capacity.0 as f64;
    // Demand (milli) of pending workloads, for the idle-while-waiting figure.
    let mut waiting_demand: u64 = 0;
    let total = jobs.len() as u64;
    // Start estimates, checked against what happened (Axle only): run
    // times of finished jobs by kind, each waiting job's estimated start
    // when it first waited, and its first start.
    let mut runtimes = RuntimeStats::new();
    let mut eta: Vec<Option<u64>> = vec![None; jobs.len()];
    let mut first_start: Vec<Option<u64>> = vec![None; jobs.len()];
    let mut submitted_now: Vec<WorkloadId> = Vec::new();
    progress(Progress {
        jobs_submitted: 0,
        jobs_total: total,
    });

    loop {
        let next_arrival = specs.get(next).map(|s| s.submit_time_ms);
        let next_done = completions.first().map(|&(t, _)| t);
        let t = match (next_arrival, next_done) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(d)) => d,
            (Some(a), Some(d)) => a.min(d),
        };
        events += 1;
        if events.is_multiple_of(PROGRESS_EVERY_EVENTS) {
            progress(Progress {
                jobs_submitted: next as u64,
                jobs_total: total,
            });
        }
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
            if mode == Mode::Axle {
                let j = &jobs[id as usize];
                runtimes.record(&j.team, &j.priority_class, &j.name, j.duration_s);
            }
            book.stop(id as usize, specs[id as usize].total_gpus());
        }
        submitted_now.clear();
        while next < specs.len() && specs[next].submit_time_ms == t {
            let spec = specs[next].clone();
            next += 1;
            let admitted = {
                let mut s = (*spec).clone();
                if mode == Mode::Axle {
                    // What the hub does at submit: the run time of its kind.
                    let j = &jobs[spec.id as usize];
                    s.expected_runtime = runtimes.estimate(&j.team, &j.priority_class, &j.name);
                    submitted_now.push(spec.id);
                }
                state.submit(s)
            };
            match admitted {
                Ok(()) => {
                    waiting_demand += spec.total_gpus().0;
                    book.pend(spec.id as usize, spec.submit_time_ms);
                }
                Err(e) => *rejected.entry(reject_key(&e)).or_default() += 1,
            }
        }

        let mut decisions = Vec::new();
        {
            // The hub runs a cycle whenever something changed; so does the
            // simulator, at the same instant, until a cycle decides nothing.
            // Victims stop at once here, so what they held beyond their
            // preemptor's needs is free to the next round; and work placed
            // in one round may be what a team owed its guarantee reclaims
            // in the next.
            for _ in 0..MAX_CYCLES_PER_INSTANT {
                cycles += 1;
                let d = cycle(&state, t, &opts);
                if d.placements.is_empty() && d.preemptions.is_empty() {
                    break;
                }
                // Decisions from our own cycle on our own state always apply.
                let _ = state.apply(&d, t);
                decisions.push(d);
            }
        }
        for d in &decisions {
            for p in &d.placements {
                first_start[p.workload as usize].get_or_insert(t);
            }
            record(
                d,
                t,
                &specs,
                &own,
                &mut runs,
                &mut completions,
                &mut waiting_demand,
                &mut preemptions,
                &mut book,
            );
        }
        if !decisions.is_empty() || next_arrival == Some(t) {
            violations += book.check(&state);
        }
        // A job that waits: the start its pending reason would estimate.
        for &id in &submitted_now {
            if first_start[id as usize].is_none() {
                eta[id as usize] = estimate_start(&state, id, t).map(|(at, _)| at);
            }
        }
    }
    progress(Progress {
        jobs_submitted: total,
        jobs_total: total,
    });

    let span = (now - start).max(1) as f64;
    let outcomes: Vec<JobOutcome> = runs
        .iter()
        .map(|r| JobOutcome {
            waited_ms: r.waited_ms,
            finished: r.finished,
            gpu_ms: r.gpu_ms,
            lost_gpu_ms: r.lost_gpu_ms,
            preemptions: r.preemptions,
        })
        .collect();
    let start_estimates = (mode == Mode::Axle).then(|| {
        let mut r = EstimateReport::default();
        for (i, j) in jobs.iter().enumerate() {
            let submit = j.submit_time_s * 1000;
            let Some(start) = first_start[i].filter(|&s| s > submit) else {
                continue;
            };
            r.waited += 1;
            let Some(est) = eta[i] else { continue };
            r.estimated += 1;
            let real = (start - submit) as f64;
            let guess = est.saturating_sub(submit) as f64;
            if (guess - real).abs() <= 0.25 * real {
                r.within_25pct += 1;
            }
        }
        r.fraction_within_25pct = if r.estimated > 0 {
            r.within_25pct as f64 / r.estimated as f64
        } else {
            0.0
        };
        r
    });
    summarize(
        policy,
        jobs,
        &outcomes,
        mode,
        Totals {
            capacity,
            gpu_utilization: if cap > 0.0 {
                alloc_integral / (cap * span)
            } else {
                0.0
            },
            idle_while_waiting_gpu_hours: idle_waiting_integral / MILLI_PER_GPU as f64 / 3.6e6,
            preemptions,
            guarantee_violations: violations,
            violations_per_team: book.violations_by_team(),
            makespan_s: (now - start) / 1000,
            cycles,
            rejected_reasons: rejected,
            start_estimates,
        },
    )
}

/// Books one applied cycle: victims stop (losing their work since the last
/// checkpoint, or all of it) and wait again; placed jobs start.
#[allow(clippy::too_many_arguments)]
fn record(
    d: &Decisions,
    t: u64,
    specs: &[Arc<WorkloadSpec>],
    own: &[WorkloadSpec],
    runs: &mut [JobRun],
    completions: &mut BTreeSet<(u64, WorkloadId)>,
    waiting_demand: &mut u64,
    preemptions: &mut u64,
    book: &mut GuaranteeBook,
) {
    for p in &d.preemptions {
        *preemptions += 1;
        let id = p.workload;
        let spec = &own[id as usize];
        let gpus = spec.total_gpus();
        let r = &mut runs[id as usize];
        r.preemptions += 1;
        if let Some(s) = r.started_ms.take() {
            let ran = t - s;
            r.gpu_ms += gpus.as_gpus_f64() * ran as f64;
            completions.remove(&(s + r.remaining_ms, id));
            let lost_ms = match spec.checkpoint_interval_s {
                Some(i) if i > 0 => ran % (i * 1000),
                _ => ran,
            };
            r.lost_gpu_ms += gpus.as_gpus_f64() * lost_ms as f64;
            // What was saved is kept; the job needs at least a moment more.
            let saved = ran - lost_ms;
            r.remaining_ms -= saved.min(r.remaining_ms.saturating_sub(1));
        }
        r.pending_since_ms = t;
        *waiting_demand += specs[id as usize].total_gpus().0;
        book.stop(id as usize, gpus);
        book.pend(id as usize, spec.submit_time_ms);
    }
    for p in &d.placements {
        let id = p.workload;
        let r = &mut runs[id as usize];
        r.waited_ms += t - r.pending_since_ms;
        r.started_ms = Some(t);
        completions.insert((t + r.remaining_ms, id));
        *waiting_demand -= specs[id as usize].total_gpus().0;
        book.unpend(id as usize, own[id as usize].submit_time_ms);
        book.start(id as usize, own[id as usize].total_gpus());
    }
}

fn reject_key(e: &RequestError) -> String {
    use RequestError as E;
    match e {
        E::AboveLimit { .. } | E::AboveEveryLimit { .. } => "request above the team's limit".into(),
        E::AboveGuarantee { .. } => "never-preempted request above the team's guarantee".into(),
        E::NeverFitsNode { .. } => "larger than any node".into(),
        E::NoQuota { .. } => "team has no quota for the GPU model".into(),
        E::UnknownGpuModel { .. } => "no cluster has the GPU model".into(),
        other => other.to_string(),
    }
}
