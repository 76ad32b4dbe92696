//! The embedded store's recent history: every change with the value it replaced, so
//! [`RedbStore`](super::RedbStore) can read at a past revision and replay a watch from one,
//! as etcd does.
//!
//! redb keeps only the current state. The writer appends a batch's changes here *before*
//! its commit becomes visible (and takes them back if the commit fails), so every change
//! a reader's snapshot can show is here. A read at revision `R` takes the snapshot and,
//! for each key changed after `R`, the value its first later change replaced: that is the
//! key's state at `R`, whether or not the later changes are in the snapshot yet.
//!
//! The history lives in memory and is bounded ([`MAX_HISTORY_CHANGES`],
//! [`MAX_HISTORY_BYTES`]); the oldest revisions are dropped first, which is a compaction:
//! reads and watches at or before the newest dropped revision answer
//! [`StoreError::Compacted`]. A store that was just opened keeps no history: it is
//! compacted at the revision it opened at.

use std::collections::{BTreeMap, VecDeque};

use super::{KeyValue, Rev, StoreError, WatchEvent};

/// Changes kept. About ten seconds of the hub's peak write rate (~1,500 txns/s of a few
/// keys each): enough for a paginated read or a watcher that reconnects to resume, while
/// the embedded hub (one process, no followers) pays little memory for it.
pub const MAX_HISTORY_CHANGES: usize = 16_384;

/// Bytes of keys and values kept, for the same reason; a change costs its key, its new
/// value and the one it replaced.
pub const MAX_HISTORY_BYTES: usize = 16 * 1024 * 1024;

/// Bookkeeping bytes counted per change besides its keys and values.
const CHANGE_OVERHEAD: usize = 96;

/// One change and the key's state before it (`None`: it was absent).
#[derive(Debug, Clone)]
pub(super) struct Change {
    pub event: WatchEvent,
    pub prev: Option<KeyValue>,
}

impl Change {
    fn bytes(&self) -> usize {
        let event = match &self.event {
            WatchEvent::Put(kv) => kv.key.len() + kv.value.len(),
            WatchEvent::Delete { key, .. } => key.len(),
        };
        event + self.prev.as_ref().map_or(0, |kv| kv.value.len()) + CHANGE_OVERHEAD
    }
}

/// Recent changes, oldest first (revisions ascend).
#[derive(Debug)]
pub(super) struct History {
    changes: VecDeque<Change>,
    bytes: usize,
    /// The newest revision whose changes are no longer kept.
    compacted: Rev,
}

impl History {
    /// An empty history of a store at revision `rev`.
    pub fn new(rev: Rev) -> Self {
        History {
            changes: VecDeque::new(),
            bytes: 0,
            compacted: rev,
        }
    }

    #[cfg(test)]
    pub fn compacted(&self) -> Rev {
        self.compacted
    }

    /// Adds a batch's changes (before its commit is visible).
    pub fn append(&mut self, changes: impl IntoIterator<Item = Change>) {
        for c in changes {
            self.bytes += c.bytes();
            self.changes.push_back(c);
        }
    }

    /// Takes back the changes after `committed`: their commit failed.
    pub fn rollback(&mut self, committed: Rev) {
        while self
            .changes
            .back()
            .is_some_and(|c| c.event.rev() > committed)
        {
            if let Some(c) = self.changes.pop_back() {
                self.bytes -= c.bytes();
            }
        }
    }

    /// Drops the oldest revisions (never one after `committed`) until the history is within
    /// its bounds.
    pub fn trim(&mut self, committed: Rev) {
        while self.changes.len() > MAX_HISTORY_CHANGES || self.bytes > MAX_HISTORY_BYTES {
            let Some(oldest) = self.changes.front().map(|c| c.event.rev()) else {
                return;
            };
            if oldest > committed {
                return;
            }
            self.drop_through(oldest);
        }
    }

    /// Forgets every change at or before `rev`.
    pub fn compact(&mut self, rev: Rev) {
        self.drop_through(rev);
    }

    fn drop_through(&mut self, rev: Rev) {
        while self.changes.front().is_some_and(|c| c.event.rev() <= rev) {
            if let Some(c) = self.changes.pop_front() {
                self.bytes -= c.bytes();
            }
        }
        self.compacted = self.compacted.max(rev);
    }

    /// The state at `rev` of every key starting with `prefix` (and sorting after `after`)
    /// that changed after `rev`: what a snapshot newer than `rev` must be corrected by.
    pub fn state_at(
        &self,
        prefix: &str,
        after: Option<&str>,
        rev: Rev,
    ) -> Result<BTreeMap<String, Option<KeyValue>>, StoreError> {
        if rev < self.compacted {
            return Err(StoreError::Compacted { rev });
        }
        let first_later = self.changes.partition_point(|c| c.event.rev() <= rev);
        let mut out = BTreeMap::new();
        for c in self.changes.range(first_later..) {
            let key = c.event.key();
            if key.starts_with(prefix) && after.is_none_or(|a| key > a) {
                // The first later change holds the state at `rev`.
                out.entry(key.to_owned()).or_insert_with(|| c.prev.clone());
            }
        }
        Ok(out)
    }

    /// The changes of keys starting with `prefix` at revisions `start..=through`, in order.
    pub fn replay(
        &self,
        prefix: &str,
        start: Rev,
        through: Rev,
    ) -> Result<Vec<WatchEvent>, StoreError> {
        if start <= self.compacted {
            return Err(StoreError::Compacted { rev: start });
        }
        let first = self.changes.partition_point(|c| c.event.rev() < start);
        Ok(self
            .changes
            .range(first..)
            .take_while(|c| c.event.rev() <= through)
            .filter(|c| c.event.key().starts_with(prefix))
            .map(|c| c.event.clone())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str, rev: Rev) -> WatchEvent {
        WatchEvent::Put(KeyValue {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
            mod_rev: rev,
            create_rev: rev,
            version: 1,
            lease: None,
        })
    }

    fn kv(event: &WatchEvent) -> Option<KeyValue> {
        match event {
            WatchEvent::Put(kv) => Some(kv.clone()),
            WatchEvent::Delete { .. } => None,
        }
    }

    #[test]
    fn the_state_at_a_revision_is_what_the_first_later_change_replaced() {
        let mut h = History::new(0);
        let a1 = put("p/a", "1", 1);
        let a2 = put("p/a", "2", 2);
        h.append([
            Change {
                event: a1.clone(),
                prev: None,
            },
            Change {
                event: a2.clone(),
                prev: kv(&a1),
            },
            Change {
                event: WatchEvent::Delete {
                    key: "p/a".into(),
                    rev: 3,
                },
                prev: kv(&a2),
            },
        ]);
        assert_eq!(h.state_at("p/", None, 0).unwrap()["p/a"], None);
        assert_eq!(h.state_at("p/", None, 1).unwrap()["p/a"], kv(&a1));
        assert_eq!(h.state_at("p/", None, 2).unwrap()["p/a"], kv(&a2));
        assert!(h.state_at("p/", None, 3).unwrap().is_empty());
        assert!(h.state_at("q/", None, 0).unwrap().is_empty());
        assert_eq!(h.replay("p/", 2, 3).unwrap().len(), 2);
        h.rollback(2);
        assert_eq!(h.replay("p/", 1, 9).unwrap().len(), 2);
        h.compact(1);
        assert!(matches!(
            h.state_at("p/", None, 0),
            Err(StoreError::Compacted { rev: 0 })
        ));
        assert!(h.replay("p/", 1, 9).is_err());
        assert_eq!(h.replay("p/", 2, 9).unwrap(), vec![a2]);
    }

    #[test]
    fn trimming_drops_whole_revisions_and_never_uncommitted_ones() {
        let mut h = History::new(0);
        let big = "x".repeat(MAX_HISTORY_BYTES / 2);
        h.append((1..=3).map(|rev| Change {
            event: put("k", &big, rev),
            prev: None,
        }));
        h.trim(1);
        assert_eq!(h.compacted(), 1, "only the committed revision may go");
        h.trim(3);
        assert_eq!(h.compacted(), 2);
        assert!(h.bytes <= MAX_HISTORY_BYTES);
    }
}
