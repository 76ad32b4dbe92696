//! Criterion benchmarks of one scheduling cycle at fleet scale: placing from a
//! deep queue, and a cycle that must preempt. Figures print as elements/s
//! (placements per second).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;

use axle_policy::{Milli, Policy, PriorityClass, Quota, Settings, Team, TeamBurst};
use axle_scheduler::{
    Allocation, ClusterInventory, CycleOptions, Inventory, NodeInventory, Shard, State,
    WorkloadSpec, cycle,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const CLUSTERS: usize = 500;
const NODES_PER_CLUSTER: usize = 16;
const GPUS_PER_NODE: u32 = 8;
const TEAMS: usize = 1000;
const PENDING: usize = 100_000;

fn class(name: &str, value: i32, by: &[&str], idle_only: bool) -> (String, PriorityClass) {
    (
        name.to_string(),
        PriorityClass {
            name: name.to_string(),
            value,
            preemptible_by: by.iter().map(|s| s.to_string()).collect(),
            grace_period_s: 30,
            idle_only,
            burst_allowed: !idle_only,
            checkpointable: false,
            checkpoint_interval_s: 1800,
            checkpoint_signal: "SIGTERM".into(),
            placement: axle_policy::GangPlacement::Packed,
            min_runtime_s: 0,
            tolerable_wait_s: 0,
        },
    )
}

fn policy() -> Policy {
    let capacity = (CLUSTERS * NODES_PER_CLUSTER) as u64 * u64::from(GPUS_PER_NODE);
    let per_team = capacity / TEAMS as u64;
    let teams = (0..TEAMS)
        .map(|i| {
            let name = format!("team-{i:04}");
            (
                name.clone(),
                Team {
                    name,
                    quotas: BTreeMap::from([(
                        "H100".to_string(),
                        Quota {
                            guaranteed: Milli::gpus(per_team),
                            limit: Milli::gpus(per_team * 4),
                        },
                    )]),
                    weight: 1.0 + (i % 3) as f64,
                    members: Vec::new(),
                    groups: Vec::new(),
                    burst: TeamBurst::default(),
                },
            )
        })
        .collect();
    Policy {
        revision: "bench".into(),
        teams,
        priority_classes: BTreeMap::from([
            class("production", 1000, &[], false),
            class("training", 100, &["production"], false),
            class("development", 10, &["training", "production"], false),
            class("batch", 0, &["development", "training", "production"], true),
        ]),
        clusters: BTreeMap::new(),
        burst_providers: BTreeMap::new(),
        settings: Settings::default(),
    }
}

fn inventory() -> Inventory {
    Inventory {
        clusters: (0..CLUSTERS)
            .map(|c| ClusterInventory {
                name: format!("c-{c:03}"),
                region: if c % 2 == 0 { "eu".into() } else { "us".into() },
                schedulable: true,
                needs_image: false,
                price_per_gpu_hour: axle_policy::Usd::ZERO,
                owner_team: None,
                nodes: (0..NODES_PER_CLUSTER)
                    .map(|n| NodeInventory {
                        name: format!("node-{n}"),
                        gpu_model: "H100".into(),
                        gpu_count: GPUS_PER_NODE,
                        gpu_memory_mb: 80 * 1024,
                        fractions_only: false,
                        whole_only: false,
                        units: Vec::new(),
                        topology: None,
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn spec(id: u64, team: usize, class: &str, gpus: Milli) -> WorkloadSpec {
    WorkloadSpec {
        id,
        team: format!("team-{team:04}"),
        priority_class: class.into(),
        gpus_per_replica: gpus,
        replicas: 1,
        gpu_model: None,
        regions: Vec::new(),
        allow_spread: false,
        burst_allowed: false,
        submit_time_ms: id,
        checkpoint_interval_s: None,
        max_runtime_s: None,
        has_image: false,
        expected_runtime: None,
    }
}

/// 100,000 pending workloads of 1,000 teams (mostly 1 GPU, some 0.5, 2, 4
/// and 8) on an empty fleet of 64,000 GPUs.
fn deep_queue() -> State {
    let mut s = State::new(Arc::new(policy()), &inventory());
    for i in 0..PENDING as u64 {
        let gpus = match i % 10 {
            0 => Milli(500),
            1 => Milli::gpus(2),
            2 => Milli::gpus(4),
            3 if i % 20 == 3 => Milli::gpus(8),
            _ => Milli::gpus(1),
        };
        s.submit(spec(i, (i as usize * 7) % TEAMS, "training", gpus))
            .expect("valid");
    }
    s
}

/// A full fleet of batch work (one 1-GPU workload per GPU) held by the
/// first half of the teams, each borrowing twice its guarantee, and 256
/// pending training workloads of `gpus` GPUs from teams of the other half,
/// within their guarantees, that can only run by preempting (reclaim).
fn must_preempt(gpus: u64) -> State {
    let mut s = State::new(Arc::new(policy()), &inventory());
    let mut id = 0u64;
    for c in 0..CLUSTERS as u32 {
        for n in 0..NODES_PER_CLUSTER as u32 {
            for g in 0..GPUS_PER_NODE {
                let team = (id as usize) % (TEAMS / 2);
                let w = spec(id, team, "batch", Milli::gpus(1));
                let alloc = Allocation {
                    cluster: c,
                    replicas: vec![vec![Shard {
                        node: n,
                        gpu: g,
                        milli: Milli::gpus(1),
                    }]],
                };
                s.start(Arc::new(w), alloc, id).expect("free GPU");
                id += 1;
            }
        }
    }
    for i in 0..256u64 {
        s.submit(spec(
            id + i,
            TEAMS / 2 + (i as usize * 13) % (TEAMS / 2),
            "training",
            Milli::gpus(gpus),
        ))
        .expect("valid");
    }
    s
}

fn bench(c: &mut Criterion) {
    let opts = CycleOptions::default();
    let state = deep_queue();
    let placed = cycle(&state, 1_000_000, &opts).placements.len();
    println!("deep queue: {PENDING} pending, {placed} placed per cycle");
    let mut g = c.benchmark_group("cycle");
    g.sample_size(10);
    g.throughput(Throughput::Elements(placed as u64));
    g.bench_function("place_from_100k_pending_500x16x8", |b| {
        b.iter(|| black_box(cycle(black_box(&state), 1_000_000, &opts)))
    });

    // The simulator's cycle: no reason for what waits.
    let quiet = CycleOptions {
        explain: false,
        ..CycleOptions::default()
    };
    g.bench_function("place_from_100k_pending_unexplained_500x16x8", |b| {
        b.iter(|| black_box(cycle(black_box(&state), 1_000_000, &quiet)))
    });

    // One victim per request: a borrower of the lowest class on every node,
    // each losing a different amount of work.
    let state = must_preempt(1);
    let d = cycle(&state, 1_000_000, &opts);
    println!(
        "must preempt, one victim each: {} placed, {} preempted per cycle",
        d.placements.len(),
        d.preemptions.len()
    );
    g.throughput(Throughput::Elements(d.preemptions.len() as u64));
    g.bench_function("preempt_256_on_full_fleet_500x16x8", |b| {
        b.iter(|| black_box(cycle(black_box(&state), 1_000_000, &opts)))
    });

    // The worst case: no ideal victim anywhere. Every request needs two
    // victims, every node of the fleet offers them, so no search can stop at
    // a perfect victim and each one compares scopes.
    let state = must_preempt(2);
    let d = cycle(&state, 1_000_000, &opts);
    println!(
        "must preempt, no ideal victim: {} placed, {} preempted per cycle",
        d.placements.len(),
        d.preemptions.len()
    );
    g.throughput(Throughput::Elements(d.preemptions.len() as u64));
    g.bench_function("preempt_worst_case_no_ideal_victim_500x16x8", |b| {
        b.iter(|| black_box(cycle(black_box(&state), 1_000_000, &opts)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
