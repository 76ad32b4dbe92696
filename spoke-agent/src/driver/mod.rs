//! What runs workloads on a cluster: the [`Driver`] trait the agent's
//! generic core drives, and the stop requests it passes on. Two drivers:
//! `local` (processes on this host behind a shim) and `kubernetes` (Jobs
//! through the Kubernetes API).
//!
//! A driver owns everything about how work runs: its inventory, what it
//! runs and what waits to start, and its own tasks, which report through
//! the agent's event channel ([`crate::event::Event`]). The agent owns the
//! hub session, what the hub still has to hear, heartbeats, self-fencing
//! and shutdown.

pub mod kubernetes;
pub mod local;

use std::time::Duration;

use axle_proto::pb;

use crate::config::NodeSpec;

/// Why a workload is being stopped from outside.
#[derive(Debug, Clone)]
pub enum StopCause {
    /// The hub sent `Stop`; the text says why.
    Hub(String),
    /// The hub sent `Stop` because a user cancelled the workload: it will not
    /// run again, so its checkpoints go too.
    Cancelled(String),
    /// The hub assigned a newer epoch of the same workload.
    Superseded { by_epoch: u64 },
    /// No word from the hub for too long: the hub runs it elsewhere.
    Fenced(String),
    /// The spoke is shutting down.
    Shutdown,
}

impl StopCause {
    /// How the stopped workload's status describes the stop.
    pub fn describe(&self) -> String {
        match self {
            StopCause::Hub(why) | StopCause::Cancelled(why) => format!("stopped by the hub: {why}"),
            StopCause::Fenced(why) => format!("stopped by the hub: {why}"),
            StopCause::Superseded { by_epoch } => format!("superseded by epoch {by_epoch}"),
            StopCause::Shutdown => "the spoke is shutting down".into(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct StopRequest {
    /// Time between the stop signal and SIGKILL.
    pub grace: Duration,
    pub cause: StopCause,
}

/// What a driver did with a `Stop` from the hub.
#[derive(Debug, Default)]
pub struct StopAnswer {
    /// The stopped epoch was here (running or waiting); it reports its own
    /// end. `false`: the agent answers from what it knows.
    pub answered: bool,
    /// Terminal statuses to report now.
    pub terminals: Vec<pb::WorkloadStatus>,
}

/// Runs the hub's assignments on one cluster. Every method returns at once;
/// long work happens in the driver's own tasks, which report through the
/// agent's event channel. Terminal statuses a method returns are reported
/// to the hub (and remembered) by the agent.
pub trait Driver: Send + 'static {
    /// `local` or `kubernetes`, as reported to the hub.
    fn kind(&self) -> &'static str;

    /// The image for workloads that name none, where the driver runs images.
    fn default_image(&self) -> Option<String> {
        None
    }

    /// The nodes to report, or `None` while the driver does not know them
    /// yet (the agent registers with the hub only once it does).
    fn nodes(&self) -> Option<Vec<NodeSpec>>;

    /// Accepted assignments that have not ended: running, and waiting to
    /// start here (a restarted hub must not take them for lost).
    fn running(&self) -> Vec<pb::RunningWorkload>;

    /// Is this epoch of the workload running here?
    fn is_running(&self, workload_id: u64, epoch: u64) -> bool;

    /// A new assignment, which the agent has checked has not already ended
    /// here. A newer epoch of a running workload replaces the old one once
    /// it stopped; an older one is ignored.
    fn assign(&mut self, assign: pb::Assign) -> Vec<pb::WorkloadStatus>;

    /// A `Stop` from the hub (epoch 0: whatever epoch runs here).
    fn stop(&mut self, stop: &pb::Stop, why: &str) -> StopAnswer;

    /// Stops everything running or waiting, each with its grace period.
    fn stop_all(&mut self, cause: StopCause) -> Vec<pb::WorkloadStatus>;

    /// A workload ended (its `Finished` event): the driver forgets it and may
    /// start what waited for it.
    fn finished(&mut self, status: &pb::WorkloadStatus) -> Vec<pb::WorkloadStatus>;

    /// Periodic work, about once a second while [`Driver::wants_tick`].
    fn tick(&mut self) -> Vec<pb::WorkloadStatus>;

    fn wants_tick(&self) -> bool;

    /// Nothing of this driver's runs any more (shutdown may complete).
    fn is_idle(&self) -> bool;

    /// The policy's teams and priority classes, from the hub's `Registered`
    /// (a driver that mirrors team isolation onto its cluster keeps them).
    fn policy(&mut self, _teams: &[pb::TeamIsolation], _classes: &[pb::PriorityClassInfo]) {}
}
