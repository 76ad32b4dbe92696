//! What spokes report about workloads: started, exited, stopped — and the
//! two outcomes of a report: re-queue (the spoke no longer runs it) and a
//! confirmed stop.

use axle_proto::pb;
use tracing::warn;

use super::Inner;
use super::applier::Effects;
use super::messages::stop_msg;
use super::snapshot::spec_of;
use super::workloads::transition;
use crate::lifecycle::{WEvent, WState};

/// Most bytes of a spoke's message about a workload kept (in its history
/// and events): a reason and a traceback's last line fit; the workload's
/// log holds the rest.
pub const MAX_STATUS_MESSAGE_BYTES: usize = 2048;

/// `message` as the hub keeps it: hidden characters escaped (it is shown
/// on terminals) and at most [`MAX_STATUS_MESSAGE_BYTES`], saying what was cut.
pub(super) fn bounded_message(message: &str) -> String {
    let shown = axle_policy::text::printable(message);
    if shown.len() <= MAX_STATUS_MESSAGE_BYTES {
        return shown.into_owned();
    }
    let mut end = MAX_STATUS_MESSAGE_BYTES;
    while !shown.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… [{} more bytes; see the workload's logs]",
        &shown[..end],
        shown.len() - end
    )
}

impl Inner {
    pub(super) fn status(
        &mut self,
        cluster: &str,
        mut s: pb::WorkloadStatus,
        fx: &mut Effects,
        now: u64,
    ) {
        // Observed: a 1 MiB failure message was stored in the history and
        // events, and `describe` printed it whole.
        s.message = bounded_message(&s.message);
        let id = s.workload_id;
        let phase = pb::Phase::try_from(s.phase).unwrap_or(pb::Phase::Unspecified);
        let Some(w) = self.workloads.get(&id) else {
            fx.msgs.push((
                cluster.to_string(),
                stop_msg(
                    id,
                    s.epoch,
                    pb::StopReason::Stale,
                    0,
                    "unknown workload".into(),
                ),
            ));
            return;
        };
        let on_here = w.placement.as_ref().is_some_and(|p| p.cluster == cluster);
        let current = w.epoch == s.epoch && w.holds_gpus() && on_here;
        let stopping_here = w.state.is_stopping()
            && w.stopping
                .as_ref()
                .is_some_and(|st| st.epoch == s.epoch && st.cluster == cluster);
        match phase {
            pb::Phase::Started => {
                if current && w.state == WState::Placed {
                    let w = self.workloads.get_mut(&id).expect("exists");
                    transition(w, WEvent::Started, now, format!("started on {cluster}"));
                    w.started_at_ms = Some(now);
                    self.save(fx, id);
                    self.event(
                        fx,
                        now,
                        "started",
                        Some(id),
                        Some(cluster),
                        format!("workload {id} started on {cluster}"),
                    );
                } else if !current && !stopping_here {
                    fx.msgs.push((
                        cluster.to_string(),
                        stop_msg(id, s.epoch, pb::StopReason::Stale, 0, "stale epoch".into()),
                    ));
                }
            }
            pb::Phase::Succeeded | pb::Phase::Failed => {
                if stopping_here && phase == pb::Phase::Succeeded {
                    // It finished on its own before the stop reached it: the
                    // work is done, so it is not re-queued (nor cancelled).
                    let w = self.workloads.get_mut(&id).expect("exists");
                    w.stopping = None;
                    transition(
                        w,
                        WEvent::Succeeded,
                        now,
                        "exited 0 before its stop took effect".into(),
                    );
                    w.finished_at_ms = Some(now);
                    w.exit_code = Some(0);
                    self.state.remove(id);
                    self.save(fx, id);
                    self.event(
                        fx,
                        now,
                        "succeeded",
                        Some(id),
                        Some(cluster),
                        format!("workload {id} exited 0 before its stop took effect"),
                    );
                    self.changed();
                } else if stopping_here && !current {
                    self.stopped(cluster, id, s.epoch, fx, now);
                } else if current {
                    let ok = phase == pb::Phase::Succeeded;
                    let w = self.workloads.get_mut(&id).expect("exists");
                    let reason = if ok {
                        "exited 0".to_string()
                    } else {
                        format!(
                            "failed: exit code {}{}",
                            s.exit_code,
                            if s.message.is_empty() {
                                String::new()
                            } else {
                                format!(" ({})", s.message)
                            }
                        )
                    };
                    transition(
                        w,
                        if ok {
                            WEvent::Succeeded
                        } else {
                            WEvent::Failed
                        },
                        now,
                        reason.clone(),
                    );
                    w.finished_at_ms = Some(now);
                    w.exit_code = Some(s.exit_code);
                    w.stopping = None;
                    if ok {
                        let (team, class, name) =
                            (w.team.clone(), w.priority.clone(), w.name.clone());
                        let ran_s = w.run_ms / 1000;
                        self.runtimes.record(&team, &class, &name, ran_s);
                    }
                    self.state.remove(id);
                    self.save(fx, id);
                    self.event(
                        fx,
                        now,
                        if ok { "succeeded" } else { "failed" },
                        Some(id),
                        Some(cluster),
                        format!("workload {id} {reason}"),
                    );
                    self.changed();
                }
            }
            pb::Phase::Stopped => {
                if stopping_here {
                    self.stopped(cluster, id, s.epoch, fx, now);
                } else if current {
                    // Stopped without being asked (the spoke shut down): re-queue.
                    self.requeue(
                        fx,
                        now,
                        id,
                        cluster,
                        &format!("stopped on {cluster}: {}", s.message),
                    );
                }
            }
            pb::Phase::Unspecified => {}
        }
    }

    /// Puts a placed or running workload back in the queue (its spoke no
    /// longer runs it), with its original submit time.
    pub(super) fn requeue(
        &mut self,
        fx: &mut Effects,
        now: u64,
        id: u64,
        cluster: &str,
        why: &str,
    ) {
        let Some(w) = self.workloads.get_mut(&id) else {
            return;
        };
        if !transition(w, WEvent::Requeue, now, format!("re-queued: {why}")) {
            return;
        }
        w.placement = None;
        self.state.requeue(id);
        self.save(fx, id);
        self.event(
            fx,
            now,
            "requeued",
            Some(id),
            Some(cluster),
            format!("workload {id} re-queued: {why}"),
        );
        self.changed();
    }

    /// The spoke confirmed the stop of `epoch`: a preempted workload may now
    /// run again, a cancelled one is done.
    pub(super) fn stopped(
        &mut self,
        cluster: &str,
        id: u64,
        epoch: u64,
        fx: &mut Effects,
        now: u64,
    ) {
        let Some(w) = self.workloads.get(&id) else {
            return;
        };
        if !w.state.is_stopping() || w.stopping.as_ref().is_none_or(|s| s.epoch != epoch) {
            return;
        }
        self.stop_done(fx, now, id, cluster, None);
        if let Some(w) = self.workloads.get(&id)
            && w.state == WState::Pending
        {
            // Back in the queue with its original submit time.
            if let Err(e) = self.state.submit(spec_of(w, &self.runtimes)) {
                warn!("workload {id} cannot re-queue: {e}");
            }
        }
        self.changed();
    }

    /// Ends the stop of a `Preempting` or `Cancelling` workload (confirmed
    /// by its spoke, or `lost`: the spoke is lost past the grace period):
    /// `Pending` or `Cancelled`. The scheduler's state is the caller's.
    pub(super) fn stop_done(
        &mut self,
        fx: &mut Effects,
        now: u64,
        id: u64,
        cluster: &str,
        lost: Option<&str>,
    ) {
        let Some(w) = self.workloads.get_mut(&id) else {
            return;
        };
        let cancel = w.state == WState::Cancelling;
        let reason = match (cancel, lost) {
            (true, None) => "cancelled by user".to_string(),
            (true, Some(why)) => format!("cancelled ({why})"),
            (false, None) => format!("re-queued: its stop on {cluster} is confirmed"),
            (false, Some(why)) => format!("re-queued: {why}"),
        };
        if !transition(w, WEvent::Stopped, now, reason.clone()) {
            return;
        }
        w.stopping = None;
        if cancel {
            w.finished_at_ms = Some(now);
            self.state.remove(id);
        }
        self.save(fx, id);
        let (kind, message) = match (cancel, lost) {
            (true, None) => ("cancelled", format!("workload {id} cancelled")),
            (true, Some(_)) => ("cancelled", format!("workload {id} {reason}")),
            (false, _) => ("requeued", format!("workload {id} {reason}")),
        };
        self.event(fx, now, kind, Some(id), Some(cluster), message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spokes_message_is_bounded_and_printable() {
        let huge = "x".repeat(1 << 20);
        let kept = bounded_message(&huge);
        assert!(kept.len() < MAX_STATUS_MESSAGE_BYTES + 64, "{}", kept.len());
        assert!(
            kept.ends_with("[1046528 more bytes; see the workload's logs]"),
            "{kept}"
        );
        assert_eq!(
            bounded_message("oom\u{1b}]0;pwned\u{7}"),
            "oom\\u{1b}]0;pwned\\u{7}"
        );
        assert_eq!(bounded_message("exit 1"), "exit 1");
        // Cut on a character boundary.
        let wide = "é".repeat(3000);
        assert!(bounded_message(&wide).starts_with("é"));
    }
}
