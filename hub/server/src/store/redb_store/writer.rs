//! The single writer thread of [`RedbStore`]: batches of requests applied in one redb write
//! transaction and committed with one fsync, then published (see the parent module).

use super::*;

/// The single writer: owns the write side of the database.
pub(super) struct Writer {
    pub(super) shared: Arc<Shared>,
    pub(super) reaper_wake: Arc<Notify>,
    /// Latest committed revision.
    pub(super) rev: Rev,
    /// Next lease id to hand out.
    pub(super) next_lease: LeaseId,
}

/// The tables of one write transaction.
struct Tables<'t> {
    kv: Table<'t, &'static str, &'static [u8]>,
    meta: Table<'t, &'static str, u64>,
    leases: Table<'t, u64, u64>,
    lease_keys: Table<'t, &'static str, ()>,
}

/// What one batch did, applied to memory only after its commit succeeds.
struct Batch {
    rev: Rev,
    next_lease: LeaseId,
    /// Whether anything was written (otherwise nothing is committed).
    dirty: bool,
    /// The batch's changes with the values they replace, in commit order.
    changes: Vec<Change>,
    granted: Vec<(LeaseId, u64, Instant)>,
    /// Leases deleted in this batch, marked `revoking` in the lease map.
    ended: Vec<LeaseId>,
}

impl Writer {
    pub(super) fn run(mut self, mut queue: mpsc::Receiver<Request>) {
        let mut requests = Vec::with_capacity(MAX_BATCH_TXNS);
        while let Some(first) = queue.blocking_recv() {
            requests.push(first);
            while requests.len() < MAX_BATCH_TXNS {
                match queue.try_recv() {
                    Ok(request) => requests.push(request),
                    Err(_) => break,
                }
            }
            self.process(std::mem::take(&mut requests));
        }
        tracing::debug!("store writer stopped: queue closed");
    }

    fn process(&mut self, requests: Vec<Request>) {
        let now = requests
            .iter()
            .map(|r| match r {
                Request::Txn { now, .. }
                | Request::Atomic { now, .. }
                | Request::Grant { now, .. }
                | Request::Revoke { now, .. }
                | Request::Reap { now, .. } => *now,
            })
            .max();
        let mut replies = Vec::with_capacity(requests.len());
        let mut works = Vec::with_capacity(requests.len());
        for request in requests {
            let (work, reply) = match request {
                Request::Txn { txn, reply, .. } => (Work::Txn(txn), reply),
                Request::Atomic { txns, reply, .. } => (Work::Atomic(txns), reply),
                Request::Grant { ttl_ms, now, reply } => (Work::Grant { ttl_ms, now }, reply),
                Request::Revoke { id, reply, .. } => (Work::Revoke(id), reply),
                Request::Reap { reply, .. } => (Work::Reap, reply),
            };
            works.push(work);
            replies.push(reply);
        }
        let mut batch = Batch {
            rev: self.rev,
            next_lease: self.next_lease,
            dirty: false,
            changes: Vec::new(),
            granted: Vec::new(),
            ended: Vec::new(),
        };
        match self.apply(works, now, &mut batch) {
            Ok(outcomes) => {
                self.rev = batch.rev;
                self.next_lease = batch.next_lease;
                self.shared.rev.store(batch.rev, Ordering::Release);
                {
                    let mut leases = lock(&self.shared.leases);
                    for id in &batch.ended {
                        leases.remove(id);
                    }
                    for &(id, ttl_ms, granted_at) in &batch.granted {
                        leases.insert(id, LeaseState::new(ttl_ms, granted_at));
                    }
                }
                if !batch.granted.is_empty() {
                    self.reaper_wake.notify_one();
                }
                lock(&self.shared.history).trim(batch.rev);
                // Events first: a caller that sees its txn resolve finds its events queued.
                self.publish(&batch.changes, batch.rev);
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    // A caller that gave up waiting is not an error.
                    let _ = reply.send(outcome);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "group commit failed; nothing in it was written");
                lock(&self.shared.history).rollback(self.rev);
                let mut leases = lock(&self.shared.leases);
                for id in &batch.ended {
                    if let Some(lease) = leases.get_mut(id) {
                        lease.revoking = false;
                    }
                }
                drop(leases);
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// Applies a batch in one write transaction and commits it. The outer error fails the whole
    /// batch (nothing written); the inner results are per request.
    fn apply(
        &self,
        works: Vec<Work>,
        now: Option<Instant>,
        batch: &mut Batch,
    ) -> Result<Vec<Result<Reply, StoreError>>, StoreError> {
        let mut wtx = self
            .shared
            .db
            .begin_write()
            .ctx("beginning a group commit")?;
        wtx.set_durability(Durability::Immediate)
            .ctx("setting commit durability")?;
        let mut outcomes = Vec::with_capacity(works.len());
        {
            let mut tables = Tables {
                kv: wtx.open_table(KV).ctx("opening the kv table")?,
                meta: wtx.open_table(META).ctx("opening the meta table")?,
                leases: wtx.open_table(LEASES).ctx("opening the lease table")?,
                lease_keys: wtx
                    .open_table(LEASE_KEYS)
                    .ctx("opening the lease index table")?,
            };
            if let Some(now) = now {
                self.reap_expired(&mut tables, now, batch)?;
            }
            for work in works {
                let outcome = match work {
                    Work::Txn(txn) => self.apply_txn(&mut tables, txn, batch)?.map(Reply::Txn),
                    Work::Atomic(txns) => {
                        let mut results = Vec::with_capacity(txns.len());
                        for txn in txns {
                            // A txn of an atomic group that fails after its
                            // predecessors were applied fails the whole
                            // group commit: nothing of it is written.
                            match self.apply_txn(&mut tables, txn, batch)? {
                                Ok(r) => results.push(r),
                                Err(e) => return Err(e),
                            }
                        }
                        Ok(Reply::Txns(results))
                    }
                    Work::Grant { ttl_ms, now } => self.grant(&mut tables, ttl_ms, now, batch)?,
                    Work::Revoke(id) => self.revoke(&mut tables, id, batch)?,
                    Work::Reap => Ok(Reply::Done),
                };
                outcomes.push(outcome);
            }
            if batch.dirty {
                tables
                    .meta
                    .insert(META_REV, batch.rev)
                    .ctx("writing the revision")?;
                tables
                    .meta
                    .insert(META_NEXT_LEASE, batch.next_lease)
                    .ctx("writing the next lease id")?;
            }
        }
        if batch.dirty {
            // Before the commit is visible: a reader's snapshot never shows a change the
            // history lacks (see `history.rs`).
            lock(&self.shared.history).append(batch.changes.iter().cloned());
            wtx.commit().ctx("committing a group commit")?;
            self.shared.commits.fetch_add(1, Ordering::Relaxed);
        } else {
            wtx.abort().ctx("ending a read-only batch")?;
        }
        Ok(outcomes)
    }

    /// Deletes the leases that expired by `now` (the latest clock reading in the batch).
    fn reap_expired(
        &self,
        tables: &mut Tables<'_>,
        now: Instant,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        let mut expired: Vec<LeaseId> = {
            let mut leases = lock(&self.shared.leases);
            leases
                .iter_mut()
                .filter(|(_, l)| !l.revoking && l.deadline <= now)
                .map(|(id, l)| {
                    l.revoking = true;
                    *id
                })
                .collect()
        };
        // Deterministic order of the delete events.
        expired.sort_unstable();
        for id in expired {
            tracing::debug!(lease = id, "lease expired");
            batch.ended.push(id);
            self.end_lease(tables, id, batch)?;
        }
        Ok(())
    }

    /// Deletes a lease and the keys attached to it, as one revision.
    fn end_lease(
        &self,
        tables: &mut Tables<'_>,
        id: LeaseId,
        batch: &mut Batch,
    ) -> Result<(), StoreError> {
        let prefix = lease_index_prefix(id);
        let mut index_keys = Vec::new();
        for entry in tables
            .lease_keys
            .range::<&str>(prefix.as_str()..)
            .ctx("listing a lease's keys")?
        {
            let (index_key, _) = entry.ctx("reading a lease's keys")?;
            let index_key = index_key.value();
            if !index_key.starts_with(&prefix) {
                break;
            }
            index_keys.push(index_key.to_owned());
        }
        let rev = batch.rev + 1;
        let mut deleted_any = false;
        for index_key in index_keys {
            tables
                .lease_keys
                .remove(index_key.as_str())
                .ctx("removing a lease index entry")?;
            let key = &index_key[prefix.len()..];
            // The index and the records change together, but check before deleting anyway.
            let owned = tables
                .kv
                .get(key)
                .ctx("reading a leased key")?
                .is_some_and(|bytes| stored_lease(key, bytes.value()) == Some(id));
            if owned {
                let old = tables.kv.remove(key).ctx("deleting a leased key")?;
                let prev = old.and_then(|old| replaced(key, old.value()));
                batch.changes.push(Change {
                    event: WatchEvent::Delete {
                        key: key.to_owned(),
                        rev,
                    },
                    prev,
                });
                deleted_any = true;
            }
        }
        tables.leases.remove(id).ctx("deleting a lease")?;
        batch.dirty = true;
        if deleted_any {
            batch.rev = rev;
        }
        Ok(())
    }

    fn apply_txn(
        &self,
        tables: &mut Tables<'_>,
        txn: Txn,
        batch: &mut Batch,
    ) -> Result<Result<TxnResult, StoreError>, StoreError> {
        let mut succeeded = true;
        for (key, compare) in &txn.compares {
            let current = match tables.kv.get(key.as_str()).ctx("reading a compared key")? {
                Some(bytes) => match record::decode(key, bytes.value()) {
                    Ok(rec) => Some(kv_of(key, rec)),
                    Err(e) => return Ok(Err(e)),
                },
                None => None,
            };
            if !compare.holds(current.as_ref()) {
                succeeded = false;
                break;
            }
        }
        let ops = if succeeded { txn.success } else { txn.failure };
        {
            let leases = lock(&self.shared.leases);
            for op in &ops {
                if let Op::Put {
                    lease: Some(id), ..
                } = op
                    && leases.get(id).is_none_or(|l| l.revoking)
                {
                    return Ok(Err(StoreError::LeaseNotFound(*id)));
                }
            }
        }
        let rev = batch.rev + 1;
        let mut changed = false;
        for op in ops {
            match op {
                Op::Put { key, value, lease } => {
                    // etcd's metadata: the creation revision stays, the
                    // version counts puts since the key was last absent.
                    let (create_rev, version) =
                        match tables.kv.get(key.as_str()).ctx("reading a key")? {
                            Some(old) => match record::decode_header(&key, old.value()) {
                                Ok(h) => (h.create_rev, h.version + 1),
                                Err(_) => (rev, 1),
                            },
                            None => (rev, 1),
                        };
                    let header = record::Header {
                        mod_rev: rev,
                        create_rev,
                        version,
                        lease,
                    };
                    let bytes = record::encode(&header, &value);
                    let prev = tables
                        .kv
                        .insert(key.as_str(), bytes.as_slice())
                        .ctx("writing a key")?
                        .and_then(|old| replaced(&key, old.value()));
                    let old_lease = prev.as_ref().and_then(|kv| kv.lease);
                    if old_lease != lease {
                        if let Some(old) = old_lease {
                            tables
                                .lease_keys
                                .remove(lease_index_key(old, &key).as_str())
                                .ctx("removing a lease index entry")?;
                        }
                        if let Some(new) = lease {
                            tables
                                .lease_keys
                                .insert(lease_index_key(new, &key).as_str(), ())
                                .ctx("writing a lease index entry")?;
                        }
                    }
                    batch.changes.push(Change {
                        event: WatchEvent::Put(KeyValue {
                            key,
                            value,
                            mod_rev: rev,
                            create_rev,
                            version,
                            lease,
                        }),
                        prev,
                    });
                    changed = true;
                }
                Op::Delete { key } => {
                    let removed = tables
                        .kv
                        .remove(key.as_str())
                        .ctx("deleting a key")?
                        .map(|old| replaced(&key, old.value()));
                    if let Some(prev) = removed {
                        if let Some(old) = prev.as_ref().and_then(|kv| kv.lease) {
                            tables
                                .lease_keys
                                .remove(lease_index_key(old, &key).as_str())
                                .ctx("removing a lease index entry")?;
                        }
                        batch.changes.push(Change {
                            event: WatchEvent::Delete { key, rev },
                            prev,
                        });
                        changed = true;
                    }
                }
            }
        }
        if changed {
            batch.rev = rev;
            batch.dirty = true;
        }
        Ok(Ok(TxnResult {
            succeeded,
            rev: batch.rev,
        }))
    }

    fn grant(
        &self,
        tables: &mut Tables<'_>,
        ttl_ms: u64,
        now: Instant,
        batch: &mut Batch,
    ) -> Result<Result<Reply, StoreError>, StoreError> {
        let live = lock(&self.shared.leases).len() + batch.granted.len();
        if live >= MAX_LEASES {
            return Ok(Err(StoreError::InvalidRequest(format!(
                "too many leases (limit {MAX_LEASES})"
            ))));
        }
        let id = batch.next_lease;
        batch.next_lease += 1;
        tables.leases.insert(id, ttl_ms).ctx("writing a lease")?;
        batch.granted.push((id, ttl_ms, now));
        batch.dirty = true;
        Ok(Ok(Reply::Lease(id)))
    }

    fn revoke(
        &self,
        tables: &mut Tables<'_>,
        id: LeaseId,
        batch: &mut Batch,
    ) -> Result<Result<Reply, StoreError>, StoreError> {
        {
            let mut leases = lock(&self.shared.leases);
            match leases.get_mut(&id) {
                Some(lease) if !lease.revoking => lease.revoking = true,
                _ => return Ok(Err(StoreError::LeaseNotFound(id))),
            }
        }
        batch.ended.push(id);
        self.end_lease(tables, id, batch)?;
        Ok(Ok(Reply::Done))
    }

    /// Sends a durable batch's events to the watchers of their prefixes, in commit order.
    fn publish(&self, changes: &[Change], rev: Rev) {
        let mut watchers = lock(&self.shared.watchers);
        watchers.published = rev;
        watchers.list.retain(|watcher| {
            if watcher.events.is_closed() {
                return false;
            }
            for event in changes
                .iter()
                .map(|c| &c.event)
                .filter(|e| e.rev() >= watcher.from && e.key().starts_with(&watcher.prefix))
            {
                match watcher.events.try_send(event.clone()) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => {
                        tracing::warn!(
                            prefix = %watcher.prefix,
                            "watcher fell {WATCH_CHANNEL_CAPACITY} events behind; dropping it"
                        );
                        return false;
                    }
                    Err(TrySendError::Closed(_)) => return false,
                }
            }
            true
        });
    }
}
