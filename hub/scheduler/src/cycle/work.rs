//! The working copy of capacity and usage one cycle decides on: free
//! milli-GPUs per GPU with indices for best fit, per-team usage, and the
//! victims already chosen. Placements and evictions update every index.

use std::collections::BTreeSet;

use axle_policy::Milli;

use crate::state::{FULL_GPU, GpuFree, State};
use crate::types::{Allocation, Decisions, Placement, Shard, WorkloadId, WorkloadSpec};

/// Per model: (end ms, milli-GPUs freed by then in all, what the first
/// expected end so far rests on), soonest first.
pub(super) type Freeing = Vec<Vec<(u64, u64, Option<String>)>>;

/// A candidate plan: global GPU index and milli per shard, per replica.
pub(super) type Plan = Vec<Vec<(u32, GpuFree)>>;

/// The mutable copy of capacity and usage a cycle works on.
pub(super) struct Work<'s> {
    pub(super) s: &'s State,
    pub(super) gpu_free: Vec<GpuFree>,
    pub(super) node_full: Vec<u32>,
    /// Per model: (fully free GPUs, node) for schedulable nodes with at
    /// least one; nodes that take only fractions are never here.
    pub(super) whole: Vec<BTreeSet<(u32, u32)>>,
    /// Per model: (free milli, gpu) for schedulable GPUs that are partly
    /// used, and every GPU with room of a node that takes only fractions.
    pub(super) partial: Vec<BTreeSet<(GpuFree, u32)>>,
    /// Per model: (share, gpu) of every free fractional unit (MIG device,
    /// time-sliced replica) of a schedulable node: smallest first.
    pub(super) units: Vec<BTreeSet<(GpuFree, u32)>>,
    /// [cluster][model] fully free GPUs (that may take whole requests).
    pub(super) cluster_full: Vec<Vec<u32>>,
    /// [cluster][model] free milli-GPUs and capacity of schedulable
    /// clusters, for explanations (summing them per request walked every
    /// GPU of the fleet).
    pub(super) cluster_free: Vec<Vec<u64>>,
    pub(super) cluster_cap: Vec<Vec<u64>>,
    /// Per cluster: does any node of it run work (at cycle start)?
    pub(super) cluster_runs: Vec<bool>,
    pub(super) global_free: u64,
    /// Per model: free milli-GPUs on schedulable nodes (`global_free` by
    /// model), for start estimates.
    pub(super) model_free: Vec<u64>,
    pub(super) usage: Vec<Vec<Milli>>,
    /// Usage of never-preempted classes (see `State::usage_fixed`).
    pub(super) usage_fixed: Vec<Vec<Milli>>,
    pub(super) preempted: BTreeSet<WorkloadId>,
    pub(super) lowest_class_value: i32,
    /// Does any team run above its guarantee (at cycle start)?
    pub(super) borrowers_exist: bool,
    pub(super) explain: bool,
    /// The cycle's clock, for the work a preemption would lose.
    pub(super) now_ms: u64,
    /// What running work frees and when, for queue-aware start estimates
    /// (built on first use).
    pub(super) freeing: std::cell::OnceCell<Freeing>,
    /// Victim search order over nodes (built on first use).
    pub(super) node_bounds: std::cell::OnceCell<NodeBounds>,
    /// `never_fits` per request shape (and whether it names an image).
    pub(super) never_fits_memo: std::collections::BTreeMap<
        (super::memo::ShapeKey<'s>, bool),
        Option<crate::types::PendingReason>,
    >,
    /// Does any cluster belong to one team (then `never_fits` depends on
    /// the team)?
    pub(super) owned_clusters: bool,
    /// Per team: does it run above its guarantee in any quota class?
    pub(super) borrowing: Vec<bool>,
    /// Milli-GPUs used by every team together, and used above guarantees.
    pub(super) total_used: u64,
    pub(super) total_borrowed: u64,
    /// Running workloads of the teams that borrow (at cycle start, counted
    /// by the teams' current borrowing): the victims a search may draw on.
    pub(super) borrower_running: usize,
}

/// Per node, the lowest (class value, work lost) of the preemptible work
/// running on it at cycle start: no victim set on the node can have a
/// lower highest priority, nor at that priority lose less. And the nodes
/// that hold any, lowest bound first (ties by index), for a search that
/// visits the most promising nodes first and stops once no node left can
/// beat what it found.
pub(super) struct NodeBounds {
    pub bound: Vec<(i32, u128)>,
    pub order: Vec<u32>,
}

impl<'s> Work<'s> {
    pub(super) fn new(s: &'s State, explain: bool, now_ms: u64) -> Work<'s> {
        let models = s.cat.models.len();
        let mut w = Work {
            s,
            gpu_free: s.gpu_free.clone(),
            node_full: vec![0; s.nodes.len()],
            whole: vec![BTreeSet::new(); models],
            partial: vec![BTreeSet::new(); models],
            units: vec![BTreeSet::new(); models],
            cluster_full: vec![vec![0; models]; s.clusters.len()],
            cluster_free: vec![vec![0; models]; s.clusters.len()],
            cluster_cap: vec![vec![0; models]; s.clusters.len()],
            cluster_runs: vec![false; s.clusters.len()],
            global_free: 0,
            model_free: vec![0; models],
            usage: s.usage.clone(),
            usage_fixed: s.usage_fixed.clone(),
            preempted: BTreeSet::new(),
            lowest_class_value: s.cat.classes.iter().map(|c| c.value).min().unwrap_or(0),
            explain,
            now_ms,
            freeing: std::cell::OnceCell::new(),
            node_bounds: std::cell::OnceCell::new(),
            never_fits_memo: std::collections::BTreeMap::new(),
            owned_clusters: s.clusters.iter().any(|c| c.owner_team.is_some()),
            borrowing: vec![false; s.cat.teams.len()],
            total_used: 0,
            total_borrowed: 0,
            borrower_running: 0,
            borrowers_exist: s.cat.teams.iter().enumerate().any(|(t, info)| {
                info.slots
                    .iter()
                    .enumerate()
                    .any(|(i, slot)| s.usage[t][i] > slot.1)
            }),
        };
        for t in 0..s.cat.teams.len() as u32 {
            w.count_team(t, true);
        }
        for (ni, n) in s.nodes.iter().enumerate() {
            let sched = s.clusters[n.cluster as usize].schedulable;
            let mut full = 0;
            for g in n.first_gpu..n.first_gpu + n.gpu_count {
                let f = w.gpu_free[g as usize];
                if s.gpu_fit[g as usize] > 0 {
                    if f == s.gpu_cap[g as usize] && sched {
                        w.units[n.model as usize].insert((f, g));
                    }
                } else if n.fractions_only {
                    if f > 0 && sched {
                        w.partial[n.model as usize].insert((f, g));
                    }
                } else if f == FULL_GPU {
                    full += 1;
                } else if f > 0 && sched {
                    w.partial[n.model as usize].insert((f, g));
                }
                if sched {
                    w.global_free += u64::from(f);
                    w.model_free[n.model as usize] += u64::from(f);
                    w.cluster_free[n.cluster as usize][n.model as usize] += u64::from(f);
                    w.cluster_cap[n.cluster as usize][n.model as usize] +=
                        u64::from(s.gpu_cap[g as usize]);
                }
            }
            if !s.node_running[ni].is_empty() {
                w.cluster_runs[n.cluster as usize] = true;
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

    /// The victim search order (see [`NodeBounds`]): one pass over the
    /// running work, once per cycle. Victims chosen later in the cycle only
    /// leave their nodes, so the bounds stay lower bounds.
    pub(super) fn node_bounds(&self) -> &NodeBounds {
        self.node_bounds.get_or_init(|| {
            let none = (i32::MAX, u128::MAX);
            let mut bound = vec![none; self.s.nodes.len()];
            for f in &self.s.victim_facts {
                let vc = &self.s.cat.classes[f.class as usize];
                if !vc.is_preemptible() {
                    continue;
                }
                let b = (vc.value, f.lost_now(self.now_ms));
                if let Some(n) = f.only_node {
                    let n = n as usize;
                    if b < bound[n] {
                        bound[n] = b;
                    }
                    continue;
                }
                for &(g, _) in &self.s.running[&f.id].gpus {
                    let n = self.s.gpu_node[g as usize] as usize;
                    if b < bound[n] {
                        bound[n] = b;
                    }
                }
            }
            let mut order: Vec<u32> = (0..self.s.nodes.len() as u32)
                .filter(|&n| bound[n as usize] != none)
                .collect();
            order.sort_unstable_by_key(|&n| (bound[n as usize], n));
            NodeBounds { bound, order }
        })
    }

    /// (used, used above guarantee, borrows at all) of team `t`.
    pub(super) fn team_totals(&self, t: u32) -> (u64, u64, bool) {
        let info = &self.s.cat.teams[t as usize];
        let usage = &self.usage[t as usize];
        let mut out = (0, 0, false);
        for (i, slot) in info.slots.iter().enumerate() {
            out.0 += usage[i].0;
            out.1 += usage[i].0.saturating_sub(slot.1.0);
            out.2 |= usage[i] > slot.1;
        }
        out
    }

    /// Adds (`add`) or removes team `t`'s share of the fleet-wide totals.
    fn count_team(&mut self, t: u32, add: bool) {
        let (used, borrowed, borrows) = self.team_totals(t);
        let running = self.s.team_running[t as usize].len();
        if add {
            self.total_used += used;
            self.total_borrowed += borrowed;
            self.borrowing[t as usize] = borrows;
            if borrows {
                self.borrower_running += running;
            }
        } else {
            self.total_used -= used;
            self.total_borrowed -= borrowed;
            if self.borrowing[t as usize] {
                self.borrower_running -= running;
            }
        }
    }

    pub(super) fn schedulable_gpu(&self, g: u32) -> (u32, bool) {
        let node = self.s.gpu_node[g as usize];
        let c = self.s.nodes[node as usize].cluster;
        (node, self.s.clusters[c as usize].schedulable)
    }

    /// Changes the free amount of GPU `g` by `delta` and keeps every index true.
    pub(super) fn adjust(&mut self, g: u32, new_free: GpuFree) {
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
        self.model_free[model] = self.model_free[model] + u64::from(new_free) - u64::from(old);
        let cf = &mut self.cluster_free[n.cluster as usize][model];
        *cf = *cf + u64::from(new_free) - u64::from(old);
        let cap = self.s.gpu_cap[g as usize];
        if self.s.gpu_fit[g as usize] > 0 {
            if old == cap {
                self.units[model].remove(&(old, g));
            }
            if new_free == cap {
                self.units[model].insert((new_free, g));
            }
            return;
        }
        if n.fractions_only {
            if old > 0 {
                self.partial[model].remove(&(old, g));
            }
            if new_free > 0 {
                self.partial[model].insert((new_free, g));
            }
            return;
        }
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

    pub(super) fn cluster_ok(&self, spec: &WorkloadSpec, cluster: u32) -> bool {
        let c = &self.s.clusters[cluster as usize];
        self.cluster_ok_but_image(spec, cluster) && (spec.has_image || !c.needs_image)
    }

    /// [`Work::cluster_ok`] as if the workload named an image.
    pub(super) fn cluster_ok_but_image(&self, spec: &WorkloadSpec, cluster: u32) -> bool {
        let c = &self.s.clusters[cluster as usize];
        c.schedulable
            && (spec.regions.is_empty() || spec.regions.contains(&c.region))
            && c.owner_team.as_deref().is_none_or(|t| t == spec.team)
    }

    pub(super) fn node_ok(&self, spec: &WorkloadSpec, node: u32) -> bool {
        self.cluster_ok(spec, self.s.nodes[node as usize].cluster)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn commit(
        &mut self,
        spec: &WorkloadSpec,
        team: u32,
        slot: u16,
        class: u16,
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
                        self.adjust(g, self.gpu_free[g as usize] - self.s.taken(g, m));
                        Shard {
                            node: n.local,
                            gpu: g - n.first_gpu,
                            milli: Milli(u64::from(m)),
                        }
                    })
                    .collect()
            })
            .collect();
        self.count_team(team, false);
        self.usage[team as usize][slot as usize] += spec.total_gpus();
        self.count_team(team, true);
        if !self.s.cat.classes[class as usize].is_preemptible() {
            self.usage_fixed[team as usize][slot as usize] += spec.total_gpus();
        }
        out.placements.push(Placement {
            workload: spec.id,
            allocation: Allocation { cluster, replicas },
            after_preempting,
        });
    }

    pub(super) fn evict(&mut self, v: WorkloadId) {
        let r = &self.s.running[&v];
        for &(g, m) in &r.gpus {
            self.adjust(g, self.gpu_free[g as usize] + m);
        }
        self.count_team(r.team, false);
        let u = &mut self.usage[r.team as usize][r.slot as usize];
        *u = u.saturating_sub(r.spec.total_gpus());
        self.count_team(r.team, true);
        self.preempted.insert(v);
    }
}

#[cfg(test)]
mod tests {
    use axle_policy::CrossTeamPreemption::BorrowedOnly;

    use super::*;
    use crate::testkit::{inventory, policy, req, run};

    #[test]
    fn adjust_commit_and_evict_keep_every_index_true() {
        let p = policy(&[("a", &[("H100", 0.0, 8.0)])], BorrowedOnly);
        let mut s = State::new(p, &inventory(&[("H100", 4)]));
        run(&mut s, req(1, "a", "training", 1.0), 0, &[0], 0);
        let mut w = Work::new(&s, true, 0);
        let m = 0usize;
        assert_eq!(w.global_free, 3000);
        assert_eq!(w.cluster_full[0][m], 3);
        assert!(w.whole[m].contains(&(3, 0)));
        // Half of GPU 1: it leaves the whole index and enters the partial one.
        w.adjust(1, 500);
        assert_eq!(w.cluster_full[0][m], 2);
        assert!(w.whole[m].contains(&(2, 0)));
        assert!(w.partial[m].contains(&(500, 1)));
        assert_eq!(w.global_free, 2500);
        assert_eq!(w.model_free[m], 2500);
        assert_eq!(w.cluster_free[0][m], 2500);
        assert_eq!(w.cluster_cap[0][m], 4000);
        assert!(w.cluster_runs[0]);
        // Evicting workload 1 frees GPU 0 and its team's usage.
        w.evict(1);
        assert_eq!(w.cluster_full[0][m], 3);
        assert_eq!(w.cluster_free[0][m], 3500);
        assert_eq!(w.usage[0][0], Milli::ZERO);
        assert!(w.preempted.contains(&1));
    }
}
