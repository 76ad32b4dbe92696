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
    let headroom = match &opts.burst_headroom {
        Some(m) => m.get(&info.name).copied().unwrap_or_default(),
        None => info.burst_budget_per_month,
    };
    if headroom.is_zero() {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use axle_policy::CrossTeamPreemption::BorrowedOnly;

    use super::*;
    use crate::testkit::{inventory, policy, req};

    #[test]
    fn a_burst_is_wanted_after_the_threshold_with_budget_left() {
        let mut p = (*policy(&[("a", &[("H100", 0.0, 8.0)])], BorrowedOnly)).clone();
        let team = p.teams.get_mut("a").unwrap();
        team.burst.providers = vec!["aws".into()];
        team.burst.monthly_budget = axle_policy::Usd::from_dollars(100);
        let s = State::new(std::sync::Arc::new(p), &inventory(&[("H100", 1)]));
        let mut spec = req(1, "a", "training", 1.0);
        spec.burst_allowed = true;
        let threshold_ms = s.cat.policy.settings.burst_wait_threshold_s * 1000;
        let wants = |now: u64, opts: &CycleOptions| {
            let mut out = Decisions::default();
            maybe_burst(&s, opts, &spec, 0, true, now, &mut out);
            out.burst_wanted.len()
        };
        let opts = CycleOptions::default();
        assert_eq!(wants(threshold_ms - 1, &opts), 0, "not waited long enough");
        assert_eq!(wants(threshold_ms, &opts), 1);
        let spent = CycleOptions {
            burst_headroom: Some(BTreeMap::from([("a".to_string(), axle_policy::Usd::ZERO)])),
            ..CycleOptions::default()
        };
        assert_eq!(wants(threshold_ms, &spent), 0, "no budget left");
    }
}
