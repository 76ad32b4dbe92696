//! The hub's core, by responsibility. One applier task owns every state
//! change: it takes a batch of [`Command`]s (submits, cancels, spoke
//! messages, ticks), applies them to the in-memory state, runs a scheduling
//! cycle when something changed, commits everything in ONE atomic store
//! transaction, publishes a new immutable [`ReadView`] for readers, and only
//! then answers callers and sends assignments and stops to spokes — in
//! commit order, so a spoke never sees a stop overtaken by an older assign.
//!
//! - `applier.rs` — commands, batching, the commit, effects;
//! - `restore.rs` — loading the state from the store at start;
//! - `snapshot.rs` — records ↔ the scheduler's `State` (inventory, rebuild);
//! - `workloads.rs` — user commands (submit, cancel) and workload transitions;
//! - `spokes.rs` — the [`SpokeState`] lifecycle, registration, liveness;
//! - `inventory.rs` — what a registering spoke may claim, against the policy;
//! - `reports.rs` — what spokes report about workloads (status, stops);
//! - `messages.rs` — what the hub sends to spokes (assign, stop);
//! - `schedule.rs` — one cycle and its decisions turned into records;
//! - `read.rs` — the read snapshot and every query on it;
//! - `retention.rs` — deleting finished workloads and old events;
//! - `tokens.rs` — minting API tokens (`crate::auth` checks them);
//! - `identity.rs` — spoke join tokens and certificates (`crate::spoke_ca` issues them);
//! - `tasks.rs` — the supervised tasks; `clock.rs`, `error.rs`, `limits.rs`.
//!
//! Nothing here knows HTTP or gRPC: errors are [`HubError`]s mapped at the
//! edges, spokes are fed `pb::HubMessage`s over a channel.

mod applier;
mod burst;
mod clock;
mod error;
mod identity;
mod inventory;
mod limits;
mod messages;
mod read;
mod reports;
mod restore;
mod retention;
mod schedule;
mod snapshot;
mod spokes;
mod table;
mod tasks;
mod tokens;
mod workloads;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use axle_policy::Policy;
use axle_scheduler::{PendingReason, State};
use tokio::sync::mpsc;

use crate::read_lane::ReadLane;
use crate::records::*;
use crate::store::Store;

pub use applier::{Command, Reply, SubmitReply};
pub use clock::Clock;
pub use error::HubError;
pub use identity::{IssuedCert, Revoked, invalid_join_token};
pub use limits::*;
pub use read::{ListParams, Page, PageItem, ReadView};
pub use retention::Retention;
pub use spokes::{SpokeEvent, SpokeState, SpokeTx};
pub use table::Workloads;
pub use tasks::HubTasks;

use applier::Effects;
use spokes::ClusterEntry;

#[derive(Debug, Clone)]
pub struct HubConfig {
    pub data_dir: PathBuf,
    /// Shared secret spokes must present; `None` accepts any (dev mode).
    pub spoke_token: Option<String>,
    /// How much of each run's log the hub keeps.
    pub log_limits: crate::logs::LogLimits,
    /// Where hub time comes from.
    pub clock: Clock,
    /// What a failed store commit does.
    pub on_store_failure: OnStoreFailure,
    /// How user calls are authenticated.
    pub auth: crate::auth::AuthMode,
    /// A token the hub accepts from its start on (`--dev` mints one for its
    /// dev user and prints it).
    pub bootstrap_token: Option<crate::auth::TokenRecord>,
    /// How much each user, and everyone together, may ask.
    pub rate_limits: crate::rate::RateLimits,
    /// The CA that issues spoke certificates: with it, spokes register with a
    /// certificate it issued (mTLS), and `spoke_token` is not used.
    pub spoke_ca: Option<Arc<crate::spoke_ca::SpokeCa>>,
    /// How long a spoke certificate lives.
    pub spoke_cert_ttl_ms: u64,
    /// Single sign-on: OIDC ID tokens accepted besides API tokens.
    pub oidc: Option<Arc<crate::oidc::Oidc>>,
    /// Cloud burst: the providers and how instances reach the hub; `None`:
    /// the hub never launches (burst wishes are only recorded as events).
    pub burst: Option<Arc<crate::burst::setup::BurstConfig>>,
}

/// What the hub does when a commit fails: memory is then ahead of the
/// store, and callers were promised durability, so it never goes on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnStoreFailure {
    /// Exit the process (status 70), so a supervisor restarts it from its
    /// store: one hub on redb.
    #[default]
    Exit,
    /// Stop the applier and report it ([`HubTasks::failed`],
    /// [`Hub::store_failure`]): a replica on etcd steps down and campaigns again.
    StepDown,
}

/// The applier's state. Only the applier task touches it (behind
/// [`Hub::lock`], never held across an await); readers use the
/// [`ReadView`] published after every commit.
pub struct Inner {
    /// When a refused registration was last recorded as an event, by
    /// declared cluster (one key for every undeclared name), so a spoke
    /// retrying a refused registration writes an event a minute at most.
    refusals_noted: BTreeMap<String, u64>,
    policy: Arc<Policy>,
    state: State,
    clusters: BTreeMap<String, ClusterEntry>,
    workloads: Workloads,
    reasons: imbl::OrdMap<u64, Arc<PendingReason>>,
    idem: BTreeMap<(String, String), u64>,
    next_id: u64,
    next_event: u64,
    events: imbl::Vector<Arc<EventRecord>>,
    burst_noted: BTreeSet<u64>,
    started_ms: u64,
    /// Something changed that may let a workload run: run a cycle.
    dirty: bool,
    /// Something changed since the last cycle that explained every waiting workload.
    explain_stale: bool,
    last_explain_ms: u64,
    /// Finished workloads by finish time, for retention: (finished_at_ms, id).
    finished: BTreeSet<(u64, u64)>,
    /// Oldest event sequence still stored, and its time (`u64::MAX`: none
    /// stored): retention deletes from there.
    oldest_event: u64,
    oldest_event_at_ms: u64,
    /// The counters last written to the store.
    saved_counters: (u64, u64),
    /// API tokens by id (copied on write: readers share it).
    tokens: Arc<BTreeMap<String, crate::auth::TokenRecord>>,
    /// Join tokens of new spokes by id.
    join_tokens: Arc<BTreeMap<String, crate::spoke_ca::JoinTokenRecord>>,
    /// Certificates issued to spokes by fingerprint.
    spoke_certs: Arc<BTreeMap<String, crate::spoke_ca::SpokeCertRecord>>,
    /// The caller of the command being applied, for its events.
    actor: Option<crate::auth::Identity>,
    /// Burst instances by id (live, and finished ones of this and last month).
    bursts: BTreeMap<String, crate::burst::record::BurstRecord>,
    /// The reservations of `bursts`, by team and month.
    ledger: crate::burst::ledger::Ledger,
    /// What the burst reconciler keeps in memory only.
    burst_rt: burst::BurstRuntime,
    burst_cfg: Option<Arc<crate::burst::setup::BurstConfig>>,
    spoke_ca: Option<Arc<crate::spoke_ca::SpokeCa>>,
    /// `bursts` as readers see it, rebuilt when a burst record changed.
    burst_snapshot: Arc<Vec<crate::burst::record::BurstRecord>>,
    burst_snapshot_stale: bool,
    /// Run times of finished workloads by kind (bounded histograms), for
    /// the start estimates of work waiting behind running work without a
    /// max runtime. Rebuilt from the retained finished workloads at start.
    runtimes: axle_scheduler::RuntimeStats,
}

pub struct Hub {
    inner: Mutex<Inner>,
    read: ArcSwap<ReadView>,
    /// Permits to build a list page (see [`list_concurrency`]).
    lists: tokio::sync::Semaphore,
    /// The threads that build them, below the writers' CPU priority.
    list_lane: ReadLane,
    store: Arc<dyn Store>,
    tx: mpsc::Sender<Command>,
    /// Per-user rate and the bound on user calls in flight.
    pub limiter: crate::rate::Limiter,
    pub config: HubConfig,
    /// Why the last commit failed, under [`OnStoreFailure::StepDown`].
    store_failure: Mutex<Option<String>>,
    /// Performs provider calls for the burst reconciler.
    burst_worker: std::sync::OnceLock<crate::burst::worker::Worker>,
}

impl Hub {
    /// Loads the hub's state from the store and starts the applier and
    /// ticker tasks, which [`HubTasks`] supervises.
    pub async fn start(
        store: Arc<dyn Store>,
        policy: Policy,
        config: HubConfig,
    ) -> anyhow::Result<(Arc<Hub>, HubTasks)> {
        let source = store.clone();
        Self::start_from(store, source.as_ref(), policy, config).await
    }

    /// Like [`Hub::start`], loading the state from `source` instead: a copy of `store`
    /// as of its latest revision (a replica's warm mirror), which saves reading every key
    /// again. The hub writes to `store` only.
    pub async fn start_from(
        store: Arc<dyn Store>,
        source: &dyn Store,
        policy: Policy,
        config: HubConfig,
    ) -> anyhow::Result<(Arc<Hub>, HubTasks)> {
        let now = config.clock.now_ms();
        let inner = restore::load(source, Arc::new(policy), now).await?;
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let hub = Arc::new(Hub {
            read: ArcSwap::from_pointee(inner.read_view()),
            lists: tokio::sync::Semaphore::new(list_concurrency()),
            list_lane: ReadLane::new(list_concurrency()),
            inner: Mutex::new(inner),
            store,
            tx,
            limiter: crate::rate::Limiter::new(config.rate_limits),
            config,
            store_failure: Mutex::new(None),
            burst_worker: std::sync::OnceLock::new(),
        });
        {
            let mut inner = hub.lock();
            inner.burst_cfg = hub.config.burst.clone();
            // Bursting needs the spoke CA: instances join with a join token.
            inner.spoke_ca = hub.config.spoke_ca.clone();
            if inner.spoke_ca.is_none() {
                inner.burst_cfg = None;
            }
        }
        {
            let mut fx = Effects::default();
            {
                let mut inner = hub.lock();
                if let Some(t) = &hub.config.bootstrap_token {
                    fx.put(token_key(&t.id), t);
                    Arc::make_mut(&mut inner.tokens).insert(t.id.clone(), t.clone());
                }
                inner.rebuild(&mut fx, now);
                let n = inner.workloads.len();
                inner.event(
                    &mut fx,
                    now,
                    "hub_started",
                    None,
                    None,
                    format!("hub started with {n} workloads"),
                );
                inner.save_counters(&mut fx);
            }
            if !hub.commit(fx).await {
                anyhow::bail!(
                    "cannot write the hub's start: {}",
                    hub.store_failure().unwrap_or_default()
                );
            }
        }
        let mut tasks = tasks::spawn(hub.clone(), rx);
        if let Some(b) = hub.lock().burst_cfg.clone() {
            let (worker, task) =
                crate::burst::worker::Worker::spawn(b.providers.clone(), hub.tx.clone());
            let _ = hub.burst_worker.set(worker);
            tasks.burst = Some(task);
        }
        Ok((hub, tasks))
    }

    /// The applier's state; for the applier and tests only.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock means a panic in the applier, which the
        // supervisor turns into an exit; the state is not read again.
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The latest committed state, for every read: never waits on the applier.
    pub fn read(&self) -> Arc<ReadView> {
        self.read.load_full()
    }

    /// Runs `build` (a list page and its encoding) on the [`ReadLane`]
    /// once a list permit is free: lists are the expensive reads, and
    /// however many clients poll them they use at most
    /// [`list_concurrency`] threads, off the async workers that carry
    /// submits and the applier, and below their CPU priority.
    pub async fn with_list_permit<T: Send + 'static>(
        &self,
        build: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, HubError> {
        let _permit = self
            .lists
            .acquire()
            .await
            .map_err(|_| HubError::shutting_down())?;
        self.list_lane.run(build).await
    }

    pub async fn send(&self, cmd: Command) -> Result<(), HubError> {
        self.tx.send(cmd).await.map_err(|_| self.stopped())
    }

    /// Sends the command `make` builds around a reply channel and waits for
    /// its answer (given once the command's batch is durable).
    pub async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, HubError> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.send(make(reply)).await?;
        rx.await.map_err(|_| self.stopped())?
    }

    /// Why a command got no answer: the applier stopped on a store failure (a replica
    /// that stepped down: nothing of the request was kept), or the hub is shutting down.
    pub fn stopped(&self) -> HubError {
        match self.store_failure() {
            Some(why) => HubError::Unavailable(format!(
                "this hub replica stopped writing ({why}); nothing of this request was kept;                  retry: another replica takes over, or this one once its store answers"
            )),
            None => HubError::shutting_down(),
        }
    }

    /// The hub's current time.
    pub fn now_ms(&self) -> u64 {
        self.config.clock.now_ms()
    }

    /// Why the applier stopped on a store failure, if it did.
    pub fn store_failure(&self) -> Option<String> {
        self.store_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Ends every spoke session at once, without the applier (which has
    /// stopped: this replica stepped down). The streams close, so spokes
    /// redial and find the new leader; nothing is recorded, the new leader
    /// restores the sessions' state from the store.
    pub fn close_sessions(&self) {
        let mut inner = self.lock();
        for c in inner.clusters.values_mut() {
            if c.session.session().is_some() {
                c.session = SpokeState::Disconnected;
            }
        }
    }
}

/// List pages built at once: half the cores (at least one), so however
/// many clients poll the list, the other half stays for writes.
pub fn list_concurrency() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

impl Inner {
    /// Writes the id and sequence counters when this batch moved them.
    fn save_counters(&mut self, fx: &mut Effects) {
        let now = (self.next_id, self.next_event);
        if now != self.saved_counters {
            fx.put(
                COUNTERS_KEY.to_string(),
                &CountersRecord {
                    v: RECORD_VERSION,
                    next_workload_id: now.0,
                    next_event_seq: now.1,
                },
            );
            self.saved_counters = now;
        }
    }

    /// Something changed that may let a workload run or changes why one waits.
    fn changed(&mut self) {
        self.dirty = true;
        self.explain_stale = true;
    }

    fn event(
        &mut self,
        fx: &mut Effects,
        now: u64,
        kind: &str,
        workload: Option<u64>,
        cluster: Option<&str>,
        message: String,
    ) {
        let e = EventRecord {
            v: RECORD_VERSION,
            seq: self.next_event,
            at_ms: now,
            kind: kind.to_string(),
            workload,
            cluster: cluster.map(str::to_string),
            message,
            policy_revision: self.policy.revision.clone(),
            actor: self.actor.as_ref().map(|a| a.user.clone()),
            auth: self.actor.as_ref().map(|a| a.via.clone()),
        };
        self.next_event += 1;
        if self.oldest_event_at_ms == u64::MAX {
            self.oldest_event = e.seq;
            self.oldest_event_at_ms = now;
        }
        fx.put(event_key(e.seq), &e);
        self.events.push_back(Arc::new(e));
        if self.events.len() > EVENTS_IN_MEMORY {
            self.events.pop_front();
        }
    }

    /// Queues the record's write, and indexes it for retention once it is
    /// finished.
    fn save(&mut self, fx: &mut Effects, id: u64) {
        if let Some(w) = self.workloads.get(&id) {
            fx.put(workload_key(id), w);
            if w.state.is_terminal() {
                self.finished
                    .insert((w.finished_at_ms.unwrap_or(w.submitted_at_ms), id));
            }
        }
    }
}
