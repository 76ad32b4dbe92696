//! Records ↔ the scheduler's state: the inventory the scheduler plans on
//! (from the clusters' records and their spokes' states), the workload
//! spec of a record, and the rebuild of `State` from the records after a
//! start or an inventory change.

use std::collections::BTreeMap;
use std::sync::Arc;

use axle_policy::{Milli, Usd};
use axle_scheduler::{
    Allocation, ClusterInventory, Inventory, NodeInventory, Shard, State, WorkloadSpec,
};
use tracing::warn;

use super::Inner;
use super::applier::Effects;
use super::workloads::transition;
use crate::lifecycle::{WEvent, WState};
use crate::records::*;

/// The scheduler's view of a workload; `runtimes` gives the run time it is
/// expected to take when it names no max runtime.
pub(super) fn spec_of(w: &WorkloadRecord, runtimes: &axle_scheduler::RuntimeStats) -> WorkloadSpec {
    WorkloadSpec {
        expected_runtime: w
            .max_runtime_s
            .is_none()
            .then(|| runtimes.estimate(&w.team, &w.priority, &w.name))
            .flatten(),
        id: w.id,
        team: w.team.clone(),
        priority_class: w.priority.clone(),
        gpus_per_replica: Milli(w.gpus_milli),
        replicas: w.replicas,
        gpu_model: w.gpu_model.clone(),
        regions: w.regions.clone(),
        allow_spread: w.allow_spread,
        burst_allowed: w.burst_allowed,
        submit_time_ms: w.submitted_at_ms,
        checkpoint_interval_s: w.checkpoint_interval_s,
        max_runtime_s: w.max_runtime_s,
        has_image: w.image.is_some(),
    }
}

impl Inner {
    pub(super) fn inventory(&self) -> Inventory {
        let mut inv = Inventory {
            clusters: self
                .clusters
                .iter()
                .map(|(name, c)| {
                    let burst = self.burst_of_cluster(name);
                    (name, c, burst)
                })
                .map(|(name, c, burst)| ClusterInventory {
                    name: name.clone(),
                    region: c.region.clone(),
                    // A burst instance takes work only while Ready (not
                    // draining or terminating), and only its team's.
                    schedulable: c.session.schedulable()
                        && burst.is_none_or(|b| {
                            matches!(b.state, crate::burst::lifecycle::BurstState::Ready { .. })
                        }),
                    price_per_gpu_hour: match burst {
                        Some(b) => Usd::from_micros(
                            b.offer.price_per_hour.micros() / u64::from(b.offer.gpus.max(1)),
                        ),
                        None => self
                            .policy
                            .clusters
                            .get(name)
                            .map_or(Usd::ZERO, |p| p.price_per_gpu_hour),
                    },
                    owner_team: burst.map(|b| b.team.clone()),
                    // Jobs need an image: without a default, image-less
                    // workloads go elsewhere.
                    needs_image: c.runs_images()
                        && c.default_image.is_none()
                        && self
                            .policy
                            .clusters
                            .get(name)
                            .is_none_or(|p| p.default_image.is_none()),
                    nodes: c
                        .nodes
                        .iter()
                        .flat_map(|n| self.node_inventory(n))
                        .collect(),
                })
                .collect(),
        };
        // Among clusters that fit equally, the cheaper wins.
        inv.order_by_price();
        inv
    }

    /// One inventory node per GPU model on the node, with its fractional
    /// units (MIG devices, time-sliced replicas) when it has any.
    fn node_inventory(&self, n: &crate::records::NodeRecord) -> Vec<NodeInventory> {
        let mut by_model: BTreeMap<&str, Vec<&crate::records::GpuRecord>> = BTreeMap::new();
        for g in &n.gpus {
            by_model.entry(&g.model).or_default().push(g);
        }
        by_model
            .into_iter()
            .map(|(m, gpus)| {
                let count = gpus.iter().map(|g| g.index + 1).max().unwrap_or(0);
                let mem = gpus
                    .iter()
                    .find(|g| g.unit.is_empty())
                    .or(gpus.first())
                    .map_or(0, |g| g.memory_mb);
                let units = if gpus.iter().any(|g| !g.unit.is_empty()) {
                    (0..count)
                        .map(|i| match gpus.iter().find(|g| g.index == i) {
                            Some(g) if !g.unit.is_empty() => self.unit_of(m, g),
                            _ => axle_scheduler::GpuUnit::whole(),
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                NodeInventory {
                    name: n.name.clone(),
                    gpu_model: m.to_string(),
                    gpu_count: count,
                    gpu_memory_mb: mem,
                    fractions_only: gpus.iter().any(|g| g.fractions_only && g.unit.is_empty()),
                    whole_only: n.whole_only,
                    units,
                    topology: (!n.topology.is_empty()).then(|| n.topology.clone()),
                }
            })
            .collect()
    }

    /// A fractional unit as the scheduler sees it. The largest fraction a
    /// MIG device serves is its memory over a whole GPU's (the policy's
    /// `fractionMemoryGb` for the model, else what the node reported); a
    /// time-sliced replica serves its share.
    fn unit_of(&self, model: &str, g: &crate::records::GpuRecord) -> axle_scheduler::GpuUnit {
        let share = g.share_milli.min(1000) as u16;
        let whole_mb = self
            .policy
            .settings
            .fraction_memory_gb
            .get(model)
            .map(|gb| gb * 1024)
            .unwrap_or(g.whole_memory_mb);
        let fits = if g.unit.contains("mig-") && whole_mb > 0 {
            (g.memory_mb.saturating_mul(1000) / whole_mb).min(1000) as u16
        } else {
            share
        };
        axle_scheduler::GpuUnit {
            name: g.unit_name(),
            share_milli: share,
            fits_milli: fits,
        }
    }

    /// Maps a stored placement onto the current inventory's indices.
    fn allocation_of(&self, inv: &Inventory, p: &PlacementRecord) -> Option<Allocation> {
        let ci = inv.clusters.iter().position(|c| c.name == p.cluster)?;
        let c = &inv.clusters[ci];
        let replicas = p
            .replicas
            .iter()
            .map(|r| {
                r.shards
                    .iter()
                    .map(|(node, gpu, milli)| {
                        let ni = c.nodes.iter().position(|n| &n.name == node)?;
                        Some(Shard {
                            node: ni as u32,
                            gpu: *gpu,
                            milli: Milli(u64::from(*milli)),
                        })
                    })
                    .collect::<Option<Vec<Shard>>>()
            })
            .collect::<Option<Vec<Vec<Shard>>>>()?;
        Some(Allocation {
            cluster: ci as u32,
            replicas,
        })
    }

    /// Rebuilds the scheduler state from the records (after start, or when
    /// inventory or policy changes).
    pub(super) fn rebuild(&mut self, fx: &mut Effects, now: u64) {
        let inv = self.inventory();
        let mut state = State::new(self.policy.clone(), &inv);
        let ids: Vec<u64> = self.workloads.keys().collect();
        for id in ids {
            let w = &self.workloads[&id];
            if w.state == WState::Cancelling && w.placement.is_none() {
                // Cancelled while preempting: its GPUs went to the
                // preemptor; only its stop is awaited.
                continue;
            }
            if w.state.holds_gpus() {
                let alloc = w
                    .placement
                    .as_ref()
                    .and_then(|p| self.allocation_of(&inv, p));
                let started = w.started_at_ms.unwrap_or(w.submitted_at_ms);
                let res = match alloc {
                    Some(a) => state
                        .start(Arc::new(spec_of(w, &self.runtimes)), a, started)
                        .map_err(|e| e.to_string()),
                    None => Err("its placement no longer exists".to_string()),
                };
                if let Err(e) = res {
                    let w = self.workloads.get_mut(&id).expect("listed id");
                    if w.state == WState::Cancelling {
                        // Its stop is still awaited; it waits outside the
                        // scheduler (nothing else may be placed on GPUs that
                        // no longer exist anyway).
                        warn!("cancelling workload {id}: cannot restore placement: {e}");
                        continue;
                    }
                    warn!("workload {id}: cannot restore placement: {e}; re-queueing");
                    transition(w, WEvent::Requeue, now, format!("re-queued: {e}"));
                    w.placement = None;
                    let _ = state.submit(spec_of(w, &self.runtimes));
                    self.save(fx, id);
                }
            } else if w.state == WState::Pending
                && let Err(e) = state.submit(spec_of(w, &self.runtimes))
            {
                let w = self.workloads.get_mut(&id).expect("listed id");
                let msg = format!("no longer valid under policy {}: {e}", self.policy.revision);
                transition(w, WEvent::Cancel, now, msg.clone());
                w.finished_at_ms = Some(now);
                self.save(fx, id);
                self.event(fx, now, "cancelled", Some(id), None, msg);
            }
        }
        self.state = state;
        self.changed();
    }
}
