//! Data-driven scheduler scenarios: every `testdata/scenarios/*.yaml` file
//! declares a policy, an inventory, running and pending workloads and what
//! one cycle must decide; the runner checks the decisions (and the invariant
//! checkers) and names the file on failure.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axle_policy::{CrossTeamPreemption, MILLI_PER_GPU, Milli, Policy, PriorityClass};
use axle_scheduler::{
    Allocation, CycleOptions, Decisions, Inventory, PreemptReason, Shard, State, WorkloadId,
    WorkloadSpec, cycle,
};
use common::*;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    description: String,
    /// Priority classes; absent: the four standard ones.
    #[serde(default)]
    classes: Option<Vec<ClassDef>>,
    #[serde(default)]
    fraction_granularity: Option<f64>,
    /// `borrowedOnly` (the default) or `any`.
    #[serde(default)]
    cross_team_preemption: Option<String>,
    teams: Vec<TeamDef>,
    clusters: Vec<ClusterDef>,
    #[serde(default)]
    running: Vec<WorkloadDef>,
    #[serde(default)]
    pending: Vec<WorkloadDef>,
    now_ms: u64,
    expect: Expect,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassDef {
    name: String,
    value: i32,
    #[serde(default)]
    preemptible_by: Vec<String>,
    #[serde(default = "thirty")]
    grace_period_s: u64,
    #[serde(default)]
    idle_only: bool,
    #[serde(default)]
    checkpointable: bool,
    #[serde(default)]
    checkpoint_interval_s: Option<u64>,
}

fn thirty() -> u64 {
    30
}
fn one() -> f64 {
    1.0
}
fn one_u32() -> u32 {
    1
}
fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TeamDef {
    name: String,
    #[serde(default = "one")]
    weight: f64,
    /// GPU class → guaranteed and limit, in GPUs.
    quotas: BTreeMap<String, QuotaDef>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaDef {
    guaranteed: f64,
    limit: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterDef {
    name: String,
    region: String,
    #[serde(default = "yes")]
    schedulable: bool,
    /// Runs container images and has no default image.
    #[serde(default)]
    needs_image: bool,
    nodes: Vec<NodeDef>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeDef {
    name: String,
    model: String,
    gpus: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadDef {
    name: String,
    team: String,
    class: String,
    /// GPUs per replica.
    gpus: f64,
    #[serde(default = "one_u32")]
    replicas: u32,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    regions: Vec<String>,
    #[serde(default)]
    spread: bool,
    #[serde(default)]
    submit_ms: u64,
    /// Checkpoints every this many seconds (overrides the class).
    #[serde(default)]
    checkpoint_interval_s: Option<u64>,
    #[serde(default)]
    max_runtime_s: Option<u64>,
    /// Names a container image.
    #[serde(default)]
    image: bool,
    /// Running workloads: when they started, and where.
    #[serde(default)]
    start_ms: u64,
    #[serde(default)]
    cluster: Option<String>,
    /// One entry per replica: a node and the GPU indices the replica holds
    /// (a fraction holds that fraction of its one GPU).
    #[serde(default)]
    at: Vec<ReplicaAt>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplicaAt {
    node: String,
    gpus: Vec<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    /// Exactly these workloads are placed.
    #[serde(default)]
    placements: Vec<ExpPlacement>,
    /// Placement order, where it matters (fair share).
    #[serde(default)]
    placement_order: Option<Vec<String>>,
    /// Exactly these workloads are preempted.
    #[serde(default)]
    preemptions: Vec<ExpPreemption>,
    /// Substrings of the pending reason of these workloads.
    #[serde(default)]
    pending: Vec<ExpPending>,
    /// Pending workloads that are refused at submit.
    #[serde(default)]
    submit_errors: Vec<ExpSubmitError>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpPlacement {
    workload: String,
    cluster: String,
    /// Every shard is on this node.
    #[serde(default)]
    node: Option<String>,
    /// Exactly these GPU indices (of `node`) are used.
    #[serde(default)]
    gpus: Option<Vec<u32>>,
    /// Per replica, the one node it is on.
    #[serde(default)]
    replica_nodes: Option<Vec<String>>,
    /// The placement waits for exactly these victims.
    #[serde(default)]
    after_preempting: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpPreemption {
    victim: String,
    #[serde(rename = "for")]
    for_workload: String,
    /// `priority` or `quota_reclaim`.
    reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpPending {
    workload: String,
    reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpSubmitError {
    workload: String,
    error: String,
}

struct Built {
    inv: Inventory,
    state: State,
    ids: BTreeMap<String, WorkloadId>,
    names: BTreeMap<WorkloadId, String>,
}

fn policy_of(sc: &Scenario) -> Result<Arc<Policy>, String> {
    let mut b = PolicyBuilder::new();
    if let Some(classes) = &sc.classes {
        let map: BTreeMap<String, PriorityClass> = classes
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    PriorityClass {
                        name: c.name.clone(),
                        value: c.value,
                        preemptible_by: c.preemptible_by.clone(),
                        grace_period_s: c.grace_period_s,
                        idle_only: c.idle_only,
                        burst_allowed: !c.idle_only,
                        checkpointable: c.checkpointable,
                        checkpoint_interval_s: c
                            .checkpoint_interval_s
                            .unwrap_or(axle_policy::DEFAULT_CHECKPOINT_INTERVAL_S),
                        checkpoint_signal: "SIGTERM".to_string(),
                        placement: axle_policy::GangPlacement::Packed,
                        min_runtime_s: 0,
                        tolerable_wait_s: 0,
                    },
                )
            })
            .collect();
        b = b.classes(map);
    }
    if let Some(g) = sc.fraction_granularity {
        b = b.fraction_granularity(gpus(g));
    }
    match sc.cross_team_preemption.as_deref() {
        None | Some("borrowedOnly") => {}
        Some("any") => b = b.cross_team(CrossTeamPreemption::Any),
        Some(other) => return Err(format!("unknown cross_team_preemption {other}")),
    }
    for t in &sc.teams {
        let quotas: Vec<(String, Milli, Milli)> = t
            .quotas
            .iter()
            .map(|(k, q)| (k.clone(), gpus(q.guaranteed), gpus(q.limit)))
            .collect();
        b = b.team_milli(&t.name, t.weight, &quotas);
    }
    Ok(b.build())
}

fn spec_of(policy: &Policy, id: WorkloadId, w: &WorkloadDef) -> WorkloadSpec {
    let mut s = wl(id, &w.team, &w.class)
        .gpus(w.gpus)
        .replicas(w.replicas)
        .submit(w.submit_ms);
    s.gpu_model = w.model.clone();
    s.regions = w.regions.clone();
    s.allow_spread = w.spread;
    s.max_runtime_s = w.max_runtime_s;
    s.has_image = w.image;
    s.checkpoint_interval_s = w.checkpoint_interval_s.or_else(|| {
        policy
            .priority_classes
            .get(&w.class)
            .filter(|c| c.checkpointable)
            .map(|c| c.checkpoint_interval_s)
    });
    s
}

fn build(sc: &Scenario) -> Result<Built, String> {
    let mut ib = InventoryBuilder::new();
    for c in &sc.clusters {
        ib = ib.cluster(&c.name, &c.region);
        if !c.schedulable {
            ib = ib.unschedulable();
        }
        if c.needs_image {
            ib = ib.needs_image();
        }
        for n in &c.nodes {
            ib = ib.node(&n.name, &n.model, n.gpus);
        }
    }
    let inv = ib.build();
    let policy = policy_of(sc)?;
    let mut state = State::new(policy.clone(), &inv);
    let mut ids = BTreeMap::new();
    let mut names = BTreeMap::new();
    for (i, w) in sc.running.iter().chain(&sc.pending).enumerate() {
        let id = i as WorkloadId + 1;
        if ids.insert(w.name.clone(), id).is_some() {
            return Err(format!("workload name {} used twice", w.name));
        }
        names.insert(id, w.name.clone());
    }
    for w in &sc.running {
        let spec = spec_of(&policy, ids[&w.name], w);
        let cname = w
            .cluster
            .as_ref()
            .ok_or(format!("running {} needs a cluster", w.name))?;
        let ci = inv
            .clusters
            .iter()
            .position(|c| c.name == *cname)
            .ok_or(format!("unknown cluster {cname}"))?;
        let share = Milli(spec.gpus_per_replica.0.min(MILLI_PER_GPU));
        let replicas =
            w.at.iter()
                .map(|r| {
                    let ni = inv.clusters[ci]
                        .nodes
                        .iter()
                        .position(|n| n.name == r.node)
                        .ok_or(format!("unknown node {} in {cname}", r.node))?;
                    Ok(r.gpus
                        .iter()
                        .map(|&gpu| Shard {
                            node: ni as u32,
                            gpu,
                            milli: share,
                        })
                        .collect())
                })
                .collect::<Result<Vec<Vec<Shard>>, String>>()?;
        let alloc = Allocation {
            cluster: ci as u32,
            replicas,
        };
        state
            .start(Arc::new(spec), alloc, w.start_ms)
            .map_err(|e| format!("running {}: {e}", w.name))?;
    }
    let refused: BTreeMap<&str, &str> = sc
        .expect
        .submit_errors
        .iter()
        .map(|e| (e.workload.as_str(), e.error.as_str()))
        .collect();
    for w in &sc.pending {
        let res = state.submit(spec_of(&policy, ids[&w.name], w));
        match (res, refused.get(w.name.as_str())) {
            (Ok(()), None) => {}
            (Err(e), Some(want)) if e.to_string().contains(want) => {}
            (Err(e), Some(want)) => {
                return Err(format!("submit {}: error {e:?} lacks {want:?}", w.name));
            }
            (Err(e), None) => return Err(format!("submit {}: {e}", w.name)),
            (Ok(()), Some(_)) => {
                return Err(format!("submit {} was accepted, expected an error", w.name));
            }
        }
    }
    Ok(Built {
        inv,
        state,
        ids,
        names,
    })
}

fn name(b: &Built, id: WorkloadId) -> String {
    b.names
        .get(&id)
        .cloned()
        .unwrap_or_else(|| format!("#{id}"))
}

fn describe(b: &Built, d: &Decisions) -> String {
    let mut out = String::new();
    for p in &d.placements {
        let c = &b.inv.clusters[p.allocation.cluster as usize];
        let shards: Vec<String> = p
            .allocation
            .replicas
            .iter()
            .map(|r| {
                r.iter()
                    .map(|s| format!("{}:{}={}", c.nodes[s.node as usize].name, s.gpu, s.milli))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        let after: Vec<String> = p.after_preempting.iter().map(|v| name(b, *v)).collect();
        out += &format!(
            "  place {} on {} [{}] after {after:?}\n",
            name(b, p.workload),
            c.name,
            shards.join(" | ")
        );
    }
    for e in &d.preemptions {
        out += &format!(
            "  preempt {} for {}: {}\n",
            name(b, e.workload),
            name(b, e.for_workload),
            e.reason
        );
    }
    for (id, r) in &d.pending {
        out += &format!("  pending {}: {r}\n", name(b, *id));
    }
    out
}

fn check(sc: &Scenario, b: &Built, d: &Decisions) -> Result<(), String> {
    let e = &sc.expect;
    let id = |n: &str| {
        b.ids
            .get(n)
            .copied()
            .ok_or(format!("expect names unknown workload {n}"))
    };
    // Placements: exactly the expected set, each where expected.
    let got: BTreeSet<String> = d.placements.iter().map(|p| name(b, p.workload)).collect();
    let want: BTreeSet<String> = e.placements.iter().map(|p| p.workload.clone()).collect();
    if got != want {
        return Err(format!("placed {got:?}, expected {want:?}"));
    }
    for ep in &e.placements {
        let wid = id(&ep.workload)?;
        let p = d.placements.iter().find(|p| p.workload == wid).unwrap();
        let c = &b.inv.clusters[p.allocation.cluster as usize];
        if c.name != ep.cluster {
            return Err(format!(
                "{} placed in {}, expected {}",
                ep.workload, c.name, ep.cluster
            ));
        }
        let node_of = |s: &Shard| c.nodes[s.node as usize].name.clone();
        if let Some(n) = &ep.node {
            let nodes: BTreeSet<String> = p.allocation.shards().map(node_of).collect();
            if nodes != BTreeSet::from([n.clone()]) {
                return Err(format!(
                    "{} placed on {nodes:?}, expected only {n}",
                    ep.workload
                ));
            }
        }
        if let Some(g) = &ep.gpus {
            let mut have: Vec<u32> = p.allocation.shards().map(|s| s.gpu).collect();
            have.sort_unstable();
            let mut want = g.clone();
            want.sort_unstable();
            if have != want {
                return Err(format!(
                    "{} placed on GPUs {have:?}, expected {want:?}",
                    ep.workload
                ));
            }
        }
        if let Some(rn) = &ep.replica_nodes {
            let have: Vec<BTreeSet<String>> = p
                .allocation
                .replicas
                .iter()
                .map(|r| r.iter().map(node_of).collect())
                .collect();
            let want: Vec<BTreeSet<String>> =
                rn.iter().map(|n| BTreeSet::from([n.clone()])).collect();
            if have != want {
                return Err(format!(
                    "{} replicas on {have:?}, expected {want:?}",
                    ep.workload
                ));
            }
        }
        if let Some(after) = &ep.after_preempting {
            let have: BTreeSet<String> = p.after_preempting.iter().map(|v| name(b, *v)).collect();
            let want: BTreeSet<String> = after.iter().cloned().collect();
            if have != want {
                return Err(format!(
                    "{} waits for {have:?}, expected {want:?}",
                    ep.workload
                ));
            }
        }
    }
    if let Some(order) = &e.placement_order {
        let have: Vec<String> = d.placements.iter().map(|p| name(b, p.workload)).collect();
        if have != *order {
            return Err(format!("placement order {have:?}, expected {order:?}"));
        }
    }
    // Preemptions: exactly the expected ones.
    let mut got: Vec<(String, String, String)> = d
        .preemptions
        .iter()
        .map(|p| {
            let kind = match p.reason {
                PreemptReason::Priority { .. } => "priority",
                PreemptReason::QuotaReclaim { .. } => "quota_reclaim",
            };
            (
                name(b, p.workload),
                name(b, p.for_workload),
                kind.to_string(),
            )
        })
        .collect();
    let mut want: Vec<(String, String, String)> = e
        .preemptions
        .iter()
        .map(|p| (p.victim.clone(), p.for_workload.clone(), p.reason.clone()))
        .collect();
    got.sort();
    want.sort();
    if got != want {
        return Err(format!(
            "preemptions (victim, for, reason) {got:?}, expected {want:?}"
        ));
    }
    for ep in &e.pending {
        let wid = id(&ep.workload)?;
        let reason = d
            .pending
            .iter()
            .find(|(i, _)| *i == wid)
            .map(|(_, r)| r.to_string())
            .ok_or(format!("{} has no pending reason", ep.workload))?;
        if !reason.contains(&ep.reason) {
            return Err(format!(
                "{} pending reason {reason:?} lacks {:?}",
                ep.workload, ep.reason
            ));
        }
    }
    Ok(())
}

fn run_file(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let sc: Scenario = serde_saphyr::from_str(&text).map_err(|e| format!("parse: {e}"))?;
    if sc.description.trim().is_empty() {
        return Err("empty description".into());
    }
    let mut b = build(&sc)?;
    let d = cycle(&b.state, sc.now_ms, &CycleOptions::default());
    let ctx = |e: String| format!("{e}\ndecisions:\n{}", describe(&b, &d));
    check(&sc, &b, &d).map_err(ctx)?;
    check_deterministic(&b.state, sc.now_ms, &d).map_err(ctx)?;
    check_decisions(&b.inv, &b.state, &d).map_err(ctx)?;
    check_no_missed_room(&b.inv, &b.state, &d).map_err(ctx)?;
    b.state
        .apply(&d, sc.now_ms)
        .map_err(|e| format!("apply: {e}"))?;
    check_state(&b.inv, &b.state)?;
    Ok(())
}

fn scenario_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn scenarios() {
    let files = scenario_files();
    assert!(files.len() >= 20, "only {} scenario files", files.len());
    let mut failures = Vec::new();
    for f in &files {
        if let Err(e) = run_file(f) {
            failures.push(format!("{}: {e}", f.file_name().unwrap().to_string_lossy()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n\n")
    );
}

/// The test builders' standard classes are the policy crate's defaults.
#[test]
fn standard_classes_match_policy_defaults() {
    assert_eq!(standard_classes(), axle_policy::default_priority_classes());
}
