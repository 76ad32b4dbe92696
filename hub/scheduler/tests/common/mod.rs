//! Shared test code for the scheduler's integration tests: builders for
//! policies, inventories and workloads, and the invariant checkers that the
//! property, scenario and reference tests all run on every cycle.
// Each integration test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axle_policy::{
    CrossTeamPreemption, MILLI_PER_GPU, Milli, Policy, PriorityClass, Quota, Settings, Team,
    TeamBurst,
};
use axle_scheduler::{
    Allocation, ClusterInventory, Decisions, Inventory, NodeInventory, PreemptReason, Shard, State,
    WorkloadId, WorkloadSpec,
};

pub const PRODUCTION: &str = "production";
pub const TRAINING: &str = "training";
pub const DEVELOPMENT: &str = "development";
pub const BATCH: &str = "batch";
/// The standard classes, highest priority first.
pub const STANDARD_CLASSES: [&str; 4] = [PRODUCTION, TRAINING, DEVELOPMENT, BATCH];

/// GPUs as people write them (0.25, 1, 8) to exact milli-GPUs.
pub fn gpus(x: f64) -> Milli {
    Milli::from_gpus_f64(x).unwrap_or_else(|| panic!("bad GPU amount {x}"))
}

// ---------------------------------------------------------------- policies

pub fn class(
    name: &str,
    value: i32,
    preemptible_by: &[&str],
    idle_only: bool,
) -> (String, PriorityClass) {
    (
        name.to_string(),
        PriorityClass {
            name: name.to_string(),
            value,
            preemptible_by: preemptible_by.iter().map(|s| s.to_string()).collect(),
            grace_period_s: 30,
            idle_only,
            burst_allowed: !idle_only,
            checkpointable: false,
            checkpoint_interval_s: axle_policy::DEFAULT_CHECKPOINT_INTERVAL_S,
            checkpoint_signal: "SIGTERM".to_string(),
            placement: axle_policy::GangPlacement::Packed,
            min_runtime_s: 0,
            tolerable_wait_s: 0,
        },
    )
}

/// production 1000 (never preempted) > training 100 (by production) >
/// development 10 (by training, production) > batch 0 (by all; idle only).
pub fn standard_classes() -> BTreeMap<String, PriorityClass> {
    BTreeMap::from([
        class(PRODUCTION, 1000, &[], false),
        class(TRAINING, 100, &[PRODUCTION], false),
        class(DEVELOPMENT, 10, &[TRAINING, PRODUCTION], false),
        class(BATCH, 0, &[DEVELOPMENT, TRAINING, PRODUCTION], true),
    ])
}

/// Builds a validated-looking `Policy` directly (no YAML).
#[derive(Debug, Clone)]
pub struct PolicyBuilder {
    teams: BTreeMap<String, Team>,
    classes: BTreeMap<String, PriorityClass>,
    settings: Settings,
}

impl Default for PolicyBuilder {
    fn default() -> Self {
        PolicyBuilder::new()
    }
}

impl PolicyBuilder {
    /// No teams, the four standard classes, default settings.
    pub fn new() -> PolicyBuilder {
        PolicyBuilder {
            teams: BTreeMap::new(),
            classes: standard_classes(),
            settings: Settings::default(),
        }
    }

    /// A team with weight 1 and `(gpu class, guaranteed, limit)` quotas in GPUs.
    pub fn team(self, name: &str, quotas: &[(&str, f64, f64)]) -> PolicyBuilder {
        self.weighted_team(name, 1.0, quotas)
    }

    pub fn weighted_team(
        self,
        name: &str,
        weight: f64,
        quotas: &[(&str, f64, f64)],
    ) -> PolicyBuilder {
        let q: Vec<(String, Milli, Milli)> = quotas
            .iter()
            .map(|&(c, g, l)| (c.to_string(), gpus(g), gpus(l)))
            .collect();
        self.team_milli(name, weight, &q)
    }

    pub fn team_milli(
        mut self,
        name: &str,
        weight: f64,
        quotas: &[(String, Milli, Milli)],
    ) -> PolicyBuilder {
        let quotas = quotas
            .iter()
            .map(|(c, g, l)| {
                assert!(g <= l, "team {name}: guarantee above limit for {c}");
                (
                    c.clone(),
                    Quota {
                        guaranteed: *g,
                        limit: *l,
                    },
                )
            })
            .collect();
        self.teams.insert(
            name.to_string(),
            Team {
                name: name.to_string(),
                quotas,
                weight,
                members: Vec::new(),
                groups: Vec::new(),
                burst: TeamBurst::default(),
            },
        );
        self
    }

    pub fn classes(mut self, classes: BTreeMap<String, PriorityClass>) -> PolicyBuilder {
        self.classes = classes;
        self
    }

    pub fn cross_team(mut self, c: CrossTeamPreemption) -> PolicyBuilder {
        self.settings.cross_team_preemption = c;
        self
    }

    pub fn fraction_granularity(mut self, g: Milli) -> PolicyBuilder {
        self.settings.fraction_granularity = g;
        self
    }

    pub fn build(self) -> Arc<Policy> {
        Arc::new(Policy {
            revision: "test".to_string(),
            teams: self.teams,
            priority_classes: self.classes,
            clusters: BTreeMap::new(),
            burst_providers: BTreeMap::new(),
            settings: self.settings,
        })
    }
}

// ------------------------------------------------------------- inventories

#[derive(Debug, Clone, Default)]
pub struct InventoryBuilder {
    clusters: Vec<ClusterInventory>,
}

impl InventoryBuilder {
    pub fn new() -> InventoryBuilder {
        InventoryBuilder::default()
    }

    /// Starts a schedulable cluster; `node` calls add to the last one.
    pub fn cluster(mut self, name: &str, region: &str) -> InventoryBuilder {
        self.clusters.push(ClusterInventory {
            name: name.to_string(),
            region: region.to_string(),
            schedulable: true,
            needs_image: false,
            price_per_gpu_hour: axle_policy::Usd::ZERO,
            owner_team: None,
            nodes: Vec::new(),
        });
        self
    }

    /// The last cluster runs container images and has no default image.
    pub fn needs_image(mut self) -> InventoryBuilder {
        if let Some(c) = self.clusters.last_mut() {
            c.needs_image = true;
        }
        self
    }

    pub fn unschedulable(mut self) -> InventoryBuilder {
        self.clusters
            .last_mut()
            .expect("a cluster first")
            .schedulable = false;
        self
    }

    pub fn node(mut self, name: &str, model: &str, gpu_count: u32) -> InventoryBuilder {
        self.clusters
            .last_mut()
            .expect("a cluster first")
            .nodes
            .push(NodeInventory {
                name: name.to_string(),
                gpu_model: model.to_string(),
                gpu_count,
                gpu_memory_mb: 80 * 1024,
                fractions_only: false,
                whole_only: false,
                units: Vec::new(),
                topology: None,
            });
        self
    }

    pub fn build(self) -> Inventory {
        Inventory {
            clusters: self.clusters,
        }
    }
}

// --------------------------------------------------------------- workloads

/// `wl(id, team, class)`: one replica of 1 GPU, any model, any region,
/// submitted at 0; chain the setters to change it.
pub fn wl(id: WorkloadId, team: &str, class: &str) -> WorkloadSpec {
    WorkloadSpec {
        id,
        team: team.to_string(),
        priority_class: class.to_string(),
        gpus_per_replica: Milli::gpus(1),
        replicas: 1,
        gpu_model: None,
        regions: Vec::new(),
        allow_spread: false,
        burst_allowed: false,
        checkpoint_interval_s: None,
        max_runtime_s: None,
        has_image: false,
        expected_runtime: None,
        submit_time_ms: 0,
    }
}

pub trait SpecExt: Sized {
    fn gpus(self, g: f64) -> Self;
    fn milli(self, m: Milli) -> Self;
    fn replicas(self, n: u32) -> Self;
    fn model(self, m: &str) -> Self;
    fn region(self, r: &str) -> Self;
    fn spread(self) -> Self;
    fn submit(self, ms: u64) -> Self;
}

impl SpecExt for WorkloadSpec {
    fn gpus(self, g: f64) -> Self {
        self.milli(gpus(g))
    }
    fn milli(mut self, m: Milli) -> Self {
        self.gpus_per_replica = m;
        self
    }
    fn replicas(mut self, n: u32) -> Self {
        self.replicas = n;
        self
    }
    fn model(mut self, m: &str) -> Self {
        self.gpu_model = Some(m.to_string());
        self
    }
    fn region(mut self, r: &str) -> Self {
        self.regions.push(r.to_string());
        self
    }
    fn spread(mut self) -> Self {
        self.allow_spread = true;
        self
    }
    fn submit(mut self, ms: u64) -> Self {
        self.submit_time_ms = ms;
        self
    }
}

/// An allocation in cluster `cluster`: per replica, `(node, gpu indices)`;
/// each listed GPU gets `min(gpus_per_replica, 1)`.
pub fn allocation(cluster: u32, per_replica: Milli, replicas: &[(u32, &[u32])]) -> Allocation {
    let share = Milli(per_replica.0.min(MILLI_PER_GPU));
    Allocation {
        cluster,
        replicas: replicas
            .iter()
            .map(|(node, gpus)| {
                gpus.iter()
                    .map(|&gpu| Shard {
                        node: *node,
                        gpu,
                        milli: share,
                    })
                    .collect()
            })
            .collect(),
    }
}

// ---------------------------------------------------------------- checkers

/// Global key of one GPU: (cluster, node, gpu) indices.
pub type GpuKey = (u32, u32, u32);

fn model_of(inv: &Inventory, cluster: u32, node: u32) -> Option<&str> {
    inv.clusters
        .get(cluster as usize)?
        .nodes
        .get(node as usize)
        .map(|n| n.gpu_model.as_str())
}

/// The quota class charged for `model` of `team`'s quotas, with (guaranteed, limit).
pub fn quota_of(policy: &Policy, team: &str, model: &str) -> Option<(String, Milli, Milli)> {
    let t = policy.teams.get(team)?;
    let q = t.quota_class_for(model)?;
    let quota = t.quotas[q];
    Some((q.to_string(), quota.guaranteed, quota.limit))
}

/// Checks that an allocation is well-formed for `spec`: known cluster, node and
/// GPU indices, each replica's shards add up to its request, a non-spread
/// replica sits on one node, one GPU model, and the model is the requested one.
/// Returns the GPU model.
pub fn check_allocation(
    inv: &Inventory,
    spec: &WorkloadSpec,
    a: &Allocation,
) -> Result<String, String> {
    let id = spec.id;
    let cluster = inv.clusters.get(a.cluster as usize).ok_or(format!(
        "workload {id}: unknown cluster index {}",
        a.cluster
    ))?;
    if a.replicas.len() != spec.replicas as usize {
        return Err(format!(
            "workload {id}: {} replicas allocated, gang of {} (not all-or-nothing)",
            a.replicas.len(),
            spec.replicas
        ));
    }
    let mut model: Option<&str> = None;
    for (r, shards) in a.replicas.iter().enumerate() {
        if shards.is_empty() {
            return Err(format!("workload {id}: replica {r} has no shards"));
        }
        let sum: u64 = shards.iter().map(|s| s.milli.0).sum();
        if sum != spec.gpus_per_replica.0 {
            return Err(format!(
                "workload {id}: replica {r} shards add up to {} milli, asked {}",
                sum, spec.gpus_per_replica.0
            ));
        }
        let nodes: BTreeSet<u32> = shards.iter().map(|s| s.node).collect();
        if !spec.allow_spread && nodes.len() != 1 {
            return Err(format!(
                "workload {id}: non-spread replica {r} spans nodes {nodes:?}"
            ));
        }
        let mut seen = BTreeSet::new();
        for s in shards {
            let node = cluster
                .nodes
                .get(s.node as usize)
                .ok_or(format!("workload {id}: unknown node index {}", s.node))?;
            if s.gpu >= node.gpu_count {
                return Err(format!(
                    "workload {id}: GPU {} on {} which has {}",
                    s.gpu, node.name, node.gpu_count
                ));
            }
            if s.milli.0 == 0 || s.milli.0 > MILLI_PER_GPU {
                return Err(format!("workload {id}: shard of {} milli", s.milli.0));
            }
            if !seen.insert((s.node, s.gpu)) {
                return Err(format!(
                    "workload {id}: GPU {}/{} twice in one replica",
                    s.node, s.gpu
                ));
            }
            if *model.get_or_insert(&node.gpu_model) != node.gpu_model {
                return Err(format!("workload {id}: mixed GPU models"));
            }
        }
    }
    let model = model.ok_or(format!("workload {id}: empty allocation"))?;
    if let Some(want) = &spec.gpu_model
        && want != model
    {
        return Err(format!("workload {id}: asked for {want}, got {model}"));
    }
    Ok(model.to_string())
}

/// Allocated milli per GPU, recomputed from the running set.
pub fn recompute_allocated(inv: &Inventory, s: &State) -> Result<BTreeMap<GpuKey, u64>, String> {
    let mut out: BTreeMap<GpuKey, u64> = BTreeMap::new();
    for r in s.running() {
        check_allocation(inv, &r.spec, &r.allocation)?;
        for sh in r.allocation.shards() {
            *out.entry((r.allocation.cluster, sh.node, sh.gpu))
                .or_default() += sh.milli.0;
        }
    }
    Ok(out)
}

/// Invariant 1 on a state: every GPU holds at most one GPU's worth, the
/// state's own accounting (`node_allocated`, `allocated`, `team_usage`) equals
/// a recomputation from the running set, and no team exceeds a limit.
pub fn check_state(inv: &Inventory, s: &State) -> Result<(), String> {
    let alloc = recompute_allocated(inv, s)?;
    let mut total = 0u64;
    for (ci, c) in inv.clusters.iter().enumerate() {
        for (ni, n) in c.nodes.iter().enumerate() {
            let have = s.node_allocated(ci as u32, ni as u32);
            if have.len() != n.gpu_count as usize {
                return Err(format!(
                    "{}/{}: {} GPUs reported",
                    c.name,
                    n.name,
                    have.len()
                ));
            }
            for (gi, m) in have.iter().enumerate() {
                let want = alloc
                    .get(&(ci as u32, ni as u32, gi as u32))
                    .copied()
                    .unwrap_or(0);
                if want > MILLI_PER_GPU {
                    return Err(format!(
                        "{}/{} GPU {gi} over-committed: {want} milli",
                        c.name, n.name
                    ));
                }
                if m.0 != want {
                    return Err(format!(
                        "{}/{} GPU {gi}: state says {} milli allocated, running set says {want}",
                        c.name, n.name, m.0
                    ));
                }
                total += want;
            }
        }
    }
    if s.allocated().0 != total {
        return Err(format!(
            "allocated() {} != recomputed {total}",
            s.allocated().0
        ));
    }
    let policy = s.policy();
    let mut used: BTreeMap<(String, String), Milli> = BTreeMap::new();
    for r in s.running() {
        let model = model_of(inv, r.allocation.cluster, r.allocation.replicas[0][0].node).unwrap();
        let (q, _, _) = quota_of(policy, &r.spec.team, model).ok_or(format!(
            "workload {} runs on {model} without quota",
            r.spec.id
        ))?;
        *used.entry((r.spec.team.clone(), q)).or_default() += r.spec.total_gpus();
    }
    for tu in s.team_usage() {
        for cu in &tu.classes {
            let want = used
                .get(&(tu.team.clone(), cu.gpu_class.clone()))
                .copied()
                .unwrap_or_default();
            if cu.used != want {
                return Err(format!(
                    "team {} {}: team_usage says {}, running set says {want}",
                    tu.team, cu.gpu_class, cu.used
                ));
            }
            if cu.used > cu.limit {
                return Err(format!(
                    "team {} uses {} {} above its limit {}",
                    tu.team, cu.used, cu.gpu_class, cu.limit
                ));
            }
        }
    }
    Ok(())
}

/// Free milli per GPU of a state (schedulable or not).
pub fn free_map(inv: &Inventory, s: &State) -> BTreeMap<GpuKey, u64> {
    let mut out = BTreeMap::new();
    for (ci, c) in inv.clusters.iter().enumerate() {
        for ni in 0..c.nodes.len() {
            for (gi, m) in s.node_allocated(ci as u32, ni as u32).iter().enumerate() {
                out.insert((ci as u32, ni as u32, gi as u32), MILLI_PER_GPU - m.0);
            }
        }
    }
    out
}

fn shards_by_gpu(a: &Allocation) -> BTreeMap<GpuKey, u64> {
    let mut out = BTreeMap::new();
    for s in a.shards() {
        *out.entry((a.cluster, s.node, s.gpu)).or_default() += s.milli.0;
    }
    out
}

/// Invariants 1 and 3 on one cycle's decisions, against the state the cycle ran on.
///
/// Capacity is checked at every moment the hub can reach: a placement starts
/// once the workloads in its `after_preempting` have stopped, so for the sets
/// "no victim stopped yet", "the victims of placement P stopped" and "all
/// stopped", the placements that may then run must fit beside the workloads
/// still running.
pub fn check_decisions(inv: &Inventory, pre: &State, d: &Decisions) -> Result<(), String> {
    let policy = pre.policy();
    let mut placed: BTreeMap<WorkloadId, usize> = BTreeMap::new();
    let mut placed_model: BTreeMap<WorkloadId, String> = BTreeMap::new();
    for (i, p) in d.placements.iter().enumerate() {
        let spec = pre.pending_spec(p.workload).ok_or(format!(
            "placement of workload {} that is not pending",
            p.workload
        ))?;
        if placed.insert(p.workload, i).is_some() {
            return Err(format!("workload {} placed twice in one cycle", p.workload));
        }
        let model = check_allocation(inv, spec, &p.allocation)?;
        let cluster = &inv.clusters[p.allocation.cluster as usize];
        if !cluster.schedulable {
            return Err(format!(
                "workload {} placed on unschedulable {}",
                spec.id, cluster.name
            ));
        }
        if cluster.needs_image && !spec.has_image {
            return Err(format!(
                "workload {} without an image placed on {}, which runs only images",
                spec.id, cluster.name
            ));
        }
        if !spec.regions.is_empty() && !spec.regions.contains(&cluster.region) {
            return Err(format!(
                "workload {} wants regions {:?}, placed in {}",
                spec.id, spec.regions, cluster.region
            ));
        }
        if quota_of(policy, &spec.team, &model).is_none() {
            return Err(format!(
                "workload {} placed on {model} without quota",
                spec.id
            ));
        }
        placed_model.insert(p.workload, model);
    }

    // Preemptions: victims that were running, each once, never unpreemptible,
    // always for a placement that waits for them.
    let mut victims: BTreeMap<WorkloadId, usize> = BTreeMap::new();
    for (i, e) in d.preemptions.iter().enumerate() {
        let r = pre.running_workload(e.workload).ok_or(format!(
            "preemption of workload {} that is not running",
            e.workload
        ))?;
        if victims.insert(e.workload, i).is_some() {
            return Err(format!("workload {} preempted twice", e.workload));
        }
        let vc = &policy.priority_classes[&r.spec.priority_class];
        if vc.preemptible_by.is_empty() {
            return Err(format!(
                "workload {} of unpreemptible class {} was preempted ({:?})",
                e.workload, vc.name, e.reason
            ));
        }
        if e.grace_period_s != vc.grace_period_s {
            return Err(format!(
                "preemption of {}: grace {} != class's",
                e.workload, e.grace_period_s
            ));
        }
        let Some(&pi) = placed.get(&e.for_workload) else {
            return Err(format!(
                "workload {} preempted for {}, which is not placed: the freed GPUs would go to anyone",
                e.workload, e.for_workload
            ));
        };
        if !d.placements[pi].after_preempting.contains(&e.workload) {
            return Err(format!(
                "placement of {} does not wait for its victim {}",
                e.for_workload, e.workload
            ));
        }
        let preemptor = pre.pending_spec(e.for_workload).unwrap();
        let pc = &policy.priority_classes[&preemptor.priority_class];
        if pc.idle_only {
            return Err(format!(
                "idle-only workload {} preempted {}",
                preemptor.id, e.workload
            ));
        }
    }
    for p in &d.placements {
        for v in &p.after_preempting {
            match victims.get(v) {
                Some(&i) if d.preemptions[i].for_workload == p.workload => {}
                _ => {
                    return Err(format!(
                        "placement of {} waits for {v}, which is not preempted for it",
                        p.workload
                    ));
                }
            }
        }
    }

    // Capacity at every reachable moment.
    let free0 = free_map(inv, pre);
    let all: BTreeSet<WorkloadId> = victims.keys().copied().collect();
    let mut moments: Vec<BTreeSet<WorkloadId>> = vec![BTreeSet::new(), all];
    for p in &d.placements {
        moments.push(p.after_preempting.iter().copied().collect());
    }
    for stopped in &moments {
        let mut cap = free0.clone();
        for v in stopped {
            for (g, m) in shards_by_gpu(&pre.running_workload(*v).unwrap().allocation) {
                *cap.get_mut(&g).unwrap() += m;
            }
        }
        let mut load: BTreeMap<GpuKey, u64> = BTreeMap::new();
        for p in &d.placements {
            if p.after_preempting.iter().all(|v| stopped.contains(v)) {
                for (g, m) in shards_by_gpu(&p.allocation) {
                    *load.entry(g).or_default() += m;
                }
            }
        }
        for (g, m) in load {
            let c = cap.get(&g).copied().ok_or(format!("unknown GPU {g:?}"))?;
            if m > c {
                let (ci, ni, gi) = g;
                let cl = &inv.clusters[ci as usize];
                return Err(format!(
                    "{}/{} GPU {gi} over-committed once {:?} stopped: {m} milli placed, {c} free",
                    cl.name, cl.nodes[ni as usize].name, stopped
                ));
            }
        }
    }

    // Replay usage in decision order: reasons, guarantees and limits.
    let hard = policy.settings.cross_team_preemption == CrossTeamPreemption::BorrowedOnly;
    // Usage of never-preempted classes per (team, quota class).
    let never = |class: &str| policy.priority_classes[class].preemptible_by.is_empty();
    let mut fixed: BTreeMap<(String, String), Milli> = BTreeMap::new();
    for r in pre.running() {
        if never(&r.spec.priority_class) {
            let model =
                model_of(inv, r.allocation.cluster, r.allocation.replicas[0][0].node).unwrap();
            let (q, _, _) = quota_of(policy, &r.spec.team, model).unwrap();
            *fixed.entry((r.spec.team.clone(), q)).or_default() += r.spec.total_gpus();
        }
    }
    let mut usage: BTreeMap<(String, String), Milli> = BTreeMap::new();
    for tu in pre.team_usage() {
        for cu in tu.classes {
            usage.insert((tu.team.clone(), cu.gpu_class), cu.used);
        }
    }
    for p in &d.placements {
        let spec = pre.pending_spec(p.workload).unwrap();
        let model = &placed_model[&p.workload];
        let (q, g, limit) = quota_of(policy, &spec.team, model).unwrap();
        let mut reclaimed = false;
        for e in d
            .preemptions
            .iter()
            .filter(|e| e.for_workload == p.workload)
        {
            let v = pre.running_workload(e.workload).unwrap();
            let vmodel =
                model_of(inv, v.allocation.cluster, v.allocation.replicas[0][0].node).unwrap();
            let (vq, vg, _) = quota_of(policy, &v.spec.team, vmodel).unwrap();
            let vu = usage.get_mut(&(v.spec.team.clone(), vq.clone())).unwrap();
            *vu = vu.saturating_sub(v.spec.total_gpus());
            let vu = *vu;
            match &e.reason {
                PreemptReason::Priority {
                    victim_class,
                    preemptor_class,
                    victim_team,
                    preemptor_team,
                } => {
                    if *victim_class != v.spec.priority_class
                        || *preemptor_class != spec.priority_class
                        || *victim_team != v.spec.team
                        || *preemptor_team != spec.team
                    {
                        return Err(format!(
                            "preemption of {}: wrong classes in {:?}",
                            v.spec.id, e.reason
                        ));
                    }
                    let vc = &policy.priority_classes[victim_class];
                    if !vc.preemptible_by.contains(preemptor_class) {
                        return Err(format!(
                            "{} preempted {} by priority, but {victim_class} is not preemptible by {preemptor_class}",
                            spec.id, v.spec.id
                        ));
                    }
                    // Invariant 3: across teams, only borrowed capacity.
                    if hard && v.spec.team != spec.team && vu < vg {
                        return Err(format!(
                            "{} of team {} preempted {} by priority and took team {} below its guarantee {vg} {vq} (now {vu})",
                            spec.id, spec.team, v.spec.id, v.spec.team
                        ));
                    }
                }
                PreemptReason::QuotaReclaim {
                    victim_team,
                    preemptor_team,
                    gpu_class,
                    guaranteed,
                } => {
                    if *victim_team != v.spec.team
                        || *preemptor_team != spec.team
                        || *gpu_class != q
                        || *guaranteed != g
                    {
                        return Err(format!(
                            "preemption of {}: wrong fields in {:?}",
                            v.spec.id, e.reason
                        ));
                    }
                    if v.spec.team == spec.team {
                        return Err(format!(
                            "team {} reclaimed from itself ({})",
                            spec.team, v.spec.id
                        ));
                    }
                    // A reclaim takes only from a team that borrows: above
                    // its guarantee before this eviction. It may end below
                    // it only when the victim is larger than what its team
                    // borrows (a gang cannot be cut).
                    if vu + v.spec.total_gpus() <= vg {
                        return Err(format!(
                            "reclaim for {} took team {} below its guarantee {vg} {vq} (now {vu}) by preempting {}, although it did not borrow",
                            spec.id, v.spec.team, v.spec.id
                        ));
                    }
                    reclaimed = true;
                }
            }
        }
        let u = usage.entry((spec.team.clone(), q.clone())).or_default();
        *u += spec.total_gpus();
        if never(&spec.priority_class) {
            let f = fixed.entry((spec.team.clone(), q.clone())).or_default();
            *f += spec.total_gpus();
            if hard && *f > g {
                return Err(format!(
                    "placing never-preempted {} takes team {}'s never-preempted work to {} {q}, above its guarantee {g}",
                    spec.id, spec.team, *f
                ));
            }
        }
        if *u > limit {
            return Err(format!(
                "placing {} takes team {} to {} {q}, above its limit {limit}",
                spec.id, spec.team, *u
            ));
        }
        if reclaimed && *u > g {
            return Err(format!(
                "{} reclaimed a guarantee but its team {} ends at {} {q}, above its guarantee {g}",
                spec.id, spec.team, *u
            ));
        }
    }
    Ok(())
}

/// Invariant 2, checked precisely for what one cycle must achieve: every
/// pending request of at most one GPU on one replica, within its team's cap
/// (its limit; its guarantee for never-preempted work under
/// `borrowedOnly`), that could have been placed on free GPUs, or on GPUs
/// freed by preempting workloads it may preempt, must not be left pending.
/// It may preempt: its own team's lower priority work that lists its class;
/// another team's such work only from what that team borrows (it stays at
/// or above its guarantee) unless the policy says `crossTeamPreemption:
/// any`; and — while its own team stays within its guarantee — any other
/// team's preemptible work that keeps that team at or above its guarantee,
/// or that is larger than what that team borrows while it borrows (a gang
/// is reclaimed whole).
///
/// To stay exact although the cycle changed things while it ran, every
/// quantity is a bound that held at any moment of the cycle: free GPUs minus
/// all placements, victims still running after it, each team's usage lowered
/// by all its preempted work, the pending team's usage raised by all its
/// placements.
pub fn check_no_missed_room(inv: &Inventory, pre: &State, d: &Decisions) -> Result<(), String> {
    let policy = pre.policy();
    let placed: BTreeSet<WorkloadId> = d.placements.iter().map(|p| p.workload).collect();
    let preempted: BTreeSet<WorkloadId> = d.preemptions.iter().map(|p| p.workload).collect();
    let mut free_lb: BTreeMap<GpuKey, i64> = free_map(inv, pre)
        .into_iter()
        .map(|(k, v)| (k, v as i64))
        .collect();
    let mut used_hi: BTreeMap<(String, String), Milli> = BTreeMap::new();
    let mut used_lo: BTreeMap<(String, String), Milli> = BTreeMap::new();
    for tu in pre.team_usage() {
        for cu in tu.classes {
            used_hi.insert((tu.team.clone(), cu.gpu_class.clone()), cu.used);
            used_lo.insert((tu.team.clone(), cu.gpu_class), cu.used);
        }
    }
    // Never-preempted usage per (team, quota class), raised by every
    // never-preempted placement of the cycle.
    let mut fixed_hi: BTreeMap<(String, String), Milli> = BTreeMap::new();
    for r in pre.running() {
        if policy.priority_classes[&r.spec.priority_class]
            .preemptible_by
            .is_empty()
        {
            let model =
                model_of(inv, r.allocation.cluster, r.allocation.replicas[0][0].node).unwrap();
            let (q, _, _) = quota_of(policy, &r.spec.team, model).unwrap();
            *fixed_hi.entry((r.spec.team.clone(), q)).or_default() += r.spec.total_gpus();
        }
    }
    for p in &d.placements {
        for (g, m) in shards_by_gpu(&p.allocation) {
            *free_lb.get_mut(&g).unwrap() -= m as i64;
        }
        let spec = pre.pending_spec(p.workload).unwrap();
        if policy.priority_classes[&spec.priority_class]
            .preemptible_by
            .is_empty()
        {
            let model =
                model_of(inv, p.allocation.cluster, p.allocation.replicas[0][0].node).unwrap();
            let (q, _, _) = quota_of(policy, &spec.team, model).unwrap();
            *fixed_hi.entry((spec.team.clone(), q)).or_default() += spec.total_gpus();
        }
        let spec = pre.pending_spec(p.workload).unwrap();
        let model = model_of(inv, p.allocation.cluster, p.allocation.replicas[0][0].node).unwrap();
        let (q, _, _) = quota_of(policy, &spec.team, model).unwrap();
        *used_hi.get_mut(&(spec.team.clone(), q)).unwrap() += spec.total_gpus();
    }
    // (team, quota class) of every running workload, and its shards per GPU.
    struct Victim<'a> {
        spec: &'a WorkloadSpec,
        quota: (String, Milli),
        on_gpu: BTreeMap<GpuKey, u64>,
    }
    let mut by_gpu: BTreeMap<GpuKey, Vec<Victim>> = BTreeMap::new();
    for r in pre.running() {
        if preempted.contains(&r.spec.id) {
            let model =
                model_of(inv, r.allocation.cluster, r.allocation.replicas[0][0].node).unwrap();
            let (q, _, _) = quota_of(policy, &r.spec.team, model).unwrap();
            let u = used_lo.get_mut(&(r.spec.team.clone(), q)).unwrap();
            *u = u.saturating_sub(r.spec.total_gpus());
        }
    }
    for r in pre.running() {
        if preempted.contains(&r.spec.id) {
            continue;
        }
        let model = model_of(inv, r.allocation.cluster, r.allocation.replicas[0][0].node).unwrap();
        let (q, g, _) = quota_of(policy, &r.spec.team, model).unwrap();
        let on_gpu = shards_by_gpu(&r.allocation);
        for k in on_gpu.keys() {
            by_gpu.entry(*k).or_default().push(Victim {
                spec: &r.spec,
                quota: (q.clone(), g),
                on_gpu: on_gpu.clone(),
            });
        }
    }

    for w in pre.pending_specs() {
        if placed.contains(&w.id) || w.replicas != 1 || w.gpus_per_replica.0 > MILLI_PER_GPU {
            continue;
        }
        let wc = &policy.priority_classes[&w.priority_class];
        for (ci, c) in inv.clusters.iter().enumerate() {
            if !c.schedulable
                || (c.needs_image && !w.has_image)
                || (!w.regions.is_empty() && !w.regions.contains(&c.region))
            {
                continue;
            }
            for (ni, n) in c.nodes.iter().enumerate() {
                if w.gpu_model.as_ref().is_some_and(|m| *m != n.gpu_model) {
                    continue;
                }
                let Some((q, g, limit)) = quota_of(policy, &w.team, &n.gpu_model) else {
                    continue;
                };
                let hi = used_hi[&(w.team.clone(), q.clone())];
                let hard =
                    policy.settings.cross_team_preemption == CrossTeamPreemption::BorrowedOnly;
                if hi + w.total_gpus() > limit {
                    continue;
                }
                if hard
                    && wc.preemptible_by.is_empty()
                    && fixed_hi
                        .get(&(w.team.clone(), q.clone()))
                        .copied()
                        .unwrap_or_default()
                        + w.total_gpus()
                        > g
                {
                    continue;
                }
                let reclaim = hi + w.total_gpus() <= g;
                for gi in 0..n.gpu_count {
                    let key = (ci as u32, ni as u32, gi);
                    let free = free_lb[&key].max(0) as u64;
                    let mut eligible: Vec<(&Victim, bool)> = Vec::new();
                    if !wc.idle_only {
                        for v in by_gpu.get(&key).map(|v| v.as_slice()).unwrap_or(&[]) {
                            let vc = &policy.priority_classes[&v.spec.priority_class];
                            if vc.preemptible_by.is_empty() {
                                continue;
                            }
                            let by_priority = vc.preemptible_by.contains(&w.priority_class);
                            let by_reclaim = reclaim && v.spec.team != w.team;
                            if by_priority || by_reclaim {
                                // Cross-team victims (in `borrowedOnly`, and every reclaim)
                                // are checked against their team's guarantee below.
                                eligible.push((v, by_priority));
                            }
                        }
                    }
                    assert!(
                        eligible.len() <= 8,
                        "too many shards on one GPU to enumerate"
                    );
                    for mask in 0u32..(1 << eligible.len()) {
                        let chosen: Vec<&(&Victim, bool)> = eligible
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| mask >> i & 1 == 1)
                            .map(|(_, v)| v)
                            .collect();
                        let gain: u64 = chosen.iter().map(|(v, _)| v.on_gpu[&key]).sum();
                        if free + gain < w.gpus_per_replica.0 {
                            continue;
                        }
                        // Teams that lose cross-team victims must stay at or
                        // above their guarantee after losing every chosen one;
                        // a reclaim may also take a team's workloads while the
                        // team borrows before each (taken largest last), so a
                        // workload larger than what its team borrows — a gang
                        // across its guarantee — is taken whole.
                        let mut taken: BTreeMap<(String, String), Milli> = BTreeMap::new();
                        let mut largest: BTreeMap<(String, String), Milli> = BTreeMap::new();
                        for (v, _) in &chosen {
                            let k = (v.spec.team.clone(), v.quota.0.clone());
                            *taken.entry(k.clone()).or_default() += v.spec.total_gpus();
                            let l = largest.entry(k).or_default();
                            *l = (*l).max(v.spec.total_gpus());
                        }
                        let ok = chosen.iter().all(|(v, by_priority)| {
                            (*by_priority && (!hard || v.spec.team == w.team)) || {
                                let k = (v.spec.team.clone(), v.quota.0.clone());
                                let lo = used_lo[&k].0 as i64;
                                let after = lo - taken[&k].0 as i64;
                                let g = v.quota.1.0 as i64;
                                after >= g
                                    || (reclaim
                                        && v.spec.team != w.team
                                        && after + largest[&k].0 as i64 > g)
                            }
                        });
                        if ok {
                            let ids: Vec<WorkloadId> =
                                chosen.iter().map(|(v, _)| v.spec.id).collect();
                            return Err(format!(
                                "workload {} ({} GPU, team {}, class {}) left pending although {}/{} GPU {gi} \
                                 has {free} milli free and preempting {ids:?} would free enough (reclaim allowed: {reclaim}); \
                                 reason given: {:?}",
                                w.id,
                                w.gpus_per_replica,
                                w.team,
                                w.priority_class,
                                c.name,
                                n.name,
                                d.pending
                                    .iter()
                                    .find(|(id, _)| *id == w.id)
                                    .map(|(_, r)| r.to_string())
                            ));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Runs `cycle` twice on the state and once on a clone; all must agree.
pub fn check_deterministic(s: &State, now_ms: u64, first: &Decisions) -> Result<(), String> {
    let opts = axle_scheduler::CycleOptions::default();
    let again = axle_scheduler::cycle(s, now_ms, &opts);
    if again != *first {
        return Err("a second cycle on the same state decided differently".into());
    }
    let cloned = s.clone();
    if axle_scheduler::cycle(&cloned, now_ms, &opts) != *first {
        return Err("a cycle on a clone of the state decided differently".into());
    }
    Ok(())
}
