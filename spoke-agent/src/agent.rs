//! The spoke agent's core: one task that owns all spoke state (what runs,
//! what waits for GPUs, what the hub still has to hear) and reacts to hub
//! messages, workload events, timers and shutdown. Workloads themselves run in
//! their own supervisor tasks (`driver.rs`); the hub connection in `session.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::time::Duration;

use axle_proto::pb;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::config::SpokeConfig;
use crate::driver::{self, DriverCtx, SPAWN_FAILED_EXIT_CODE, StopCause, StopRequest};
use crate::event::Event;
use crate::ledger::{self, Demand, Holder};
use crate::outbox::{Outbox, RESEND_WINDOW, Terminals};

/// Heartbeat interval when the hub's `Registered` does not name one.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(1000);
/// Floor for the hub's heartbeat interval, so a misconfigured hub cannot make
/// the spoke spin.
pub const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(50);
/// Grace period when neither `Stop` nor `Assign` sets one: Kubernetes'
/// default `terminationGracePeriodSeconds`, which workloads already expect.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);
/// Longest grace period honoured: bounds how long a stop (and the spoke's
/// shutdown) can take.
pub const MAX_GRACE_PERIOD: Duration = Duration::from_secs(3600);
/// How long an assignment may wait for its GPUs to be released. Waiting on a
/// stopping workload takes at most its grace period; anything longer means
/// hub and spoke disagree about what runs here, and the assignment fails
/// with the reason instead of hanging.
pub const GPU_WAIT_TIMEOUT: Duration = Duration::from_secs(300);
/// How often a wait that no stop explains is logged again.
pub const GPU_WAIT_WARN_INTERVAL: Duration = Duration::from_secs(10);
/// How often waiting assignments are re-checked (timeouts, warnings).
const GPU_WAIT_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Assignments that may wait for GPUs at once: a spoke has at most a few
/// hundred GPU shares, so more waiting assignments than this is a hub bug.
pub const MAX_PENDING_ASSIGNS: usize = 1024;
/// How long a shutting-down spoke tries to deliver its last statuses.
pub const SHUTDOWN_FLUSH_TIMEOUT: Duration = Duration::from_secs(3);

/// What the connection task tells the agent.
#[derive(Debug)]
pub enum Input {
    /// A session is open; messages for the hub go into this sender.
    Connected(mpsc::Sender<pb::SpokeMessage>),
    Disconnected,
    Hub(pb::HubMessage),
}

/// A workload whose processes may be alive.
struct Live {
    epoch: u64,
    shares: Demand,
    stop_tx: watch::Sender<Option<StopRequest>>,
    stopping: bool,
    grace: Duration,
}

/// An assignment waiting for its GPUs (or for an older epoch to stop).
struct Pending {
    assign: pb::Assign,
    shares: Demand,
    grace: Duration,
    since: Instant,
    last_warned: Option<Instant>,
}

struct Conn {
    tx: mpsc::Sender<pb::SpokeMessage>,
    /// The hub answered Register; only then does the outbox drain.
    registered: bool,
}

pub struct Agent {
    config: SpokeConfig,
    instance_id: String,
    driver: DriverCtx,
    live: BTreeMap<u64, Live>,
    pending: VecDeque<Pending>,
    outbox: Outbox,
    terminals: Terminals,
    conn: Option<Conn>,
    heartbeat_every: Duration,
    next_heartbeat: Instant,
    shutting_down: bool,
    /// Log chunks the outbox had dropped when we last said so.
    dropped_logs_reported: u64,
    /// Self-fencing (from `Registered`; zero: off): with no word from the
    /// hub for this long, stop every workload, since the hub re-queues them.
    fence_after: Duration,
    /// When the hub last acknowledged us (Registered or HeartbeatAck).
    last_ack: Instant,
    /// The workloads were stopped for lack of word from the hub; cleared by the next ack.
    fenced: bool,
}

/// A random-enough id per spoke process: pid plus the clock's nanoseconds.
pub fn new_instance_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}-{:x}", std::process::id(), nanos)
}

fn resolve_grace(seconds: u64) -> Duration {
    if seconds == 0 {
        DEFAULT_GRACE_PERIOD
    } else {
        Duration::from_secs(seconds).min(MAX_GRACE_PERIOD)
    }
}

fn make_status(
    workload_id: u64,
    epoch: u64,
    phase: pb::Phase,
    exit_code: i32,
    message: String,
) -> pb::WorkloadStatus {
    pb::WorkloadStatus {
        workload_id,
        epoch,
        phase: phase as i32,
        exit_code,
        message,
    }
}

fn stop_reason_text(stop: &pb::Stop) -> String {
    let reason = match pb::StopReason::try_from(stop.reason) {
        Ok(pb::StopReason::Preempted) => "preempted",
        Ok(pb::StopReason::Cancelled) => "cancelled",
        Ok(pb::StopReason::Stale) => "stale epoch",
        _ => "stop requested",
    };
    if stop.message.is_empty() {
        reason.to_string()
    } else {
        format!("{reason}: {}", stop.message)
    }
}

fn holders(live: &BTreeMap<u64, Live>) -> impl Iterator<Item = Holder<'_>> {
    live.iter().map(|(id, l)| Holder {
        workload_id: *id,
        epoch: l.epoch,
        stopping: l.stopping,
        shares: &l.shares,
    })
}

async fn reserve(
    tx: Option<mpsc::Sender<pb::SpokeMessage>>,
) -> Option<mpsc::OwnedPermit<pb::SpokeMessage>> {
    match tx {
        Some(tx) => tx.reserve_owned().await.ok(),
        None => std::future::pending().await,
    }
}

impl Agent {
    pub fn new(config: SpokeConfig, driver: DriverCtx) -> Self {
        Agent {
            config,
            instance_id: new_instance_id(),
            driver,
            live: BTreeMap::new(),
            pending: VecDeque::new(),
            outbox: Outbox::default(),
            terminals: Terminals::default(),
            conn: None,
            heartbeat_every: DEFAULT_HEARTBEAT_INTERVAL,
            next_heartbeat: Instant::now(),
            shutting_down: false,
            dropped_logs_reported: 0,
            fence_after: Duration::ZERO,
            last_ack: Instant::now(),
            fenced: false,
        }
    }

    /// Runs until `shutdown` resolves and every workload has stopped.
    pub async fn run(
        mut self,
        mut inputs: mpsc::Receiver<Input>,
        mut events: mpsc::Receiver<Event>,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut gpu_check = tokio::time::interval(GPU_WAIT_CHECK_INTERVAL);
        gpu_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tracing::info!(cluster = %self.config.cluster, instance_id = %self.instance_id, "spoke agent running");
        loop {
            if self.shutting_down && self.live.is_empty() {
                break;
            }
            let registered = self.conn.as_ref().filter(|c| c.registered);
            let sender = registered
                .filter(|_| !self.outbox.is_empty())
                .map(|c| c.tx.clone());
            let can_send = sender.is_some();
            let heartbeat_on = registered.is_some();
            let next_heartbeat = self.next_heartbeat;
            let fence_on = !self.fence_after.is_zero()
                && !self.fenced
                && !self.shutting_down
                && (!self.live.is_empty() || !self.pending.is_empty());
            let fence_at = self.last_ack + self.fence_after;
            tokio::select! {
                () = &mut shutdown, if !self.shutting_down => self.begin_shutdown(),
                input = inputs.recv() => match input {
                    Some(input) => self.on_input(input),
                    None => anyhow::bail!("the hub connection task ended unexpectedly"),
                },
                Some(event) = events.recv() => self.on_event(event),
                permit = reserve(sender), if can_send => self.send_one(permit),
                () = tokio::time::sleep_until(next_heartbeat), if heartbeat_on => self.send_heartbeat(),
                _ = gpu_check.tick(), if !self.pending.is_empty() => self.check_pending(),
                () = tokio::time::sleep_until(fence_at), if fence_on => self.fence(),
            }
        }
        self.flush_before_exit(&mut inputs).await;
        tracing::info!("spoke agent stopped");
        Ok(())
    }

    /// Every accepted assignment not yet terminal: live ones, and those
    /// waiting for GPUs, which will start here (a hub that restarts must not
    /// take them for lost and run them elsewhere too).
    fn running(&self) -> Vec<pb::RunningWorkload> {
        let live = self.live.iter().map(|(id, l)| pb::RunningWorkload {
            workload_id: *id,
            epoch: l.epoch,
        });
        let waiting = self.pending.iter().map(|p| pb::RunningWorkload {
            workload_id: p.assign.workload_id,
            epoch: p.assign.epoch,
        });
        live.chain(waiting).collect()
    }

    fn nodes(&self) -> Vec<pb::Node> {
        self.config.nodes.iter().map(pb::Node::from).collect()
    }

    fn on_input(&mut self, input: Input) {
        match input {
            Input::Connected(tx) => {
                if self.shutting_down {
                    // Nothing new to say; keep the old session (if any) for the flush.
                    return;
                }
                let register = pb::Register {
                    cluster: self.config.cluster.clone(),
                    region: self.config.region.clone(),
                    labels: self
                        .config
                        .labels
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    nodes: self.nodes(),
                    instance_id: self.instance_id.clone(),
                    token: self.config.token.clone().unwrap_or_default(),
                    running: self.running(),
                };
                let msg = pb::SpokeMessage {
                    msg: Some(pb::spoke_message::Msg::Register(register)),
                };
                // A fresh channel has room, so this cannot be Full.
                if let Err(e) = tx.try_send(msg) {
                    tracing::warn!(error = %e, "cannot send Register");
                }
                tracing::info!(
                    running = self.live.len(),
                    "connected to the hub; registering"
                );
                self.conn = Some(Conn {
                    tx,
                    registered: false,
                });
            }
            Input::Disconnected => {
                if self.conn.take().is_some() {
                    tracing::warn!(
                        queued = self.outbox.len(),
                        "disconnected from the hub; workloads keep running"
                    );
                }
            }
            Input::Hub(msg) => match msg.msg {
                Some(pb::hub_message::Msg::Registered(r)) => self.on_registered(&r),
                Some(pb::hub_message::Msg::Assign(a)) => self.on_assign(a),
                Some(pb::hub_message::Msg::Stop(s)) => self.on_stop(&s),
                Some(pb::hub_message::Msg::HeartbeatAck(_)) => {
                    self.last_ack = Instant::now();
                    self.fenced = false;
                }
                None => tracing::debug!("empty hub message"),
            },
        }
    }

    fn on_registered(&mut self, registered: &pb::Registered) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        conn.registered = true;
        self.fence_after = Duration::from_millis(registered.fence_after_ms);
        self.last_ack = Instant::now();
        self.fenced = false;
        self.heartbeat_every = match registered.heartbeat_interval_ms {
            0 => DEFAULT_HEARTBEAT_INTERVAL,
            ms => Duration::from_millis(ms).max(MIN_HEARTBEAT_INTERVAL),
        };
        self.next_heartbeat = Instant::now() + self.heartbeat_every;
        let resend = self.terminals.recently_sent(Instant::now(), RESEND_WINDOW);
        tracing::info!(
            heartbeat_ms = self.heartbeat_every.as_millis() as u64,
            queued = self.outbox.len(),
            resending = resend.len(),
            "registered with the hub"
        );
        self.outbox.push_front_statuses(resend);
        let dropped = self.outbox.dropped_log_chunks();
        if dropped > self.dropped_logs_reported {
            tracing::warn!(
                chunks = dropped - self.dropped_logs_reported,
                "log chunks were dropped while the hub was away; the log files hold them"
            );
            self.dropped_logs_reported = dropped;
        }
    }

    fn send_one(&mut self, permit: Option<mpsc::OwnedPermit<pb::SpokeMessage>>) {
        let Some(permit) = permit else {
            // The stream's receiver is gone: the session is over; the
            // connection task reports it and redials.
            self.conn = None;
            return;
        };
        if let Some(msg) = self.outbox.pop() {
            self.terminals.note_sent(&msg, Instant::now());
            permit.send(msg);
        }
    }

    fn send_heartbeat(&mut self) {
        self.next_heartbeat = Instant::now() + self.heartbeat_every;
        let Some(conn) = self.conn.as_ref() else {
            return;
        };
        let msg = pb::SpokeMessage {
            msg: Some(pb::spoke_message::Msg::Heartbeat(pb::Heartbeat {
                nodes: self.nodes(),
                running: self.running(),
            })),
        };
        // A full stream means the hub is not reading; skipping one beat is
        // fine, the next carries the same facts.
        if let Err(e) = conn.tx.try_send(msg) {
            tracing::debug!(error = %e, "heartbeat skipped");
        }
    }

    fn emit_terminal(&mut self, status: pb::WorkloadStatus) {
        self.terminals.record(status.clone());
        self.outbox.push_status(status);
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Started { workload_id, epoch } => {
                if self
                    .live
                    .get(&workload_id)
                    .is_some_and(|l| l.epoch == epoch)
                {
                    self.outbox.push_status(make_status(
                        workload_id,
                        epoch,
                        pb::Phase::Started,
                        0,
                        "all replicas started".into(),
                    ));
                }
            }
            Event::Log(chunk) => self.outbox.push_log(chunk),
            Event::Finished(status) => {
                if self
                    .live
                    .get(&status.workload_id)
                    .is_some_and(|l| l.epoch == status.epoch)
                {
                    self.live.remove(&status.workload_id);
                }
                self.emit_terminal(status);
                self.start_ready();
            }
        }
    }

    /// Refuses an assignment: it never starts, and the hub learns why.
    fn reject(&mut self, id: u64, epoch: u64, message: String) {
        tracing::warn!(workload_id = id, epoch, %message, "rejecting assignment");
        self.emit_terminal(make_status(
            id,
            epoch,
            pb::Phase::Failed,
            SPAWN_FAILED_EXIT_CODE,
            message,
        ));
    }

    fn on_assign(&mut self, assign: pb::Assign) {
        let (id, epoch) = (assign.workload_id, assign.epoch);
        if self.shutting_down {
            tracing::info!(
                workload_id = id,
                epoch,
                "ignoring assignment: the spoke is shutting down"
            );
            return;
        }
        if let Some(status) = self.terminals.get(id, epoch) {
            tracing::info!(
                workload_id = id,
                epoch,
                "assignment already ran here; re-sending its final status"
            );
            let status = status.clone();
            self.outbox.push_status(status);
            return;
        }
        if let Some(live) = self.live.get_mut(&id) {
            if live.epoch == epoch {
                tracing::debug!(
                    workload_id = id,
                    epoch,
                    "assignment already running; ignored"
                );
                return;
            }
            if live.epoch > epoch {
                tracing::warn!(
                    workload_id = id,
                    epoch,
                    running_epoch = live.epoch,
                    "ignoring assignment older than the running epoch"
                );
                return;
            }
            if !live.stopping {
                tracing::info!(
                    workload_id = id,
                    old_epoch = live.epoch,
                    epoch,
                    "new epoch assigned; stopping the old copy first"
                );
                live.stopping = true;
                live.stop_tx.send_replace(Some(StopRequest {
                    grace: live.grace,
                    cause: StopCause::Superseded { by_epoch: epoch },
                }));
            }
        }
        if let Some(pos) = self.pending.iter().position(|p| p.assign.workload_id == id) {
            let waiting_epoch = self.pending[pos].assign.epoch;
            if waiting_epoch == epoch {
                tracing::debug!(
                    workload_id = id,
                    epoch,
                    "assignment already waiting; ignored"
                );
                return;
            }
            if waiting_epoch > epoch {
                tracing::warn!(
                    workload_id = id,
                    epoch,
                    waiting_epoch,
                    "ignoring assignment older than the waiting epoch"
                );
                return;
            }
            self.pending.remove(pos);
            self.emit_terminal(make_status(
                id,
                waiting_epoch,
                pb::Phase::Stopped,
                0,
                format!("superseded by epoch {epoch} before it started"),
            ));
        }
        let shares = match ledger::demand(&assign, &self.config.nodes) {
            Ok(shares) => shares,
            Err(message) => {
                self.reject(id, epoch, message);
                return;
            }
        };
        if self.pending.len() >= MAX_PENDING_ASSIGNS {
            let message =
                format!("{MAX_PENDING_ASSIGNS} assignments already wait for GPUs on this spoke");
            self.reject(id, epoch, message);
            return;
        }
        let grace = resolve_grace(assign.grace_period_s);
        self.pending.push_back(Pending {
            assign,
            shares,
            grace,
            since: Instant::now(),
            last_warned: None,
        });
        self.start_ready();
        if let Some(p) = self.pending.iter_mut().find(|p| p.assign.workload_id == id) {
            let found = ledger::conflicts(holders(&self.live), &p.shares);
            if found.is_empty() {
                tracing::info!(workload_id = id, epoch, "waiting for the old epoch to stop");
            } else if found.iter().all(|c| c.all_stopping()) {
                tracing::info!(
                    workload_id = id,
                    epoch,
                    "waiting for GPUs held by stopping workloads"
                );
            } else {
                p.last_warned = Some(Instant::now());
                let detail: Vec<String> = found.iter().map(ToString::to_string).collect();
                tracing::warn!(workload_id = id, epoch, conflicts = %detail.join("; "), "assignment would over-commit GPUs; waiting for the hub to stop something");
            }
        }
    }

    /// Starts every waiting assignment whose GPUs are free and whose older
    /// epoch is gone, in arrival order.
    fn start_ready(&mut self) {
        let mut i = 0;
        while i < self.pending.len() {
            let p = &self.pending[i];
            let blocked = self.live.contains_key(&p.assign.workload_id)
                || !ledger::conflicts(holders(&self.live), &p.shares).is_empty();
            if blocked {
                i += 1;
                continue;
            }
            if let Some(p) = self.pending.remove(i) {
                self.start(p);
            }
        }
    }

    fn start(&mut self, p: Pending) {
        let (stop_tx, stop_rx) = watch::channel(None);
        let id = p.assign.workload_id;
        let epoch = p.assign.epoch;
        tracing::info!(workload_id = id, epoch, name = %p.assign.name, team = %p.assign.team, "starting workload");
        tokio::spawn(driver::supervise(
            self.driver.clone(),
            p.assign,
            p.grace,
            stop_rx,
        ));
        self.live.insert(
            id,
            Live {
                epoch,
                shares: p.shares,
                stop_tx,
                stopping: false,
                grace: p.grace,
            },
        );
    }

    fn on_stop(&mut self, stop: &pb::Stop) {
        let id = stop.workload_id;
        // Epoch 0 means "whatever epoch runs here" (the hub fencing off a copy it forgot).
        let any_epoch = stop.epoch == 0;
        let why = stop_reason_text(stop);
        let mut answered = false;
        if let Some(live) = self.live.get_mut(&id)
            && (any_epoch || live.epoch <= stop.epoch)
        {
            let grace = if stop.grace_period_s == 0 {
                live.grace
            } else {
                resolve_grace(stop.grace_period_s)
            };
            tracing::info!(workload_id = id, epoch = live.epoch, reason = %why, grace_s = grace.as_secs(), "stopping workload");
            live.stopping = true;
            let cause = if stop.reason == pb::StopReason::Cancelled as i32 {
                StopCause::Cancelled(why.clone())
            } else {
                StopCause::Hub(why.clone())
            };
            live.stop_tx
                .send_replace(Some(StopRequest { grace, cause }));
            // Its supervisor reports STOPPED once every process is gone.
            answered = any_epoch || live.epoch == stop.epoch;
        }
        if let Some(pos) = self
            .pending
            .iter()
            .position(|p| p.assign.workload_id == id && (any_epoch || p.assign.epoch <= stop.epoch))
            && let Some(p) = self.pending.remove(pos)
        {
            answered = answered || any_epoch || p.assign.epoch == stop.epoch;
            self.emit_terminal(make_status(
                id,
                p.assign.epoch,
                pb::Phase::Stopped,
                0,
                format!("stopped by the hub before it started: {why}"),
            ));
        }
        if !answered {
            if let Some(status) = self.terminals.get(id, stop.epoch) {
                // It already ended on its own: tell the hub how, again.
                let status = status.clone();
                self.outbox.push_status(status);
            } else {
                self.emit_terminal(make_status(
                    id,
                    stop.epoch,
                    pb::Phase::Stopped,
                    0,
                    format!("not running on this spoke ({why})"),
                ));
            }
        }
        self.start_ready();
    }

    fn check_pending(&mut self) {
        self.start_ready();
        let now = Instant::now();
        let mut expired = Vec::new();
        for (i, p) in self.pending.iter_mut().enumerate() {
            let found = ledger::conflicts(holders(&self.live), &p.shares);
            let detail: Vec<String> = found.iter().map(ToString::to_string).collect();
            if now.duration_since(p.since) >= GPU_WAIT_TIMEOUT {
                expired.push((i, detail.join("; ")));
                continue;
            }
            let unexplained = found.iter().any(|c| !c.all_stopping());
            let due = p
                .last_warned
                .is_none_or(|t| now.duration_since(t) >= GPU_WAIT_WARN_INTERVAL);
            if unexplained && due {
                p.last_warned = Some(now);
                tracing::warn!(
                    workload_id = p.assign.workload_id,
                    epoch = p.assign.epoch,
                    waited_s = now.duration_since(p.since).as_secs(),
                    conflicts = %detail.join("; "),
                    "assignment still waiting for GPUs that no stop will free"
                );
            }
        }
        for (i, detail) in expired.into_iter().rev() {
            if let Some(p) = self.pending.remove(i) {
                let message = format!(
                    "waited {} s for GPUs that stayed in use: {detail}",
                    GPU_WAIT_TIMEOUT.as_secs()
                );
                tracing::warn!(workload_id = p.assign.workload_id, epoch = p.assign.epoch, %message, "giving up on assignment");
                self.emit_terminal(make_status(
                    p.assign.workload_id,
                    p.assign.epoch,
                    pb::Phase::Failed,
                    SPAWN_FAILED_EXIT_CODE,
                    message,
                ));
            }
        }
    }

    /// No word from the hub for `fence_after`: it will declare this spoke lost
    /// and run its workloads elsewhere, so stop them here first (each with its
    /// grace period) — a workload never runs twice at once, even when the
    /// spoke is alive but cut off.
    fn fence(&mut self) {
        self.fenced = true;
        let why = format!(
            "no word from the hub for {} s: stopped so it can run elsewhere",
            self.fence_after.as_secs()
        );
        tracing::warn!(workloads = self.live.len(), "{why}");
        for live in self.live.values_mut() {
            if live.stopping {
                continue;
            }
            live.stopping = true;
            live.stop_tx.send_replace(Some(StopRequest {
                grace: live.grace,
                cause: StopCause::Hub(why.clone()),
            }));
        }
        let waiting: Vec<Pending> = self.pending.drain(..).collect();
        for p in waiting {
            self.emit_terminal(make_status(
                p.assign.workload_id,
                p.assign.epoch,
                pb::Phase::Stopped,
                0,
                format!("stopped before it started: {why}"),
            ));
        }
    }

    fn begin_shutdown(&mut self) {
        tracing::info!(
            workloads = self.live.len(),
            "shutting down: stopping workloads"
        );
        self.shutting_down = true;
        for live in self.live.values_mut() {
            live.stopping = true;
            live.stop_tx.send_replace(Some(StopRequest {
                grace: live.grace,
                cause: StopCause::Shutdown,
            }));
        }
        let waiting: Vec<Pending> = self.pending.drain(..).collect();
        for p in waiting {
            self.emit_terminal(make_status(
                p.assign.workload_id,
                p.assign.epoch,
                pb::Phase::Stopped,
                0,
                "the spoke is shutting down".into(),
            ));
        }
    }

    /// Hands the last statuses to the stream, closes it, and waits (bounded)
    /// for the hub to end the session so they are on the wire before exit.
    async fn flush_before_exit(&mut self, inputs: &mut mpsc::Receiver<Input>) {
        let deadline = Instant::now() + SHUTDOWN_FLUSH_TIMEOUT;
        while let Some(conn) = self.conn.as_ref().filter(|c| c.registered) {
            if self.outbox.is_empty() {
                break;
            }
            let tx = conn.tx.clone();
            match tokio::time::timeout_at(deadline, tx.reserve_owned()).await {
                Ok(Ok(permit)) => self.send_one(Some(permit)),
                _ => break,
            }
        }
        if self.conn.take().is_none() {
            return;
        }
        if !self.outbox.is_empty() {
            tracing::warn!(
                undelivered = self.outbox.len(),
                "exiting with messages the hub did not get"
            );
        }
        loop {
            match tokio::time::timeout_at(deadline, inputs.recv()).await {
                Ok(Some(Input::Disconnected)) | Ok(None) | Err(_) => break,
                Ok(Some(_)) => {}
            }
        }
    }
}
