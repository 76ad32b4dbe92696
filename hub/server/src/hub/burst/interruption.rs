//! A provider's notice that it takes a burst instance back (EC2 gives two
//! minutes before it reclaims spot capacity): the instance drains (no new
//! work) and what runs there is preempted with a grace period that ends
//! before the instance does, so a checkpointable workload saves its
//! progress and is re-queued instead of being killed mid-step.
//!
//! The notice reaches the hub two ways, both into [`Inner::burst_notice`]:
//! the instance's own spoke reads it from the instance metadata service and
//! carries it in its heartbeats (seconds after EC2 posts it), and the
//! provider's listing shows it (`InstanceState::Interrupting`, at the next
//! listing). The first one wins; the rest change nothing.

use tracing::{info, warn};

use super::super::Inner;
use super::super::applier::Effects;
use super::super::workloads::transition;
use crate::burst::lifecycle::BurstEvent;
use crate::lifecycle::{WEvent, WState};
use crate::records::*;

/// Seconds kept between the end of a noticed workload's grace period and
/// the reclaim: the spoke's SIGKILL, its report and the hub's commit fit in
/// them (and the provider's clock may run ahead of the hub's).
pub const NOTICE_MARGIN_S: u64 = 10;
/// The shortest grace period a noticed workload gets, even when the notice
/// came too late for any: a stop with none would mean "the class's".
pub const MIN_NOTICE_GRACE_S: u64 = 1;

/// The grace period left to a workload of a class with `class_grace_s`
/// when its machine is reclaimed at `at_ms` and it is `now`.
pub fn notice_grace_s(class_grace_s: u64, at_ms: u64, now: u64) -> u64 {
    let left_s = at_ms.saturating_sub(now) / 1000;
    class_grace_s
        .min(left_s.saturating_sub(NOTICE_MARGIN_S))
        .max(MIN_NOTICE_GRACE_S)
}

impl Inner {
    /// The spoke of `cluster` reports a notice that its machine is reclaimed
    /// at `at_ms`; only a burst instance's spoke can say so.
    pub(in crate::hub) fn spoke_notice(
        &mut self,
        cluster: &str,
        action: &str,
        at_ms: u64,
        fx: &mut Effects,
        now: u64,
    ) {
        let Some(id) = self.burst_of_cluster(cluster).map(|b| b.id.clone()) else {
            warn!(
                "spoke {cluster} reports an interruption notice ({action}), but it is no burst instance: ignored"
            );
            return;
        };
        self.burst_notice(&id, at_ms, &format!("its spoke ({action})"), fx, now);
    }

    /// Burst `id`'s instance is reclaimed at `at_ms` (`source`: who said
    /// so): no new work goes there, and what runs there is stopped in the
    /// time left and re-queued. Idempotent: a later notice changes nothing.
    pub(in crate::hub) fn burst_notice(
        &mut self,
        id: &str,
        at_ms: u64,
        source: &str,
        fx: &mut Effects,
        now: u64,
    ) {
        let Some(r) = self.bursts.get(id) else {
            return;
        };
        if !r.is_live() || r.interruption_at_ms.is_some() || r.state.instance_id().is_none() {
            return;
        }
        let (cluster, provider, workload) = (r.cluster.clone(), r.provider.clone(), r.workload);
        let instance = r.state.instance_id().unwrap_or_default().to_string();
        self.burst_step(id, BurstEvent::InterruptionNoticed);
        if let Some(r) = self.bursts.get_mut(id) {
            r.interruption_at_ms = Some(at_ms);
        }
        self.save_burst(fx, id);
        let left_s = at_ms.saturating_sub(now) / 1000;
        info!("burst {id}: {provider} reclaims instance {instance} in {left_s} s");
        self.event(
            fx,
            now,
            "burst_interruption_notice",
            Some(workload),
            Some(&cluster),
            format!(
                "burst {id}: {provider} gave notice ({source}) that it reclaims instance {instance} in {left_s} s; no new work goes there and what runs there is stopped in time and re-queued"
            ),
        );
        let running: Vec<u64> = self
            .workloads
            .values()
            .filter(|w| {
                matches!(w.state, WState::Placed | WState::Running)
                    && w.placement.as_ref().is_some_and(|p| p.cluster == cluster)
            })
            .map(|w| w.id)
            .collect();
        for wid in running {
            self.preempt_for_notice(wid, &cluster, at_ms, fx, now);
        }
        // The instance takes no new work (it is draining).
        self.rebuild(fx, now);
        self.changed();
    }

    /// Stops workload `wid` on `cluster` before its machine is reclaimed at
    /// `at_ms`: preempted (its checkpoint signal first, where it has one),
    /// with the class's grace period or the time left, whichever is shorter.
    fn preempt_for_notice(
        &mut self,
        wid: u64,
        cluster: &str,
        at_ms: u64,
        fx: &mut Effects,
        now: u64,
    ) {
        let class_grace = self
            .workloads
            .get(&wid)
            .map_or(super::super::DEFAULT_GRACE_S, |w| {
                super::super::messages::grace_of(&self.policy, &w.priority)
            });
        let grace = notice_grace_s(class_grace, at_ms, now);
        self.state.remove(wid);
        let Some(w) = self.workloads.get_mut(&wid) else {
            return;
        };
        if w.placement.take().is_none() {
            return;
        }
        let reason = format!(
            "preempted: its machine on {cluster} is reclaimed by the provider in {} s; stopped with a {grace} s grace period",
            at_ms.saturating_sub(now) / 1000
        );
        transition(w, WEvent::Preempt, now, reason.clone());
        w.preemptions += 1;
        let stopping = StoppingRecord {
            cluster: cluster.to_string(),
            epoch: w.epoch,
            legacy_cancel: false,
            grace_s: Some(grace),
        };
        w.stopping = Some(stopping.clone());
        self.request_stop(fx, wid, &stopping, reason.clone());
        self.save(fx, wid);
        self.event(fx, now, "preempted", Some(wid), Some(cluster), reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_period_ends_before_the_machine_does() {
        let now = 1_000_000;
        // Two minutes' notice: a 30 s class keeps its 30 s…
        assert_eq!(notice_grace_s(30, now + 120_000, now), 30);
        // …a 300 s class gets what is left less the margin.
        assert_eq!(
            notice_grace_s(300, now + 120_000, now),
            120 - NOTICE_MARGIN_S
        );
        // Too late for any: the least there is (never 0, "the class's").
        assert_eq!(notice_grace_s(300, now + 5_000, now), MIN_NOTICE_GRACE_S);
        assert_eq!(notice_grace_s(300, now - 5_000, now), MIN_NOTICE_GRACE_S);
    }
}
