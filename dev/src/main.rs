//! `axle-dev`: Axle's dev stack with one command — a hub on the embedded
//! example policy and a temporary data dir, and two in-process spokes with
//! the local driver and declared GPUs (eu-1: 2 nodes × 8 H100, us-1: 1 node
//! × 4 A100). It links the hub and the spoke agent; the production
//! `axle-hub` links no spoke code.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use axle_policy::Policy;
use axle_spoke_agent::{GpuSpec, NodeSpec, SpokeConfig};
use clap::Parser;
use tracing::error;

#[derive(Parser, Debug)]
#[command(
    name = "axle-dev",
    version,
    about = "Axle's dev stack: a hub and two local spokes with declared GPUs, on one machine"
)]
struct Args {
    /// HTTP/JSON API address.
    #[arg(long, env = "AXLE_HTTP", default_value = "127.0.0.1:7070")]
    http: SocketAddr,
    /// gRPC address (spokes and the user API).
    #[arg(long, env = "AXLE_GRPC", default_value = "127.0.0.1:7071")]
    grpc: SocketAddr,
    /// Where the store, logs and spoke work dirs live (default: a temporary dir).
    #[arg(long, env = "AXLE_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Policy repository (default: the embedded example policy).
    #[arg(long, env = "AXLE_POLICY")]
    policy: Option<PathBuf>,
    /// No authentication: every caller is a platform admin (loopback only; for scripts).
    #[arg(long)]
    no_auth: bool,
}

/// The dev spokes: eu-1 with 2 nodes × 8 H100 80GB, us-1 with 1 node × 4 A100 80GB.
fn dev_spokes(grpc_url: &str, data_dir: &std::path::Path, policy: &Policy) -> Vec<SpokeConfig> {
    let node = |name: &str, n: u32, model: &str| NodeSpec {
        name: name.to_string(),
        gpus: (0..n)
            .map(|index| GpuSpec::whole(index, model, 80 * 1024))
            .collect(),
        whole_only: false,
        topology: String::new(),
    };
    let region = |c: &str, default: &str| {
        policy
            .clusters
            .get(c)
            .map(|x| x.region.clone())
            .unwrap_or_else(|| default.to_string())
    };
    vec![
        SpokeConfig {
            hub_url: grpc_url.to_string(),
            cluster: "eu-1".into(),
            region: region("eu-1", "eu-west"),
            labels: Default::default(),
            nodes: vec![node("node-0", 8, "H100"), node("node-1", 8, "H100")],
            data_dir: data_dir.join("spokes/eu-1"),
            token: None,
            hub_ca_pem: None,
            join_token: None,
            spot_notices: None,
            driver: Default::default(),
        },
        SpokeConfig {
            hub_url: grpc_url.to_string(),
            cluster: "us-1".into(),
            region: region("us-1", "us-east"),
            labels: Default::default(),
            nodes: vec![node("node-0", 4, "A100")],
            data_dir: data_dir.join("spokes/us-1"),
            token: None,
            hub_ca_pem: None,
            join_token: None,
            spot_notices: None,
            driver: Default::default(),
        },
    ]
}

async fn run(
    data_dir: PathBuf,
    mut policy: Policy,
    mut listeners: axle_hub::server::Listeners,
    no_auth: bool,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let login = if no_auth {
        let loopback = [&listeners.http, &listeners.grpc]
            .iter()
            .all(|l| l.local_addr().is_ok_and(|a| a.ip().is_loopback()));
        if !loopback {
            anyhow::bail!("--no-auth: without authentication the hub listens on loopback only");
        }
        listeners.auth = axle_hub::auth::AuthMode::None;
        "no authentication (--no-auth): every caller is a platform admin".to_string()
    } else {
        // A dev user (a platform admin) with a token, as `axle-hub --dev` has.
        let now = axle_hub::hub::Clock::system().now_ms();
        let (record, token) = axle_hub::auth::dev_token(now)?;
        let dev_user = axle_hub::auth::DEV_USER.to_string();
        if !policy.settings.platform_admins.contains(&dev_user) {
            policy.settings.platform_admins.push(dev_user);
        }
        listeners.auth = axle_hub::auth::AuthMode::Tokens;
        listeners.bootstrap_token = Some(record);
        format!(
            "user dev (a platform admin); its API token, valid one day:\n  export AXLE_TOKEN={token}"
        )
    };
    let http = listeners.http.local_addr()?;
    let grpc = listeners.grpc.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let spokes = dev_spokes(&format!("http://{grpc}"), &data_dir, &policy);
    let mut tasks = Vec::new();
    for cfg in spokes {
        let mut rx = stop_rx.clone();
        let name = cfg.cluster.clone();
        tasks.push(tokio::spawn(async move {
            let stop = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            if let Err(e) = axle_spoke_agent::run(cfg, stop).await {
                error!("dev spoke {name} failed: {e:#}");
            }
        }));
    }
    let axle = axle_command();
    println!(
        "\nAxle hub (dev) is up: HTTP http://{http}  gRPC {grpc}  data {}\n\
         PLAINTEXT on loopback, spokes without certificates: for one machine only\n\
         spokes: eu-1 (2 nodes × 8 H100, {}), us-1 (1 node × 4 A100, {})\n\
         teams: {}\n\n\
         {login}\n\n\
         try, in another terminal (AXLE_HUB=http://{http}, and AXLE_TOKEN as above):\n  \
         {axle} submit --team vision --gpus 0.25 --priority development -- sleep 60\n  \
         {axle} submit --team nlp --gpus 8 --gang 2 --priority training -- sleep 120\n  \
         {axle} get workloads\n  \
         {axle} get teams\n",
        data_dir.display(),
        policy
            .clusters
            .get("eu-1")
            .map(|c| c.region.as_str())
            .unwrap_or("eu-west"),
        policy
            .clusters
            .get("us-1")
            .map(|c| c.region.as_str())
            .unwrap_or("us-east"),
        policy.teams.keys().cloned().collect::<Vec<_>>().join(", "),
    );
    let hub_shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let res = axle_hub::server::run(data_dir, policy, None, listeners, hub_shutdown).await;
    for t in tasks {
        let _ = t.await;
    }
    res
}

fn main() -> ExitCode {
    // Workload processes are started through this executable as a shim.
    axle_spoke_agent::maybe_run_shim();
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
    match rt.block_on(start(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn start(args: Args) -> anyhow::Result<()> {
    let policy = match &args.policy {
        Some(dir) => match axle_policy::load_dir(dir) {
            Ok(l) => l.policy,
            Err(f) => {
                eprintln!("{f}");
                anyhow::bail!("policy {} has errors", dir.display());
            }
        },
        None => axle_hub::dev::example_policy().context("the embedded example policy")?,
    };
    // Removed (with the store, logs and work dirs in it) when the stack stops.
    let temp_dir;
    let data_dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => {
            temp_dir = axle_hub::dev::temp_data_dir()?;
            temp_dir.path().to_path_buf()
        }
    };
    let mut listeners = axle_hub::server::Listeners::bind(args.http, args.grpc).await?;
    listeners.rate_limits = axle_hub::dev::DEV_RATE_LIMITS;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot handle SIGTERM")?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = sigterm.recv() => {}
        }
    };
    run(data_dir, policy, listeners, args.no_auth, shutdown).await
}

/// How to run the CLI from here: the `axle` built beside this binary when
/// there is one (what `cargo build` and `cargo run` leave in target/), else
/// the cargo command that builds it.
fn axle_command() -> String {
    std::env::current_exe()
        .ok()
        .map(|p| p.with_file_name("axle"))
        .filter(|p| p.is_file())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "cargo run --release --bin axle --".to_string())
}
