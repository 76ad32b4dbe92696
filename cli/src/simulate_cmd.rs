//! `axle simulate`: replay a GPU job trace through Axle's scheduler and a baseline.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use axle_policy::{Milli, Policy};
use axle_scheduler::inventory;
use axle_scheduler::{Inventory, State};
use axle_sim::trace::{TraceFormat, parse_trace};
use axle_sim::{self as sim, Mode, SimJob, SimReport};
use clap::{Args, ValueEnum};

#[derive(Args)]
pub struct SimulateArgs {
    /// Job trace file.
    #[arg(long)]
    trace: PathBuf,
    /// Policy repository (directory of YAML documents).
    #[arg(long)]
    policy: PathBuf,
    /// Trace format.
    #[arg(long, default_value = "philly")]
    format: String,
    /// Also run a baseline and print it beside Axle.
    #[arg(long, value_enum)]
    baseline: Option<Baseline>,
    /// Simulate one cluster of N GPUs in 8-GPU nodes instead of the policy's clusters.
    #[arg(long)]
    capacity: Option<u64>,
    /// Priority class for trace jobs that name none (default: `training` if
    /// the policy has it, else the policy's default class).
    #[arg(long)]
    priority: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    output: Output,
}

#[derive(Clone, Copy, ValueEnum)]
enum Baseline {
    /// Each team only on its own guaranteed GPUs, no borrowing.
    Static,
    /// One FIFO queue without quotas.
    Fifo,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Output {
    Text,
    Json,
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
    let content = std::fs::read_to_string(&args.trace)
        .with_context(|| format!("cannot read trace {}", args.trace.display()))?;
    let trace = parse_trace(&args.trace.display().to_string(), &content, format)?;
    let policy = loaded.policy;

    let default_class = match &args.priority {
        Some(p) => {
            if !policy.priority_classes.contains_key(p) {
                bail!(
                    "unknown priority class {p:?}; the policy has: {}",
                    policy
                        .priority_classes
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            p.clone()
        }
        None if policy.priority_classes.contains_key("training") => "training".to_string(),
        None => policy.settings.default_priority_class.clone(),
    };
    let jobs: Vec<SimJob> = trace
        .jobs
        .iter()
        .map(|j| SimJob {
            name: j.name.clone(),
            submit_time_s: j.submit_time_s,
            duration_s: j.duration_s,
            gpus_per_replica: j.gpus_per_replica,
            replicas: j.replicas,
            allow_spread: j.allow_spread,
            team: j.team.clone(),
            priority_class: j
                .priority
                .clone()
                .filter(|p| policy.priority_classes.contains_key(p))
                .unwrap_or_else(|| default_class.clone()),
            gpu_model: j.gpu_model.clone(),
        })
        .collect();

    let inventory: Inventory = match args.capacity {
        Some(0) => bail!("--capacity must be at least 1 GPU"),
        Some(n) => {
            let model = jobs
                .iter()
                .find_map(|j| j.gpu_model.clone())
                .unwrap_or_else(|| "V100".to_string());
            inventory::uniform("sim", "sim", &model, n, 8)
        }
        None => inventory::declared(&policy),
    };
    let capacity: Milli = State::new(std::sync::Arc::new(policy.clone()), &inventory).capacity();
    if capacity == Milli::ZERO {
        bail!("no capacity to simulate: the policy declares no Cluster nodes; pass --capacity N");
    }
    let (policy, notes) = sim::complete_policy(&policy, &jobs, capacity);
    if args.output == Output::Text {
        for (reason, n) in &trace.skipped {
            eprintln!("note: skipped {n} rows: {reason}");
        }
        for n in &notes {
            eprintln!("note: {n}");
        }
    }

    let mut reports: Vec<(SimReport, f64)> = Vec::new();
    let mut modes = vec![Mode::Axle];
    match args.baseline {
        Some(Baseline::Static) => modes.push(Mode::Static),
        Some(Baseline::Fifo) => modes.push(Mode::Fifo),
        None => {}
    }
    for mode in modes {
        let t0 = Instant::now();
        let r = sim::simulate(&policy, &inventory, &jobs, mode);
        reports.push((r, t0.elapsed().as_secs_f64()));
    }

    match args.output {
        Output::Json => {
            let mut v = serde_json::to_value(&reports[0].0)?;
            if let Some((b, _)) = reports.get(1) {
                v["baseline"] = serde_json::to_value(b)?;
            }
            v["notes"] = serde_json::to_value(&notes)?;
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Output::Text => print_text(&reports, &policy),
    }
    Ok(ExitCode::SUCCESS)
}

fn print_text(reports: &[(SimReport, f64)], policy: &Policy) {
    let name = |m: Mode| match m {
        Mode::Axle => "axle",
        Mode::Static => "static",
        Mode::Fifo => "fifo",
    };
    print!("{:<32}", "");
    for (r, _) in reports {
        print!("{:>16}", name(r.mode));
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
    row("makespan_s", &|r| r.makespan_s.to_string());
    row("cycles", &|r| r.cycles.to_string());
    for (r, secs) in reports {
        if !r.rejected_reasons.is_empty() {
            for (why, n) in &r.rejected_reasons {
                println!("{}: rejected {n} jobs: {why}", name(r.mode));
            }
        }
        println!("{}: simulated in {secs:.2}s", name(r.mode));
    }
    for (r, _) in reports {
        println!();
        println!("per priority class ({})", name(r.mode));
        println!(
            "  {:<16}{:>10}{:>14}{:>14}",
            "class", "jobs", "delay mean s", "delay p95 s"
        );
        for (c, d) in &r.per_priority_class {
            println!("  {c:<16}{:>10}{:>14.0}{:>14.0}", d.jobs, d.mean, d.p95);
        }
    }
    for (r, _) in reports {
        println!();
        println!("per team ({})", name(r.mode));
        println!(
            "  {:<12}{:>10}{:>12}{:>9}{:>13}{:>14}{:>14}",
            "team", "finished", "gpu_hours", "share", "entitlement", "delay mean s", "delay p95 s"
        );
        for (t, tr) in &r.per_team {
            let _ = policy;
            println!(
                "  {t:<12}{:>10}{:>12.0}{:>8.1}%{:>12.1}%{:>14.0}{:>14.0}",
                tr.jobs_finished,
                tr.gpu_hours,
                tr.share * 100.0,
                tr.entitlement * 100.0,
                tr.queue_delay_s.mean,
                tr.queue_delay_s.p95
            );
        }
    }
}
