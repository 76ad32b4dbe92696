//! The simulator's own check of the promise a guarantee makes: a workload
//! that fits its team's guarantee does not wait while other teams hold
//! borrowed GPUs it could run on. It is computed from the simulator's
//! bookkeeping (each job's original team, the policy's guarantees, where
//! every job runs), not from the scheduler's internals, so it measures every
//! mode the same way — the baselines that ignore guarantees included.
//!
//! After each cycle, for every team below its guarantee, its oldest pending
//! job that fits the rest of the guarantee is *owed*. It is a violation when
//! some node (a cluster, for gangs and jobs that may spread) would hold it
//! once the GPUs of other teams' preemptible jobs were freed, taking from
//! each such team no more than it runs above its own guarantee. Preemption
//! is instant in the simulator, so "within one grace period" is "within the
//! same cycle". Each job counts at most once.

use std::collections::{BTreeMap, BTreeSet};

use axle_policy::{MILLI_PER_GPU, Milli, Policy};
use axle_scheduler::{State, WorkloadSpec};

use crate::replay::SimJob;

/// What the check sees of a fleet: where every running job holds GPUs and
/// how much of each GPU is taken. Axle's `State` and the textbook
/// baselines' own fleet both answer it, so every mode is measured alike.
pub(crate) trait Fleet {
    /// Calls `each(job, cluster, node, gpu, milli)` for every shard.
    fn running_shards(&self, each: &mut dyn FnMut(usize, u32, u32, u32, u64));
    fn cluster_count(&self) -> u32;
    fn node_count(&self, cluster: u32) -> u32;
    fn gpu_model_of(&self, cluster: u32, node: u32) -> &str;
    /// Milli-GPUs taken on each GPU of the node.
    fn node_used(&self, cluster: u32, node: u32) -> Vec<u64>;
}

impl Fleet for State {
    fn running_shards(&self, each: &mut dyn FnMut(usize, u32, u32, u32, u64)) {
        for r in self.running() {
            for sh in r.allocation.shards() {
                each(
                    r.spec.id as usize,
                    r.allocation.cluster,
                    sh.node,
                    sh.gpu,
                    sh.milli.0,
                );
            }
        }
    }
    fn cluster_count(&self) -> u32 {
        State::cluster_count(self)
    }
    fn node_count(&self, cluster: u32) -> u32 {
        State::node_count(self, cluster)
    }
    fn gpu_model_of(&self, cluster: u32, node: u32) -> &str {
        State::gpu_model_of(self, cluster, node)
    }
    fn node_used(&self, cluster: u32, node: u32) -> Vec<u64> {
        self.node_allocated(cluster, node)
            .into_iter()
            .map(|m| m.0)
            .collect()
    }
}

/// The shape of one job, as the check needs it.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    pub team: String,
    pub priority_class: String,
    pub gpus_per_replica: Milli,
    pub replicas: u32,
    pub allow_spread: bool,
    pub gpu_model: Option<String>,
}

impl Shape {
    fn total(&self) -> Milli {
        Milli(self.gpus_per_replica.0 * u64::from(self.replicas.max(1)))
    }
}

impl From<&WorkloadSpec> for Shape {
    fn from(s: &WorkloadSpec) -> Shape {
        Shape {
            team: s.team.clone(),
            priority_class: s.priority_class.clone(),
            gpus_per_replica: s.gpus_per_replica,
            replicas: s.replicas,
            allow_spread: s.allow_spread,
            gpu_model: s.gpu_model.clone(),
        }
    }
}

impl From<&SimJob> for Shape {
    fn from(j: &SimJob) -> Shape {
        Shape {
            team: j.team.clone(),
            priority_class: j.priority_class.clone(),
            gpus_per_replica: j.gpus_per_replica,
            replicas: j.replicas,
            allow_spread: j.allow_spread,
            gpu_model: j.gpu_model.clone(),
        }
    }
}

/// One (team, quota class) the simulator accounts for.
#[derive(Debug, Clone)]
struct Slot {
    guaranteed: Milli,
    used: Milli,
    /// Pending jobs charged here: (submit ms, job index).
    pending: BTreeSet<(u64, usize)>,
}

/// Where each job is charged and whether it can be preempted at all.
#[derive(Debug, Clone, Copy)]
struct JobInfo {
    /// (team index, slot index); `None` when the job's quota class is
    /// ambiguous (no model named and several classes) or absent.
    slot: Option<(usize, usize)>,
    preemptible: bool,
}

/// (cluster, node, GPU) of the simulated fleet.
type GpuAt = (u32, u32, u32);
/// A job holding part of a GPU: (job index, milli on this GPU, job size).
type Holder = (usize, u64, Milli);

pub(crate) struct GuaranteeBook {
    team_slots: Vec<Vec<Slot>>,
    jobs: Vec<JobInfo>,
    shapes: Vec<Shape>,
    violated: Vec<bool>,
    pub violations_per_team: Vec<u64>,
    pub team_names: Vec<String>,
}

impl GuaranteeBook {
    /// `policy` is the policy as written (the guarantees promised), whatever
    /// the mode replays.
    pub fn of_jobs(policy: &Policy, jobs: &[SimJob], models: &[String]) -> GuaranteeBook {
        Self::new(policy, jobs.iter().map(Shape::from).collect(), models)
    }

    pub fn new(policy: &Policy, specs: Vec<Shape>, models: &[String]) -> GuaranteeBook {
        let team_names: Vec<String> = policy.teams.keys().cloned().collect();
        let team_slots: Vec<Vec<Slot>> = policy
            .teams
            .values()
            .map(|t| {
                t.quotas
                    .values()
                    .map(|q| Slot {
                        guaranteed: q.guaranteed,
                        used: Milli::ZERO,
                        pending: BTreeSet::new(),
                    })
                    .collect()
            })
            .collect();
        let jobs = specs
            .iter()
            .map(|s| {
                let slot = policy
                    .teams
                    .iter()
                    .enumerate()
                    .find(|(_, (name, _))| **name == s.team)
                    .and_then(|(ti, (_, t))| {
                        let class = match &s.gpu_model {
                            Some(m) => t.quota_class_for(m),
                            None if t.quotas.len() == 1 => {
                                t.quotas.keys().next().map(|k| k.as_str())
                            }
                            // Several classes and no model: which one is
                            // charged depends on where it lands.
                            None => models
                                .iter()
                                .filter_map(|m| t.quota_class_for(m))
                                .next()
                                .filter(|_| models.len() == 1),
                        }?;
                        let si = t.quotas.keys().position(|k| k == class)?;
                        Some((ti, si))
                    });
                let preemptible = policy
                    .priority_classes
                    .get(&s.priority_class)
                    .is_some_and(|c| c.is_preemptible());
                JobInfo { slot, preemptible }
            })
            .collect();
        GuaranteeBook {
            violations_per_team: vec![0; team_names.len()],
            team_names,
            team_slots,
            violated: vec![false; specs.len()],
            jobs,
            shapes: specs,
        }
    }

    fn slot_mut(&mut self, job: usize) -> Option<&mut Slot> {
        let (t, s) = self.jobs[job].slot?;
        Some(&mut self.team_slots[t][s])
    }

    pub fn pend(&mut self, job: usize, submit_ms: u64) {
        if let Some(s) = self.slot_mut(job) {
            s.pending.insert((submit_ms, job));
        }
    }

    pub fn unpend(&mut self, job: usize, submit_ms: u64) {
        if let Some(s) = self.slot_mut(job) {
            s.pending.remove(&(submit_ms, job));
        }
    }

    pub fn start(&mut self, job: usize, gpus: Milli) {
        if let Some(s) = self.slot_mut(job) {
            s.used += gpus;
        }
    }

    pub fn stop(&mut self, job: usize, gpus: Milli) {
        if let Some(s) = self.slot_mut(job) {
            s.used = s.used.saturating_sub(gpus);
        }
    }

    fn room_above_guarantee(&self, t: usize, s: usize) -> Milli {
        let slot = &self.team_slots[t][s];
        slot.used.saturating_sub(slot.guaranteed)
    }

    /// Violations found so far, per team of the written policy.
    pub fn violations_by_team(&self) -> BTreeMap<String, u64> {
        self.team_names
            .iter()
            .cloned()
            .zip(self.violations_per_team.iter().copied())
            .collect()
    }

    /// Checks every team's owed job against `state` (after a cycle) and
    /// returns how many new violations it found.
    pub fn check(&mut self, state: &dyn Fleet) -> u64 {
        let borrowed: Milli = (0..self.team_slots.len())
            .flat_map(|t| (0..self.team_slots[t].len()).map(move |s| (t, s)))
            .map(|(t, s)| self.room_above_guarantee(t, s))
            .sum();
        if borrowed == Milli::ZERO {
            return 0;
        }
        let mut owed: Vec<(usize, usize, usize)> = Vec::new();
        for (t, slots) in self.team_slots.iter().enumerate() {
            for (s, slot) in slots.iter().enumerate() {
                let Some(&(_, job)) = slot.pending.first() else {
                    continue;
                };
                if self.violated[job] {
                    continue;
                }
                let need = self.shapes[job].total();
                let borrowed_by_others = borrowed.saturating_sub(self.room_above_guarantee(t, s));
                if slot.used + need <= slot.guaranteed && borrowed_by_others > Milli::ZERO {
                    owed.push((t, s, job));
                }
            }
        }
        let mut found = 0;
        for (t, _, job) in owed {
            if self.fits_reclaiming(state, &self.shapes[job], t) {
                self.violated[job] = true;
                self.violations_per_team[t] += 1;
                found += 1;
            }
        }
        found
    }

    /// Would `spec` of team `t` fit once other teams' preemptible jobs gave
    /// back what they borrow?
    fn fits_reclaiming(&self, state: &dyn Fleet, spec: &Shape, t: usize) -> bool {
        // Per GPU (cluster, node, gpu): the jobs that may be evicted for it,
        // with their milli on that GPU and their whole size.
        let mut victims: BTreeMap<GpuAt, Vec<Holder>> = BTreeMap::new();
        state.running_shards(&mut |job, cluster, node, gpu, milli| {
            let info = self.jobs[job];
            let Some((vt, _)) = info.slot else { return };
            if vt == t || !info.preemptible {
                return;
            }
            victims.entry((cluster, node, gpu)).or_default().push((
                job,
                milli,
                self.shapes[job].total(),
            ));
        });
        let single = spec.replicas == 1 && !spec.allow_spread;
        let per_replica = spec.gpus_per_replica.0;
        // What one GPU must offer: a fraction's share, or all of it.
        let need_on_gpu = if single && per_replica < MILLI_PER_GPU {
            per_replica
        } else {
            MILLI_PER_GPU
        };
        let whole_needed = if single {
            spec.gpus_per_replica.whole_gpus().max(1)
        } else {
            u64::from(spec.replicas) * spec.gpus_per_replica.0.div_ceil(MILLI_PER_GPU)
        };
        for c in 0..state.cluster_count() {
            // Room each victim team may still give, and who is taken, for
            // one scope (a node, or the cluster).
            let mut room: BTreeMap<(usize, usize), Milli> = BTreeMap::new();
            let mut taken: BTreeSet<usize> = BTreeSet::new();
            let mut gpus_in_scope = 0u64;
            for n in 0..state.node_count(c) {
                if spec
                    .gpu_model
                    .as_deref()
                    .is_some_and(|m| m != state.gpu_model_of(c, n))
                {
                    continue;
                }
                if single {
                    room.clear();
                    taken.clear();
                    gpus_in_scope = 0;
                }
                for (g, used) in state.node_used(c, n).iter().enumerate() {
                    let mut offer = MILLI_PER_GPU - used;
                    let mut newly: Vec<(usize, (usize, usize), Milli)> = Vec::new();
                    let holders = victims
                        .get(&(c, n, g as u32))
                        .map(Vec::as_slice)
                        .unwrap_or(&[]);
                    for &(job, milli, size) in holders {
                        if offer >= need_on_gpu {
                            break;
                        }
                        if taken.contains(&job) {
                            offer += milli;
                            continue;
                        }
                        let key = self.jobs[job].slot.expect("victims have a slot");
                        let left = *room
                            .entry(key)
                            .or_insert_with(|| self.room_above_guarantee(key.0, key.1));
                        let pledged: Milli = newly.iter().filter(|x| x.1 == key).map(|x| x.2).sum();
                        if pledged + size <= left {
                            newly.push((job, key, size));
                            offer += milli;
                        }
                    }
                    if offer < need_on_gpu {
                        continue;
                    }
                    for (job, key, size) in newly {
                        taken.insert(job);
                        let e = room.entry(key).or_default();
                        *e = e.saturating_sub(size);
                    }
                    gpus_in_scope += 1;
                    if gpus_in_scope >= whole_needed {
                        return true;
                    }
                }
            }
        }
        false
    }
}
