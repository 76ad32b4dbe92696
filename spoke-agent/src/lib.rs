//! Axle spoke agent: registers one cluster with the hub over an outbound gRPC
//! stream, reports its GPU inventory and running workloads, and runs the
//! workloads the hub assigns through a [`driver::Driver`]: `local` (shimmed
//! child processes on this host) or `kubernetes` (Jobs).
//!
//! Entry points: [`run`] (the binary and the `axle-dev` stack),
//! [`maybe_run_shim`] (first thing in every `main` that hosts a spoke),
//! [`discover_gpus`] / [`parse_gpu_decl`] (inventory).

mod agent;
mod config;
pub mod driver;
mod event;
mod gpu_class;
pub mod identity;
pub mod lease;
mod logs;
mod outbox;
mod session;
pub mod spot;

use std::future::Future;
use std::path::PathBuf;

use anyhow::Context as _;
use tokio::sync::mpsc;

pub use agent::{DEFAULT_GRACE_PERIOD, DEFAULT_HEARTBEAT_INTERVAL, MAX_GRACE_PERIOD};
pub use config::{DriverConfig, GpuSpec, KubernetesConfig, NodeSpec, SpokeConfig};
pub use driver::local::GPU_WAIT_TIMEOUT;
pub use driver::local::gpu::{
    DiscoverError, GpuDeclError, build_nodes, discover_gpus, host_name, parse_gpu_decl,
    parse_nvidia_smi,
};
pub use driver::local::shim::{SHIM_ARG, maybe_run_shim};
pub use gpu_class::gpu_class;
pub use logs::{LOG_FLUSH_INTERVAL, MAX_LOG_CHUNK_BYTES};
pub use outbox::{MAX_OUTBOX_LOG_BYTES, RESEND_WINDOW};
pub use session::{INITIAL_BACKOFF, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, MAX_BACKOFF};

/// Hub messages (and session changes) waiting for the agent. When the agent
/// falls behind, the connection task stops reading the stream and HTTP/2 flow
/// control pushes back on the hub; 64 absorbs the burst of re-sent
/// assignments after a reconnect.
const INPUT_CHANNEL_CAPACITY: usize = 64;
/// Workload events (starts, log chunks, ends) waiting for the agent. Log
/// writers wait when it is full, which in turn slows the workloads' output
/// pipes rather than growing memory.
const EVENT_CHANNEL_CAPACITY: usize = 1024;

/// How long a workload's checkpoint directory outlives its last write when
/// the workload does not come back to this spoke: a week covers a long
/// queue behind higher priority work; after that a resumed run elsewhere
/// starts from zero anyway.
pub const CHECKPOINT_RETENTION: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Removes the checkpoint directories under `root` whose newest entry is
/// older than `retention`. Best effort: what cannot be read stays.
fn sweep_checkpoints(root: &std::path::Path, retention: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let now = std::time::SystemTime::now();
    for entry in entries.flatten() {
        let path = entry.path();
        let newest = std::iter::once(path.clone())
            .chain(
                std::fs::read_dir(&path)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            )
            .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .max();
        let stale = newest.is_some_and(|t| now.duration_since(t).is_ok_and(|age| age > retention));
        if stale {
            match std::fs::remove_dir_all(&path) {
                Ok(()) => tracing::info!("removed stale checkpoints {}", path.display()),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot remove stale checkpoints {}", path.display())
                }
            }
        }
    }
}

/// A Kubernetes client: the kubeconfig given, else in-cluster config or
/// the default kubeconfig (`kube::Config::infer`).
async fn kube_client(k: &KubernetesConfig) -> anyhow::Result<kube::Client> {
    let config = match &k.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes configuration (in-cluster, $KUBECONFIG or ~/.kube/config)")?,
    };
    kube::Client::try_from(config).context("cannot build the Kubernetes client")
}

/// Knobs of [`run_with`] that callers other than the `axle-spoke` binary need.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The executable that runs the shim, i.e. whose `main` calls
    /// [`maybe_run_shim`]. Default: the current executable, which is right
    /// for `axle-spoke` and `axle-dev`, but not for a test binary.
    pub shim_exe: Option<PathBuf>,
}

/// Runs the spoke until `shutdown` resolves: dials the hub (and redials
/// forever), runs assigned workloads, then stops them all (SIGTERM, grace,
/// SIGKILL) and returns. Errors only on bad configuration or when it cannot
/// create its data directories.
pub async fn run(
    config: SpokeConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    run_with(config, RunOptions::default(), shutdown).await
}

/// [`run`] with [`RunOptions`].
pub async fn run_with(
    config: SpokeConfig,
    options: RunOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    if config.cluster.trim().is_empty() {
        anyhow::bail!("the cluster name is empty");
    }
    // Checked once here, so a bad --hub fails the start, not every dial.
    session::endpoints(&config.hub_url, session::client_tls(Some(b"")).as_ref())?;
    let wants_tls = config.hub_url.contains("https://");
    let kept = identity::SpokeIdentity::load(&config.data_dir)?.is_some();
    let mut renewer = None;
    let tls = if wants_tls && (config.join_token.is_some() || kept || config.hub_ca_pem.is_none()) {
        let creds = identity::establish(
            &config.hub_url,
            &config.cluster,
            &config.data_dir,
            config.join_token.as_deref(),
        )
        .await?;
        renewer = Some(tokio::spawn(identity::renew_loop(
            creds.clone(),
            config.hub_url.clone(),
            config.data_dir.clone(),
        )));
        session::TlsSource::Identity(creds)
    } else {
        session::TlsSource::Fixed(session::client_tls(config.hub_ca_pem.as_deref()))
    };
    let shim_exe = match options.shim_exe {
        Some(path) => path,
        None => std::env::current_exe()
            .context("cannot find the spoke's own executable for the process shim")?,
    };
    for dir in ["logs", "work", "checkpoints"] {
        let path = config.data_dir.join(dir);
        tokio::fs::create_dir_all(&path)
            .await
            .with_context(|| format!("cannot create {}", path.display()))?;
    }
    // Nothing runs yet (workloads die with their spoke), so no checkpoint
    // directory is in use: those left untouched for too long belong to
    // workloads that will not come back (cancelled while waiting, or run
    // elsewhere).
    sweep_checkpoints(&config.data_dir.join("checkpoints"), CHECKPOINT_RETENTION);
    let (inputs_tx, inputs_rx) = mpsc::channel(INPUT_CHANNEL_CAPACITY);
    let (events_tx, events_rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
    let dialer = tokio::spawn(session::dial_loop(config.hub_url.clone(), tls, inputs_tx));
    let notices = config
        .spot_notices
        .clone()
        .map(|endpoint| tokio::spawn(spot::watch(endpoint, events_tx.clone())));
    let result = match config.driver.clone() {
        DriverConfig::Local => {
            let lease = std::sync::Arc::new(lease::Lease::default());
            let driver = driver::local::LocalDriver::new(
                config.nodes.clone(),
                driver::local::DriverCtx {
                    shim_exe,
                    data_dir: config.data_dir.clone(),
                    events: events_tx,
                    lease: lease.clone(),
                },
            );
            agent::Agent::new(config, driver)
                .with_lease(lease)
                .run(inputs_rx, events_rx, shutdown)
                .await
        }
        DriverConfig::Kubernetes(k) => {
            let lease = std::sync::Arc::new(lease::Lease::default());
            let client = kube_client(&k).await?;
            let opts = driver::kubernetes::controller::ControllerOptions {
                manifest: driver::kubernetes::manifest::ManifestOptions {
                    namespace_prefix: k.namespace_prefix.clone(),
                    priority_class_prefix: "axle-".into(),
                    shared_resource: k.shared_resource.clone(),
                    tolerated_taints: k.tolerated_taints.clone(),
                    default_image: k.default_image.clone(),
                },
                inventory: driver::kubernetes::nodes::InventoryOptions {
                    shared_resource: k.shared_resource.clone(),
                    tolerated_taints: k.tolerated_taints.clone(),
                    topology_labels: k.topology_labels.clone(),
                },
                member_subject: k.member_subject.clone(),
                data_dir: config.data_dir.clone(),
                lease: lease.clone(),
            };
            let driver = driver::kubernetes::KubeDriver::start(client, opts, events_tx);
            agent::Agent::new(config, driver)
                .with_lease(lease)
                .run(inputs_rx, events_rx, shutdown)
                .await
        }
    };
    dialer.abort();
    if let Some(n) = notices {
        n.abort();
    }
    if let Some(r) = renewer {
        r.abort();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send + 'static>(_: &T) {}

    #[test]
    fn run_is_spawnable() {
        // The hub's --dev mode runs spokes with tokio::spawn.
        let config = SpokeConfig {
            hub_url: "http://127.0.0.1:1".into(),
            cluster: "c".into(),
            region: "r".into(),
            labels: Default::default(),
            nodes: vec![],
            data_dir: PathBuf::from("/nonexistent"),
            token: None,
            hub_ca_pem: None,
            join_token: None,
            spot_notices: None,
            driver: Default::default(),
        };
        let fut = run(config, async {});
        assert_send(&fut);
    }
}
