//! A Kubernetes API test server on loopback (plain HTTP) with the semantics
//! the spoke's kubernetes driver relies on: CRUD with optimistic
//! concurrency, list/watch with resourceVersions, bookmarks and 410 Expired,
//! label and field selectors, a Job controller, ResourceQuota admission and
//! pod logs, all with k8s-openapi types on the wire.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let server = axle_kube_testserver::KubeTestServer::start().await;
//! let cluster = server.state();
//! // point a kube::Client at server.url(), then drive pods with
//! // cluster.set_pod_running(..) / set_pod_succeeded(..)
//! server.stop().await;
//! # Ok(()) }
//! ```
//!
//! Code map: `kinds` (the stored types), `store` (objects, resourceVersion,
//! history), `api` (verbs), `admission` (defaults, validation, quota),
//! `controller` (Job controller, quota status, events), `kubelet` (pod
//! status transitions), `selectors`, `watch`, `logs`, `http` (routing),
//! `cluster` (the shared state and test controls).

#![warn(missing_docs)]

mod admission;
mod api;
mod cluster;
mod controller;
mod errors;
mod http;
mod kinds;
mod kubelet;
mod logs;
mod quantity;
mod scheduler;
mod selectors;
mod store;
mod watch;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use axum::http::Method;
pub use cluster::{Cluster, ClusterError, DeleteRecord};

/// How long `start_with` keeps retrying to bind an address that is still
/// in use (a server on it was just stopped and its socket is closing).
const BIND_RETRY_MS: u64 = 5_000;

/// How long `stop` waits for open connections to close before it gives up
/// waiting (they are broken on purpose, so this is only a backstop).
const STOP_WAIT_MS: u64 = 5_000;

/// How often the Job controller looks for passed `activeDeadlineSeconds`.
const DEADLINE_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// A running test API server. Dropping it stops it (without waiting).
pub struct KubeTestServer {
    addr: SocketAddr,
    cluster: Cluster,
    shutdown: tokio::sync::watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl KubeTestServer {
    /// Serves a fresh cluster on a free port of 127.0.0.1.
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub async fn start() -> KubeTestServer {
        KubeTestServer::start_with(Cluster::new(), SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await
    }

    /// Serves a fresh cluster on `addr` (to restart on a known port).
    ///
    /// # Panics
    /// If `addr` cannot be bound within a few seconds.
    pub async fn start_on(addr: SocketAddr) -> KubeTestServer {
        KubeTestServer::start_with(Cluster::new(), addr).await
    }

    /// Serves an existing cluster on `addr`: stop a server, wait, and start
    /// this with its `state()` and `addr()` to simulate an API server that
    /// went away and came back with its data.
    ///
    /// # Panics
    /// If `addr` cannot be bound within a few seconds.
    pub async fn start_with(cluster: Cluster, addr: SocketAddr) -> KubeTestServer {
        let listener = bind(addr).await;
        let addr = listener.local_addr().unwrap_or(addr);
        let (shutdown, stopped) = tokio::sync::watch::channel(false);
        let app = http::App {
            cluster: cluster.clone(),
            shutdown: stopped.clone(),
        };
        // The Job controller's timer: deadlines pass on their own.
        let timer = cluster.clone();
        let mut timer_stop = stopped.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(DEADLINE_CHECK_EVERY);
            loop {
                tokio::select! {
                    _ = tick.tick() => timer.sync_deadlines(),
                    _ = timer_stop.wait_for(|stopped| *stopped) => return,
                }
            }
        });
        let mut signal = stopped;
        let task = tokio::spawn(async move {
            let serve =
                axum::serve(listener, http::router(app)).with_graceful_shutdown(async move {
                    let _ = signal.wait_for(|stopped| *stopped).await;
                });
            if let Err(e) = serve.await {
                tracing::warn!("kube test server on {addr}: {e}");
            }
        });
        KubeTestServer {
            addr,
            cluster,
            shutdown,
            task: Some(task),
        }
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig whose current context points at this server (no
    /// credentials: the test server has no authentication).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: axle-test\n  cluster:\n    server: {}\n\
             users:\n- name: axle-test\n  user: {{}}\ncontexts:\n- name: axle-test\n  context:\n    cluster: axle-test\n    user: axle-test\n\
             current-context: axle-test\n",
            self.url()
        )
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The cluster this server serves (shared; it outlives the server).
    pub fn state(&self) -> Cluster {
        self.cluster.clone()
    }

    /// Stops serving: the listener closes and open watches and log streams
    /// break. The cluster's state stays in `state()`.
    pub async fn stop(mut self) {
        self.shutdown.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_millis(STOP_WAIT_MS), task).await;
        }
    }
}

impl Drop for KubeTestServer {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
    }
}

async fn bind(addr: SocketAddr) -> TcpListener {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(BIND_RETRY_MS);
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return listener,
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!("kube test server: binding {addr}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("kube test server: cannot bind {addr}: {e}"),
        }
    }
}
