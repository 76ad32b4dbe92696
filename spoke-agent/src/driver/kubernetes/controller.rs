//! The kubernetes driver's task: watches Nodes, Axle's Jobs and pods and
//! the Jobs' events into caches (kube-runtime reflectors, which relist after
//! a `410 Gone` and reconnect with backoff), takes the agent's commands, runs
//! the reconciler on every change, and performs its actions through the
//! Kubernetes API with bounded concurrency. It also keeps team isolation and
//! follows pod logs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axle_proto::pb;
use futures::StreamExt as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event as K8sEvent, Namespace, Node, Pod, ResourceQuota};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use super::isolation::{orphaned, priority_classes, team_objects};
use super::manifest::{COMPLETION_INDEX_ANNOTATION, LABEL_MANAGED_BY, MANAGED_BY, ManifestOptions};
use super::nodes::{InventoryOptions, NodeFacts, node_facts};
use super::podlogs;
use super::reconcile::{Action, Observed, Track, Want, reconcile, run_of};
use crate::config::NodeSpec;
use crate::event::Event;
use crate::logs::{LOG_PIPE_CHANNEL_CAPACITY, write_log};

/// API calls (creates, deletes, applies) in flight at once: enough to keep
/// up with hundreds of assignments a second on a real API server, few
/// enough not to trip its client throttling.
pub const MAX_INFLIGHT_API_CALLS: usize = 16;
/// Pod log streams followed at once; beyond it a pod's log is fetched
/// when it ends instead.
pub const MAX_LOG_FOLLOWERS: usize = 256;
/// Commands from the agent waiting for the controller.
pub const COMMAND_QUEUE: usize = 4096;
/// Reconcile at most this often under a stream of changes: changes
/// between passes are folded into the next one.
const RECONCILE_EVERY: Duration = Duration::from_millis(20);
/// Team isolation is applied again this often, so drift (a quota edited by
/// hand) is undone and a removed team's namespace goes once it is empty.
const ISOLATION_RESYNC: Duration = Duration::from_secs(60);
/// The field manager of Axle's server-side applies.
const FIELD_MANAGER: &str = "axle-spoke";

/// Everything the driver's methods need from the controller at once.
#[derive(Debug, Default)]
pub struct Shared {
    /// The inventory, once the first list of Nodes is complete.
    pub nodes: Option<Vec<NodeSpec>>,
    /// Job adoption after a restart is done (the first list of Jobs).
    pub adopted: bool,
    /// (workload, epoch) the driver runs or will run.
    pub running: BTreeMap<u64, u64>,
}

#[derive(Debug)]
pub enum Command {
    Assign(Box<pb::Assign>),
    Stop {
        workload_id: u64,
        epoch: u64,
        grace_s: u64,
        why: String,
    },
    StopAll {
        why: String,
    },
    Teams {
        teams: Vec<pb::TeamIsolation>,
        classes: Vec<pb::PriorityClassInfo>,
    },
}

/// How the controller is set up.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    pub manifest: ManifestOptions,
    pub inventory: InventoryOptions,
    /// A member's Kubernetes user name from their policy name (`{user}`).
    pub member_subject: String,
    /// Workload logs also go to `<data_dir>/logs/<id>-<epoch>.log`.
    pub data_dir: PathBuf,
    /// While the hub confirms this spoke, every Job's
    /// `activeDeadlineSeconds` is extended; when it stops (the agent hung
    /// or cut off), the Jobs end by themselves (`lease.rs`).
    pub lease: Arc<crate::lease::Lease>,
}

/// How often Jobs' deadlines are looked at (and extended where due).
const DEADLINE_EVERY: Duration = Duration::from_secs(1);

/// Annotation saying what bounds a Job's `activeDeadlineSeconds`: `lease`
/// (the spoke renews it) or `max-runtime` (the workload's own limit).
pub const DEADLINE_ANNOTATION: &str = "axle.dev/deadline";

/// A failed call is tried again after this long while the API server is
/// unreachable or overloaded (connection refused, 429, 5xx); a refusal
/// (4xx) is final.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// A broken pod log stream is reopened (skipping what was already read)
/// this many times, `RETRY_AFTER` apart: two minutes of API server outage.
/// Beyond it the rest of that pod's output is not collected; the workload
/// itself is unaffected.
const MAX_LOG_REOPENS: u32 = 120;

/// Why an API call failed.
#[derive(Debug)]
enum CallError {
    /// The API server refused it (admission, quota, validation).
    Refused(String),
    /// It could not be made or the server could not answer: try again.
    Transient(String),
}

/// A Job that cannot be created for this many tries in a row (five
/// minutes at `RETRY_AFTER`) fails its run with the last error, so a
/// workload never waits forever on an API server that does not come back.
const MAX_CREATE_RETRIES: u32 = 300;

fn call_error(e: kube::Error) -> CallError {
    match e {
        // 404: the team's namespace is not there yet (its isolation is
        // being applied); it will be.
        kube::Error::Api(s) if s.code != 429 && s.code != 404 && s.code < 500 => {
            CallError::Refused(s.message)
        }
        other => CallError::Transient(other.to_string()),
    }
}

/// What an applier task reports back.
enum Done {
    Created {
        run: (u64, u64),
        result: Result<(), CallError>,
    },
    Deleted {
        run: (u64, u64),
        result: Result<(), String>,
    },
    /// `RETRY_AFTER` passed since a transient failure: issue it again.
    RetryCreate {
        run: (u64, u64),
    },
    RetryDelete {
        run: (u64, u64),
    },
}

/// An action without its Job body, for the debug log.
struct ActionSummary<'a>(&'a Action);

impl std::fmt::Debug for ActionSummary<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Action::Create { run, .. } => write!(f, "create {run:?}"),
            Action::Delete { run, grace_s, .. } => write!(f, "delete {run:?} grace {grace_s}s"),
            Action::Started { run } => write!(f, "started {run:?}"),
            Action::Ended(s) => write!(
                f,
                "ended ({}, {}) phase {} {:?}",
                s.workload_id, s.epoch, s.phase, s.message
            ),
        }
    }
}

/// What a watcher tells the controller.
enum Seen {
    Changed,
    NodesReady,
    JobsReady,
}

fn labels_of_axle() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY}")
}

/// Watches `api` into `writer`, telling the controller of every change.
fn spawn_watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    mut writer: Writer<K>,
    tx: mpsc::Sender<Seen>,
    ready: Option<Seen>,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    tokio::spawn(async move {
        let mut ready = ready;
        let mut stream = watcher(api, cfg).default_backoff().boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => {
                    writer.apply_watcher_event(&ev);
                    if matches!(ev, watcher::Event::InitDone)
                        && let Some(r) = ready.take()
                        && tx.send(r).await.is_err()
                    {
                        return;
                    }
                    if tx.send(Seen::Changed).await.is_err() {
                        return;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "kubernetes watch failed; retrying"),
            }
        }
    });
}

pub struct Controller {
    client: Client,
    opts: ControllerOptions,
    shared: Arc<Mutex<Shared>>,
    events: mpsc::Sender<Event>,
    /// Started and Finished to tell the agent, sent (waiting for room) at
    /// the end of each pass: dropped, the hub could re-queue a run that
    /// succeeded. At most two per run.
    outgoing: Vec<Event>,
    /// Jobs whose deadline was just extended (namespace, name) and when,
    /// so one extension is in flight per Job at a time.
    extended: BTreeMap<(String, String), tokio::time::Instant>,
    nodes: Store<Node>,
    jobs: Store<Job>,
    pods: Store<Pod>,
    job_events: Store<K8sEvent>,
    wants: BTreeMap<u64, Want>,
    tracks: BTreeMap<(u64, u64), Track>,
    nodes_ready: bool,
    jobs_ready: bool,
    priority_classes_ok: bool,
    teams: Option<Vec<pb::TeamIsolation>>,
    teams_applied: bool,
    /// Pods whose logs are followed (by name), and the log writers by run.
    following: BTreeSet<String>,
    log_writers: BTreeMap<(u64, u64), mpsc::Sender<Vec<u8>>>,
    last_nodes: Option<Vec<NodeSpec>>,
    /// Cleared when the PriorityClasses could not be created.
    priority_classes_flag: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Applier tasks and retry timers report here.
    done_tx: mpsc::Sender<Done>,
    /// Failed tries of Job creations still being retried.
    create_retries: BTreeMap<(u64, u64), u32>,
}

/// The `(workload, epoch)` of a pod and its replica index.
fn pod_run(p: &Pod) -> Option<((u64, u64), String)> {
    let run = run_of(p.metadata.labels.as_ref())?;
    let idx = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(COMPLETION_INDEX_ANNOTATION))
        .cloned()
        .unwrap_or_else(|| "0".into());
    Some((run, idx))
}

impl Controller {
    pub fn start(
        client: Client,
        opts: ControllerOptions,
        shared: Arc<Mutex<Shared>>,
        events: mpsc::Sender<Event>,
        commands: mpsc::Receiver<Command>,
    ) {
        let (seen_tx, seen_rx) = mpsc::channel(1024);
        let (done_tx, done_rx) = mpsc::channel::<Done>(1024);
        let axle = labels_of_axle();
        let (nodes, w) = {
            let w = Writer::<Node>::default();
            (w.as_reader(), w)
        };
        spawn_watch(
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            w,
            seen_tx.clone(),
            Some(Seen::NodesReady),
        );
        let (jobs, w) = {
            let w = Writer::<Job>::default();
            (w.as_reader(), w)
        };
        spawn_watch(
            Api::<Job>::all(client.clone()),
            watcher::Config::default().labels(&axle),
            w,
            seen_tx.clone(),
            Some(Seen::JobsReady),
        );
        let (pods, w) = {
            let w = Writer::<Pod>::default();
            (w.as_reader(), w)
        };
        spawn_watch(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().labels(&axle),
            w,
            seen_tx.clone(),
            None,
        );
        let (job_events, w) = {
            let w = Writer::<K8sEvent>::default();
            (w.as_reader(), w)
        };
        spawn_watch(
            Api::<K8sEvent>::all(client.clone()),
            watcher::Config::default().fields("involvedObject.kind=Job"),
            w,
            seen_tx,
            None,
        );
        let c = Controller {
            client,
            opts,
            shared,
            events,
            outgoing: Vec::new(),
            extended: BTreeMap::new(),
            nodes,
            jobs,
            pods,
            job_events,
            wants: BTreeMap::new(),
            tracks: BTreeMap::new(),
            nodes_ready: false,
            jobs_ready: false,
            priority_classes_ok: false,
            teams: None,
            teams_applied: false,
            following: BTreeSet::new(),
            log_writers: BTreeMap::new(),
            last_nodes: None,
            priority_classes_flag: None,
            done_tx,
            create_retries: BTreeMap::new(),
        };
        tokio::spawn(c.run(commands, seen_rx, done_rx));
    }

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut seen: mpsc::Receiver<Seen>,
        mut done_rx: mpsc::Receiver<Done>,
    ) {
        let limit = Arc::new(Semaphore::new(MAX_INFLIGHT_API_CALLS));
        let done_tx = self.done_tx.clone();
        let mut calls: JoinSet<()> = JoinSet::new();
        let mut dirty = true;
        let mut tick = tokio::time::interval(RECONCILE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut resync = tokio::time::interval(ISOLATION_RESYNC);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut deadlines = tokio::time::interval(DEADLINE_EVERY);
        deadlines.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                cmd = commands.recv() => match cmd {
                    Some(c) => { self.command(c); dirty = true; }
                    None => return,
                },
                s = seen.recv() => match s {
                    Some(Seen::NodesReady) => { self.nodes_ready = true; dirty = true; }
                    Some(Seen::JobsReady) => { self.adopt(); dirty = true; }
                    Some(Seen::Changed) => dirty = true,
                    None => return,
                },
                Some(done) = done_rx.recv() => { self.done(done); dirty = true; }
                Some(_) = calls.join_next(), if !calls.is_empty() => {}
                _ = resync.tick() => { self.teams_applied = false; dirty = true; }
                _ = deadlines.tick(), if self.jobs_ready => self.extend_deadlines(&limit, &mut calls),
                _ = tick.tick(), if dirty => {
                    dirty = false;
                    self.publish_nodes();
                    if self.nodes_ready && self.jobs_ready {
                        self.pass(&limit, &done_tx, &mut calls).await;
                    }
                }
            }
            // Waits for room rather than dropping: the agent reads events
            // in its loop and never waits on this controller (commands are
            // try_send), so this cannot deadlock.
            for e in std::mem::take(&mut self.outgoing) {
                if self.events.send(e).await.is_err() {
                    return;
                }
            }
        }
    }

    fn facts(&self) -> BTreeMap<String, NodeFacts> {
        self.nodes
            .state()
            .iter()
            .filter_map(|n| node_facts(n, &self.opts.inventory))
            .map(|f| (f.name.clone(), f))
            .collect()
    }

    /// Reports the inventory to the agent when it changed.
    fn publish_nodes(&mut self) {
        if !self.nodes_ready {
            return;
        }
        let nodes: Vec<NodeSpec> = self.facts().into_values().map(|f| f.spec).collect();
        if self.last_nodes.as_ref() == Some(&nodes) {
            return;
        }
        self.last_nodes = Some(nodes.clone());
        // Quotas name the MIG and shared resources the nodes have.
        self.teams_applied = false;
        let ready = {
            let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            s.nodes = Some(nodes);
            s.adopted
        };
        if ready {
            let _ = self.events.try_send(Event::Inventory);
        }
    }

    /// After the first list of Jobs: every Axle Job still in the cluster is
    /// adopted as running (the hub stops what it no longer wants).
    fn adopt(&mut self) {
        self.jobs_ready = true;
        let mut adopted = 0;
        for j in self.jobs.state() {
            let Some((id, epoch)) = run_of(j.metadata.labels.as_ref()) else {
                continue;
            };
            let newer = self.wants.get(&id).is_some_and(|w| w.epoch >= epoch);
            if !newer {
                self.wants.insert(
                    id,
                    Want {
                        epoch,
                        assign: None,
                        stop: None,
                    },
                );
                self.tracks.entry((id, epoch)).or_default().created = true;
                adopted += 1;
            }
        }
        tracing::info!(adopted, "adopted the Jobs that outlived the agent");
        let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        for (id, w) in &self.wants {
            s.running.insert(*id, w.epoch);
        }
        s.adopted = true;
        drop(s);
        if self.nodes_ready {
            let _ = self.events.try_send(Event::Inventory);
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Assign(a) => {
                let (id, epoch) = (a.workload_id, a.epoch);
                match self.wants.get_mut(&id) {
                    Some(w) if w.epoch == epoch => {
                        // Adopted, now confirmed by the hub: keep its body.
                        if w.assign.is_none() {
                            w.assign = Some(*a);
                        }
                    }
                    Some(w) if w.epoch > epoch => {}
                    _ => {
                        self.wants.insert(
                            id,
                            Want {
                                epoch,
                                assign: Some(*a),
                                stop: None,
                            },
                        );
                    }
                }
            }
            Command::Stop {
                workload_id,
                epoch,
                grace_s,
                why,
            } => {
                if let Some(w) = self.wants.get_mut(&workload_id)
                    && (epoch == 0 || w.epoch <= epoch)
                {
                    w.stop = Some((grace_s, why));
                }
            }
            Command::StopAll { why } => {
                for w in self.wants.values_mut() {
                    let grace = w.assign.as_ref().map_or(30, |a| a.grace_period_s);
                    w.stop.get_or_insert((grace, why.clone()));
                }
            }
            Command::Teams { teams, classes } => {
                self.teams = Some(teams);
                self.teams_applied = false;
                self.ensure_priority_classes(classes);
            }
        }
    }

    fn done(&mut self, done: Done) {
        match done {
            Done::Created {
                run,
                result: Err(CallError::Transient(message)),
            } => {
                let tries = self.create_retries.entry(run).or_default();
                *tries += 1;
                if *tries > MAX_CREATE_RETRIES {
                    self.create_retries.remove(&run);
                    let t = self.tracks.entry(run).or_default();
                    if !t.ended {
                        t.ended = true;
                        self.end(pb::WorkloadStatus {
                            workload_id: run.0,
                            epoch: run.1,
                            phase: pb::Phase::Failed as i32,
                            exit_code: 127,
                            message: format!(
                                "cannot create its Job after {MAX_CREATE_RETRIES} tries: {message}"
                            ),
                        });
                    }
                    return;
                }
                tracing::warn!(workload_id = run.0, epoch = run.1, %message, "cannot create the Job yet; retrying");
                // A missing namespace is made by the next isolation pass.
                self.teams_applied = false;
                self.retry_later(Done::RetryCreate { run });
            }
            Done::Created {
                run,
                result: Ok(()),
            } => {
                self.create_retries.remove(&run);
            }
            Done::RetryCreate { run } => {
                if let Some(t) = self.tracks.get_mut(&run)
                    && !t.seen
                {
                    t.created = false;
                }
            }
            Done::RetryDelete { run } => {
                if let Some(t) = self.tracks.get_mut(&run) {
                    t.deleting = false;
                }
            }
            Done::Created {
                run,
                result: Err(CallError::Refused(message)),
            } => {
                // The API refused the Job (quota, admission, validation).
                let t = self.tracks.entry(run).or_default();
                if !t.ended {
                    t.ended = true;
                    self.end(pb::WorkloadStatus {
                        workload_id: run.0,
                        epoch: run.1,
                        phase: pb::Phase::Failed as i32,
                        exit_code: 127,
                        message: format!("Kubernetes refused its Job: {message}"),
                    });
                }
            }
            Done::Deleted {
                run,
                result: Err(message),
            } => {
                tracing::warn!(workload_id = run.0, epoch = run.1, %message, "cannot delete the Job; retrying");
                self.retry_later(Done::RetryDelete { run });
            }
            Done::Deleted { .. } => {}
        }
    }

    /// Hands `retry` back to the loop after `RETRY_AFTER`.
    fn retry_later(&self, retry: Done) {
        let done = self.done_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(RETRY_AFTER).await;
            let _ = done.send(retry).await;
        });
    }

    fn end(&mut self, status: pb::WorkloadStatus) {
        let run = (status.workload_id, status.epoch);
        if self.wants.get(&run.0).is_some_and(|w| w.epoch == run.1) {
            self.wants.remove(&run.0);
            let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            if s.running.get(&run.0) == Some(&run.1) {
                s.running.remove(&run.0);
            }
        }
        self.log_writers.remove(&run);
        self.outgoing.push(Event::Finished(status));
    }

    /// A new Job's deadline: at most what the lease allows from now (the
    /// agent extends it while the hub confirms this spoke).
    fn bound_deadline(&self, job: &mut Job) {
        let Some(left) = self.opts.lease.expires_in() else {
            return;
        };
        let Some(spec) = job.spec.as_mut() else {
            return;
        };
        let lease_s = (left.as_secs() as i64).max(1);
        let by_lease = spec.active_deadline_seconds.is_none_or(|max| lease_s < max);
        if by_lease {
            spec.active_deadline_seconds = Some(lease_s);
        }
        job.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                DEADLINE_ANNOTATION.into(),
                if by_lease { "lease" } else { "max-runtime" }.into(),
            );
    }

    /// Extends the deadline of every running Job of a wanted run whose
    /// deadline is the lease's and comes within half the fence time, to
    /// what the lease allows from now (never past its max runtime).
    fn extend_deadlines(&mut self, limit: &Arc<Semaphore>, calls: &mut JoinSet<()>) {
        let Some(left) = self.opts.lease.expires_in() else {
            return;
        };
        if left.is_zero() {
            return; // not confirmed: the Jobs end by themselves
        }
        let fence = self.opts.lease.fence_after();
        let now = jiff::Timestamp::now();
        self.extended
            .retain(|_, at| at.elapsed() < DEADLINE_EVERY * 5);
        for j in self.jobs.state() {
            let Some((id, epoch)) = run_of(j.metadata.labels.as_ref()) else {
                continue;
            };
            let Some(want) = self.wants.get(&id).filter(|w| w.epoch == epoch) else {
                continue;
            };
            let by_lease = j
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEADLINE_ANNOTATION))
                .is_some_and(|v| v == "lease");
            let (Some(spec), Some(status)) = (j.spec.as_ref(), j.status.as_ref()) else {
                continue;
            };
            let finished = status.completion_time.is_some()
                || status
                    .conditions
                    .as_ref()
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Failed" && c.status == "True"));
            let (Some(start), Some(current)) =
                (status.start_time.as_ref(), spec.active_deadline_seconds)
            else {
                continue;
            };
            if !by_lease || finished {
                continue;
            }
            let key = (
                j.metadata.namespace.clone().unwrap_or_default(),
                j.metadata.name.clone().unwrap_or_default(),
            );
            if self.extended.contains_key(&key) {
                continue;
            }
            let ran_s = now.duration_since(start.0).as_secs().max(0);
            let remaining = current.saturating_sub(ran_s);
            if remaining as u64 > fence.as_secs() / 2 {
                continue;
            }
            let max_runtime = want
                .assign
                .as_ref()
                .map_or(0, |a| a.max_runtime_s)
                .min(i64::MAX as u64) as i64;
            let mut desired = ran_s.saturating_add(left.as_secs() as i64);
            let mut bound = "lease";
            if max_runtime > 0 && desired >= max_runtime {
                desired = max_runtime;
                bound = "max-runtime";
            }
            if desired <= current {
                continue;
            }
            self.extended
                .insert(key.clone(), tokio::time::Instant::now());
            let api: Api<Job> = Api::namespaced(self.client.clone(), &key.0);
            let permit = limit.clone();
            let patch = serde_json::json!({
                "metadata": {"annotations": {DEADLINE_ANNOTATION: bound}},
                "spec": {"activeDeadlineSeconds": desired},
            });
            calls.spawn(async move {
                let _p = permit.acquire_owned().await;
                if let Err(e) = api
                    .patch(&key.1, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    tracing::warn!(job = %key.1, error = %e, "cannot extend the Job's deadline");
                }
            });
        }
    }

    async fn pass(
        &mut self,
        limit: &Arc<Semaphore>,
        done: &mpsc::Sender<Done>,
        calls: &mut JoinSet<()>,
    ) {
        if let Some(f) = &self.priority_classes_flag {
            self.priority_classes_ok = f.load(std::sync::atomic::Ordering::Relaxed);
        }
        let facts = self.facts();
        let jobs = self.jobs.state();
        let pods = self.pods.state();
        let evs = self.job_events.state();
        let job_refs: Vec<&Job> = jobs.iter().map(|j| j.as_ref()).collect();
        let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
        let ev_refs: Vec<&K8sEvent> = evs.iter().map(|e| e.as_ref()).collect();
        let seen = Observed::from_refs(&job_refs, &pod_refs, &ev_refs);
        let actions = reconcile(
            &self.wants,
            &mut self.tracks,
            &seen,
            &facts,
            &self.opts.manifest,
            self.priority_classes_ok,
        );
        for a in actions {
            tracing::debug!(action = ?ActionSummary(&a), "reconciled");
            match a {
                Action::Create { run, mut job } => {
                    self.bound_deadline(&mut job);
                    let api: Api<Job> = Api::namespaced(
                        self.client.clone(),
                        job.metadata.namespace.as_deref().unwrap_or("default"),
                    );
                    let permit = limit.clone();
                    let done = done.clone();
                    calls.spawn(async move {
                        let _p = permit.acquire_owned().await;
                        let result = match api.create(&PostParams::default(), &job).await {
                            Ok(_) => Ok(()),
                            // Made by an earlier try whose answer was lost.
                            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                            Err(e) => Err(call_error(e)),
                        };
                        let _ = done.send(Done::Created { run, result }).await;
                    });
                }
                Action::Delete {
                    run,
                    namespace,
                    name,
                    grace_s,
                } => {
                    let api: Api<Job> = Api::namespaced(self.client.clone(), &namespace);
                    let permit = limit.clone();
                    let done = done.clone();
                    calls.spawn(async move {
                        let _p = permit.acquire_owned().await;
                        let dp = DeleteParams {
                            propagation_policy: Some(PropagationPolicy::Background),
                            grace_period_seconds: Some(u32::try_from(grace_s).unwrap_or(u32::MAX)),
                            ..DeleteParams::default()
                        };
                        let result = match api.delete(&name, &dp).await {
                            Ok(_) => Ok(()),
                            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                            Err(e) => Err(e.to_string()),
                        };
                        let _ = done.send(Done::Deleted { run, result }).await;
                    });
                }
                Action::Started { run } => {
                    self.outgoing.push(Event::Started {
                        workload_id: run.0,
                        epoch: run.1,
                    });
                }
                Action::Ended(status) => self.end(status),
            }
        }
        self.follow_logs(&pod_refs);
        if !self.teams_applied && self.teams.is_some() {
            self.teams_applied = true;
            self.apply_isolation(facts, &pod_refs);
        }
    }

    /// Starts following the log of every running or ended pod of a run the
    /// driver wants, once per pod.
    fn follow_logs(&mut self, pods: &[&Pod]) {
        for p in pods {
            let Some((run, replica)) = pod_run(p) else {
                continue;
            };
            let Some(name) = p.metadata.name.clone() else {
                continue;
            };
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            if !matches!(phase, Some("Running") | Some("Succeeded") | Some("Failed")) {
                continue;
            }
            if self.following.contains(&name) || self.following.len() >= MAX_LOG_FOLLOWERS {
                continue;
            }
            let Some(want) = self.wants.get(&run.0).filter(|w| w.epoch == run.1) else {
                continue;
            };
            let replicas = want.assign.as_ref().map_or(1, |a| a.replicas.len());
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            self.following.insert(name.clone());
            let tx = self.log_writer(run);
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            let prefix = (replicas > 1).then(|| format!("[r{replica}] "));
            tokio::spawn(podlogs::follow(
                api,
                name,
                prefix,
                tx,
                podlogs::Reopen {
                    after: RETRY_AFTER,
                    max: MAX_LOG_REOPENS,
                },
            ));
        }
    }

    /// The writer of a run's log: a file, and chunks up to the hub.
    fn log_writer(&mut self, run: (u64, u64)) -> mpsc::Sender<Vec<u8>> {
        if let Some(tx) = self.log_writers.get(&run) {
            return tx.clone();
        }
        let (tx, rx) = mpsc::channel(LOG_PIPE_CHANNEL_CAPACITY);
        let path = crate::driver::local::supervise::log_path(&self.opts.data_dir, run.0, run.1);
        let events = self.events.clone();
        tokio::spawn(async move {
            match tokio::fs::File::create(&path).await {
                Ok(file) => write_log(file, rx, run.0, run.1, events).await,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot create the log file {}", path.display())
                }
            }
        });
        self.log_writers.insert(run, tx.clone());
        tx
    }

    fn ensure_priority_classes(&mut self, classes: Vec<pb::PriorityClassInfo>) {
        let wanted = priority_classes(&classes, &self.opts.manifest);
        let api: Api<PriorityClass> = Api::all(self.client.clone());
        // Optimistic: pods name the classes; a refusal turns that off.
        self.priority_classes_ok = true;
        let ok = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let ok2 = ok.clone();
        tokio::spawn(async move {
            for pc in wanted {
                let name = pc.metadata.name.clone().unwrap_or_default();
                match api.create(&PostParams::default(), &pc).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => {
                        tracing::warn!(class = %name, error = %e, "cannot create the PriorityClass; pods run without one");
                        ok2.store(false, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        });
        // The flag is read at the next passes; creation takes milliseconds.
        self.priority_classes_flag = Some(ok);
    }

    /// Keeps every team's namespace, quota, reader role and binding, and
    /// deletes the namespaces of teams no longer in the policy once empty.
    fn apply_isolation(&self, facts: BTreeMap<String, NodeFacts>, pods: &[&Pod]) {
        let Some(teams) = self.teams.clone() else {
            return;
        };
        let client = self.client.clone();
        let opts = self.opts.clone();
        let busy: BTreeSet<String> = pods
            .iter()
            .filter_map(|p| p.metadata.namespace.clone())
            .collect();
        tokio::spawn(async move {
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            for t in &teams {
                let o = team_objects(t, &facts, &opts.manifest, &opts.member_subject);
                let ns = o.namespace.metadata.name.clone().unwrap_or_default();
                let r1 = Api::<Namespace>::all(client.clone())
                    .patch(&ns, &pp, &Patch::Apply(&o.namespace))
                    .await
                    .map(|_| ());
                let r2 = Api::<ResourceQuota>::namespaced(client.clone(), &ns)
                    .patch(super::isolation::QUOTA_NAME, &pp, &Patch::Apply(&o.quota))
                    .await
                    .map(|_| ());
                let r3 = Api::<Role>::namespaced(client.clone(), &ns)
                    .patch(super::isolation::READER_ROLE, &pp, &Patch::Apply(&o.role))
                    .await
                    .map(|_| ());
                let r4 = Api::<RoleBinding>::namespaced(client.clone(), &ns)
                    .patch(
                        super::isolation::MEMBERS_BINDING,
                        &pp,
                        &Patch::Apply(&o.binding),
                    )
                    .await
                    .map(|_| ());
                for r in [r1, r2, r3, r4] {
                    if let Err(e) = r {
                        tracing::warn!(team = %t.name, error = %e, "cannot apply the team's isolation");
                    }
                }
            }
            let lp = ListParams::default().labels(&labels_of_axle());
            if let Ok(list) = Api::<Namespace>::all(client.clone()).list(&lp).await {
                for ns in orphaned(&list.items, &teams) {
                    if busy.contains(&ns) {
                        tracing::info!(namespace = %ns, "its team left the policy; kept until its pods are gone");
                        continue;
                    }
                    if let Err(e) = Api::<Namespace>::all(client.clone())
                        .delete(&ns, &DeleteParams::default())
                        .await
                    {
                        tracing::warn!(namespace = %ns, error = %e, "cannot delete the namespace of a removed team");
                    }
                }
            }
        });
    }
}
