//! The textbook baselines, written the way a scheduling course or a
//! paper's simulator writes them and independent of Axle's core, so that
//! "Axle beats first-fit" is measured against first-fit as others build it:
//!
//! - one queue in arrival order, no teams, quotas, priorities or preemption;
//! - at every arrival and every finish the queue is scanned from its head;
//!   **first-fit** starts every job that fits (greedy backfill), **FIFO**
//!   stops at the first job that does not (head-of-line blocking). At one
//!   instant the arrivals come first, one at a time (a scan after each),
//!   then all the finishes of the instant together (then one scan);
//! - a job of one node goes to the node with the fewest free GPUs that
//!   still holds it (best fit); a fraction of a GPU to the fullest GPU that
//!   holds it, else a free GPU of the fullest node;
//! - a job larger than one node takes whole free nodes: as many fully free
//!   nodes as its GPUs fill, and the rest, best fit, on one more node.
//!
//! Nothing here reads Axle's scheduling code: only the inventory, to build
//! the same fleet.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use axle_policy::{MILLI_PER_GPU, Milli, Policy};
use axle_scheduler::Inventory;

use crate::baseline::Mode;
use crate::guarantee::{Fleet, GuaranteeBook};
use crate::replay::SimJob;
use crate::report::{JobOutcome, SimReport, summarize};

/// The two textbook queue disciplines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Discipline {
    FirstFit,
    Fifo,
}

struct Node {
    cluster: u32,
    /// Index within its cluster.
    local: u32,
    model: String,
    /// Free milli-GPUs per GPU.
    free: Vec<u64>,
}

impl Node {
    fn fully_free(&self) -> usize {
        self.free.iter().filter(|&&f| f == MILLI_PER_GPU).count()
    }
}

/// Where a running job holds GPUs: (node, gpu, milli) per shard.
type Held = Vec<(usize, usize, u64)>;

/// The simulated fleet, as plain arrays.
pub(crate) struct TextbookFleet {
    nodes: Vec<Node>,
    /// Per cluster, its nodes' indices.
    clusters: Vec<Vec<usize>>,
    /// Job index → what it holds, for the jobs that run.
    running: BTreeMap<usize, Held>,
    allocated: u64,
    capacity: u64,
}

impl TextbookFleet {
    fn new(inv: &Inventory) -> TextbookFleet {
        let mut nodes = Vec::new();
        let mut clusters = Vec::new();
        for (ci, c) in inv.clusters.iter().enumerate() {
            let mut mine = Vec::new();
            if !c.schedulable {
                clusters.push(mine);
                continue;
            }
            for (li, n) in c.nodes.iter().enumerate() {
                mine.push(nodes.len());
                nodes.push(Node {
                    cluster: ci as u32,
                    local: li as u32,
                    model: n.gpu_model.clone(),
                    free: vec![MILLI_PER_GPU; n.gpu_count as usize],
                });
            }
            clusters.push(mine);
        }
        let capacity = nodes.iter().map(|n| n.free.len() as u64).sum::<u64>() * MILLI_PER_GPU;
        TextbookFleet {
            nodes,
            clusters,
            running: BTreeMap::new(),
            allocated: 0,
            capacity,
        }
    }

    fn model_ok(&self, job: &SimJob, node: usize) -> bool {
        job.gpu_model
            .as_deref()
            .is_none_or(|m| m == self.nodes[node].model)
    }

    /// Best fit of one replica of `milli` (a fraction, or whole GPUs that
    /// one node holds) among `nodes`, skipping what `taken` already holds.
    fn best_fit(&self, milli: u64, nodes: &[usize], taken: &Held) -> Option<Held> {
        let free = |n: usize, g: usize| {
            let used: u64 = taken
                .iter()
                .filter(|&&(tn, tg, _)| tn == n && tg == g)
                .map(|x| x.2)
                .sum();
            self.nodes[n].free[g] - used
        };
        let fully_free = |n: usize| {
            (0..self.nodes[n].free.len())
                .filter(|&g| free(n, g) == MILLI_PER_GPU)
                .count()
        };
        if milli < MILLI_PER_GPU {
            // The fullest partly used GPU that holds it.
            let mut best: Option<(u64, usize, usize)> = None;
            for &n in nodes {
                for g in 0..self.nodes[n].free.len() {
                    let f = free(n, g);
                    if f >= milli && f < MILLI_PER_GPU && best.is_none_or(|b| f < b.0) {
                        best = Some((f, n, g));
                    }
                }
            }
            if let Some((_, n, g)) = best {
                return Some(vec![(n, g, milli)]);
            }
            // Else a free GPU of the fullest node that has one.
            let n = nodes
                .iter()
                .copied()
                .map(|n| (fully_free(n), n))
                .filter(|&(c, _)| c > 0)
                .min()?
                .1;
            let g = (0..self.nodes[n].free.len()).find(|&g| free(n, g) == MILLI_PER_GPU)?;
            return Some(vec![(n, g, milli)]);
        }
        let k = milli.div_ceil(MILLI_PER_GPU) as usize;
        let n = nodes
            .iter()
            .copied()
            .map(|n| (fully_free(n), n))
            .filter(|&(c, _)| c >= k)
            .min()?
            .1;
        Some(
            (0..self.nodes[n].free.len())
                .filter(|&g| free(n, g) == MILLI_PER_GPU)
                .take(k)
                .map(|g| (n, g, MILLI_PER_GPU))
                .collect(),
        )
    }

    /// Where `job` would run now, all replicas in one cluster, or `None`.
    fn place(&self, job: &SimJob) -> Option<Held> {
        let per_replica = job.gpus_per_replica.0.max(1);
        for cluster in &self.clusters {
            let nodes: Vec<usize> = cluster
                .iter()
                .copied()
                .filter(|&n| self.model_ok(job, n))
                .collect();
            let mut held: Held = Vec::new();
            let mut ok = true;
            for _ in 0..job.replicas.max(1) {
                let largest = nodes
                    .iter()
                    .map(|&n| self.nodes[n].free.len() as u64 * MILLI_PER_GPU)
                    .max()
                    .unwrap_or(0);
                let shards = if per_replica <= largest {
                    self.best_fit(per_replica, &nodes, &held)
                } else {
                    self.whole_nodes(per_replica, &nodes, &held)
                };
                match shards {
                    Some(s) => held.extend(s),
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                return Some(held);
            }
        }
        None
    }

    /// A replica larger than one node: whole free nodes (lowest index
    /// first) while it fills them, the rest best fit on one more node.
    fn whole_nodes(&self, milli: u64, nodes: &[usize], taken: &Held) -> Option<Held> {
        let mut left = milli.div_ceil(MILLI_PER_GPU);
        let mut held: Held = Vec::new();
        let untouched = |n: usize| !taken.iter().any(|t| t.0 == n);
        for &n in nodes {
            let size = self.nodes[n].free.len() as u64;
            if left >= size && untouched(n) && self.nodes[n].fully_free() as u64 == size {
                held.extend((0..size as usize).map(|g| (n, g, MILLI_PER_GPU)));
                left -= size;
            }
        }
        if left > 0 {
            let mut all = taken.clone();
            all.extend(held.iter().copied());
            held.extend(self.best_fit(left * MILLI_PER_GPU, nodes, &all)?);
        }
        Some(held)
    }

    fn start(&mut self, job: usize, held: Held) {
        for &(n, g, m) in &held {
            self.nodes[n].free[g] -= m;
            self.allocated += m;
        }
        self.running.insert(job, held);
    }

    fn finish(&mut self, job: usize) {
        if let Some(held) = self.running.remove(&job) {
            for (n, g, m) in held {
                self.nodes[n].free[g] += m;
                self.allocated -= m;
            }
        }
    }
}

impl Fleet for TextbookFleet {
    fn running_shards(&self, each: &mut dyn FnMut(usize, u32, u32, u32, u64)) {
        for (&job, held) in &self.running {
            for &(n, g, m) in held {
                let node = &self.nodes[n];
                each(job, node.cluster, node.local, g as u32, m);
            }
        }
    }
    fn cluster_count(&self) -> u32 {
        self.clusters.len() as u32
    }
    fn node_count(&self, cluster: u32) -> u32 {
        self.clusters[cluster as usize].len() as u32
    }
    fn gpu_model_of(&self, cluster: u32, node: u32) -> &str {
        &self.nodes[self.clusters[cluster as usize][node as usize]].model
    }
    fn node_used(&self, cluster: u32, node: u32) -> Vec<u64> {
        self.nodes[self.clusters[cluster as usize][node as usize]]
            .free
            .iter()
            .map(|f| MILLI_PER_GPU - f)
            .collect()
    }
}

/// The smallest request that failed in one scan, per kind of request: a
/// bigger one of the same kind cannot fit either, since a scan only takes
/// capacity.
#[derive(Default)]
struct Failed(BTreeMap<(Option<String>, u32, bool), u64>);

impl Failed {
    fn key(job: &SimJob) -> (Option<String>, u32, bool) {
        (
            job.gpu_model.clone(),
            job.replicas.max(1),
            job.gpus_per_replica.0 < MILLI_PER_GPU,
        )
    }
    fn proves_fails(&self, job: &SimJob) -> bool {
        self.0
            .get(&Self::key(job))
            .is_some_and(|&m| job.gpus_per_replica.0 >= m)
    }
    fn note(&mut self, job: &SimJob) {
        let e = self.0.entry(Self::key(job)).or_insert(u64::MAX);
        *e = (*e).min(job.gpus_per_replica.0);
    }
}

/// Replays `jobs` (sorted by submit time) on `inventory` under a textbook
/// discipline. `policy` is the policy as written: it only names the
/// guarantees the report checks, the schedule ignores it.
pub(crate) fn replay(
    policy: &Policy,
    inventory: &Inventory,
    jobs: &[SimJob],
    discipline: Discipline,
    progress: &mut dyn FnMut(crate::Progress),
) -> SimReport {
    let mut fleet = TextbookFleet::new(inventory);
    // The same fleet kept empty: whether a job could ever run on it.
    let empty = TextbookFleet::new(inventory);
    let mode = match discipline {
        Discipline::FirstFit => Mode::FirstFit,
        Discipline::Fifo => Mode::Fifo,
    };
    let models: Vec<String> = {
        let m: BTreeSet<String> = fleet.nodes.iter().map(|n| n.model.clone()).collect();
        m.into_iter().collect()
    };
    let mut book = GuaranteeBook::of_jobs(policy, jobs, &models);
    let mut outcomes: Vec<JobOutcome> = vec![JobOutcome::default(); jobs.len()];
    let mut rejected: BTreeMap<String, u64> = BTreeMap::new();
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut finishing: BTreeSet<(u64, usize)> = BTreeSet::new();
    let mut next = 0usize;
    let first = jobs.first().map(|j| j.submit_time_s).unwrap_or(0);
    let (mut last_t, mut now) = (first, first);
    let (mut alloc_integral, mut idle_waiting_integral) = (0f64, 0f64);
    let mut waiting_demand = 0u64;
    let mut scans = 0u64;
    let mut violations = 0u64;
    let total = jobs.len() as u64;
    let mut events = 0u64;
    loop {
        let t = match (
            jobs.get(next).map(|j| j.submit_time_s),
            finishing.first().map(|&(t, _)| t),
        ) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(d)) => d,
            (Some(a), Some(d)) => a.min(d),
        };
        events += 1;
        if events.is_multiple_of(1024) {
            progress(crate::Progress {
                jobs_submitted: next as u64,
                jobs_total: total,
            });
        }
        let dt = (t - last_t) as f64;
        alloc_integral += fleet.allocated as f64 * dt;
        let idle = fleet.capacity.saturating_sub(fleet.allocated);
        idle_waiting_integral += idle.min(waiting_demand) as f64 * dt;
        last_t = t;
        now = t;
        // One instant: each arrival in turn, the queue scanned after each,
        // then every finish of the instant at once and one more scan.
        let arrived = next < jobs.len() && jobs[next].submit_time_s == t;
        if arrived {
            let j = &jobs[next];
            if empty.place(j).is_some() {
                queue.push_back(next);
                waiting_demand += j.total_gpus().0;
                book.pend(next, j.submit_time_s * 1000);
            } else {
                *rejected
                    .entry("larger than any cluster can hold".to_string())
                    .or_default() += 1;
            }
            next += 1;
        } else {
            while let Some(&(d, job)) = finishing.first() {
                if d != t {
                    break;
                }
                finishing.pop_first();
                fleet.finish(job);
                outcomes[job].finished = true;
                outcomes[job].gpu_ms = jobs[job].total_gpus().as_gpus_f64()
                    * jobs[job].duration_s.max(1) as f64
                    * 1000.0;
                book.stop(job, jobs[job].total_gpus());
            }
        }
        // Scan the queue from its head.
        scans += 1;
        let mut failed = Failed::default();
        let mut i = 0;
        let mut started = false;
        while i < queue.len() {
            if fleet.allocated >= fleet.capacity {
                break;
            }
            let job = queue[i];
            let j = &jobs[job];
            let held = if failed.proves_fails(j) {
                None
            } else {
                fleet.place(j)
            };
            match held {
                Some(h) => {
                    fleet.start(job, h);
                    outcomes[job].waited_ms = (t - j.submit_time_s) * 1000;
                    finishing.insert((t + j.duration_s.max(1), job));
                    waiting_demand -= j.total_gpus().0;
                    book.unpend(job, j.submit_time_s * 1000);
                    book.start(job, j.total_gpus());
                    queue.remove(i);
                    started = true;
                }
                None => {
                    if discipline == Discipline::Fifo {
                        break;
                    }
                    failed.note(j);
                    i += 1;
                }
            }
        }
        if started || arrived {
            violations += book.check(&fleet);
        }
    }
    progress(crate::Progress {
        jobs_submitted: total,
        jobs_total: total,
    });
    let span_ms = (now - first).max(1) as f64 * 1000.0;
    let cap = fleet.capacity as f64;
    summarize(
        policy,
        jobs,
        &outcomes,
        mode,
        crate::report::Totals {
            capacity: Milli(fleet.capacity),
            gpu_utilization: if cap > 0.0 {
                alloc_integral * 1000.0 / (cap * span_ms)
            } else {
                0.0
            },
            idle_while_waiting_gpu_hours: idle_waiting_integral / MILLI_PER_GPU as f64 / 3600.0,
            preemptions: 0,
            guarantee_violations: violations,
            violations_per_team: book.violations_by_team(),
            makespan_s: now - first,
            cycles: scans,
            rejected_reasons: rejected,
            start_estimates: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use axle_policy::Milli;
    use axle_scheduler::inventory;

    use super::*;

    fn job(submit: u64, duration: u64, gpus: u64) -> SimJob {
        SimJob {
            name: format!("j{submit}-{gpus}"),
            submit_time_s: submit,
            duration_s: duration,
            gpus_per_replica: Milli::gpus(gpus),
            replicas: 1,
            allow_spread: gpus > 8,
            team: "a".into(),
            priority_class: "training".into(),
            gpu_model: None,
        }
    }

    fn policy() -> Policy {
        Policy {
            revision: "unit".into(),
            teams: BTreeMap::new(),
            priority_classes: axle_policy::default_priority_classes(),
            clusters: BTreeMap::new(),
            burst_providers: BTreeMap::new(),
            settings: axle_policy::Settings::default(),
        }
    }

    /// A 16-GPU job takes two whole free nodes, never two half-used ones:
    /// on two nodes each half used, it waits for them to empty.
    #[test]
    fn a_job_larger_than_a_node_takes_whole_free_nodes() {
        let inv = inventory::uniform("c", "r", "V100", 32, 8);
        let mut fleet = TextbookFleet::new(&inv);
        fleet.start(0, fleet.place(&job(0, 10, 4)).unwrap());
        fleet.start(1, fleet.place(&job(0, 10, 4)).unwrap());
        // Best fit: the second 4 went beside the first, on node 0.
        assert!(fleet.running[&1].iter().all(|s| s.0 == 0));
        let big = fleet.place(&job(0, 10, 16)).unwrap();
        let nodes: BTreeSet<usize> = big.iter().map(|s| s.0).collect();
        assert_eq!(nodes, BTreeSet::from([1, 2]), "{big:?}");
        // 12 GPUs: one whole node, and 4 best fit beside it.
        fleet.start(2, big);
        fleet.finish(0);
        let twelve = fleet.place(&job(0, 10, 12)).unwrap();
        assert_eq!(twelve.iter().filter(|s| s.0 == 3).count(), 8);
        assert_eq!(twelve.iter().filter(|s| s.0 == 0).count(), 4);
    }

    /// First-fit starts a small job behind a blocked big one; FIFO does not.
    #[test]
    fn first_fit_backfills_and_fifo_blocks_at_the_head() {
        let inv = inventory::uniform("c", "r", "V100", 8, 8);
        let jobs = [job(0, 100, 6), job(1, 100, 4), job(2, 100, 2)];
        let p = policy();
        let ff = replay(&p, &inv, &jobs, Discipline::FirstFit, &mut |_| {});
        let fifo = replay(&p, &inv, &jobs, Discipline::Fifo, &mut |_| {});
        // First-fit: the 2 starts at once beside the 6, the 4 at 100.
        assert_eq!(ff.queue_delay_s.mean, (0.0 + 99.0 + 0.0) / 3.0);
        // FIFO: the 4 blocks the 2 until the 6 ends; both start at 100.
        assert_eq!(fifo.queue_delay_s.mean, (0.0 + 99.0 + 98.0) / 3.0);
        assert_eq!(ff.jobs_finished, 3);
        assert_eq!(ff.preemptions, 0);
    }

    /// A job no cluster can ever hold is refused, not queued forever.
    #[test]
    fn a_job_too_large_for_the_fleet_is_rejected() {
        let inv = inventory::uniform("c", "r", "V100", 16, 8);
        let r = replay(
            &policy(),
            &inv,
            &[job(0, 10, 24), job(0, 10, 1)],
            Discipline::FirstFit,
            &mut |_| {},
        );
        assert_eq!(r.jobs_rejected, 1);
        assert_eq!(r.jobs_finished, 1);
    }
}
