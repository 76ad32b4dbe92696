//! Burst wishes: waiting workloads that may overflow to a cloud provider.

use super::CycleOptions;
use crate::state::State;
use crate::types::{BurstWanted, Decisions, WorkloadSpec};

pub(super) fn maybe_burst(
    state: &State,
    opts: &CycleOptions,
    spec: &WorkloadSpec,
    team: u32,
    class_allows: bool,
    now_ms: u64,
    out: &mut Decisions,
) {
    if !spec.burst_allowed || !class_allows {
        return;
    }
    let info = &state.cat.teams[team as usize];
    if info.burst_providers.is_empty() {
        return;
    }
    let waited_ms = now_ms.saturating_sub(spec.submit_time_ms);
    if waited_ms < state.cat.policy.settings.burst_wait_threshold_s * 1000 {
        return;
    }
    let headroom = match &opts.burst_headroom_usd {
        Some(m) => m.get(&info.name).copied().unwrap_or(0.0),
        None => info.burst_budget_usd_per_month,
    };
    if headroom <= 0.0 {
        return;
    }
    out.burst_wanted.push(BurstWanted {
        workload: spec.id,
        team: info.name.clone(),
        gpus_per_replica: spec.gpus_per_replica,
        replicas: spec.replicas,
        gpu_model: spec.gpu_model.clone(),
        providers: info.burst_providers.clone(),
        waited_ms,
    });
}
