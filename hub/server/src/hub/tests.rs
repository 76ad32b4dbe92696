//! Unit tests of the core with hand-built values and explicit times: the
//! applier's state is driven command by command, no server, no clock.

use std::sync::Arc;

use axle_proto::api::SubmitRequest;
use axle_proto::pb;
use tokio::sync::{mpsc, oneshot};

use super::applier::Effects;
use super::*;
use crate::lifecycle::WState;
use crate::store::{RedbStore, Txn};

const POLICY: &str = r#"
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: c1}
spec:
  region: test
  nodes: [{count: 1, gpuModel: H100, gpusPerNode: 2}]
---
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: open}
spec:
  region: test
---
apiVersion: axle.dev/v1
kind: Team
metadata: {name: vision}
spec:
  quotas: {H100: {guaranteed: 2, limit: 2}}
---
apiVersion: axle.dev/v1
kind: Settings
metadata: {name: settings}
spec:
  spokeLostAfterSeconds: 10
  retainFinishedHours: 1
  retainEventsDays: 1
"#;

const T0: u64 = 1_800_000_000_000;
const LOST_MS: u64 = 10_000;
/// `development`'s grace period.
const GRACE_MS: u64 = 30_000;

fn policy() -> axle_policy::Policy {
    axle_policy::load_sources(&[("p.yaml".to_string(), POLICY.to_string())])
        .expect("policy loads")
        .policy
}

/// A whole hub (applier and ticker running) on a store in a temp dir.
async fn start_hub(clock: Clock) -> (Arc<Hub>, HubTasks, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = RedbStore::open_in_dir(dir.path()).expect("store");
    let (hub, tasks) = Hub::start(
        store,
        policy(),
        HubConfig {
            data_dir: dir.path().to_path_buf(),
            spoke_token: None,
            log_limits: crate::logs::LogLimits::default(),
            clock,
            on_store_failure: Default::default(),
            auth: crate::auth::AuthMode::None,
            bootstrap_token: None,
            rate_limits: Default::default(),
            spoke_ca: None,
            spoke_cert_ttl_ms: 0,
            oidc: None,
            burst: None,
        },
    )
    .await
    .expect("hub starts");
    (hub, tasks, dir)
}

/// The applier's state with a store to commit to.
struct Core {
    inner: Inner,
    store: Arc<RedbStore>,
    cfg: HubConfig,
    _dir: tempfile::TempDir,
}

impl Core {
    async fn new() -> Core {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = RedbStore::open_in_dir(dir.path()).expect("store");
        let mut inner = restore::load(store.as_ref(), Arc::new(policy()), T0)
            .await
            .expect("load");
        let mut fx = Effects::default();
        inner.rebuild(&mut fx, T0);
        let cfg = HubConfig {
            data_dir: dir.path().to_path_buf(),
            spoke_token: None,
            log_limits: crate::logs::LogLimits::default(),
            clock: Clock::starting_at(T0),
            on_store_failure: Default::default(),
            auth: crate::auth::AuthMode::None,
            bootstrap_token: None,
            rate_limits: Default::default(),
            spoke_ca: None,
            spoke_cert_ttl_ms: 0,
            oidc: None,
            burst: None,
        };
        let mut core = Core {
            inner,
            store,
            cfg,
            _dir: dir,
        };
        core.commit(fx).await;
        core
    }

    /// The events page retention reads at `now`, read as the applier does.
    async fn events_page(&self, now: u64) -> Option<retention::EventsPage> {
        let from = self.inner.events_to_read(now)?;
        Some(
            self.store
                .range_page(
                    crate::records::EVENTS,
                    Some(&from),
                    retention::RETENTION_BATCH,
                )
                .await,
        )
    }

    async fn retain(&mut self, fx: &mut Effects, now: u64) -> Retention {
        let events = self.events_page(now).await;
        self.inner.retain(fx, now, events)
    }

    /// Applies one command at `now` as a batch of its own (with the cycle
    /// the applier runs), and commits its writes.
    async fn apply(&mut self, cmd: Command, now: u64) -> Effects {
        let mut fx = Effects::default();
        let mut events = if matches!(cmd, Command::Tick) {
            self.events_page(now).await
        } else {
            None
        };
        self.inner.apply(&self.cfg, cmd, &mut fx, now, &mut events);
        if self.inner.dirty {
            self.inner.dirty = false;
            self.inner.schedule(&mut fx, now);
        }
        self.inner.save_counters(&mut fx);
        let ops = std::mem::take(&mut fx.ops);
        self.commit_ops(ops).await;
        fx
    }

    async fn commit(&mut self, fx: Effects) {
        self.commit_ops(fx.ops).await;
    }

    async fn commit_ops(&mut self, ops: Vec<crate::store::Op>) {
        if ops.is_empty() {
            return;
        }
        let txns = ops
            .chunks(crate::store::MAX_OPS_PER_TXN)
            .map(|c| Txn {
                compares: Vec::new(),
                success: c.to_vec(),
                failure: Vec::new(),
            })
            .collect();
        self.store.txn_atomic(txns).await.expect("commit");
    }

    async fn register(&mut self, conn: u64, now: u64) -> (mpsc::Receiver<pb::HubMessage>, Effects) {
        let (tx, rx) = mpsc::channel(64);
        let (reply, mut answer) = oneshot::channel();
        let register = pb::Register {
            cluster: "c1".into(),
            region: "test".into(),
            nodes: vec![pb::Node {
                name: "n0".into(),
                gpus: (0..2)
                    .map(|index| pb::Gpu {
                        index,
                        model: "H100".into(),
                        memory_mb: 81920,
                        fractions_only: false,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            // One spoke process: a second registration is its reconnect.
            instance_id: "scripted".into(),
            ..Default::default()
        };
        let fx = self
            .apply(
                Command::Register {
                    register,
                    peer: None,
                    conn,
                    tx,
                    reply,
                },
                now,
            )
            .await;
        // Nothing is answered before the commit: the answer runs in `after`.
        assert!(matches!(
            answer.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        (rx, fx)
    }

    async fn submit(&mut self, gpus: f64, now: u64) -> u64 {
        self.submit_at(gpus, None, now).await
    }

    async fn submit_at(&mut self, gpus: f64, priority: Option<&str>, now: u64) -> u64 {
        self.submit_named(None, gpus, priority, now).await
    }

    async fn submit_named(
        &mut self,
        name: Option<&str>,
        gpus: f64,
        priority: Option<&str>,
        now: u64,
    ) -> u64 {
        let (reply, _answer) = oneshot::channel();
        let req = SubmitRequest {
            team: "vision".into(),
            name: name.map(str::to_string),
            command: vec!["true".into()],
            gpus,
            gpu_model: None,
            priority: priority.map(str::to_string),
            gang: None,
            regions: Vec::new(),
            allow_spread: false,
            burst_allowed: false,
            idempotency_key: None,
            env: Default::default(),
            max_runtime_s: None,
            image: None,
            checkpointable: None,
            checkpoint_interval_s: None,
            checkpoint_signal: None,
        };
        let fx = self
            .apply(
                Command::Submit(req, crate::auth::Identity::anonymous(), reply),
                now,
            )
            .await;
        fx.submitted.first().expect("accepted").0
    }

    async fn report(&mut self, conn: u64, id: u64, phase: pb::Phase, now: u64) {
        let epoch = self.inner.workloads[&id].epoch;
        self.apply(
            Command::Status {
                cluster: "c1".into(),
                conn,
                status: pb::WorkloadStatus {
                    workload_id: id,
                    epoch,
                    phase: phase as i32,
                    ..Default::default()
                },
            },
            now,
        )
        .await;
    }

    async fn cancel(&mut self, id: u64, now: u64) -> (Effects, axle_proto::api::WorkloadView) {
        let (reply, mut answer) = oneshot::channel();
        let mut fx = self
            .apply(
                Command::Cancel(id, crate::auth::Identity::anonymous(), reply),
                now,
            )
            .await;
        for after in std::mem::take(&mut fx.after) {
            after();
        }
        let view = answer.try_recv().expect("answered").expect("cancelled");
        (fx, view)
    }

    async fn tick(&mut self, now: u64) -> Effects {
        self.apply(Command::Tick, now).await
    }

    fn state(&self, id: u64) -> WState {
        self.inner.workloads[&id].state
    }

    fn spoke(&self) -> &'static str {
        self.inner.clusters["c1"].session.name()
    }
}

fn kinds(fx: &Effects) -> Vec<&'static str> {
    fx.msgs
        .iter()
        .map(|(_, m)| match &m.msg {
            Some(pb::hub_message::Msg::Registered(_)) => "Registered",
            Some(pb::hub_message::Msg::Assign(_)) => "Assign",
            Some(pb::hub_message::Msg::Stop(_)) => "Stop",
            Some(pb::hub_message::Msg::HeartbeatAck(_)) => "Ack",
            _ => "other",
        })
        .collect()
}

#[tokio::test]
async fn register_sends_nothing_before_the_commit_and_registered_first() {
    // Observed: `Register` was answered before its commit.
    let mut core = Core::new().await;
    let (mut rx, fx) = core.register(1, T0).await;
    assert!(rx.try_recv().is_err(), "nothing sent during the batch");
    assert_eq!(kinds(&fx)[0], "Registered");
    assert_eq!(core.spoke(), "Ready");
}

#[tokio::test]
async fn a_lost_spokes_work_is_released_only_after_lost_timeout_grace_and_margin() {
    let mut core = Core::new().await;
    let _rx = core.register(1, T0).await;
    let id = core.submit(1.0, T0).await;
    assert_eq!(core.state(id), WState::Placed);
    core.report(1, id, pb::Phase::Started, T0).await;
    assert_eq!(core.state(id), WState::Running);

    core.tick(T0 + LOST_MS - 1).await;
    assert_eq!(core.spoke(), "Ready");
    core.tick(T0 + LOST_MS).await;
    assert_eq!(core.spoke(), "Lost");
    // The spoke fences itself and gives the workload its grace period:
    // until then the hub must not run it elsewhere.
    let release = T0 + LOST_MS + GRACE_MS + FENCE_MARGIN_MS;
    core.tick(release - 1).await;
    assert_eq!(core.state(id), WState::Running);
    core.tick(release).await;
    assert_eq!(core.state(id), WState::Pending);
    let w = &core.inner.workloads[&id];
    assert!(w.placement.is_none());
    assert!(
        w.history.last().unwrap().reason.contains("spoke c1 lost"),
        "{:?}",
        w.history.last()
    );
}

#[tokio::test]
async fn a_heartbeat_on_the_open_session_brings_a_lost_spoke_back() {
    let mut core = Core::new().await;
    let _rx = core.register(1, T0).await;
    core.tick(T0 + LOST_MS).await;
    assert_eq!(core.spoke(), "Lost");
    let id = core.submit(1.0, T0 + LOST_MS).await;
    assert_eq!(
        core.state(id),
        WState::Pending,
        "nothing goes to a lost spoke"
    );
    let fx = core
        .apply(
            Command::Heartbeat {
                cluster: "c1".into(),
                conn: 1,
                heartbeat: pb::Heartbeat::default(),
            },
            T0 + LOST_MS + 1,
        )
        .await;
    assert_eq!(core.spoke(), "Ready");
    assert_eq!(core.state(id), WState::Placed);
    assert!(kinds(&fx).contains(&"Assign"));
}

#[tokio::test]
async fn a_replaced_session_can_neither_disconnect_nor_report_for_the_cluster() {
    let mut core = Core::new().await;
    let _old = core.register(1, T0).await;
    let id = core.submit(1.0, T0).await;
    let _new = core.register(2, T0 + 1).await;
    core.apply(
        Command::Disconnected {
            cluster: "c1".into(),
            conn: 1,
        },
        T0 + 2,
    )
    .await;
    assert_eq!(
        core.spoke(),
        "Ready",
        "the old stream ending changes nothing"
    );
    core.report(1, id, pb::Phase::Succeeded, T0 + 3).await;
    assert_eq!(
        core.state(id),
        WState::Placed,
        "the old session's report is ignored"
    );
    core.report(2, id, pb::Phase::Started, T0 + 4).await;
    assert_eq!(core.state(id), WState::Running);
}

#[tokio::test]
async fn a_disconnected_spoke_takes_no_work_and_is_lost_after_the_timeout() {
    let mut core = Core::new().await;
    let _rx = core.register(1, T0).await;
    core.apply(
        Command::Disconnected {
            cluster: "c1".into(),
            conn: 1,
        },
        T0 + 1,
    )
    .await;
    assert_eq!(core.spoke(), "Disconnected");
    let id = core.submit(1.0, T0 + 2).await;
    assert_eq!(core.state(id), WState::Pending);
    core.tick(T0 + LOST_MS).await;
    assert_eq!(core.spoke(), "Lost");
}

#[tokio::test]
async fn finished_workloads_are_deleted_after_retain_finished_hours_with_their_logs() {
    let mut core = Core::new().await;
    let _rx = core.register(1, T0).await;
    let id = core.submit(1.0, T0).await;
    core.report(1, id, pb::Phase::Started, T0).await;
    let done_at = T0 + 1000;
    // Keep the spoke alive through the window.
    core.report(1, id, pb::Phase::Succeeded, done_at).await;
    assert_eq!(core.state(id), WState::Succeeded);
    let hour = 3_600_000;
    let fx = core.tick(done_at + hour - 1).await;
    assert!(
        core.inner.workloads.contains_key(&id),
        "kept inside the window"
    );
    assert!(fx.forget_logs.is_empty());
    let fx = core.tick(done_at + hour).await;
    assert!(!core.inner.workloads.contains_key(&id), "deleted after it");
    assert_eq!(fx.forget_logs, vec![id]);
    assert!(
        core.store
            .get(&crate::records::workload_key(id))
            .await
            .unwrap()
            .is_none(),
        "and from the store"
    );
}

#[tokio::test]
async fn events_are_deleted_after_retain_events_days_oldest_first() {
    let mut core = Core::new().await;
    let day = 24 * 3_600_000;
    core.submit(1.0, T0).await;
    core.submit(1.0, T0).await;
    core.submit(1.0, T0 + day / 2).await;
    let before = core
        .store
        .range(crate::records::EVENTS)
        .await
        .unwrap()
        .len();
    assert_eq!(before, 3, "three submits");
    let gone = core.retain(&mut Effects::default(), T0 + day - 1).await;
    assert_eq!(gone.events, 0);
    // Past the first day: the events of T0 go, the later submit's stays.
    let mut fx = Effects::default();
    let gone = core.retain(&mut fx, T0 + day).await;
    assert_eq!(gone.events, 2, "the two submits of the first day");
    core.commit(fx).await;
    let left: Vec<u64> = core
        .store
        .range(crate::records::EVENTS)
        .await
        .unwrap()
        .iter()
        .map(|kv| {
            serde_json::from_slice::<crate::records::EventRecord>(&kv.value)
                .unwrap()
                .at_ms
        })
        .collect();
    assert!(left.iter().all(|&at| at >= T0 + day / 2), "{left:?}");
    assert!(!left.is_empty());
}

#[tokio::test]
async fn retention_deletes_a_bounded_batch_per_tick() {
    let mut core = Core::new().await;
    let id = core.submit(1.0, T0).await;
    let template = core.inner.workloads[&id].clone();
    let n = retention::RETENTION_BATCH as u64 + 5;
    for k in 0..n {
        let mut w = template.clone();
        w.id = 1000 + k;
        w.state = WState::Succeeded;
        w.finished_at_ms = Some(T0);
        core.inner.workloads.insert(w);
        core.inner.save(&mut Effects::default(), 1000 + k);
    }
    let later = T0 + 2 * 3_600_000;
    let mut fx = Effects::default();
    let gone = core.retain(&mut fx, later).await;
    assert_eq!(gone.workloads, retention::RETENTION_BATCH);
    assert_eq!(fx.forget_logs.len(), retention::RETENTION_BATCH);
    let gone = core.retain(&mut Effects::default(), later).await;
    assert_eq!(gone.workloads, 5, "the rest on the next tick");
    assert!(
        core.inner.workloads.contains_key(&id),
        "unfinished work stays"
    );
}

#[tokio::test]
// Holding the applier's lock across the reads is what this test checks.
#[allow(clippy::await_holding_lock)]
async fn reads_never_wait_for_the_applier() {
    // Observed: list calls held the applier's lock, so 32 pollers cut
    // submits from 378/s to 3.6/s.
    let (hub, _tasks, _dir) = start_hub(Clock::system()).await;
    let _applier = hub.lock();
    // With the applier's lock held, every read still answers.
    let (items, _) = hub.read().list(&ListParams::default()).unwrap();
    assert!(items.is_empty());
    assert_eq!(hub.read().cluster_views().len(), 2);
    assert!(!hub.read().team_views().is_empty());
    assert!(hub.events_since(0, 10, None).await.unwrap().len() == 1);
}

#[tokio::test(start_paused = true)]
async fn hub_time_is_tokios_so_spoke_loss_needs_no_real_waiting() {
    let (hub, _tasks, _dir) = start_hub(Clock::starting_at(T0)).await;
    let (tx, _rx) = mpsc::channel(64);
    let (reply, answer) = oneshot::channel();
    hub.send(Command::Register {
        peer: None,
        register: pb::Register {
            cluster: "c1".into(),
            nodes: vec![pb::Node {
                name: "n0".into(),
                gpus: vec![pb::Gpu {
                    index: 0,
                    model: "H100".into(),
                    memory_mb: 81920,
                    fractions_only: false,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        },
        conn: 1,
        tx,
        reply,
    })
    .await
    .unwrap();
    answer.await.unwrap().unwrap();
    let state = |hub: &Hub| hub.read().clusters[0].state;
    assert_eq!(state(&hub), "Ready");
    let real = std::time::Instant::now();
    // No heartbeats: 10 s of hub time later the spoke is lost. Tokio's
    // paused clock jumps to the next timer whenever the runtime idles, so
    // hub time runs ahead while the store's writer thread commits; the
    // loop is bounded in real time instead.
    while state(&hub) != "Lost" && real.elapsed() < std::time::Duration::from_secs(5) {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(state(&hub), "Lost");
    assert!(hub.now_ms() >= T0 + LOST_MS);
    assert!(real.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn core_errors_name_the_field_for_clients() {
    let e = HubError::bad("gang must be at least 1", Some("gang"));
    let api = e.to_api();
    assert_eq!(api.error, "gang must be at least 1");
    assert_eq!(api.field.as_deref(), Some("gang"));
    assert_eq!(
        HubError::NotFound("workload 9 not found".into())
            .to_api()
            .field,
        None
    );
}

#[tokio::test]
async fn run_time_adds_up_over_every_run_of_a_workload() {
    // Observed: describe showed only the last run's time after a preemption.
    let mut core = Core::new().await;
    let _rx = core.register(1, T0).await;
    let id = core.submit(1.0, T0).await;
    core.report(1, id, pb::Phase::Started, T0).await;
    // The spoke stops it without being asked (it shut down): re-queued,
    // and placed again by the same batch's cycle.
    core.report(1, id, pb::Phase::Stopped, T0 + 10_000).await;
    assert_eq!(core.inner.workloads[&id].run_ms, 10_000);
    assert_eq!(core.state(id), WState::Placed);
    core.report(1, id, pb::Phase::Started, T0 + 20_000).await;
    core.report(1, id, pb::Phase::Succeeded, T0 + 25_000).await;
    let w = &core.inner.workloads[&id];
    assert_eq!(w.state, WState::Succeeded);
    assert_eq!(w.run_ms, 15_000, "10 s + 5 s, not the 5 s of the last run");
}

#[tokio::test]
async fn ids_and_event_sequences_are_never_reused_after_retention() {
    // Found in review: with every workload retired, a restarted hub took
    // the next id from the highest one stored, handing out id 1 again.
    let mut core = Core::new().await;
    let _rx = core.register(1, T0).await;
    let id = core.submit(1.0, T0).await;
    core.report(1, id, pb::Phase::Started, T0).await;
    core.report(1, id, pb::Phase::Succeeded, T0 + 1).await;
    let next_event = core.inner.next_event;
    core.tick(T0 + 3 * 3_600_000).await;
    assert!(!core.inner.workloads.contains_key(&id));
    let policy = core.inner.policy.clone();
    let again = restore::load(core.store.as_ref(), policy, T0 + 3 * 3_600_000)
        .await
        .unwrap();
    assert_eq!(again.next_id, id + 1, "id {id} is not handed out again");
    assert!(again.next_event >= next_event);
}

#[tokio::test]
async fn team_views_count_running_work_per_gpu_class() {
    // Observed: `get teams` repeated the team's totals on every class row.
    let mut core = Core::new().await;
    let _rx = core.register(1, T0).await;
    let id = core.submit(1.0, T0).await;
    core.report(1, id, pb::Phase::Started, T0).await;
    core.submit(1.0, T0).await;
    core.submit(1.0, T0).await; // over the limit of 2: waits
    let teams = core.inner.read_view().team_views();
    let vision = teams.iter().find(|t| t.name == "vision").unwrap();
    assert_eq!((vision.running, vision.pending), (2, 1));
    let h100 = vision
        .quotas
        .iter()
        .find(|q| q.gpu_class == "H100")
        .unwrap();
    assert_eq!(h100.running, 2);
    // Observed: the team's whole queue showed on its first class row; the
    // waiting workload names no model, so it is counted apart.
    assert_eq!((h100.pending, vision.pending_any_model), (0, 1));
}

fn stops(fx: &Effects) -> Vec<(u64, pb::StopReason)> {
    fx.msgs
        .iter()
        .filter_map(|(_, m)| match &m.msg {
            Some(pb::hub_message::Msg::Stop(s)) => Some((s.workload_id, s.reason())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_cancelled_running_workload_is_cancelling_and_keeps_its_gpus_until_the_stop_is_confirmed()
{
    let mut core = Core::new().await;
    let _rx = core.register(1, T0).await;
    let id = core.submit(1.0, T0).await;
    core.report(1, id, pb::Phase::Started, T0).await;
    let (fx, view) = core.cancel(id, T0 + 1_000).await;
    assert_eq!(core.state(id), WState::Cancelling);
    assert_eq!(view.state, "Cancelling");
    assert_eq!(stops(&fx), [(id, pb::StopReason::Cancelled)]);
    // Asked again: nothing new is sent.
    let (fx, _) = core.cancel(id, T0 + 1_500).await;
    assert!(stops(&fx).is_empty());
    // Its GPU is still taken: a 2-GPU workload waits.
    let big = core.submit(2.0, T0 + 2_000).await;
    assert_eq!(core.state(big), WState::Pending);
    core.report(1, id, pb::Phase::Stopped, T0 + 3_000).await;
    assert_eq!(core.state(id), WState::Cancelled);
    assert!(core.inner.workloads[&id].stopping.is_none());
    assert_eq!(core.state(big), WState::Placed, "placed by the same batch");
}

#[tokio::test]
async fn a_preempted_workload_is_preempting_until_its_stop_is_confirmed_then_pending() {
    let mut core = Core::new().await;
    let _rx = core.register(1, T0).await;
    let dev = core.submit_at(2.0, Some("development"), T0).await;
    core.report(1, dev, pb::Phase::Started, T0).await;
    let prod = core.submit_at(2.0, Some("production"), T0 + 1_000).await;
    assert_eq!(core.state(dev), WState::Preempting);
    assert_eq!(
        core.state(prod),
        WState::Placed,
        "the GPUs are the preemptor's at once"
    );
    let view = core.inner.view(dev).expect("view");
    assert_eq!(view.state, "Preempting");
    assert!(
        view.pending_reason
            .as_deref()
            .is_some_and(|r| r.contains("stop on c1 to be confirmed")),
        "{view:?}"
    );
    // A start report of the preempted epoch is no reason to run it.
    core.report(1, dev, pb::Phase::Started, T0 + 1_500).await;
    assert_eq!(core.state(dev), WState::Preempting);
    core.report(1, dev, pb::Phase::Stopped, T0 + 2_000).await;
    let w = &core.inner.workloads[&dev];
    assert_eq!(w.state, WState::Pending);
    assert!(w.stopping.is_none());
    let to: Vec<WState> = w.history.iter().map(|h| h.to).collect();
    assert_eq!(
        to,
        [
            WState::Placed,
            WState::Running,
            WState::Preempting,
            WState::Pending
        ]
    );
}

#[tokio::test]
async fn a_workload_cancelled_while_preempting_is_cancelled_when_the_stop_is_confirmed() {
    let mut core = Core::new().await;
    let _rx = core.register(1, T0).await;
    let dev = core.submit_at(2.0, Some("development"), T0).await;
    core.report(1, dev, pb::Phase::Started, T0).await;
    let epoch = core.inner.workloads[&dev].epoch;
    let prod = core.submit_at(2.0, Some("production"), T0 + 1_000).await;
    let (fx, _) = core.cancel(dev, T0 + 1_500).await;
    assert_eq!(core.state(dev), WState::Cancelling);
    assert!(stops(&fx).is_empty(), "the preemption's stop is on its way");
    // The rebuild (policy or inventory change) keeps it out of the
    // scheduler: its GPUs are the preemptor's.
    let mut fx = Effects::default();
    core.inner.rebuild(&mut fx, T0 + 1_600);
    core.commit(fx).await;
    assert_eq!(core.state(prod), WState::Placed);
    core.apply(
        Command::Status {
            cluster: "c1".into(),
            conn: 1,
            status: pb::WorkloadStatus {
                workload_id: dev,
                epoch,
                phase: pb::Phase::Stopped as i32,
                ..Default::default()
            },
        },
        T0 + 2_000,
    )
    .await;
    assert_eq!(core.state(dev), WState::Cancelled);
}

#[tokio::test]
async fn a_lost_spoke_ends_the_stops_it_was_sent() {
    let mut core = Core::new().await;
    let _rx = core.register(1, T0).await;
    let dev = core.submit_at(1.0, Some("development"), T0).await;
    let other = core.submit_at(1.0, Some("development"), T0).await;
    core.report(1, dev, pb::Phase::Started, T0).await;
    core.report(1, other, pb::Phase::Started, T0).await;
    core.submit_at(1.0, Some("production"), T0).await;
    let preempted = [dev, other]
        .into_iter()
        .find(|id| core.state(*id) == WState::Preempting)
        .expect("one was preempted");
    let cancelled = if preempted == dev { other } else { dev };
    core.cancel(cancelled, T0).await;
    assert_eq!(core.state(cancelled), WState::Cancelling);
    // Silent past lost + grace + margin: both stops are as good as done.
    core.tick(T0 + LOST_MS + 1).await;
    core.tick(T0 + LOST_MS + GRACE_MS + 10_000).await;
    assert_eq!(core.state(cancelled), WState::Cancelled);
    let w = &core.inner.workloads[&preempted];
    assert!(
        matches!(w.state, WState::Pending | WState::Placed),
        "re-queued: {:?}",
        w.state
    );
    assert!(w.history.iter().any(|h| h.reason.contains("spoke c1 lost")));
}

#[tokio::test]
async fn version_1_records_upgrade_their_stop_into_the_state() {
    // Version 1 kept an unconfirmed stop beside the state.
    let mut core = Core::new().await;
    let id = core.submit(1.0, T0).await;
    let record = serde_json::to_value(&core.inner.workloads[&id]).unwrap();
    let v1 = |state: &str, cancel: bool| {
        let mut w = record.clone();
        w["v"] = 1.into();
        w["state"] = state.into();
        w["stopping"] = serde_json::json!({"cluster": "c1", "epoch": 1, "cancel": cancel});
        serde_json::from_value::<crate::records::WorkloadRecord>(w)
            .unwrap()
            .upgrade()
    };
    let w = v1("Pending", false);
    assert_eq!(
        (w.state, w.v),
        (WState::Preempting, crate::records::RECORD_VERSION)
    );
    assert_eq!(v1("Running", true).state, WState::Cancelling);
    assert_eq!(v1("Pending", true).state, WState::Cancelling);
    let done = v1("Succeeded", false);
    assert_eq!(done.state, WState::Succeeded);
    assert!(done.stopping.is_none());
    // Version 2 never writes the old flag.
    let text = serde_json::to_string(&v1("Running", true)).unwrap();
    assert!(!text.contains("\"cancel\""), "{text}");
}

#[tokio::test]
async fn an_on_prem_spokes_interruption_notice_changes_nothing() {
    // Only a burst instance can be taken back by its provider: an on-prem
    // spoke (or one that lies) saying so stops nothing.
    let mut core = Core::new().await;
    let _rx = core.register(1, T0).await;
    let id = core.submit(1.0, T0).await;
    core.report(1, id, pb::Phase::Started, T0).await;
    let fx = core
        .apply(
            Command::Heartbeat {
                cluster: "c1".into(),
                conn: 1,
                heartbeat: pb::Heartbeat {
                    interruption: Some(pb::InterruptionNotice {
                        action: "terminate".into(),
                        at_unix_ms: T0 + 120_000,
                    }),
                    ..Default::default()
                },
            },
            T0 + 1_000,
        )
        .await;
    assert_eq!(core.state(id), WState::Running);
    assert!(stops(&fx).is_empty(), "{:?}", kinds(&fx));
    assert_eq!(core.spoke(), "Ready");
}

#[tokio::test]
async fn finished_runs_give_the_next_run_of_their_kind_an_expected_runtime() {
    // Observed: ETA was always "no estimate" unless --max-runtime was set.
    let mut core = Core::new().await;
    let _rx = core.register(1, T0).await;
    let mut t = T0;
    for i in 1..=3 {
        let id = core
            .submit_named(Some(&format!("sweep-{i}")), 1.0, None, t)
            .await;
        core.report(1, id, pb::Phase::Started, t).await;
        t += 600_000;
        core.report(1, id, pb::Phase::Succeeded, t).await;
    }
    let next = core.submit_named(Some("sweep-4"), 1.0, None, t).await;
    let spec = super::snapshot::spec_of(&core.inner.workloads[&next], &core.inner.runtimes);
    let e = spec.expected_runtime.expect("an expected runtime");
    assert_eq!(e.basis, "3 earlier runs of `sweep-*`");
    assert!((540..=660).contains(&e.seconds), "{e:?}");
    // A restarted hub rebuilds the histograms from what it retained.
    let policy = core.inner.policy.clone();
    let again = restore::load(core.store.as_ref(), policy, t).await.unwrap();
    let e = again.runtimes.estimate("vision", "development", "sweep-9");
    assert_eq!(
        e.map(|e| e.basis),
        Some("3 earlier runs of `sweep-*`".into())
    );
}

/// A node of eight H100.
fn h100_node(name: String) -> pb::Node {
    pb::Node {
        name,
        gpus: (0..8)
            .map(|index| pb::Gpu {
                index,
                model: "H100".into(),
                memory_mb: 81_559,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// A registration of cluster `open` (no nodes declared) by spoke
/// `instance`, applied and committed.
async fn register_open(core: &mut Core, nodes: Vec<pb::Node>, instance: &str, conn: u64, now: u64) {
    let (tx, _rx) = mpsc::channel(64);
    let (reply, _answer) = oneshot::channel();
    let register = pb::Register {
        cluster: "open".into(),
        nodes,
        instance_id: instance.into(),
        ..Default::default()
    };
    core.apply(
        Command::Register {
            register,
            peer: None,
            conn,
            tx,
            reply,
        },
        now,
    )
    .await;
}

/// A registration of cluster `open` with `nodes` nodes of eight H100,
/// named like a large fleet's.
async fn register_big(core: &mut Core, nodes: usize, conn: u64, now: u64) {
    let nodes = (0..nodes)
        .map(|i| {
            h100_node(format!(
                "gpu-node-{i:05}.rack-{:03}.example.internal",
                i / 32
            ))
        })
        .collect();
    register_open(core, nodes, "big-spoke", conn, now).await;
}

#[tokio::test]
async fn ten_thousand_nodes_are_stored_in_pages_and_restored() {
    // Observed: 3,000 nodes × 8 H100 made one cluster record of 1,720,992
    // bytes, over the store's limit: the hub exited, and again at every
    // restart as the spoke reconnected. `commit` fails the same way here.
    let mut core = Core::new().await;
    register_big(&mut core, 10_000, 7, T0).await;
    assert_eq!(core.inner.clusters["open"].nodes.len(), 10_000);
    let pages = core.inner.clusters["open"].node_pages;
    assert!(pages > 1, "{pages} pages");
    for kv in core
        .store
        .range(crate::records::CLUSTER_NODES)
        .await
        .unwrap()
    {
        assert!(kv.value.len() <= crate::records::NODE_PAGE_BYTES + 32 * 1024);
    }
    let restored = restore::load(core.store.as_ref(), Arc::new(policy()), T0)
        .await
        .expect("restores");
    let big = &restored.clusters["open"];
    assert_eq!(big.nodes.len(), 10_000);
    assert_eq!(
        big.nodes.iter().map(|n| n.gpus.len()).sum::<usize>(),
        80_000
    );
    assert_eq!(
        big.nodes[9_999].name,
        core.inner.clusters["open"].nodes[9_999].name
    );
    // Fewer nodes at the next registration: the pages beyond are deleted.
    register_big(&mut core, 3, 7, T0 + 1_000).await;
    let left = core
        .store
        .range(crate::records::CLUSTER_NODES)
        .await
        .unwrap();
    assert_eq!(left.len(), 1, "one page for three nodes");
    let restored = restore::load(core.store.as_ref(), Arc::new(policy()), T0)
        .await
        .expect("restores");
    assert_eq!(restored.clusters["open"].nodes.len(), 3);
    // One more than Settings maxNodesPerCluster (10,000 by default) is
    // refused with a reason and changes nothing.
    register_big(&mut core, 10_001, 8, T0 + 2_000).await;
    assert_eq!(core.inner.clusters["open"].nodes.len(), 3);
}

#[tokio::test]
async fn a_spoke_reported_topology_domain_reaches_the_scheduler_and_survives_a_restart() {
    // Observed: only a Cluster document could name a node's domain; what
    // a spoke reported was dropped, so gangs on reported clusters never
    // kept to one rack or NVLink block.
    let mut core = Core::new().await;
    let node = |name: &str, topology: &str| pb::Node {
        topology: topology.into(),
        ..h100_node(name.into())
    };
    let nodes = vec![node("a", "rack-1"), node("b", ""), node("c", "nvl-7")];
    register_open(&mut core, nodes, "topo-spoke", 9, T0).await;
    let domains = |inv: &axle_scheduler::Inventory| -> Vec<(String, Option<String>)> {
        inv.clusters
            .iter()
            .filter(|c| c.name == "open")
            .flat_map(|c| c.nodes.iter())
            .map(|n| (n.name.clone(), n.topology.clone()))
            .collect()
    };
    let want = vec![
        ("a".to_string(), Some("rack-1".to_string())),
        ("b".to_string(), None),
        ("c".to_string(), Some("nvl-7".to_string())),
    ];
    assert_eq!(domains(&core.inner.inventory()), want);
    let restored = restore::load(core.store.as_ref(), Arc::new(policy()), T0)
        .await
        .expect("restores");
    assert_eq!(domains(&restored.inventory()), want);
}
