//! `axle simulate --fill`: the fill-until-full experiment
//! (`axle_sim::fill`) on a trace of GPU-sharing pods and a node list: the
//! share of GPUs each packer leaves unallocated when the first pod no
//! longer fits, and once the arrivals ask for the whole fleet.

use std::process::ExitCode;

use axle_policy::Policy;
use axle_scheduler::Inventory;
use axle_sim::SimJob;
use axle_sim::fill::{self, FillRow, Packer};

use crate::layout::render;
use crate::table::Row;

/// Seeds a fill run may take: each is one full fleet's worth of arrivals
/// for each packer; a hundred gives tight means and still runs in minutes.
pub const MAX_FILL_SEEDS: u64 = 100;

pub fn run(
    policy: &Policy,
    inventory: &Inventory,
    jobs: &[SimJob],
    seeds: u64,
    json: bool,
) -> anyhow::Result<ExitCode> {
    if seeds == 0 || seeds > MAX_FILL_SEEDS {
        anyhow::bail!("--seeds must be 1..={MAX_FILL_SEEDS}, got {seeds}");
    }
    let seeds: Vec<u64> = (1..=seeds).collect();
    let rows = fill::fill(policy, inventory, jobs, &seeds, &Packer::ALL);
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print_table(&rows);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(rows: &[FillRow]) {
    let pct = |x: f64| format!("{:.2} %", x * 100.0);
    // The least and most unallocated at the first failure over the seeds.
    let spread = |r: &FillRow| {
        let at = r.runs.iter().map(|x| x.unallocated_at_first_failure);
        (
            at.clone().fold(f64::INFINITY, f64::min),
            at.fold(f64::NEG_INFINITY, f64::max),
        )
    };
    let header = [
        "PACKER",
        "UNALLOCATED AT FIRST FAILURE",
        "MIN .. MAX",
        "PODS PLACED BEFORE IT",
        "UNALLOCATED AT 100 % DEMAND",
    ];
    let table_rows: Vec<Row> = rows
        .iter()
        .map(|r| {
            let (lo, hi) = spread(r);
            let placed = r
                .runs
                .iter()
                .map(|x| x.placed_before_first_failure as f64)
                .sum::<f64>()
                / r.runs.len().max(1) as f64;
            Row {
                key: r.packer.name().to_string(),
                cells: vec![
                    r.packer.name().to_string(),
                    pct(r.mean_unallocated_at_first_failure),
                    format!("{} .. {}", pct(lo), pct(hi)),
                    format!("{placed:.0}"),
                    pct(r.mean_unallocated_at_full_demand),
                ],
            }
        })
        .collect();
    print!("{}", render(Some(&header), &table_rows, None));
    println!(
        "{} seeds; pods drawn with replacement from the trace; GPUs only (CPU and memory not modelled)",
        rows.first().map_or(0, |r| r.runs.len())
    );
}
