//! The hub's core: one applier task owns every state change. It takes a batch
//! of commands (submits, cancels, spoke messages, ticks), applies them to the
//! in-memory state, runs a scheduling cycle when something changed, commits
//! everything in ONE store transaction (one fsync for the whole batch), and
//! only then answers callers and sends assignments and stops to spokes — in
//! commit order, so a spoke never sees a stop overtaken by an older assign.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axle_policy::{MILLI_PER_GPU, Milli, Policy};
use axle_proto::api::{self, ApiError, SubmitRequest};
use axle_proto::pb;
use axle_scheduler::{
    Allocation, ClusterInventory, CycleOptions, Inventory, NodeInventory, Shard, State,
    WorkloadSpec, cycle,
};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use crate::lifecycle::{WEvent, WState, step};
use crate::records::*;
use crate::store::{MAX_OPS_PER_TXN, Op, Store, Txn};

/// Commands one applier batch takes at most: one fsync per batch, so 4,096
/// submits commit together under load while a batch still applies in a few ms.
pub const MAX_COMMANDS_PER_BATCH: usize = 4096;

/// Queue of commands waiting for the applier. Callers wait on a full queue
/// (backpressure) instead of growing memory without bound.
pub const COMMAND_QUEUE: usize = 65_536;

/// Messages queued to one spoke: a full queue means the spoke stopped
/// reading; its connection is dropped and it re-registers.
pub const SPOKE_QUEUE: usize = 16_384;

/// How often spokes heartbeat.
pub const HEARTBEAT_INTERVAL_MS: u64 = 1000;

/// Slack between a lost spoke fencing itself (no ack for `spokeLostAfter`,
/// then the grace period) and the hub re-queueing its workloads: covers the
/// last ack's trip and a missed heartbeat.
pub const FENCE_MARGIN_MS: u64 = 2 * HEARTBEAT_INTERVAL_MS;

/// Housekeeping tick: lost spokes, burst thresholds, and a cycle even when
/// nothing changed (reasons age, waits pass thresholds).
pub const TICK_MS: u64 = 1000;

/// Events kept in memory for `GET /api/v1/events`; older ones are read from the store.
pub const EVENTS_IN_MEMORY: usize = 10_000;

/// Below this many waiting workloads every cycle explains all of them (a
/// cycle over 10,000 costs a few ms).
pub const EXPLAIN_ALWAYS_BELOW: usize = 10_000;

/// With a deeper queue, pending reasons are refreshed at most this often.
pub const EXPLAIN_EVERY_MS: u64 = 1000;

/// Wall clock in milliseconds; the only clock read of the hub's logic.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// An API error with an HTTP status.
#[derive(Debug, Clone)]
pub struct HubError {
    pub status: u16,
    pub error: ApiError,
}

impl HubError {
    pub fn bad(msg: impl Into<String>, field: Option<&str>) -> HubError {
        HubError {
            status: 400,
            error: ApiError {
                error: msg.into(),
                field: field.map(str::to_string),
            },
        }
    }
    pub fn status(status: u16, msg: impl Into<String>) -> HubError {
        HubError {
            status,
            error: ApiError {
                error: msg.into(),
                field: None,
            },
        }
    }
}

pub type Reply<T> = oneshot::Sender<Result<T, HubError>>;

/// The answer to a submit: the workload, and whether this call created it
/// (false for an idempotent replay).
pub type SubmitReply = Reply<(api::WorkloadView, bool)>;

/// A spoke's outbound stream.
pub type SpokeTx = mpsc::Sender<Result<pb::HubMessage, tonic::Status>>;

pub enum Command {
    Submit(SubmitRequest, SubmitReply),
    Cancel(u64, Reply<api::WorkloadView>),
    Register {
        register: pb::Register,
        conn: u64,
        tx: SpokeTx,
        reply: oneshot::Sender<Result<(), tonic::Status>>,
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
}

#[derive(Debug, Clone)]
pub struct HubConfig {
    pub data_dir: PathBuf,
    /// Shared secret spokes must present; `None` accepts any (dev mode).
    pub spoke_token: Option<String>,
    /// How much of each run's log the hub keeps.
    pub log_limits: crate::logs::LogLimits,
}

/// A cluster the hub knows: declared in policy, registered by a spoke, or both.
struct ClusterEntry {
    region: String,
    labels: BTreeMap<String, String>,
    nodes: Vec<NodeRecord>,
    /// The live connection, if any: (connection id, sender).
    conn: Option<(u64, SpokeTx)>,
    last_seen_ms: u64,
    lost: bool,
    /// Whether a spoke ever registered (else the nodes are only declared).
    registered: bool,
    /// Running workloads the spoke did not list when it registered; if the
    /// next heartbeat does not list them either, they are gone.
    unconfirmed: BTreeSet<u64>,
    /// How its spoke runs work: `local`, `kubernetes` (empty: never said).
    driver: String,
    /// The spoke's image for workloads that name none.
    default_image: Option<String>,
}

impl ClusterEntry {
    /// A cluster that runs container images (Kubernetes Jobs).
    fn runs_images(&self) -> bool {
        self.driver == "kubernetes"
    }
}

pub struct Inner {
    pub policy: Arc<Policy>,
    state: State,
    clusters: BTreeMap<String, ClusterEntry>,
    pub workloads: BTreeMap<u64, WorkloadRecord>,
    pub reasons: BTreeMap<u64, axle_scheduler::PendingReason>,
    idem: BTreeMap<(String, String), u64>,
    next_id: u64,
    next_event: u64,
    pub events: std::collections::VecDeque<EventRecord>,
    burst_noted: BTreeSet<u64>,
    started_ms: u64,
    /// Something changed that may let a workload run: run a cycle.
    dirty: bool,
    /// Something changed since the last cycle that explained every waiting workload.
    explain_stale: bool,
    last_explain_ms: u64,
}

pub struct Hub {
    inner: Mutex<Inner>,
    store: Arc<dyn Store>,
    tx: mpsc::Sender<Command>,
    pub config: HubConfig,
}

/// What one batch produced besides memory changes.
#[derive(Default)]
struct Effects {
    ops: Vec<Op>,
    msgs: Vec<(String, pb::HubMessage)>,
    after: Vec<Box<dyn FnOnce() + Send>>,
    /// Accepted submits, answered after the cycle: (id, newly created, reply).
    submitted: Vec<(u64, bool, SubmitReply)>,
}

impl Effects {
    fn put<T: serde::Serialize>(&mut self, key: String, value: &T) {
        match serde_json::to_vec(value) {
            Ok(v) => self.ops.push(Op::Put {
                key,
                value: v,
                lease: None,
            }),
            Err(e) => error!("cannot encode record {key}: {e}"),
        }
    }
}

/// The hub's own tasks. Neither ends while the hub runs: [`HubTasks::failed`]
/// resolves when one does (a panic), with why, so the process can exit
/// instead of answering 503 forever.
pub struct HubTasks {
    applier: tokio::task::JoinHandle<()>,
    ticker: tokio::task::JoinHandle<()>,
}

impl HubTasks {
    /// Waits until a task ends; the message names it and says why.
    pub async fn failed(&mut self) -> String {
        let (name, r) = tokio::select! {
            r = &mut self.applier => ("applier", r),
            r = &mut self.ticker => ("ticker", r),
        };
        match r {
            Ok(()) => format!("the hub's {name} task stopped"),
            Err(e) if e.is_panic() => {
                let p = e.into_panic();
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic".into());
                format!("the hub's {name} task panicked: {msg}")
            }
            Err(e) => format!("the hub's {name} task was cancelled: {e}"),
        }
    }
}

impl Hub {
    /// Loads the hub's state from the store and starts the applier task.
    pub async fn start(
        store: Arc<dyn Store>,
        policy: Policy,
        config: HubConfig,
    ) -> anyhow::Result<(Arc<Hub>, HubTasks)> {
        let now = now_ms();
        let policy = Arc::new(policy);
        let mut workloads = BTreeMap::new();
        for kv in store.range(WORKLOADS)? {
            let w: WorkloadRecord = serde_json::from_slice(&kv.value)
                .map_err(|e| anyhow::anyhow!("corrupt record {}: {e}", kv.key))?;
            workloads.insert(w.id, w);
        }
        let mut clusters = BTreeMap::new();
        for kv in store.range(CLUSTERS)? {
            let c: ClusterRecord = serde_json::from_slice(&kv.value)
                .map_err(|e| anyhow::anyhow!("corrupt record {}: {e}", kv.key))?;
            clusters.insert(
                c.name.clone(),
                ClusterEntry {
                    region: c.region,
                    labels: c.labels,
                    nodes: c.nodes,
                    conn: None,
                    last_seen_ms: now,
                    lost: false,
                    registered: true,
                    unconfirmed: BTreeSet::new(),
                    driver: c.driver,
                    default_image: c.default_image,
                },
            );
        }
        add_declared_clusters(&policy, &mut clusters);
        let mut events = std::collections::VecDeque::new();
        let mut next_event = 1;
        for kv in store.range(EVENTS)? {
            if let Ok(e) = serde_json::from_slice::<EventRecord>(&kv.value) {
                next_event = next_event.max(e.seq + 1);
                events.push_back(e);
                if events.len() > EVENTS_IN_MEMORY {
                    events.pop_front();
                }
            }
        }
        let next_id = workloads.keys().next_back().map(|id| id + 1).unwrap_or(1);
        let idem = workloads
            .values()
            .filter_map(|w| {
                w.idempotency_key
                    .as_ref()
                    .map(|k| ((w.team.clone(), k.clone()), w.id))
            })
            .collect();
        let state = State::new(policy.clone(), &Inventory::default());
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let hub = Arc::new(Hub {
            inner: Mutex::new(Inner {
                policy,
                state,
                clusters,
                workloads,
                reasons: BTreeMap::new(),
                idem,
                next_id,
                next_event,
                events,
                burst_noted: BTreeSet::new(),
                started_ms: now,
                dirty: true,
                explain_stale: true,
                last_explain_ms: 0,
            }),
            store,
            tx,
            config,
        });
        {
            let mut fx = Effects::default();
            {
                let mut inner = hub.lock();
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
            }
            hub.commit(fx).await;
        }
        let h = hub.clone();
        let applier = tokio::spawn(async move { h.applier(rx).await });
        // The ticker holds only a sender, so it never keeps the hub alive.
        let tick_tx = hub.tx.clone();
        let ticker = tokio::spawn(async move {
            let mut t = tokio::time::interval(Duration::from_millis(TICK_MS));
            loop {
                t.tick().await;
                if tick_tx.send(Command::Tick).await.is_err() {
                    break;
                }
            }
        });
        Ok((hub, HubTasks { applier, ticker }))
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock means a panic in the applier: the hub cannot go on.
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Events after `since` (oldest first), from memory, or from the store
    /// when they are older than the in-memory window.
    pub fn events_since(
        &self,
        since: u64,
        limit: usize,
        workload: Option<u64>,
    ) -> Result<Vec<EventRecord>, HubError> {
        let keep =
            |e: &EventRecord| e.seq > since && workload.is_none_or(|w| e.workload == Some(w));
        {
            let inner = self.lock();
            let in_memory = inner
                .events
                .front()
                .is_none_or(|first| first.seq <= since + 1);
            if in_memory {
                return Ok(inner
                    .events
                    .iter()
                    .filter(|e| keep(e))
                    .take(limit)
                    .cloned()
                    .collect());
            }
        }
        let all = self
            .store
            .range(EVENTS)
            .map_err(|e| HubError::status(500, format!("cannot read events: {e}")))?;
        Ok(all
            .iter()
            .filter_map(|kv| serde_json::from_slice::<EventRecord>(&kv.value).ok())
            .filter(|e| keep(e))
            .take(limit)
            .collect())
    }

    pub async fn send(&self, cmd: Command) -> Result<(), HubError> {
        self.tx
            .send(cmd)
            .await
            .map_err(|_| HubError::status(503, "hub is shutting down"))
    }

    async fn commit(&self, fx: Effects) {
        if !fx.ops.is_empty() {
            // Each record is self-contained, so the batch may span several
            // store txns; they go in one group commit.
            let mut txns = Vec::with_capacity(fx.ops.len() / MAX_OPS_PER_TXN + 1);
            let mut ops = fx.ops.into_iter().peekable();
            while ops.peek().is_some() {
                txns.push(Txn {
                    compares: Vec::new(),
                    success: ops.by_ref().take(MAX_OPS_PER_TXN).collect(),
                    failure: Vec::new(),
                });
            }
            let results = self.store.txn_many(txns).await;
            if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
                // Memory is ahead of disk and callers were promised
                // durability: the only safe move is to stop and restart from the store.
                error!("store commit failed: {e}; exiting so the hub restarts from its store");
                std::process::exit(70);
            }
        }
        // Send in commit order.
        let conns: BTreeMap<String, SpokeTx> = {
            let inner = self.lock();
            inner
                .clusters
                .iter()
                .filter_map(|(n, c)| c.conn.as_ref().map(|(_, tx)| (n.clone(), tx.clone())))
                .collect()
        };
        for (cluster, msg) in fx.msgs {
            if let Some(tx) = conns.get(&cluster)
                && tx.try_send(Ok(msg)).is_err()
            {
                warn!("spoke {cluster} is not reading its stream; it will re-register");
            }
        }
        for f in fx.after {
            f();
        }
    }

    async fn applier(self: Arc<Self>, mut rx: mpsc::Receiver<Command>) {
        let mut batch = Vec::with_capacity(MAX_COMMANDS_PER_BATCH);
        while rx.recv_many(&mut batch, MAX_COMMANDS_PER_BATCH).await > 0 {
            let now = now_ms();
            let mut fx = Effects::default();
            {
                let mut inner = self.lock();
                for cmd in batch.drain(..) {
                    inner.apply(&self.config, cmd, &mut fx, now);
                }
                if inner.dirty {
                    inner.dirty = false;
                    inner.schedule(&mut fx, now);
                }
                for (id, created, reply) in std::mem::take(&mut fx.submitted) {
                    let res = inner
                        .view(id)
                        .map(|v| (v, created))
                        .ok_or_else(|| HubError::status(500, format!("workload {id} vanished")));
                    fx.after.push(Box::new(move || {
                        let _ = reply.send(res);
                    }));
                }
            }
            self.commit(fx).await;
        }
    }
}

/// Adds every cluster the policy declares and no spoke has registered yet,
/// with the capacity [`axle_scheduler::inventory::declared`] expands it to
/// (the same nodes the simulator plans on).
fn add_declared_clusters(policy: &Policy, clusters: &mut BTreeMap<String, ClusterEntry>) {
    for c in axle_scheduler::inventory::declared(policy).clusters {
        if clusters.contains_key(&c.name) {
            continue;
        }
        let nodes = c
            .nodes
            .iter()
            .map(|n| NodeRecord {
                name: n.name.clone(),
                gpus: (0..n.gpu_count)
                    .map(|index| GpuRecord {
                        index,
                        model: n.gpu_model.clone(),
                        memory_mb: n.gpu_memory_mb,
                        fractions_only: n.fractions_only,
                    })
                    .collect(),
            })
            .collect();
        let labels = policy
            .clusters
            .get(&c.name)
            .map(|p| p.labels.clone())
            .unwrap_or_default();
        clusters.insert(
            c.name,
            ClusterEntry {
                region: c.region,
                labels,
                nodes,
                conn: None,
                last_seen_ms: 0,
                lost: false,
                registered: false,
                unconfirmed: BTreeSet::new(),
                driver: String::new(),
                default_image: None,
            },
        );
    }
}

fn spec_of(w: &WorkloadRecord) -> WorkloadSpec {
    WorkloadSpec {
        id: w.id,
        team: w.team.clone(),
        priority_class: w.priority.clone(),
        gpus_per_replica: Milli(w.gpus_milli),
        replicas: w.replicas,
        gpu_model: w.gpu_model.clone(),
        regions: w.regions.clone(),
        allow_spread: w.allow_spread,
        burst_allowed: w.burst_allowed,
        submit_time_ms: w.submitted_at_ms,
        checkpoint_interval_s: w.checkpoint_interval_s,
        max_runtime_s: w.max_runtime_s,
        has_image: w.image.is_some(),
    }
}

fn transition(w: &mut WorkloadRecord, event: WEvent, now: u64, reason: String) -> bool {
    match step(w.state, event) {
        Ok(to) => {
            w.history.push(TransitionRecord {
                at_ms: now,
                from: w.state,
                to,
                reason,
            });
            if w.history.len() > MAX_HISTORY {
                w.history.remove(0);
            }
            w.state = to;
            true
        }
        Err(e) => {
            warn!("workload {}: {e}", w.id);
            false
        }
    }
}

fn grace_of(policy: &Policy, class: &str) -> u64 {
    policy
        .priority_classes
        .get(class)
        .map(|c| c.grace_period_s)
        .unwrap_or(30)
}

fn stop_msg(
    id: u64,
    epoch: u64,
    reason: pb::StopReason,
    grace: u64,
    message: String,
) -> pb::HubMessage {
    pb::HubMessage {
        msg: Some(pb::hub_message::Msg::Stop(pb::Stop {
            workload_id: id,
            epoch,
            reason: reason as i32,
            grace_period_s: grace,
            message,
        })),
    }
}

impl Inner {
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
        };
        self.next_event += 1;
        fx.put(event_key(e.seq), &e);
        self.events.push_back(e);
        if self.events.len() > EVENTS_IN_MEMORY {
            self.events.pop_front();
        }
    }

    /// Sends (or re-sends) the stop a `stopping` record stands for, to its
    /// cluster, with the grace period of the workload's class.
    fn request_stop(&self, fx: &mut Effects, id: u64, s: &StoppingRecord, message: String) {
        let grace = self
            .workloads
            .get(&id)
            .map(|w| grace_of(&self.policy, &w.priority))
            .unwrap_or(30);
        let reason = if s.cancel {
            pb::StopReason::Cancelled
        } else {
            pb::StopReason::Preempted
        };
        fx.msgs.push((
            s.cluster.clone(),
            stop_msg(id, s.epoch, reason, grace, message),
        ));
    }

    fn save(&self, fx: &mut Effects, id: u64) {
        if let Some(w) = self.workloads.get(&id) {
            fx.put(workload_key(id), w);
        }
    }

    fn inventory(&self) -> Inventory {
        Inventory {
            clusters: self
                .clusters
                .iter()
                .map(|(name, c)| ClusterInventory {
                    name: name.clone(),
                    region: c.region.clone(),
                    schedulable: c.conn.is_some() && !c.lost,
                    // Jobs need an image: without a default, image-less
                    // workloads go elsewhere.
                    needs_image: c.runs_images()
                        && c.default_image.is_none()
                        && self
                            .policy
                            .clusters
                            .get(name)
                            .is_none_or(|p| p.default_image.is_none()),
                    nodes: c
                        .nodes
                        .iter()
                        .flat_map(|n| {
                            // One inventory node per GPU model on the node.
                            let mut by_model: BTreeMap<&str, (u32, u64, bool)> = BTreeMap::new();
                            for g in &n.gpus {
                                let e = by_model.entry(&g.model).or_insert((0, g.memory_mb, false));
                                e.0 = e.0.max(g.index + 1);
                                e.2 |= g.fractions_only;
                            }
                            by_model
                                .into_iter()
                                .map(|(m, (count, mem, fractions_only))| NodeInventory {
                                    name: n.name.clone(),
                                    gpu_model: m.to_string(),
                                    gpu_count: count,
                                    gpu_memory_mb: mem,
                                    fractions_only,
                                })
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// Maps a stored placement onto the current inventory's indices.
    fn allocation_of(&self, inv: &Inventory, p: &PlacementRecord) -> Option<Allocation> {
        let ci = inv.clusters.iter().position(|c| c.name == p.cluster)?;
        let c = &inv.clusters[ci];
        let replicas = p
            .replicas
            .iter()
            .map(|r| {
                r.shards
                    .iter()
                    .map(|(node, gpu, milli)| {
                        let ni = c.nodes.iter().position(|n| &n.name == node)?;
                        Some(Shard {
                            node: ni as u32,
                            gpu: *gpu,
                            milli: Milli(u64::from(*milli)),
                        })
                    })
                    .collect::<Option<Vec<Shard>>>()
            })
            .collect::<Option<Vec<Vec<Shard>>>>()?;
        Some(Allocation {
            cluster: ci as u32,
            replicas,
        })
    }

    /// Rebuilds the scheduler state from the records (after start, or when
    /// inventory or policy changes).
    fn rebuild(&mut self, fx: &mut Effects, now: u64) {
        let inv = self.inventory();
        let mut state = State::new(self.policy.clone(), &inv);
        let ids: Vec<u64> = self.workloads.keys().copied().collect();
        for id in ids {
            let w = &self.workloads[&id];
            if w.state.holds_gpus() {
                let alloc = w
                    .placement
                    .as_ref()
                    .and_then(|p| self.allocation_of(&inv, p));
                let started = w.started_at_ms.unwrap_or(w.submitted_at_ms);
                let res = match alloc {
                    Some(a) => state
                        .start(Arc::new(spec_of(w)), a, started)
                        .map_err(|e| e.to_string()),
                    None => Err("its placement no longer exists".to_string()),
                };
                if let Err(e) = res {
                    let w = self.workloads.get_mut(&id).expect("listed id");
                    warn!("workload {id}: cannot restore placement: {e}; re-queueing");
                    transition(w, WEvent::Requeue, now, format!("re-queued: {e}"));
                    w.placement = None;
                    let _ = state.submit(spec_of(w));
                    self.save(fx, id);
                }
            } else if w.state == WState::Pending
                && w.stopping.is_none()
                && let Err(e) = state.submit(spec_of(w))
            {
                let w = self.workloads.get_mut(&id).expect("listed id");
                let msg = format!("no longer valid under policy {}: {e}", self.policy.revision);
                transition(w, WEvent::Cancel, now, msg.clone());
                w.finished_at_ms = Some(now);
                self.save(fx, id);
                self.event(fx, now, "cancelled", Some(id), None, msg);
            }
        }
        self.state = state;
        self.changed();
    }

    fn apply(&mut self, cfg: &HubConfig, cmd: Command, fx: &mut Effects, now: u64) {
        match cmd {
            Command::Submit(req, reply) => match self.submit(req, fx, now) {
                // The view is taken after this batch's cycle, so the answer
                // already says where the workload went or why it waits.
                Ok((id, created)) => fx.submitted.push((id, created, reply)),
                Err(e) => fx.after.push(Box::new(move || {
                    let _ = reply.send(Err(e));
                })),
            },
            Command::Cancel(id, reply) => {
                let res = self.cancel(id, fx, now);
                fx.after.push(Box::new(move || {
                    let _ = reply.send(res);
                }));
            }
            Command::Register {
                register,
                conn,
                tx,
                reply,
            } => {
                // Answered after the batch's commit, like every other
                // command: the session opens only once its registration
                // is durable.
                let res = self.register(cfg, register, conn, tx, fx, now);
                fx.after.push(Box::new(move || {
                    let _ = reply.send(res);
                }));
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
                if let Some(c) = self.clusters.get_mut(&cluster)
                    && c.conn.as_ref().is_some_and(|(id, _)| *id == conn)
                {
                    // Keep it schedulable until it is silent past the lost
                    // timeout: a hub-side stream error is often a blip.
                    c.conn = None;
                    info!("spoke {cluster} disconnected");
                    self.event(
                        fx,
                        now,
                        "spoke_disconnected",
                        None,
                        Some(&cluster),
                        format!("spoke {cluster} disconnected"),
                    );
                    self.rebuild(fx, now);
                }
            }
            Command::Tick => self.tick(fx, now),
        }
    }

    fn is_current(&self, cluster: &str, conn: u64) -> bool {
        self.clusters
            .get(cluster)
            .is_some_and(|c| c.conn.as_ref().is_some_and(|(id, _)| *id == conn))
    }

    /// The checkpoint settings of a new workload: its priority class's,
    /// overridden by the request. Err on an interval of 0 or a signal a
    /// workload cannot catch.
    fn checkpoint_of(
        &self,
        req: &SubmitRequest,
        priority: &str,
    ) -> Result<(Option<u64>, Option<String>), HubError> {
        let class = self.policy.priority_classes.get(priority);
        let checkpointable = req
            .checkpointable
            .unwrap_or_else(|| class.is_some_and(|c| c.checkpointable));
        if req.checkpoint_interval_s == Some(0) {
            return Err(HubError::bad(
                "checkpoint_interval_s must be at least 1 second",
                Some("checkpoint_interval_s"),
            ));
        }
        if let Some(sig) = &req.checkpoint_signal
            && !axle_policy::CHECKPOINT_SIGNALS.contains(&sig.as_str())
        {
            return Err(HubError::bad(
                format!(
                    "checkpoint_signal {sig:?} cannot ask a workload to save; use one of {}",
                    axle_policy::CHECKPOINT_SIGNALS.join(", ")
                ),
                Some("checkpoint_signal"),
            ));
        }
        if !checkpointable {
            return Ok((None, None));
        }
        let interval = req.checkpoint_interval_s.unwrap_or_else(|| {
            class.map_or(axle_policy::DEFAULT_CHECKPOINT_INTERVAL_S, |c| {
                c.checkpoint_interval_s
            })
        });
        let signal = req.checkpoint_signal.clone().unwrap_or_else(|| {
            class.map_or_else(|| "SIGTERM".to_string(), |c| c.checkpoint_signal.clone())
        });
        Ok((Some(interval), Some(signal)))
    }

    fn submit(
        &mut self,
        req: SubmitRequest,
        fx: &mut Effects,
        now: u64,
    ) -> Result<(u64, bool), HubError> {
        if let Err(e) = crate::request_limits::check(&req) {
            return Err(HubError::bad(e.message, Some(&e.field)));
        }
        if let Some(key) = &req.idempotency_key
            && let Some(&id) = self.idem.get(&(req.team.clone(), key.clone()))
        {
            return Ok((id, false));
        }
        if req.command.is_empty() || req.command[0].trim().is_empty() {
            return Err(HubError::bad(
                "command must name a program to run",
                Some("command"),
            ));
        }
        if !req.gpus.is_finite() || req.gpus <= 0.0 {
            return Err(HubError::bad(
                format!(
                    "gpus must be a positive number (got {}); e.g. 0.25, 1 or 8",
                    req.gpus
                ),
                Some("gpus"),
            ));
        }
        let Some(gpus) = Milli::from_gpus_f64(req.gpus) else {
            return Err(HubError::bad(
                format!(
                    "gpus {} is not a valid GPU amount; use e.g. 0.25, 0.5 or a whole number",
                    req.gpus
                ),
                Some("gpus"),
            ));
        };
        let gang = req.gang.unwrap_or(1);
        if gang == 0 {
            return Err(HubError::bad("gang must be at least 1", Some("gang")));
        }
        let priority = req
            .priority
            .clone()
            .unwrap_or_else(|| self.policy.settings.default_priority_class.clone());
        let id = self.next_id;
        let (checkpoint_interval_s, checkpoint_signal) = self.checkpoint_of(&req, &priority)?;
        let w = WorkloadRecord {
            v: RECORD_VERSION,
            id,
            name: req
                .name
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("w-{id}")),
            team: req.team.clone(),
            priority,
            gpus_milli: gpus.0,
            replicas: gang,
            gpu_model: req.gpu_model.clone().filter(|m| !m.is_empty()),
            regions: req.regions.clone(),
            allow_spread: req.allow_spread,
            burst_allowed: req.burst_allowed,
            command: req.command.clone(),
            env: req.env.clone(),
            max_runtime_s: req.max_runtime_s.filter(|&s| s > 0),
            image: req.image.clone().filter(|i| !i.trim().is_empty()),
            checkpoint_interval_s,
            checkpoint_signal,
            idempotency_key: req.idempotency_key.clone(),
            submitted_at_ms: now,
            state: WState::Pending,
            epoch: 0,
            placement: None,
            started_at_ms: None,
            finished_at_ms: None,
            exit_code: None,
            preemptions: 0,
            stopping: None,
            history: Vec::new(),
            preemption_log: Vec::new(),
            lost_gpu_ms: 0,
        };
        let spec = spec_of(&w);
        if let Err(e) = self.state.submit(spec) {
            use axle_scheduler::RequestError as R;
            let field = match &e {
                R::UnknownTeam { .. } => Some("team"),
                R::UnknownPriorityClass { .. } => Some("priority"),
                R::ZeroGpus
                | R::BadFraction { .. }
                | R::NotWhole(_)
                | R::NeverFitsNode { .. }
                | R::AboveLimit { .. }
                | R::AboveGuarantee { .. } => Some("gpus"),
                R::ZeroReplicas | R::GangTooLarge { .. } => Some("gang"),
                R::UnknownGpuModel { .. } | R::NoQuota { .. } => Some("gpu_model"),
                R::UnknownRegion { .. } => Some("regions"),
                _ => None,
            };
            return Err(HubError::bad(e.to_string(), field));
        }
        self.next_id += 1;
        if let Some(key) = &w.idempotency_key {
            self.idem.insert((w.team.clone(), key.clone()), id);
        }
        let msg = format!(
            "{} submitted by team {}: {} GPU{} ({})",
            w.name,
            w.team,
            gpus,
            if gang > 1 {
                format!(" × {gang}")
            } else {
                String::new()
            },
            w.priority
        );
        self.workloads.insert(id, w);
        self.save(fx, id);
        self.event(fx, now, "submitted", Some(id), None, msg);
        self.changed();
        Ok((id, true))
    }

    fn cancel(
        &mut self,
        id: u64,
        fx: &mut Effects,
        now: u64,
    ) -> Result<api::WorkloadView, HubError> {
        let Some(w) = self.workloads.get_mut(&id) else {
            return Err(HubError::status(404, format!("workload {id} not found")));
        };
        if w.state.is_terminal() {
            return Err(HubError::status(
                409,
                format!("workload {id} already finished ({})", w.state.as_str()),
            ));
        }
        if let Some(s) = &mut w.stopping {
            // Already stopping (preempted): cancel once the stop is confirmed.
            s.cancel = true;
        } else if w.state.holds_gpus() {
            let p = w
                .placement
                .as_ref()
                .expect("placed workloads have a placement");
            let stopping = StoppingRecord {
                cluster: p.cluster.clone(),
                epoch: w.epoch,
                cancel: true,
            };
            w.stopping = Some(stopping.clone());
            self.request_stop(fx, id, &stopping, "cancelled by user".into());
        } else {
            transition(w, WEvent::Cancel, now, "cancelled by user".into());
            w.finished_at_ms = Some(now);
            self.state.remove(id);
            self.reasons.remove(&id);
        }
        self.save(fx, id);
        self.event(
            fx,
            now,
            "cancel_requested",
            Some(id),
            None,
            format!("workload {id} cancelled by user"),
        );
        self.view(id).ok_or_else(|| HubError::status(500, "lost"))
    }

    fn register(
        &mut self,
        cfg: &HubConfig,
        r: pb::Register,
        conn: u64,
        tx: SpokeTx,
        fx: &mut Effects,
        now: u64,
    ) -> Result<(), tonic::Status> {
        if let Some(token) = &cfg.spoke_token
            && r.token != *token
        {
            warn!("spoke for cluster {:?} presented a wrong token", r.cluster);
            return Err(tonic::Status::unauthenticated(
                "wrong or missing spoke token; start the spoke with --token (or AXLE_SPOKE_TOKEN) set to the hub's --spoke-token",
            ));
        }
        if r.cluster.is_empty() {
            return Err(tonic::Status::invalid_argument(
                "register: cluster name is empty",
            ));
        }
        if !self.policy.clusters.is_empty() && !self.policy.clusters.contains_key(&r.cluster) {
            return Err(tonic::Status::permission_denied(format!(
                "cluster {:?} is not declared in the policy (known: {}); add a Cluster document first",
                r.cluster,
                self.policy
                    .clusters
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let mut nodes = Vec::new();
        for n in &r.nodes {
            if n.name.is_empty() || n.gpus.is_empty() {
                return Err(tonic::Status::invalid_argument(format!(
                    "register: node {:?} has no name or no GPUs",
                    n.name
                )));
            }
            nodes.push(NodeRecord {
                name: n.name.clone(),
                gpus: n
                    .gpus
                    .iter()
                    .map(|g| GpuRecord {
                        index: g.index,
                        model: g.model.clone(),
                        memory_mb: g.memory_mb,
                        fractions_only: g.fractions_only,
                    })
                    .collect(),
            });
        }
        let record = ClusterRecord {
            v: RECORD_VERSION,
            name: r.cluster.clone(),
            region: if r.region.is_empty() {
                self.policy
                    .clusters
                    .get(&r.cluster)
                    .map(|c| c.region.clone())
                    .unwrap_or_default()
            } else {
                r.region.clone()
            },
            labels: r.labels.clone().into_iter().collect(),
            nodes,
            driver: r.driver.clone(),
            default_image: Some(r.default_image.clone()).filter(|i| !i.is_empty()),
        };
        fx.put(cluster_key(&r.cluster), &record);
        let entry = self
            .clusters
            .entry(r.cluster.clone())
            .or_insert_with(|| ClusterEntry {
                region: String::new(),
                labels: BTreeMap::new(),
                nodes: Vec::new(),
                conn: None,
                last_seen_ms: now,
                lost: false,
                registered: true,
                unconfirmed: BTreeSet::new(),
                driver: String::new(),
                default_image: None,
            });
        entry.driver = record.driver.clone();
        entry.default_image = record.default_image.clone();
        entry.region = record.region.clone();
        entry.labels = record.labels.clone();
        entry.nodes = record.nodes.clone();
        entry.conn = Some((conn, tx.clone()));
        entry.last_seen_ms = now;
        entry.lost = false;
        entry.registered = true;
        entry.unconfirmed.clear();
        let gpus: usize = record.nodes.iter().map(|n| n.gpus.len()).sum();
        info!(
            "spoke {} registered: {} nodes, {gpus} GPUs",
            r.cluster,
            record.nodes.len()
        );
        self.event(
            fx,
            now,
            "spoke_registered",
            None,
            Some(&r.cluster),
            format!(
                "spoke {} registered with {} nodes, {gpus} GPUs",
                r.cluster,
                record.nodes.len()
            ),
        );
        let _ = tx.try_send(Ok(pb::HubMessage {
            msg: Some(pb::hub_message::Msg::Registered(pb::Registered {
                cluster: r.cluster.clone(),
                heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS,
                fence_after_ms: self.policy.settings.spoke_lost_after_s * 1000,
                teams: crate::isolation::teams_for(&self.policy, &record.nodes),
                priority_classes: crate::isolation::priority_classes(&self.policy),
            })),
        }));
        self.rebuild(fx, now);
        self.reconcile_running(&r.cluster, &r.running, true, fx, now);
        Ok(())
    }

    /// Compares what a spoke runs with what the hub assigned to it.
    fn reconcile_running(
        &mut self,
        cluster: &str,
        running: &[pb::RunningWorkload],
        registering: bool,
        fx: &mut Effects,
        now: u64,
    ) {
        let reported: BTreeMap<u64, u64> =
            running.iter().map(|r| (r.workload_id, r.epoch)).collect();
        for (&id, &epoch) in &reported {
            let current = self.workloads.get(&id).is_some_and(|w| {
                w.epoch == epoch
                    && w.state.holds_gpus()
                    && w.placement.as_ref().is_some_and(|p| p.cluster == cluster)
            });
            let stopping = self.workloads.get(&id).and_then(|w| w.stopping.clone());
            if current {
                let w = self.workloads.get_mut(&id).expect("checked");
                if w.state == WState::Placed {
                    transition(
                        w,
                        WEvent::Started,
                        now,
                        format!("adopted: running on {cluster}"),
                    );
                    w.started_at_ms.get_or_insert(now);
                    self.save(fx, id);
                }
                if let Some(s) = stopping
                    && s.epoch == epoch
                {
                    // Re-send the stop that may have been lost.
                    self.request_stop(fx, id, &s, "stop".into());
                }
            } else if let Some(s) = stopping.filter(|s| s.epoch == epoch && s.cluster == cluster) {
                self.request_stop(fx, id, &s, "stop".into());
            } else {
                // Fencing: the spoke runs an epoch the hub no longer wants.
                warn!(
                    "spoke {cluster} runs workload {id} epoch {epoch}, which is stale; stopping it"
                );
                fx.msgs.push((
                    cluster.to_string(),
                    stop_msg(
                        id,
                        epoch,
                        pb::StopReason::Stale,
                        0,
                        "stale epoch: the workload was re-queued or finished".into(),
                    ),
                ));
                self.event(
                    fx,
                    now,
                    "fenced",
                    Some(id),
                    Some(cluster),
                    format!(
                        "stale copy of workload {id} (epoch {epoch}) on {cluster} told to stop"
                    ),
                );
            }
        }
        // Assigned here but not reported.
        let ids: Vec<u64> = self
            .workloads
            .values()
            .filter(|w| {
                w.state.holds_gpus() && w.placement.as_ref().is_some_and(|p| p.cluster == cluster)
            })
            .map(|w| w.id)
            .filter(|id| !reported.contains_key(id))
            .collect();
        for id in ids {
            let w = &self.workloads[&id];
            if w.stopping.is_some() {
                // It was being stopped and is gone: the stop is done.
                let epoch = w.epoch;
                self.stopped(cluster, id, epoch, fx, now);
            } else if w.state == WState::Placed {
                let msg = self.assign_msg(id);
                fx.msgs.push((cluster.to_string(), msg));
            } else if registering {
                if let Some(c) = self.clusters.get_mut(cluster) {
                    c.unconfirmed.insert(id);
                }
            } else {
                self.requeue(
                    fx,
                    now,
                    id,
                    cluster,
                    &format!("spoke {cluster} no longer runs it"),
                );
            }
        }
    }

    fn heartbeat(
        &mut self,
        cluster: &str,
        conn: u64,
        hb: pb::Heartbeat,
        fx: &mut Effects,
        now: u64,
    ) {
        if !self.is_current(cluster, conn) {
            return;
        }
        let was_lost = {
            let c = self.clusters.get_mut(cluster).expect("current");
            c.last_seen_ms = now;
            std::mem::replace(&mut c.lost, false)
        };
        // The spoke fences itself when these stop coming.
        fx.msgs.push((
            cluster.to_string(),
            pb::HubMessage {
                msg: Some(pb::hub_message::Msg::HeartbeatAck(pb::HeartbeatAck {})),
            },
        ));
        if was_lost {
            self.rebuild(fx, now);
        }
        let unconfirmed =
            std::mem::take(&mut self.clusters.get_mut(cluster).expect("current").unconfirmed);
        if !unconfirmed.is_empty() {
            let reported: BTreeSet<u64> = hb.running.iter().map(|r| r.workload_id).collect();
            for id in unconfirmed {
                if reported.contains(&id) {
                    continue;
                }
                let Some(w) = self.workloads.get(&id) else {
                    continue;
                };
                if w.state == WState::Running
                    && w.placement.as_ref().is_some_and(|p| p.cluster == cluster)
                {
                    self.requeue(
                        fx,
                        now,
                        id,
                        cluster,
                        &format!("spoke {cluster} restarted without it"),
                    );
                }
            }
        }
    }

    fn status(&mut self, cluster: &str, s: pb::WorkloadStatus, fx: &mut Effects, now: u64) {
        let id = s.workload_id;
        let phase = pb::Phase::try_from(s.phase).unwrap_or(pb::Phase::Unspecified);
        let Some(w) = self.workloads.get(&id) else {
            fx.msgs.push((
                cluster.to_string(),
                stop_msg(
                    id,
                    s.epoch,
                    pb::StopReason::Stale,
                    0,
                    "unknown workload".into(),
                ),
            ));
            return;
        };
        let on_here = w.placement.as_ref().is_some_and(|p| p.cluster == cluster);
        let current = w.epoch == s.epoch && w.state.holds_gpus() && on_here;
        let stopping_here = w
            .stopping
            .as_ref()
            .is_some_and(|st| st.epoch == s.epoch && st.cluster == cluster);
        match phase {
            pb::Phase::Started => {
                if current && w.state == WState::Placed {
                    let w = self.workloads.get_mut(&id).expect("exists");
                    transition(w, WEvent::Started, now, format!("started on {cluster}"));
                    w.started_at_ms = Some(now);
                    self.save(fx, id);
                    self.event(
                        fx,
                        now,
                        "started",
                        Some(id),
                        Some(cluster),
                        format!("workload {id} started on {cluster}"),
                    );
                } else if !current && !stopping_here {
                    fx.msgs.push((
                        cluster.to_string(),
                        stop_msg(id, s.epoch, pb::StopReason::Stale, 0, "stale epoch".into()),
                    ));
                }
            }
            pb::Phase::Succeeded | pb::Phase::Failed => {
                if stopping_here && phase == pb::Phase::Succeeded {
                    // It finished on its own before the stop reached it: the
                    // work is done, so it is not re-queued (nor cancelled).
                    let w = self.workloads.get_mut(&id).expect("exists");
                    w.stopping = None;
                    transition(
                        w,
                        WEvent::Succeeded,
                        now,
                        "exited 0 before its stop took effect".into(),
                    );
                    w.finished_at_ms = Some(now);
                    w.exit_code = Some(0);
                    self.state.remove(id);
                    self.save(fx, id);
                    self.event(
                        fx,
                        now,
                        "succeeded",
                        Some(id),
                        Some(cluster),
                        format!("workload {id} exited 0 before its stop took effect"),
                    );
                    self.changed();
                } else if stopping_here && !current {
                    self.stopped(cluster, id, s.epoch, fx, now);
                } else if current {
                    let ok = phase == pb::Phase::Succeeded;
                    let w = self.workloads.get_mut(&id).expect("exists");
                    let reason = if ok {
                        "exited 0".to_string()
                    } else {
                        format!(
                            "failed: exit code {}{}",
                            s.exit_code,
                            if s.message.is_empty() {
                                String::new()
                            } else {
                                format!(" ({})", s.message)
                            }
                        )
                    };
                    transition(
                        w,
                        if ok {
                            WEvent::Succeeded
                        } else {
                            WEvent::Failed
                        },
                        now,
                        reason.clone(),
                    );
                    w.finished_at_ms = Some(now);
                    w.exit_code = Some(s.exit_code);
                    w.stopping = None;
                    self.state.remove(id);
                    self.save(fx, id);
                    self.event(
                        fx,
                        now,
                        if ok { "succeeded" } else { "failed" },
                        Some(id),
                        Some(cluster),
                        format!("workload {id} {reason}"),
                    );
                    self.changed();
                }
            }
            pb::Phase::Stopped => {
                if stopping_here {
                    self.stopped(cluster, id, s.epoch, fx, now);
                } else if current {
                    // Stopped without being asked (the spoke shut down): re-queue.
                    self.requeue(
                        fx,
                        now,
                        id,
                        cluster,
                        &format!("stopped on {cluster}: {}", s.message),
                    );
                }
            }
            pb::Phase::Unspecified => {}
        }
    }

    /// Puts a placed or running workload back in the queue (its spoke no
    /// longer runs it), with its original submit time.
    fn requeue(&mut self, fx: &mut Effects, now: u64, id: u64, cluster: &str, why: &str) {
        let Some(w) = self.workloads.get_mut(&id) else {
            return;
        };
        if !transition(w, WEvent::Requeue, now, format!("re-queued: {why}")) {
            return;
        }
        w.placement = None;
        self.state.requeue(id);
        self.save(fx, id);
        self.event(
            fx,
            now,
            "requeued",
            Some(id),
            Some(cluster),
            format!("workload {id} re-queued: {why}"),
        );
        self.changed();
    }

    /// A requested stop is confirmed: a preempted workload may now run again,
    /// a cancelled one is done.
    fn stopped(&mut self, cluster: &str, id: u64, epoch: u64, fx: &mut Effects, now: u64) {
        let Some(w) = self.workloads.get_mut(&id) else {
            return;
        };
        let Some(st) = w.stopping.take() else { return };
        if st.epoch != epoch {
            w.stopping = Some(st);
            return;
        }
        if st.cancel {
            transition(w, WEvent::Cancel, now, "cancelled by user".into());
            w.finished_at_ms = Some(now);
            self.state.remove(id);
            self.event(
                fx,
                now,
                "cancelled",
                Some(id),
                Some(cluster),
                format!("workload {id} cancelled"),
            );
        } else if w.state == WState::Pending {
            // Preempted earlier; back in the queue with its original submit time.
            let spec = spec_of(w);
            if let Err(e) = self.state.submit(spec) {
                warn!("workload {id} cannot re-queue: {e}");
            }
        }
        self.save(fx, id);
        self.changed();
    }

    fn tick(&mut self, fx: &mut Effects, now: u64) {
        let lost_after = self.policy.settings.spoke_lost_after_s * 1000;
        let started = self.started_ms;
        let silent_ms = |c: &ClusterEntry| now.saturating_sub(c.last_seen_ms.max(started));
        // 1. A spoke silent past the timeout is lost: no new work goes there.
        let mut newly_lost = Vec::new();
        for (name, c) in &mut self.clusters {
            if !c.lost && c.registered && silent_ms(c) >= lost_after {
                c.lost = true;
                newly_lost.push(name.clone());
            }
        }
        for cluster in &newly_lost {
            warn!("spoke {cluster} silent for {lost_after} ms: lost");
            self.event(
                fx,
                now,
                "spoke_lost",
                None,
                Some(cluster),
                format!(
                    "spoke {cluster} silent for {}s: marked lost",
                    lost_after / 1000
                ),
            );
        }
        // 2. Its workloads are released once the spoke has surely stopped
        // them: a spoke cut off from the hub fences itself after the same
        // timeout and gives each workload its grace period.
        let due: Vec<(u64, String)> = self
            .workloads
            .values()
            .filter_map(|w| {
                let cluster = match (&w.stopping, &w.placement) {
                    (Some(s), _) => &s.cluster,
                    (None, Some(p)) if w.state.holds_gpus() => &p.cluster,
                    _ => return None,
                };
                let c = self.clusters.get(cluster).filter(|c| c.lost)?;
                let release_after =
                    lost_after + grace_of(&self.policy, &w.priority) * 1000 + FENCE_MARGIN_MS;
                (silent_ms(c) >= release_after).then(|| (w.id, cluster.clone()))
            })
            .collect();
        for (id, cluster) in &due {
            let w = self.workloads.get_mut(id).expect("listed");
            let stopping = w.stopping.take();
            let why = format!("spoke {cluster} lost");
            if stopping.as_ref().is_some_and(|s| s.cancel) {
                transition(w, WEvent::Cancel, now, format!("cancelled ({why})"));
                w.finished_at_ms = Some(now);
            } else if w.state.holds_gpus() {
                transition(w, WEvent::Requeue, now, format!("re-queued: {why}"));
                w.placement = None;
            }
            self.save(fx, *id);
            self.event(
                fx,
                now,
                "requeued",
                Some(*id),
                Some(cluster),
                format!("workload {id} re-queued: {why}"),
            );
        }
        if !newly_lost.is_empty() || !due.is_empty() {
            self.rebuild(fx, now);
        }
        // A cycle each tick (waits pass burst thresholds), without forcing
        // a full explanation when nothing else changed.
        self.dirty = true;
    }

    /// The image a workload runs with on `cluster`: its own, else the
    /// spoke's default, else the policy's `defaultImage` for the cluster.
    fn image_for(&self, w: &WorkloadRecord, cluster: &str) -> String {
        w.image
            .clone()
            .or_else(|| {
                self.clusters
                    .get(cluster)
                    .and_then(|c| c.default_image.clone())
            })
            .or_else(|| {
                self.policy
                    .clusters
                    .get(cluster)
                    .and_then(|c| c.default_image.clone())
            })
            .unwrap_or_default()
    }

    fn assign_msg(&self, id: u64) -> pb::HubMessage {
        let w = &self.workloads[&id];
        let p = w.placement.as_ref().expect("placed");
        pb::HubMessage {
            msg: Some(pb::hub_message::Msg::Assign(pb::Assign {
                workload_id: id,
                epoch: w.epoch,
                name: w.name.clone(),
                team: w.team.clone(),
                command: w.command.clone(),
                env: w.env.clone().into_iter().collect(),
                // A spread replica spans nodes: the spoke runs one process per node piece.
                replicas: p
                    .replicas
                    .iter()
                    .flat_map(|r| {
                        r.by_node().into_iter().map(|(node, gpus)| pb::Replica {
                            node: node.to_string(),
                            gpus: gpus
                                .into_iter()
                                .map(|(index, milli)| pb::GpuShare { index, milli })
                                .collect(),
                        })
                    })
                    .collect(),
                grace_period_s: grace_of(&self.policy, &w.priority),
                max_runtime_s: w.max_runtime_s.unwrap_or(0),
                checkpoint_signal: w.checkpoint_signal.clone().unwrap_or_default(),
                image: self.image_for(w, &p.cluster),
                priority: w.priority.clone(),
                // Epochs count placements from 1.
                restart_count: u32::try_from(w.epoch.saturating_sub(1)).unwrap_or(u32::MAX),
            })),
        }
    }

    /// Runs one scheduling cycle and turns its decisions into record changes,
    /// events and spoke messages.
    fn schedule(&mut self, fx: &mut Effects, now: u64) {
        // Explaining every waiting workload costs O(queue); with a deep queue
        // it is done at most once per EXPLAIN_EVERY_MS, and the cycles in
        // between skip what provably cannot run (placements are the same).
        let explain = self.explain_stale
            && (self.state.pending_len() <= EXPLAIN_ALWAYS_BELOW
                || now.saturating_sub(self.last_explain_ms) >= EXPLAIN_EVERY_MS);
        if explain {
            self.explain_stale = false;
            self.last_explain_ms = now;
        }
        let opts = CycleOptions {
            explain,
            ..CycleOptions::default()
        };
        let d = cycle(&self.state, now, &opts);
        if let Err(e) = self.state.apply(&d, now) {
            error!("cannot apply the cycle's own decisions: {e}");
            return;
        }
        for p in &d.preemptions {
            let id = p.workload;
            let by = self
                .workloads
                .get(&p.for_workload)
                .map(|f| (f.team.clone(), f.priority.clone()))
                .unwrap_or_default();
            // Its GPUs now belong to the preemptor; it waits for the stop to
            // be confirmed before it may run again.
            self.state.remove(id);
            let Some(w) = self.workloads.get_mut(&id) else {
                continue;
            };
            let Some(pl) = w.placement.take() else {
                continue;
            };
            let reason = format!("preempted for workload {}: {}", p.for_workload, p.reason);
            transition(w, WEvent::Preempt, now, reason.clone());
            w.preemptions += 1;
            w.lost_gpu_ms = w.lost_gpu_ms.saturating_add(p.lost_gpu_ms);
            if w.preemption_log.len() >= MAX_HISTORY {
                w.preemption_log.remove(0);
            }
            w.preemption_log.push(PreemptionRecord {
                at_ms: now,
                by_workload: p.for_workload,
                by_team: by.0,
                by_priority: by.1,
                reason: p.reason.to_string(),
                lost_gpu_ms: p.lost_gpu_ms,
            });
            let stopping = StoppingRecord {
                cluster: pl.cluster.clone(),
                epoch: w.epoch,
                cancel: false,
            };
            w.stopping = Some(stopping.clone());
            // The grace period is the victim's class's (as in the decision).
            self.request_stop(fx, id, &stopping, reason.clone());
            self.save(fx, id);
            self.event(fx, now, "preempted", Some(id), Some(&pl.cluster), reason);
        }
        for p in &d.placements {
            let id = p.workload;
            let cluster = self.state.cluster_name(p.allocation.cluster).to_string();
            let replicas: Vec<ReplicaRecord> = p
                .allocation
                .replicas
                .iter()
                .map(|shards| ReplicaRecord {
                    shards: shards
                        .iter()
                        .map(|s| {
                            (
                                self.state
                                    .node_name(p.allocation.cluster, s.node)
                                    .to_string(),
                                s.gpu,
                                s.milli.0 as u32,
                            )
                        })
                        .collect(),
                })
                .collect();
            let Some(w) = self.workloads.get_mut(&id) else {
                continue;
            };
            w.epoch += 1;
            let desc = describe_placement(&cluster, &replicas);
            let mut reason = format!("placed on {desc}");
            if !p.after_preempting.is_empty() {
                reason.push_str(&format!(
                    " after preempting {}",
                    p.after_preempting
                        .iter()
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            transition(w, WEvent::Place, now, reason.clone());
            w.placement = Some(PlacementRecord {
                cluster: cluster.clone(),
                replicas,
            });
            self.reasons.remove(&id);
            self.burst_noted.remove(&id);
            let msg = self.assign_msg(id);
            fx.msgs.push((cluster.clone(), msg));
            self.save(fx, id);
            self.event(
                fx,
                now,
                "placed",
                Some(id),
                Some(&cluster),
                format!("workload {id} {reason}"),
            );
        }
        for (id, reason) in d.pending {
            self.reasons.insert(id, reason);
        }
        for b in d.burst_wanted {
            if self.burst_noted.insert(b.workload) {
                let msg = format!(
                    "workload {} waited {}s and may burst to {}",
                    b.workload,
                    b.waited_ms / 1000,
                    b.providers.join(", ")
                );
                self.event(fx, now, "burst_wanted", Some(b.workload), None, msg);
            }
        }
        debug!(
            placed = d.placements.len(),
            preempted = d.preemptions.len(),
            pending = self.state.pending_len(),
            "cycle"
        );
    }

    pub fn view(&self, id: u64) -> Option<api::WorkloadView> {
        self.workloads
            .get(&id)
            .map(|w| crate::views::workload(w, self.reasons.get(&id)))
    }

    pub fn cluster_views(&self) -> Vec<api::ClusterView> {
        let allocated: BTreeMap<(&str, &str, u32), u64> = {
            let mut m = BTreeMap::new();
            for w in self.workloads.values() {
                if !w.state.holds_gpus() {
                    continue;
                }
                if let Some(p) = &w.placement {
                    for r in &p.replicas {
                        for (node, g, milli) in &r.shards {
                            *m.entry((p.cluster.as_str(), node.as_str(), *g))
                                .or_insert(0) += u64::from(*milli);
                        }
                    }
                }
            }
            m
        };
        self.clusters
            .iter()
            .map(|(name, c)| {
                let state = if c.lost {
                    "Lost"
                } else if c.conn.is_some() {
                    "Ready"
                } else if c.registered {
                    "Disconnected"
                } else {
                    "Declared"
                };
                let nodes: Vec<api::NodeView> = c
                    .nodes
                    .iter()
                    .map(|n| api::NodeView {
                        name: n.name.clone(),
                        gpus: n
                            .gpus
                            .iter()
                            .map(|g| api::GpuView {
                                index: g.index,
                                model: g.model.clone(),
                                memory_mb: g.memory_mb,
                                allocated: allocated
                                    .get(&(name.as_str(), n.name.as_str(), g.index))
                                    .copied()
                                    .unwrap_or(0) as f64
                                    / MILLI_PER_GPU as f64,
                            })
                            .collect(),
                    })
                    .collect();
                let total: f64 = nodes.iter().map(|n| n.gpus.len() as f64).sum();
                let alloc: f64 = nodes
                    .iter()
                    .flat_map(|n| &n.gpus)
                    .map(|g| g.allocated)
                    .sum();
                let running = self
                    .workloads
                    .values()
                    .filter(|w| {
                        w.state.holds_gpus()
                            && w.placement.as_ref().is_some_and(|p| &p.cluster == name)
                    })
                    .count() as u64;
                api::ClusterView {
                    name: name.clone(),
                    region: c.region.clone(),
                    state: state.to_string(),
                    labels: c.labels.clone(),
                    nodes,
                    gpus_total: total,
                    gpus_allocated: alloc,
                    running_workloads: running,
                    last_heartbeat_ms: (c.registered && c.last_seen_ms > 0)
                        .then_some(c.last_seen_ms),
                    driver: c.driver.clone(),
                }
            })
            .collect()
    }

    pub fn team_views(&self) -> Vec<api::TeamView> {
        let mut pending: BTreeMap<&str, u64> = BTreeMap::new();
        let mut running: BTreeMap<&str, u64> = BTreeMap::new();
        for w in self.workloads.values() {
            if w.state == WState::Pending {
                *pending.entry(&w.team).or_default() += 1;
            } else if w.state.holds_gpus() {
                *running.entry(&w.team).or_default() += 1;
            }
        }
        self.state
            .team_usage()
            .into_iter()
            .map(|t| {
                let team = self.policy.teams.get(&t.team);
                api::TeamView {
                    weight: team.map(|x| x.weight).unwrap_or(1.0),
                    burst_budget_usd_per_month: team
                        .map(|x| x.burst.budget_usd_per_month)
                        .unwrap_or(0.0),
                    pending: pending.get(t.team.as_str()).copied().unwrap_or(0),
                    running: running.get(t.team.as_str()).copied().unwrap_or(0),
                    quotas: t
                        .classes
                        .iter()
                        .map(|c| api::QuotaView {
                            gpu_class: c.gpu_class.clone(),
                            used: c.used.as_gpus_f64(),
                            guaranteed: c.guaranteed.as_gpus_f64(),
                            limit: c.limit.as_gpus_f64(),
                            borrowed: c.used.saturating_sub(c.guaranteed).as_gpus_f64(),
                        })
                        .collect(),
                    name: t.team,
                }
            })
            .collect()
    }
}

fn describe_placement(cluster: &str, replicas: &[ReplicaRecord]) -> String {
    let parts: Vec<String> = replicas
        .iter()
        .flat_map(|r| r.by_node())
        .map(|(node, gpus)| {
            let gpus: Vec<String> = gpus
                .iter()
                .map(|&(g, m)| {
                    if u64::from(m) == MILLI_PER_GPU {
                        g.to_string()
                    } else {
                        format!("{g}:{}", Milli(u64::from(m)))
                    }
                })
                .collect();
            format!("{node} GPU {}", gpus.join(","))
        })
        .collect();
    format!("{cluster} ({})", parts.join("; "))
}

#[cfg(test)]
mod supervision_tests {
    use super::HubTasks;

    #[tokio::test]
    async fn a_panicked_applier_is_reported_by_name_and_cause() {
        // Observed: a dead applier left a hub that answered 503 forever.
        let mut tasks = HubTasks {
            applier: tokio::spawn(async { panic!("store invariant broken") }),
            ticker: tokio::spawn(std::future::pending()),
        };
        let why = tokio::time::timeout(std::time::Duration::from_secs(1), tasks.failed())
            .await
            .expect("reported within a second");
        assert_eq!(
            why,
            "the hub's applier task panicked: store invariant broken"
        );
    }

    #[tokio::test]
    async fn a_ticker_that_stops_is_reported() {
        let mut tasks = HubTasks {
            applier: tokio::spawn(std::future::pending()),
            ticker: tokio::spawn(async {}),
        };
        assert_eq!(tasks.failed().await, "the hub's ticker task stopped");
    }
}
