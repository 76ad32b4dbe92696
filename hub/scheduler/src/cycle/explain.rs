//! Pending reasons: why a request found no room, in words and numbers.

use axle_policy::{MILLI_PER_GPU, Milli};

use super::quota::ModelChoice;
use super::work::Work;
use crate::types::{PendingReason, WorkloadSpec};

impl<'s> Work<'s> {
    /// The reason a request found no room, with the largest free block.
    pub(super) fn explain_capacity(
        &self,
        spec: &WorkloadSpec,
        choices: &[ModelChoice],
        idle_only: bool,
    ) -> PendingReason {
        let models: Vec<(u16, u16)> = choices.iter().map(|c| (c.model, c.slot)).collect();
        let models = models.as_slice();
        let single = spec.replicas == 1 && !spec.allow_spread;
        let g = spec.gpus_per_replica;
        let model_names: Vec<&str> = models
            .iter()
            .map(|&(m, _)| self.s.cat.models[m as usize].as_str())
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
                .map(|&(m, _)| self.s.cat.largest_node[m as usize])
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

    pub(super) fn where_node(&self, node: u32) -> String {
        let n = &self.s.nodes[node as usize];
        format!(
            "{}/{}",
            self.s.clusters[n.cluster as usize].name, self.s.node_names[node as usize]
        )
    }
}
