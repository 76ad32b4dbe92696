//! Test support: a small in-test hub that serves `SpokeService` on loopback,
//! records what spokes send and lets a test push hub messages; plus helpers
//! to start an in-process spoke and build assignments.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axle_proto::pb;
use axle_proto::pb::spoke_service_server::{SpokeService, SpokeServiceServer};
use axle_spoke_agent::{GpuSpec, NodeSpec, RunOptions, SpokeConfig};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::Stream;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// How long a test waits for something the spoke should do promptly.
pub const WAIT: Duration = Duration::from_secs(10);
/// Heartbeat interval the test hub asks for: fast, so tests see beats quickly.
pub const TEST_HEARTBEAT_MS: u64 = 100;

#[derive(Default)]
struct State {
    messages: Mutex<Vec<pb::SpokeMessage>>,
    notify: Notify,
    next_session: Mutex<u64>,
    sessions: Mutex<BTreeMap<u64, mpsc::Sender<Result<pb::HubMessage, Status>>>>,
    stopped: Mutex<bool>,
    /// `Registered.fence_after_ms` to announce (0: no self-fencing). This
    /// test hub never acks heartbeats, so a non-zero value makes the spoke fence.
    fence_after_ms: Mutex<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    fn record(&self, msg: pb::SpokeMessage) {
        lock(&self.messages).push(msg);
        self.notify.notify_waiters();
    }

    fn sender(&self, id: u64) -> Option<mpsc::Sender<Result<pb::HubMessage, Status>>> {
        lock(&self.sessions).get(&id).cloned()
    }
}

#[derive(Clone)]
struct Svc {
    state: Arc<State>,
}

type HubStream = Pin<Box<dyn Stream<Item = Result<pb::HubMessage, Status>> + Send>>;

#[tonic::async_trait]
impl SpokeService for Svc {
    type SessionStream = HubStream;

    async fn join(
        &self,
        _: Request<pb::JoinRequest>,
    ) -> Result<Response<pb::SpokeCertificate>, Status> {
        Err(Status::unimplemented(
            "this test hub admits spokes by token",
        ))
    }

    async fn renew(
        &self,
        _: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::SpokeCertificate>, Status> {
        Err(Status::unimplemented(
            "this test hub admits spokes by token",
        ))
    }

    async fn session(
        &self,
        request: Request<Streaming<pb::SpokeMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        if *lock(&self.state.stopped) {
            return Err(Status::unavailable("hub stopping"));
        }
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let id = {
            let mut next = lock(&self.state.next_session);
            *next += 1;
            *next
        };
        lock(&self.state.sessions).insert(id, tx);
        let state = self.state.clone();
        tokio::spawn(async move {
            while let Ok(Some(msg)) = inbound.message().await {
                let register = match &msg.msg {
                    Some(pb::spoke_message::Msg::Register(r)) => Some(r.cluster.clone()),
                    _ => None,
                };
                state.record(msg);
                if let Some(cluster) = register
                    && let Some(tx) = state.sender(id)
                {
                    let reply = pb::HubMessage {
                        msg: Some(pb::hub_message::Msg::Registered(pb::Registered {
                            cluster,
                            heartbeat_interval_ms: TEST_HEARTBEAT_MS,
                            fence_after_ms: *lock(&state.fence_after_ms),
                            ..Default::default()
                        })),
                    };
                    let _ = tx.send(Ok(reply)).await;
                }
            }
            // The spoke's side ended: end ours, as a real hub does.
            lock(&state.sessions).remove(&id);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

pub struct TestHub {
    pub addr: SocketAddr,
    state: Arc<State>,
    shutdown: Option<oneshot::Sender<()>>,
    server: JoinHandle<()>,
}

impl TestHub {
    pub async fn start() -> TestHub {
        Self::start_on("127.0.0.1:0".parse().expect("addr")).await
    }

    pub async fn start_on(addr: SocketAddr) -> TestHub {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind test hub");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(State::default());
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let svc = Svc {
            state: state.clone(),
        };
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(SpokeServiceServer::new(svc))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = shutdown_rx.await;
                })
                .await;
        });
        TestHub {
            addr,
            state,
            shutdown: Some(shutdown_tx),
            server,
        }
    }

    /// Announce self-fencing after `ms` without an ack in the next Registered.
    pub fn set_fence_after_ms(&self, ms: u64) {
        *lock(&self.state.fence_after_ms) = ms;
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Ends every session and the server, and frees the port.
    pub async fn stop(mut self) {
        *lock(&self.state.stopped) = true;
        lock(&self.state.sessions).clear();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if tokio::time::timeout(Duration::from_secs(5), &mut self.server)
            .await
            .is_err()
        {
            self.server.abort();
            let _ = (&mut self.server).await;
        }
    }

    /// Sends to the newest session, waiting for one to exist.
    pub async fn send(&self, msg: pb::hub_message::Msg) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let newest = lock(&self.state.sessions)
                .iter()
                .next_back()
                .map(|(_, tx)| tx.clone());
            if let Some(tx) = newest {
                tx.send(Ok(pb::HubMessage { msg: Some(msg) }))
                    .await
                    .expect("session open");
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no spoke session to send to"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn assign(&self, assign: pb::Assign) {
        self.send(pb::hub_message::Msg::Assign(assign)).await;
    }

    pub async fn stop_workload(
        &self,
        workload_id: u64,
        epoch: u64,
        reason: pb::StopReason,
        grace_period_s: u64,
    ) {
        self.send(pb::hub_message::Msg::Stop(pb::Stop {
            workload_id,
            epoch,
            reason: reason as i32,
            grace_period_s,
            message: "test".into(),
        }))
        .await;
    }

    pub fn messages(&self) -> Vec<pb::SpokeMessage> {
        lock(&self.state.messages).clone()
    }

    pub fn statuses(&self) -> Vec<pb::WorkloadStatus> {
        self.messages()
            .into_iter()
            .filter_map(|m| match m.msg {
                Some(pb::spoke_message::Msg::Status(s)) => Some(s),
                _ => None,
            })
            .collect()
    }

    pub fn log_bytes(&self, workload_id: u64, epoch: u64) -> Vec<u8> {
        let mut chunks: Vec<pb::LogChunk> = self
            .messages()
            .into_iter()
            .filter_map(|m| match m.msg {
                Some(pb::spoke_message::Msg::Log(c))
                    if c.workload_id == workload_id && c.epoch == epoch =>
                {
                    Some(c)
                }
                _ => None,
            })
            .collect();
        chunks.sort_by_key(|c| c.offset);
        let mut out = Vec::new();
        for c in chunks {
            assert_eq!(
                c.offset as usize,
                out.len(),
                "log chunks must be contiguous"
            );
            out.extend_from_slice(&c.data);
        }
        out
    }

    /// Waits until `pick` finds something among everything recorded.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        mut pick: impl FnMut(&[pb::SpokeMessage]) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let notified = self.state.notify.notified();
            if let Some(found) = pick(&lock(&self.state.messages)) {
                return found;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let statuses: Vec<String> =
                    self.statuses().iter().map(|s| format!("{s:?}")).collect();
                panic!(
                    "timed out waiting for {what}; statuses so far:\n{}",
                    statuses.join("\n")
                );
            }
        }
    }

    pub async fn wait_register(&self) -> pb::Register {
        self.wait_for("Register", |msgs| {
            msgs.iter().find_map(|m| match &m.msg {
                Some(pb::spoke_message::Msg::Register(r)) => Some(r.clone()),
                _ => None,
            })
        })
        .await
    }

    pub async fn wait_status(
        &self,
        workload_id: u64,
        epoch: u64,
        phase: pb::Phase,
    ) -> pb::WorkloadStatus {
        self.wait_for(
            &format!("{phase:?} for workload {workload_id} epoch {epoch}"),
            |msgs| {
                msgs.iter().find_map(|m| match &m.msg {
                    Some(pb::spoke_message::Msg::Status(s))
                        if s.workload_id == workload_id
                            && s.epoch == epoch
                            && s.phase == phase as i32 =>
                    {
                        Some(s.clone())
                    }
                    _ => None,
                })
            },
        )
        .await
    }

    /// Position of a status among all recorded messages, for ordering checks.
    pub fn position(&self, workload_id: u64, epoch: u64, phase: pb::Phase) -> Option<usize> {
        self.messages().iter().position(|m| {
            matches!(&m.msg, Some(pb::spoke_message::Msg::Status(s))
                if s.workload_id == workload_id && s.epoch == epoch && s.phase == phase as i32)
        })
    }
}

pub const NODE: &str = "node-a";

pub fn nodes() -> Vec<NodeSpec> {
    vec![NodeSpec {
        name: NODE.into(),
        gpus: (0..4)
            .map(|index| GpuSpec::whole(index, "H100", 81559))
            .collect(),
        whole_only: false,
        topology: String::new(),
    }]
}

/// The `axle-spoke` binary runs the shim for in-process spokes too: a test
/// binary's own `main` does not know `__axle_shim`.
pub fn shim_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_axle-spoke"))
}

pub struct Spoke {
    pub data_dir: tempfile::TempDir,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

pub fn start_spoke(hub: &TestHub) -> Spoke {
    let data_dir = tempfile::tempdir().expect("tempdir");
    let config = SpokeConfig {
        hub_url: hub.url(),
        cluster: "test-cluster".into(),
        region: "eu-test".into(),
        labels: BTreeMap::from([("bu".to_string(), "research".to_string())]),
        nodes: nodes(),
        data_dir: data_dir.path().to_path_buf(),
        token: Some("s3cret".into()),
        hub_ca_pem: None,
        join_token: None,
        spot_notices: None,
        driver: Default::default(),
    };
    let (tx, rx) = oneshot::channel::<()>();
    let options = RunOptions {
        shim_exe: Some(shim_exe()),
    };
    let task = tokio::spawn(axle_spoke_agent::run_with(config, options, async {
        let _ = rx.await;
    }));
    Spoke {
        data_dir,
        shutdown: Some(tx),
        task,
    }
}

impl Spoke {
    pub fn path(&self) -> &Path {
        self.data_dir.path()
    }

    pub fn work_file(&self, workload_id: u64, epoch: u64, name: &str) -> PathBuf {
        self.path()
            .join("work")
            .join(format!("{workload_id}-{epoch}"))
            .join(name)
    }

    pub fn log_file(&self, workload_id: u64, epoch: u64) -> PathBuf {
        self.path()
            .join("logs")
            .join(format!("{workload_id}-{epoch}.log"))
    }

    /// Triggers shutdown and waits for `run` to return.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("spoke shuts down in time")
            .expect("spoke task joins")
    }
}

/// An assignment of `sh -c script` with one replica per entry of `replicas`
/// (each a list of (gpu index, milli) on [`NODE`]).
pub fn assign(
    workload_id: u64,
    epoch: u64,
    script: &str,
    replicas: &[&[(u32, u32)]],
    grace_period_s: u64,
) -> pb::Assign {
    pb::Assign {
        workload_id,
        epoch,
        name: format!("w{workload_id}"),
        team: "ml".into(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: [("FOO".to_string(), "bar".to_string())]
            .into_iter()
            .collect(),
        replicas: replicas
            .iter()
            .map(|shares| pb::Replica {
                node: NODE.into(),
                gpus: shares
                    .iter()
                    .map(|&(index, milli)| pb::GpuShare { index, milli })
                    .collect(),
            })
            .collect(),
        grace_period_s,
        max_runtime_s: 0,
        checkpoint_signal: String::new(),
        restart_count: epoch.saturating_sub(1) as u32,
        image: String::new(),
        priority: "training".into(),
    }
}

/// Waits for a file a workload writes, then returns its trimmed content.
pub async fn wait_file(path: &Path) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text.trim().to_string();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a process is gone (no /proc entry, or only a zombie left for a
/// parent that is not ours to reap).
pub fn process_gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
    }
}

pub async fn wait_gone(pid: &str, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while !process_gone(pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "process {pid} still alive after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
