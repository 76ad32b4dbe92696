//! Preemption: the cheapest set of running workloads whose eviction lets a
//! request fit, under the rules of DESIGN.md invariant 3.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use axle_policy::Milli;

use super::MAX_RECLAIM_RETRIES;
use super::MAX_VICTIMS_PER_PREEMPTION;
use super::work::Work;
use crate::state::GpuFree;
use crate::types::{PreemptReason, WorkloadId, WorkloadSpec};

impl<'s> Work<'s> {
    /// Could a workload of this team and class make room by preempting?
    pub(super) fn may_preempt(&self, team: u32, class: u16) -> bool {
        let c = &self.s.cat.classes[class as usize];
        if c.idle_only {
            return false;
        }
        let by_priority = self.s.cat.classes.iter().enumerate().any(|(v, vc)| {
            (vc.preemptible_by >> (class % 64)) & 1 == 1 && self.s.running_per_class[v] > 0
        });
        if by_priority {
            return true;
        }
        let info = &self.s.cat.teams[team as usize];
        let usage = &self.usage[team as usize];
        info.slots
            .iter()
            .enumerate()
            .any(|(i, (_, g, _))| usage[i] < *g)
    }

    /// The cheapest set of running workloads whose eviction lets `spec` fit:
    /// never unpreemptible classes (production); only classes this one may
    /// preempt, except to reclaim this team's guarantee from borrowers;
    /// borrowers above their guarantee first; then lowest priority; most
    /// recently started first among equals. Returns (model, slot, cluster, victims).
    #[allow(clippy::type_complexity)]
    pub(super) fn find_victims(
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
            let info = &self.s.cat.teams[team as usize];
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
                        let vc = &self.s.cat.classes[r.class as usize];
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
                        let vc = &self.s.cat.classes[r.class as usize];
                        let by_priority = (vc.preemptible_by >> (class % 64)) & 1 == 1;
                        let already = removed.get(&(r.team, r.slot)).copied().unwrap_or_default();
                        // A reclaim never takes a borrower below its own guarantee.
                        let reclaim_ok = reclaim
                            && r.team != team
                            && self.is_borrower(r.team, r.slot, already + r.spec.total_gpus());
                        let why = if by_priority {
                            PreemptReason::Priority {
                                victim_class: vc.name.clone(),
                                preemptor_class: self.s.cat.classes[class as usize].name.clone(),
                            }
                        } else if reclaim_ok {
                            PreemptReason::QuotaReclaim {
                                victim_team: self.s.cat.teams[r.team as usize].name.clone(),
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
                    .map(|(v, _)| self.s.cat.classes[self.s.running[v].class as usize].value)
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
}
