//! `axle-hub`: the control plane process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use axle_hub::ha::HaOptions;
use axle_hub::store::{EtcdOptions, EtcdStore, RedbStore, Store, StoreLocation};
use axle_hub::{dev, server};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "axle-hub",
    version,
    about = "Axle's control plane: routes GPU workloads to spoke agents"
)]
struct Args {
    /// HTTP/JSON API address.
    #[arg(long, env = "AXLE_HTTP", default_value = "127.0.0.1:7070")]
    http: SocketAddr,
    /// gRPC address (spokes and the user API).
    #[arg(long, env = "AXLE_GRPC", default_value = "127.0.0.1:7071")]
    grpc: SocketAddr,
    /// Where workload logs live, and the embedded store unless --store says otherwise.
    #[arg(long, env = "AXLE_DATA_DIR", global = true)]
    data_dir: Option<PathBuf>,
    /// The hub's state: `redb:PATH` (default: DATA_DIR/axle.redb; one hub) or
    /// `etcd://HOST:PORT,HOST:PORT,...` (several replicas, one leads).
    #[arg(long, env = "AXLE_STORE", global = true)]
    store: Option<String>,
    #[command(flatten)]
    etcd: EtcdArgs,
    #[command(flatten)]
    replica: ReplicaArgs,
    #[command(flatten)]
    burst: axle_hub::burst::setup::BurstArgs,
    /// Policy repository (directory of YAML documents).
    #[arg(long, env = "AXLE_POLICY")]
    policy: Option<PathBuf>,
    /// Shared secret spokes must present, on a hub without TLS (--insecure-no-tls,
    /// --dev); with TLS, spokes prove who they are with certificates instead.
    #[arg(long, env = "AXLE_SPOKE_TOKEN", hide_env_values = true)]
    spoke_token: Option<String>,
    /// PEM certificate (chain) the HTTP API serves TLS with, e.g. from the company's CA;
    /// without it HTTPS serves a certificate from the hub's spoke CA. Clients use
    /// https:// URLs and trust the CA (`axle --ca-file`).
    #[arg(long, env = "AXLE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Serve plaintext HTTP and gRPC, with spokes admitted by --spoke-token: only for a
    /// network that is already private end to end. Without it (and without --dev) the hub
    /// serves TLS, and spokes join with certificates from its CA.
    #[arg(long, env = "AXLE_INSECURE_NO_TLS", conflicts_with = "tls_cert")]
    insecure_no_tls: bool,
    /// PEM certificate of the CA that issues spoke certificates (with --spoke-ca-key);
    /// without them the hub generates one at its first start and keeps it in its store.
    #[arg(long, env = "AXLE_SPOKE_CA_CERT", requires = "spoke_ca_key")]
    spoke_ca_cert: Option<PathBuf>,
    /// PEM private key of --spoke-ca-cert.
    #[arg(long, env = "AXLE_SPOKE_CA_KEY", requires = "spoke_ca_cert")]
    spoke_ca_key: Option<PathBuf>,
    /// A DNS name or IP address spokes and clients reach the hub by, for its serving
    /// certificate (repeatable; localhost, 127.0.0.1, ::1, the host name and the
    /// --advertise-* hosts are always in it).
    #[arg(long = "tls-san", value_name = "NAME")]
    tls_sans: Vec<String>,
    /// How long a spoke certificate lives; spokes renew at two thirds of it.
    #[arg(long, default_value_t = axle_hub::spoke_ca::DEFAULT_SPOKE_CERT_TTL_MS / 1000,
          value_parser = clap::value_parser!(u64).range(60..=366 * 86_400))]
    spoke_cert_ttl_s: u64,
    /// How user calls are authenticated: `tokens` (API tokens, `axle token create`) or
    /// `none` (every caller is a platform admin; only with loopback --http and --grpc).
    #[arg(long, value_enum, env = "AXLE_AUTH", default_value = "tokens")]
    auth: AuthArg,
    /// A file holding an API token (from `axle-hub create-token --print-only`) that the
    /// hub accepts for --bootstrap-user from its start: the first platform admin's, e.g.
    /// mounted from a Kubernetes Secret, with the hub running on any store.
    #[arg(long, env = "AXLE_BOOTSTRAP_TOKEN_FILE", requires = "bootstrap_user")]
    bootstrap_token_file: Option<PathBuf>,
    /// The user --bootstrap-token-file authenticates (list them in Settings platformAdmins).
    #[arg(long, env = "AXLE_BOOTSTRAP_USER", requires = "bootstrap_token_file")]
    bootstrap_user: Option<String>,
    /// Single sign-on: the OIDC issuer whose ID tokens the hub accepts besides API tokens
    /// (their `iss`, exactly, e.g. https://sso.example.com).
    #[arg(long, env = "AXLE_OIDC_ISSUER", requires_all = ["oidc_audience", "oidc_jwks"])]
    oidc_issuer: Option<String>,
    /// The audience ID tokens must name (`aud`): the client id Axle has at the provider.
    #[arg(long, env = "AXLE_OIDC_AUDIENCE", requires = "oidc_issuer")]
    oidc_audience: Option<String>,
    /// The provider's signing keys: a JWKS file, or its https:// URL (re-read every 5
    /// minutes).
    #[arg(
        long,
        env = "AXLE_OIDC_JWKS",
        requires = "oidc_issuer",
        value_name = "FILE|URL"
    )]
    oidc_jwks: Option<String>,
    /// The ID token claim that names the user (as the policy's team members do).
    #[arg(long, env = "AXLE_OIDC_USER_CLAIM", default_value = axle_hub::oidc::DEFAULT_USER_CLAIM)]
    oidc_user_claim: String,
    /// The ID token claim listing the user's groups, which teams give roles (`groups:`).
    #[arg(long, env = "AXLE_OIDC_GROUPS_CLAIM")]
    oidc_groups_claim: Option<String>,
    /// User calls per second one user may make on average (beyond: 429 with Retry-After).
    #[arg(long, default_value_t = axle_hub::rate::DEFAULT_PER_USER_PER_S,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    rate_per_user: u32,
    /// User calls one user may make at once above that average.
    #[arg(long, default_value_t = axle_hub::rate::DEFAULT_PER_USER_BURST,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    rate_burst_per_user: u32,
    /// User calls in flight at once, all users together (beyond: 503 with
    /// Retry-After); one user holds at most a sixteenth of them.
    #[arg(long, default_value_t = axle_hub::rate::DEFAULT_MAX_IN_FLIGHT as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_calls_in_flight: u64,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "AXLE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The hub with nothing to set up: the example policy (unless
    /// --policy) and a temporary data dir (unless --data-dir). For the whole
    /// dev stack with spokes, run `axle-dev`.
    #[arg(long)]
    dev: bool,
    /// Most open HTTP connections; beyond it the oldest idle one is closed.
    #[arg(long, default_value_t = axle_hub::http_serve::DEFAULT_MAX_CONNECTIONS as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    http_max_connections: u64,
    /// Seconds an HTTP connection may stay open with no request in flight.
    #[arg(long, default_value_t = axle_hub::http_serve::DEFAULT_IDLE_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    http_idle_timeout_s: u64,
    /// Seconds a client has to send a whole request header.
    #[arg(long, default_value_t = axle_hub::http_serve::DEFAULT_HEADER_READ_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3_600))]
    http_header_timeout_s: u64,
    /// Most open gRPC connections (spokes and the user API); at the limit
    /// the oldest that never sent a request is closed.
    #[arg(long, default_value_t = axle_hub::grpc_serve::DEFAULT_GRPC_MAX_CONNECTIONS as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    grpc_max_connections: u64,
    /// Most connections one source address may hold open, on each port.
    #[arg(long, default_value_t = axle_hub::grpc_serve::DEFAULT_MAX_CONNECTIONS_PER_SOURCE as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections_per_source: u64,
    #[command(subcommand)]
    command: Option<Cmd>,
}

/// How to reach etcd, for `--store etcd://…`.
#[derive(clap::Args, Debug, Clone)]
struct EtcdArgs {
    /// PEM file of the CA that signed the etcd members' certificates (TLS to etcd).
    #[arg(long, env = "AXLE_ETCD_CA", global = true)]
    etcd_ca: Option<PathBuf>,
    /// PEM client certificate this hub presents to etcd (with --etcd-key).
    #[arg(long, env = "AXLE_ETCD_CERT", requires = "etcd_key", global = true)]
    etcd_cert: Option<PathBuf>,
    /// PEM private key of --etcd-cert.
    #[arg(long, env = "AXLE_ETCD_KEY", requires = "etcd_cert", global = true)]
    etcd_key: Option<PathBuf>,
    /// Every key of this hub is kept under this etcd prefix.
    #[arg(
        long,
        env = "AXLE_ETCD_PREFIX",
        default_value = "/axle/",
        global = true
    )]
    etcd_prefix: String,
}

/// This replica, for `--store etcd://…`.
#[derive(clap::Args, Debug, Clone)]
struct ReplicaArgs {
    /// Unique name of this replica (default: host name and HTTP port).
    #[arg(long, env = "AXLE_REPLICA_ID")]
    replica_id: Option<String>,
    /// The HTTP URL other replicas send clients to (default: http://--http, https:// with --tls-cert).
    #[arg(long, env = "AXLE_ADVERTISE_HTTP")]
    advertise_http: Option<String>,
    /// The gRPC URL other replicas send spokes to (default: http://--grpc, https:// with --tls-cert).
    #[arg(long, env = "AXLE_ADVERTISE_GRPC")]
    advertise_grpc: Option<String>,
    /// The replica's lease in etcd: a leader that stops renewing it is replaced after this.
    #[arg(long, default_value_t = axle_hub::ha::DEFAULT_LEASE_TTL.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(2_000..=60_000))]
    lease_ttl_ms: u64,
    /// How often the leader compacts etcd's history, to the revision of one interval
    /// before (etcd keeps every revision until compacted).
    #[arg(long, default_value_t = axle_hub::ha::DEFAULT_COMPACTION_INTERVAL.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    compaction_interval_s: u64,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum AuthArg {
    Tokens,
    None,
}

#[derive(clap::Subcommand, Debug)]
enum Cmd {
    /// Mints an API token for USER straight into a stopped hub's store (the first
    /// platform admin's; later ones come from `axle token create`) and prints it.
    CreateToken {
        /// The user the token names (make them a platform admin in Settings).
        #[arg(long)]
        user: String,
        /// Days the token is valid.
        #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u64).range(1..=366))]
        ttl_days: u64,
        /// Only print a new token, writing nothing: for --bootstrap-token-file.
        #[arg(long)]
        print_only: bool,
    },
    /// Copies a stopped hub's state into an empty store, e.g. from redb to etcd.
    MigrateStore {
        /// `redb:PATH` or `etcd://HOST:PORT,...`
        #[arg(long)]
        from: String,
        /// `redb:PATH` or `etcd://HOST:PORT,...` (must be empty)
        #[arg(long)]
        to: String,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: a log file or a pipe
        // once held ANSI escape codes.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        )
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Reads a PEM file named by a flag.
fn pem(flag: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("{flag} {}: cannot read it", path.display()))
}

/// Connects to etcd at `endpoints` as `--etcd-*` say.
async fn etcd_store(endpoints: &[String], a: &EtcdArgs) -> anyhow::Result<EtcdStore> {
    let tls = a.etcd_ca.is_some() || a.etcd_cert.is_some();
    let mut o = EtcdOptions::new(StoreLocation::urls(endpoints, tls));
    o.prefix = a.etcd_prefix.clone();
    if let Some(ca) = &a.etcd_ca {
        o.ca_pem = Some(pem("--etcd-ca", ca)?);
    }
    if let (Some(cert), Some(key)) = (&a.etcd_cert, &a.etcd_key) {
        o.client_cert_pem = Some((pem("--etcd-cert", cert)?, pem("--etcd-key", key)?));
    }
    EtcdStore::connect(o)
        .await
        .with_context(|| format!("cannot reach etcd at {}", endpoints.join(",")))
}

/// Opens a `--from`/`--to` store of `migrate-store`.
async fn open_store(flag: &str, s: &str, a: &EtcdArgs) -> anyhow::Result<Arc<dyn Store>> {
    match StoreLocation::parse(s).map_err(|e| anyhow::anyhow!("{flag}: {e}"))? {
        StoreLocation::Redb(path) => {
            let store: Arc<dyn Store> = RedbStore::open(&path).with_context(|| {
                format!(
                    "{flag} {}: cannot open it (is a hub running on it?)",
                    path.display()
                )
            })?;
            Ok(store)
        }
        StoreLocation::Etcd(endpoints) => {
            let store = etcd_store(&endpoints, a).await?;
            if flag == "--from" {
                store.recover_batches().await?;
            }
            Ok(Arc::new(store))
        }
    }
}

async fn migrate_store(from: &str, to: &str, a: &EtcdArgs) -> anyhow::Result<()> {
    let source = open_store("--from", from, a).await?;
    let dest = open_store("--to", to, a).await?;
    let started = std::time::Instant::now();
    let done = axle_hub::store::migrate(source.as_ref(), dest.as_ref())
        .await
        .context("migration failed")?;
    println!(
        "copied {} records ({} bytes) from {from} to {to} in {:.1} s",
        done.keys,
        done.bytes,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<()> {
    if let Some(Cmd::MigrateStore { from, to }) = &args.command {
        return migrate_store(from, to, &args.etcd).await;
    }
    if let Some(Cmd::CreateToken {
        user,
        ttl_days,
        print_only,
    }) = &args.command
    {
        if *print_only {
            axle_hub::auth::check_user(user).map_err(|e| anyhow::anyhow!("--user: {e}"))?;
            let (_, token, _) = axle_hub::auth::mint()?;
            println!("{token}");
            return Ok(());
        }
        return create_token(&args, user, *ttl_days).await;
    }
    let mut policy = match (&args.policy, args.dev) {
        (Some(dir), _) => match axle_policy::load_dir(dir) {
            Ok(l) => {
                for w in &l.warnings {
                    eprintln!("{w}");
                }
                l.policy
            }
            Err(f) => {
                eprintln!("{f}");
                anyhow::bail!(
                    "policy {} has errors; fix them (axle policy check) and start again",
                    dir.display()
                );
            }
        },
        (None, true) => dev::example_policy().context("the embedded example policy")?,
        (None, false) => {
            anyhow::bail!("--policy DIR is required (or --dev for the built-in example)")
        }
    };
    // Held to the end of `main`'s work: dropping it removes the temporary dir.
    let temp_dir;
    let data_dir = match (&args.data_dir, args.dev) {
        (Some(d), _) => d.clone(),
        (None, true) => {
            temp_dir = dev::temp_data_dir()?;
            temp_dir.path().to_path_buf()
        }
        (None, false) => anyhow::bail!("--data-dir DIR is required (or --dev for a temporary one)"),
    };
    let plaintext = args.insecure_no_tls || (args.dev && args.tls_cert.is_none());
    let loopback = args.http.ip().is_loopback() && args.grpc.ip().is_loopback();
    if args.dev && !args.insecure_no_tls && args.tls_cert.is_none() {
        if !loopback {
            anyhow::bail!(
                "--dev serves plaintext on loopback only (--http {} / --grpc {}); give \
                 --tls-cert, or drop --dev to serve TLS with the hub's own CA",
                args.http,
                args.grpc
            );
        }
        eprintln!(
            "axle-hub --dev: PLAINTEXT HTTP and gRPC on loopback, spokes without certificates: \
             for one machine only"
        );
    } else if args.insecure_no_tls {
        eprintln!(
            "axle-hub --insecure-no-tls: PLAINTEXT HTTP and gRPC; tokens and workloads cross \
             the network in clear"
        );
    }
    let spoke_mtls = if plaintext {
        None
    } else {
        if args.spoke_token.is_some() {
            eprintln!(
                "axle-hub: --spoke-token is not used: with TLS, spokes prove who they are with \
                 certificates (axle cluster join-token)"
            );
        }
        Some(spoke_mtls(&args)?)
    };
    // Spokes are trusted with the cluster they name: without a token, only
    // processes on this machine may be spokes.
    if spoke_mtls.is_none() && args.spoke_token.is_none() {
        if !args.grpc.ip().is_loopback() {
            anyhow::bail!(
                "--grpc {} is not a loopback address, and spokes would connect without \
                 authentication; set --spoke-token (or AXLE_SPOKE_TOKEN), or listen on 127.0.0.1",
                args.grpc
            );
        }
        eprintln!(
            "axle-hub: spokes connect without a token (gRPC on loopback {} only); \
             set --spoke-token to require one",
            args.grpc
        );
    }
    let auth_mode;
    let mut bootstrap = None;
    match args.auth {
        AuthArg::None if !loopback => anyhow::bail!(
            "--auth none on --http {} / --grpc {}: without authentication the hub listens \
             on loopback addresses only",
            args.http,
            args.grpc
        ),
        AuthArg::None => {
            auth_mode = axle_hub::auth::AuthMode::None;
            eprintln!(
                "axle-hub: --auth none: NO AUTHENTICATION, every caller is a platform admin \
                 (loopback only)"
            );
        }
        AuthArg::Tokens => {
            auth_mode = axle_hub::auth::AuthMode::Tokens;
            if args.dev {
                let now = axle_hub::hub::Clock::system().now_ms();
                let (record, token) = axle_hub::auth::dev_token(now)?;
                let user = axle_hub::auth::DEV_USER.to_string();
                if !policy.settings.platform_admins.contains(&user) {
                    policy.settings.platform_admins.push(user.clone());
                }
                bootstrap = Some(record);
                eprintln!(
                    "axle-hub --dev: user {user:?} (a platform admin), valid one day:\n  \
                     export AXLE_TOKEN={token}"
                );
            }
        }
    }
    if let (Some(file), Some(user)) = (&args.bootstrap_token_file, &args.bootstrap_user) {
        if bootstrap.is_some() {
            anyhow::bail!("--bootstrap-token-file and --dev each bring a token: give one");
        }
        if auth_mode == axle_hub::auth::AuthMode::None {
            anyhow::bail!(
                "--bootstrap-token-file with --auth none: there is nothing to authenticate"
            );
        }
        bootstrap = Some(bootstrap_token(file, user)?);
    }
    let oidc = match (&args.oidc_issuer, &args.oidc_audience, &args.oidc_jwks) {
        (Some(issuer), Some(audience), Some(jwks)) => {
            if auth_mode == axle_hub::auth::AuthMode::None {
                anyhow::bail!("--oidc-issuer with --auth none: there is nothing to authenticate");
            }
            Some(
                oidc(
                    issuer,
                    audience,
                    jwks,
                    &args.oidc_user_claim,
                    args.oidc_groups_claim.as_deref(),
                )
                .await?,
            )
        }
        _ => None,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(axle_hub::tls::ServerTls::from_files(cert, key)?),
        _ => None,
    };
    let mut listeners = server::Listeners::bind(args.http, args.grpc).await?;
    listeners.tls = tls;
    listeners.spoke_mtls = spoke_mtls;
    listeners.oidc = oidc;
    listeners.burst = args.burst.config(&policy).await;
    listeners.auth = auth_mode;
    listeners.bootstrap_token = bootstrap;
    listeners.rate_limits = axle_hub::rate::RateLimits {
        per_user_per_s: args.rate_per_user,
        per_user_burst: args.rate_burst_per_user,
        max_in_flight: args.max_calls_in_flight as usize,
    };
    listeners.http_limits = axle_hub::http_serve::HttpLimits {
        max_connections: args.http_max_connections as usize,
        idle_timeout: std::time::Duration::from_secs(args.http_idle_timeout_s),
        header_read_timeout: std::time::Duration::from_secs(args.http_header_timeout_s),
        max_per_source: args.max_connections_per_source as usize,
    };
    listeners.grpc_limits = axle_hub::grpc_serve::GrpcLimits {
        max_connections: args.grpc_max_connections as usize,
        max_per_source: args.max_connections_per_source as usize,
    };
    // SIGINT (Ctrl-C) or SIGTERM (systemd, kill) stop the hub gracefully.
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot handle SIGTERM")?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = sigterm.recv() => {}
        }
    };
    if args.dev {
        eprintln!(
            "axle-hub --dev: example policy, data in {}; no spokes (run `axle-dev` for the whole stack)",
            data_dir.display()
        );
    }
    let location = match &args.store {
        Some(s) => StoreLocation::parse(s).map_err(|e| anyhow::anyhow!("--store: {e}"))?,
        None => StoreLocation::Redb(data_dir.join(server::STORE_FILE)),
    };
    match location {
        StoreLocation::Redb(path) => {
            server::run_on(
                data_dir,
                path,
                policy,
                args.spoke_token,
                listeners,
                shutdown,
            )
            .await
        }
        StoreLocation::Etcd(endpoints) => {
            let store = etcd_store(&endpoints, &args.etcd).await?;
            let r = &args.replica;
            let http = listeners.http.local_addr()?;
            let grpc = listeners.grpc.local_addr()?;
            let scheme = listeners.scheme();
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| http.ip().to_string());
            let ha = HaOptions {
                replica_id: r
                    .replica_id
                    .clone()
                    .unwrap_or_else(|| format!("{host}-{}", http.port())),
                advertise_http: r
                    .advertise_http
                    .clone()
                    .unwrap_or_else(|| format!("{scheme}://{http}")),
                advertise_grpc: r
                    .advertise_grpc
                    .clone()
                    .unwrap_or_else(|| format!("{scheme}://{grpc}")),
                lease_ttl: std::time::Duration::from_millis(r.lease_ttl_ms),
                compaction_interval: std::time::Duration::from_secs(r.compaction_interval_s),
            };
            axle_hub::ha::run(
                data_dir,
                policy,
                args.spoke_token,
                listeners,
                store,
                ha,
                shutdown,
            )
            .await
        }
    }
}

/// The single sign-on verifier of the `--oidc-*` flags, its keys loaded and
/// refreshed every [`axle_hub::oidc::JWKS_REFRESH`].
async fn oidc(
    issuer: &str,
    audience: &str,
    jwks: &str,
    user_claim: &str,
    groups_claim: Option<&str>,
) -> anyhow::Result<Arc<axle_hub::oidc::Oidc>> {
    use axle_hub::oidc::{JwksSource, Oidc, OidcConfig};
    let source = if jwks.starts_with("https://") {
        JwksSource::Url(jwks.to_string())
    } else if let Some(rest) = jwks.strip_prefix("http://") {
        // Keys in clear could be swapped on the way: only from this machine.
        let host = url_host(rest).unwrap_or_default();
        if !(host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback()))
        {
            anyhow::bail!(
                "--oidc-jwks {jwks}: fetch signing keys over https:// (http:// only from loopback)"
            );
        }
        JwksSource::Url(jwks.to_string())
    } else {
        JwksSource::File(PathBuf::from(jwks))
    };
    let config = OidcConfig {
        user_claim: user_claim.to_string(),
        groups_claim: groups_claim.map(str::to_string),
        ..OidcConfig::new(issuer, audience, source)
    };
    let oidc = Arc::new(
        Oidc::load(config)
            .await
            .map_err(|e| anyhow::anyhow!("--oidc-jwks: {e}"))?,
    );
    oidc.spawn_refresh(axle_hub::oidc::JWKS_REFRESH);
    eprintln!("axle-hub: single sign-on with ID tokens of {issuer} (audience {audience})");
    Ok(oidc)
}

/// The host of a URL (`https://h:7071/x` → `h`), for the serving certificate.
fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    (!host.is_empty()).then(|| host.to_string())
}

/// Spoke identity by certificates, as the flags say.
fn spoke_mtls(args: &Args) -> anyhow::Result<server::SpokeMtls> {
    let ca = match (&args.spoke_ca_cert, &args.spoke_ca_key) {
        (Some(cert), Some(key)) => server::CaSource::Given(Arc::new(
            axle_hub::spoke_ca::SpokeCa::from_files(cert, key)?,
        )),
        _ => server::CaSource::Store,
    };
    let mut names = server::default_serving_names();
    let advertised = [&args.replica.advertise_http, &args.replica.advertise_grpc];
    let hosts = advertised.into_iter().flatten().filter_map(|u| url_host(u));
    for bind in [args.http.ip(), args.grpc.ip()] {
        if !bind.is_unspecified() && !names.contains(&bind.to_string()) {
            names.push(bind.to_string());
        }
    }
    for n in args.tls_sans.iter().cloned().chain(hosts) {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    Ok(server::SpokeMtls {
        ca,
        names,
        cert_ttl_ms: args.spoke_cert_ttl_s * 1000,
    })
}

/// `axle-hub create-token`: a token record written into the store directly.
async fn create_token(args: &Args, user: &str, ttl_days: u64) -> anyhow::Result<()> {
    axle_hub::auth::check_user(user).map_err(|e| anyhow::anyhow!("--user: {e}"))?;
    let store = match (&args.store, &args.data_dir) {
        (Some(s), _) => s.clone(),
        (None, Some(d)) => {
            std::fs::create_dir_all(d)
                .with_context(|| format!("cannot create data dir {}", d.display()))?;
            format!("redb:{}", d.join(server::STORE_FILE).display())
        }
        (None, None) => anyhow::bail!("give the hub's --store or --data-dir"),
    };
    let store = open_store("--store", &store, &args.etcd).await?;
    let (id, token, sha256) = axle_hub::auth::mint()?;
    let now = axle_hub::hub::Clock::system().now_ms();
    let record = axle_hub::auth::TokenRecord::new(
        id.clone(),
        sha256,
        user,
        "axle-hub create-token",
        now,
        ttl_days * 86_400_000,
    );
    let value = serde_json::to_vec(&record)?;
    store
        .txn(
            axle_hub::store::Txn::new().and_then(axle_hub::store::Op::put(
                axle_hub::records::token_key(&id),
                value,
            )),
        )
        .await
        .context("cannot write the token")?;
    eprintln!(
        "token {id} for {user}, valid {ttl_days} days (the hub reads it when it starts; \
         make {user} a platform admin in Settings to mint more with `axle token create`):"
    );
    println!("{token}");
    Ok(())
}

/// Largest --bootstrap-token-file read: a token is 82 bytes.
const MAX_TOKEN_FILE_BYTES: u64 = 1024;

/// The record of the token in `file`, for `user`, valid the longest a token lives
/// from this start (the hub registers it again at every start).
fn bootstrap_token(
    file: &std::path::Path,
    user: &str,
) -> anyhow::Result<axle_hub::auth::TokenRecord> {
    axle_hub::auth::check_user(user).map_err(|e| anyhow::anyhow!("--bootstrap-user: {e}"))?;
    let len = std::fs::metadata(file)
        .with_context(|| format!("--bootstrap-token-file {}: cannot read it", file.display()))?
        .len();
    if len > MAX_TOKEN_FILE_BYTES {
        anyhow::bail!(
            "--bootstrap-token-file {}: {len} bytes, more than a token file of {MAX_TOKEN_FILE_BYTES}",
            file.display()
        );
    }
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("--bootstrap-token-file {}: cannot read it", file.display()))?;
    let Some((id, secret)) = axle_hub::auth::parse(text.trim()) else {
        anyhow::bail!(
            "--bootstrap-token-file {}: not an Axle API token (make one with \
             `axle-hub create-token --user {user} --print-only`)",
            file.display()
        );
    };
    let now = axle_hub::hub::Clock::system().now_ms();
    Ok(axle_hub::auth::TokenRecord::new(
        id.to_string(),
        axle_hub::auth::digest(secret),
        user,
        "--bootstrap-token-file",
        now,
        axle_hub::auth::MAX_TOKEN_TTL_MS,
    ))
}
