//! Conversions from stored records to API views (the HTTP JSON types and the
//! gRPC user messages): one module per boundary.

use axle_policy::MILLI_PER_GPU;
use axle_proto::{api, pb};

use crate::lifecycle::WState;
use crate::records::{EventRecord, WorkloadRecord};

pub fn workload(
    w: &WorkloadRecord,
    reason: Option<&axle_scheduler::PendingReason>,
) -> api::WorkloadView {
    let stop_on = w
        .stopping
        .as_ref()
        .map_or("its cluster", |s| s.cluster.as_str());
    let pending_reason = match (w.state, reason) {
        (WState::Pending, Some(r)) => Some(r.to_string()),
        (WState::Pending, None) => Some("queued; the next scheduling cycle evaluates it".into()),
        (WState::Preempting, _) => Some(format!(
            "preempted; waiting for its stop on {stop_on} to be confirmed before it is re-queued"
        )),
        _ => None,
    };
    // The reason's numbers, for scripts (`-o json`).
    let pending_detail = match (w.state, reason) {
        (WState::Pending, Some(r)) => serde_json::to_value(r).ok(),
        _ => None,
    };
    api::WorkloadView {
        id: w.id,
        pending_detail,
        name: w.name.clone(),
        team: w.team.clone(),
        priority: w.priority.clone(),
        gpus: w.gpus_milli as f64 / MILLI_PER_GPU as f64,
        gang: w.replicas,
        gpu_model: w.gpu_model.clone(),
        image: w.image.clone(),
        command: w.command.clone(),
        state: w.state.as_str().to_string(),
        pending_reason,
        cluster: w.placement.as_ref().map(|p| p.cluster.clone()),
        replicas: w
            .placement
            .iter()
            .flat_map(|p| &p.replicas)
            .flat_map(|r| r.by_node())
            .map(|(node, gpus)| api::ReplicaView {
                node: node.to_string(),
                gpus: gpus
                    .into_iter()
                    .map(|(index, milli)| api::GpuShareView {
                        index,
                        fraction: f64::from(milli) / MILLI_PER_GPU as f64,
                        unit: None,
                    })
                    .collect(),
            })
            .collect(),
        epoch: w.epoch,
        submitted_at_ms: w.submitted_at_ms,
        started_at_ms: w.started_at_ms,
        finished_at_ms: w.finished_at_ms,
        exit_code: w.exit_code,
        preemptions: w.preemptions,
        checkpointable: w.checkpoint_interval_s.is_some(),
        checkpoint_interval_s: w.checkpoint_interval_s,
        preemption_log: w
            .preemption_log
            .iter()
            .map(|p| api::PreemptionView {
                at_ms: p.at_ms,
                by_workload: p.by_workload,
                by_team: p.by_team.clone(),
                by_priority: p.by_priority.clone(),
                reason: p.reason.clone(),
                lost_gpu_hours: p.lost_gpu_ms as f64 / 3.6e6,
            })
            .collect(),
        lost_gpu_hours: w.lost_gpu_ms as f64 / 3.6e6,
        run_ms: w.run_ms,
        history: w
            .history
            .iter()
            .map(|t| api::TransitionView {
                at_ms: t.at_ms,
                from: t.from.as_str().to_string(),
                to: t.to.as_str().to_string(),
                reason: t.reason.clone(),
            })
            .collect(),
    }
}

pub fn event(e: &EventRecord) -> api::EventView {
    api::EventView {
        seq: e.seq,
        at_ms: e.at_ms,
        kind: e.kind.clone(),
        workload: e.workload,
        cluster: e.cluster.clone(),
        message: e.message.clone(),
        policy_revision: e.policy_revision.clone(),
        actor: e.actor.clone(),
        auth: e.auth.clone(),
    }
}

pub fn workload_pb(v: &api::WorkloadView) -> pb::Workload {
    pb::Workload {
        id: v.id,
        name: v.name.clone(),
        team: v.team.clone(),
        priority: v.priority.clone(),
        gpus: v.gpus,
        gang: v.gang,
        gpu_model: v.gpu_model.clone().unwrap_or_default(),
        command: v.command.clone(),
        state: v.state.clone(),
        pending_reason: v.pending_reason.clone().unwrap_or_default(),
        cluster: v.cluster.clone().unwrap_or_default(),
        replicas: v
            .replicas
            .iter()
            .map(|r| pb::Replica {
                node: r.node.clone(),
                gpus: r
                    .gpus
                    .iter()
                    .map(|g| pb::GpuShare {
                        index: g.index,
                        milli: (g.fraction * MILLI_PER_GPU as f64).round() as u32,
                    })
                    .collect(),
            })
            .collect(),
        epoch: v.epoch,
        submitted_at_ms: v.submitted_at_ms,
        started_at_ms: v.started_at_ms.unwrap_or(0),
        finished_at_ms: v.finished_at_ms.unwrap_or(0),
        exit_code: v.exit_code.unwrap_or(0),
        history: v
            .history
            .iter()
            .map(|t| pb::Transition {
                at_ms: t.at_ms,
                from: t.from.clone(),
                to: t.to.clone(),
                reason: t.reason.clone(),
            })
            .collect(),
    }
}

pub fn submit_from_pb(r: pb::SubmitRequest) -> api::SubmitRequest {
    let opt = |s: String| if s.is_empty() { None } else { Some(s) };
    api::SubmitRequest {
        team: r.team,
        name: opt(r.name),
        command: r.command,
        gpus: r.gpus,
        gpu_model: opt(r.gpu_model),
        priority: opt(r.priority),
        gang: if r.gang == 0 { None } else { Some(r.gang) },
        regions: r.regions,
        allow_spread: r.allow_spread,
        burst_allowed: r.burst_allowed,
        idempotency_key: opt(r.idempotency_key),
        env: r.env.into_iter().collect(),
        max_runtime_s: if r.max_runtime_s == 0 {
            None
        } else {
            Some(r.max_runtime_s)
        },
        checkpointable: r.checkpointable,
        checkpoint_interval_s: (r.checkpoint_interval_s > 0).then_some(r.checkpoint_interval_s),
        checkpoint_signal: opt(r.checkpoint_signal),
        image: opt(r.image),
    }
}
