//! Property tests of the scheduling invariants (ARCHITECTURE.md, "Invariants the tests prove" 1–3) and of
//! determinism, over random clusters, policies and workload streams run for
//! several cycles; plus checks that the checkers themselves catch violations.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use axle_policy::{CrossTeamPreemption, MILLI_PER_GPU, Milli};
use axle_scheduler::{
    CycleOptions, Decisions, Inventory, Placement, PreemptReason, Preemption, State, WorkloadSpec,
    cycle,
};
use common::*;
use proptest::prelude::*;

const MODELS: [&str; 2] = ["A100", "H100"];
const REGIONS: [&str; 3] = ["eu", "us", "ap"];

#[derive(Debug, Clone)]
enum Shape {
    /// One replica of a fraction (milli).
    Frac(u64),
    /// One replica of whole GPUs on one node.
    Whole(u64),
    /// A gang: (replicas, milli per replica).
    Gang(u32, u64),
    /// One replica of whole GPUs that may span nodes.
    Spread(u64),
}

#[derive(Debug, Clone)]
struct WlGen {
    team: usize,
    class: usize,
    shape: Shape,
    model: Option<usize>,
    region: Option<usize>,
}

#[derive(Debug, Clone)]
struct TeamGen {
    weight: u8,
    /// One `any` quota instead of one per model.
    any: bool,
    /// Per model: (has quota, share of the guarantees, GPUs of limit above the guarantee).
    quotas: [(bool, u64, u64); 2],
}

#[derive(Debug, Clone)]
struct Round {
    submits: Vec<WlGen>,
    /// Indices (mod the running count) of running workloads that finish.
    finish: Vec<usize>,
    requeue: Option<usize>,
    cancel: Option<usize>,
}

#[derive(Debug, Clone)]
struct Case {
    /// Per cluster: region index and nodes as (model index, GPUs).
    clusters: Vec<(usize, Vec<(usize, u32)>)>,
    teams: Vec<TeamGen>,
    /// Per model: guarantee shares nobody gets (so guarantees sum below capacity).
    slack: [u64; 2],
    rounds: Vec<Round>,
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        3 => (1u64..=3).prop_map(|q| Shape::Frac(q * 250)),
        3 => prop_oneof![3 => 1u64..=2, 1 => 3u64..=8].prop_map(Shape::Whole),
        // Gangs of fractions up to gangs of several whole GPUs per replica
        // (2 × 6 GPUs is the borrowing gang that once kept another team's
        // guarantee): victims and borrowers, placed across nodes.
        1 => (2u32..=3, prop_oneof![Just(250u64), Just(500), Just(750), Just(1000), Just(2000), Just(4000), Just(6000)])
            .prop_map(|(r, m)| Shape::Gang(r, m)),
        1 => (2u64..=8).prop_map(Shape::Spread),
    ]
}

fn wl_gen(teams: usize) -> impl Strategy<Value = WlGen> {
    (
        0..teams,
        0usize..4,
        shape(),
        prop_oneof![3 => Just(None), 1 => (0usize..2).prop_map(Some)],
        prop_oneof![5 => Just(None), 1 => (0usize..3).prop_map(Some)],
    )
        .prop_map(|(team, class, shape, model, region)| WlGen {
            team,
            class,
            shape,
            model,
            region,
        })
}

fn case() -> impl Strategy<Value = Case> {
    let cluster = (
        0usize..2,
        prop::collection::vec((0usize..2, 1u32..=8), 1..=4),
    );
    let team = (
        1u8..=2,
        prop::bool::weighted(0.25),
        prop::array::uniform2((prop::bool::weighted(0.8), 0u64..=3, 0u64..=8)),
    )
        .prop_map(|(weight, any, quotas)| TeamGen {
            weight,
            any,
            quotas,
        });
    (
        prop::collection::vec(cluster, 1..=3),
        prop::collection::vec(team, 2..=4),
        prop::array::uniform2(0u64..=2),
    )
        .prop_flat_map(|(clusters, teams, slack)| {
            let n = teams.len();
            let round = (
                prop::collection::vec(wl_gen(n), 0..=6),
                prop::collection::vec(0usize..64, 0..=3),
                prop::option::weighted(0.2, 0usize..64),
                prop::option::weighted(0.2, 0usize..64),
            )
                .prop_map(|(submits, finish, requeue, cancel)| Round {
                    submits,
                    finish,
                    requeue,
                    cancel,
                });
            (
                Just(clusters),
                Just(teams),
                Just(slack),
                prop::collection::vec(round, 3..=6),
            )
        })
        .prop_map(|(clusters, teams, slack, rounds)| Case {
            clusters,
            teams,
            slack,
            rounds,
        })
}

fn inventory(case: &Case) -> Inventory {
    let mut b = InventoryBuilder::new();
    for (ci, (region, nodes)) in case.clusters.iter().enumerate() {
        b = b.cluster(&format!("c{ci}"), REGIONS[*region]);
        for (ni, (model, count)) in nodes.iter().enumerate() {
            b = b.node(&format!("node-{ni}"), MODELS[*model], *count);
        }
    }
    b.build()
}

/// Guarantees per model split the model's capacity by share (with slack
/// shares nobody gets), so they sum to at most the capacity; limits are the
/// guarantee plus a random number of GPUs.
fn policy(case: &Case, inv: &Inventory, cross: CrossTeamPreemption) -> Arc<axle_policy::Policy> {
    let mut capacity = [0u64; 2];
    for c in &inv.clusters {
        for n in &c.nodes {
            let m = MODELS.iter().position(|m| *m == n.gpu_model).unwrap();
            capacity[m] += u64::from(n.gpu_count) * MILLI_PER_GPU;
        }
    }
    let mut b = PolicyBuilder::new().cross_team(cross);
    for (ti, t) in case.teams.iter().enumerate() {
        let mut per_model = Vec::new();
        for m in 0..2 {
            let (has, share, extra) = t.quotas[m];
            // A team without any quota gets one on the last model.
            if !(has || m == 1 && per_model.is_empty()) {
                continue;
            }
            let total: u64 = case
                .teams
                .iter()
                .filter(|t| t.quotas[m].0)
                .map(|t| t.quotas[m].1)
                .sum::<u64>()
                + case.slack[m]
                + u64::from(!has) * share;
            let g = (capacity[m] * share).checked_div(total).unwrap_or(0) / 250 * 250;
            per_model.push((
                MODELS[m].to_string(),
                Milli(g),
                Milli(g + extra * MILLI_PER_GPU),
            ));
        }
        let quotas = if t.any {
            let g = per_model.iter().map(|q| q.1.0).sum();
            let l = per_model.iter().map(|q| q.2.0).sum();
            vec![("any".to_string(), Milli(g), Milli(l))]
        } else {
            per_model
        };
        b = b.team_milli(&format!("t{ti}"), f64::from(t.weight), &quotas);
    }
    b.build()
}

fn spec(id: u64, g: &WlGen, now_ms: u64) -> WorkloadSpec {
    let mut s = wl(id, &format!("t{}", g.team), STANDARD_CLASSES[g.class]).submit(now_ms);
    s = match g.shape {
        Shape::Frac(m) => s.milli(Milli(m)),
        Shape::Whole(n) => s.milli(Milli::gpus(n)),
        Shape::Gang(r, m) => s.milli(Milli(m)).replicas(r),
        Shape::Spread(n) => s.milli(Milli::gpus(n)).spread(),
    };
    if let Some(m) = g.model {
        s = s.model(MODELS[m]);
    }
    if let Some(r) = g.region {
        s = s.region(REGIONS[r]);
    }
    s
}

/// Every check a single cycle must pass, on the state it ran on.
fn check_cycle(inv: &Inventory, pre: &State, now_ms: u64, d: &Decisions) -> Result<(), String> {
    check_deterministic(pre, now_ms, d)?;
    check_decisions(inv, pre, d)?;
    check_no_missed_room(inv, pre, d)?;
    // With explain on, every workload left waiting has exactly one reason.
    let placed: BTreeSet<u64> = d.placements.iter().map(|p| p.workload).collect();
    let mut explained = BTreeSet::new();
    for (id, _) in &d.pending {
        if placed.contains(id) || !explained.insert(*id) {
            return Err(format!("workload {id}: placed and pending, or two reasons"));
        }
    }
    for s in pre.pending_specs() {
        if !placed.contains(&s.id) && !explained.contains(&s.id) {
            return Err(format!("workload {} left pending without a reason", s.id));
        }
    }
    Ok(())
}

/// Runs `case` under both cross-team preemption settings.
fn run_case(case: &Case) -> Result<(u64, u64), String> {
    let mut totals = (0, 0);
    for cross in CrossTeamPreemption::ALL {
        let (p, e) = run_case_with(case, cross).map_err(|e| format!("{}: {e}", cross.as_str()))?;
        totals.0 += p;
        totals.1 += e;
    }
    Ok(totals)
}

fn run_case_with(case: &Case, cross: CrossTeamPreemption) -> Result<(u64, u64), String> {
    let inv = inventory(case);
    let policy = policy(case, &inv, cross);
    let mut state = State::new(policy, &inv);
    let mut next_id = 1;
    let (mut placed, mut preempted) = (0, 0);
    for (round, r) in case.rounds.iter().enumerate() {
        let now_ms = (round as u64 + 1) * 1000;
        for g in &r.submits {
            // Requests the policy refuses (no quota, above limit, never fits)
            // are rejected at submit and never reach a cycle.
            let _ = state.submit(spec(next_id, g, now_ms));
            next_id += 1;
        }
        let d = cycle(&state, now_ms, &CycleOptions::default());
        check_cycle(&inv, &state, now_ms, &d).map_err(|e| format!("round {round}: {e}\n{d:#?}"))?;
        placed += d.placements.len() as u64;
        preempted += d.preemptions.len() as u64;
        let before = state.clone();
        state
            .apply(&d, now_ms)
            .map_err(|e| format!("round {round}: apply failed: {e}"))?;
        check_state(&inv, &state).map_err(|e| format!("round {round} after apply: {e}"))?;
        for p in &d.placements {
            let run = state
                .running_workload(p.workload)
                .ok_or("placed workload not running")?;
            if run.allocation != p.allocation || run.start_time_ms != now_ms {
                return Err(format!(
                    "workload {} runs elsewhere than placed",
                    p.workload
                ));
            }
        }
        for e in &d.preemptions {
            let old = before.running_workload(e.workload).unwrap();
            let back = state.pending_spec(e.workload).ok_or(format!(
                "preempted workload {} was not requeued",
                e.workload
            ))?;
            if back.submit_time_ms != old.spec.submit_time_ms {
                return Err(format!(
                    "preempted workload {} lost its submit time",
                    e.workload
                ));
            }
        }
        // Between cycles: some workloads finish, one is requeued, one cancelled.
        let running: Vec<u64> = state.running().map(|r| r.spec.id).collect();
        if !running.is_empty() {
            for &i in &r.finish {
                state.remove(running[i % running.len()]);
            }
            if let Some(i) = r.requeue {
                state.requeue(running[i % running.len()]);
            }
        }
        let pending: Vec<u64> = state.pending_specs().map(|s| s.id).collect();
        if let (Some(i), false) = (r.cancel, pending.is_empty()) {
            state.remove(pending[i % pending.len()]);
        }
        check_state(&inv, &state).map_err(|e| format!("round {round} after finishing: {e}"))?;
    }
    Ok((placed, preempted))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Invariants 1–3 and determinism hold after every cycle of random runs.
    #[test]
    fn invariants_hold_over_random_runs(case in case()) {
        run_case(&case).map_err(TestCaseError::fail)?;
    }
}

/// The random runs are not vacuous: over a fixed set of seeds they place
/// work and preempt (by priority and by reclaim).
#[test]
fn random_runs_exercise_placement_and_preemption() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let (mut placed, mut preempted) = (0, 0);
    for _ in 0..64 {
        let case = case().new_tree(&mut runner).unwrap().current();
        let (p, e) = run_case(&case).unwrap();
        placed += p;
        preempted += e;
    }
    assert!(placed > 200, "only {placed} placements");
    assert!(preempted > 5, "only {preempted} preemptions");
}

// ------------------------------------------------- the checkers can fail

fn small() -> (Inventory, State) {
    let inv = InventoryBuilder::new()
        .cluster("eu-1", "eu")
        .node("node-0", "H100", 2)
        .build();
    let policy = PolicyBuilder::new()
        .team("a", &[("H100", 1.0, 2.0)])
        .team("b", &[("H100", 1.0, 2.0)])
        .build();
    (inv.clone(), State::new(policy, &inv))
}

#[test]
fn checker_catches_double_booking() {
    let (inv, mut s) = small();
    s.submit(wl(1, "a", TRAINING)).unwrap();
    s.submit(wl(2, "b", TRAINING)).unwrap();
    let d = cycle(&s, 0, &CycleOptions::default());
    assert!(check_decisions(&inv, &s, &d).is_ok());
    let mut bad = d.clone();
    bad.placements[1].allocation = bad.placements[0].allocation.clone();
    let err = check_decisions(&inv, &s, &bad).unwrap_err();
    assert!(err.contains("over-committed"), "{err}");
    let mut bad = d.clone();
    bad.placements.push(bad.placements[0].clone());
    assert!(
        check_decisions(&inv, &s, &bad)
            .unwrap_err()
            .contains("twice")
    );
}

#[test]
fn checker_catches_preempted_production_and_bad_reclaim() {
    let (inv, mut s) = small();
    let prod = Arc::new(wl(1, "b", PRODUCTION));
    s.start(prod, allocation(0, Milli::gpus(1), &[(0, &[0])]), 0)
        .unwrap();
    let dev = Arc::new(wl(2, "b", DEVELOPMENT));
    s.start(dev, allocation(0, Milli::gpus(1), &[(0, &[1])]), 0)
        .unwrap();
    s.submit(wl(3, "a", DEVELOPMENT)).unwrap();
    let place = |victim| Decisions {
        placements: vec![Placement {
            workload: 3,
            allocation: allocation(0, Milli::gpus(1), &[(0, &[victim as u32 - 1])]),
            after_preempting: vec![victim],
        }],
        preemptions: vec![Preemption {
            workload: victim,
            for_workload: 3,
            reason: PreemptReason::QuotaReclaim {
                victim_team: "b".into(),
                preemptor_team: "a".into(),
                gpu_class: "H100".into(),
                guaranteed: Milli::gpus(1),
            },
            grace_period_s: 30,
            lost_gpu_ms: 0,
        }],
        ..Decisions::default()
    };
    let err = check_decisions(&inv, &s, &place(1)).unwrap_err();
    assert!(err.contains("unpreemptible"), "{err}");
    // b runs 2 with a guarantee of 1: taking one leaves it at its guarantee.
    assert!(check_decisions(&inv, &s, &place(2)).is_ok());
    // What the scheduler really does here.
    let d = cycle(&s, 0, &CycleOptions::default());
    assert_eq!(d, place(2));
    // Leaving it pending is a missed reclaim.
    let err = check_no_missed_room(&inv, &s, &Decisions::default()).unwrap_err();
    assert!(err.contains("left pending"), "{err}");
}

#[test]
fn checker_catches_reclaim_below_the_victims_guarantee() {
    let (inv, mut s) = small();
    let b1 = Arc::new(wl(1, "b", TRAINING));
    s.start(b1, allocation(0, Milli::gpus(1), &[(0, &[0])]), 0)
        .unwrap();
    s.submit(wl(2, "a", TRAINING)).unwrap();
    // b is at its guarantee: nothing to reclaim, and GPU 1 is free.
    let d = cycle(&s, 0, &CycleOptions::default());
    assert!(d.preemptions.is_empty());
    let bad = Decisions {
        placements: vec![Placement {
            workload: 2,
            allocation: allocation(0, Milli::gpus(1), &[(0, &[0])]),
            after_preempting: vec![1],
        }],
        preemptions: vec![Preemption {
            workload: 1,
            for_workload: 2,
            reason: PreemptReason::QuotaReclaim {
                victim_team: "b".into(),
                preemptor_team: "a".into(),
                gpu_class: "H100".into(),
                guaranteed: Milli::gpus(1),
            },
            grace_period_s: 30,
            lost_gpu_ms: 0,
        }],
        ..Decisions::default()
    };
    let err = check_decisions(&inv, &s, &bad).unwrap_err();
    assert!(err.contains("below its guarantee"), "{err}");
}

#[test]
fn checker_catches_freed_gpus_used_without_waiting() {
    let (inv, mut s) = small();
    let dev = Arc::new(wl(1, "b", DEVELOPMENT));
    s.start(dev, allocation(0, Milli::gpus(1), &[(0, &[0])]), 0)
        .unwrap();
    let other = Arc::new(wl(2, "b", TRAINING));
    s.start(other, allocation(0, Milli::gpus(1), &[(0, &[1])]), 0)
        .unwrap();
    s.submit(wl(3, "a", TRAINING).gpus(0.5)).unwrap();
    s.submit(wl(4, "a", TRAINING).gpus(0.25)).unwrap();
    let d = cycle(&s, 0, &CycleOptions::default());
    check_decisions(&inv, &s, &d).unwrap();
    assert!(
        d.placements
            .iter()
            .any(|p| p.workload == 3 && p.after_preempting == [1])
    );
    // Workload 1 keeps GPU 0 through its grace period: the half that workload
    // 3 leaves is not free for workload 4 in this cycle.
    assert!(d.placements.iter().all(|p| p.workload != 4), "{d:#?}");
    let mut bad = d.clone();
    bad.placements.push(Placement {
        workload: 4,
        allocation: allocation(0, Milli(250), &[(0, &[0])]),
        after_preempting: vec![],
    });
    let err = check_decisions(&inv, &s, &bad).unwrap_err();
    assert!(err.contains("over-committed"), "{err}");
}
