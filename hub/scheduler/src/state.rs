//! The scheduler's view of the world, kept incrementally: inventory, the
//! running set with its GPU shards, per-team usage and the pending queues.
//!
//! The hub and the simulator mutate a `State` between cycles (submit, finish,
//! apply decisions); a cycle only reads it. Every structure that a decision
//! iterates is ordered (`BTreeMap`/`BTreeSet`/`Vec`), never hashed.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axle_policy::{MILLI_PER_GPU, Milli, Policy};

use crate::catalog::Catalog;
use crate::error::RequestError;
use crate::types::{Allocation, Decisions, Inventory, WorkloadId, WorkloadSpec};

/// Milli-GPUs free on one GPU; fits in u16 (≤ 1000).
pub(crate) type GpuFree = u16;
pub(crate) const FULL_GPU: GpuFree = MILLI_PER_GPU as GpuFree;

#[derive(Debug, Clone)]
pub(crate) struct NodeRec {
    pub cluster: u32,
    /// Index within its cluster.
    pub local: u32,
    pub model: u16,
    pub first_gpu: u32,
    pub gpu_count: u32,
    /// Only fractions fit (MIG or time-sliced GPUs).
    pub fractions_only: bool,
    /// Whole GPUs are never split (see `NodeInventory::whole_only`).
    pub whole_only: bool,
    /// Its topology domain, numbered within its cluster; `NO_DOMAIN` when
    /// the node declares none.
    pub domain: u32,
}

/// The domain of a node without a declared topology domain.
pub(crate) const NO_DOMAIN: u32 = u32::MAX;

/// The most milli-GPUs a fractional unit counts for: one below a whole GPU,
/// so that "fully free" (`FULL_GPU`) always means a whole GPU, never a unit
/// (a `7g.80gb` MIG device is requested as a MIG device, not a GPU).
pub(crate) const MAX_UNIT_SHARE: GpuFree = FULL_GPU - 1;

#[derive(Debug, Clone)]
pub(crate) struct ClusterRec {
    pub name: String,
    pub region: String,
    pub schedulable: bool,
    /// Workloads without an image cannot run here.
    pub needs_image: bool,
    /// Only this team's workloads run here.
    pub owner_team: Option<String>,
    /// Global node indices.
    pub nodes: Vec<u32>,
}

/// A workload holding GPUs.
#[derive(Debug, Clone)]
pub struct RunningWorkload {
    pub spec: Arc<WorkloadSpec>,
    pub allocation: Allocation,
    pub start_time_ms: u64,
    pub(crate) team: u32,
    pub(crate) class: u16,
    /// The quota slot of its team it is charged to.
    pub(crate) slot: u16,
    /// (global gpu index, milli) for every shard.
    pub(crate) gpus: Vec<(u32, GpuFree)>,
}

/// One running workload as the victim search sees it (see
/// `State::victim_facts`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct VictimFacts {
    pub id: WorkloadId,
    pub class: u16,
    pub start_time_ms: u64,
    pub total_milli: u64,
    pub checkpoint_ms: u64,
    /// The node it runs on; `None` when on several.
    pub only_node: Option<u32>,
}

impl VictimFacts {
    /// Work it loses if preempted at `now_ms` (milli-GPU·ms), as
    /// `WorkloadSpec::lost_work_milli_ms` computes it.
    pub(crate) fn lost_now(&self, now_ms: u64) -> u128 {
        crate::types::lost_work(
            now_ms.saturating_sub(self.start_time_ms),
            self.checkpoint_ms,
            self.total_milli,
        )
    }
}

#[derive(Debug, Clone)]
pub(crate) struct PendingRec {
    pub spec: Arc<WorkloadSpec>,
    pub team: u32,
    pub class: u16,
}

/// Key of a pending queue: higher priority value first, then team index.
pub(crate) type QueueKey = (Reverse<i32>, u16, u32);

#[derive(Debug, Clone)]
pub struct State {
    pub(crate) cat: Catalog,
    pub(crate) clusters: Vec<ClusterRec>,
    pub(crate) nodes: Vec<NodeRec>,
    pub(crate) node_names: Vec<String>,
    /// Free milli-GPUs per global GPU index.
    pub(crate) gpu_free: Vec<GpuFree>,
    /// What each global GPU index holds when free: `FULL_GPU` for a whole
    /// GPU, a unit's share for a fractional unit.
    pub(crate) gpu_cap: Vec<GpuFree>,
    /// The largest fraction each fractional unit serves (it serves one at
    /// a time, whole); 0 for a whole GPU.
    pub(crate) gpu_fit: Vec<GpuFree>,
    /// Global node index of every global GPU index.
    pub(crate) gpu_node: Vec<u32>,
    /// Workloads with a shard on each node.
    pub(crate) node_running: Vec<BTreeSet<WorkloadId>>,
    /// Running workloads of each team (by team index).
    pub(crate) team_running: Vec<BTreeSet<WorkloadId>>,
    pub(crate) running: BTreeMap<WorkloadId, RunningWorkload>,
    /// What the victim search reads of every running workload, packed in
    /// one array (a cycle reads all of it once; `running` is a tree of
    /// large records), and where each workload's entry is.
    pub(crate) victim_facts: Vec<VictimFacts>,
    victim_slot: BTreeMap<WorkloadId, usize>,
    /// usage[team][slot]
    pub(crate) usage: Vec<Vec<Milli>>,
    /// The part of `usage` of classes that are never preempted: it must
    /// stay within the guarantee (`borrowedOnly`), since nothing could take
    /// it back.
    pub(crate) usage_fixed: Vec<Vec<Milli>>,
    pub(crate) running_per_class: Vec<u64>,
    pub(crate) pending: BTreeMap<WorkloadId, PendingRec>,
    /// (priority, class, team) → (submit time, id) → the request, in
    /// order. The request rides along so a cycle walking the queues never
    /// looks it up in `pending` (that lookup was a fifth of a cycle).
    pub(crate) queues: BTreeMap<QueueKey, BTreeMap<(u64, WorkloadId), Queued>>,
    /// Each queue split by request shape, in the same order: a cycle that
    /// learns a shape does not fit jumps past that shape's requests instead
    /// of visiting each, and drops a queue once every shape in it is known
    /// not to fit.
    pub(crate) queue_shapes: BTreeMap<QueueKey, BTreeMap<Shape, BTreeSet<(u64, WorkloadId)>>>,
}

/// A queued request and what its place in line is computed from, kept
/// beside it: ordering a cycle's queue heads then reads no request (each
/// read of one of 100,000 requests is a cache miss).
#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub spec: Arc<WorkloadSpec>,
    /// Index of the GPU model it names, if any.
    pub model: Option<u16>,
}

/// The parts of a request that decide whether it fits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Shape {
    pub model: Option<String>,
    pub gpus: Milli,
    pub replicas: u32,
    pub spread: bool,
    pub regions: Vec<String>,
}

impl Shape {
    fn of(spec: &WorkloadSpec) -> Shape {
        Shape {
            model: spec.gpu_model.clone(),
            gpus: spec.gpus_per_replica,
            replicas: spec.replicas,
            spread: spec.allow_spread,
            regions: spec.regions.clone(),
        }
    }
}

impl State {
    /// A state for `policy` over `inventory`, with nothing running or pending.
    pub fn new(policy: Arc<Policy>, inventory: &Inventory) -> State {
        let cat = Catalog::new(policy, inventory);
        let model_index = &cat.model_index;
        let mut clusters = Vec::new();
        let mut nodes = Vec::new();
        let mut node_names = Vec::new();
        let mut gpu_free = Vec::new();
        let mut gpu_cap = Vec::new();
        let mut gpu_fit = Vec::new();
        let mut gpu_node = Vec::new();
        for (ci, c) in inventory.clusters.iter().enumerate() {
            let mut rec = ClusterRec {
                name: c.name.clone(),
                region: c.region.clone(),
                schedulable: c.schedulable,
                needs_image: c.needs_image,
                owner_team: c.owner_team.clone(),
                nodes: Vec::new(),
            };
            let mut domains: BTreeMap<&str, u32> = BTreeMap::new();
            for (li, n) in c.nodes.iter().enumerate() {
                let next = domains.len() as u32;
                let domain = match n.topology.as_deref() {
                    Some(d) => *domains.entry(d).or_insert(next),
                    None => NO_DOMAIN,
                };
                let model = model_index[&n.gpu_model];
                let count = if n.units.is_empty() {
                    n.gpu_count
                } else {
                    n.units.len() as u32
                };
                rec.nodes.push(nodes.len() as u32);
                nodes.push(NodeRec {
                    cluster: ci as u32,
                    local: li as u32,
                    model,
                    first_gpu: gpu_free.len() as u32,
                    gpu_count: count,
                    fractions_only: n.fractions_only,
                    whole_only: n.whole_only,
                    domain,
                });
                node_names.push(n.name.clone());
                gpu_node.extend(std::iter::repeat_n(
                    (nodes.len() - 1) as u32,
                    count as usize,
                ));
                for i in 0..count as usize {
                    let (cap, fit) = match n.units.get(i) {
                        Some(u) if !u.is_whole() => (
                            u.share_milli.clamp(1, MAX_UNIT_SHARE),
                            u.fits_milli.min(FULL_GPU),
                        ),
                        _ => (FULL_GPU, 0),
                    };
                    gpu_free.push(cap);
                    gpu_cap.push(cap);
                    gpu_fit.push(fit);
                }
            }
            clusters.push(rec);
        }
        let usage: Vec<Vec<Milli>> = cat
            .teams
            .iter()
            .map(|t| vec![Milli::ZERO; t.slots.len()])
            .collect();
        let node_count = nodes.len();
        let class_count = cat.classes.len();
        let team_count = cat.teams.len();
        State {
            cat,
            clusters,
            nodes,
            node_names,
            gpu_free,
            gpu_cap,
            gpu_fit,
            gpu_node,
            node_running: vec![BTreeSet::new(); node_count],
            team_running: vec![BTreeSet::new(); team_count],
            running: BTreeMap::new(),
            victim_facts: Vec::new(),
            victim_slot: BTreeMap::new(),
            usage_fixed: usage.clone(),
            usage,
            running_per_class: vec![0; class_count],
            pending: BTreeMap::new(),
            queues: BTreeMap::new(),
            queue_shapes: BTreeMap::new(),
        }
    }

    /// What a shard of `m` milli on GPU index `g` takes of it: a fractional
    /// unit whole, a GPU what is asked.
    pub(crate) fn taken(&self, g: u32, m: GpuFree) -> GpuFree {
        if self.gpu_fit[g as usize] > 0 {
            self.gpu_cap[g as usize]
        } else {
            m
        }
    }

    /// Can GPU index `g`, with `free` milli free, take a fraction of `need`?
    /// A unit: when free and large enough; a whole GPU: when its node splits
    /// GPUs and enough of it is free.
    pub(crate) fn fraction_fits(&self, g: u32, free: GpuFree, need: GpuFree) -> bool {
        let fit = self.gpu_fit[g as usize];
        if fit > 0 {
            return free == self.gpu_cap[g as usize] && fit >= need;
        }
        !self.nodes[self.gpu_node[g as usize] as usize].whole_only && free >= need
    }

    pub fn policy(&self) -> &Arc<Policy> {
        &self.cat.policy
    }

    /// Checks a new request against policy and inventory without changing anything.
    pub fn validate(&self, spec: &WorkloadSpec) -> Result<(), RequestError> {
        crate::validate::validate(&self.cat, spec, true)
    }

    /// Queues a workload. Fails (changing nothing) on an invalid or impossible request
    /// or a duplicate id.
    pub fn submit(&mut self, spec: WorkloadSpec) -> Result<(), RequestError> {
        self.validate(&spec)?;
        if self.pending.contains_key(&spec.id) || self.running.contains_key(&spec.id) {
            return Err(RequestError::DuplicateId(spec.id));
        }
        self.enqueue(Arc::new(spec));
        Ok(())
    }

    fn enqueue(&mut self, spec: Arc<WorkloadSpec>) {
        let team = self.cat.team_index[&spec.team];
        let class = self.cat.class_index[&spec.priority_class];
        let key = (Reverse(self.cat.classes[class as usize].value), class, team);
        self.queues.entry(key).or_default().insert(
            (spec.submit_time_ms, spec.id),
            Queued {
                spec: Arc::clone(&spec),
                model: self.cat.model_of(spec.gpu_model.as_deref()),
            },
        );
        self.queue_shapes
            .entry(key)
            .or_default()
            .entry(Shape::of(&spec))
            .or_default()
            .insert((spec.submit_time_ms, spec.id));
        self.pending
            .insert(spec.id, PendingRec { spec, team, class });
    }

    fn dequeue(&mut self, id: WorkloadId) -> Option<PendingRec> {
        let rec = self.pending.remove(&id)?;
        let key = (
            Reverse(self.cat.classes[rec.class as usize].value),
            rec.class,
            rec.team,
        );
        if let Some(q) = self.queues.get_mut(&key) {
            q.remove(&(rec.spec.submit_time_ms, id));
            if q.is_empty() {
                self.queues.remove(&key);
            }
        }
        if let Some(shapes) = self.queue_shapes.get_mut(&key) {
            let shape = Shape::of(&rec.spec);
            if let Some(of_shape) = shapes.get_mut(&shape) {
                of_shape.remove(&(rec.spec.submit_time_ms, id));
                if of_shape.is_empty() {
                    shapes.remove(&shape);
                }
            }
            if shapes.is_empty() {
                self.queue_shapes.remove(&key);
            }
        }
        Some(rec)
    }

    /// Removes a workload wherever it is (finished, failed, cancelled) and frees
    /// its GPUs. Returns whether it was known.
    pub fn remove(&mut self, id: WorkloadId) -> bool {
        if self.dequeue(id).is_some() {
            return true;
        }
        self.release(id).is_some()
    }

    fn release(&mut self, id: WorkloadId) -> Option<RunningWorkload> {
        let r = self.running.remove(&id)?;
        if let Some(i) = self.victim_slot.remove(&id) {
            self.victim_facts.swap_remove(i);
            if let Some(moved) = self.victim_facts.get(i) {
                self.victim_slot.insert(moved.id, i);
            }
        }
        for &(g, m) in &r.gpus {
            self.gpu_free[g as usize] += m;
        }
        for s in r.allocation.shards() {
            let node = self.clusters[r.allocation.cluster as usize].nodes[s.node as usize];
            self.node_running[node as usize].remove(&id);
        }
        let u = &mut self.usage[r.team as usize][r.slot as usize];
        *u = u.saturating_sub(r.spec.total_gpus());
        if !self.cat.classes[r.class as usize].is_preemptible() {
            let f = &mut self.usage_fixed[r.team as usize][r.slot as usize];
            *f = f.saturating_sub(r.spec.total_gpus());
        }
        self.team_running[r.team as usize].remove(&id);
        self.running_per_class[r.class as usize] -= 1;
        Some(r)
    }

    /// Records a workload as holding `allocation` from `start_time_ms` (a
    /// placement being applied, or a running workload adopted after a restart).
    /// Fails, changing nothing, when the GPUs are not free: no node is ever
    /// over-committed.
    pub fn start(
        &mut self,
        spec: Arc<WorkloadSpec>,
        allocation: Allocation,
        start_time_ms: u64,
    ) -> Result<(), RequestError> {
        crate::validate::validate(&self.cat, &spec, false)?;
        let cluster = self
            .clusters
            .get(allocation.cluster as usize)
            .ok_or(RequestError::BadAllocation("unknown cluster index"))?
            .nodes
            .clone();
        if allocation.replicas.len() != spec.replicas as usize {
            return Err(RequestError::BadAllocation(
                "replica count differs from the spec",
            ));
        }
        let mut gpus: Vec<(u32, GpuFree)> = Vec::new();
        let mut model = None;
        for replica in &allocation.replicas {
            let total: u64 = replica.iter().map(|s| s.milli.0).sum();
            if total != spec.gpus_per_replica.0 {
                return Err(RequestError::BadAllocation(
                    "shards of a replica do not add up to its GPUs",
                ));
            }
            for s in replica {
                let node = *cluster
                    .get(s.node as usize)
                    .ok_or(RequestError::BadAllocation("unknown node index"))?;
                let n = &self.nodes[node as usize];
                if s.gpu >= n.gpu_count || s.milli.0 == 0 || s.milli.0 > MILLI_PER_GPU {
                    return Err(RequestError::BadAllocation("bad GPU index or share"));
                }
                if *model.get_or_insert(n.model) != n.model {
                    return Err(RequestError::BadAllocation("mixed GPU models"));
                }
                let g = n.first_gpu + s.gpu;
                // A fractional unit is taken whole by the one fraction it serves.
                let fit = self.gpu_fit[g as usize];
                if fit > 0 && s.milli.0 > u64::from(fit) {
                    return Err(RequestError::BadAllocation(
                        "a fraction larger than its unit serves",
                    ));
                }
                let take = if fit > 0 {
                    self.gpu_cap[g as usize]
                } else {
                    s.milli.0 as GpuFree
                };
                match gpus.iter_mut().find(|(x, _)| *x == g) {
                    Some(_) if fit > 0 => {
                        return Err(RequestError::BadAllocation("a unit serves one fraction"));
                    }
                    Some(e) => e.1 += take,
                    None => gpus.push((g, take)),
                }
            }
        }
        for &(g, m) in &gpus {
            if self.gpu_free[g as usize] < m {
                return Err(RequestError::BadAllocation("GPU already allocated"));
            }
        }
        let model = model.ok_or(RequestError::BadAllocation("empty allocation"))?;
        let team = self.cat.team_index[&spec.team];
        let slot = self.cat.teams[team as usize].charge[model as usize].ok_or(
            RequestError::BadAllocation("team has no quota for this GPU model"),
        )?;
        let class = self.cat.class_index[&spec.priority_class];
        if self.running.contains_key(&spec.id) {
            return Err(RequestError::DuplicateId(spec.id));
        }
        self.dequeue(spec.id);
        for &(g, m) in &gpus {
            self.gpu_free[g as usize] -= m;
        }
        for s in allocation.shards() {
            let node = cluster[s.node as usize];
            self.node_running[node as usize].insert(spec.id);
        }
        self.usage[team as usize][slot as usize] += spec.total_gpus();
        if !self.cat.classes[class as usize].is_preemptible() {
            self.usage_fixed[team as usize][slot as usize] += spec.total_gpus();
        }
        self.team_running[team as usize].insert(spec.id);
        self.running_per_class[class as usize] += 1;
        let first = gpus.first().map(|&(g, _)| self.gpu_node[g as usize]);
        let only_node =
            first.filter(|&n| gpus.iter().all(|&(g, _)| self.gpu_node[g as usize] == n));
        self.victim_slot.insert(spec.id, self.victim_facts.len());
        self.victim_facts.push(VictimFacts {
            id: spec.id,
            class,
            start_time_ms,
            total_milli: spec.total_gpus().0,
            checkpoint_ms: spec.checkpoint_ms(),
            only_node,
        });
        self.running.insert(
            spec.id,
            RunningWorkload {
                spec,
                allocation,
                start_time_ms,
                team,
                class,
                slot,
                gpus,
            },
        );
        Ok(())
    }

    /// Applies a cycle's decisions: preempted workloads go back to the queue
    /// with their original submit time, placed ones start holding their GPUs.
    pub fn apply(&mut self, decisions: &Decisions, now_ms: u64) -> Result<(), RequestError> {
        for p in &decisions.preemptions {
            if let Some(r) = self.release(p.workload) {
                self.enqueue(r.spec);
            }
        }
        for p in &decisions.placements {
            let spec = self
                .pending
                .get(&p.workload)
                .map(|r| r.spec.clone())
                .ok_or(RequestError::UnknownWorkload(p.workload))?;
            self.start(spec, p.allocation.clone(), now_ms)?;
        }
        Ok(())
    }

    /// Moves a running workload back to the queue (its spoke was lost).
    pub fn requeue(&mut self, id: WorkloadId) -> bool {
        match self.release(id) {
            Some(r) => {
                self.enqueue(r.spec);
                true
            }
            None => false,
        }
    }

    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    pub fn running(&self) -> impl Iterator<Item = &RunningWorkload> {
        self.running.values()
    }

    pub fn running_workload(&self, id: WorkloadId) -> Option<&RunningWorkload> {
        self.running.get(&id)
    }

    pub fn pending_spec(&self, id: WorkloadId) -> Option<&Arc<WorkloadSpec>> {
        self.pending.get(&id).map(|r| &r.spec)
    }

    pub fn pending_specs(&self) -> impl Iterator<Item = &Arc<WorkloadSpec>> {
        self.pending.values().map(|r| &r.spec)
    }

    pub fn cluster_count(&self) -> u32 {
        self.clusters.len() as u32
    }

    /// Nodes of a cluster (by index within it).
    pub fn node_count(&self, cluster: u32) -> u32 {
        self.clusters[cluster as usize].nodes.len() as u32
    }

    pub fn cluster_name(&self, cluster: u32) -> &str {
        &self.clusters[cluster as usize].name
    }

    pub fn node_name(&self, cluster: u32, node: u32) -> &str {
        let g = self.clusters[cluster as usize].nodes[node as usize];
        &self.node_names[g as usize]
    }

    pub fn gpu_model_of(&self, cluster: u32, node: u32) -> &str {
        let g = self.clusters[cluster as usize].nodes[node as usize];
        &self.cat.models[self.nodes[g as usize].model as usize]
    }

    /// Total GPUs in schedulable clusters (a fractional unit counts its share).
    pub fn capacity(&self) -> Milli {
        self.nodes
            .iter()
            .filter(|n| self.clusters[n.cluster as usize].schedulable)
            .flat_map(|n| n.first_gpu..n.first_gpu + n.gpu_count)
            .map(|g| Milli(u64::from(self.gpu_cap[g as usize])))
            .sum()
    }

    /// GPUs allocated, in all clusters.
    pub fn allocated(&self) -> Milli {
        let total: u64 = self.gpu_cap.iter().map(|&c| u64::from(c)).sum();
        let free: u64 = self.gpu_free.iter().map(|&f| u64::from(f)).sum();
        Milli(total - free)
    }

    /// Allocated milli-GPUs on every GPU of a node, for invariant checks:
    /// index i is GPU i of the node.
    pub fn node_allocated(&self, cluster: u32, node: u32) -> Vec<Milli> {
        let g = self.clusters[cluster as usize].nodes[node as usize];
        let n = &self.nodes[g as usize];
        (0..n.gpu_count)
            .map(|i| {
                let g = (n.first_gpu + i) as usize;
                Milli(u64::from(self.gpu_cap[g] - self.gpu_free[g]))
            })
            .collect()
    }

    /// Usage of every team per quota class, with guarantee and limit.
    pub fn team_usage(&self) -> Vec<TeamUsage> {
        self.cat
            .teams
            .iter()
            .enumerate()
            .map(|(t, info)| TeamUsage {
                team: info.name.clone(),
                classes: info
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(s, (class, g, l))| ClassUsage {
                        gpu_class: class.clone(),
                        used: self.usage[t][s],
                        guaranteed: *g,
                        limit: *l,
                    })
                    .collect(),
            })
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TeamUsage {
    pub team: String,
    pub classes: Vec<ClassUsage>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ClassUsage {
    pub gpu_class: String,
    pub used: Milli,
    pub guaranteed: Milli,
    pub limit: Milli,
}
