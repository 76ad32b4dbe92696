//! `axle simulate --matrix`: Axle against the textbook first-fit on every
//! cell of the robustness matrix (`axle_sim::matrix`), printed as a table
//! with the cells Axle loses in red.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use axle_policy::Policy;
use axle_sim::matrix::{self, Cell, CellSpec, MatrixSize};
use axle_sim::trace::{Trace, TraceFormat};

pub struct MatrixArgs {
    pub team_mix: PathBuf,
    pub size: MatrixSize,
    pub priority: Option<String>,
    pub json: bool,
}

/// Cells run at once: one per core, at most this many (each holds a
/// trace's worth of jobs twice).
const MAX_PARALLEL_CELLS: usize = 8;

pub fn run(
    args: &MatrixArgs,
    policy: &Policy,
    trace: &Trace,
    format: TraceFormat,
) -> anyhow::Result<ExitCode> {
    if format != TraceFormat::Philly {
        bail!("--matrix replays a Philly trace (--format philly)");
    }
    let text = crate::simulate_cmd::read_text(&args.team_mix)
        .with_context(|| format!("cannot read team mix {}", args.team_mix.display()))?;
    let sizes = matrix::helios_vc_sizes(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.team_mix.display()))?;
    let class = axle_sim::setup::default_class(policy, args.priority.as_deref())
        .map_err(anyhow::Error::msg)?;
    let jobs = axle_sim::setup::jobs_of(trace, policy, &class);
    let specs = matrix::cells(&jobs, &sizes, args.size);
    let cells = run_all(policy, &specs);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cells)?);
    } else {
        print_table(&cells, std::io::stdout().is_terminal());
    }
    let lost = cells.iter().filter(|c| !c.ok()).count();
    if lost > 0 {
        eprintln!("Axle loses {lost} of {} cells", cells.len());
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Every cell, on as many threads as there are cores.
fn run_all(policy: &Policy, specs: &[CellSpec]) -> Vec<Cell> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_PARALLEL_CELLS);
    matrix::run_cells(policy, specs, threads)
}

fn print_table(cells: &[Cell], color: bool) {
    let header = [
        "cell",
        "jobs",
        "axle mean s",
        "firstfit mean s",
        "axle p95 s",
        "firstfit p95 s",
        "axle util",
        "firstfit util",
        "preemptions",
        "lost GPU-h",
        "violations",
    ];
    // (text, lost): a lost cell is red on a terminal, else marked `!`.
    let rows: Vec<Vec<(String, bool)>> = cells
        .iter()
        .map(|c| {
            vec![
                (c.name.clone(), false),
                (c.jobs.to_string(), false),
                (format!("{:.0}", c.axle.queue_delay_s.mean), !c.mean_ok()),
                (format!("{:.0}", c.firstfit.queue_delay_s.mean), false),
                (format!("{:.0}", c.axle.queue_delay_s.p95), !c.p95_ok()),
                (format!("{:.0}", c.firstfit.queue_delay_s.p95), false),
                (format!("{:.3}", c.axle.gpu_utilization), false),
                (format!("{:.3}", c.firstfit.gpu_utilization), false),
                (c.axle.preemptions.to_string(), false),
                (format!("{:.0}", c.axle.gpu_hours_lost_to_preemption), false),
                (
                    c.axle.guarantee_violations.to_string(),
                    c.axle.guarantee_violations > 0,
                ),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, (text, lost)) in widths.iter_mut().zip(r) {
            *w = (*w).max(text.chars().count() + usize::from(*lost && !color) * 2);
        }
    }
    let line = |cells: Vec<String>| println!("| {} |", cells.join(" | "));
    line(
        header
            .iter()
            .zip(&widths)
            .map(|(h, w)| format!("{h:<w$}"))
            .collect(),
    );
    line(widths.iter().map(|w| "-".repeat(*w)).collect());
    for r in rows {
        line(
            r.into_iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, ((text, lost), w))| {
                    let text = if lost && !color {
                        format!("{text} !")
                    } else {
                        text
                    };
                    let padded = if i == 0 {
                        format!("{text:<w$}")
                    } else {
                        format!("{text:>w$}")
                    };
                    if lost && color {
                        format!("\x1b[31m{padded}\x1b[0m")
                    } else {
                        padded
                    }
                })
                .collect(),
        );
    }
    let won = cells.iter().filter(|c| c.ok()).count();
    println!(
        "Axle at or below first-fit on mean and p95 delay, with no guarantee broken, in {won} of {} cells",
        cells.len()
    );
}
