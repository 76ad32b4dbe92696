//! Pending reasons: why a request found no room, in words and numbers —
//! the blocker (the largest free block; who holds the capacity and on what
//! terms) and a way out (its place in line, an estimated start from the max
//! runtimes of the work in the way).

use std::collections::BTreeMap;

use axle_policy::{MILLI_PER_GPU, Milli};

use super::quota::ModelChoice;
use super::work::Work;
use crate::state::{GpuFree, RunningWorkload};
use crate::types::{CapacityDetail, Holding, PendingReason, WorkloadSpec};

/// Work waiting before a request, per model: milli-GPUs by request size.
pub(super) type Ahead = Vec<BTreeMap<u64, u64>>;

/// Running workloads an estimated start walks through, soonest end first:
/// the estimate is one pass over them with a fit check each; 256 covers a
/// full cluster of notebooks and keeps an explained cycle's cost bounded.
pub const MAX_ESTIMATE_STEPS: usize = 256;

impl<'s> Work<'s> {
    /// `Some(reason)` when no allowed cluster has the model, or none is big
    /// enough even when empty. Cheap: sizes come from the catalog.
    pub(super) fn never_fits(
        &self,
        spec: &WorkloadSpec,
        choices: &[ModelChoice],
    ) -> Option<PendingReason> {
        let cat = &self.s.cat;
        let mut any_cluster = false;
        let mut biggest_cluster = 0u64;
        for c in 0..self.s.clusters.len() as u32 {
            if !self.cluster_ok(spec, c) {
                continue;
            }
            let size: u64 = choices
                .iter()
                .map(|ch| u64::from(cat.cluster_model_gpus[c as usize][ch.model as usize]))
                .sum();
            any_cluster |= size > 0;
            biggest_cluster = biggest_cluster.max(size);
        }
        if !any_cluster {
            let for_images: Vec<String> = (0..self.s.clusters.len() as u32)
                .filter(|&c| {
                    self.cluster_ok_but_image(spec, c)
                        && choices
                            .iter()
                            .any(|ch| cat.cluster_model_gpus[c as usize][ch.model as usize] > 0)
                })
                .map(|c| self.s.clusters[c as usize].name.clone())
                .collect();
            if !for_images.is_empty() {
                return Some(PendingReason::NeedsImage {
                    clusters: for_images,
                });
            }
            return Some(PendingReason::NoMatchingCluster {
                gpu_model: spec.gpu_model.clone(),
                regions: spec.regions.clone(),
            });
        }
        let g = spec.gpus_per_replica;
        if spec.replicas == 1 && !spec.allow_spread {
            let largest_node = choices
                .iter()
                .map(|c| cat.largest_node[c.model as usize])
                .max()
                .unwrap_or(0);
            if g.whole_gpus() > u64::from(largest_node) {
                return Some(PendingReason::NeverFits {
                    need: self.need_text(spec, choices),
                    largest: format!("a node of {largest_node} GPUs"),
                });
            }
        } else if spec.total_gpus().0 > biggest_cluster * MILLI_PER_GPU {
            return Some(PendingReason::NeverFits {
                need: self.need_text(spec, choices),
                largest: format!("a cluster of {biggest_cluster} GPUs"),
            });
        }
        None
    }

    fn model_text(&self, choices: &[ModelChoice]) -> String {
        let names: Vec<&str> = choices
            .iter()
            .map(|c| self.s.cat.models[c.model as usize].as_str())
            .collect();
        names.join("|")
    }

    fn need_text(&self, spec: &WorkloadSpec, choices: &[ModelChoice]) -> String {
        let g = spec.gpus_per_replica;
        let model_txt = self.model_text(choices);
        if spec.replicas == 1 && !spec.allow_spread {
            if g.0 < MILLI_PER_GPU {
                format!("{g} of one {model_txt} GPU")
            } else {
                format!("{g} {model_txt} on one node")
            }
        } else if spec.replicas > 1 {
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
        }
    }

    /// The full reason a request found no room: the largest free block,
    /// who holds the capacity, the team's standing, and an estimated start.
    pub(super) fn explain_capacity(
        &self,
        spec: &WorkloadSpec,
        team: u32,
        class: u16,
        choices: &[ModelChoice],
    ) -> PendingReason {
        if let Some(r) = self.never_fits(spec, choices) {
            return r;
        }
        let single = spec.replicas == 1 && !spec.allow_spread;
        let (largest_free, largest_free_at) = if single {
            // Largest free block on an allowed node.
            let mut best: (Milli, Option<String>) = (Milli::ZERO, None);
            for c in choices {
                let m = c.model as usize;
                for &(_, gpu) in self.partial[m].iter().rev() {
                    let node = self.s.gpu_node[gpu as usize];
                    if self.node_ok(spec, node) {
                        let f = Milli(u64::from(self.gpu_free[gpu as usize]));
                        if f > best.0 {
                            best = (f, Some(self.where_node(node)));
                        }
                        break;
                    }
                }
                for &(full, node) in self.whole[m].iter().rev() {
                    if self.node_ok(spec, node) {
                        let f = Milli::gpus(u64::from(full));
                        if f > best.0 {
                            best = (f, Some(self.where_node(node)));
                        }
                        break;
                    }
                }
            }
            best
        } else {
            let mut best: (u32, Option<String>) = (0, None);
            for c in 0..self.s.clusters.len() as u32 {
                if !self.cluster_ok(spec, c) {
                    continue;
                }
                for ch in choices {
                    let full = self.cluster_full[c as usize][ch.model as usize];
                    if full > best.0 {
                        best = (full, Some(self.s.clusters[c as usize].name.clone()));
                    }
                }
            }
            (Milli::gpus(u64::from(best.0)), best.1)
        };
        let info = &self.s.cat.teams[team as usize];
        // The team's standing in the quota class of its first allowed model.
        let slot = choices[0].slot;
        let guaranteed = info.slots[slot as usize].1;
        let borrowing = self.usage[team as usize][slot as usize] + spec.total_gpus() > guaranteed;
        let own_preemptible = self.own_preemptible(team, slot, class);
        let (capacity, estimate) = self.capacity_detail(spec, team, class, choices, !borrowing);
        let (estimate, estimate_basis) = match estimate {
            Some((at, basis)) => (Some(at), basis),
            None => (None, None),
        };
        PendingReason::NoFreeCapacity {
            need: self.need_text(spec, choices).into(),
            largest_free,
            largest_free_at: largest_free_at.map(Into::into),
            idle_only: self.s.cat.classes[class as usize].idle_only,
            team: info.name.as_str().into(),
            borrowing,
            guaranteed,
            capacity: capacity.map(Into::into),
            own_preemptible,
            queue_position: None,
            estimated_start_ms: estimate,
            estimated_wait_ms: estimate.map(|t| t.saturating_sub(self.now_ms)),
            estimate_basis,
            burst: None,
        }
    }

    /// Who holds the GPUs the request could use (allowed clusters and
    /// models), and the earliest time enough of them free up if the work
    /// holding them ends at its max runtime.
    fn capacity_detail(
        &self,
        spec: &WorkloadSpec,
        team: u32,
        class: u16,
        choices: &[ModelChoice],
        reclaim: bool,
    ) -> (Option<CapacityDetail>, Option<(u64, Option<String>)>) {
        let single = spec.replicas == 1 && !spec.allow_spread;
        let models: Vec<u16> = choices.iter().map(|c| c.model).collect();
        let clusters: Vec<u32> = (0..self.s.clusters.len() as u32)
            .filter(|&c| {
                self.cluster_ok(spec, c)
                    && models
                        .iter()
                        .any(|&m| self.s.cat.cluster_model_gpus[c as usize][m as usize] > 0)
            })
            .collect();
        let mut total = 0u64;
        let mut free = 0u64;
        let mut held: BTreeMap<u32, (Milli, bool)> = BTreeMap::new();
        // Running work in the way with a known or expected end: (end ms,
        // workload, what an expected end rests on).
        let mut ending: Vec<(u64, u64, Option<&str>)> = Vec::new();
        for &c in &clusters {
            for &m in &models {
                total += self.cluster_cap[c as usize][m as usize];
                free += self.cluster_free[c as usize][m as usize];
            }
            if !self.cluster_runs[c as usize] {
                continue;
            }
            for &n in &self.s.clusters[c as usize].nodes {
                let node = &self.s.nodes[n as usize];
                if !models.contains(&node.model) {
                    continue;
                }
                for &v in &self.s.node_running[n as usize] {
                    let r = &self.s.running[&v];
                    let on_node: u64 = r
                        .gpus
                        .iter()
                        .filter(|(g, _)| self.s.gpu_node[*g as usize] == n)
                        .map(|&(_, m)| u64::from(m))
                        .sum();
                    let e = held.entry(r.team).or_insert((Milli::ZERO, false));
                    e.0 += Milli(on_node);
                    e.1 |= self.eligible(team, class, reclaim, r).is_some();
                    if let Some((end, basis)) = self.expected_end(r) {
                        ending.push((end, v, basis));
                    }
                }
            }
        }
        if clusters.is_empty() {
            return (None, None);
        }
        let mut holders: Vec<Holding> = held
            .into_iter()
            .map(|(t, (gpus, preemptible_by_it))| {
                let info = &self.s.cat.teams[t as usize];
                // What the team runs above its guarantees, at most what it
                // holds here.
                let above: Milli = info
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(i, slot)| self.usage[t as usize][i].saturating_sub(slot.1))
                    .sum();
                Holding {
                    team: info.name.clone(),
                    gpus,
                    borrowing: above > Milli::ZERO,
                    borrowed: above.min(gpus),
                    preemptible_by_it,
                }
            })
            .collect();
        holders.sort_by(|a, b| b.gpus.cmp(&a.gpus).then_with(|| a.team.cmp(&b.team)));
        let scope = match clusters.as_slice() {
            [one] => self.s.clusters[*one as usize].name.clone(),
            many => format!("{} clusters", many.len()),
        };
        let detail = CapacityDetail {
            scope,
            gpu_model: self.model_text(choices),
            total: Milli(total),
            free: Milli(free),
            holders,
        };
        // Estimated start: free the work in the way in order of its end,
        // until the request fits somewhere.
        ending.sort_unstable();
        ending.dedup_by_key(|e| e.1);
        // What the estimate rests on, when any end on the way is expected
        // rather than a max runtime: the first such basis.
        let mut basis: Option<&str> = None;
        let mut overlay: BTreeMap<u32, GpuFree> = BTreeMap::new();
        let mut estimate = None;
        'ends: for &(end, v, b) in ending.iter().take(MAX_ESTIMATE_STEPS) {
            basis = basis.or(b);
            let r = &self.s.running[&v];
            for &(g, m) in &r.gpus {
                *overlay.entry(g).or_insert(self.gpu_free[g as usize]) += m;
            }
            let cluster = r.allocation.cluster;
            for c in choices {
                let nodes: Vec<u32> = self.s.clusters[cluster as usize]
                    .nodes
                    .iter()
                    .copied()
                    .filter(|&n| self.s.nodes[n as usize].model == c.model)
                    .filter(|&n| {
                        !single
                            || r.gpus
                                .iter()
                                .any(|(g, _)| self.s.gpu_node[*g as usize] == n)
                    })
                    .collect();
                if !nodes.is_empty() && self.fits_in(spec, c.model, cluster, &nodes, &overlay) {
                    estimate = Some((end, basis.map(str::to_string)));
                    break 'ends;
                }
            }
        }
        (Some(detail), estimate)
    }

    /// When running work `r` ends, at the earliest now: at its max runtime,
    /// else when runs of its kind end (its `expected_runtime`: the median,
    /// or of the runs that lasted as long as it has), with what that rests
    /// on; `None` when nothing is known.
    fn expected_end<'r>(&self, r: &'r RunningWorkload) -> Option<(u64, Option<&'r str>)> {
        let elapsed_s = self.now_ms.saturating_sub(r.start_time_ms) / 1000;
        let (s, basis) = match (&r.spec.max_runtime_s, &r.spec.expected_runtime) {
            (Some(max_s), _) => (*max_s, None),
            (None, Some(e)) => (e.expected_end_s(elapsed_s), Some(e.basis.as_str())),
            (None, None) => return None,
        };
        let end = r.start_time_ms.saturating_add(s.saturating_mul(1000));
        Some((end.max(self.now_ms), basis))
    }

    /// Per model: running work with a max runtime or an expected end, as
    /// (end ms, milli-GPUs freed by then in all, the basis of the first
    /// expected end so far), soonest first. Built once per cycle.
    fn freeing(&self) -> &[Vec<(u64, u64, Option<String>)>] {
        self.freeing.get_or_init(|| {
            let mut per: Vec<Vec<(u64, u64, Option<&str>)>> =
                vec![Vec::new(); self.s.cat.models.len()];
            for r in self.s.running.values() {
                let Some((end, basis)) = self.expected_end(r) else {
                    continue;
                };
                for &(g, m) in &r.gpus {
                    let model = self.s.nodes[self.s.gpu_node[g as usize] as usize].model;
                    per[model as usize].push((end, u64::from(m), basis));
                }
            }
            per.into_iter()
                .map(|mut v| {
                    v.sort_unstable_by_key(|e| e.0);
                    let mut cum = 0u64;
                    let mut first: Option<String> = None;
                    v.into_iter()
                        .map(|(end, m, b)| {
                            cum += m;
                            if first.is_none() {
                                first = b.map(str::to_string);
                            }
                            (end, cum, first.clone())
                        })
                        .collect()
                })
                .collect()
        })
    }

    /// The earliest time enough GPUs of one of `models` free up for `need`
    /// milli-GPUs after the work waiting before it that is no larger has
    /// taken its share (larger work ahead does not fit first and does not
    /// hold it up: whatever fits is placed in line order), counting GPUs
    /// freed in all (fluid: fragmentation aside). `None`: not before every
    /// known end.
    pub(super) fn fluid_start(
        &self,
        models: &[u16],
        need: u64,
        ahead: &Ahead,
    ) -> Option<(u64, Option<String>)> {
        models
            .iter()
            .filter_map(|&m| {
                let before: u64 = ahead
                    .get(m as usize)
                    .map_or(0, |by_size| by_size.range(..=need).map(|(_, t)| t).sum());
                let want = (before + need).saturating_sub(self.model_free[m as usize]);
                if want == 0 {
                    return Some((self.now_ms, None));
                }
                let list = &self.freeing()[m as usize];
                let i = list.partition_point(|e| e.1 < want);
                // More waits ahead than all running work frees: no later
                // bound is known (extrapolating the turnover of what runs
                // now overestimated Philly's waits a hundredfold).
                list.get(i).map(|e| (e.0, e.2.clone()))
            })
            .min_by_key(|e| e.0)
    }

    /// Counts `spec` as waiting before whatever is estimated next.
    pub(super) fn add_ahead(&self, ahead: &mut Ahead, spec: &WorkloadSpec) {
        let need = spec.total_gpus().0;
        for m in self.models_of(spec) {
            *ahead[m as usize].entry(need).or_default() += need;
        }
    }

    /// The models a request may use, as indices (a range, so asking
    /// allocates nothing: it is asked for every waiting request).
    pub(super) fn models_of(&self, spec: &WorkloadSpec) -> std::ops::Range<u16> {
        match &spec.gpu_model {
            Some(name) => match self.s.cat.model_of(Some(name)) {
                Some(m) => m..m + 1,
                None => 0..0,
            },
            None => 0..self.s.cat.models.len() as u16,
        }
    }

    /// Pushes the estimate in `reason` back to when the work waiting
    /// before it (`ahead`, milli per model) has had its share of what
    /// frees, and says what it rests on.
    pub(super) fn queue_aware_estimate(
        &self,
        spec: &WorkloadSpec,
        ahead: &Ahead,
        reason: &mut PendingReason,
    ) {
        let PendingReason::NoFreeCapacity {
            estimated_start_ms,
            estimated_wait_ms,
            estimate_basis,
            ..
        } = reason
        else {
            return;
        };
        let Some(at) = *estimated_start_ms else {
            return;
        };
        let models: Vec<u16> = self.models_of(spec).collect();
        match self.fluid_start(&models, spec.total_gpus().0, ahead) {
            Some((fluid, basis)) => {
                if fluid > at {
                    *estimated_start_ms = Some(fluid);
                    *estimated_wait_ms = Some(fluid.saturating_sub(self.now_ms));
                }
                if estimate_basis.is_none() {
                    *estimate_basis = basis;
                }
            }
            // More waits before it than the running work with known ends
            // frees: any time given would be a guess.
            None => {
                *estimated_start_ms = None;
                *estimated_wait_ms = None;
                *estimate_basis = None;
            }
        }
    }

    pub(super) fn where_node(&self, node: u32) -> String {
        let n = &self.s.nodes[node as usize];
        format!(
            "{}/{}",
            self.s.clusters[n.cluster as usize].name, self.s.node_names[node as usize]
        )
    }
}

#[cfg(test)]
mod tests {
    use axle_policy::CrossTeamPreemption::BorrowedOnly;

    use super::*;
    use crate::state::State;
    use crate::testkit::{gpus, inventory, policy, req, run};

    #[test]
    fn reasons_name_holders_terms_and_a_way_out() {
        let p = policy(
            &[
                ("vision", &[("A100", 1.0, 4.0)]),
                ("recsys", &[("A100", 2.0, 4.0)]),
            ],
            BorrowedOnly,
        );
        let mut s = State::new(p, &inventory(&[("A100", 4)]));
        let mut nb = req(1, "vision", "development", 1.0);
        nb.max_runtime_s = Some(60);
        run(&mut s, nb, 0, &[0], 0);
        let w = Work::new(&s, true, 30_000);
        let training = s.cat.class_index["training"];
        let spec = req(2, "recsys", "training", 4.0);
        let choices = w.allowed_models(&spec, 1, training).unwrap();
        let r = w.explain_capacity(&spec, 1, training, &choices);
        let PendingReason::NoFreeCapacity {
            capacity: Some(c),
            borrowing,
            estimated_wait_ms,
            largest_free,
            ..
        } = &r
        else {
            panic!("{r:?}");
        };
        assert!(*borrowing);
        assert_eq!(*largest_free, gpus(3.0));
        assert_eq!(c.holders.len(), 1);
        assert_eq!(
            (c.holders[0].team.as_str(), c.holders[0].borrowing),
            ("vision", false)
        );
        assert_eq!(
            *estimated_wait_ms,
            Some(30_000),
            "the notebook's max runtime ends in 30 s"
        );
        let text = r.to_string();
        assert!(
            text.contains("c0 has 4 A100: 1 held by vision within its guarantee, 3 free"),
            "{text}"
        );
        assert!(text.contains("may borrow only idle GPUs"), "{text}");
    }

    #[test]
    fn without_a_max_runtime_the_estimate_uses_earlier_runs_of_its_kind() {
        // Observed: "no estimate" whenever the work in the way named no
        // --max-runtime, though earlier runs of its kind said how long it takes.
        let p = policy(
            &[
                ("vision", &[("A100", 1.0, 4.0)]),
                ("recsys", &[("A100", 2.0, 4.0)]),
            ],
            BorrowedOnly,
        );
        let mut s = State::new(p, &inventory(&[("A100", 4)]));
        let mut nb = req(1, "vision", "development", 1.0);
        nb.expected_runtime = Some(crate::RuntimeEstimate {
            seconds: 2400,
            basis: "212 earlier runs of `nb-*`".into(),
            deciles: Vec::new(),
        });
        run(&mut s, nb, 0, &[0], 0);
        let w = Work::new(&s, true, 600_000);
        let training = s.cat.class_index["training"];
        let spec = req(2, "recsys", "training", 4.0);
        let choices = w.allowed_models(&spec, 1, training).unwrap();
        let r = w.explain_capacity(&spec, 1, training, &choices);
        let PendingReason::NoFreeCapacity {
            estimated_wait_ms,
            estimate_basis,
            ..
        } = &r
        else {
            panic!("{r:?}");
        };
        assert_eq!(
            *estimated_wait_ms,
            Some(1_800_000),
            "40 min less the 10 it ran"
        );
        assert_eq!(
            estimate_basis.as_deref(),
            Some("212 earlier runs of `nb-*`")
        );
        let text = r.to_string();
        assert!(
            text.contains("estimated start in about 30 min, from 212 earlier runs of `nb-*`"),
            "{text}"
        );
    }

    #[test]
    fn never_fits_is_cheap_and_names_the_largest() {
        let p = policy(&[("a", &[("H100", 0.0, 64.0)])], BorrowedOnly);
        let s = State::new(p, &inventory(&[("H100", 8)]));
        let w = Work::new(&s, true, 0);
        let m = s.cat.model_index["H100"];
        let choice = [ModelChoice {
            model: m,
            slot: 0,
            deficit: Milli::ZERO,
        }];
        let mut gang = req(1, "a", "training", 8.0);
        gang.replicas = 2;
        let r = w.never_fits(&gang, &choice).unwrap();
        assert!(r.to_string().contains("a cluster of 8 GPUs"), "{r}");
        assert!(
            w.never_fits(&req(2, "a", "training", 8.0), &choice)
                .is_none()
        );
        let mut elsewhere = req(3, "a", "training", 1.0);
        elsewhere.regions = vec!["us".into()];
        assert!(matches!(
            w.never_fits(&elsewhere, &choice),
            Some(PendingReason::NoMatchingCluster { .. })
        ));
    }
}
