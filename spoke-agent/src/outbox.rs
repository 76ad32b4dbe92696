//! What the spoke still has to tell the hub: an outbox of statuses and log
//! chunks that survives disconnects, and a record of terminal statuses for
//! re-sending after a reconnect and for answering re-sent assignments.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use axle_proto::pb;
use tokio::time::Instant;

/// Log bytes the outbox holds while the hub is unreachable. The full log is
/// in the file on disk; this only bounds how much of the live tail the hub
/// gets after an outage (32 MiB ≈ 500 full chunks). Oldest chunks go first;
/// statuses are never dropped (at most two per workload that was running
/// when the hub went away, since no new work arrives while disconnected).
pub const MAX_OUTBOX_LOG_BYTES: usize = 32 * 1024 * 1024;
/// Terminal statuses remembered per (workload, epoch). A re-sent `Assign` for
/// one of these is answered with its status instead of running it twice;
/// 4096 covers hours of churn on a busy cluster at ~100 bytes each.
pub const MAX_REMEMBERED_TERMINALS: usize = 4096;
/// Terminal statuses sent this recently are sent again after a reconnect:
/// anything still queued in the old stream when it broke is lost, and a dead
/// hub is noticed only after the keepalive interval plus timeout (30 s). The
/// hub treats a repeated terminal status as a no-op.
pub const RESEND_WINDOW: Duration = Duration::from_secs(60);

pub fn is_terminal(phase: i32) -> bool {
    matches!(
        pb::Phase::try_from(phase),
        Ok(pb::Phase::Succeeded | pb::Phase::Failed | pb::Phase::Stopped)
    )
}

/// FIFO of messages waiting for a registered hub session.
#[derive(Debug, Default)]
pub struct Outbox {
    queue: VecDeque<pb::SpokeMessage>,
    log_bytes: usize,
    dropped_log_chunks: u64,
    /// Runs (workload, epoch) that lost a chunk here: their log files are
    /// the only full copy, so they are kept. At most
    /// [`MAX_REMEMBERED_TERMINALS`], oldest forgotten first.
    lossy: VecDeque<(u64, u64)>,
}

fn status_message(status: pb::WorkloadStatus) -> pb::SpokeMessage {
    pb::SpokeMessage {
        msg: Some(pb::spoke_message::Msg::Status(status)),
    }
}

impl Outbox {
    pub fn push_status(&mut self, status: pb::WorkloadStatus) {
        self.queue.push_back(status_message(status));
    }

    /// Puts statuses ahead of everything queued, in the order given.
    pub fn push_front_statuses(&mut self, statuses: Vec<pb::WorkloadStatus>) {
        for status in statuses.into_iter().rev() {
            self.queue.push_front(status_message(status));
        }
    }

    /// Queues a log chunk, dropping the oldest queued chunks to stay within
    /// [`MAX_OUTBOX_LOG_BYTES`].
    pub fn push_log(&mut self, chunk: pb::LogChunk) {
        let len = chunk.data.len();
        while self.log_bytes + len > MAX_OUTBOX_LOG_BYTES {
            let oldest = self
                .queue
                .iter()
                .position(|m| matches!(m.msg, Some(pb::spoke_message::Msg::Log(_))));
            let Some(pos) = oldest else { break };
            if let Some(pb::SpokeMessage {
                msg: Some(pb::spoke_message::Msg::Log(old)),
            }) = self.queue.remove(pos)
            {
                self.log_bytes -= old.data.len();
                self.dropped_log_chunks += 1;
                let run = (old.workload_id, old.epoch);
                if !self.lossy.contains(&run) {
                    if self.lossy.len() >= MAX_REMEMBERED_TERMINALS {
                        self.lossy.pop_front();
                    }
                    self.lossy.push_back(run);
                }
            }
        }
        self.log_bytes += len;
        self.queue.push_back(pb::SpokeMessage {
            msg: Some(pb::spoke_message::Msg::Log(chunk)),
        });
    }

    pub fn pop(&mut self) -> Option<pb::SpokeMessage> {
        let msg = self.queue.pop_front()?;
        if let Some(pb::spoke_message::Msg::Log(chunk)) = &msg.msg {
            self.log_bytes -= chunk.data.len();
        }
        Some(msg)
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether a chunk of this run's log was dropped here.
    pub fn lost_log_of(&self, workload_id: u64, epoch: u64) -> bool {
        self.lossy.contains(&(workload_id, epoch))
    }

    pub fn dropped_log_chunks(&self) -> u64 {
        self.dropped_log_chunks
    }
}

#[derive(Debug)]
struct Terminal {
    status: pb::WorkloadStatus,
    sent_at: Option<Instant>,
}

/// Bounded record of terminal statuses by (workload_id, epoch).
#[derive(Debug, Default)]
pub struct Terminals {
    by_key: BTreeMap<(u64, u64), Terminal>,
    order: VecDeque<(u64, u64)>,
}

impl Terminals {
    pub fn record(&mut self, status: pb::WorkloadStatus) {
        let key = (status.workload_id, status.epoch);
        if self
            .by_key
            .insert(
                key,
                Terminal {
                    status,
                    sent_at: None,
                },
            )
            .is_none()
        {
            self.order.push_back(key);
        }
        while self.order.len() > MAX_REMEMBERED_TERMINALS {
            if let Some(old) = self.order.pop_front() {
                self.by_key.remove(&old);
            }
        }
    }

    pub fn get(&self, workload_id: u64, epoch: u64) -> Option<&pb::WorkloadStatus> {
        self.by_key.get(&(workload_id, epoch)).map(|t| &t.status)
    }

    /// Notes that `msg` went out, if it is a terminal status.
    pub fn note_sent(&mut self, msg: &pb::SpokeMessage, now: Instant) {
        if let Some(pb::spoke_message::Msg::Status(s)) = &msg.msg
            && is_terminal(s.phase)
            && let Some(t) = self.by_key.get_mut(&(s.workload_id, s.epoch))
        {
            t.sent_at = Some(now);
        }
    }

    /// Terminal statuses sent within `window` before `now`, oldest first.
    pub fn recently_sent(&self, now: Instant, window: Duration) -> Vec<pb::WorkloadStatus> {
        self.order
            .iter()
            .filter_map(|key| self.by_key.get(key))
            .filter(|t| t.sent_at.is_some_and(|at| now.duration_since(at) <= window))
            .map(|t| t.status.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(id: u64, len: usize) -> pb::LogChunk {
        pb::LogChunk {
            workload_id: id,
            epoch: 1,
            offset: 0,
            data: vec![b'x'; len],
            stderr: Vec::new(),
        }
    }

    fn status(id: u64, phase: pb::Phase) -> pb::WorkloadStatus {
        pb::WorkloadStatus {
            workload_id: id,
            epoch: 1,
            phase: phase as i32,
            ..Default::default()
        }
    }

    #[test]
    fn drops_oldest_logs_never_statuses() {
        let mut outbox = Outbox::default();
        let third = MAX_OUTBOX_LOG_BYTES / 3;
        outbox.push_status(status(1, pb::Phase::Succeeded));
        outbox.push_log(chunk(1, third));
        outbox.push_log(chunk(2, third));
        outbox.push_status(status(2, pb::Phase::Failed));
        outbox.push_log(chunk(3, third));
        outbox.push_log(chunk(4, third));
        assert_eq!(outbox.dropped_log_chunks(), 1);
        assert!(outbox.lost_log_of(1, 1));
        assert!(!outbox.lost_log_of(2, 1));
        let mut kinds = Vec::new();
        while let Some(m) = outbox.pop() {
            kinds.push(match m.msg {
                Some(pb::spoke_message::Msg::Status(s)) => format!("s{}", s.workload_id),
                Some(pb::spoke_message::Msg::Log(c)) => format!("l{}", c.workload_id),
                _ => "?".into(),
            });
        }
        assert_eq!(kinds, ["s1", "l2", "s2", "l3", "l4"]);
        assert!(outbox.is_empty());
        assert_eq!(outbox.log_bytes, 0);
    }

    #[test]
    fn front_statuses_keep_their_order() {
        let mut outbox = Outbox::default();
        outbox.push_status(status(3, pb::Phase::Started));
        outbox.push_front_statuses(vec![
            status(1, pb::Phase::Stopped),
            status(2, pb::Phase::Stopped),
        ]);
        let ids: Vec<u64> = std::iter::from_fn(|| outbox.pop())
            .filter_map(|m| match m.msg {
                Some(pb::spoke_message::Msg::Status(s)) => Some(s.workload_id),
                _ => None,
            })
            .collect();
        assert_eq!(ids, [1, 2, 3]);
    }

    #[test]
    fn terminals_are_bounded_and_resend_only_recent() {
        let mut terminals = Terminals::default();
        let t0 = Instant::now();
        for id in 0..(MAX_REMEMBERED_TERMINALS as u64 + 5) {
            terminals.record(status(id, pb::Phase::Succeeded));
        }
        assert!(terminals.get(0, 1).is_none());
        assert!(terminals.get(5, 1).is_some());
        let sent_old = status_message(status(5, pb::Phase::Succeeded));
        let sent_new = status_message(status(6, pb::Phase::Succeeded));
        terminals.note_sent(&sent_old, t0);
        terminals.note_sent(&sent_new, t0 + RESEND_WINDOW);
        let resend =
            terminals.recently_sent(t0 + RESEND_WINDOW + Duration::from_secs(1), RESEND_WINDOW);
        let ids: Vec<u64> = resend.iter().map(|s| s.workload_id).collect();
        assert_eq!(ids, [6]);
    }
}
