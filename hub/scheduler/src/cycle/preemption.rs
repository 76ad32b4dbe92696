//! Preemption: the cheapest set of running workloads whose eviction lets a
//! request fit, under the preemption rules of ARCHITECTURE.md (invariant 3):
//!
//! - a class with an empty `preemptibleBy` (production) is never preempted;
//! - within a team, higher priority preempts lower priority as the victim
//!   class's `preemptibleBy` allows, also to make room under the team's own
//!   limit;
//! - across teams (`crossTeamPreemption: borrowedOnly`, the default), only
//!   capacity the victim's team borrows is taken: it runs above its
//!   guarantee in that quota class and stays at or above it after the
//!   eviction. Either by priority, or to give the preemptor's team back its
//!   own guarantee (reclaim, whatever the victim's priority). With `any`,
//!   priority may take any team's work; reclaim still takes only borrowers;
//! - borrowers go first, then the lowest priority, then the victim that
//!   loses the least work (a checkpointable workload loses only what it did
//!   since its last checkpoint), then the most recently started.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use axle_policy::Milli;

use super::quota::ModelChoice;
use super::work::Work;
use super::{MAX_RECLAIM_RETRIES, MAX_VICTIMS_PER_PREEMPTION};
use crate::state::{GpuFree, RunningWorkload};
use crate::types::{PreemptReason, WorkloadId, WorkloadSpec};

/// After the first scope (a node, or a cluster for gangs and spread work)
/// where a victim set exists, this many more scopes with candidates are
/// compared for a cheaper set. A scope costs a few microseconds (its
/// workloads ranked, one fit check per victim); 16 keeps the worst search
/// near 50 µs on the largest fleet planned for (8,000 nodes) while still
/// comparing victims across many nodes. A search that finds nothing scans
/// every scope, so a request that can make room always does.
pub const MAX_EXTRA_SCOPES_PER_SEARCH: usize = 16;

/// A search collects every possible victim up front when there are at most
/// this many (or at most one per scope): then scopes without any are never
/// visited, which keeps hopeless searches on small fleets cheap. With more,
/// scanning scopes in order is cheaper, since it stops soon after the first
/// scope that works.
const MIN_SPARSE_SOURCES: usize = 1024;

/// One chosen victim: why it may be preempted and the work it loses
/// (milli-GPU·ms).
#[derive(Debug, Clone)]
pub(super) struct Victim {
    pub id: WorkloadId,
    pub why: PreemptReason,
    pub lost: u128,
    /// Holds GPUs of the scope (else it only frees its team's quota).
    pub in_scope: bool,
    /// Milli-GPUs its eviction takes its team below its guarantee: a
    /// reclaim takes a borrowing team's workload whole, and a gang (or any
    /// workload) larger than what its team borrows cannot be cut.
    pub below_guarantee: u64,
}

/// A victim set that lets the request fit in one cluster.
#[derive(Debug, Clone)]
pub(super) struct VictimPlan {
    pub choice: ModelChoice,
    pub cluster: u32,
    pub victims: Vec<Victim>,
}

/// A candidate's rank, cheapest first: workloads whose eviction keeps their
/// team at or above its guarantee before those too large for what their
/// team borrows, borrowers before workloads within their team's guarantee,
/// lowest priority, least work lost, most recently started, highest id.
type Rank = (bool, bool, i32, u128, Reverse<u64>, Reverse<WorkloadId>);

/// A victim set's cost, cheapest first: fewest GPUs taken below a victim
/// team's guarantee, fewest victims within their team's guarantee, lowest
/// highest priority, least work lost, fewest victims, fewest GPUs.
type Cost = (u64, usize, i32, u128, usize, u64);

#[derive(Debug, Clone, Copy)]
struct Cand {
    rank: Rank,
    id: WorkloadId,
    /// On the scope's GPUs (else only useful to free the team's own quota).
    in_scope: bool,
    by_priority: bool,
}

/// Free GPUs after evicting chosen victims: an overlay on the cycle's free
/// array, so a scope costs what it touches.
type Overlay = BTreeMap<u32, GpuFree>;

/// One request looking for victims in one scope.
#[derive(Clone, Copy)]
struct Search<'a> {
    spec: &'a WorkloadSpec,
    team: u32,
    class: u16,
    /// The request fits its team's guarantee: it may reclaim.
    reclaim: bool,
    choice: ModelChoice,
    cluster: u32,
    nodes: &'a [u32],
}

impl<'s> Work<'s> {
    /// Could a workload of this team and class make room by preempting?
    pub(super) fn may_preempt(&self, team: u32, class: u16) -> bool {
        let c = &self.s.cat.classes[class as usize];
        if c.idle_only {
            return false;
        }
        let by_priority = self
            .s
            .cat
            .classes
            .iter()
            .enumerate()
            .any(|(v, vc)| vc.preemptible_by(class) && self.s.running_per_class[v] > 0);
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

    /// May `r` be preempted for a request of `team` and `class`, before
    /// counting what else is taken from its team? `Some(by_priority)`.
    pub(super) fn eligible(
        &self,
        team: u32,
        class: u16,
        reclaim: bool,
        r: &RunningWorkload,
    ) -> Option<bool> {
        let vc = &self.s.cat.classes[r.class as usize];
        if !vc.is_preemptible() {
            return None; // production is never preempted
        }
        // Not by priority before its class's minimum runtime (a reclaim of
        // a guarantee still may: a guarantee is never held back).
        let settled = self.now_ms.saturating_sub(r.start_time_ms) >= vc.min_runtime_ms;
        let by_priority = vc.preemptible_by(class) && settled;
        if r.team == team {
            return by_priority.then_some(true);
        }
        if by_priority && !self.s.cat.guarantees_hard {
            return Some(true);
        }
        let borrower = self.is_borrower(r.team, r.slot, Milli::ZERO);
        (borrower && (by_priority || reclaim)).then_some(by_priority)
    }

    /// Does any workload run that `class` may preempt by priority?
    fn priority_possible(&self, class: u16) -> bool {
        self.s
            .cat
            .classes
            .iter()
            .enumerate()
            .any(|(v, vc)| vc.preemptible_by(class) && self.s.running_per_class[v] > 0)
    }

    /// An upper bound on the GPUs a request could find by preempting, plus
    /// what is free: its own team's work, and what other teams hold that it
    /// may take (all of it when priority crosses guarantees, else what they
    /// borrow). Lets a hopeless search stop before it scans any node.
    fn freeable_bound(&self, team: u32, class: u16, reclaim: bool) -> Milli {
        let priority_takes_all = !self.s.cat.guarantees_hard
            && self.s.cat.classes.iter().any(|vc| vc.preemptible_by(class));
        let can_take = priority_takes_all || reclaim || self.priority_possible(class);
        // From the fleet-wide totals `Work` keeps as usage changes.
        let (own_used, own_borrowed, _) = self.team_totals(team);
        let mut bound = self.global_free;
        if priority_takes_all {
            bound += self.total_used;
        } else {
            bound += own_used;
            if can_take {
                bound += self.total_borrowed - own_borrowed;
            }
        }
        Milli(bound)
    }

    /// `team` is the requesting team.
    fn rank(&self, team: u32, r: &RunningWorkload) -> Rank {
        (
            r.team != team && !self.is_borrower(r.team, r.slot, r.spec.total_gpus()),
            !self.is_borrower(r.team, r.slot, Milli::ZERO),
            self.s.cat.classes[r.class as usize].value,
            r.spec.lost_work_milli_ms(r.start_time_ms, self.now_ms),
            Reverse(r.start_time_ms),
            Reverse(r.spec.id),
        )
    }

    /// The cheapest set of running workloads whose eviction lets `spec` fit
    /// (see the module doc for the rules and the order).
    pub(super) fn find_victims(
        &self,
        spec: &WorkloadSpec,
        team: u32,
        class: u16,
        choices: &[ModelChoice],
    ) -> Option<VictimPlan> {
        let single = spec.replicas == 1 && !spec.allow_spread;
        let mut best: Option<(Cost, VictimPlan)> = None;
        'models: for &choice in choices {
            let m = choice.model;
            let slot = choice.slot;
            let guaranteed = self.s.cat.teams[team as usize].slots[slot as usize].1;
            let reclaim =
                self.usage[team as usize][slot as usize] + spec.total_gpus() <= guaranteed;
            if !reclaim && choice.deficit == Milli::ZERO && !self.priority_possible(class) {
                // No victim by priority runs, and no guarantee to reclaim.
                continue;
            }
            if self.freeable_bound(team, class, reclaim) < spec.total_gpus() {
                // Even evicting everything it may take would not free enough.
                continue;
            }
            // The team's own work that may free its quota from anywhere.
            let own: Vec<Cand> = if choice.deficit > Milli::ZERO {
                self.s.team_running[team as usize]
                    .iter()
                    .filter(|v| !self.preempted.contains(v))
                    .map(|v| &self.s.running[v])
                    .filter(|r| r.slot == slot && self.eligible(team, class, reclaim, r).is_some())
                    .map(|r| Cand {
                        rank: self.rank(team, r),
                        id: r.spec.id,
                        in_scope: false,
                        by_priority: true,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            // Every candidate victim, by scope: a node, or a cluster for
            // gangs and spread work. Collected from the workloads that can be
            // victims at all (the team's own, borrowers', or — when priority
            // crosses guarantees — everyone's), so scopes without any are
            // never visited.
            let everyone = !self.s.cat.guarantees_hard && self.priority_possible(class);
            let sources = if everyone {
                self.s.running.len()
            } else {
                self.borrower_running
                    + if self.borrowing[team as usize] {
                        0
                    } else {
                        self.s.team_running[team as usize].len()
                    }
            };
            let scope_count = if single {
                self.s.nodes.len()
            } else {
                self.s.clusters.len()
            };
            // Few possible victims: collect them first, so scopes without any
            // are never visited. Many: scan scopes in order, which stops
            // soon after the first one that works.
            let sparse = sources <= scope_count.max(MIN_SPARSE_SOURCES);
            let mut by_scope: BTreeMap<u32, Vec<Cand>> = BTreeMap::new();
            if sparse {
                let source_teams = (0..self.s.cat.teams.len() as u32)
                    .filter(|&t| everyone || t == team || self.borrowing[t as usize]);
                for t in source_teams {
                    for v in &self.s.team_running[t as usize] {
                        let r = &self.s.running[v];
                        if self.preempted.contains(v) {
                            continue;
                        }
                        let Some(by_priority) = self.eligible(team, class, reclaim, r) else {
                            continue;
                        };
                        let cluster_nodes = &self.s.clusters[r.allocation.cluster as usize].nodes;
                        let mut keys: Vec<u32> = Vec::with_capacity(1);
                        for sh in r.allocation.shards() {
                            let n = cluster_nodes[sh.node as usize];
                            if self.s.nodes[n as usize].model != m || !self.node_ok(spec, n) {
                                continue;
                            }
                            let key = if single { n } else { r.allocation.cluster };
                            if !keys.contains(&key) {
                                keys.push(key);
                            }
                        }
                        for key in keys {
                            by_scope.entry(key).or_default().push(Cand {
                                rank: self.rank(team, r),
                                id: r.spec.id,
                                in_scope: true,
                                by_priority,
                            });
                        }
                    }
                }
            }
            // Scopes: nodes lowest bound first when scanning nodes for
            // victims on them alone (a branch and bound: see `NodeBounds`);
            // else in index order, those with candidates, or every one when
            // scanning or when the team's own work elsewhere may free its quota.
            let bounded = single && !sparse && choice.deficit == Milli::ZERO;
            let all_scopes: Box<dyn Iterator<Item = u32> + '_> =
                if bounded {
                    Box::new(self.node_bounds().order.iter().copied().filter(move |&n| {
                        self.s.nodes[n as usize].model == m && self.node_ok(spec, n)
                    }))
                } else if !sparse || choice.deficit > Milli::ZERO {
                    if single {
                        Box::new((0..self.s.nodes.len() as u32).filter(move |&n| {
                            self.s.nodes[n as usize].model == m && self.node_ok(spec, n)
                        }))
                    } else {
                        Box::new(
                            (0..self.s.clusters.len() as u32)
                                .filter(move |&c| self.cluster_ok(spec, c)),
                        )
                    }
                } else {
                    Box::new(by_scope.keys().copied().collect::<Vec<u32>>().into_iter())
                };
            let mut extra_left: Option<usize> = None;
            for key in all_scopes {
                if extra_left == Some(0) {
                    break 'models;
                }
                if bounded
                    && let Some((cost, _)) = &best
                    && cost.0 == 0
                    && cost.1 == 0
                    && self.node_bounds().bound[key as usize] > (cost.2, cost.3)
                {
                    // Every node left is bounded higher: none can take
                    // victims as cheap.
                    break;
                }
                let (cluster, nodes): (u32, Vec<u32>) = if single {
                    (self.s.nodes[key as usize].cluster, vec![key])
                } else {
                    let ns = self.s.clusters[key as usize]
                        .nodes
                        .iter()
                        .copied()
                        .filter(|&n| self.s.nodes[n as usize].model == m)
                        .collect();
                    (key, ns)
                };
                let mut cands: Vec<Cand> = if sparse {
                    by_scope.remove(&key).unwrap_or_default()
                } else {
                    self.scope_candidates(team, class, reclaim, &nodes)
                };
                if cands.is_empty() && own.is_empty() {
                    continue;
                }
                if !own.is_empty() {
                    let here: BTreeSet<WorkloadId> = cands.iter().map(|c| c.id).collect();
                    cands.extend(own.iter().filter(|c| !here.contains(&c.id)).copied());
                }
                cands.sort_unstable_by_key(|c| c.rank);
                let search = Search {
                    spec,
                    team,
                    class,
                    reclaim,
                    choice,
                    cluster,
                    nodes: &nodes,
                };
                let Some(victims) = self.pick_in_scope(search, &cands) else {
                    if let Some(e) = extra_left.as_mut() {
                        *e -= 1;
                    }
                    continue;
                };
                let cost = self.cost(&victims);
                let ideal = cost.0 == 0
                    && (cost.1 == 0 || !self.borrowers_exist)
                    && cost.4 == 1
                    && cost.2 == self.lowest_class_value
                    && cost.3 == 0
                    && cost.5 == spec.total_gpus().0;
                if best.as_ref().is_none_or(|b| cost < b.0) {
                    best = Some((
                        cost,
                        VictimPlan {
                            choice,
                            cluster,
                            victims,
                        },
                    ));
                }
                if ideal {
                    break 'models;
                }
                extra_left = Some(match extra_left {
                    None => MAX_EXTRA_SCOPES_PER_SEARCH,
                    Some(e) => e - 1,
                });
            }
        }
        best.map(|(_, plan)| plan)
    }

    /// The candidate victims running on `nodes`, each once.
    fn scope_candidates(&self, team: u32, class: u16, reclaim: bool, nodes: &[u32]) -> Vec<Cand> {
        let mut cands: Vec<Cand> = Vec::new();
        for &n in nodes {
            for &v in &self.s.node_running[n as usize] {
                if self.preempted.contains(&v)
                    || (nodes.len() > 1 && cands.iter().any(|c| c.id == v))
                {
                    continue;
                }
                let r = &self.s.running[&v];
                if let Some(by_priority) = self.eligible(team, class, reclaim, r) {
                    cands.push(Cand {
                        rank: self.rank(team, r),
                        id: v,
                        in_scope: true,
                        by_priority,
                    });
                }
            }
        }
        cands
    }

    fn cost(&self, victims: &[Victim]) -> Cost {
        let below: u64 = victims.iter().map(|v| v.below_guarantee).sum();
        let mut non_borrowers = 0;
        let mut max_prio = i32::MIN;
        let mut lost = 0u128;
        let mut gpus = 0u64;
        for v in victims {
            let r = &self.s.running[&v.id];
            if !self.is_borrower(r.team, r.slot, Milli::ZERO) {
                non_borrowers += 1;
            }
            max_prio = max_prio.max(self.s.cat.classes[r.class as usize].value);
            lost += v.lost;
            gpus += r.spec.total_gpus().0;
        }
        (below, non_borrowers, max_prio, lost, victims.len(), gpus)
    }

    /// Victims in one scope (candidates ranked cheapest first), or None.
    fn pick_in_scope(&self, q: Search<'_>, cands: &[Cand]) -> Option<Vec<Victim>> {
        let Search {
            spec,
            team,
            choice,
            cluster,
            nodes,
            ..
        } = q;
        let order: Vec<usize> = (0..cands.len()).collect();
        let (mut found, refused) = self.pick(q, cands, &order);
        // Cheaper picks of a team may free nothing this request can use and
        // still spend that team's room above its guarantee, so a victim that
        // would help is refused: retry with it first.
        for &first in refused.iter().take(MAX_RECLAIM_RETRIES) {
            if found.is_some() {
                break;
            }
            let mut o = Vec::with_capacity(order.len());
            o.push(first);
            o.extend(order.iter().copied().filter(|&i| i != first));
            found = self.pick(q, cands, &o).0;
        }
        let (mut free, mut chosen, mut freed_own) = found?;
        // Drop victims that turned out unnecessary, newest choice last.
        let mut i = chosen.len();
        while i > 0 {
            i -= 1;
            let r = &self.s.running[&chosen[i].id];
            let own = r.team == team && r.slot == choice.slot;
            let own_after = if own {
                freed_own.saturating_sub(r.spec.total_gpus())
            } else {
                freed_own
            };
            if own_after < choice.deficit {
                continue;
            }
            if !chosen[i].in_scope {
                // Frees no GPU here and is not needed for the quota.
                chosen.remove(i);
                freed_own = own_after;
                continue;
            }
            for &(g, mm) in &r.gpus {
                *free.entry(g).or_insert(self.gpu_free[g as usize]) -= mm;
            }
            if self.fits_in(spec, choice.model, cluster, nodes, &free) {
                chosen.remove(i);
                freed_own = own_after;
            } else {
                for &(g, mm) in &r.gpus {
                    *free.entry(g).or_insert(self.gpu_free[g as usize]) += mm;
                }
            }
        }
        Some(chosen)
    }

    /// Greedy in rank order over `order` (indices into `cands`). Returns the
    /// free overlay, the victims and the GPUs freed from the team's own
    /// quota once the request fits, and the candidates refused because
    /// their team would drop below its guarantee.
    #[allow(clippy::type_complexity)]
    fn pick(
        &self,
        q: Search<'_>,
        cands: &[Cand],
        order: &[usize],
    ) -> (Option<(Overlay, Vec<Victim>, Milli)>, Vec<usize>) {
        let Search {
            spec,
            team,
            class,
            reclaim,
            choice,
            cluster,
            nodes,
        } = q;
        let info = &self.s.cat.teams[team as usize];
        let (qclass, guaranteed, _) = &info.slots[choice.slot as usize];
        let mut free: Overlay = BTreeMap::new();
        let mut chosen: Vec<Victim> = Vec::new();
        let mut removed: BTreeMap<(u32, u16), Milli> = BTreeMap::new();
        let mut refused = Vec::new();
        let mut freed_own = Milli::ZERO;
        let mut fits =
            choice.deficit > Milli::ZERO && self.fits_in(spec, choice.model, cluster, nodes, &free);
        for &ci in order {
            if chosen.len() >= MAX_VICTIMS_PER_PREEMPTION {
                break;
            }
            let c = cands[ci];
            let r = &self.s.running[&c.id];
            let own = r.team == team && r.slot == choice.slot;
            let deficit_left = choice.deficit.saturating_sub(freed_own);
            // Once the request fits, only the team's own work still helps.
            if (fits || !c.in_scope) && !(own && deficit_left > Milli::ZERO) {
                continue;
            }
            let vc = &self.s.cat.classes[r.class as usize];
            let mut below_guarantee = 0;
            if r.team != team && (self.s.cat.guarantees_hard || !c.by_priority) {
                // Across teams only borrowed capacity: the victim's team stays
                // at or above its guarantee after everything taken from it.
                // A reclaim may also take a workload of a team that still
                // borrows when that workload is larger than what the team
                // borrows (a gang across its guarantee cannot be cut, and
                // the reclaiming team is owed the GPUs it holds).
                let already = removed.get(&(r.team, r.slot)).copied().unwrap_or_default();
                let after = already + r.spec.total_gpus();
                if !self.is_borrower(r.team, r.slot, after) {
                    if !(reclaim && self.borrows_after(r.team, r.slot, already)) {
                        refused.push(ci);
                        continue;
                    }
                    let used = self.usage[r.team as usize][r.slot as usize];
                    let g = self.s.cat.teams[r.team as usize].slots[r.slot as usize].1;
                    below_guarantee = g.0.saturating_sub(used.0.saturating_sub(after.0));
                }
            }
            // Taking part of a team's guarantee is a reclaim, never a
            // priority preemption.
            let why = if c.by_priority && below_guarantee == 0 {
                PreemptReason::Priority {
                    victim_class: vc.name.clone(),
                    preemptor_class: self.s.cat.classes[class as usize].name.clone(),
                    victim_team: self.s.cat.teams[r.team as usize].name.clone(),
                    preemptor_team: info.name.clone(),
                }
            } else {
                PreemptReason::QuotaReclaim {
                    victim_team: self.s.cat.teams[r.team as usize].name.clone(),
                    preemptor_team: info.name.clone(),
                    gpu_class: qclass.clone(),
                    guaranteed: *guaranteed,
                }
            };
            if c.in_scope {
                for &(g, mm) in &r.gpus {
                    *free.entry(g).or_insert(self.gpu_free[g as usize]) += mm;
                }
            }
            *removed.entry((r.team, r.slot)).or_default() += r.spec.total_gpus();
            if own {
                freed_own += r.spec.total_gpus();
            }
            chosen.push(Victim {
                id: c.id,
                why,
                lost: c.rank.3,
                in_scope: c.in_scope,
                below_guarantee,
            });
            if c.in_scope {
                fits = self.fits_in(spec, choice.model, cluster, nodes, &free);
            }
            if fits && freed_own >= choice.deficit {
                return (Some((free, chosen, freed_own)), refused);
            }
        }
        (None, refused)
    }
}

#[cfg(test)]
mod tests {
    use axle_policy::CrossTeamPreemption::{self, Any, BorrowedOnly};

    use super::*;
    use crate::state::State;
    use crate::testkit::{inventory, policy, req, run};

    /// a (guarantee 1) runs development within it; b (guarantee 0) borrows
    /// with development; c runs production.
    fn state(cross: CrossTeamPreemption) -> State {
        let p = policy(
            &[
                ("a", &[("H100", 1.0, 4.0)]),
                ("b", &[("H100", 0.0, 4.0)]),
                ("c", &[("H100", 1.0, 4.0)]),
                ("d", &[("H100", 1.0, 4.0)]),
            ],
            cross,
        );
        let mut s = State::new(p, &inventory(&[("H100", 3)]));
        run(&mut s, req(1, "a", "development", 1.0), 0, &[0], 100);
        run(&mut s, req(2, "b", "development", 1.0), 0, &[1], 200);
        run(&mut s, req(3, "c", "production", 1.0), 0, &[2], 300);
        s
    }

    #[test]
    fn across_teams_only_borrowed_capacity_unless_the_policy_says_any() {
        let s = state(BorrowedOnly);
        let w = Work::new(&s, true, 1000);
        let training = s.cat.class_index["training"];
        let run_of = |id| &s.running[&id];
        // d's training may take b's borrowed GPU by priority, not a's.
        assert_eq!(w.eligible(3, training, false, run_of(2)), Some(true));
        assert_eq!(w.eligible(3, training, false, run_of(1)), None);
        // Production is never a victim, not even to reclaim a guarantee.
        assert_eq!(w.eligible(3, training, true, run_of(3)), None);
        let s = state(Any);
        let w = Work::new(&s, true, 1000);
        let run_of = |id| &s.running[&id];
        assert_eq!(w.eligible(3, training, false, run_of(1)), Some(true));
        assert_eq!(w.eligible(3, training, true, run_of(3)), None);
    }

    #[test]
    fn the_search_takes_the_borrower_and_never_a_guarantee() {
        let s = state(BorrowedOnly);
        let w = Work::new(&s, true, 1000);
        let training = s.cat.class_index["training"];
        let spec = req(9, "d", "training", 1.0);
        let choices = w.allowed_models(&spec, 3, training).unwrap();
        let plan = w.find_victims(&spec, 3, training, &choices).unwrap();
        let ids: Vec<u64> = plan.victims.iter().map(|v| v.id).collect();
        assert_eq!(ids, [2]);
        assert!(matches!(
            plan.victims[0].why,
            PreemptReason::Priority { .. }
        ));
        // Two GPUs would need a's guaranteed one too: no plan.
        let spec = req(10, "d", "training", 2.0);
        let choices = w.allowed_models(&spec, 3, training).unwrap();
        assert!(w.find_victims(&spec, 3, training, &choices).is_none());
    }

    #[test]
    fn among_equal_victims_the_one_losing_least_work_ranks_first() {
        let p = policy(
            &[("a", &[("H100", 0.0, 4.0)]), ("b", &[("H100", 0.0, 4.0)])],
            BorrowedOnly,
        );
        let mut s = State::new(p, &inventory(&[("H100", 2)]));
        let mut saved = req(1, "b", "development", 1.0);
        saved.checkpoint_interval_s = Some(100);
        run(&mut s, saved, 0, &[0], 0); // ran 1000 s, saved at 1000 s: loses 0
        run(&mut s, req(2, "b", "development", 1.0), 0, &[1], 900_000); // loses 100 s
        let w = Work::new(&s, true, 1_000_000);
        assert!(w.rank(0, &s.running[&1]) < w.rank(0, &s.running[&2]));
        assert_eq!(s.running[&1].spec.lost_work_milli_ms(0, 1_000_000), 0);
    }

    /// A full fleet of 160 nodes × 8 GPUs of borrowed batch work, more
    /// possible victims than nodes (the search scans nodes): a reclaim takes
    /// the victim that loses the least work anywhere, on the last node,
    /// where a search in node order stopped 16 nodes after the first.
    #[test]
    fn a_full_fleet_search_takes_the_least_lost_victim_anywhere() {
        let p = policy(
            &[
                ("a", &[("H100", 0.0, 1280.0)]),
                ("b", &[("H100", 8.0, 16.0)]),
            ],
            BorrowedOnly,
        );
        let mut s = State::new(p, &inventory(&[("H100", 8); 160]));
        let mut id = 0;
        for n in 0..160 {
            for g in 0..8 {
                run(&mut s, req(id, "a", "batch", 1.0), n, &[g], id * 1000);
                id += 1;
            }
        }
        let w = Work::new(&s, true, 10_000_000);
        let training = s.cat.class_index["training"];
        let spec = req(99_999, "b", "training", 1.0);
        let choices = w.allowed_models(&spec, 1, training).unwrap();
        let plan = w.find_victims(&spec, 1, training, &choices).unwrap();
        let ids: Vec<u64> = plan.victims.iter().map(|v| v.id).collect();
        assert_eq!(ids, [id - 1], "the most recently started loses least");
    }
}
