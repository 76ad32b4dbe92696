//! The workload lifecycle: one enum and one transition function. Every state
//! change of a workload in the hub goes through `step`, and illegal
//! transitions are errors, not silent no-ops.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum WState {
    /// Waiting for GPUs (also after a preemption or a lost spoke).
    Pending,
    /// Assigned to a cluster; the spoke has not reported it started yet.
    Placed,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl WState {
    pub fn as_str(self) -> &'static str {
        match self {
            WState::Pending => "Pending",
            WState::Placed => "Placed",
            WState::Running => "Running",
            WState::Succeeded => "Succeeded",
            WState::Failed => "Failed",
            WState::Cancelled => "Cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<WState> {
        [
            WState::Pending,
            WState::Placed,
            WState::Running,
            WState::Succeeded,
            WState::Failed,
            WState::Cancelled,
        ]
        .into_iter()
        .find(|w| w.as_str().eq_ignore_ascii_case(s))
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, WState::Succeeded | WState::Failed | WState::Cancelled)
    }

    /// Holds GPUs in the scheduler's view.
    pub fn holds_gpus(self) -> bool {
        matches!(self, WState::Placed | WState::Running)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WEvent {
    /// The scheduler placed it on a cluster.
    Place,
    /// The spoke reported the process started.
    Started,
    /// The spoke reported exit 0.
    Succeeded,
    /// The spoke reported a failure (non-zero exit, could not start, runtime exceeded).
    Failed,
    /// The scheduler preempted it; it waits again with its original submit time.
    Preempt,
    /// Its spoke was lost, or no longer runs it: back to the queue.
    Requeue,
    /// A user cancelled it (effective once the spoke confirms the stop, or at once when nothing runs).
    Cancel,
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
        // reconnects); a preempted workload may exit 0 on its own before its
        // stop reaches it (Pending while the stop is being confirmed).
        (S::Pending | S::Placed | S::Running, E::Succeeded) => S::Succeeded,
        (S::Placed | S::Running, E::Failed) => S::Failed,
        (S::Placed | S::Running, E::Preempt) => S::Pending,
        (S::Placed | S::Running, E::Requeue) => S::Pending,
        (S::Pending | S::Placed | S::Running, E::Cancel) => S::Cancelled,
        _ => return Err(IllegalTransition { from, event }),
    };
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: [WState; 6] = [
        WState::Pending,
        WState::Placed,
        WState::Running,
        WState::Succeeded,
        WState::Failed,
        WState::Cancelled,
    ];
    const EVENTS: [WEvent; 7] = [
        WEvent::Place,
        WEvent::Started,
        WEvent::Succeeded,
        WEvent::Failed,
        WEvent::Preempt,
        WEvent::Requeue,
        WEvent::Cancel,
    ];

    #[test]
    fn every_pair_is_decided() {
        let mut legal = 0;
        for s in STATES {
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
        assert_eq!(legal, 14);
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
        assert_eq!(s, WState::Pending);
        let s = step(s, WEvent::Place).unwrap();
        assert_eq!(step(s, WEvent::Succeeded).unwrap(), WState::Succeeded);
    }

    #[test]
    fn state_names_round_trip() {
        for s in STATES {
            assert_eq!(WState::parse(s.as_str()), Some(s));
            assert_eq!(WState::parse(&s.as_str().to_lowercase()), Some(s));
        }
        assert_eq!(WState::parse("Bogus"), None);
    }
}
