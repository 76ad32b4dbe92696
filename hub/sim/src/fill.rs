//! The fill-until-full experiment of FGD (Weng et al., "Beware of
//! Fragmentation", USENIX ATC'23), on a trace of GPU-sharing pods such as
//! Alibaba's openb: pods drawn from the trace arrive one at a time, nothing
//! ever finishes, and each packer places every pod it can. What is left
//! unallocated when the first pod cannot be placed — and again once the
//! pods that arrived ask for the whole fleet, the paper's figure — is GPU
//! capacity lost to fragmentation.
//!
//! Four packers see the same arrivals:
//! - **axle**: Axle's scheduling core (`State` + `cycle`), one team and one
//!   class, so only placement decides;
//! - **firstfit**: the first node in list order that holds the pod, the
//!   first GPUs on it that do;
//! - **bestfit**: the node left with the fewest free milli-GPUs, and on it
//!   the fullest GPU that holds a fraction;
//! - **fgd**: the node and GPUs whose *fragmentation* grows least, where a
//!   node's fragmentation is, summed over the trace's pod shapes weighted
//!   by their share, the free GPU capacity that a pod of that shape could
//!   not use there (all of it when the pod does not fit the node at all).
//!
//! Only GPUs are modelled: a pod needs a fraction of one GPU or whole GPUs
//! on one node, of any model unless it names one. CPU and memory, which
//! the paper's simulator also checks, are left out (Axle schedules GPUs).
//! Draws are with replacement from the trace, from a seeded generator, so
//! a run is reproducible and the packers are compared on one sequence.

use std::collections::BTreeMap;
use std::sync::Arc;

use axle_policy::{MILLI_PER_GPU, Milli, Policy};
use axle_scheduler::{CycleOptions, Inventory, State, WorkloadSpec, cycle};
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use serde::Serialize;

use crate::baseline::{FIRST_FIT_CLASS, ONE_QUEUE_TEAM, first_fit_policy};
use crate::replay::SimJob;

/// The packers of the experiment, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Packer {
    Axle,
    FirstFit,
    BestFit,
    Fgd,
}

impl Packer {
    pub const ALL: [Packer; 4] = [Packer::Axle, Packer::FirstFit, Packer::BestFit, Packer::Fgd];

    pub fn name(self) -> &'static str {
        match self {
            Packer::Axle => "axle",
            Packer::FirstFit => "firstfit",
            Packer::BestFit => "bestfit",
            Packer::Fgd => "fgd",
        }
    }
}

/// Pods one run draws at most: the arrivals stop once they ask for the
/// whole fleet, and this bounds a run on a trace of tiny pods (a fleet of
/// 10,000 GPUs filled with 0.01-GPU pods).
pub const MAX_PODS_PER_RUN: usize = 1_000_000;

/// One packer on one seed's arrivals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FillRun {
    pub seed: u64,
    /// Pods placed before the first one that could not be.
    pub placed_before_first_failure: u64,
    /// The share of the fleet's GPU capacity unallocated at that moment.
    pub unallocated_at_first_failure: f64,
    /// The GPUs the first pod that failed asked for.
    pub first_failure_gpus: Milli,
    /// The share unallocated once the arrivals asked for the whole fleet
    /// (pods that did not fit were skipped).
    pub unallocated_at_full_demand: f64,
}

/// One packer over every seed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FillRow {
    pub packer: Packer,
    pub runs: Vec<FillRun>,
    pub mean_unallocated_at_first_failure: f64,
    pub mean_unallocated_at_full_demand: f64,
}

/// The pods a run may draw, as (GPUs per pod, required model).
type Pod = (u64, Option<String>);

/// Runs every packer in `packers` on the arrivals of every seed.
/// `policy` supplies the GPU models' names; teams and classes are replaced
/// by one of each, and fractions are kept as the trace gives them (a
/// granularity of one milli-GPU).
pub fn fill(
    policy: &Policy,
    inventory: &Inventory,
    jobs: &[SimJob],
    seeds: &[u64],
    packers: &[Packer],
) -> Vec<FillRow> {
    let pods: Vec<Pod> = jobs
        .iter()
        .filter(|j| j.replicas <= 1 && !j.allow_spread && j.gpus_per_replica.0 > 0)
        .map(|j| (j.gpus_per_replica.0, j.gpu_model.clone()))
        .collect();
    let fleet = Fleet::new(inventory);
    let capacity = fleet.capacity();
    let shapes = shape_weights(&pods);
    packers
        .iter()
        .map(|&packer| {
            let runs: Vec<FillRun> = seeds
                .iter()
                .map(|&seed| {
                    let arrivals = draw(&pods, seed, capacity);
                    match packer {
                        Packer::Axle => run_axle(policy, inventory, &arrivals, seed, capacity),
                        _ => run_plain(&fleet, &shapes, packer, &arrivals, seed, capacity),
                    }
                })
                .collect();
            let mean =
                |f: fn(&FillRun) -> f64| runs.iter().map(f).sum::<f64>() / runs.len().max(1) as f64;
            FillRow {
                packer,
                mean_unallocated_at_first_failure: mean(|r| r.unallocated_at_first_failure),
                mean_unallocated_at_full_demand: mean(|r| r.unallocated_at_full_demand),
                runs,
            }
        })
        .collect()
}

/// Pods drawn with replacement until they ask for `capacity` milli-GPUs.
fn draw(pods: &[Pod], seed: u64, capacity: u64) -> Vec<&Pod> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut asked = 0u64;
    while asked < capacity && out.len() < MAX_PODS_PER_RUN && !pods.is_empty() {
        let pod = &pods[(rng.next_u64() % pods.len() as u64) as usize];
        asked += pod.0;
        out.push(pod);
    }
    out
}

/// The trace's pod shapes (GPUs per pod) with their share of the pods.
fn shape_weights(pods: &[Pod]) -> Vec<(u64, f64)> {
    let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
    for p in pods {
        *counts.entry(p.0).or_default() += 1;
    }
    let total = pods.len().max(1) as f64;
    counts
        .into_iter()
        .map(|(g, c)| (g, c as f64 / total))
        .collect()
}

/// Tracks one run: the first failure and the end.
struct Tally {
    seed: u64,
    capacity: u64,
    allocated: u64,
    placed: u64,
    first_failure: Option<(u64, f64, u64)>,
}

impl Tally {
    fn new(seed: u64, capacity: u64) -> Tally {
        Tally {
            seed,
            capacity,
            allocated: 0,
            placed: 0,
            first_failure: None,
        }
    }

    fn unallocated(&self) -> f64 {
        (self.capacity - self.allocated) as f64 / self.capacity.max(1) as f64
    }

    fn placed(&mut self, milli: u64) {
        self.allocated += milli;
        if self.first_failure.is_none() {
            self.placed += 1;
        }
    }

    fn failed(&mut self, milli: u64) {
        if self.first_failure.is_none() {
            self.first_failure = Some((self.placed, self.unallocated(), milli));
        }
    }

    fn finish(self) -> FillRun {
        let end = self.unallocated();
        let (placed, at, gpus) = self.first_failure.unwrap_or((self.placed, end, 0));
        FillRun {
            seed: self.seed,
            placed_before_first_failure: placed,
            unallocated_at_first_failure: at,
            first_failure_gpus: Milli(gpus),
            unallocated_at_full_demand: end,
        }
    }
}

/// Axle's core places each arrival: one cycle per pod; a pod it cannot
/// place is withdrawn (a pod left pending would be retried by every later
/// cycle, which the other packers do not do).
fn run_axle(
    policy: &Policy,
    inventory: &Inventory,
    arrivals: &[&Pod],
    seed: u64,
    capacity: u64,
) -> FillRun {
    let mut p = first_fit_policy(policy, Milli(capacity));
    p.settings.fraction_granularity = Milli(1);
    let mut state = State::new(Arc::new(p), inventory);
    let opts = CycleOptions {
        explain: false,
        ..CycleOptions::default()
    };
    let mut tally = Tally::new(seed, capacity);
    for (i, pod) in arrivals.iter().enumerate() {
        let now = i as u64;
        let spec = WorkloadSpec {
            id: i as u64,
            team: ONE_QUEUE_TEAM.to_string(),
            priority_class: FIRST_FIT_CLASS.to_string(),
            gpus_per_replica: Milli(pod.0),
            replicas: 1,
            gpu_model: pod.1.clone(),
            regions: Vec::new(),
            allow_spread: false,
            burst_allowed: false,
            submit_time_ms: now,
            checkpoint_interval_s: None,
            max_runtime_s: None,
            has_image: false,
            expected_runtime: None,
        };
        if state.submit(spec).is_err() {
            tally.failed(pod.0);
            continue;
        }
        let d = cycle(&state, now, &opts);
        let placed = d.placements.iter().any(|p| p.workload == i as u64);
        // Decisions from our own cycle on our own state always apply.
        let _ = state.apply(&d, now);
        if placed {
            tally.placed(pod.0);
        } else {
            state.remove(i as u64);
            tally.failed(pod.0);
        }
    }
    tally.finish()
}

/// A fleet of plain GPUs for the packers written here.
#[derive(Clone)]
struct Fleet {
    /// Per node: its model and the free milli-GPUs of each GPU.
    nodes: Vec<(String, Vec<u64>)>,
}

impl Fleet {
    fn new(inv: &Inventory) -> Fleet {
        let nodes = inv
            .clusters
            .iter()
            .filter(|c| c.schedulable)
            .flat_map(|c| c.nodes.iter())
            .map(|n| {
                (
                    n.gpu_model.clone(),
                    vec![MILLI_PER_GPU; n.gpu_count as usize],
                )
            })
            .collect();
        Fleet { nodes }
    }

    fn capacity(&self) -> u64 {
        self.nodes.iter().map(|n| n.1.len() as u64).sum::<u64>() * MILLI_PER_GPU
    }
}

/// The GPUs of one node a pod of `milli` would take there (a fraction:
/// one GPU; whole GPUs: the first fully free ones), or `None`.
fn fit_on(
    free: &[u64],
    milli: u64,
    fraction_gpu: impl Fn(&[u64]) -> Option<usize>,
) -> Option<Vec<usize>> {
    if milli < MILLI_PER_GPU {
        return fraction_gpu(free).map(|g| vec![g]);
    }
    let k = milli.div_ceil(MILLI_PER_GPU) as usize;
    let whole: Vec<usize> = (0..free.len())
        .filter(|&g| free[g] == MILLI_PER_GPU)
        .take(k)
        .collect();
    (whole.len() == k).then_some(whole)
}

fn first_gpu(milli: u64) -> impl Fn(&[u64]) -> Option<usize> {
    move |free| (0..free.len()).find(|&g| free[g] >= milli)
}

fn fullest_gpu(milli: u64) -> impl Fn(&[u64]) -> Option<usize> {
    move |free| {
        (0..free.len())
            .filter(|&g| free[g] >= milli)
            .min_by_key(|&g| (free[g], g))
    }
}

/// Of the free capacity `free` of one node, what a pod of `milli` could
/// not use: all of it when the pod does not fit, else the GPUs too small
/// for it (for whole GPUs: every GPU not fully free).
fn fragment(free: &[u64], milli: u64) -> u64 {
    let total: u64 = free.iter().sum();
    if milli < MILLI_PER_GPU {
        if free.iter().all(|&f| f < milli) {
            return total;
        }
        return free.iter().filter(|&&f| f < milli).sum();
    }
    let k = milli.div_ceil(MILLI_PER_GPU) as usize;
    if free.iter().filter(|&&f| f == MILLI_PER_GPU).count() < k {
        return total;
    }
    free.iter().filter(|&&f| f < MILLI_PER_GPU).sum()
}

/// A node's fragmentation against the workload's shapes.
fn fragmentation(free: &[u64], shapes: &[(u64, f64)]) -> f64 {
    shapes
        .iter()
        .map(|&(g, w)| w * fragment(free, g) as f64)
        .sum()
}

/// Node scores FGD keeps (free GPUs and pod → growth of fragmentation and
/// GPUs taken): nodes in the same state score the same, and a fleet has
/// few distinct states; past this many the memo starts over.
const MAX_FGD_MEMO: usize = 100_000;

/// (free milli-GPUs of a node's GPUs, pod) → what [`fgd_best_on`] found.
type FgdMemo = BTreeMap<(Vec<u64>, u64), (f64, Option<Vec<usize>>)>;

/// FGD on one node: the GPUs a pod of `milli` takes there that grow the
/// node's fragmentation least, with that growth; `None` GPUs when the pod
/// does not fit.
fn fgd_best_on(free: &[u64], milli: u64, shapes: &[(u64, f64)]) -> (f64, Option<Vec<usize>>) {
    let before = fragmentation(free, shapes);
    let candidates: Vec<Vec<usize>> = if milli < MILLI_PER_GPU {
        (0..free.len())
            .filter(|&g| free[g] >= milli)
            .map(|g| vec![g])
            .collect()
    } else {
        fit_on(free, milli, first_gpu(milli)).into_iter().collect()
    };
    let mut best: (f64, Option<Vec<usize>>) = (f64::INFINITY, None);
    for gpus in candidates {
        let mut after = free.to_vec();
        for &g in &gpus {
            after[g] -= milli.min(MILLI_PER_GPU);
        }
        let delta = fragmentation(&after, shapes) - before;
        if delta < best.0 {
            best = (delta, Some(gpus));
        }
    }
    best
}

/// The first-fit, best-fit and FGD packers.
fn run_plain(
    fleet: &Fleet,
    shapes: &[(u64, f64)],
    packer: Packer,
    arrivals: &[&Pod],
    seed: u64,
    capacity: u64,
) -> FillRun {
    let mut fleet = fleet.clone();
    let mut tally = Tally::new(seed, capacity);
    let mut memo: FgdMemo = BTreeMap::new();
    for pod in arrivals {
        let milli = pod.0;
        let model_ok = |n: &(String, Vec<u64>)| pod.1.as_deref().is_none_or(|m| m == n.0);
        let choice: Option<(usize, Vec<usize>)> = match packer {
            Packer::FirstFit => fleet.nodes.iter().enumerate().find_map(|(i, n)| {
                if !model_ok(n) {
                    return None;
                }
                fit_on(&n.1, milli, first_gpu(milli)).map(|g| (i, g))
            }),
            Packer::BestFit => fleet
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| model_ok(n))
                .filter_map(|(i, n)| {
                    let gpus = fit_on(&n.1, milli, fullest_gpu(milli))?;
                    let left = n.1.iter().sum::<u64>() - milli;
                    Some(((left, i), (i, gpus)))
                })
                .min_by_key(|(key, _)| *key)
                .map(|(_, c)| c),
            Packer::Fgd => {
                let mut best: Option<(f64, usize, Vec<usize>)> = None;
                for (i, n) in fleet.nodes.iter().enumerate() {
                    if !model_ok(n) {
                        continue;
                    }
                    // Nodes with the same free GPUs score the same.
                    if memo.len() >= MAX_FGD_MEMO {
                        memo.clear();
                    }
                    let (delta, gpus) = memo
                        .entry((n.1.clone(), milli))
                        .or_insert_with(|| fgd_best_on(&n.1, milli, shapes))
                        .clone();
                    if let Some(gpus) = gpus
                        && best.as_ref().is_none_or(|b| delta < b.0)
                    {
                        best = Some((delta, i, gpus));
                    }
                }
                best.map(|(_, i, g)| (i, g))
            }
            Packer::Axle => unreachable!("Axle places through its core"),
        };
        match choice {
            Some((i, gpus)) => {
                for g in gpus {
                    fleet.nodes[i].1[g] -= milli.min(MILLI_PER_GPU);
                }
                tally.placed(milli);
            }
            None => tally.failed(milli),
        }
    }
    tally.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragment_counts_what_a_shape_cannot_use() {
        // Two GPUs: 300 and 1000 free.
        let free = [300, 1000];
        assert_eq!(fragment(&free, 500), 300, "the 300 is too small for 0.5");
        assert_eq!(fragment(&free, 200), 0, "both serve 0.2");
        assert_eq!(
            fragment(&free, 1000),
            300,
            "one whole GPU: the partial one is lost"
        );
        assert_eq!(
            fragment(&free, 2000),
            1300,
            "two whole GPUs do not fit: all of it"
        );
        assert_eq!(fragment(&[100, 200], 500), 300, "nothing fits: all of it");
    }

    #[test]
    fn fgd_leaves_room_that_best_fit_wastes() {
        // One node with 0.7 and 1.0 free; pods of 0.3 then two of 0.6.
        // Best fit puts the 0.3 on the 0.7 GPU (0.4 left: too small for
        // 0.6); FGD puts it on the free GPU, so both 0.6 pods still fit.
        let fleet = Fleet {
            nodes: vec![("A".into(), vec![700, 1000])],
        };
        let shapes = [(300, 1.0 / 3.0), (600, 2.0 / 3.0)];
        let (small, big): (Pod, Pod) = ((300, None), (600, None));
        let arrivals = [&small, &big, &big];
        let fgd = run_plain(&fleet, &shapes, Packer::Fgd, &arrivals, 0, 1700);
        assert_eq!(fgd.first_failure_gpus, Milli(0), "FGD places all three");
        assert_eq!(fgd.placed_before_first_failure, 3);
        let best = run_plain(&fleet, &shapes, Packer::BestFit, &arrivals, 0, 1700);
        assert_eq!(best.first_failure_gpus, Milli(600));
        assert_eq!(best.placed_before_first_failure, 2);
        // 0.4 and 0.4 of the 1.7 free at the start are left.
        assert!((best.unallocated_at_first_failure - 800.0 / 1700.0).abs() < 1e-9);
        let first = run_plain(&fleet, &shapes, Packer::FirstFit, &arrivals, 0, 1700);
        assert_eq!(
            first.placed_before_first_failure, 2,
            "first fit also takes GPU 0"
        );
    }
}
