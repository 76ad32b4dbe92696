//! `axle-hub`: the control plane process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
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
    /// Where the store and workload logs live.
    #[arg(long, env = "AXLE_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Policy repository (directory of YAML documents).
    #[arg(long, env = "AXLE_POLICY")]
    policy: Option<PathBuf>,
    /// Shared secret spokes must present.
    #[arg(long, env = "AXLE_SPOKE_TOKEN")]
    spoke_token: Option<String>,
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
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
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

async fn run(args: Args) -> anyhow::Result<()> {
    let policy = match (&args.policy, args.dev) {
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
    let data_dir = match (&args.data_dir, args.dev) {
        (Some(d), _) => d.clone(),
        (None, true) => dev::temp_data_dir()?,
        (None, false) => anyhow::bail!("--data-dir DIR is required (or --dev for a temporary one)"),
    };
    let mut listeners = server::Listeners::bind(args.http, args.grpc).await?;
    listeners.http_limits = axle_hub::http_serve::HttpLimits {
        max_connections: args.http_max_connections as usize,
        idle_timeout: std::time::Duration::from_secs(args.http_idle_timeout_s),
        header_read_timeout: std::time::Duration::from_secs(args.http_header_timeout_s),
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
    server::run(data_dir, policy, args.spoke_token, listeners, shutdown).await
}
