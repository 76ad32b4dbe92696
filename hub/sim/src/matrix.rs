//! The robustness matrix: Axle against the textbook first-fit on traces
//! and loads it was not tuned on. Philly at five capacities and three
//! arrival rates, synthetic fleets of 10, 50 and 200 teams whose demand is
//! skewed like the Helios Earth VCs, and a trace of only multi-node jobs.
//! In every cell Axle must be at or below first-fit on mean and p95 delay,
//! with no guarantee broken.
//!
//! Pure like the rest of the crate: the caller hands in the parsed Philly
//! jobs and the Helios VC sizes.

use axle_policy::{MILLI_PER_GPU, Milli, Policy};
use axle_scheduler::inventory;
use serde::Serialize;

use crate::baseline::{Mode, complete_policy};
use crate::replay::{SimJob, simulate};
use crate::report::SimReport;

/// How much of the matrix to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixSize {
    /// Every cell on the whole trace (minutes, release build).
    Full,
    /// The same cells on the trace's first `REDUCED_JOBS` jobs at a quarter
    /// of the capacities: what CI runs.
    Reduced,
}

/// Jobs of the reduced matrix: the first three weeks of Philly's busy
/// months hold about this many, enough for queues to form at a quarter of
/// the capacity, few enough for a debug-build CI run.
pub const REDUCED_JOBS: usize = 20_000;

/// Philly capacities of the full matrix, in GPUs (8-GPU nodes).
pub const PHILLY_CAPACITIES: [u64; 5] = [256, 384, 512, 768, 1024];
/// Arrival-time factors: ×0.5 doubles the load, ×2 halves it.
pub const ARRIVAL_SCALES: [f64; 3] = [0.5, 1.0, 2.0];
/// Team counts of the synthetic traces.
pub const SYNTHETIC_TEAMS: [usize; 3] = [10, 50, 200];
/// Capacity of the synthetic and multi-node cells (full size).
pub const SYNTHETIC_CAPACITY: u64 = 512;
/// Capacity of the multi-node-only cell (full size): its 300 jobs of 12 to
/// 128 GPUs queue at 256.
pub const MULTI_NODE_CAPACITY: u64 = 256;

/// One cell to run.
#[derive(Debug, Clone)]
pub struct CellSpec {
    pub name: String,
    pub capacity_gpus: u64,
    pub jobs: Vec<SimJob>,
}

/// One cell's result.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub name: String,
    pub capacity_gpus: u64,
    pub jobs: usize,
    pub axle: SimReport,
    pub firstfit: SimReport,
}

impl Cell {
    /// Axle at or below first-fit on mean and on p95 delay.
    pub fn mean_ok(&self) -> bool {
        self.axle.queue_delay_s.mean <= self.firstfit.queue_delay_s.mean
    }
    pub fn p95_ok(&self) -> bool {
        self.axle.queue_delay_s.p95 <= self.firstfit.queue_delay_s.p95
    }
    pub fn ok(&self) -> bool {
        self.mean_ok() && self.p95_ok() && self.axle.guarantee_violations == 0
    }
}

/// The GPUs of each Helios Earth VC on the day the cluster was largest,
/// largest first, from `Earth_gpu_number.csv` (`date,<vc>...,total`).
pub fn helios_vc_sizes(content: &str) -> Result<Vec<u64>, String> {
    let mut best: Option<(u64, Vec<u64>)> = None;
    let mut lines = content.lines();
    let header = lines.next().ok_or("empty file")?;
    let cols = header.split(',').count();
    if cols < 3 || !header.starts_with("date,") || !header.ends_with(",total") {
        return Err("line 1: expected header `date,<vc>...,total`".into());
    }
    for (i, line) in lines.enumerate() {
        let cells: Vec<&str> = line.split(',').collect();
        if cells.len() != cols {
            return Err(format!(
                "line {}: {} cells, expected {cols}",
                i + 2,
                cells.len()
            ));
        }
        let nums: Result<Vec<u64>, _> =
            cells[1..].iter().map(|c| c.trim().parse::<u64>()).collect();
        let nums = nums.map_err(|e| format!("line {}: {e}", i + 2))?;
        let (total, vcs) = nums.split_last().ok_or("no columns")?;
        if best.as_ref().is_none_or(|b| *total > b.0) {
            best = Some((*total, vcs.to_vec()));
        }
    }
    let mut sizes: Vec<u64> = best
        .ok_or("no rows")?
        .1
        .into_iter()
        .filter(|&s| s > 0)
        .collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    if sizes.is_empty() {
        return Err("no VC has GPUs".into());
    }
    Ok(sizes)
}

/// `n` team weights with the skew of `sizes` (largest first): team i takes
/// the size at the same quantile of the VC distribution.
pub fn skewed_weights(sizes: &[u64], n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let q = (i as f64 + 0.5) / n as f64 * sizes.len() as f64;
            sizes[(q as usize).min(sizes.len() - 1)] as f64
        })
        .collect()
}

/// A deterministic mix of the bits of `x` (SplitMix64).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The jobs with their teams drawn anew: job i goes to team k with
/// probability weights[k] / sum, from a hash of i (the same every run).
pub fn with_teams(jobs: &[SimJob], weights: &[f64]) -> Vec<SimJob> {
    let total: f64 = weights.iter().sum();
    let width = weights.len().to_string().len();
    jobs.iter()
        .enumerate()
        .map(|(i, j)| {
            let u = (mix(i as u64) >> 11) as f64 / (1u64 << 53) as f64 * total;
            let mut acc = 0.0;
            let mut team = weights.len() - 1;
            for (k, w) in weights.iter().enumerate() {
                acc += w;
                if u < acc {
                    team = k;
                    break;
                }
            }
            SimJob {
                team: format!("team-{team:0width$}"),
                ..j.clone()
            }
        })
        .collect()
}

/// The jobs with submit times multiplied by `factor` (order kept).
pub fn scale_arrivals(jobs: &[SimJob], factor: f64) -> Vec<SimJob> {
    jobs.iter()
        .map(|j| SimJob {
            submit_time_s: (j.submit_time_s as f64 * factor) as u64,
            ..j.clone()
        })
        .collect()
}

/// The cells of the matrix for the Philly jobs (sorted by submit time) and
/// the Helios VC sizes.
pub fn cells(philly: &[SimJob], helios_sizes: &[u64], size: MatrixSize) -> Vec<CellSpec> {
    let (jobs, div) = match size {
        MatrixSize::Full => (philly, 1),
        MatrixSize::Reduced => (&philly[..philly.len().min(REDUCED_JOBS)], 4),
    };
    let mut out = Vec::new();
    for &cap in &PHILLY_CAPACITIES {
        for &scale in &ARRIVAL_SCALES {
            out.push(CellSpec {
                name: format!("philly@{} ×{scale}", cap / div),
                capacity_gpus: cap / div,
                jobs: scale_arrivals(jobs, scale),
            });
        }
    }
    for &n in &SYNTHETIC_TEAMS {
        out.push(CellSpec {
            name: format!("{n} teams (Helios skew)@{}", SYNTHETIC_CAPACITY / div),
            capacity_gpus: SYNTHETIC_CAPACITY / div,
            jobs: with_teams(jobs, &skewed_weights(helios_sizes, n)),
        });
    }
    let multi: Vec<SimJob> = philly
        .iter()
        .filter(|j| j.total_gpus().0 > 8 * MILLI_PER_GPU)
        .cloned()
        .collect();
    out.push(CellSpec {
        name: format!("multi-node only@{}", MULTI_NODE_CAPACITY / div),
        capacity_gpus: MULTI_NODE_CAPACITY / div,
        jobs: match size {
            MatrixSize::Full => multi,
            // Every multi-node job still fits the smaller fleet.
            MatrixSize::Reduced => multi
                .into_iter()
                .filter(|j| j.total_gpus().0 <= MULTI_NODE_CAPACITY / div * MILLI_PER_GPU)
                .collect(),
        },
    });
    out
}

/// Runs one cell: Axle and the textbook first-fit on the same fleet.
pub fn run_cell(policy: &Policy, cell: &CellSpec) -> Cell {
    let inv = inventory::uniform("sim", "sim", "V100", cell.capacity_gpus, 8);
    let (policy, _) = complete_policy(policy, &cell.jobs, Milli::gpus(cell.capacity_gpus));
    let run = |mode| simulate(&policy, &inv, &cell.jobs, mode, &mut |_| {});
    Cell {
        name: cell.name.clone(),
        capacity_gpus: cell.capacity_gpus,
        jobs: cell.jobs.len(),
        axle: run(Mode::Axle),
        firstfit: run(Mode::FirstFit),
    }
}

/// Runs every cell on `threads` threads (at least one), each taking the
/// next cell left; results in cell order. A panic in a cell is raised here.
pub fn run_cells(policy: &Policy, specs: &[CellSpec], threads: usize) -> Vec<Cell> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, Cell)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(spec) = specs.get(i) else { break };
                        mine.push((i, run_cell(policy, spec)));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    done.sort_unstable_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, c)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helios_sizes_come_from_the_largest_day() {
        let csv = "date,a,b,c,total\n2020-04-01,8,0,8,16\n2020-04-02,0,16,32,48\n";
        assert_eq!(helios_vc_sizes(csv).unwrap(), vec![32, 16]);
        assert!(helios_vc_sizes("date,a\n").is_err());
        assert!(
            helios_vc_sizes("date,a,total\n2020-04-01,x,1\n")
                .unwrap_err()
                .contains("line 2")
        );
    }

    #[test]
    fn teams_are_drawn_with_the_skew_of_the_weights() {
        let job = SimJob {
            name: "j".into(),
            submit_time_s: 0,
            duration_s: 1,
            gpus_per_replica: Milli::gpus(1),
            replicas: 1,
            allow_spread: false,
            team: "x".into(),
            priority_class: "training".into(),
            gpu_model: None,
        };
        let jobs = vec![job; 10_000];
        let out = with_teams(&jobs, &[3.0, 1.0]);
        let first = out.iter().filter(|j| j.team == "team-0").count();
        assert!((7_000..8_000).contains(&first), "{first}");
        assert_eq!(with_teams(&jobs, &[3.0, 1.0]), out, "the same every run");
        let w = skewed_weights(&[200, 100, 10], 6);
        assert_eq!(w, vec![200.0, 200.0, 100.0, 100.0, 10.0, 10.0]);
    }
}
