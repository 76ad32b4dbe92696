//! The fill-until-full experiment on the openb pods and their own nodes:
//! Axle's placement of fractions, through its core, leaves no more than
//! 10 % more of the fleet unallocated at the first pod that fails than the
//! fragmentation-gradient packer (FGD) does on the same arrivals, and every
//! packer sees the same arrivals. Figures printed for the README.

mod common;

use axle_sim::fill::{Packer, fill};
use axle_sim::setup::{default_class, inventory_of, jobs_of};
use axle_sim::trace::{TraceFormat, parse_node_list, parse_trace};
use common::gunzip;

#[test]
fn axle_packs_openb_fractions_within_ten_percent_of_fgd() {
    let policy = common::policy("deploy/examples/policy");
    let nodes = parse_node_list(
        "openb_node_list_gpu_node.csv",
        &gunzip("openb_node_list_gpu_node.csv.gz"),
    )
    .expect("the node list parses");
    let trace = parse_trace(
        "openb",
        &gunzip("openb_pod_list_default.csv.gz"),
        TraceFormat::AlibabaOpenb,
    )
    .expect("the trace parses");
    let class = default_class(&policy, None).expect("a default class");
    let jobs = jobs_of(&trace, &policy, &class);
    let inventory = inventory_of(&nodes);
    let rows = fill(&policy, &inventory, &jobs, &[1, 2, 3], &Packer::ALL);
    for r in &rows {
        println!(
            "{:>8}: unallocated at first failure {:.2} %, at full demand {:.2} %",
            r.packer.name(),
            r.mean_unallocated_at_first_failure * 100.0,
            r.mean_unallocated_at_full_demand * 100.0
        );
    }
    let of = |p: Packer| {
        rows.iter()
            .find(|r| r.packer == p)
            .expect("every packer ran")
    };
    let (axle, fgd) = (of(Packer::Axle), of(Packer::Fgd));
    assert!(
        axle.mean_unallocated_at_first_failure <= fgd.mean_unallocated_at_first_failure * 1.10,
        "Axle leaves {:.4} unallocated, FGD {:.4}",
        axle.mean_unallocated_at_first_failure,
        fgd.mean_unallocated_at_first_failure
    );
    for r in &rows {
        assert_eq!(r.runs.len(), 3);
        for run in &r.runs {
            // A fleet of 6,212 GPUs filled by pods of at most 8: the first
            // failure leaves something, and far from everything, free.
            assert!(
                run.unallocated_at_first_failure > 0.0 && run.unallocated_at_first_failure < 0.5,
                "{}: {run:?}",
                r.packer.name()
            );
            assert!(run.unallocated_at_full_demand <= run.unallocated_at_first_failure);
            assert!(run.placed_before_first_failure > 1000);
        }
    }
}
