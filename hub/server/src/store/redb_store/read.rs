//! The read side of [`RedbStore`]: point reads, ranges at a revision (the committed state
//! corrected back through the history), tails, watches and compaction.

use super::*;

/// Reads: redb answers from its committed state at once, so the trait's
/// futures are ready when made.
impl RedbStore {
    pub(super) fn get_now(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let read = self.shared.db.begin_read().ctx("beginning a read")?;
        let table = read.open_table(KV).ctx("opening the kv table")?;
        let Some(bytes) = table.get(key).ctx("reading a key")? else {
            return Ok(None);
        };
        self.decode_kv(key, bytes.value(), Instant::now())
    }

    /// A page as of `rev` (see `history.rs`): the snapshot, with every key that changed
    /// after `rev` put back as it was then.
    pub(super) fn range_at_now(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        rev: Option<Rev>,
    ) -> Result<Page, StoreError> {
        // A read at the current revision can only find it compacted if the history was
        // trimmed between reading the revision and taking the snapshot: read again.
        let mut tries = 0;
        loop {
            tries += 1;
            match self.range_at_once(prefix, after, limit, rev) {
                Err(StoreError::Compacted { .. }) if rev.is_none() && tries < 3 => continue,
                r => return r,
            }
        }
    }

    fn range_at_once(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        rev: Option<Rev>,
    ) -> Result<Page, StoreError> {
        let current = self.shared.rev.load(Ordering::Acquire);
        let at = rev.unwrap_or(current);
        if at > current {
            return Err(StoreError::FutureRevision { rev: at, current });
        }
        let read = self.shared.db.begin_read().ctx("beginning a read")?;
        let table = read.open_table(KV).ctx("opening the kv table")?;
        let since = lock(&self.shared.history).state_at(prefix, after, at)?;
        let now = Instant::now();
        let start = match after {
            Some(a) if a >= prefix => std::ops::Bound::Excluded(a),
            _ => std::ops::Bound::Included(prefix),
        };
        let mut out = Vec::new();
        let mut since = since.into_iter().peekable();
        let take = |kv: Option<KeyValue>, out: &mut Vec<KeyValue>| {
            if let Some(kv) = kv.filter(|kv| self.shared.lease_live(kv.lease, now)) {
                out.push(kv);
            }
        };
        let range = table
            .range::<&str>((start, std::ops::Bound::Unbounded))
            .ctx("ranging over keys")?;
        for entry in range {
            if out.len() >= limit {
                break;
            }
            let (key, bytes) = entry.ctx("reading a key in a range")?;
            let key = key.value();
            if !key.starts_with(prefix) {
                break;
            }
            // Keys that existed at `at` and are gone from the snapshot come back in order.
            while out.len() < limit
                && let Some((_, then)) = since.next_if(|(k, _)| k.as_str() < key)
            {
                take(then, &mut out);
            }
            if out.len() >= limit {
                break;
            }
            match since.next_if(|(k, _)| k == key) {
                Some((_, then)) => take(then, &mut out),
                None => {
                    if let Some(kv) = self.decode_kv(key, bytes.value(), now)? {
                        out.push(kv);
                    }
                }
            }
        }
        for (_, then) in since {
            if out.len() >= limit {
                break;
            }
            take(then, &mut out);
        }
        Ok(Page { kvs: out, rev: at })
    }

    pub(super) fn range_tail_now(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<KeyValue>, StoreError> {
        let read = self.shared.db.begin_read().ctx("beginning a read")?;
        let table = read.open_table(KV).ctx("opening the kv table")?;
        let now = Instant::now();
        let mut out = Vec::new();
        let range = table.range::<&str>(prefix..).ctx("ranging over keys")?;
        // Keys after the prefix's range sort after every key in it; walk
        // back from the end past them, then take the last `limit`.
        for entry in range.rev() {
            if out.len() >= limit {
                break;
            }
            let (key, bytes) = entry.ctx("reading a key in a range")?;
            let key = key.value();
            if !key.starts_with(prefix) {
                if out.is_empty() {
                    continue;
                }
                break;
            }
            if let Some(kv) = self.decode_kv(key, bytes.value(), now)? {
                out.push(kv);
            }
        }
        out.reverse();
        Ok(out)
    }

    pub(super) fn watch_now(
        &self,
        prefix: &str,
        start: Option<Rev>,
    ) -> Result<mpsc::Receiver<WatchEvent>, StoreError> {
        if self.requests.is_none() {
            return Err(StoreError::Closed);
        }
        // Under the watchers' lock nothing is published: the backlog (from the history)
        // and the live events (from `publish`) meet at `published` without a gap.
        let mut watchers = lock(&self.shared.watchers);
        watchers.list.retain(|w| !w.events.is_closed());
        if watchers.list.len() >= MAX_WATCHERS {
            return Err(StoreError::TooManyWatchers(MAX_WATCHERS));
        }
        let published = watchers.published;
        let backlog = match start {
            Some(s) if s <= published => lock(&self.shared.history).replay(prefix, s, published)?,
            _ => Vec::new(),
        };
        let (events, receiver) = mpsc::channel(WATCH_CHANNEL_CAPACITY + backlog.len());
        for event in backlog {
            // Cannot fail: the channel has room for the whole backlog.
            let _ = events.try_send(event);
        }
        watchers.list.push(Watcher {
            prefix: prefix.to_owned(),
            from: start.unwrap_or(0).max(published + 1),
            events,
        });
        Ok(receiver)
    }

    pub(super) fn compact_now(&self, rev: Rev) -> Result<(), StoreError> {
        let current = self.shared.rev.load(Ordering::Acquire);
        if rev > current {
            return Err(StoreError::FutureRevision { rev, current });
        }
        lock(&self.shared.history).compact(rev);
        Ok(())
    }
}
