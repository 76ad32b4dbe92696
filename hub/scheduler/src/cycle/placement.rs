//! Placement: best fit of a request on the free capacity of a cycle.
//! Fractions go to the fullest GPU already shared in software that fits,
//! then to the smallest free fractional unit that serves them (a MIG device
//! or a time-sliced replica), and only then is a whole GPU split — never on
//! a node that hands out whole devices only; whole GPUs go to the fullest
//! node that holds them; gangs and spread workloads to the best-fit
//! cluster, all or nothing.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use axle_policy::{MILLI_PER_GPU, Milli};

use axle_policy::GangPlacement;

use super::work::{Plan, Work};
use crate::state::{FULL_GPU, GpuFree};
use crate::types::WorkloadSpec;

impl<'s> Work<'s> {
    /// Finds GPUs for the whole request on model `m` with the current free
    /// capacity, optionally only in one cluster. Best fit: the fullest node or
    /// shared GPU that still fits, so whole GPUs and big blocks stay free.
    pub(super) fn find(&self, spec: &WorkloadSpec, m: u16, only: Option<u32>) -> Option<Plan> {
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
    pub(super) fn find_on_nodes(
        &self,
        g: Milli,
        m: u16,
        ok: impl Fn(u32) -> bool,
    ) -> Option<Vec<(u32, GpuFree)>> {
        if g.0 < MILLI_PER_GPU {
            let need = g.0 as GpuFree;
            for &(f, gpu) in self.partial[m as usize].range((need, 0)..) {
                if self.s.fraction_fits(gpu, f, need) && ok(self.s.gpu_node[gpu as usize]) {
                    return Some(vec![(gpu, need)]);
                }
            }
            // The smallest free unit that serves it: the bigger ones, and
            // whole GPUs, stay free for bigger requests.
            for &(_, gpu) in &self.units[m as usize] {
                if self.s.gpu_fit[gpu as usize] >= need && ok(self.s.gpu_node[gpu as usize]) {
                    return Some(vec![(gpu, need)]);
                }
            }
            for &(_, node) in self.whole[m as usize].range((1, 0)..) {
                if ok(node) && !self.s.nodes[node as usize].whole_only {
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
    pub(super) fn plan_in_cluster(
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
                // Shared GPUs first (best fit), then the smallest free unit
                // that serves it, then a fully free GPU.
                let mut best: Option<(u8, GpuFree, u32)> = None;
                for &n in &nodes {
                    let nr = &self.s.nodes[n as usize];
                    for x in nr.first_gpu..nr.first_gpu + nr.gpu_count {
                        let f = get(&free_local, x);
                        if self.s.fraction_fits(x, f, need) {
                            let key = if self.s.gpu_fit[x as usize] > 0 {
                                (1, f, x)
                            } else if f == FULL_GPU {
                                (2, f, x)
                            } else {
                                (0, f, x)
                            };
                            if best.is_none_or(|b| key < b) {
                                best = Some(key);
                            }
                        }
                    }
                }
                let (_, _, x) = best?;
                free_local.insert(x, get(&free_local, x) - self.s.taken(x, need));
                shards.push((x, need));
            } else {
                let k = g.whole_gpus() as usize;
                let full_on = |fl: &BTreeMap<u32, GpuFree>, n: u32| {
                    let nr = &self.s.nodes[n as usize];
                    (nr.first_gpu..nr.first_gpu + nr.gpu_count)
                        .filter(|&x| !nr.fractions_only && get(fl, x) == FULL_GPU)
                        .collect::<Vec<u32>>()
                };
                // Best-fit node holding the whole replica; a gang's later
                // replicas prefer the first one's topology domain.
                let gang_domain = plan
                    .first()
                    .and_then(|r: &Vec<(u32, GpuFree)>| r.first())
                    .map(|&(x, _)| self.s.nodes[self.s.gpu_node[x as usize] as usize].domain);
                let mut best: Option<(bool, usize, u32)> = None;
                for &n in &nodes {
                    let cnt = full_on(&free_local, n).len();
                    let away = gang_domain.is_some_and(|d| d != self.s.nodes[n as usize].domain);
                    if cnt >= k && best.is_none_or(|b| (away, cnt, n) < b) {
                        best = Some((away, cnt, n));
                    }
                }
                if let Some((_, _, n)) = best {
                    for x in full_on(&free_local, n).into_iter().take(k) {
                        free_local.insert(x, 0);
                        shards.push((x, FULL_GPU));
                    }
                } else if spec.allow_spread {
                    let mut blocks: Vec<(usize, u32)> = nodes
                        .iter()
                        .map(|&n| (full_on(&free_local, n).len(), n))
                        .filter(|&(c, _)| c > 0)
                        .collect();
                    // The layout rule is for replicas larger than a node;
                    // a smaller one that fits no node takes the largest blocks.
                    let largest = nodes
                        .iter()
                        .map(|&n| self.s.nodes[n as usize].gpu_count as usize)
                        .max()
                        .unwrap_or(0);
                    let placement = if k > largest {
                        self.placement_of(spec)
                    } else {
                        GangPlacement::Packed
                    };
                    let chosen = match placement {
                        GangPlacement::WholeNodes => self.whole_nodes(k, &blocks)?,
                        GangPlacement::Packed => {
                            // Largest blocks first: the fewest nodes free now.
                            blocks.sort_unstable_by_key(|&(c, n)| (Reverse(c), n));
                            blocks.into_iter().map(|(_, n)| n).collect()
                        }
                        GangPlacement::Spread => {
                            // Smallest blocks first: fills partly used nodes.
                            blocks.sort_unstable();
                            blocks.into_iter().map(|(_, n)| n).collect()
                        }
                    };
                    let mut left = k;
                    for n in chosen {
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

    /// The layout of a replica larger than one node (its class's placement).
    fn placement_of(&self, spec: &WorkloadSpec) -> GangPlacement {
        self.s
            .cat
            .class_index
            .get(&spec.priority_class)
            .map(|&c| self.s.cat.classes[c as usize].placement)
            .unwrap_or_default()
    }

    /// The nodes a replica of `k` whole GPUs larger than one node takes
    /// under `wholeNodes`, from `blocks` (fully free GPUs, node): fully free
    /// nodes while the replica fills them, then the best-fit node for the
    /// rest. The nodes come from the one topology domain that holds the
    /// replica with the least to spare, else from the domains with the most
    /// room first (the fewest domains). `None` when the whole free nodes
    /// cannot hold it.
    fn whole_nodes(&self, k: usize, blocks: &[(usize, u32)]) -> Option<Vec<u32>> {
        let node = |n: u32| &self.s.nodes[n as usize];
        let whole = |&(c, n): &(usize, u32)| c == node(n).gpu_count as usize;
        // Room on whole free nodes per domain.
        let mut room: BTreeMap<u32, usize> = BTreeMap::new();
        for b in blocks.iter().filter(|b| whole(b)) {
            *room.entry(node(b.1).domain).or_default() += b.0;
        }
        let holds_alone = room
            .iter()
            .filter(|&(_, &r)| r >= k)
            .min_by_key(|&(&d, &r)| (r, d))
            .map(|(&d, _)| d);
        // The domain that holds it alone first, then by room, most first.
        let mut whole_nodes: Vec<(usize, u32)> = blocks.iter().copied().filter(whole).collect();
        whole_nodes.sort_unstable_by_key(|&(_, n)| {
            let d = node(n).domain;
            (holds_alone != Some(d), Reverse(room[&d]), d, n)
        });
        let mut left = k;
        let mut chosen = Vec::new();
        for (c, n) in whole_nodes {
            if left >= c {
                chosen.push(n);
                left -= c;
            }
        }
        if left > 0 {
            // The rest on one more node, best fit, in a chosen node's domain
            // when one holds it.
            let home = chosen.first().map(|&n| node(n).domain);
            let rest = blocks
                .iter()
                .filter(|&&(c, n)| c >= left && !chosen.contains(&n))
                .min_by_key(|&&(c, n)| (home.is_some_and(|h| h != node(n).domain), c, n))?;
            chosen.push(rest.1);
        }
        Some(chosen)
    }

    /// Would `spec` fit in the scope with free array `free`?
    pub(super) fn fits_in(
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
        if spec.replicas == 1
            && spec.allow_spread
            && spec.gpus_per_replica.0 >= MILLI_PER_GPU
            && self.placement_of(spec) != GangPlacement::WholeNodes
        {
            // A spread replica fits wherever the cluster has enough fully
            // free GPUs of the model: count them instead of planning.
            let mut full = u64::from(self.cluster_full[cluster as usize][m as usize]);
            for (&g, &f) in overlay {
                let node = &self.s.nodes[self.s.gpu_node[g as usize] as usize];
                if f == FULL_GPU
                    && self.gpu_free[g as usize] != FULL_GPU
                    && !node.fractions_only
                    && node.cluster == cluster
                    && node.model == m
                {
                    full += 1;
                }
            }
            return full >= spec.gpus_per_replica.whole_gpus();
        }
        if spec.replicas == 1 && !spec.allow_spread {
            let g = spec.gpus_per_replica;
            return nodes.iter().any(|&n| {
                let nr = &self.s.nodes[n as usize];
                let gpus = nr.first_gpu..nr.first_gpu + nr.gpu_count;
                if g.0 < MILLI_PER_GPU {
                    gpus.into_iter()
                        .any(|x| self.s.fraction_fits(x, free(x), g.0 as GpuFree))
                } else {
                    !nr.fractions_only
                        && gpus.into_iter().filter(|&x| free(x) == FULL_GPU).count() as u64
                            >= g.whole_gpus()
                }
            });
        }
        self.plan_in_cluster(spec, m, cluster, &free).is_some()
    }
}

#[cfg(test)]
mod tests {
    use axle_policy::CrossTeamPreemption::BorrowedOnly;

    use super::*;
    use crate::state::State;
    use crate::testkit::{inventory, policy, req, run, with_placement};

    /// Two 4-GPU nodes, partly used; `training` spreads large replicas
    /// over the largest free blocks (`packed`).
    fn state() -> State {
        let p = with_placement(
            policy(&[("a", &[("H100", 0.0, 16.0)])], BorrowedOnly),
            "training",
            GangPlacement::Packed,
        );
        let mut s = State::new(p, &inventory(&[("H100", 4), ("H100", 4)]));
        run(&mut s, req(1, "a", "training", 0.5), 0, &[0], 0);
        run(&mut s, req(2, "a", "training", 2.0), 1, &[0, 1], 0);
        s
    }

    #[test]
    fn best_fit_fills_shared_gpus_and_fullest_nodes_first() {
        let s = state();
        let w = Work::new(&s, true, 0);
        let m = s.cat.model_index["H100"];
        // A half goes on the half-used GPU 0 of node 0.
        let plan = w.find(&req(3, "a", "training", 0.5), m, None).unwrap();
        assert_eq!(plan, vec![vec![(0, 500)]]);
        // Two whole GPUs go to node 1 (2 free) rather than node 0 (3 free).
        let plan = w.find(&req(4, "a", "training", 2.0), m, None).unwrap();
        let first_gpu_of_node1 = s.nodes[1].first_gpu;
        assert!(
            plan[0].iter().all(|&(g, _)| g >= first_gpu_of_node1),
            "{plan:?}"
        );
        // Four on one node cannot fit; spread over both nodes they do.
        assert!(w.find(&req(5, "a", "training", 4.0), m, None).is_none());
        let mut spread = req(6, "a", "training", 5.0);
        spread.allow_spread = true;
        assert_eq!(w.find(&spread, m, None).unwrap()[0].len(), 5);
    }

    /// The nodes (in order) a plan uses.
    fn nodes_of(s: &State, plan: &Plan) -> Vec<u32> {
        let mut n: Vec<u32> = plan
            .iter()
            .flatten()
            .map(|&(g, _)| s.gpu_node[g as usize])
            .collect();
        n.dedup();
        n
    }

    /// Four 8-GPU nodes, nodes 0 and 1 half used: a 16-GPU job takes the
    /// two whole free nodes under `wholeNodes` and `packed` (the default),
    /// never the two half-used ones; once only one whole node is free,
    /// `wholeNodes` waits where `packed` fills the half-used nodes and
    /// `spread` takes the smallest blocks first.
    #[test]
    fn a_sixteen_gpu_gang_never_leaves_two_half_used_nodes_for_two_whole_ones() {
        let layout = |placement: GangPlacement, busy: &[(u32, &[u32])]| {
            let p = with_placement(
                policy(&[("a", &[("H100", 0.0, 32.0)])], BorrowedOnly),
                "training",
                placement,
            );
            let mut s = State::new(p, &inventory(&[("H100", 8); 4]));
            for (i, &(node, gpus)) in busy.iter().enumerate() {
                let g = gpus.len() as f64;
                run(
                    &mut s,
                    req(100 + i as u64, "a", "training", g),
                    node,
                    gpus,
                    0,
                );
            }
            let w = Work::new(&s, true, 0);
            let mut big = req(1, "a", "training", 16.0);
            big.allow_spread = true;
            w.find(&big, 0, None).map(|plan| nodes_of(&s, &plan))
        };
        let half: &[u32] = &[0, 1, 2, 3];
        let two_half = [(0, half), (1, half)];
        assert_eq!(
            layout(GangPlacement::WholeNodes, &two_half),
            Some(vec![2, 3])
        );
        assert_eq!(layout(GangPlacement::Packed, &two_half), Some(vec![2, 3]));
        let three_half = [(0, half), (1, half), (2, half)];
        assert_eq!(layout(GangPlacement::WholeNodes, &three_half), None);
        assert_eq!(
            layout(GangPlacement::Packed, &three_half),
            Some(vec![3, 0, 1])
        );
        assert_eq!(
            layout(GangPlacement::Spread, &three_half),
            Some(vec![0, 1, 2, 3])
        );
        // 12 GPUs: one whole node and 4 best fit beside a half-used one.
        let p = with_placement(
            policy(&[("a", &[("H100", 0.0, 32.0)])], BorrowedOnly),
            "training",
            GangPlacement::WholeNodes,
        );
        let mut s = State::new(p, &inventory(&[("H100", 8); 4]));
        run(&mut s, req(100, "a", "training", 4.0), 0, half, 0);
        let w = Work::new(&s, true, 0);
        let mut twelve = req(1, "a", "training", 12.0);
        twelve.allow_spread = true;
        let plan = w.find(&twelve, 0, None).unwrap();
        assert_eq!(nodes_of(&s, &plan), vec![1, 0]);
    }

    /// Declared topology domains: a 16-GPU job takes two whole nodes of one
    /// rack (rack-b: nodes 1 and 3) over the lowest-numbered whole nodes,
    /// which sit in two racks; a gang's replicas follow its first one.
    #[test]
    fn replicas_prefer_one_topology_domain() {
        // Four 8-GPU nodes, in racks a, b, a, b when `racks`; two GPUs of
        // node `busy` in use; the nodes `spec`'s plan takes.
        let layout = |racks: bool, busy: u32, spec: &WorkloadSpec| {
            let mut inv = inventory(&[("H100", 8); 4]);
            if racks {
                for (n, rack) in inv.clusters[0].nodes.iter_mut().zip(["a", "b", "a", "b"]) {
                    n.topology = Some(format!("rack-{rack}"));
                }
            }
            let p = with_placement(
                policy(&[("a", &[("H100", 0.0, 32.0)])], BorrowedOnly),
                "training",
                GangPlacement::WholeNodes,
            );
            let mut s = State::new(p, &inv);
            run(&mut s, req(100, "a", "training", 2.0), busy, &[0, 1], 0);
            let w = Work::new(&s, true, 0);
            nodes_of(&s, &w.find(spec, 0, None).unwrap())
        };
        let mut big = req(1, "a", "training", 16.0);
        big.allow_spread = true;
        assert_eq!(layout(true, 2, &big), vec![1, 3]);
        // Without domains: the lowest-numbered whole nodes.
        assert_eq!(layout(false, 2, &big), vec![0, 1]);
        // A gang of two 6-GPU replicas: the second beside the first's rack.
        let mut gang = req(2, "a", "training", 6.0);
        gang.replicas = 2;
        assert_eq!(layout(true, 0, &gang), vec![0, 2]);
    }

    #[test]
    fn fits_in_counts_gpus_freed_by_an_overlay() {
        let s = state();
        let w = Work::new(&s, true, 0);
        let m = s.cat.model_index["H100"];
        let mut spread = req(7, "a", "training", 7.0);
        spread.allow_spread = true;
        let nodes = [0, 1];
        assert!(!w.fits_in(&spread, m, 0, &nodes, &BTreeMap::new()));
        // Freeing node 1's two busy GPUs makes 7 fully free GPUs.
        let g = s.nodes[1].first_gpu;
        let overlay = BTreeMap::from([(g, FULL_GPU), (g + 1, FULL_GPU)]);
        assert!(w.fits_in(&spread, m, 0, &nodes, &overlay));
    }

    /// A node whose GPUs are MIG-partitioned or time-sliced takes fractions
    /// (before a whole GPU elsewhere is split) and never a whole GPU, alone,
    /// in a gang or spread.
    #[test]
    fn a_fractions_only_node_takes_fractions_and_never_whole_gpus() {
        let p = policy(&[("a", &[("H100", 0.0, 16.0)])], BorrowedOnly);
        let mut inv = inventory(&[("H100", 2), ("H100", 2)]);
        inv.clusters[0].nodes[0].fractions_only = true;
        let s = State::new(p, &inv);
        let w = Work::new(&s, true, 0);
        let m = s.cat.model_index["H100"];
        let on_node = |plan: &Plan, node: usize| {
            plan.iter()
                .flatten()
                .all(|&(g, _)| s.gpu_node[g as usize] as usize == node)
        };
        let quarter = w.find(&req(1, "a", "development", 0.25), m, None).unwrap();
        assert!(on_node(&quarter, 0), "{quarter:?}");
        let one = w.find(&req(2, "a", "training", 1.0), m, None).unwrap();
        assert!(on_node(&one, 1), "{one:?}");
        assert!(w.find(&req(3, "a", "training", 3.0), m, None).is_none());
        let mut spread = req(4, "a", "training", 3.0);
        spread.allow_spread = true;
        assert!(
            w.find(&spread, m, None).is_none(),
            "2 whole GPUs exist, not 3"
        );
        let mut gang = req(5, "a", "training", 1.0);
        gang.replicas = 2;
        assert!(on_node(&w.find(&gang, m, None).unwrap(), 1));
        gang.replicas = 3;
        assert!(w.find(&gang, m, None).is_none());
        assert!(!w.fits_in(&req(6, "a", "training", 1.0), m, 0, &[0], &BTreeMap::new()));
    }

    /// Nine quarters on a cluster like the one where fractions once landed
    /// on GPUs that could not serve them: a whole-GPU node that hands out
    /// whole devices only, a node of 3 × `2g.20gb` MIG devices, a node of
    /// 4 time-sliced replicas, and a node of `1g.10gb` devices too small
    /// for a quarter of an 80 GB GPU. Seven units serve quarters; two
    /// quarters wait; no whole GPU is split and no `1g.10gb` is used.
    #[test]
    fn fractions_go_only_to_units_that_serve_them() {
        use crate::types::GpuUnit;
        let p = policy(&[("a", &[("H100", 0.0, 16.0)])], BorrowedOnly);
        let mut inv = inventory(&[("H100", 8), ("H100", 3), ("H100", 4), ("H100", 7)]);
        let unit = |name: &str, share: u16, fits: u16| GpuUnit {
            name: name.into(),
            share_milli: share,
            fits_milli: fits,
        };
        let nodes = &mut inv.clusters[0].nodes;
        nodes[0].whole_only = true;
        nodes[1].units = vec![unit("MIG 2g.20gb", 285, 250); 3];
        nodes[2].units = vec![unit("time-slice 1/4", 250, 250); 4];
        nodes[3].units = vec![unit("MIG 1g.10gb", 142, 125); 7];
        let mut s = State::new(p, &inv);
        let m = s.cat.model_index["H100"];
        let mut placed = Vec::new();
        for id in 1..=9 {
            let w = Work::new(&s, true, 0);
            let r = req(id, "a", "development", 0.25);
            let Some(plan) = w.find(&r, m, None) else {
                continue;
            };
            let (g, milli) = plan[0][0];
            let node = s.gpu_node[g as usize];
            placed.push(node);
            let n = &s.nodes[node as usize];
            let alloc = crate::types::Allocation {
                cluster: 0,
                replicas: vec![vec![crate::types::Shard {
                    node: n.local,
                    gpu: g - n.first_gpu,
                    milli: Milli(u64::from(milli)),
                }]],
            };
            s.start(std::sync::Arc::new(r), alloc, 0).unwrap();
        }
        placed.sort_unstable();
        // Time-sliced replicas (share 250) before the MIG devices (285).
        assert_eq!(placed, [1, 1, 1, 2, 2, 2, 2], "{placed:?}");
        // A unit serves one fraction: each is taken whole.
        assert_eq!(s.node_allocated(0, 1), vec![Milli(285); 3]);
        assert_eq!(s.node_allocated(0, 0), vec![Milli::ZERO; 8]);
        // A whole GPU still fits on the whole-GPU node, and only there.
        let w = Work::new(&s, true, 0);
        let plan = w.find(&req(20, "a", "training", 2.0), m, None).unwrap();
        assert!(plan[0].iter().all(|&(g, _)| s.gpu_node[g as usize] == 0));
        // A half fits no unit at all (the largest serves a quarter).
        assert!(w.find(&req(21, "a", "development", 0.5), m, None).is_none());
        // Capacity counts each unit's share, not a GPU per device.
        assert_eq!(s.capacity(), Milli(8000 + 3 * 285 + 4 * 250 + 7 * 142));
    }
}
