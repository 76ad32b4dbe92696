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
    pub grpc_limits: crate::grpc_serve::GrpcLimits,
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
    /// Spokes prove who they are with certificates from the hub's spoke CA;
    /// gRPC serves a certificate from that CA (and so does HTTP, unless `tls`
    /// gives one). `None`: spokes present the shared `--spoke-token`.
    pub spoke_mtls: Option<SpokeMtls>,
    /// Single sign-on: OIDC ID tokens accepted besides API tokens.
    pub oidc: Option<Arc<crate::oidc::Oidc>>,
    /// Cloud burst; `hub_id` and an empty `hub_url` are filled in at start
    /// (the spoke CA's hash; the gRPC listener's address).
    pub burst: Option<crate::burst::setup::BurstConfig>,
}

/// The burst settings completed for a hub with spoke CA `ca` serving gRPC on `grpc`.
pub(crate) fn burst_config(
    listeners: &Listeners,
    ca: Option<&crate::spoke_ca::SpokeCa>,
    grpc: std::net::SocketAddr,
) -> Option<Arc<crate::burst::setup::BurstConfig>> {
    let mut b = listeners.burst.clone()?;
    let Some(ca) = ca else {
        tracing::warn!(
            "cloud burst is off: burst instances join with join tokens, which need the spoke CA (run without --insecure-no-tls)"
        );
        return None;
    };
    b.hub_id = ca.pin()[..16].to_string();
    if b.hub_url.is_empty() {
        b.hub_url = format!("https://{grpc}");
    }
    Some(Arc::new(b))
}

/// Spoke identity by mTLS (see [`crate::spoke_ca`]).
#[derive(Debug, Clone)]
pub struct SpokeMtls {
    pub ca: CaSource,
    /// DNS names and IP addresses of the hub's serving certificate.
    pub names: Vec<String>,
    /// How long a spoke certificate lives.
    pub cert_ttl_ms: u64,
}

/// Where the spoke CA comes from.
#[derive(Debug, Clone)]
pub enum CaSource {
    /// Generated at the first start and kept in the store.
    Store,
    /// Given (`--spoke-ca-cert`, `--spoke-ca-key`).
    Given(Arc<crate::spoke_ca::SpokeCa>),
}

/// The names a serving certificate carries besides `--tls-san`: this host.
pub fn default_serving_names() -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    if let Ok(h) = rustix::system::uname().nodename().to_str()
        && !h.is_empty()
        && !names.iter().any(|n| n == h)
    {
        names.push(h.to_string());
    }
    names
}

/// The TLS the listeners serve, once the spoke CA is known.
pub(crate) struct Secured {
    pub http: Option<crate::tls::ServerTls>,
    pub grpc: Option<Arc<rustls::ServerConfig>>,
    pub ca: Option<Arc<crate::spoke_ca::SpokeCa>>,
    pub cert_ttl_ms: u64,
}

/// Where the spoke CA's certificate is written in the data dir, for clients
/// of a hub whose HTTPS certificate it issued (`axle --ca-file`).
pub const CA_CERT_FILE: &str = "spoke-ca.pem";

/// Resolves the spoke CA (from the store when it keeps it) and the serving
/// certificates of both listeners.
pub(crate) async fn secure(
    listeners: &Listeners,
    store: &dyn crate::store::Store,
    data_dir: &std::path::Path,
) -> anyhow::Result<Secured> {
    let Some(m) = &listeners.spoke_mtls else {
        return Ok(Secured {
            http: listeners.tls.clone(),
            grpc: listeners
                .tls
                .as_ref()
                .map(|t| t.grpc_config(None))
                .transpose()?,
            ca: None,
            cert_ttl_ms: 0,
        });
    };
    let ca = match &m.ca {
        CaSource::Given(ca) => ca.clone(),
        CaSource::Store => Arc::new(crate::spoke_ca::SpokeCa::load_or_create(store).await?),
    };
    let (chain, key) = ca.serving_cert(&m.names)?;
    let serving = crate::tls::ServerTls::from_pem(chain.into_bytes(), key.into_bytes())?;
    let grpc = serving.grpc_config(Some(ca.cert_pem()))?;
    let http = match &listeners.tls {
        Some(t) => t.clone(),
        None => serving,
    };
    let ca_file = data_dir.join(CA_CERT_FILE);
    if let Err(e) = std::fs::write(&ca_file, ca.cert_pem()) {
        tracing::warn!("cannot write {}: {e}", ca_file.display());
    }
    info!(
        "spokes join with a certificate from the spoke CA (SHA-256 {}); its certificate is in {}{}",
        ca.pin(),
        ca_file.display(),
        if listeners.tls.is_none() {
            " (HTTPS serves a certificate it issued: clients trust it with axle --ca-file)"
        } else {
            ""
        }
    );
    Ok(Secured {
        http: Some(http),
        grpc: Some(grpc),
        ca: Some(ca),
        cert_ttl_ms: m.cert_ttl_ms,
    })
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
            grpc_limits: Default::default(),
            tls: None,
            auth: crate::auth::AuthMode::None,
            bootstrap_token: None,
            rate_limits: Default::default(),
            spoke_mtls: None,
            oidc: None,
            burst: None,
        })
    }

    /// The URL scheme clients use: `https` with TLS.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() || self.spoke_mtls.is_some() {
            "https"
        } else {
            "http"
        }
    }
}

/// The gRPC server with the hub's keepalive and stream limits (TLS and
/// connection limits are the listener's: [`crate::grpc_serve::incoming`]).
pub(crate) fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        .max_concurrent_streams(Some(GRPC_MAX_STREAMS_PER_CONNECTION))
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
    let secured = secure(&listeners, store.as_ref(), &data_dir).await?;
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
            spoke_ca: secured.ca.clone(),
            spoke_cert_ttl_ms: secured.cert_ttl_ms,
            oidc: listeners.oidc.clone(),
            burst: burst_config(
                &listeners,
                secured.ca.as_deref(),
                listeners.grpc.local_addr()?,
            ),
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
        secured.http.as_ref(),
        async move {
            let _ = http_stop.wait_for(|s| *s).await;
        },
    );
    let grpc = grpc_server()
        .add_service(spoke_service(hub.clone()))
        .add_service(user_service(hub))
        .serve_with_incoming_shutdown(
            crate::grpc_serve::incoming(listeners.grpc, secured.grpc, listeners.grpc_limits),
            async move {
                let _ = grpc_stop.wait_for(|s| *s).await;
            },
        );
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
