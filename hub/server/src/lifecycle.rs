//! The workload lifecycle: one enum and one transition function. Every state
//! change of a workload in the hub goes through `step`, and illegal
//! transitions are errors, not silent no-ops.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum WState {
    /// Waiting for GPUs (also after a preemption is confirmed or a lost spoke).
    Pending,
    /// Assigned to a cluster; the spoke has not reported it started yet.
    Placed,
    Running,
    /// Preempted: its GPUs already belong to the preemptor, and a stop went
    /// to its spoke. It waits again only once the spoke confirms the stop (or
    /// is lost past the grace period), so two copies never run at once.
    Preempting,
    /// Cancelled by a user while placed, running or preempting: a stop went
    /// to its spoke and it is `Cancelled` once the spoke confirms it. It
    /// keeps the GPUs it was placed on until then (one cancelled while
    /// preempting has none left).
    Cancelling,
    Succeeded,
    Failed,
    Cancelled,
}

/// Every state, in lifecycle order.
pub const ALL_STATES: [WState; 8] = [
    WState::Pending,
    WState::Placed,
    WState::Running,
    WState::Preempting,
    WState::Cancelling,
    WState::Succeeded,
    WState::Failed,
    WState::Cancelled,
];

impl WState {
    pub fn as_str(self) -> &'static str {
        match self {
            WState::Pending => "Pending",
            WState::Placed => "Placed",
            WState::Running => "Running",
            WState::Preempting => "Preempting",
            WState::Cancelling => "Cancelling",
            WState::Succeeded => "Succeeded",
            WState::Failed => "Failed",
            WState::Cancelled => "Cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<WState> {
        ALL_STATES
            .into_iter()
            .find(|w| w.as_str().eq_ignore_ascii_case(s))
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, WState::Succeeded | WState::Failed | WState::Cancelled)
    }

    /// A stop was sent and is not confirmed yet: the workload record has a
    /// `stopping` record (its cluster and epoch) exactly in these states.
    pub fn is_stopping(self) -> bool {
        matches!(self, WState::Preempting | WState::Cancelling)
    }

    /// May hold GPUs in the scheduler's view: it does when it also has a
    /// placement (see `WorkloadRecord::holds_gpus`; a workload cancelled
    /// while preempting has given its GPUs away already).
    pub fn holds_gpus(self) -> bool {
        matches!(self, WState::Placed | WState::Running | WState::Cancelling)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WEvent {
    /// The scheduler placed it on a cluster.
    Place,
    /// The spoke reported the process started.
    Started,
    /// The spoke reported exit 0 (also while a stop was on its way: the
    /// work is done, so it is neither re-queued nor cancelled).
    Succeeded,
    /// The spoke reported a failure (non-zero exit, could not start, runtime exceeded).
    Failed,
    /// The scheduler preempted it: a stop goes to its spoke.
    Preempt,
    /// Its spoke was lost, or no longer runs it: back to the queue.
    Requeue,
    /// A user cancelled it: at once when nothing runs, else a stop goes to
    /// its spoke.
    Cancel,
    /// The stop is confirmed (the spoke reported it stopped or gone, or the
    /// spoke was lost past the grace period).
    Stopped,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal workload transition: {event:?} in state {from:?}")]
pub struct IllegalTransition {
    pub from: WState,
    pub event: WEvent,
}

/// The one transition function of a workload.
pub fn step(from: WState, event: WEvent) -> Result<WState, IllegalTransition> {
    use WEvent as E;
    use WState as S;
    let to = match (from, event) {
        (S::Pending, E::Place) => S::Placed,
        (S::Placed, E::Started) => S::Running,
        // A spoke may report the exit before we saw the start (fast jobs,
        // reconnects); a workload may exit 0 on its own before its stop
        // reaches it.
        (S::Placed | S::Running | S::Preempting | S::Cancelling, E::Succeeded) => S::Succeeded,
        // A preempted workload that fails on its way down only confirms its
        // stop (it runs again); a cancelled one failed before it stopped.
        (S::Placed | S::Running | S::Cancelling, E::Failed) => S::Failed,
        (S::Placed | S::Running, E::Preempt) => S::Preempting,
        (S::Placed | S::Running, E::Requeue) => S::Pending,
        (S::Pending, E::Cancel) => S::Cancelled,
        (S::Placed | S::Running | S::Preempting, E::Cancel) => S::Cancelling,
        (S::Preempting, E::Stopped) => S::Pending,
        (S::Cancelling, E::Stopped) => S::Cancelled,
        _ => return Err(IllegalTransition { from, event }),
    };
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENTS: [WEvent; 8] = [
        WEvent::Place,
        WEvent::Started,
        WEvent::Succeeded,
        WEvent::Failed,
        WEvent::Preempt,
        WEvent::Requeue,
        WEvent::Cancel,
        WEvent::Stopped,
    ];

    #[test]
    fn every_pair_is_decided() {
        let mut legal = 0;
        for s in ALL_STATES {
            for e in EVENTS {
                match step(s, e) {
                    Ok(to) => {
                        legal += 1;
                        assert!(
                            !s.is_terminal(),
                            "{s:?} is terminal but {e:?} moved it to {to:?}"
                        );
                    }
                    Err(err) => assert_eq!(err, IllegalTransition { from: s, event: e }),
                }
            }
        }
        assert_eq!(legal, 19);
    }

    #[test]
    fn the_api_names_every_state() {
        let names: Vec<&str> = ALL_STATES.iter().map(|s| s.as_str()).collect();
        assert_eq!(names, axle_proto::api::STATES);
    }

    #[test]
    fn terminal_states_never_move() {
        for s in [WState::Succeeded, WState::Failed, WState::Cancelled] {
            for e in EVENTS {
                assert!(step(s, e).is_err());
            }
        }
    }

    #[test]
    fn happy_path_and_preemption() {
        let s = step(WState::Pending, WEvent::Place).unwrap();
        let s = step(s, WEvent::Started).unwrap();
        let s = step(s, WEvent::Preempt).unwrap();
        assert_eq!(s, WState::Preempting);
        // Not placed again before its stop is confirmed.
        assert!(step(s, WEvent::Place).is_err());
        let s = step(s, WEvent::Stopped).unwrap();
        assert_eq!(s, WState::Pending);
        let s = step(s, WEvent::Place).unwrap();
        assert_eq!(step(s, WEvent::Succeeded).unwrap(), WState::Succeeded);
    }

    #[test]
    fn stopping_states_wait_for_the_stop() {
        // Cancelled while running: Cancelling until the stop is confirmed.
        let s = step(WState::Running, WEvent::Cancel).unwrap();
        assert_eq!(s, WState::Cancelling);
        assert_eq!(step(s, WEvent::Stopped), Ok(WState::Cancelled));
        // Cancelled while preempting: still waits for the same stop.
        let s = step(WState::Preempting, WEvent::Cancel).unwrap();
        assert_eq!(s, WState::Cancelling);
        // Nothing runs while pending: cancelled at once.
        assert_eq!(step(WState::Pending, WEvent::Cancel), Ok(WState::Cancelled));
        // Exit 0 before the stop took effect: the work is done.
        assert_eq!(
            step(WState::Preempting, WEvent::Succeeded),
            Ok(WState::Succeeded)
        );
        assert_eq!(
            step(WState::Cancelling, WEvent::Succeeded),
            Ok(WState::Succeeded)
        );
        // Only stopping states have a stop to confirm.
        for s in ALL_STATES {
            assert_eq!(step(s, WEvent::Stopped).is_ok(), s.is_stopping(), "{s:?}");
        }
    }

    #[test]
    fn state_names_round_trip() {
        for s in ALL_STATES {
            assert_eq!(WState::parse(s.as_str()), Some(s));
            assert_eq!(WState::parse(&s.as_str().to_lowercase()), Some(s));
        }
        assert_eq!(WState::parse("Bogus"), None);
    }
}
