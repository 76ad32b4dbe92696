//! Wires a hub: opens the store, starts the applier, and serves gRPC and HTTP
//! on the given listeners until the shutdown signal.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use axle_policy::Policy;
use axle_proto::pb;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::info;

use crate::grpc::{SpokeSvc, UserSvc};
use crate::http_serve::HttpLimits;
use crate::hub::{Hub, HubConfig};
use crate::store::RedbStore;

/// Most concurrent gRPC streams on one connection: a spoke needs one, a
/// user client a few; this bounds what one peer can make the hub hold.
pub const GRPC_MAX_STREAMS_PER_CONNECTION: u32 = 64;
/// Largest gRPC message accepted: a spoke's inventory of a big cluster or
/// a log chunk fits many times over (tonic's own default is 4 MiB).
pub const GRPC_MAX_MESSAGE_BYTES: usize = 4 << 20;
/// After a shutdown signal (SIGTERM), how long open requests and spoke
/// sessions get to finish before the hub exits anyway: spokes reconnect to
/// the next hub on their own, and a supervisor waits ~30 s before SIGKILL.
pub const DRAIN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

pub struct Listeners {
    pub http: TcpListener,
    pub grpc: TcpListener,
    /// Limits on the HTTP API's connections.
    pub http_limits: HttpLimits,
    /// TLS on both listeners (`--tls-cert`, `--tls-key`); plaintext when `None`.
    pub tls: Option<crate::tls::ServerTls>,
    /// How user calls on them are authenticated. [`Listeners::bind`] leaves it
    /// open ([`AuthMode::None`](crate::auth::AuthMode::None), for tests and the
    /// embedded dev stack on loopback); `axle-hub` requires tokens unless
    /// `--auth none`.
    pub auth: crate::auth::AuthMode,
    /// A token accepted from the start (see [`crate::auth::dev_token`]).
    pub bootstrap_token: Option<crate::auth::TokenRecord>,
    /// Per-user rate and calls in flight on the user APIs.
    pub rate_limits: crate::rate::RateLimits,
}

impl Listeners {
    pub async fn bind(http: SocketAddr, grpc: SocketAddr) -> anyhow::Result<Listeners> {
        Ok(Listeners {
            http: TcpListener::bind(http)
                .await
                .with_context(|| format!("cannot listen for HTTP on {http}"))?,
            grpc: TcpListener::bind(grpc)
                .await
                .with_context(|| format!("cannot listen for gRPC on {grpc}"))?,
            http_limits: HttpLimits::default(),
            tls: None,
            auth: crate::auth::AuthMode::None,
            bootstrap_token: None,
            rate_limits: Default::default(),
        })
    }

    /// The URL scheme clients use: `https` with TLS.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }
}

/// The gRPC server with the hub's keepalive and stream limits, and TLS when given.
pub(crate) fn grpc_server(
    tls: Option<&crate::tls::ServerTls>,
) -> anyhow::Result<tonic::transport::Server> {
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server
            .tls_config(tls.grpc())
            .context("TLS for gRPC (--tls-cert, --tls-key)")?;
    }
    Ok(server
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        .max_concurrent_streams(Some(GRPC_MAX_STREAMS_PER_CONNECTION)))
}

/// The spoke session service of `hub`, with the message size limit.
pub(crate) fn spoke_service(
    hub: Arc<Hub>,
) -> pb::spoke_service_server::SpokeServiceServer<SpokeSvc> {
    pb::spoke_service_server::SpokeServiceServer::new(SpokeSvc::new(hub))
        .max_decoding_message_size(GRPC_MAX_MESSAGE_BYTES)
}

/// The user API of `hub`, with the message size limit.
pub(crate) fn user_service(hub: Arc<Hub>) -> pb::user_service_server::UserServiceServer<UserSvc> {
    pb::user_service_server::UserServiceServer::new(UserSvc::new(hub))
        .max_decoding_message_size(GRPC_MAX_MESSAGE_BYTES)
}

/// The embedded store's file in the data dir, unless `--store redb:PATH`.
pub const STORE_FILE: &str = "axle.redb";

/// Runs a hub on the embedded store in `data_dir` until `shutdown` resolves or a server fails.
pub async fn run(
    data_dir: PathBuf,
    policy: Policy,
    spoke_token: Option<String>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let store_path = data_dir.join(STORE_FILE);
    run_on(
        data_dir,
        store_path,
        policy,
        spoke_token,
        listeners,
        shutdown,
    )
    .await
}

/// Runs a hub on the embedded store at `store_path` until `shutdown` resolves or a server fails.
pub async fn run_on(
    data_dir: PathBuf,
    store_path: PathBuf,
    policy: Policy,
    spoke_token: Option<String>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("cannot create data dir {}", data_dir.display()))?;
    let store = RedbStore::open(&store_path)
        .with_context(|| format!("cannot open the store {}", store_path.display()))?;
    let log_limits = crate::logs::LogLimits::within(policy.settings.max_log_bytes_per_workload);
    let (hub, mut tasks) = Hub::start(
        store,
        policy,
        HubConfig {
            data_dir,
            spoke_token,
            log_limits,
            clock: crate::hub::Clock::system(),
            on_store_failure: Default::default(),
            auth: listeners.auth,
            bootstrap_token: listeners.bootstrap_token.clone(),
            rate_limits: listeners.rate_limits,
        },
    )
    .await?;
    let http_addr = listeners.http.local_addr()?;
    let grpc_addr = listeners.grpc.local_addr()?;
    let scheme = listeners.scheme();
    info!("HTTP API on {scheme}://{http_addr}, gRPC on {scheme}://{grpc_addr}");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let mut http_stop = stop_rx.clone();
    let mut grpc_stop = stop_rx.clone();
    let mut drain = stop_rx;

    let hub_for_drain = hub.clone();
    let app = crate::http::router(hub.clone());
    let http = crate::http_serve::serve(
        listeners.http,
        app,
        listeners.http_limits,
        listeners.tls.as_ref(),
        async move {
            let _ = http_stop.wait_for(|s| *s).await;
        },
    );
    let grpc = grpc_server(listeners.tls.as_ref())?
        .add_service(spoke_service(hub.clone()))
        .add_service(user_service(hub))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listeners.grpc), async move {
            let _ = grpc_stop.wait_for(|s| *s).await;
        });
    let servers = async {
        let http = async { http.await.context("HTTP server failed") };
        let grpc = async { grpc.await.context("gRPC server failed") };
        tokio::try_join!(http, grpc).map(|_| ())
    };
    tokio::pin!(servers);
    // Either server or a hub task failing ends the hub: it must not limp
    // on half-served (the caller exits non-zero).
    tokio::select! {
        r = &mut servers => return r,
        why = tasks.failed() => anyhow::bail!("{why}"),
        _ = drain.wait_for(|s| *s) => {}
    }
    info!(
        "shutting down: draining requests and spoke sessions for at most {} s",
        DRAIN_DEADLINE.as_secs()
    );
    let _ = hub_for_drain.send(crate::hub::Command::EndSessions).await;
    match tokio::time::timeout(DRAIN_DEADLINE, &mut servers).await {
        Ok(r) => r?,
        Err(_) => tracing::warn!(
            "drain deadline of {} s passed; closing what is still open",
            DRAIN_DEADLINE.as_secs()
        ),
    }
    tasks.abort();
    Ok(())
}
