//! One scheduling cycle: a pure function of (`State`, clock, options) to
//! `Decisions`. No I/O, no clock reads, no hashing, no randomness.
//!
//! Order of service (documented in ARCHITECTURE.md):
//! 1. priority class value, highest first;
//! 2. within a class, teams below their guarantee before borrowers, then the
//!    lowest weighted dominant share
//!    `share(t) = max over quota classes q of used(t,q) / max(guaranteed(t,q), 1 GPU) / weight(t)`
//!    (for a workload that names a GPU model, only that model's quota class counts);
//! 3. then submit time, then workload id.
//!
//! Shares are recomputed after every placement, so a cycle interleaves teams
//! the way a fair-share queue does.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axle_policy::{MILLI_PER_GPU, Milli};

use crate::state::{FULL_GPU, GpuFree, QueueKey, State};
use crate::types::{
    Allocation, BurstWanted, Decisions, PendingReason, Placement, PreemptReason, Preemption, Shard,
    WorkloadId, WorkloadSpec,
};

/// Preemption searches per cycle. Each search may scan every node of a GPU
/// model (8,000 nodes in the largest fleet we plan for, ~50 µs); 256 searches
/// bound the worst cycle to ~15 ms. Workloads past the limit wait one cycle.
pub const MAX_PREEMPTION_SEARCHES_PER_CYCLE: usize = 256;

/// Victims one preemption may evict: more than a full 16-node cluster of
/// fractional notebooks would be a sign of a bad request, not a plan.
pub const MAX_VICTIMS_PER_PREEMPTION: usize = 512;

/// Extra victim searches in one scope when a reclaim was refused because the
/// victim's team would fall below its guarantee: each retry puts one refused
/// victim first. Each retry is one more pass over the scope's candidates, and
/// only scopes that found no victim set retry, so 8 keeps a scope within 9
/// passes.
pub const MAX_RECLAIM_RETRIES: usize = 8;

#[derive(Debug, Clone)]
pub struct CycleOptions {
    /// Give every waiting workload a reason (the hub). The simulator turns it
    /// off: workloads that provably cannot be placed are then skipped, which
    /// makes a cycle cost proportional to what changes, not to the queue.
    pub explain: bool,
    pub max_preemption_searches: usize,
    /// Remaining burst budget per team this month; `None` uses the policy's
    /// monthly budget (nothing spent).
    pub burst_headroom_usd: Option<BTreeMap<String, f64>>,
}

impl Default for CycleOptions {
    fn default() -> Self {
        CycleOptions {
            explain: true,
            max_preemption_searches: MAX_PREEMPTION_SEARCHES_PER_CYCLE,
            burst_headroom_usd: None,
        }
    }
}

/// One team's queue within a priority level.
type LevelQueue<'a> = (&'a QueueKey, &'a BTreeSet<(u64, WorkloadId)>);

/// Runs one cycle over `state` at time `now_ms`.
pub fn cycle(state: &State, now_ms: u64, opts: &CycleOptions) -> Decisions {
    let mut w = Work::new(state, opts.explain);
    let mut out = Decisions::default();
    let mut failed: BTreeMap<ShapeKey<'_>, PendingReason> = BTreeMap::new();
    let mut searches_left = opts.max_preemption_searches;

    // Group queues into levels of equal (priority value, class).
    let mut levels: Vec<(u16, Vec<LevelQueue<'_>>)> = Vec::new();
    for (key, q) in &state.queues {
        let class = key.1;
        match levels.last_mut() {
            Some((c, v)) if *c == class => v.push((key, q)),
            _ => levels.push((class, vec![(key, q)])),
        }
    }

    for (class, queues) in levels {
        let class_info = &state.classes[class as usize];
        let mut iters: Vec<_> = queues
            .iter()
            .map(|(k, q)| (k.2, q.iter().peekable()))
            .collect();
        let mut order: BTreeSet<TeamKey> = BTreeSet::new();
        for (i, (team, it)) in iters.iter_mut().enumerate() {
            if let Some(&&(submit, id)) = it.peek() {
                order.insert(w.team_key(*team, &state.pending[&id].spec, submit, id, i));
            }
        }
        while let Some(k) = order.pop_first() {
            let i = k.5;
            let (team, it) = &mut iters[i];
            let team = *team;
            let Some(&(_, id)) = it.next() else { continue };
            let spec = &state.pending[&id].spec;

            let skip = !opts.explain && w.global_free == 0 && !w.may_preempt(team, class);
            if skip {
                // Nothing is free and this group cannot make room: nothing
                // else in this group can be placed this cycle.
                continue;
            }

            let result = w.schedule_one(
                state,
                spec,
                team,
                class,
                &mut failed,
                &mut searches_left,
                &mut out,
            );
            if let Err(reason) = result {
                maybe_burst(
                    state,
                    opts,
                    spec,
                    team,
                    class_info.burst_allowed,
                    now_ms,
                    &mut out,
                );
                if opts.explain || reason != PendingReason::NotEvaluated {
                    out.pending.push((id, reason));
                }
                if !opts.explain && w.queue_exhausted(queues[i].0, team, class, &failed) {
                    // Every shape left in this queue is known not to fit.
                    continue;
                }
            }
            if let Some(&&(submit, next)) = iters[i].1.peek() {
                order.insert(w.team_key(team, &state.pending[&next].spec, submit, next, i));
            }
        }
    }
    out
}

fn maybe_burst(
    state: &State,
    opts: &CycleOptions,
    spec: &WorkloadSpec,
    team: u32,
    class_allows: bool,
    now_ms: u64,
    out: &mut Decisions,
) {
    if !spec.burst_allowed || !class_allows {
        return;
    }
    let info = &state.teams[team as usize];
    if info.burst_providers.is_empty() {
        return;
    }
    let waited_ms = now_ms.saturating_sub(spec.submit_time_ms);
    if waited_ms < state.policy.settings.burst_wait_threshold_s * 1000 {
        return;
    }
    let headroom = match &opts.burst_headroom_usd {
        Some(m) => m.get(&info.name).copied().unwrap_or(0.0),
        None => info.burst_budget_usd_per_month,
    };
    if headroom <= 0.0 {
        return;
    }
    out.burst_wanted.push(BurstWanted {
        workload: spec.id,
        team: info.name.clone(),
        gpus_per_replica: spec.gpus_per_replica,
        replicas: spec.replicas,
        gpu_model: spec.gpu_model.clone(),
        providers: info.burst_providers.clone(),
        waited_ms,
    });
}

/// Total order on f64 for shares (all finite and non-negative).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Share(f64);
impl Eq for Share {}
impl PartialOrd for Share {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Share {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// (borrowing, weighted share, submit time, id, team, index in level)
type TeamKey = (bool, Share, u64, WorkloadId, u32, usize);

/// What makes two requests of a cycle interchangeable for feasibility: if one
/// failed, the other fails too (capacity only shrinks and usage only grows
/// within a cycle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct ShapeKey<'a> {
    team: u32,
    class: u16,
    model: Option<&'a str>,
    gpus: Milli,
    replicas: u32,
    spread: bool,
    regions: &'a [String],
}

/// Does a failure recorded this cycle prove that `key` fails too?
fn dominated(failed: &BTreeMap<ShapeKey<'_>, PendingReason>, key: &ShapeKey<'_>) -> bool {
    // Failures of the same team and class sort together, from this bound on.
    let first = ShapeKey {
        team: key.team,
        class: key.class,
        model: None,
        gpus: Milli::ZERO,
        replicas: 0,
        spread: false,
        regions: &[],
    };
    failed
        .range(first..)
        .take_while(|(f, _)| f.team == key.team && f.class == key.class)
        .any(|(f, _)| f.dominates(key))
}

impl ShapeKey<'_> {
    /// Does a failure of `self` imply a failure of `other`? True when `other`
    /// asks for at least as much under at least the same constraints.
    fn dominates(&self, other: &ShapeKey<'_>) -> bool {
        self.team == other.team
            && self.class == other.class
            && self.model == other.model
            && self.regions == other.regions
            && (self.spread || !other.spread)
            && other.replicas >= self.replicas
            && other.gpus >= self.gpus
            && (self.gpus.0 >= MILLI_PER_GPU) == (other.gpus.0 >= MILLI_PER_GPU)
    }
}

/// A candidate plan: global GPU index and milli per shard, per replica.
type Plan = Vec<Vec<(u32, GpuFree)>>;

/// The mutable copy of capacity and usage a cycle works on.
struct Work<'s> {
    s: &'s State,
    gpu_free: Vec<GpuFree>,
    node_full: Vec<u32>,
    /// Per model: (fully free GPUs, node) for schedulable nodes with at least one.
    whole: Vec<BTreeSet<(u32, u32)>>,
    /// Per model: (free milli, gpu) for schedulable GPUs that are partly used.
    partial: Vec<BTreeSet<(GpuFree, u32)>>,
    /// [cluster][model] fully free GPUs.
    cluster_full: Vec<Vec<u32>>,
    global_free: u64,
    usage: Vec<Vec<Milli>>,
    preempted: BTreeSet<WorkloadId>,
    lowest_class_value: i32,
    /// Does any team run above its guarantee (at cycle start)?
    borrowers_exist: bool,
    explain: bool,
}

impl<'s> Work<'s> {
    fn new(s: &'s State, explain: bool) -> Work<'s> {
        let models = s.models.len();
        let mut w = Work {
            s,
            gpu_free: s.gpu_free.clone(),
            node_full: vec![0; s.nodes.len()],
            whole: vec![BTreeSet::new(); models],
            partial: vec![BTreeSet::new(); models],
            cluster_full: vec![vec![0; models]; s.clusters.len()],
            global_free: 0,
            usage: s.usage.clone(),
            preempted: BTreeSet::new(),
            lowest_class_value: s.classes.iter().map(|c| c.value).min().unwrap_or(0),
            explain,
            borrowers_exist: s.teams.iter().enumerate().any(|(t, info)| {
                info.slots
                    .iter()
                    .enumerate()
                    .any(|(i, slot)| s.usage[t][i] > slot.1)
            }),
        };
        for (ni, n) in s.nodes.iter().enumerate() {
            let sched = s.clusters[n.cluster as usize].schedulable;
            let mut full = 0;
            for g in n.first_gpu..n.first_gpu + n.gpu_count {
                let f = w.gpu_free[g as usize];
                if f == FULL_GPU {
                    full += 1;
                } else if f > 0 && sched {
                    w.partial[n.model as usize].insert((f, g));
                }
                if sched {
                    w.global_free += u64::from(f);
                }
            }
            w.node_full[ni] = full;
            if sched {
                if full > 0 {
                    w.whole[n.model as usize].insert((full, ni as u32));
                }
                w.cluster_full[n.cluster as usize][n.model as usize] += full;
            }
        }
        w
    }

    fn schedulable_gpu(&self, g: u32) -> (u32, bool) {
        let node = self.s.gpu_node[g as usize];
        let c = self.s.nodes[node as usize].cluster;
        (node, self.s.clusters[c as usize].schedulable)
    }

    /// Changes the free amount of GPU `g` by `delta` and keeps every index true.
    fn adjust(&mut self, g: u32, new_free: GpuFree) {
        let old = self.gpu_free[g as usize];
        if old == new_free {
            return;
        }
        let (node, sched) = self.schedulable_gpu(g);
        let n = &self.s.nodes[node as usize];
        let model = n.model as usize;
        self.gpu_free[g as usize] = new_free;
        if !sched {
            return;
        }
        self.global_free = self.global_free + u64::from(new_free) - u64::from(old);
        if old > 0 && old < FULL_GPU {
            self.partial[model].remove(&(old, g));
        }
        if new_free > 0 && new_free < FULL_GPU {
            self.partial[model].insert((new_free, g));
        }
        let was_full = old == FULL_GPU;
        let is_full = new_free == FULL_GPU;
        if was_full != is_full {
            let full = self.node_full[node as usize];
            if full > 0 {
                self.whole[model].remove(&(full, node));
            }
            let full = if is_full { full + 1 } else { full - 1 };
            self.node_full[node as usize] = full;
            if full > 0 {
                self.whole[model].insert((full, node));
            }
            let cf = &mut self.cluster_full[n.cluster as usize][model];
            if is_full { *cf += 1 } else { *cf -= 1 }
        }
    }

    fn share_of(&self, team: u32, model: Option<&str>) -> f64 {
        let info = &self.s.teams[team as usize];
        let usage = &self.usage[team as usize];
        let ratio = |slot: usize| {
            let g = info.slots[slot].1.0.max(MILLI_PER_GPU);
            usage[slot].0 as f64 / g as f64
        };
        let slot_of_model = model
            .and_then(|m| self.s.model_index.get(m))
            .and_then(|&m| info.charge[m as usize]);
        match slot_of_model {
            Some(slot) => ratio(slot as usize),
            None => (0..info.slots.len()).map(ratio).fold(0.0, f64::max),
        }
    }

    fn team_key(
        &self,
        team: u32,
        spec: &WorkloadSpec,
        submit: u64,
        id: WorkloadId,
        i: usize,
    ) -> TeamKey {
        let share = self.share_of(team, spec.gpu_model.as_deref());
        let weight = self.s.teams[team as usize].weight.max(f64::MIN_POSITIVE);
        (share >= 1.0, Share(share / weight), submit, id, team, i)
    }

    /// Is every request shape queued under `key` dominated by a failure of this cycle?
    fn queue_exhausted(
        &self,
        key: &QueueKey,
        team: u32,
        class: u16,
        failed: &BTreeMap<ShapeKey<'_>, PendingReason>,
    ) -> bool {
        let Some(shapes) = self.s.queue_shapes.get(key) else {
            return true;
        };
        shapes.keys().all(|shape| {
            let k = ShapeKey {
                team,
                class,
                model: shape.model.as_deref(),
                gpus: shape.gpus,
                replicas: shape.replicas,
                spread: shape.spread,
                regions: &shape.regions,
            };
            dominated(failed, &k)
        })
    }

    /// Could a workload of this team and class make room by preempting?
    fn may_preempt(&self, team: u32, class: u16) -> bool {
        let c = &self.s.classes[class as usize];
        if c.idle_only {
            return false;
        }
        let by_priority = self.s.classes.iter().enumerate().any(|(v, vc)| {
            (vc.preemptible_by >> (class % 64)) & 1 == 1 && self.s.running_per_class[v] > 0
        });
        if by_priority {
            return true;
        }
        let info = &self.s.teams[team as usize];
        let usage = &self.usage[team as usize];
        info.slots
            .iter()
            .enumerate()
            .any(|(i, (_, g, _))| usage[i] < *g)
    }

    /// Models this request may use, each with the quota slot it is charged to.
    /// Err: the reason none is allowed.
    fn allowed_models(
        &self,
        spec: &WorkloadSpec,
        team: u32,
    ) -> Result<Vec<(u16, u16)>, PendingReason> {
        let info = &self.s.teams[team as usize];
        let candidates: Vec<u16> = match &spec.gpu_model {
            Some(m) => match self.s.model_index.get(m) {
                Some(&i) => vec![i],
                None => {
                    return Err(PendingReason::NoMatchingCluster {
                        gpu_model: spec.gpu_model.clone(),
                        regions: spec.regions.clone(),
                    });
                }
            },
            None => (0..self.s.models.len() as u16).collect(),
        };
        let mut out = Vec::new();
        let mut limit_reason = None;
        for m in candidates {
            let Some(slot) = info.charge[m as usize] else {
                continue;
            };
            let (class, _, limit) = &info.slots[slot as usize];
            let used = self.usage[team as usize][slot as usize];
            if used + spec.total_gpus() > *limit {
                limit_reason.get_or_insert(PendingReason::TeamAtLimit {
                    team: info.name.clone(),
                    gpu_class: class.clone(),
                    limit: *limit,
                    used,
                    requested: spec.total_gpus(),
                });
                continue;
            }
            out.push((m, slot));
        }
        if out.is_empty() {
            return Err(
                limit_reason.unwrap_or_else(|| PendingReason::NoQuotaForModel {
                    team: info.name.clone(),
                    gpu_model: spec.gpu_model.clone().unwrap_or_else(|| "any".to_string()),
                }),
            );
        }
        Ok(out)
    }

    fn cluster_ok(&self, spec: &WorkloadSpec, cluster: u32) -> bool {
        let c = &self.s.clusters[cluster as usize];
        c.schedulable && (spec.regions.is_empty() || spec.regions.contains(&c.region))
    }

    fn node_ok(&self, spec: &WorkloadSpec, node: u32) -> bool {
        self.cluster_ok(spec, self.s.nodes[node as usize].cluster)
    }

    /// Schedules one workload: place directly, else preempt, else explain.
    #[allow(clippy::too_many_arguments)]
    fn schedule_one(
        &mut self,
        state: &State,
        spec: &'s Arc<WorkloadSpec>,
        team: u32,
        class: u16,
        failed: &mut BTreeMap<ShapeKey<'s>, PendingReason>,
        searches_left: &mut usize,
        out: &mut Decisions,
    ) -> Result<(), PendingReason> {
        let key = ShapeKey {
            team,
            class,
            model: spec.gpu_model.as_deref(),
            gpus: spec.gpus_per_replica,
            replicas: spec.replicas,
            spread: spec.allow_spread,
            regions: &spec.regions,
        };
        if let Some(r) = failed.get(&key) {
            return Err(if self.explain {
                r.clone()
            } else {
                PendingReason::NotEvaluated
            });
        }
        if !self.explain {
            // A failed request of this group that asks for no more than this
            // one under the same constraints proves this one fails too.
            if dominated(failed, &key) {
                return Err(PendingReason::NotEvaluated);
            }
        }
        let models = match self.allowed_models(spec, team) {
            Ok(m) => m,
            Err(r) => {
                failed.insert(key, r.clone());
                return Err(r);
            }
        };
        for &(m, slot) in &models {
            if let Some(plan) = self.find(spec, m, None) {
                self.commit(spec, team, slot, plan, Vec::new(), out);
                return Ok(());
            }
        }
        let class_info = &state.classes[class as usize];
        let mut reason = self.explain_capacity(spec, &models, class_info.idle_only);
        if !class_info.idle_only && !matches!(reason, PendingReason::NeverFits { .. }) {
            if *searches_left == 0 {
                reason = PendingReason::PreemptionDeferred;
            } else {
                *searches_left -= 1;
                if let Some((m, slot, cluster, victims)) =
                    self.find_victims(spec, team, class, &models)
                {
                    // Victims hold their GPUs until they stop (grace period);
                    // only this workload waits for them, so after it is
                    // placed whatever it left of their GPUs is not free for
                    // anyone else this cycle.
                    let held: Vec<(u32, GpuFree)> = victims
                        .iter()
                        .flat_map(|(v, _)| state.running[v].gpus.iter())
                        .map(|&(g, _)| (g, self.gpu_free[g as usize]))
                        .collect();
                    let mut ids = Vec::with_capacity(victims.len());
                    for (v, why) in victims {
                        self.evict(v);
                        let grace = state.classes[state.running[&v].class as usize].grace_period_s;
                        out.preemptions.push(Preemption {
                            workload: v,
                            for_workload: spec.id,
                            reason: why,
                            grace_period_s: grace,
                        });
                        ids.push(v);
                    }
                    let placed = match self.find(spec, m, Some(cluster)) {
                        Some(plan) => {
                            self.commit(spec, team, slot, plan, ids, out);
                            true
                        }
                        // Unreachable when find_victims and find agree; the victims
                        // stay preempted and the workload takes the room next cycle.
                        None => false,
                    };
                    for (g, before) in held {
                        if self.gpu_free[g as usize] > before {
                            self.adjust(g, before);
                        }
                    }
                    if placed {
                        return Ok(());
                    }
                }
            }
        }
        failed.insert(key, reason.clone());
        Err(reason)
    }

    fn commit(
        &mut self,
        spec: &WorkloadSpec,
        team: u32,
        slot: u16,
        plan: Plan,
        after_preempting: Vec<WorkloadId>,
        out: &mut Decisions,
    ) {
        let mut cluster = 0;
        let replicas = plan
            .iter()
            .map(|shards| {
                shards
                    .iter()
                    .map(|&(g, m)| {
                        let node = self.s.gpu_node[g as usize];
                        let n = &self.s.nodes[node as usize];
                        cluster = n.cluster;
                        self.adjust(g, self.gpu_free[g as usize] - m);
                        Shard {
                            node: n.local,
                            gpu: g - n.first_gpu,
                            milli: Milli(u64::from(m)),
                        }
                    })
                    .collect()
            })
            .collect();
        self.usage[team as usize][slot as usize] += spec.total_gpus();
        out.placements.push(Placement {
            workload: spec.id,
            allocation: Allocation { cluster, replicas },
            after_preempting,
        });
    }

    fn evict(&mut self, v: WorkloadId) {
        let r = &self.s.running[&v];
        for &(g, m) in &r.gpus {
            self.adjust(g, self.gpu_free[g as usize] + m);
        }
        let u = &mut self.usage[r.team as usize][r.slot as usize];
        *u = u.saturating_sub(r.spec.total_gpus());
        self.preempted.insert(v);
    }

    /// Finds GPUs for the whole request on model `m` with the current free
    /// capacity, optionally only in one cluster. Best fit: the fullest node or
    /// shared GPU that still fits, so whole GPUs and big blocks stay free.
    fn find(&self, spec: &WorkloadSpec, m: u16, only: Option<u32>) -> Option<Plan> {
        let single = spec.replicas == 1 && !spec.allow_spread;
        if single {
            let ok = |node: u32| {
                self.node_ok(spec, node)
                    && only.is_none_or(|c| self.s.nodes[node as usize].cluster == c)
            };
            return self
                .find_on_nodes(spec.gpus_per_replica, m, ok)
                .map(|r| vec![r]);
        }
        let total_whole = if spec.gpus_per_replica.0 >= MILLI_PER_GPU {
            spec.gpus_per_replica.whole_gpus() * u64::from(spec.replicas)
        } else {
            0
        };
        // Best-fit cluster: the fewest free GPUs of the model that may fit.
        let mut clusters: Vec<(u32, u32)> = (0..self.s.clusters.len() as u32)
            .filter(|&c| self.cluster_ok(spec, c) && only.is_none_or(|o| o == c))
            .map(|c| (self.cluster_full[c as usize][m as usize], c))
            .filter(|&(full, _)| u64::from(full) >= total_whole)
            .collect();
        clusters.sort_unstable();
        for (_, c) in clusters {
            if let Some(p) = self.plan_in_cluster(spec, m, c, &|g| self.gpu_free[g as usize]) {
                return Some(p);
            }
        }
        None
    }

    /// One replica on one node (or one GPU for a fraction), best fit.
    fn find_on_nodes(
        &self,
        g: Milli,
        m: u16,
        ok: impl Fn(u32) -> bool,
    ) -> Option<Vec<(u32, GpuFree)>> {
        if g.0 < MILLI_PER_GPU {
            let need = g.0 as GpuFree;
            for &(_, gpu) in self.partial[m as usize].range((need, 0)..) {
                if ok(self.s.gpu_node[gpu as usize]) {
                    return Some(vec![(gpu, need)]);
                }
            }
            for &(_, node) in self.whole[m as usize].range((1, 0)..) {
                if ok(node) {
                    let n = &self.s.nodes[node as usize];
                    let gpu = (n.first_gpu..n.first_gpu + n.gpu_count)
                        .find(|&x| self.gpu_free[x as usize] == FULL_GPU)?;
                    return Some(vec![(gpu, need)]);
                }
            }
            return None;
        }
        let k = g.whole_gpus() as u32;
        for &(_, node) in self.whole[m as usize].range((k, 0)..) {
            if ok(node) {
                let n = &self.s.nodes[node as usize];
                let gpus: Vec<(u32, GpuFree)> = (n.first_gpu..n.first_gpu + n.gpu_count)
                    .filter(|&x| self.gpu_free[x as usize] == FULL_GPU)
                    .take(k as usize)
                    .map(|x| (x, FULL_GPU))
                    .collect();
                return Some(gpus);
            }
        }
        None
    }

    /// Plans every replica of a gang (or a spread workload) inside cluster `c`
    /// against the free array `free`, without changing anything.
    fn plan_in_cluster(
        &self,
        spec: &WorkloadSpec,
        m: u16,
        c: u32,
        free: &dyn Fn(u32) -> GpuFree,
    ) -> Option<Plan> {
        let mut free_local: BTreeMap<u32, GpuFree> = BTreeMap::new();
        let get =
            |fl: &BTreeMap<u32, GpuFree>, g: u32| fl.get(&g).copied().unwrap_or_else(|| free(g));
        let nodes: Vec<u32> = self.s.clusters[c as usize]
            .nodes
            .iter()
            .copied()
            .filter(|&n| self.s.nodes[n as usize].model == m)
            .collect();
        let g = spec.gpus_per_replica;
        let mut plan = Vec::with_capacity(spec.replicas as usize);
        for _ in 0..spec.replicas {
            let mut shards = Vec::new();
            if g.0 < MILLI_PER_GPU {
                let need = g.0 as GpuFree;
                // Shared GPUs first (best fit), then a fully free one.
                let mut best: Option<(GpuFree, u32)> = None;
                for &n in &nodes {
                    let nr = &self.s.nodes[n as usize];
                    for x in nr.first_gpu..nr.first_gpu + nr.gpu_count {
                        let f = get(&free_local, x);
                        if f >= need {
                            let key = (if f == FULL_GPU { FULL_GPU + 1 } else { f }, x);
                            if best.is_none_or(|b| key < b) {
                                best = Some(key);
                            }
                        }
                    }
                }
                let (_, x) = best?;
                free_local.insert(x, get(&free_local, x) - need);
                shards.push((x, need));
            } else {
                let k = g.whole_gpus() as usize;
                let full_on = |fl: &BTreeMap<u32, GpuFree>, n: u32| {
                    let nr = &self.s.nodes[n as usize];
                    (nr.first_gpu..nr.first_gpu + nr.gpu_count)
                        .filter(|&x| get(fl, x) == FULL_GPU)
                        .collect::<Vec<u32>>()
                };
                // Best-fit node holding the whole replica.
                let mut best: Option<(usize, u32)> = None;
                for &n in &nodes {
                    let cnt = full_on(&free_local, n).len();
                    if cnt >= k && best.is_none_or(|b| (cnt, n) < b) {
                        best = Some((cnt, n));
                    }
                }
                if let Some((_, n)) = best {
                    for x in full_on(&free_local, n).into_iter().take(k) {
                        free_local.insert(x, 0);
                        shards.push((x, FULL_GPU));
                    }
                } else if spec.allow_spread {
                    // Largest blocks first, so the replica spans as few nodes as possible.
                    let mut by_size: Vec<(Reverse<usize>, u32)> = nodes
                        .iter()
                        .map(|&n| (Reverse(full_on(&free_local, n).len()), n))
                        .filter(|(Reverse(c), _)| *c > 0)
                        .collect();
                    by_size.sort_unstable();
                    let mut left = k;
                    for (_, n) in by_size {
                        for x in full_on(&free_local, n) {
                            if left == 0 {
                                break;
                            }
                            free_local.insert(x, 0);
                            shards.push((x, FULL_GPU));
                            left -= 1;
                        }
                    }
                    if left > 0 {
                        return None;
                    }
                } else {
                    return None;
                }
            }
            plan.push(shards);
        }
        Some(plan)
    }

    /// The reason a request found no room, with the largest free block.
    fn explain_capacity(
        &self,
        spec: &WorkloadSpec,
        models: &[(u16, u16)],
        idle_only: bool,
    ) -> PendingReason {
        let single = spec.replicas == 1 && !spec.allow_spread;
        let g = spec.gpus_per_replica;
        let model_names: Vec<&str> = models
            .iter()
            .map(|&(m, _)| self.s.models[m as usize].as_str())
            .collect();
        let model_txt = model_names.join("|");
        let any_cluster = (0..self.s.clusters.len() as u32).any(|c| {
            self.cluster_ok(spec, c)
                && self.s.clusters[c as usize].nodes.iter().any(|&n| {
                    models
                        .iter()
                        .any(|&(m, _)| self.s.nodes[n as usize].model == m)
                })
        });
        if !any_cluster {
            return PendingReason::NoMatchingCluster {
                gpu_model: spec.gpu_model.clone(),
                regions: spec.regions.clone(),
            };
        }
        if single {
            let need = if g.0 < MILLI_PER_GPU {
                format!("{g} of one {model_txt} GPU")
            } else {
                format!("{g} {model_txt} on one node")
            };
            let largest_node = models
                .iter()
                .map(|&(m, _)| self.s.largest_node[m as usize])
                .max()
                .unwrap_or(0);
            if g.whole_gpus() > u64::from(largest_node) {
                return PendingReason::NeverFits {
                    need,
                    largest: format!("a node of {largest_node}"),
                };
            }
            // Largest free block on an allowed node.
            let mut best: (Milli, Option<String>) = (Milli::ZERO, None);
            for &(m, _) in models {
                for &(_, gpu) in self.partial[m as usize].iter().rev() {
                    let node = self.s.gpu_node[gpu as usize];
                    if self.node_ok(spec, node) {
                        let f = Milli(u64::from(self.gpu_free[gpu as usize]));
                        if f > best.0 {
                            best = (f, Some(self.where_node(node)));
                        }
                        break;
                    }
                }
                for &(full, node) in self.whole[m as usize].iter().rev() {
                    if self.node_ok(spec, node) {
                        let f = Milli::gpus(u64::from(full));
                        if f > best.0 {
                            best = (f, Some(self.where_node(node)));
                        }
                        break;
                    }
                }
            }
            return PendingReason::NoFreeCapacity {
                need,
                largest_free: best.0,
                largest_free_at: best.1,
                idle_only,
            };
        }
        let need = if spec.replicas > 1 {
            format!(
                "a gang of {}×{g} {model_txt} in one cluster{}",
                spec.replicas,
                if spec.allow_spread {
                    ""
                } else {
                    ", each replica on one node"
                }
            )
        } else {
            format!("{g} {model_txt} in one cluster")
        };
        let mut best: (u32, Option<String>) = (0, None);
        let mut biggest_cluster = 0u64;
        for c in 0..self.s.clusters.len() as u32 {
            if !self.cluster_ok(spec, c) {
                continue;
            }
            let mut size = 0u64;
            for &(m, _) in models {
                let full = self.cluster_full[c as usize][m as usize];
                if full > best.0 {
                    best = (full, Some(self.s.clusters[c as usize].name.clone()));
                }
                size += self.s.clusters[c as usize]
                    .nodes
                    .iter()
                    .filter(|&&n| self.s.nodes[n as usize].model == m)
                    .map(|&n| u64::from(self.s.nodes[n as usize].gpu_count))
                    .sum::<u64>();
            }
            biggest_cluster = biggest_cluster.max(size);
        }
        if spec.total_gpus().0 > biggest_cluster * MILLI_PER_GPU {
            return PendingReason::NeverFits {
                need,
                largest: format!("a cluster of {biggest_cluster} GPUs"),
            };
        }
        PendingReason::NoFreeCapacity {
            need,
            largest_free: Milli::gpus(u64::from(best.0)),
            largest_free_at: best.1,
            idle_only,
        }
    }

    fn where_node(&self, node: u32) -> String {
        let n = &self.s.nodes[node as usize];
        format!(
            "{}/{}",
            self.s.clusters[n.cluster as usize].name, self.s.node_names[node as usize]
        )
    }

    /// The cheapest set of running workloads whose eviction lets `spec` fit:
    /// never unpreemptible classes (production); only classes this one may
    /// preempt, except to reclaim this team's guarantee from borrowers;
    /// borrowers above their guarantee first; then lowest priority; most
    /// recently started first among equals. Returns (model, slot, cluster, victims).
    #[allow(clippy::type_complexity)]
    fn find_victims(
        &self,
        spec: &WorkloadSpec,
        team: u32,
        class: u16,
        models: &[(u16, u16)],
    ) -> Option<(u16, u16, u32, Vec<(WorkloadId, PreemptReason)>)> {
        let single = spec.replicas == 1 && !spec.allow_spread;
        // (cost, model, slot, cluster, victims)
        type Best = (
            (usize, i32, usize, u64),
            u16,
            u16,
            u32,
            Vec<(WorkloadId, PreemptReason)>,
        );
        let mut best: Option<Best> = None;
        'models: for &(m, slot) in models {
            let info = &self.s.teams[team as usize];
            let (qclass, guaranteed, _) = &info.slots[slot as usize];
            let reclaim =
                self.usage[team as usize][slot as usize] + spec.total_gpus() <= *guaranteed;
            // Scopes: single nodes, or whole clusters for gangs and spread work.
            // Built lazily: the scan often stops at the first ideal scope.
            let scopes: Box<dyn Iterator<Item = (u32, Vec<u32>)> + '_> = if single {
                Box::new(
                    self.s
                        .nodes
                        .iter()
                        .enumerate()
                        .filter(move |(i, n)| n.model == m && self.node_ok(spec, *i as u32))
                        .map(|(i, n)| (n.cluster, vec![i as u32])),
                )
            } else {
                Box::new(
                    (0..self.s.clusters.len() as u32)
                        .filter(move |&c| self.cluster_ok(spec, c))
                        .map(move |c| {
                            let ns = self.s.clusters[c as usize]
                                .nodes
                                .iter()
                                .copied()
                                .filter(|&n| self.s.nodes[n as usize].model == m)
                                .collect();
                            (c, ns)
                        }),
                )
            };
            for (cluster, nodes) in scopes {
                // Candidate victims in this scope, cheapest first.
                let mut cands: Vec<(bool, i32, Reverse<u64>, Reverse<WorkloadId>)> = Vec::new();
                let mut seen = BTreeSet::new();
                for &n in &nodes {
                    for &v in &self.s.node_running[n as usize] {
                        if self.preempted.contains(&v) || !seen.insert(v) {
                            continue;
                        }
                        let r = &self.s.running[&v];
                        let vc = &self.s.classes[r.class as usize];
                        if !vc.is_preemptible() {
                            continue; // production is never preempted
                        }
                        let by_priority = (vc.preemptible_by >> (class % 64)) & 1 == 1;
                        let borrower = self.is_borrower(r.team, r.slot, Milli::ZERO);
                        let by_reclaim = reclaim && r.team != team && borrower;
                        if by_priority || by_reclaim {
                            cands.push((!borrower, vc.value, Reverse(r.start_time_ms), Reverse(v)));
                        }
                    }
                }
                if cands.is_empty() {
                    continue;
                }
                cands.sort_unstable();
                // Greedy in cost order over `order`. Returns the free overlay
                // and victims once the request fits, and the victims refused
                // because their team would drop below its guarantee.
                #[allow(clippy::type_complexity)]
                let pick = |order: &[WorkloadId]| -> (
                    Option<(BTreeMap<u32, GpuFree>, Vec<(WorkloadId, PreemptReason)>)>,
                    Vec<WorkloadId>,
                ) {
                    // Free GPUs after evicting the chosen victims: an overlay on
                    // the cycle's free array, so a scope costs what it touches.
                    let mut free: BTreeMap<u32, GpuFree> = BTreeMap::new();
                    let mut chosen: Vec<(WorkloadId, PreemptReason)> = Vec::new();
                    let mut removed: BTreeMap<(u32, u16), Milli> = BTreeMap::new();
                    let mut refused = Vec::new();
                    for &v in order {
                        if chosen.len() >= MAX_VICTIMS_PER_PREEMPTION {
                            break;
                        }
                        let r = &self.s.running[&v];
                        let vc = &self.s.classes[r.class as usize];
                        let by_priority = (vc.preemptible_by >> (class % 64)) & 1 == 1;
                        let already = removed.get(&(r.team, r.slot)).copied().unwrap_or_default();
                        // A reclaim never takes a borrower below its own guarantee.
                        let reclaim_ok = reclaim
                            && r.team != team
                            && self.is_borrower(r.team, r.slot, already + r.spec.total_gpus());
                        let why = if by_priority {
                            PreemptReason::Priority {
                                victim_class: vc.name.clone(),
                                preemptor_class: self.s.classes[class as usize].name.clone(),
                            }
                        } else if reclaim_ok {
                            PreemptReason::QuotaReclaim {
                                victim_team: self.s.teams[r.team as usize].name.clone(),
                                preemptor_team: info.name.clone(),
                                gpu_class: qclass.clone(),
                                guaranteed: *guaranteed,
                            }
                        } else {
                            refused.push(v);
                            continue;
                        };
                        for &(g, mm) in &r.gpus {
                            *free.entry(g).or_insert(self.gpu_free[g as usize]) += mm;
                        }
                        *removed.entry((r.team, r.slot)).or_default() += r.spec.total_gpus();
                        chosen.push((v, why));
                        if self.fits_in(spec, m, cluster, &nodes, &free) {
                            return (Some((free, chosen)), refused);
                        }
                    }
                    (None, refused)
                };
                let order: Vec<WorkloadId> = cands.iter().map(|c| c.3.0).collect();
                let (mut found, refused) = pick(&order);
                // Cheaper picks of a team may free nothing this request can
                // use and still spend that team's room above its guarantee,
                // so a victim that would help is refused: retry with it first.
                for &first in refused.iter().take(MAX_RECLAIM_RETRIES) {
                    if found.is_some() {
                        break;
                    }
                    let mut o = Vec::with_capacity(order.len());
                    o.push(first);
                    o.extend(order.iter().copied().filter(|&v| v != first));
                    found = pick(&o).0;
                }
                let Some((mut free, mut chosen)) = found else {
                    continue;
                };
                // Drop victims that turned out unnecessary, newest choice last.
                let mut i = chosen.len();
                while i > 0 {
                    i -= 1;
                    let v = chosen[i].0;
                    let r = &self.s.running[&v];
                    for &(g, mm) in &r.gpus {
                        *free.entry(g).or_insert(self.gpu_free[g as usize]) -= mm;
                    }
                    if self.fits_in(spec, m, cluster, &nodes, &free) {
                        chosen.remove(i);
                    } else {
                        for &(g, mm) in &r.gpus {
                            *free.entry(g).or_insert(self.gpu_free[g as usize]) += mm;
                        }
                    }
                }
                let non_borrowers = chosen
                    .iter()
                    .filter(|(v, _)| {
                        let r = &self.s.running[v];
                        !self.is_borrower(r.team, r.slot, Milli::ZERO)
                    })
                    .count();
                let max_prio = chosen
                    .iter()
                    .map(|(v, _)| self.s.classes[self.s.running[v].class as usize].value)
                    .max()
                    .unwrap_or(i32::MIN);
                let gpus: u64 = chosen
                    .iter()
                    .map(|(v, _)| self.s.running[v].spec.total_gpus().0)
                    .sum();
                let cost = (non_borrowers, max_prio, chosen.len(), gpus);
                // Nothing is cheaper than one borrower of the lowest class
                // holding exactly what is needed: stop scanning.
                let ideal = (non_borrowers == 0 || !self.borrowers_exist)
                    && chosen.len() == 1
                    && max_prio == self.lowest_class_value
                    && gpus == spec.total_gpus().0;
                if best.as_ref().is_none_or(|b| cost < b.0) {
                    best = Some((cost, m, slot, cluster, chosen));
                }
                if ideal {
                    break 'models;
                }
            }
        }
        best.map(|(_, m, slot, c, v)| (m, slot, c, v))
    }

    /// Is `team` above its guarantee on `slot` even after giving up `minus`?
    fn is_borrower(&self, team: u32, slot: u16, minus: Milli) -> bool {
        let used = self.usage[team as usize][slot as usize];
        let g = self.s.teams[team as usize].slots[slot as usize].1;
        if minus == Milli::ZERO {
            used > g
        } else {
            used.0 >= minus.0 && Milli(used.0 - minus.0) >= g
        }
    }

    /// Would `spec` fit in the scope with free array `free`?
    fn fits_in(
        &self,
        spec: &WorkloadSpec,
        m: u16,
        cluster: u32,
        nodes: &[u32],
        overlay: &BTreeMap<u32, GpuFree>,
    ) -> bool {
        let free = |g: u32| {
            overlay
                .get(&g)
                .copied()
                .unwrap_or(self.gpu_free[g as usize])
        };
        if spec.replicas == 1 && !spec.allow_spread {
            let g = spec.gpus_per_replica;
            return nodes.iter().any(|&n| {
                let nr = &self.s.nodes[n as usize];
                let gpus = nr.first_gpu..nr.first_gpu + nr.gpu_count;
                if g.0 < MILLI_PER_GPU {
                    gpus.into_iter().any(|x| u64::from(free(x)) >= g.0)
                } else {
                    gpus.into_iter().filter(|&x| free(x) == FULL_GPU).count() as u64
                        >= g.whole_gpus()
                }
            });
        }
        self.plan_in_cluster(spec, m, cluster, &free).is_some()
    }
}
