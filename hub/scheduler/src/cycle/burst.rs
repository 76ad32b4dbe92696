//! Burst wishes: waiting workloads that may overflow to a cloud provider.

use super::CycleOptions;
use crate::state::State;
use crate::types::{BurstWanted, Decisions, PendingReason, WorkloadSpec};

/// Whether a workload waiting for `reason` could run on a cloud instance:
/// only when the capacity is missing, never when its team is at its limit,
/// has no quota for the model, or the request needs an image or can never fit
/// (a burst instance would sit idle and cost money).
pub(super) fn capacity_is_the_blocker(reason: &PendingReason) -> bool {
    matches!(
        reason,
        PendingReason::NoFreeCapacity { .. }
            | PendingReason::NoMatchingCluster { .. }
            // Not explained this cycle (a deep queue): a shape that failed
            // for capacity; a limit would have been found by admission.
            | PendingReason::NotEvaluated
    )
}

#[allow(clippy::too_many_arguments)]
pub(super) fn maybe_burst(
    state: &State,
    opts: &CycleOptions,
    spec: &WorkloadSpec,
    team: u32,
    class_allows: bool,
    reason: &PendingReason,
    now_ms: u64,
    out: &mut Decisions,
) -> Option<String> {
    if !capacity_is_the_blocker(reason) {
        return None;
    }
    let info = &state.cat.teams[team as usize];
    // Why it does not burst, for its pending reason (observed: a reason
    // never mentioned burst, so a user could not tell "not allowed" from
    // "not yet" from "budget spent").
    if !spec.burst_allowed {
        return Some("not asked for (submit with --burst to let it run on a cloud)".into());
    }
    if !class_allows {
        return Some(format!(
            "its class {} never bursts (burstAllowed: false)",
            spec.priority_class
        ));
    }
    if info.burst_providers.is_empty() {
        return Some(format!("team {} has no burst provider", info.name));
    }
    let waited_ms = now_ms.saturating_sub(spec.submit_time_ms);
    let threshold_s = state.cat.policy.settings.burst_wait_threshold_s;
    if waited_ms < threshold_s * 1000 {
        return Some(format!(
            "wanted once it has waited {threshold_s}s on-prem (burstWaitThresholdSeconds; {}s so far)",
            waited_ms / 1000
        ));
    }
    let headroom = match &opts.burst_headroom {
        Some(m) => m.get(&info.name).copied().unwrap_or_default(),
        None => info.burst_budget_per_month,
    };
    if headroom.is_zero() {
        return Some(format!(
            "team {}'s burst budget for this month is spent",
            info.name
        ));
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
    None
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use axle_policy::CrossTeamPreemption::BorrowedOnly;

    use super::*;
    use crate::testkit::{QuotaDef, inventory, policy, req};

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
            let reason = PendingReason::NotEvaluated;
            maybe_burst(&s, opts, &spec, 0, true, &reason, now, &mut out);
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

    /// One H100, held by `holder`'s `class` work; team a (burst on `aws`,
    /// $100) has burst-allowed `class` workloads `waiting` behind it, past
    /// the burst threshold. Returns the state and that moment.
    fn one_gpu_held(
        quotas: &[QuotaDef<'_>],
        holder: &str,
        class: &str,
        waiting: std::ops::RangeInclusive<u64>,
    ) -> (State, u64) {
        let teams: Vec<(&str, &[QuotaDef<'_>])> = vec![("a", quotas), ("b", quotas)];
        let mut p = (*policy(&teams, BorrowedOnly)).clone();
        let team = p.teams.get_mut("a").unwrap();
        team.burst.providers = vec!["aws".into()];
        team.burst.monthly_budget = axle_policy::Usd::from_dollars(100);
        let mut s = State::new(std::sync::Arc::new(p), &inventory(&[("H100", 1)]));
        crate::testkit::run(&mut s, req(1, holder, class, 1.0), 0, &[0], 0);
        for id in waiting {
            let mut spec = req(id, "a", class, 1.0);
            spec.burst_allowed = true;
            s.submit(spec).unwrap();
        }
        let now = s.cat.policy.settings.burst_wait_threshold_s * 1000;
        (s, now)
    }

    fn cycle_at(s: &State, now: u64, explain: bool) -> Decisions {
        let opts = CycleOptions {
            explain,
            ..CycleOptions::default()
        };
        crate::cycle::cycle(s, now, &opts)
    }

    #[test]
    fn a_cycle_that_does_not_explain_still_wishes_a_burst_for_every_waiting_workload() {
        // On-prem is full; three of team a's workloads wait past the
        // threshold. A cycle that skips explaining once used to wish a
        // burst for the head of the queue only: the others never burst
        // until something else changed.
        // The GPU is held by the team itself, or by another team borrowing
        // it (then a preemption search runs and fails first).
        for holder in ["a", "b"] {
            let (s, now) = one_gpu_held(&[("H100", 0.0, 8.0)], holder, "training", 2..=4);
            for explain in [true, false] {
                let d = cycle_at(&s, now, explain);
                assert!(d.placements.is_empty() && d.preemptions.is_empty());
                let wished: Vec<u64> = d.burst_wanted.iter().map(|b| b.workload).collect();
                assert_eq!(
                    wished,
                    vec![2, 3, 4],
                    "held by {holder}, explain: {explain}"
                );
            }
        }
    }

    #[test]
    fn a_workload_a_limit_holds_back_wishes_no_burst_even_unexplained() {
        // Production is never preempted and runs only within the guarantee
        // (1 GPU, taken): a burst instance would idle, paid for. Seen: the
        // hub launched one, terminated it idle, and launched again.
        let (s, now) = one_gpu_held(&[("H100", 1.0, 8.0)], "a", "production", 2..=3);
        for explain in [true, false] {
            let d = cycle_at(&s, now, explain);
            assert!(
                d.burst_wanted.is_empty(),
                "explain: {explain}: {:?}",
                d.burst_wanted
            );
        }
    }

    #[test]
    fn only_missing_capacity_is_worth_a_burst() {
        use axle_policy::Milli;
        assert!(capacity_is_the_blocker(&PendingReason::NotEvaluated));
        let at_limit = PendingReason::TeamAtLimit {
            team: "a".into(),
            gpu_class: "H100".into(),
            limit: Milli(8000),
            used: Milli(8000),
            requested: Milli(1000),
            within_guarantee_only: false,
            own_preemptible: Milli::ZERO,
        };
        assert!(
            !capacity_is_the_blocker(&at_limit),
            "a cloud GPU counts against the same limit: it would idle"
        );
    }
    #[test]
    fn a_workload_that_does_not_burst_says_why() {
        // Observed: a pending reason never mentioned burst.
        let mut p = (*policy(&[("a", &[("H100", 0.0, 8.0)])], BorrowedOnly)).clone();
        let s = State::new(std::sync::Arc::new(p.clone()), &inventory(&[("H100", 1)]));
        let reason = PendingReason::NotEvaluated;
        let why = |s: &State, spec: &WorkloadSpec, class_allows: bool, now: u64| {
            let mut out = Decisions::default();
            maybe_burst(
                s,
                &CycleOptions::default(),
                spec,
                0,
                class_allows,
                &reason,
                now,
                &mut out,
            )
        };
        let mut spec = req(1, "a", "training", 1.0);
        assert!(
            why(&s, &spec, true, 0)
                .unwrap()
                .contains("submit with --burst")
        );
        spec.burst_allowed = true;
        assert!(
            why(&s, &spec, false, 0)
                .unwrap()
                .contains("burstAllowed: false")
        );
        assert_eq!(
            why(&s, &spec, true, 0).as_deref(),
            Some("team a has no burst provider")
        );
        let team = p.teams.get_mut("a").unwrap();
        team.burst.providers = vec!["aws".into()];
        let s = State::new(std::sync::Arc::new(p.clone()), &inventory(&[("H100", 1)]));
        assert!(
            why(&s, &spec, true, 0)
                .unwrap()
                .contains("burstWaitThresholdSeconds")
        );
        let late = s.cat.policy.settings.burst_wait_threshold_s * 1000;
        assert_eq!(
            why(&s, &spec, true, late).as_deref(),
            Some("team a's burst budget for this month is spent")
        );
        p.teams.get_mut("a").unwrap().burst.monthly_budget = axle_policy::Usd::from_dollars(10);
        let s = State::new(std::sync::Arc::new(p), &inventory(&[("H100", 1)]));
        assert_eq!(
            why(&s, &spec, true, late),
            None,
            "wanted: the hub says the rest"
        );
    }
}

#[cfg(test)]
mod cluster_choice_tests {
    use axle_policy::CrossTeamPreemption::BorrowedOnly;
    use axle_policy::Usd;

    use crate::cycle::{CycleOptions, cycle};
    use crate::state::State;
    use crate::testkit::{inventory, policy, req};
    use crate::types::Inventory;

    /// Two one-GPU clusters, `a` then `b`, with the given prices per GPU-hour.
    fn two_clusters(a_cents: u64, b_cents: u64) -> Inventory {
        let mut a = inventory(&[("H100", 1)]).clusters.remove(0);
        a.name = "a".into();
        a.price_per_gpu_hour = Usd::from_cents(a_cents);
        let mut b = a.clone();
        b.name = "b".into();
        b.price_per_gpu_hour = Usd::from_cents(b_cents);
        Inventory {
            clusters: vec![a, b],
        }
    }

    fn placed_on(inv: Inventory, team: &str) -> Option<String> {
        let p = policy(
            &[("t", &[("H100", 0.0, 8.0)]), ("u", &[("H100", 0.0, 8.0)])],
            BorrowedOnly,
        );
        let mut s = State::new(p, &inv);
        s.submit(req(1, team, "training", 1.0)).unwrap();
        let d = cycle(&s, 0, &CycleOptions::default());
        d.placements
            .first()
            .map(|pl| s.cluster_name(pl.allocation.cluster).to_string())
    }

    #[test]
    fn among_clusters_that_fit_equally_the_cheaper_wins() {
        let mut inv = two_clusters(300, 200);
        assert_eq!(
            placed_on(inv.clone(), "t").as_deref(),
            Some("a"),
            "unordered: the first"
        );
        inv.order_by_price();
        assert_eq!(
            placed_on(inv, "t").as_deref(),
            Some("b"),
            "$2.00 beats $3.00"
        );
    }

    #[test]
    fn a_cluster_a_team_pays_for_takes_only_that_teams_work() {
        let mut inv = two_clusters(100, 100);
        inv.clusters.truncate(1);
        inv.clusters[0].owner_team = Some("t".into());
        assert_eq!(
            placed_on(inv.clone(), "u"),
            None,
            "another team's burst instance"
        );
        assert_eq!(placed_on(inv, "t").as_deref(), Some("a"));
    }
}
