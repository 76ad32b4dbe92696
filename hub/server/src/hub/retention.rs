//! Retention: finished workloads (their records and logs) are deleted
//! `retainFinishedHours` after they finish, and events `retainEventsDays`
//! after they happen, a bounded batch per tick so deletion never stalls the
//! applier. Events are the audit log: they outlive the records they name,
//! for their own window.

use super::Inner;
use super::applier::Effects;
use crate::records::*;
use crate::store::{KeyValue, StoreError};

/// Records deleted per tick (each kind): 5,000/s is fifty times a steady
/// 100 workloads/s, so a backlog (a shortened window, a hub that was down,
/// a million finished workloads) drains within minutes, while one tick's
/// batch stays a few tens of ms of work and one modest store transaction.
pub const RETENTION_BATCH: usize = 5_000;

/// What retention deleted in one tick, for tests and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub workloads: usize,
    pub events: usize,
}

/// The page of stored events a tick's retention reads, read by the
/// applier before it takes the state's lock (the store is async).
pub(super) type EventsPage = Result<Vec<KeyValue>, StoreError>;

impl Inner {
    /// Where this tick's retention reads events from (the key to start
    /// after), if the oldest known event is past its window.
    pub(super) fn events_to_read(&self, now: u64) -> Option<String> {
        let events_before = now.saturating_sub(self.policy.settings.retain_events_ms);
        (self.oldest_event_at_ms <= events_before)
            .then(|| event_key(self.oldest_event.saturating_sub(1)))
    }

    /// Deletes what is past its retention window, at most
    /// [`RETENTION_BATCH`] of each kind. `events` is the page read from
    /// [`Inner::events_to_read`] (none: events wait for the next tick).
    pub(super) fn retain(
        &mut self,
        fx: &mut Effects,
        now: u64,
        events: Option<EventsPage>,
    ) -> Retention {
        let mut done = Retention::default();
        let s = &self.policy.settings;
        let finished_before = now.saturating_sub(s.retain_finished_ms);
        let events_before = now.saturating_sub(s.retain_events_ms);
        while done.workloads < RETENTION_BATCH {
            let Some(&(at, id)) = self.finished.first() else {
                break;
            };
            if at > finished_before {
                break;
            }
            self.finished.pop_first();
            let Some(w) = self.workloads.remove(&id) else {
                continue;
            };
            if let Some(k) = &w.idempotency_key {
                self.idem.remove(&(w.team.clone(), k.clone()));
            }
            self.reasons.remove(&id);
            self.burst_noted.remove(&id);
            fx.delete(workload_key(id));
            fx.forget_logs.push(id);
            done.workloads += 1;
        }
        // Events are in sequence (and so time) order: delete from the
        // oldest while they are past the window. The store is read only
        // when the oldest known event is old enough.
        if self.oldest_event_at_ms <= events_before
            && let Some(page) = events
        {
            let page = match page {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("retention cannot read events: {e}");
                    return done;
                }
            };
            let mut next_oldest = None;
            for kv in &page {
                let Ok(e) = serde_json::from_slice::<EventRecord>(&kv.value) else {
                    fx.delete(kv.key.clone());
                    continue;
                };
                if e.at_ms > events_before {
                    next_oldest = Some((e.seq, e.at_ms));
                    break;
                }
                fx.delete(kv.key.clone());
                done.events += 1;
                self.oldest_event = e.seq + 1;
            }
            match next_oldest {
                Some((seq, at)) => {
                    self.oldest_event = seq;
                    self.oldest_event_at_ms = at;
                }
                // The whole page was old: the next tick reads on; an empty
                // page means nothing is stored before the window.
                None if page.len() == RETENTION_BATCH => {}
                None => self.oldest_event_at_ms = u64::MAX,
            }
        }
        while self.events.front().is_some_and(|e| e.at_ms < events_before) {
            self.events.pop_front();
        }
        if done.workloads > 0 || done.events > 0 {
            tracing::info!(
                workloads = done.workloads,
                events = done.events,
                "retention deleted records past their window"
            );
        }
        done
    }
}
