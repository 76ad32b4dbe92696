//! `axle simulate`: replay a GPU job trace through Axle's scheduler and
//! today's baselines, side by side.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use axle_policy::{Milli, Policy};
use axle_scheduler::{Inventory, State, inventory};
use axle_sim::trace::{TraceFormat, parse_node_list, parse_trace};
use axle_sim::{self as sim, Mode, Progress, SimJob, SimReport};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Args)]
pub struct SimulateArgs {
    /// Job trace file (`.gz` is read compressed).
    #[arg(long)]
    trace: PathBuf,
    /// Policy repository (directory of YAML documents).
    #[arg(long)]
    policy: PathBuf,
    /// Trace format.
    #[arg(long, default_value = "philly")]
    format: String,
    /// Also run baselines and print them beside Axle (repeat, or separate
    /// with commas: `--baseline firstfit,fifo,static`).
    #[arg(long, value_enum, value_delimiter = ',')]
    baseline: Vec<Baseline>,
    /// Simulate one cluster of N GPUs in 8-GPU nodes instead of the policy's clusters.
    #[arg(long, conflicts_with = "nodes")]
    capacity: Option<u64>,
    /// Simulate the nodes of an Alibaba openb node list
    /// (`sn,cpu_milli,memory_mib,gpu,model`) as one cluster.
    #[arg(long)]
    nodes: Option<PathBuf>,
    /// Priority class for trace jobs that name none (default: `training` if
    /// the policy has it, else the policy's default class).
    #[arg(long)]
    priority: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    output: Output,
    /// Run the robustness matrix on a Philly trace instead: Philly at 256 to
    /// 1,024 GPUs with arrivals ×0.5, ×1 and ×2, synthetic fleets of 10, 50
    /// and 200 teams skewed like `--team-mix`, and only the multi-node
    /// jobs; Axle against the textbook first-fit in each. Exits 1 when Axle
    /// loses a cell.
    #[arg(long, requires = "team_mix", conflicts_with_all = ["baseline", "capacity", "nodes"])]
    matrix: bool,
    /// Helios Earth VC sizes (`Earth_gpu_number.csv`) the synthetic
    /// matrix cells take their team skew from.
    #[arg(long)]
    team_mix: Option<PathBuf>,
    /// The whole matrix, or the CI-sized one (the first 20,000 jobs at a
    /// quarter of the capacities).
    #[arg(long, value_enum, default_value = "full")]
    matrix_size: MatrixSizeArg,
    /// Run the fill-until-full experiment instead (FGD, ATC'23): pods drawn
    /// from the trace arrive until the fleet is asked for all its GPUs,
    /// nothing finishes; prints the share of GPUs Axle, first-fit,
    /// best-fit and FGD leave unallocated when the first pod fails.
    #[arg(long, conflicts_with_all = ["baseline", "matrix"])]
    fill: bool,
    /// Seeds of the fill experiment (one sequence of arrivals each).
    #[arg(long, default_value_t = 10, requires = "fill")]
    seeds: u64,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum MatrixSizeArg {
    Full,
    Reduced,
}

#[derive(Clone, Copy, ValueEnum)]
enum Baseline {
    /// Each team only on its own guaranteed GPUs, no borrowing.
    Static,
    /// Textbook FIFO: one queue in arrival order, the head blocks the rest.
    Fifo,
    /// Textbook first-fit: one queue scanned whole, starting whatever fits;
    /// best-fit node, whole free nodes for jobs larger than a node.
    Firstfit,
    /// First-fit through Axle's core: large jobs may spread over partly
    /// used nodes.
    #[value(name = "firstfit-spread")]
    FirstfitSpread,
}

impl Baseline {
    fn mode(self) -> Mode {
        match self {
            Baseline::Static => Mode::Static,
            Baseline::Fifo => Mode::Fifo,
            Baseline::Firstfit => Mode::FirstFit,
            Baseline::FirstfitSpread => Mode::FirstFitSpread,
        }
    }
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Output {
    Text,
    Json,
}

fn args_matrix(args: &SimulateArgs) -> crate::simulate_matrix::MatrixArgs {
    crate::simulate_matrix::MatrixArgs {
        team_mix: args.team_mix.clone().unwrap_or_default(),
        size: match args.matrix_size {
            MatrixSizeArg::Full => sim::matrix::MatrixSize::Full,
            MatrixSizeArg::Reduced => sim::matrix::MatrixSize::Reduced,
        },
        priority: args.priority.clone(),
        json: args.output == Output::Json,
    }
}

/// A trace or node list, gunzipped when its name ends in `.gz`.
pub(crate) fn read_text(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read as _;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(path)?).read_to_string(&mut text)?;
        Ok(text)
    } else {
        std::fs::read_to_string(path)
    }
}

/// The inventory to replay on: `--capacity`, `--nodes`, or the policy's
/// declared clusters.
fn inventory_of(
    args: &SimulateArgs,
    policy: &Policy,
    jobs: &[SimJob],
) -> anyhow::Result<Inventory> {
    if let Some(path) = &args.nodes {
        let content =
            read_text(path).with_context(|| format!("cannot read node list {}", path.display()))?;
        let list = parse_node_list(&path.display().to_string(), &content)?;
        if list.nodes.is_empty() {
            bail!("node list {} has no GPU node", path.display());
        }
        return Ok(sim::setup::inventory_of(&list));
    }
    Ok(match args.capacity {
        Some(0) => bail!("--capacity must be at least 1 GPU"),
        Some(n) => {
            let model = jobs
                .iter()
                .find_map(|j| j.gpu_model.clone())
                .unwrap_or_else(|| "V100".to_string());
            inventory::uniform("sim", "sim", &model, n, 8)
        }
        None => inventory::declared(policy),
    })
}

pub fn run(args: SimulateArgs) -> anyhow::Result<ExitCode> {
    let format: TraceFormat = args.format.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    let loaded = match axle_policy::load_dir(&args.policy) {
        Ok(l) => l,
        Err(failure) => {
            eprintln!("{failure}");
            bail!(
                "policy {} has errors; fix them first (axle policy check)",
                args.policy.display()
            );
        }
    };
    let content = read_text(&args.trace)
        .with_context(|| format!("cannot read trace {}", args.trace.display()))?;
    let trace = parse_trace(&args.trace.display().to_string(), &content, format)?;
    let policy = loaded.policy;
    if args.matrix {
        return crate::simulate_matrix::run(&args_matrix(&args), &policy, &trace, format);
    }

    let default_class =
        sim::setup::default_class(&policy, args.priority.as_deref()).map_err(anyhow::Error::msg)?;
    let jobs = sim::setup::jobs_of(&trace, &policy, &default_class);

    let inventory = inventory_of(&args, &policy, &jobs)?;
    let capacity: Milli = State::new(std::sync::Arc::new(policy.clone()), &inventory).capacity();
    if capacity == Milli::ZERO {
        bail!(
            "no capacity to simulate: the policy declares no Cluster nodes; pass --capacity N or --nodes FILE"
        );
    }
    if args.fill {
        return crate::simulate_fill::run(
            &policy,
            &inventory,
            &jobs,
            args.seeds,
            args.output == Output::Json,
        );
    }
    let (policy, notes) = sim::complete_policy(&policy, &jobs, capacity);
    if args.output == Output::Text {
        for (reason, n) in &trace.skipped {
            eprintln!("note: skipped {n} rows: {reason}");
        }
        // One line however many teams were made up (a trace of 15 teams
        // printed 15 notes); `--output json` keeps one note per team.
        match notes.as_slice() {
            [] => {}
            [one] => eprintln!("note: {one}"),
            many => eprintln!(
                "note: {} teams of the trace are not in the policy: each was created with a guarantee in proportion to its share of the trace's GPU-hours (see `--output json` `notes`)",
                many.len()
            ),
        }
    }

    let mut modes = vec![Mode::Axle];
    for b in &args.baseline {
        if !modes.contains(&b.mode()) {
            modes.push(b.mode());
        }
    }
    // A bar only for a person watching: never in pipes, files or CI logs.
    let show_bar = std::io::stderr().is_terminal();
    let mut reports: Vec<(SimReport, f64)> = Vec::new();
    for mode in modes {
        let bar = show_bar.then(|| {
            let bar = ProgressBar::new(jobs.len() as u64);
            bar.set_style(
                ProgressStyle::with_template("{msg:>9} [{bar:40}] {pos}/{len} jobs ({eta})")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            bar.set_message(mode.as_str());
            bar
        });
        let mut on_progress = |p: Progress| {
            if let Some(bar) = &bar {
                bar.set_position(p.jobs_submitted);
            }
        };
        let t0 = Instant::now();
        let r = sim::simulate(&policy, &inventory, &jobs, mode, &mut on_progress);
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        reports.push((r, t0.elapsed().as_secs_f64()));
    }

    match args.output {
        Output::Json => {
            let mut v = serde_json::to_value(&reports[0].0)?;
            if let Some((b, _)) = reports.get(1) {
                v["baseline"] = serde_json::to_value(b)?;
            }
            let mut all = serde_json::Map::new();
            for (r, _) in &reports[1..] {
                all.insert(r.mode.as_str().to_string(), serde_json::to_value(r)?);
            }
            v["baselines"] = serde_json::Value::Object(all);
            v["notes"] = serde_json::to_value(&notes)?;
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Output::Text => print_text(&reports),
    }
    Ok(ExitCode::SUCCESS)
}

fn print_text(reports: &[(SimReport, f64)]) {
    print!("{:<32}", "");
    for (r, _) in reports {
        print!("{:>16}", r.mode.as_str());
    }
    println!();
    let row = |label: &str, f: &dyn Fn(&SimReport) -> String| {
        print!("{label:<32}");
        for (r, _) in reports {
            print!("{:>16}", f(r));
        }
        println!();
    };
    row("capacity_gpus", &|r| format!("{}", r.capacity_gpus));
    row("jobs_submitted", &|r| r.jobs_submitted.to_string());
    row("jobs_rejected", &|r| r.jobs_rejected.to_string());
    row("jobs_finished", &|r| r.jobs_finished.to_string());
    row("gpu_utilization", &|r| format!("{:.3}", r.gpu_utilization));
    row("queue_delay_s.mean", &|r| {
        format!("{:.0}", r.queue_delay_s.mean)
    });
    row("queue_delay_s.p95", &|r| {
        format!("{:.0}", r.queue_delay_s.p95)
    });
    row("idle_while_waiting_gpu_hours", &|r| {
        format!("{:.0}", r.idle_while_waiting_gpu_hours)
    });
    row("preemptions", &|r| r.preemptions.to_string());
    row("gpu_hours_lost_to_preemption", &|r| {
        format!("{:.0}", r.gpu_hours_lost_to_preemption)
    });
    row("guarantee_violations", &|r| {
        r.guarantee_violations.to_string()
    });
    row("makespan_s", &|r| r.makespan_s.to_string());
    row("cycles", &|r| r.cycles.to_string());
    row("start_estimates_within_25pct", &|r| {
        r.start_estimates.as_ref().map_or("-".to_string(), |e| {
            format!("{}/{}", e.within_25pct, e.estimated)
        })
    });
    for (r, secs) in reports {
        for (why, n) in &r.rejected_reasons {
            println!("{}: rejected {n} jobs: {why}", r.mode.as_str());
        }
        println!("{}: simulated in {secs:.2}s", r.mode.as_str());
    }
    for (r, _) in reports {
        println!();
        println!("per priority class ({})", r.mode.as_str());
        println!(
            "  {:<16}{:>10}{:>14}{:>14}{:>13}{:>11}",
            "class", "jobs", "delay mean s", "delay p95 s", "preemptions", "lost_gpu_h"
        );
        for (c, d) in &r.per_priority_class {
            println!(
                "  {c:<16}{:>10}{:>14.0}{:>14.0}{:>13}{:>11.0}",
                d.queue_delay_s.jobs,
                d.queue_delay_s.mean,
                d.queue_delay_s.p95,
                d.preemptions,
                d.gpu_hours_lost_to_preemption
            );
        }
    }
    for (r, _) in reports {
        println!();
        println!("per team ({})", r.mode.as_str());
        println!(
            "  {:<12}{:>10}{:>12}{:>9}{:>13}{:>14}{:>14}{:>13}{:>11}{:>12}",
            "team",
            "finished",
            "gpu_hours",
            "share",
            "entitlement",
            "delay mean s",
            "delay p95 s",
            "preemptions",
            "lost_gpu_h",
            "violations"
        );
        for (t, tr) in &r.per_team {
            println!(
                "  {t:<12}{:>10}{:>12.0}{:>8.1}%{:>12.1}%{:>14.0}{:>14.0}{:>13}{:>11.0}{:>12}",
                tr.jobs_finished,
                tr.gpu_hours,
                tr.share * 100.0,
                tr.entitlement * 100.0,
                tr.queue_delay_s.mean,
                tr.queue_delay_s.p95,
                tr.preemptions,
                tr.gpu_hours_lost_to_preemption,
                tr.guarantee_violations
            );
        }
    }
}
