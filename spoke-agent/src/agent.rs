//! The spoke agent's generic core: one task that owns the spoke's side of
//! the hub session (registration, heartbeats, what the hub still has to hear,
//! self-fencing, shutdown) and hands workloads to a [`Driver`], which owns
//! how they run (`driver/`). The hub connection itself is in `session.rs`.

use std::future::Future;
use std::time::Duration;

use axle_proto::pb;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::SpokeConfig;
use crate::driver::local::make_status;
use crate::driver::{Driver, StopCause};
use crate::event::Event;
use crate::outbox::{Outbox, RESEND_WINDOW, Terminals};

/// Heartbeat interval when the hub's `Registered` does not name one.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(1000);
/// Floor for the hub's heartbeat interval, so a misconfigured hub cannot make
/// the spoke spin.
pub const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(50);
/// Grace period when neither `Stop` nor `Assign` sets one: Kubernetes'
/// default `terminationGracePeriodSeconds`, which workloads already expect.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);
/// Longest grace period honoured: the policy's bound on
/// `gracePeriodSeconds` (a day), so the spoke gives exactly the grace the
/// hub counts on when it re-queues a lost spoke's work.
pub const MAX_GRACE_PERIOD: Duration = Duration::from_secs(86_400);
/// How often the driver's periodic work runs while it wants it.
const DRIVER_TICK_INTERVAL: Duration = Duration::from_secs(1);
/// How long a shutting-down spoke tries to deliver its last statuses.
pub const SHUTDOWN_FLUSH_TIMEOUT: Duration = Duration::from_secs(3);

/// What the connection task tells the agent.
#[derive(Debug)]
pub enum Input {
    /// A session is open; messages for the hub go into this sender.
    Connected(mpsc::Sender<pb::SpokeMessage>),
    Disconnected,
    Hub(Box<pb::HubMessage>),
}

struct Conn {
    tx: mpsc::Sender<pb::SpokeMessage>,
    /// The hub answered Register; only then does the outbox drain.
    registered: bool,
}

pub struct Agent<D: Driver> {
    config: SpokeConfig,
    instance_id: String,
    driver: D,
    outbox: Outbox,
    terminals: Terminals,
    /// Finished runs whose files go after `KEEP_FINISHED_RUN`.
    forgetting: crate::logs::Forgetting,
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
    /// The same confirmations, for the shims' leases (`lease.rs`).
    lease: std::sync::Arc<crate::lease::Lease>,
    /// The workloads were stopped for lack of word from the hub; cleared by the next ack.
    fenced: bool,
    /// Connected, but the driver does not know its inventory yet:
    /// `Register` waits for it.
    register_due: bool,
    /// The provider's notice that it reclaims this machine: every heartbeat
    /// carries it from then on.
    interruption: Option<pb::InterruptionNotice>,
}

/// A random-enough id per spoke process: pid plus the clock's nanoseconds.
pub fn new_instance_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}-{:x}", std::process::id(), nanos)
}

/// The grace period a stop gets: what the hub sent (its class's
/// `gracePeriodSeconds`, which may be 0: SIGKILL at once), at most
/// [`MAX_GRACE_PERIOD`] — the policy's own bound, so the hub, which waits
/// that grace before re-queueing a lost spoke's work, never waits less than
/// the spoke really gives.
pub(crate) fn resolve_grace(seconds: u64) -> Duration {
    Duration::from_secs(seconds).min(MAX_GRACE_PERIOD)
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

async fn reserve(
    tx: Option<mpsc::Sender<pb::SpokeMessage>>,
) -> Option<mpsc::OwnedPermit<pb::SpokeMessage>> {
    match tx {
        Some(tx) => tx.reserve_owned().await.ok(),
        None => std::future::pending().await,
    }
}

impl<D: Driver> Agent<D> {
    pub fn new(config: SpokeConfig, driver: D) -> Self {
        Agent {
            config,
            instance_id: new_instance_id(),
            driver,
            outbox: Outbox::default(),
            terminals: Terminals::default(),
            forgetting: Default::default(),
            conn: None,
            heartbeat_every: DEFAULT_HEARTBEAT_INTERVAL,
            next_heartbeat: Instant::now(),
            shutting_down: false,
            dropped_logs_reported: 0,
            fence_after: Duration::ZERO,
            last_ack: Instant::now(),
            lease: Default::default(),
            fenced: false,
            register_due: false,
            interruption: None,
        }
    }

    /// Confirms `lease` whenever the hub acknowledges this spoke.
    pub fn with_lease(mut self, lease: std::sync::Arc<crate::lease::Lease>) -> Self {
        self.lease = lease;
        self
    }

    /// Runs until `shutdown` resolves and every workload has stopped.
    pub async fn run(
        mut self,
        mut inputs: mpsc::Receiver<Input>,
        mut events: mpsc::Receiver<Event>,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut driver_tick = tokio::time::interval(DRIVER_TICK_INTERVAL);
        driver_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tracing::info!(cluster = %self.config.cluster, instance_id = %self.instance_id, "spoke agent running");
        loop {
            if self.shutting_down && self.driver.is_idle() {
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
                && !self.driver.running().is_empty();
            let wants_tick = self.driver.wants_tick();
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
                _ = driver_tick.tick(), if wants_tick => {
                    let terminals = self.driver.tick();
                    self.emit_terminals(terminals);
                }
                () = tokio::time::sleep_until(fence_at), if fence_on => self.fence(),
            }
        }
        self.flush_before_exit(&mut inputs).await;
        tracing::info!("spoke agent stopped");
        Ok(())
    }

    fn nodes(&self) -> Vec<pb::Node> {
        self.driver
            .nodes()
            .unwrap_or_default()
            .iter()
            .map(pb::Node::from)
            .collect()
    }

    /// Sends `Register` on the open session, once the driver knows its nodes.
    fn register(&mut self) {
        let Some(conn) = self.conn.as_ref() else {
            return;
        };
        if self.driver.nodes().is_none() {
            tracing::info!("connected; registering once the cluster's inventory is known");
            self.register_due = true;
            return;
        }
        self.register_due = false;
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
            running: self.driver.running(),
            driver: self.driver.kind().to_string(),
            default_image: self.driver.default_image().unwrap_or_default(),
        };
        let msg = pb::SpokeMessage {
            msg: Some(pb::spoke_message::Msg::Register(register)),
        };
        // A fresh channel has room, so this cannot be Full.
        if let Err(e) = conn.tx.try_send(msg) {
            tracing::warn!(error = %e, "cannot send Register");
        }
        tracing::info!(
            running = self.driver.running().len(),
            "connected to the hub; registering"
        );
    }

    fn on_input(&mut self, input: Input) {
        match input {
            Input::Connected(tx) => {
                if self.shutting_down {
                    // Nothing new to say; keep the old session (if any) for the flush.
                    return;
                }
                self.conn = Some(Conn {
                    tx,
                    registered: false,
                });
                self.register();
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
                    self.lease.confirm();
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
        self.driver
            .policy(&registered.teams, &registered.priority_classes);
        crate::logs::set_max_log_file_bytes(registered.max_log_bytes_per_workload);
        self.fence_after = Duration::from_millis(registered.fence_after_ms);
        self.last_ack = Instant::now();
        self.lease.set_fence_after(self.fence_after);
        self.lease.confirm();
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
            // A run's end goes after all its log chunks: once it is sent,
            // the hub has the log, unless a chunk was dropped here while
            // the hub was away (then the file is the only full copy).
            if let Some(pb::spoke_message::Msg::Status(s)) = &msg.msg
                && crate::outbox::is_terminal(s.phase)
                && !self.outbox.lost_log_of(s.workload_id, s.epoch)
                && let Some((id, epoch)) =
                    self.forgetting.push(Instant::now(), s.workload_id, s.epoch)
            {
                self.forget(id, epoch);
            }
            permit.send(msg);
        }
    }

    /// Deletes a finished run's files on the spoke (off the loop).
    fn forget(&self, id: u64, epoch: u64) {
        let dir = self.config.data_dir.clone();
        tokio::spawn(async move { crate::logs::forget(&dir, id, epoch).await });
    }

    fn send_heartbeat(&mut self) {
        for (id, epoch) in self.forgetting.due(Instant::now()) {
            self.forget(id, epoch);
        }
        self.next_heartbeat = Instant::now() + self.heartbeat_every;
        let Some(conn) = self.conn.as_ref() else {
            return;
        };
        let msg = pb::SpokeMessage {
            msg: Some(pb::spoke_message::Msg::Heartbeat(pb::Heartbeat {
                nodes: self.nodes(),
                running: self.driver.running(),
                interruption: self.interruption.clone(),
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

    fn emit_terminals(&mut self, statuses: Vec<pb::WorkloadStatus>) {
        for s in statuses {
            self.emit_terminal(s);
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Started { workload_id, epoch } => {
                if self.driver.is_running(workload_id, epoch) {
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
                let more = self.driver.finished(&status);
                self.emit_terminal(status);
                self.emit_terminals(more);
            }
            Event::Inventory => {
                if self.register_due {
                    self.register();
                }
            }
            Event::Interruption(n) => {
                self.interruption = Some(n);
                // Said now, not at the next beat: every second counts.
                if self.conn.as_ref().is_some_and(|c| c.registered) {
                    self.send_heartbeat();
                }
            }
        }
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
        let terminals = self.driver.assign(assign);
        self.emit_terminals(terminals);
    }

    fn on_stop(&mut self, stop: &pb::Stop) {
        let why = stop_reason_text(stop);
        let answer = self.driver.stop(stop, &why);
        self.emit_terminals(answer.terminals);
        if !answer.answered {
            if let Some(status) = self.terminals.get(stop.workload_id, stop.epoch) {
                // It already ended on its own: tell the hub how, again.
                let status = status.clone();
                self.outbox.push_status(status);
            } else {
                self.emit_terminal(make_status(
                    stop.workload_id,
                    stop.epoch,
                    pb::Phase::Stopped,
                    0,
                    format!("not running on this spoke ({why})"),
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
        tracing::warn!(workloads = self.driver.running().len(), "{why}");
        let terminals = self.driver.stop_all(StopCause::Fenced(why));
        self.emit_terminals(terminals);
    }

    fn begin_shutdown(&mut self) {
        tracing::info!(
            workloads = self.driver.running().len(),
            "shutting down: stopping workloads"
        );
        self.shutting_down = true;
        let terminals = self.driver.stop_all(StopCause::Shutdown);
        self.emit_terminals(terminals);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_period_is_the_one_the_hub_sent() {
        // Observed: `gracePeriodSeconds: 0` was read as "default 30 s",
        // while the hub re-queued a lost spoke's work after lost + 0 + 2 s.
        assert_eq!(resolve_grace(0), Duration::ZERO);
        assert_eq!(resolve_grace(45), Duration::from_secs(45));
        // The policy allows a day; so does the spoke.
        assert_eq!(resolve_grace(86_400), Duration::from_secs(86_400));
        assert_eq!(resolve_grace(u64::MAX), MAX_GRACE_PERIOD);
    }
}
