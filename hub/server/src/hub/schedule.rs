//! One scheduling cycle, and its decisions (preemptions, placements,
//! pending reasons, burst wishes) turned into records, events and spoke
//! messages.

use std::sync::Arc;

use axle_policy::{MILLI_PER_GPU, Milli};
use axle_scheduler::{CycleOptions, cycle};
use tracing::{debug, error};

use super::applier::Effects;
use super::workloads::transition;
use super::{EXPLAIN_ALWAYS_BELOW, EXPLAIN_EVERY_MS, Inner};
use crate::lifecycle::WEvent;
use crate::records::*;

impl Inner {
    /// Runs one scheduling cycle and turns its decisions into record changes,
    /// events and spoke messages.
    pub(super) fn schedule(&mut self, fx: &mut Effects, now: u64) {
        // Explaining every waiting workload costs O(queue); with a deep queue
        // it is done at most once per EXPLAIN_EVERY_MS, and the cycles in
        // between skip what provably cannot run (placements are the same).
        let explain = self.explain_stale
            && (self.state.pending_len() <= EXPLAIN_ALWAYS_BELOW
                || now.saturating_sub(self.last_explain_ms) >= EXPLAIN_EVERY_MS);
        if explain {
            self.explain_stale = false;
            self.last_explain_ms = now;
        }
        let opts = CycleOptions {
            explain,
            burst_headroom: self.burst_headroom(now),
            ..CycleOptions::default()
        };
        let d = cycle(&self.state, now, &opts);
        if let Err(e) = self.state.apply(&d, now) {
            error!("cannot apply the cycle's own decisions: {e}");
            return;
        }
        for p in &d.preemptions {
            let id = p.workload;
            let by = self
                .workloads
                .get(&p.for_workload)
                .map(|f| (f.team.clone(), f.priority.clone()))
                .unwrap_or_default();
            // Its GPUs now belong to the preemptor; it waits for the stop to
            // be confirmed before it may run again.
            self.state.remove(id);
            let Some(w) = self.workloads.get_mut(&id) else {
                continue;
            };
            let Some(pl) = w.placement.take() else {
                continue;
            };
            let reason = format!("preempted for workload {}: {}", p.for_workload, p.reason);
            transition(w, WEvent::Preempt, now, reason.clone());
            w.preemptions += 1;
            w.lost_gpu_ms = w.lost_gpu_ms.saturating_add(p.lost_gpu_ms);
            if w.preemption_log.len() >= MAX_HISTORY {
                w.preemption_log.remove(0);
            }
            w.preemption_log.push(PreemptionRecord {
                at_ms: now,
                by_workload: p.for_workload,
                by_team: by.0,
                by_priority: by.1,
                reason: p.reason.to_string(),
                lost_gpu_ms: p.lost_gpu_ms,
            });
            let stopping = StoppingRecord {
                cluster: pl.cluster.clone(),
                epoch: w.epoch,
                legacy_cancel: false,
                grace_s: None,
            };
            w.stopping = Some(stopping.clone());
            // The grace period is the victim's class's (as in the decision).
            self.request_stop(fx, id, &stopping, reason.clone());
            self.save(fx, id);
            self.event(fx, now, "preempted", Some(id), Some(&pl.cluster), reason);
        }
        for p in &d.placements {
            let id = p.workload;
            let cluster = self.state.cluster_name(p.allocation.cluster).to_string();
            let replicas: Vec<ReplicaRecord> = p
                .allocation
                .replicas
                .iter()
                .map(|shards| ReplicaRecord {
                    shards: shards
                        .iter()
                        .map(|s| {
                            (
                                self.state
                                    .node_name(p.allocation.cluster, s.node)
                                    .to_string(),
                                s.gpu,
                                s.milli.0 as u32,
                            )
                        })
                        .collect(),
                })
                .collect();
            let Some(w) = self.workloads.get_mut(&id) else {
                continue;
            };
            w.epoch += 1;
            let desc = describe_placement(&cluster, &replicas);
            let mut reason = format!("placed on {desc}");
            if !p.after_preempting.is_empty() {
                reason.push_str(&format!(
                    " after preempting {}",
                    p.after_preempting
                        .iter()
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            transition(w, WEvent::Place, now, reason.clone());
            w.placement = Some(PlacementRecord {
                cluster: cluster.clone(),
                replicas,
            });
            self.reasons.remove(&id);
            self.burst_noted.remove(&id);
            self.burst_rt.notes.remove(&id);
            let msg = self.assign_msg(id);
            fx.msgs.push((cluster.clone(), msg));
            self.save(fx, id);
            self.event(
                fx,
                now,
                "placed",
                Some(id),
                Some(&cluster),
                format!("workload {id} {reason}"),
            );
        }
        for (id, mut reason) in d.pending {
            // What the burst controller knows (the instance it waits for,
            // why a launch was refused) says more than the scheduler's
            // note and outlives the cycle that replaced the reason.
            if let (Some(note), axle_scheduler::PendingReason::NoFreeCapacity { burst, .. }) =
                (self.burst_rt.notes.get(&id), &mut reason)
            {
                *burst = Some(note.clone());
            }
            // Kept when unchanged: readers (the list's page cache) tell
            // an unchanged reason by its pointer.
            if self.reasons.get(&id).is_none_or(|r| **r != reason) {
                self.reasons.insert(id, Arc::new(reason));
            }
        }
        self.burst_reconcile(&d.burst_wanted, fx, now);
        for b in d.burst_wanted {
            if self.burst_noted.insert(b.workload) {
                let msg = format!(
                    "workload {} waited {}s and may burst to {}",
                    b.workload,
                    b.waited_ms / 1000,
                    b.providers.join(", ")
                );
                self.event(fx, now, "burst_wanted", Some(b.workload), None, msg);
            }
        }
        debug!(
            placed = d.placements.len(),
            preempted = d.preemptions.len(),
            pending = self.state.pending_len(),
            "cycle"
        );
    }
}

fn describe_placement(cluster: &str, replicas: &[ReplicaRecord]) -> String {
    let parts: Vec<String> = replicas
        .iter()
        .flat_map(|r| r.by_node())
        .map(|(node, gpus)| {
            let gpus: Vec<String> = gpus
                .iter()
                .map(|&(g, m)| {
                    if u64::from(m) == MILLI_PER_GPU {
                        g.to_string()
                    } else {
                        format!("{g}:{}", Milli(u64::from(m)))
                    }
                })
                .collect();
            format!("{node} GPU {}", gpus.join(","))
        })
        .collect();
    format!("{cluster} ({})", parts.join("; "))
}
