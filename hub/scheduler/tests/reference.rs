//! The fast scheduler against a naive reference: on tiny clusters with
//! nothing running and no binding quota, brute force enumerates every way to
//! place the pending workloads and says which fit; the cycle must agree on
//! feasibility and leave nothing pending that still fits.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use axle_policy::{MILLI_PER_GPU, Milli};
use axle_scheduler::{CycleOptions, Inventory, State, WorkloadSpec, cycle};
use common::*;
use proptest::prelude::*;

const MODELS: [&str; 2] = ["A100", "H100"];

/// Free milli per GPU: `free[cluster][node][gpu]`.
type Free = Vec<Vec<Vec<u64>>>;

fn free_of(inv: &Inventory, s: &State) -> Free {
    inv.clusters
        .iter()
        .enumerate()
        .map(|(ci, c)| {
            (0..c.nodes.len())
                .map(|ni| {
                    s.node_allocated(ci as u32, ni as u32)
                        .iter()
                        .map(|m| MILLI_PER_GPU - m.0)
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Every free array that results from placing all replicas of `spec`
/// (one cluster, one model, each non-spread replica on one node).
fn placements(inv: &Inventory, free: &Free, spec: &WorkloadSpec) -> BTreeSet<Free> {
    let mut out = BTreeSet::new();
    for (ci, c) in inv.clusters.iter().enumerate() {
        if !c.schedulable {
            continue;
        }
        for m in MODELS {
            if spec.gpu_model.as_ref().is_some_and(|want| want != m) {
                continue;
            }
            let mut states = BTreeSet::from([free.clone()]);
            for _ in 0..spec.replicas {
                let mut next = BTreeSet::new();
                for f in &states {
                    place_replica(inv, f, ci, m, spec, &mut next);
                }
                states = next;
            }
            out.extend(states);
        }
    }
    out
}

fn place_replica(
    inv: &Inventory,
    f: &Free,
    ci: usize,
    model: &str,
    spec: &WorkloadSpec,
    out: &mut BTreeSet<Free>,
) {
    let nodes: Vec<usize> = (0..inv.clusters[ci].nodes.len())
        .filter(|&n| inv.clusters[ci].nodes[n].gpu_model == model)
        .collect();
    let g = spec.gpus_per_replica.0;
    if g < MILLI_PER_GPU {
        for &n in &nodes {
            for x in 0..f[ci][n].len() {
                if f[ci][n][x] >= g {
                    let mut next = f.clone();
                    next[ci][n][x] -= g;
                    out.insert(next);
                }
            }
        }
        return;
    }
    let k = (g / MILLI_PER_GPU) as usize;
    let full = |n: usize| -> Vec<usize> {
        (0..f[ci][n].len())
            .filter(|&x| f[ci][n][x] == MILLI_PER_GPU)
            .collect()
    };
    if !spec.allow_spread {
        for &n in &nodes {
            let fl = full(n);
            if fl.len() >= k {
                let mut next = f.clone();
                for &x in &fl[..k] {
                    next[ci][n][x] = 0;
                }
                out.insert(next);
            }
        }
        return;
    }
    // Spread: any split of k full GPUs over the nodes.
    fn split(
        f: &Free,
        ci: usize,
        nodes: &[usize],
        i: usize,
        left: usize,
        acc: &mut Free,
        out: &mut BTreeSet<Free>,
    ) {
        if left == 0 {
            out.insert(acc.clone());
            return;
        }
        if i == nodes.len() {
            return;
        }
        let n = nodes[i];
        let fl: Vec<usize> = (0..f[ci][n].len())
            .filter(|&x| f[ci][n][x] == MILLI_PER_GPU)
            .collect();
        for take in 0..=fl.len().min(left) {
            let saved = acc[ci][n].clone();
            for &x in &fl[..take] {
                acc[ci][n][x] = 0;
            }
            split(f, ci, nodes, i + 1, left - take, acc, out);
            acc[ci][n] = saved;
        }
    }
    let mut acc = f.clone();
    split(f, ci, &nodes, 0, k, &mut acc, out);
}

/// Most workloads of `specs[i..]` that can be placed together on `free`.
fn max_placeable(
    inv: &Inventory,
    free: &Free,
    specs: &[WorkloadSpec],
    i: usize,
    memo: &mut BTreeMap<(usize, Free), usize>,
) -> usize {
    if i == specs.len() {
        return 0;
    }
    if let Some(&v) = memo.get(&(i, free.clone())) {
        return v;
    }
    let mut best = max_placeable(inv, free, specs, i + 1, memo);
    for next in placements(inv, free, &specs[i]) {
        best = best.max(1 + max_placeable(inv, &next, specs, i + 1, memo));
    }
    memo.insert((i, free.clone()), best);
    best
}

#[derive(Debug, Clone)]
struct Tiny {
    /// Per node: (cluster 0 or 1, model index, GPUs).
    nodes: Vec<(usize, usize, u32)>,
    /// (team, class, milli per replica, replicas, spread, model).
    pending: Vec<(usize, usize, u64, u32, bool, Option<usize>)>,
}

fn tiny() -> impl Strategy<Value = Tiny> {
    let node = (0usize..2, 0usize..2, 1u32..=4);
    let per_replica = prop_oneof![
        Just(250u64),
        Just(500),
        Just(750),
        Just(1000),
        Just(2000),
        Just(3000),
        Just(4000)
    ];
    let w = (
        0usize..2,
        0usize..4,
        per_replica,
        prop_oneof![3 => Just(1u32), 1 => 2u32..=3],
        prop::bool::weighted(0.25),
        prop_oneof![2 => Just(None), 1 => (0usize..2).prop_map(Some)],
    );
    (
        prop::collection::vec(node, 1..=2),
        prop::collection::vec(w, 1..=4),
    )
        .prop_map(|(nodes, pending)| Tiny { nodes, pending })
}

fn build(t: &Tiny) -> (Inventory, State, Vec<WorkloadSpec>) {
    let mut b = InventoryBuilder::new();
    let mut total = 0;
    for c in 0..2 {
        let nodes: Vec<_> = t.nodes.iter().filter(|n| n.0 == c).collect();
        if nodes.is_empty() {
            continue;
        }
        b = b.cluster(&format!("c{c}"), "eu");
        for (i, n) in nodes.iter().enumerate() {
            b = b.node(&format!("node-{i}"), MODELS[n.1], n.2);
            total += u64::from(n.2);
        }
    }
    let inv = b.build();
    // Limits equal the capacity: no quota ever binds.
    let cap = Milli::gpus(total);
    let policy = PolicyBuilder::new()
        .team_milli("t0", 1.0, &[("any".into(), Milli::ZERO, cap)])
        .team_milli("t1", 1.0, &[("any".into(), cap, cap)])
        .build();
    let mut state = State::new(policy, &inv);
    let mut specs = Vec::new();
    for (i, &(team, class, milli, replicas, spread, model)) in t.pending.iter().enumerate() {
        let mut s = wl(i as u64 + 1, &format!("t{team}"), STANDARD_CLASSES[class])
            .milli(Milli(milli))
            .replicas(replicas);
        s.allow_spread = spread;
        if let Some(m) = model {
            s = s.model(MODELS[m]);
        }
        // Shapes the policy refuses outright never reach a cycle.
        if state.submit(s.clone()).is_ok() {
            specs.push(s);
        }
    }
    (inv, state, specs)
}

fn agree(t: &Tiny) -> Result<(), String> {
    let (inv, state, specs) = build(t);
    let d = cycle(&state, 0, &CycleOptions::default());
    check_decisions(&inv, &state, &d)?;
    if !d.preemptions.is_empty() {
        return Err("preemption with nothing running".into());
    }
    let free = free_of(&inv, &state);
    let best = max_placeable(&inv, &free, &specs, 0, &mut BTreeMap::new());
    let placed = d.placements.len();
    if placed > best {
        return Err(format!("placed {placed}, but at most {best} fit together"));
    }
    if best > 0 && placed == 0 {
        return Err(format!("placed nothing, but {best} fit"));
    }
    if specs.len() == 1 && (best == 1) != (placed == 1) {
        return Err(format!(
            "a lone workload: brute force fits={}, scheduler placed={placed}",
            best == 1
        ));
    }
    // Nothing left pending still fits in what the cycle left free.
    let mut after = state.clone();
    after.apply(&d, 0).map_err(|e| e.to_string())?;
    let left = free_of(&inv, &after);
    for s in &specs {
        if after.pending_spec(s.id).is_some() && !placements(&inv, &left, s).is_empty() {
            let reason = d
                .pending
                .iter()
                .find(|(id, _)| *id == s.id)
                .map(|(_, r)| r.to_string());
            return Err(format!(
                "workload {} ({}×{}, spread {}) left pending though it fits in what is free: {reason:?}",
                s.id, s.replicas, s.gpus_per_replica, s.allow_spread
            ));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn scheduler_agrees_with_brute_force(t in tiny()) {
        agree(&t).map_err(TestCaseError::fail)?;
    }
}

/// The brute force itself: two half GPUs and a whole one fit on two GPUs, a
/// gang of three does not fit two nodes of one GPU in different clusters.
#[test]
fn brute_force_counts() {
    let t = Tiny {
        nodes: vec![(0, 1, 2)],
        pending: vec![
            (0, 2, 500, 1, false, None),
            (0, 2, 500, 1, false, None),
            (0, 2, 1000, 1, false, None),
        ],
    };
    let (inv, state, specs) = build(&t);
    assert_eq!(
        max_placeable(
            &inv,
            &free_of(&inv, &state),
            &specs,
            0,
            &mut BTreeMap::new()
        ),
        3
    );
    let t = Tiny {
        nodes: vec![(0, 1, 2), (1, 1, 2)],
        pending: vec![(0, 1, 1000, 3, false, None)],
    };
    let (inv, state, specs) = build(&t);
    assert_eq!(
        max_placeable(
            &inv,
            &free_of(&inv, &state),
            &specs,
            0,
            &mut BTreeMap::new()
        ),
        0
    );
    agree(&t).unwrap();
}
