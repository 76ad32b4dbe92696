//! The `local` driver: each replica of an assignment runs as a process on
//! this host, behind the shim (`shim.rs`), with `CUDA_VISIBLE_DEVICES` set to
//! the GPUs the hub chose. The driver keeps the GPU ledger of this host: an
//! assignment waits until the GPUs it needs are released by stopping
//! workloads (`ledger.rs`), and each running workload has a supervisor task
//! (`supervise.rs`).

pub mod gpu;
pub mod ledger;
pub mod shim;
pub mod supervise;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use axle_proto::pb;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use self::ledger::{Demand, Holder};
use self::supervise::SPAWN_FAILED_EXIT_CODE;
use super::{Driver, StopAnswer, StopCause, StopRequest};
use crate::config::NodeSpec;
use crate::event::Event;

/// How long an assignment may wait for its GPUs to be released. Waiting on a
/// stopping workload takes at most its grace period; anything longer means
/// hub and spoke disagree about what runs here, and the assignment fails
/// with the reason instead of hanging.
pub const GPU_WAIT_TIMEOUT: Duration = Duration::from_secs(300);
/// How often a wait that no stop explains is logged again.
pub const GPU_WAIT_WARN_INTERVAL: Duration = Duration::from_secs(10);
/// Assignments that may wait for GPUs at once: a spoke has at most a few
/// hundred GPU shares, so more waiting assignments than this is a hub bug.
pub const MAX_PENDING_ASSIGNS: usize = 1024;

/// What every supervisor shares.
#[derive(Debug, Clone)]
pub struct DriverCtx {
    /// The executable that runs the shim (normally the spoke's own).
    pub shim_exe: PathBuf,
    pub data_dir: PathBuf,
    pub events: mpsc::Sender<Event>,
    /// Renewed to every shim while the hub confirms this spoke.
    pub lease: std::sync::Arc<crate::lease::Lease>,
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

pub struct LocalDriver {
    nodes: Vec<NodeSpec>,
    ctx: DriverCtx,
    live: BTreeMap<u64, Live>,
    pending: VecDeque<Pending>,
}

pub fn make_status(
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

fn holders(live: &BTreeMap<u64, Live>) -> impl Iterator<Item = Holder<'_>> {
    live.iter().map(|(id, l)| Holder {
        workload_id: *id,
        epoch: l.epoch,
        stopping: l.stopping,
        shares: &l.shares,
    })
}

fn rejected(id: u64, epoch: u64, message: String) -> pb::WorkloadStatus {
    tracing::warn!(workload_id = id, epoch, %message, "rejecting assignment");
    make_status(
        id,
        epoch,
        pb::Phase::Failed,
        SPAWN_FAILED_EXIT_CODE,
        message,
    )
}

impl LocalDriver {
    pub fn new(nodes: Vec<NodeSpec>, ctx: DriverCtx) -> LocalDriver {
        LocalDriver {
            nodes,
            ctx,
            live: BTreeMap::new(),
            pending: VecDeque::new(),
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
        tokio::spawn(supervise::supervise(
            self.ctx.clone(),
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
}

impl Driver for LocalDriver {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn nodes(&self) -> Option<Vec<NodeSpec>> {
        Some(self.nodes.clone())
    }

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

    fn is_running(&self, workload_id: u64, epoch: u64) -> bool {
        self.live
            .get(&workload_id)
            .is_some_and(|l| l.epoch == epoch)
    }

    fn assign(&mut self, assign: pb::Assign) -> Vec<pb::WorkloadStatus> {
        let (id, epoch) = (assign.workload_id, assign.epoch);
        let mut out = Vec::new();
        if let Some(live) = self.live.get_mut(&id) {
            if live.epoch == epoch {
                tracing::debug!(
                    workload_id = id,
                    epoch,
                    "assignment already running; ignored"
                );
                return out;
            }
            if live.epoch > epoch {
                tracing::warn!(
                    workload_id = id,
                    epoch,
                    running_epoch = live.epoch,
                    "ignoring assignment older than the running epoch"
                );
                return out;
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
                return out;
            }
            if waiting_epoch > epoch {
                tracing::warn!(
                    workload_id = id,
                    epoch,
                    waiting_epoch,
                    "ignoring assignment older than the waiting epoch"
                );
                return out;
            }
            self.pending.remove(pos);
            out.push(make_status(
                id,
                waiting_epoch,
                pb::Phase::Stopped,
                0,
                format!("superseded by epoch {epoch} before it started"),
            ));
        }
        let shares = match ledger::demand(&assign, &self.nodes) {
            Ok(shares) => shares,
            Err(message) => {
                out.push(rejected(id, epoch, message));
                return out;
            }
        };
        if self.pending.len() >= MAX_PENDING_ASSIGNS {
            let message =
                format!("{MAX_PENDING_ASSIGNS} assignments already wait for GPUs on this spoke");
            out.push(rejected(id, epoch, message));
            return out;
        }
        let grace = crate::agent::resolve_grace(assign.grace_period_s);
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
        out
    }

    fn stop(&mut self, stop: &pb::Stop, why: &str) -> StopAnswer {
        let id = stop.workload_id;
        // Epoch 0 means "whatever epoch runs here" (the hub fencing off a copy it forgot).
        let any_epoch = stop.epoch == 0;
        let mut answer = StopAnswer::default();
        if let Some(live) = self.live.get_mut(&id)
            && (any_epoch || live.epoch <= stop.epoch)
        {
            let grace = if stop.grace_period_s == 0 {
                live.grace
            } else {
                crate::agent::resolve_grace(stop.grace_period_s)
            };
            tracing::info!(workload_id = id, epoch = live.epoch, reason = %why, grace_s = grace.as_secs(), "stopping workload");
            live.stopping = true;
            let cause = if stop.reason == pb::StopReason::Cancelled as i32 {
                StopCause::Cancelled(why.to_string())
            } else {
                StopCause::Hub(why.to_string())
            };
            live.stop_tx
                .send_replace(Some(StopRequest { grace, cause }));
            // Its supervisor reports STOPPED once every process is gone.
            answer.answered = any_epoch || live.epoch == stop.epoch;
        }
        if let Some(pos) = self
            .pending
            .iter()
            .position(|p| p.assign.workload_id == id && (any_epoch || p.assign.epoch <= stop.epoch))
            && let Some(p) = self.pending.remove(pos)
        {
            answer.answered = answer.answered || any_epoch || p.assign.epoch == stop.epoch;
            answer.terminals.push(make_status(
                id,
                p.assign.epoch,
                pb::Phase::Stopped,
                0,
                format!("stopped by the hub before it started: {why}"),
            ));
        }
        self.start_ready();
        answer
    }

    fn stop_all(&mut self, cause: StopCause) -> Vec<pb::WorkloadStatus> {
        for live in self.live.values_mut() {
            if live.stopping && !matches!(cause, StopCause::Shutdown) {
                continue;
            }
            live.stopping = true;
            live.stop_tx.send_replace(Some(StopRequest {
                grace: live.grace,
                cause: cause.clone(),
            }));
        }
        let before = match &cause {
            StopCause::Shutdown => "the spoke is shutting down".to_string(),
            StopCause::Hub(why) | StopCause::Cancelled(why) | StopCause::Fenced(why) => {
                format!("stopped before it started: {why}")
            }
            StopCause::Superseded { by_epoch } => {
                format!("superseded by epoch {by_epoch} before it started")
            }
        };
        self.pending
            .drain(..)
            .map(|p| {
                make_status(
                    p.assign.workload_id,
                    p.assign.epoch,
                    pb::Phase::Stopped,
                    0,
                    before.clone(),
                )
            })
            .collect()
    }

    fn finished(&mut self, status: &pb::WorkloadStatus) -> Vec<pb::WorkloadStatus> {
        if self
            .live
            .get(&status.workload_id)
            .is_some_and(|l| l.epoch == status.epoch)
        {
            self.live.remove(&status.workload_id);
        }
        self.start_ready();
        Vec::new()
    }

    fn tick(&mut self) -> Vec<pb::WorkloadStatus> {
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
        let mut out = Vec::new();
        for (i, detail) in expired.into_iter().rev() {
            if let Some(p) = self.pending.remove(i) {
                let message = format!(
                    "waited {} s for GPUs that stayed in use: {detail}",
                    GPU_WAIT_TIMEOUT.as_secs()
                );
                tracing::warn!(workload_id = p.assign.workload_id, epoch = p.assign.epoch, %message, "giving up on assignment");
                out.push(make_status(
                    p.assign.workload_id,
                    p.assign.epoch,
                    pb::Phase::Failed,
                    SPAWN_FAILED_EXIT_CODE,
                    message,
                ));
            }
        }
        out
    }

    fn wants_tick(&self) -> bool {
        !self.pending.is_empty()
    }

    fn is_idle(&self) -> bool {
        self.live.is_empty()
    }
}
