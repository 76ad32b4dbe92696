//! The `kubernetes` driver: each assignment runs as a `batch/v1` Job in the
//! team's namespace, pinned to the nodes the hub chose, with its GPUs as
//! device-plugin resources; the inventory comes from the cluster's Nodes,
//! status and logs from its pods, and every team's namespace, quota and
//! member access are kept in step with the policy.
//!
//! - `nodes.rs` — inventory from Nodes (pure);
//! - `manifest.rs` — names, labels and the Job of an assignment (pure);
//! - `observe.rs` — a run's state from its Job, pods and events (pure);
//! - `reconcile.rs` — wants × observed → actions (pure);
//! - `isolation.rs` — team namespaces, quotas, RBAC, priority classes (pure);
//! - `controller.rs` — watchers, the reconcile loop, the applier, logs;
//! - `podlogs.rs` — one pod's log, reopened after a broken stream;
//! - `access.rs` — every API call it makes, as RBAC rules.
//!
//! Jobs outlive the agent: on shutdown they keep running, and a restarted
//! agent adopts them by label (the hub stops those it no longer wants).

pub mod access;
pub mod controller;
pub mod isolation;
pub mod manifest;
pub mod nodes;
pub mod observe;
pub mod podlogs;
pub mod reconcile;

use std::sync::{Arc, Mutex};

use axle_proto::pb;
use tokio::sync::mpsc;

use self::controller::{COMMAND_QUEUE, Command, Controller, ControllerOptions, Shared};
use super::{Driver, StopAnswer, StopCause};
use crate::config::NodeSpec;
use crate::event::Event;

pub struct KubeDriver {
    commands: mpsc::Sender<Command>,
    shared: Arc<Mutex<Shared>>,
    default_image: Option<String>,
    shutting_down: bool,
}

impl KubeDriver {
    /// Starts the controller on `client`; it reports through `events`.
    pub fn start(
        client: kube::Client,
        opts: ControllerOptions,
        events: mpsc::Sender<Event>,
    ) -> KubeDriver {
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let shared = Arc::new(Mutex::new(Shared::default()));
        let default_image = opts.manifest.default_image.clone();
        Controller::start(client, opts, shared.clone(), events, rx);
        KubeDriver {
            commands: tx,
            shared,
            default_image,
            shutting_down: false,
        }
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, cmd: Command) -> Result<(), String> {
        self.commands.try_send(cmd).map_err(|_| {
            format!("the kubernetes driver is behind ({COMMAND_QUEUE} commands queued)")
        })
    }
}

impl Driver for KubeDriver {
    fn kind(&self) -> &'static str {
        "kubernetes"
    }

    fn default_image(&self) -> Option<String> {
        self.default_image.clone()
    }

    fn nodes(&self) -> Option<Vec<NodeSpec>> {
        let s = self.shared();
        if s.adopted { s.nodes.clone() } else { None }
    }

    fn running(&self) -> Vec<pb::RunningWorkload> {
        self.shared()
            .running
            .iter()
            .map(|(&workload_id, &epoch)| pb::RunningWorkload { workload_id, epoch })
            .collect()
    }

    fn is_running(&self, workload_id: u64, epoch: u64) -> bool {
        self.shared().running.get(&workload_id) == Some(&epoch)
    }

    fn assign(&mut self, assign: pb::Assign) -> Vec<pb::WorkloadStatus> {
        let (id, epoch) = (assign.workload_id, assign.epoch);
        {
            let mut s = self.shared();
            if s.running.get(&id).is_some_and(|&e| e > epoch) {
                return Vec::new();
            }
            s.running.insert(id, epoch);
        }
        match self.send(Command::Assign(Box::new(assign))) {
            Ok(()) => Vec::new(),
            Err(message) => {
                self.shared().running.remove(&id);
                vec![pb::WorkloadStatus {
                    workload_id: id,
                    epoch,
                    phase: pb::Phase::Failed as i32,
                    exit_code: 127,
                    message,
                }]
            }
        }
    }

    fn stop(&mut self, stop: &pb::Stop, why: &str) -> StopAnswer {
        let here = self.shared().running.get(&stop.workload_id).copied();
        let answered = here.is_some_and(|e| stop.epoch == 0 || e == stop.epoch);
        if here.is_some_and(|e| stop.epoch == 0 || e <= stop.epoch) {
            let grace_s = if stop.grace_period_s == 0 {
                30
            } else {
                stop.grace_period_s
            };
            let _ = self.send(Command::Stop {
                workload_id: stop.workload_id,
                epoch: stop.epoch,
                grace_s: grace_s.min(crate::agent::MAX_GRACE_PERIOD.as_secs()),
                why: why.to_string(),
            });
        }
        StopAnswer {
            answered,
            terminals: Vec::new(),
        }
    }

    fn stop_all(&mut self, cause: StopCause) -> Vec<pb::WorkloadStatus> {
        match cause {
            // Jobs keep running while the agent is away; the next agent
            // adopts them.
            StopCause::Shutdown => self.shutting_down = true,
            other => {
                let _ = self.send(Command::StopAll {
                    why: other.describe(),
                });
            }
        }
        Vec::new()
    }

    fn finished(&mut self, status: &pb::WorkloadStatus) -> Vec<pb::WorkloadStatus> {
        let mut s = self.shared();
        if s.running.get(&status.workload_id) == Some(&status.epoch) {
            s.running.remove(&status.workload_id);
        }
        Vec::new()
    }

    fn tick(&mut self) -> Vec<pb::WorkloadStatus> {
        Vec::new()
    }

    fn wants_tick(&self) -> bool {
        false
    }

    fn is_idle(&self) -> bool {
        self.shutting_down || self.shared().running.is_empty()
    }

    fn policy(&mut self, teams: &[pb::TeamIsolation], classes: &[pb::PriorityClassInfo]) {
        let _ = self.send(Command::Teams {
            teams: teams.to_vec(),
            classes: classes.to_vec(),
        });
    }
}
