//! The applier: commands in, batches applied, one atomic commit per batch,
//! then the read snapshot, answers and spoke messages — never before the
//! batch is durable.

use std::collections::BTreeMap;
use std::sync::Arc;

use axle_proto::api::{self, SubmitRequest};
use axle_proto::pb;
use tokio::sync::{mpsc, oneshot};
use tracing::{error, info, warn};

use super::retention::{EventsPage, RETENTION_BATCH};
use super::spokes::SpokeEvent;
use super::{Hub, HubConfig, HubError, Inner, MAX_COMMANDS_PER_BATCH, OnStoreFailure, SpokeTx};
use crate::records::EVENTS;
use crate::store::{MAX_OPS_PER_TXN, Op, Txn};

pub type Reply<T> = oneshot::Sender<Result<T, HubError>>;

/// The answer to a submit: the workload, and whether this call created it
/// (false for an idempotent replay).
pub type SubmitReply = Reply<(api::WorkloadView, bool)>;

/// Everything that changes the hub's state goes through the applier as one
/// of these.
pub enum Command {
    /// A user's submit, by `Identity`.
    Submit(SubmitRequest, crate::auth::Identity, SubmitReply),
    /// A user's cancel.
    Cancel(u64, crate::auth::Identity, Reply<api::WorkloadView>),
    /// A platform admin mints an API token for `user`, valid `ttl_ms` (0:
    /// the default); answered with the record and the token, shown once.
    CreateToken {
        user: String,
        ttl_ms: u64,
        by: crate::auth::Identity,
        reply: Reply<(crate::auth::TokenRecord, String)>,
    },
    /// A platform admin revokes API token `id`: it is refused from this commit on.
    RevokeToken {
        id: String,
        by: crate::auth::Identity,
        reply: Reply<crate::auth::TokenRecord>,
    },
    /// A platform admin mints a join token for `cluster`, valid `ttl_ms`
    /// (0: the default); answered with the record and the token, shown once.
    CreateJoinToken {
        cluster: String,
        ttl_ms: u64,
        by: crate::auth::Identity,
        reply: Reply<(crate::spoke_ca::JoinTokenRecord, String)>,
    },
    /// A new spoke presents a join token and a CSR.
    Join {
        token: String,
        cluster: String,
        csr_pem: String,
        reply: Reply<super::identity::IssuedCert>,
    },
    /// A joined spoke (`peer`: its certificate's fingerprint) asks for a new certificate.
    Renew {
        peer: Option<String>,
        csr_pem: String,
        reply: Reply<super::identity::IssuedCert>,
    },
    /// A platform admin cuts a cluster's spoke off.
    RevokeCluster {
        cluster: String,
        by: crate::auth::Identity,
        reply: Reply<super::identity::Revoked>,
    },
    Register {
        register: pb::Register,
        /// The fingerprint of the certificate the spoke connected with (mTLS).
        peer: Option<String>,
        conn: u64,
        tx: SpokeTx,
        reply: Reply<()>,
    },
    Heartbeat {
        cluster: String,
        conn: u64,
        heartbeat: pb::Heartbeat,
    },
    Status {
        cluster: String,
        conn: u64,
        status: pb::WorkloadStatus,
    },
    Disconnected {
        cluster: String,
        conn: u64,
    },
    Tick,
    /// What a burst provider call came to (from the burst worker).
    Burst(Box<crate::burst::worker::Outcome>),
    /// The hub is shutting down: end every spoke session (their streams
    /// close, so the drain does not wait for them; spokes redial).
    EndSessions,
}

/// What one batch produced besides memory changes.
#[derive(Default)]
pub(super) struct Effects {
    pub ops: Vec<Op>,
    pub msgs: Vec<(String, pb::HubMessage)>,
    pub after: Vec<Box<dyn FnOnce() + Send>>,
    /// Accepted submits, answered after the cycle: (id, newly created, reply).
    pub submitted: Vec<(u64, bool, SubmitReply)>,
    /// Workloads deleted by retention: their logs go once the delete is durable.
    pub forget_logs: Vec<u64>,
    /// Provider calls for the burst worker, sent once the batch is durable.
    pub burst_jobs: Vec<crate::burst::worker::Job>,
}

impl Effects {
    pub fn put<T: serde::Serialize>(&mut self, key: String, value: &T) {
        match serde_json::to_vec(value) {
            Ok(v) => self.ops.push(Op::Put {
                key,
                value: v,
                lease: None,
            }),
            Err(e) => error!("cannot encode record {key}: {e}"),
        }
    }

    pub fn delete(&mut self, key: String) {
        self.ops.push(Op::Delete { key });
    }

    /// Runs `f` once the batch is durable.
    pub fn after(&mut self, f: impl FnOnce() + Send + 'static) {
        self.after.push(Box::new(f));
    }
}

impl Hub {
    /// Makes a batch durable in one atomic store transaction, publishes the
    /// state it produced to readers, then tells: spoke messages in commit
    /// order, then the callers' answers. False when the commit failed
    /// under [`OnStoreFailure::StepDown`]: nothing was told, and the
    /// applier must stop (the callers' replies drop, so they see an error).
    pub(super) async fn commit(&self, fx: Effects) -> bool {
        if !fx.ops.is_empty() {
            // The store's per-txn op limit is etcd's; the batch is split in
            // txns of that size and committed all together or not at all.
            let mut txns = Vec::with_capacity(fx.ops.len() / MAX_OPS_PER_TXN + 1);
            let mut ops = fx.ops.into_iter().peekable();
            while ops.peek().is_some() {
                txns.push(Txn {
                    compares: Vec::new(),
                    success: ops.by_ref().take(MAX_OPS_PER_TXN).collect(),
                    failure: Vec::new(),
                });
            }
            if let Err(e) = self.store.txn_atomic(txns).await {
                // Memory is ahead of disk and callers were promised
                // durability: the only safe move is to stop and restart from the store.
                if self.config.on_store_failure == OnStoreFailure::StepDown {
                    error!("store commit failed: {e}; this replica steps down");
                    *self.store_failure.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(format!("store commit failed: {e}"));
                    return false;
                }
                error!("store commit failed: {e}; exiting so the hub restarts from its store");
                std::process::exit(70);
            }
        }
        let conns: BTreeMap<String, SpokeTx> = {
            let mut inner = self.lock();
            inner.refresh_burst_snapshot();
            self.read.store(Arc::new(inner.read_view()));
            inner
                .clusters
                .iter()
                .filter_map(|(n, c)| c.session.sender().map(|tx| (n.clone(), tx.clone())))
                .collect()
        };
        if !fx.forget_logs.is_empty() {
            let dir = crate::logs::dir(&self.config.data_dir);
            let ids = fx.forget_logs;
            tokio::spawn(async move {
                if let Err(e) = crate::logs::forget(&dir, &ids).await {
                    warn!(
                        "cannot delete the logs of {} retired workloads: {e}",
                        ids.len()
                    );
                }
            });
        }
        for (cluster, msg) in fx.msgs {
            if let Some(tx) = conns.get(&cluster)
                && tx.try_send(msg).is_err()
            {
                warn!("spoke {cluster} is not reading its stream; it will re-register");
            }
        }
        for f in fx.after {
            f();
        }
        if let Some(w) = self.burst_worker.get() {
            for job in fx.burst_jobs {
                w.queue(job);
            }
        }
        true
    }

    pub(super) async fn applier(self: Arc<Self>, mut rx: mpsc::Receiver<Command>) {
        let mut batch = Vec::with_capacity(MAX_COMMANDS_PER_BATCH);
        while rx.recv_many(&mut batch, MAX_COMMANDS_PER_BATCH).await > 0 {
            let now = self.now_ms();
            let mut fx = Effects::default();
            // Retention's read of old events happens here, before the lock
            // (the store is async); nothing else writes meanwhile.
            let mut events = None;
            if batch.iter().any(|c| matches!(c, Command::Tick)) {
                let from = self.lock().events_to_read(now);
                if let Some(from) = from {
                    events = Some(
                        self.store
                            .range_page(EVENTS, Some(&from), RETENTION_BATCH)
                            .await,
                    );
                }
            }
            {
                let mut inner = self.lock();
                for cmd in batch.drain(..) {
                    inner.apply(&self.config, cmd, &mut fx, now, &mut events);
                }
                if inner.dirty {
                    inner.dirty = false;
                    inner.schedule(&mut fx, now);
                }
                inner.save_counters(&mut fx);
                for (id, created, reply) in std::mem::take(&mut fx.submitted) {
                    let res = inner
                        .view(id)
                        .map(|v| (v, created))
                        .ok_or_else(|| HubError::Internal(format!("workload {id} vanished")));
                    fx.after(move || {
                        let _ = reply.send(res);
                    });
                }
            }
            if !self.commit(fx).await {
                return;
            }
        }
    }
}

impl Inner {
    /// Runs `f` as a user's command: its events name `who`.
    fn as_actor<T>(&mut self, who: crate::auth::Identity, f: impl FnOnce(&mut Self) -> T) -> T {
        self.actor = Some(who);
        let res = f(self);
        self.actor = None;
        res
    }

    pub(super) fn apply(
        &mut self,
        cfg: &HubConfig,
        cmd: Command,
        fx: &mut Effects,
        now: u64,
        events: &mut Option<EventsPage>,
    ) {
        match cmd {
            Command::Submit(req, who, reply) => {
                match self.as_actor(who, |inner| inner.submit(req, fx, now)) {
                    // The view is taken after this batch's cycle, so the answer
                    // already says where the workload went or why it waits.
                    Ok((id, created)) => fx.submitted.push((id, created, reply)),
                    Err(e) => fx.after(move || {
                        let _ = reply.send(Err(e));
                    }),
                }
            }
            Command::Cancel(id, who, reply) => {
                let res = self.as_actor(who, |inner| inner.cancel(id, fx, now));
                fx.after(move || {
                    let _ = reply.send(res);
                });
            }
            Command::CreateToken {
                user,
                ttl_ms,
                by,
                reply,
            } => {
                let res = self.as_actor(by, |inner| inner.create_token(user, ttl_ms, fx, now));
                fx.after(move || {
                    let _ = reply.send(res);
                });
            }
            Command::RevokeToken { id, by, reply } => {
                let res = self.as_actor(by, |inner| inner.revoke_token(&id, fx, now));
                fx.after(move || {
                    let _ = reply.send(res);
                });
            }
            Command::CreateJoinToken {
                cluster,
                ttl_ms,
                by,
                reply,
            } => {
                let res = self.as_actor(by, |inner| {
                    inner.create_join_token(cfg, cluster, ttl_ms, fx, now)
                });
                fx.after(move || {
                    let _ = reply.send(res);
                });
            }
            Command::Join {
                token,
                cluster,
                csr_pem,
                reply,
            } => {
                let res = self.join(cfg, &token, &cluster, &csr_pem, fx, now);
                fx.after(move || {
                    let _ = reply.send(res);
                });
            }
            Command::Renew {
                peer,
                csr_pem,
                reply,
            } => {
                let res = self.renew(cfg, peer.as_deref(), &csr_pem, fx, now);
                fx.after(move || {
                    let _ = reply.send(res);
                });
            }
            Command::RevokeCluster { cluster, by, reply } => {
                let res = self.as_actor(by, |inner| inner.revoke_cluster(&cluster, fx, now));
                fx.after(move || {
                    let _ = reply.send(res);
                });
            }
            Command::Register {
                register,
                peer,
                conn,
                tx,
                reply,
            } => {
                // Answered after the batch's commit, like every other
                // command: the session opens only once its registration
                // is durable.
                let cluster = register.cluster.clone();
                let res = self.register(cfg, register, peer.as_deref(), conn, tx, fx, now);
                if let Err(e) = &res {
                    self.note_refused_spoke(&cluster, e, fx, now);
                }
                fx.after(move || {
                    let _ = reply.send(res);
                });
            }
            Command::Heartbeat {
                cluster,
                conn,
                heartbeat,
            } => self.heartbeat(&cluster, conn, heartbeat, fx, now),
            Command::Status {
                cluster,
                conn,
                status,
            } => {
                if self.is_current(&cluster, conn) {
                    self.status(&cluster, status, fx, now);
                }
            }
            Command::Disconnected { cluster, conn } => {
                if self.spoke_step(&cluster, SpokeEvent::StreamEnded { conn }, fx, now) {
                    info!("spoke {cluster} disconnected");
                    self.event(
                        fx,
                        now,
                        "spoke_disconnected",
                        None,
                        Some(&cluster),
                        format!("spoke {cluster} disconnected"),
                    );
                }
            }
            Command::EndSessions => {
                let open: Vec<(String, u64)> = self
                    .clusters
                    .iter()
                    .filter_map(|(n, c)| c.session.session().map(|(conn, _)| (n.clone(), conn)))
                    .collect();
                for (cluster, conn) in open {
                    self.spoke_step(&cluster, SpokeEvent::StreamEnded { conn }, fx, now);
                }
            }
            Command::Burst(outcome) => self.burst_outcome(*outcome, fx, now),
            Command::Tick => {
                self.liveness(fx, now);
                self.burst_tick(fx, now);
                self.retain(fx, now, events.take());
                // A cycle each tick (waits pass burst thresholds), without
                // forcing a full explanation when nothing else changed.
                self.dirty = true;
            }
        }
    }
}
