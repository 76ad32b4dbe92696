//! The life of one burst instance, as the hub's ledger sees it: one enum,
//! one [`step`] function, every (state, event) pair tested.
//!
//! ```text
//! Requested ──LaunchStarted──▶ Launching ──Launched──▶ Joining ──Joined──▶ Ready
//!     ▲                          │                        │                 │
//!     └──── LaunchFailed{retry} ─┘                        │ JoinTimedOut    │ Idle / Done
//!                                │ LaunchFailed{final}    ▼                 ▼
//!                                ▼                   Terminating ◀──── Draining
//!                              Failed                     │ Terminated
//!                                                         ▼
//!                                                     Terminated
//! ```
//!
//! `Interrupted` (spot capacity taken back) and `TerminateRequested` (a
//! revocation, the budget, the reaper) lead from any live state with an
//! instance to `Terminating`; before an instance exists they end the request.
//! `InterruptionNoticed` (the provider's notice that it will take the
//! instance back, EC2's two minutes) makes a joining or ready instance
//! `Draining`: no new work, and what runs there is stopped in the time left.

use serde::{Deserialize, Serialize};

/// Where a burst instance is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum BurstState {
    /// Wanted, money reserved, not yet sent to a provider.
    Requested,
    /// The launch call is in flight.
    Launching,
    /// The provider has an instance; its spoke has not joined yet.
    Joining { instance_id: String },
    /// Its spoke joined as cluster `burst-<provider>-<id>`: work may go there.
    Ready { instance_id: String },
    /// No new work; what runs there finishes first.
    Draining { instance_id: String },
    /// The terminate call is sent (or to be sent again).
    Terminating { instance_id: String },
    /// The provider says it is gone; spend is settled.
    Terminated,
    /// No instance ever came of it (every offer failed, or a permanent error).
    Failed { reason: String },
}

/// What happens to a burst instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BurstEvent {
    /// The provider applier took the launch.
    LaunchStarted,
    /// The provider created instance `instance_id`.
    Launched { instance_id: String },
    /// The launch failed; `retry`: another offer (or a later try) may work.
    LaunchFailed { retry: bool, reason: String },
    /// The instance's spoke registered with its join token's certificate.
    Joined,
    /// The spoke did not join within the policy's join timeout.
    JoinTimedOut,
    /// Its workloads are done, or it idled for the policy's idle timeout.
    Idle,
    /// What ran while draining has finished.
    Drained,
    /// The provider gave notice that it takes the instance back soon.
    InterruptionNoticed,
    /// Spot capacity taken back by the provider.
    Interrupted,
    /// Stop it now: a revocation, the budget, or the orphan reaper.
    TerminateRequested,
    /// The provider says the instance is gone.
    Terminated,
}

/// The event does not apply in that state: nothing changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("burst event {event} does not apply in state {state}")]
pub struct Ignored {
    pub state: &'static str,
    pub event: &'static str,
}

impl BurstState {
    pub fn name(&self) -> &'static str {
        match self {
            BurstState::Requested => "requested",
            BurstState::Launching => "launching",
            BurstState::Joining { .. } => "joining",
            BurstState::Ready { .. } => "ready",
            BurstState::Draining { .. } => "draining",
            BurstState::Terminating { .. } => "terminating",
            BurstState::Terminated => "terminated",
            BurstState::Failed { .. } => "failed",
        }
    }

    /// The provider's instance, once there is one and until it is gone.
    pub fn instance_id(&self) -> Option<&str> {
        match self {
            BurstState::Joining { instance_id }
            | BurstState::Ready { instance_id }
            | BurstState::Draining { instance_id }
            | BurstState::Terminating { instance_id } => Some(instance_id),
            _ => None,
        }
    }

    /// No more events change it.
    pub fn is_final(&self) -> bool {
        matches!(self, BurstState::Terminated | BurstState::Failed { .. })
    }
}

impl BurstEvent {
    pub fn name(&self) -> &'static str {
        match self {
            BurstEvent::LaunchStarted => "LaunchStarted",
            BurstEvent::Launched { .. } => "Launched",
            BurstEvent::LaunchFailed { .. } => "LaunchFailed",
            BurstEvent::Joined => "Joined",
            BurstEvent::JoinTimedOut => "JoinTimedOut",
            BurstEvent::Idle => "Idle",
            BurstEvent::Drained => "Drained",
            BurstEvent::InterruptionNoticed => "InterruptionNoticed",
            BurstEvent::Interrupted => "Interrupted",
            BurstEvent::TerminateRequested => "TerminateRequested",
            BurstEvent::Terminated => "Terminated",
        }
    }
}

/// The one transition function of a burst instance.
pub fn step(state: &BurstState, event: BurstEvent) -> Result<BurstState, Ignored> {
    use BurstEvent as E;
    use BurstState as S;
    let ignored = Ignored {
        state: state.name(),
        event: event.name(),
    };
    let terminating = |id: &str| S::Terminating {
        instance_id: id.to_string(),
    };
    match (state, event) {
        (S::Requested, E::LaunchStarted) => Ok(S::Launching),
        (S::Requested, E::TerminateRequested) => Ok(S::Failed {
            reason: "stopped before it was launched".into(),
        }),
        (S::Launching, E::Launched { instance_id }) => Ok(S::Joining { instance_id }),
        (S::Launching, E::LaunchFailed { retry: true, .. }) => Ok(S::Requested),
        (
            S::Launching,
            E::LaunchFailed {
                retry: false,
                reason,
            },
        ) => Ok(S::Failed { reason }),
        (S::Joining { instance_id }, E::Joined) => Ok(S::Ready {
            instance_id: instance_id.clone(),
        }),
        (S::Joining { instance_id }, E::JoinTimedOut) => Ok(terminating(instance_id)),
        (S::Ready { instance_id }, E::Idle) => Ok(S::Draining {
            instance_id: instance_id.clone(),
        }),
        (S::Joining { instance_id } | S::Ready { instance_id }, E::InterruptionNoticed) => {
            Ok(S::Draining {
                instance_id: instance_id.clone(),
            })
        }
        (S::Draining { instance_id }, E::Drained) => Ok(terminating(instance_id)),
        (
            S::Joining { instance_id } | S::Ready { instance_id } | S::Draining { instance_id },
            E::Interrupted | E::TerminateRequested,
        ) => Ok(terminating(instance_id)),
        (
            S::Joining { .. } | S::Ready { .. } | S::Draining { .. } | S::Terminating { .. },
            E::Terminated,
        ) => Ok(S::Terminated),
        _ => Err(ignored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states() -> Vec<BurstState> {
        let id = || "i-1".to_string();
        vec![
            BurstState::Requested,
            BurstState::Launching,
            BurstState::Joining { instance_id: id() },
            BurstState::Ready { instance_id: id() },
            BurstState::Draining { instance_id: id() },
            BurstState::Terminating { instance_id: id() },
            BurstState::Terminated,
            BurstState::Failed { reason: "r".into() },
        ]
    }

    fn events() -> Vec<BurstEvent> {
        vec![
            BurstEvent::LaunchStarted,
            BurstEvent::Launched {
                instance_id: "i-1".into(),
            },
            BurstEvent::LaunchFailed {
                retry: true,
                reason: "no capacity".into(),
            },
            BurstEvent::LaunchFailed {
                retry: false,
                reason: "bad credentials".into(),
            },
            BurstEvent::Joined,
            BurstEvent::JoinTimedOut,
            BurstEvent::Idle,
            BurstEvent::Drained,
            BurstEvent::InterruptionNoticed,
            BurstEvent::Interrupted,
            BurstEvent::TerminateRequested,
            BurstEvent::Terminated,
        ]
    }

    /// The expected outcome of every (state, event) pair: the next state's
    /// name, or `None` where the event is ignored.
    fn expected(state: &str, event: &BurstEvent) -> Option<&'static str> {
        use BurstEvent as E;
        Some(match (state, event) {
            ("requested", E::LaunchStarted) => "launching",
            ("requested", E::TerminateRequested) => "failed",
            ("launching", E::Launched { .. }) => "joining",
            ("launching", E::LaunchFailed { retry: true, .. }) => "requested",
            ("launching", E::LaunchFailed { retry: false, .. }) => "failed",
            ("joining", E::Joined) => "ready",
            ("joining", E::JoinTimedOut) => "terminating",
            ("ready", E::Idle) => "draining",
            ("joining" | "ready", E::InterruptionNoticed) => "draining",
            ("draining", E::Drained) => "terminating",
            ("joining" | "ready" | "draining", E::Interrupted | E::TerminateRequested) => {
                "terminating"
            }
            ("joining" | "ready" | "draining" | "terminating", E::Terminated) => "terminated",
            _ => return None,
        })
    }

    #[test]
    fn every_state_and_event_pair_does_what_the_table_says() {
        let mut pairs = 0;
        for s in states() {
            for e in events() {
                pairs += 1;
                let want = expected(s.name(), &e);
                let got = step(&s, e.clone());
                match (want, got) {
                    (Some(name), Ok(next)) => assert_eq!(next.name(), name, "{s:?} + {e:?}"),
                    (None, Err(ig)) => {
                        assert_eq!((ig.state, ig.event), (s.name(), e.name()));
                    }
                    (want, got) => panic!("{s:?} + {e:?}: want {want:?}, got {got:?}"),
                }
            }
        }
        assert_eq!(pairs, 8 * 12);
    }

    #[test]
    fn the_instance_id_is_carried_to_the_end_and_final_states_stay() {
        let mut s = BurstState::Requested;
        for e in [
            BurstEvent::LaunchStarted,
            BurstEvent::Launched {
                instance_id: "i-42".into(),
            },
            BurstEvent::Joined,
            BurstEvent::Idle,
            BurstEvent::Drained,
        ] {
            s = step(&s, e).unwrap();
            assert_eq!(
                s.instance_id(),
                Some("i-42").filter(|_| s.name() != "launching")
            );
        }
        assert_eq!(s.name(), "terminating");
        s = step(&s, BurstEvent::Terminated).unwrap();
        assert!(s.is_final() && s.instance_id().is_none());
        for e in events() {
            assert!(
                step(&s, e).is_err(),
                "a terminated instance stays terminated"
            );
        }
    }
}
