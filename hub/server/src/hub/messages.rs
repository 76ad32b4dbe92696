//! What the hub sends to spokes: assignments (with everything a driver
//! needs to run the workload) and stops (with the class's grace period).

use axle_policy::Policy;
use axle_proto::pb;

use super::applier::Effects;
use super::{DEFAULT_GRACE_S, Inner};
use crate::lifecycle::WState;
use crate::records::*;

pub(super) fn grace_of(policy: &Policy, class: &str) -> u64 {
    policy
        .priority_classes
        .get(class)
        .map(|c| c.grace_period_s)
        .unwrap_or(DEFAULT_GRACE_S)
}

pub(super) fn stop_msg(
    id: u64,
    epoch: u64,
    reason: pb::StopReason,
    grace: u64,
    message: String,
) -> pb::HubMessage {
    pb::HubMessage {
        msg: Some(pb::hub_message::Msg::Stop(pb::Stop {
            workload_id: id,
            epoch,
            reason: reason as i32,
            grace_period_s: grace,
            message,
        })),
    }
}

impl Inner {
    /// Sends (or re-sends) the stop a `stopping` record stands for, to its
    /// cluster, with the grace period of the workload's class (or the
    /// record's, when shorter: the machine is reclaimed sooner).
    pub(super) fn request_stop(
        &self,
        fx: &mut Effects,
        id: u64,
        s: &StoppingRecord,
        message: String,
    ) {
        let w = self.workloads.get(&id);
        let class = w
            .map(|w| grace_of(&self.policy, &w.priority))
            .unwrap_or(DEFAULT_GRACE_S);
        let grace = s.grace_s.map_or(class, |g| g.min(class));
        let reason = if w.is_some_and(|w| w.state == WState::Cancelling) {
            pb::StopReason::Cancelled
        } else {
            pb::StopReason::Preempted
        };
        fx.msgs.push((
            s.cluster.clone(),
            stop_msg(id, s.epoch, reason, grace, message),
        ));
    }

    /// The image a workload runs with on `cluster`: its own, else the
    /// spoke's default, else the policy's `defaultImage` for the cluster.
    fn image_for(&self, w: &WorkloadRecord, cluster: &str) -> String {
        w.image
            .clone()
            .or_else(|| {
                self.clusters
                    .get(cluster)
                    .and_then(|c| c.default_image.clone())
            })
            .or_else(|| {
                self.policy
                    .clusters
                    .get(cluster)
                    .and_then(|c| c.default_image.clone())
            })
            .unwrap_or_default()
    }

    pub(super) fn assign_msg(&self, id: u64) -> pb::HubMessage {
        let w = &self.workloads[&id];
        let p = w.placement.as_ref().expect("placed");
        pb::HubMessage {
            msg: Some(pb::hub_message::Msg::Assign(pb::Assign {
                workload_id: id,
                epoch: w.epoch,
                name: w.name.clone(),
                team: w.team.clone(),
                command: w.command.clone(),
                env: w.env.clone().into_iter().collect(),
                // A spread replica spans nodes: the spoke runs one process per node piece.
                replicas: p
                    .replicas
                    .iter()
                    .flat_map(|r| {
                        r.by_node().into_iter().map(|(node, gpus)| pb::Replica {
                            node: node.to_string(),
                            gpus: gpus
                                .into_iter()
                                .map(|(index, milli)| pb::GpuShare { index, milli })
                                .collect(),
                        })
                    })
                    .collect(),
                grace_period_s: grace_of(&self.policy, &w.priority),
                max_runtime_s: w.max_runtime_s.unwrap_or(0),
                checkpoint_signal: w.checkpoint_signal.clone().unwrap_or_default(),
                image: self.image_for(w, &p.cluster),
                priority: w.priority.clone(),
                // Epochs count placements from 1.
                restart_count: u32::try_from(w.epoch.saturating_sub(1)).unwrap_or(u32::MAX),
            })),
        }
    }
}
