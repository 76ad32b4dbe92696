//! Axle against the simplest good scheduler on every trace kept in the
//! repository (the full traces of `../shared/traces`): in the same run,
//! Axle's mean and p95 queueing delay are at most greedy first-fit's, its
//! utilization at least first-fit's less 0.01, the GPU-hours it leaves idle
//! while work waits at most 6 % of static allocation's (a borrowing gang is
//! reclaimed whole, which can free more than the claimant needs), and no
//! guarantee is ever broken. The figures are printed (`--nocapture`) for the README.
//!
//! The replays run optimized (see the workspace `[profile.dev.package]`):
//! three traces with three schedulers each take about half a minute.

mod common;

use axle_policy::Policy;
use axle_scheduler::{Inventory, inventory};
use axle_sim::setup::{default_class, inventory_of, jobs_of};
use axle_sim::trace::{TraceFormat, parse_node_list, parse_trace};
use axle_sim::{Mode, SimReport, complete_policy, simulate};
use common::{gunzip, policy};

/// Replays the trace under Axle, first-fit and static allocation.
fn compare(name: &str, trace: &str, format: TraceFormat, policy: Policy, inv: Inventory) {
    let trace = parse_trace(name, trace, format).expect("the trace parses");
    let class = default_class(&policy, None).expect("a default class");
    let jobs = jobs_of(&trace, &policy, &class);
    let capacity = axle_scheduler::State::new(std::sync::Arc::new(policy.clone()), &inv).capacity();
    let (policy, _) = complete_policy(&policy, &jobs, capacity);
    let run = |mode| simulate(&policy, &inv, &jobs, mode, &mut |_| {});
    let (axle, firstfit, fixed): (SimReport, SimReport, SimReport) =
        (run(Mode::Axle), run(Mode::FirstFit), run(Mode::Static));
    for r in [&axle, &firstfit, &fixed] {
        println!(
            "{name} {:>8}: mean {:>8.0} s  p95 {:>8.0} s  util {:.3}  idle-while-waiting {:>7.0} GPU-h  preemptions {:>5}  lost {:>5.0} GPU-h  guarantee violations {}",
            r.mode.as_str(),
            r.queue_delay_s.mean,
            r.queue_delay_s.p95,
            r.gpu_utilization,
            r.idle_while_waiting_gpu_hours,
            r.preemptions,
            r.gpu_hours_lost_to_preemption,
            r.guarantee_violations
        );
    }
    assert_eq!(
        axle.jobs_finished, firstfit.jobs_finished,
        "{name}: every job finishes"
    );
    assert!(
        axle.queue_delay_s.mean <= firstfit.queue_delay_s.mean,
        "{name}: mean delay {} > firstfit's {}",
        axle.queue_delay_s.mean,
        firstfit.queue_delay_s.mean
    );
    assert!(
        axle.queue_delay_s.p95 <= firstfit.queue_delay_s.p95,
        "{name}: p95 delay {} > firstfit's {}",
        axle.queue_delay_s.p95,
        firstfit.queue_delay_s.p95
    );
    assert!(
        axle.gpu_utilization >= firstfit.gpu_utilization - 0.01,
        "{name}: utilization {} < firstfit's {} - 0.01",
        axle.gpu_utilization,
        firstfit.gpu_utilization
    );
    assert!(
        axle.idle_while_waiting_gpu_hours <= 0.06 * fixed.idle_while_waiting_gpu_hours,
        "{name}: idle while waiting {} GPU-h > 6% of static's {}",
        axle.idle_while_waiting_gpu_hours,
        fixed.idle_while_waiting_gpu_hours
    );
    assert_eq!(axle.guarantee_violations, 0, "{name}: guarantees broken");
    let e = axle
        .start_estimates
        .as_ref()
        .expect("Axle checks its estimates");
    println!(
        "{name} start estimates: {} of {} waiting jobs estimated, {} ({:.1} %) within ±25 % of the real start",
        e.estimated,
        e.waited,
        e.within_25pct,
        100.0 * e.fraction_within_25pct
    );
    assert!(e.estimated <= e.waited && e.within_25pct <= e.estimated);
}

/// The textbook first-fit and FIFO of `textbook.rs` give, on Philly at 512
/// GPUs, the figures an independent implementation of the same textbook
/// rules gave (issue 31): within 1 % on mean and p95 queueing delay and on
/// utilization.
#[test]
fn textbook_baselines_match_an_independent_implementation() {
    let trace = parse_trace("philly", &gunzip("philly.csv.gz"), TraceFormat::Philly).unwrap();
    let policy = policy("deploy/examples/policy");
    let class = default_class(&policy, None).unwrap();
    let jobs = jobs_of(&trace, &policy, &class);
    let inv = inventory::uniform("sim", "sim", "V100", 512, 8);
    let (policy, _) = complete_policy(&policy, &jobs, axle_policy::Milli::gpus(512));
    // (mode, mean s, p95 s, utilization) of the independent implementation.
    for (mode, mean, p95, util) in [
        (Mode::FirstFit, 95_866.0, 271_280.0, 0.731),
        (Mode::Fifo, 808_193.0, 1_365_476.0, 0.718),
    ] {
        let r = simulate(&policy, &inv, &jobs, mode, &mut |_| {});
        println!(
            "philly@512 {:>8}: mean {:.0} s (textbook {mean:.0})  p95 {:.0} s (textbook {p95:.0})  util {:.3} (textbook {util})",
            mode.as_str(),
            r.queue_delay_s.mean,
            r.queue_delay_s.p95,
            r.gpu_utilization
        );
        let within = |got: f64, want: f64, what: &str| {
            assert!(
                (got - want).abs() <= 0.01 * want,
                "{}: {what} {got} is not within 1 % of {want}",
                mode.as_str()
            );
        };
        within(r.queue_delay_s.mean, mean, "mean delay");
        within(r.queue_delay_s.p95, p95, "p95 delay");
        within(r.gpu_utilization, util, "utilization");
        assert_eq!(r.jobs_finished, 82_247);
        assert_eq!(r.preemptions, 0, "the textbook never preempts");
    }
}

#[test]
fn philly_on_512_gpus() {
    compare(
        "philly@512",
        &gunzip("philly.csv.gz"),
        TraceFormat::Philly,
        policy("deploy/examples/policy"),
        inventory::uniform("sim", "sim", "V100", 512, 8),
    );
}

#[test]
fn philly_with_the_helios_vc_sizes() {
    compare(
        "philly-helios",
        &gunzip("philly.csv.gz"),
        TraceFormat::Philly,
        policy("deploy/examples/philly-helios"),
        inventory::uniform("sim", "sim", "V100", 2816, 8),
    );
}

#[test]
fn alibaba_openb_on_its_own_nodes() {
    let nodes = parse_node_list(
        "openb_node_list_gpu_node.csv",
        &gunzip("openb_node_list_gpu_node.csv.gz"),
    )
    .expect("the node list parses");
    compare(
        "openb",
        &gunzip("openb_pod_list_default.csv.gz"),
        TraceFormat::AlibabaOpenb,
        policy("deploy/examples/policy"),
        inventory_of(&nodes),
    );
}
