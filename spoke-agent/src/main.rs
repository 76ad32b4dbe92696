//! `axle-spoke`: the per-cluster agent binary. Parses flags, discovers or
//! declares GPUs, and runs the spoke until SIGINT/SIGTERM.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use axle_spoke_agent::{
    DriverConfig, KubernetesConfig, SpokeConfig, discover_gpus, maybe_run_shim, parse_gpu_decl, run,
};
use clap::Parser;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "axle-spoke",
    version,
    about = "Axle spoke agent: runs one cluster's GPU workloads for the hub"
)]
struct Args {
    /// The hub's gRPC address; several replicas comma-separated
    /// (`http://h1:7071,http://h2:7071`): the spoke dials them in turn and
    /// follows a replica that names the leader.
    #[arg(
        long = "hub",
        env = "AXLE_HUB_GRPC",
        default_value = "http://127.0.0.1:7071",
        value_name = "URL[,URL...]"
    )]
    hub_url: String,
    /// Name of this cluster.
    #[arg(long, value_name = "NAME", value_parser = parse_cluster)]
    cluster: String,
    /// Region the cluster is in. A cluster the policy declares takes its
    /// region from its Cluster document (leave this out, or give the same);
    /// an undeclared one without it is in region `local`.
    #[arg(long, value_name = "R")]
    region: Option<String>,
    /// A label `k=v` (repeatable).
    #[arg(long = "label", value_name = "K=V", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Declared GPUs of one node, `COUNTxMODEL[:MEMGB]`, e.g. `8xH100:80GB`
    /// (repeatable: one node each). Without it, nvidia-smi is asked.
    #[arg(long = "gpus", value_name = "COUNTxMODEL[:MEMGB]", value_parser = check_gpu_decl)]
    gpus: Vec<String>,
    /// Node names, in the order of --gpus (default node-0, node-1, …; with
    /// nvidia-smi, the host name).
    #[arg(long = "node", value_name = "NAME")]
    nodes: Vec<String>,
    /// local: the topology domain of this spoke's nodes (a rack, an
    /// NVLink block); a gang's replicas prefer nodes of one domain.
    #[arg(long, value_name = "DOMAIN")]
    topology: Option<String>,
    /// kubernetes: a node label naming the node's topology domain
    /// (repeatable, the first a node has wins; default nvidia.com/gpu.clique).
    #[arg(long = "topology-label", value_name = "KEY")]
    topology_labels: Vec<String>,
    /// Where logs and working directories go (default: a directory under the
    /// system temp dir named after the cluster).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Shared secret the hub requires from spokes.
    #[arg(long, env = "AXLE_SPOKE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM CA certificate(s) that signed the hub's TLS certificate, for a hub that admits
    /// spokes by --token over TLS. A spoke that joined trusts the CA it joined instead.
    #[arg(long, env = "AXLE_CA_FILE", value_name = "FILE")]
    ca_file: Option<PathBuf>,
    /// One-time join token from `axle cluster join-token CLUSTER`: a new spoke trades it
    /// for a certificate (kept in DATA_DIR/identity) and connects with mTLS from then on.
    #[arg(long, env = "AXLE_JOIN_TOKEN", hide_env_values = true)]
    join_token: Option<String>,
    /// How work runs: `local` (processes on this host) or `kubernetes`
    /// (Jobs in the cluster of the kubeconfig or the pod this runs in).
    #[arg(long, value_enum, default_value = "local", env = "AXLE_SPOKE_DRIVER")]
    driver: DriverKind,
    /// kubernetes: the kubeconfig file (default: in-cluster config, then
    /// $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "FILE", env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// kubernetes: the image of workloads that name none.
    #[arg(long, value_name = "IMAGE")]
    default_image: Option<String>,
    /// kubernetes: the time-slicing resource fractions use where a node
    /// has no MIG profile that fits.
    #[arg(long, default_value = "nvidia.com/gpu.shared", value_name = "RESOURCE")]
    shared_gpu_resource: String,
    /// kubernetes: team namespaces are `<prefix><team>`.
    #[arg(long, default_value = "axle-", value_name = "PREFIX")]
    namespace_prefix: String,
    /// kubernetes: a team member's Kubernetes user name; `{user}` is the
    /// name in the policy (e.g. `{user}@example.com`).
    #[arg(long, default_value = "{user}", value_name = "TEMPLATE")]
    member_subject: String,
    /// kubernetes: a taint key the workload pods tolerate (repeatable;
    /// default nvidia.com/gpu).
    #[arg(long = "tolerate-taint", value_name = "KEY")]
    tolerate_taints: Vec<String>,
    /// This is an EC2 spot instance: read the two-minute interruption
    /// notice from the instance metadata service and tell the hub, which
    /// stops the work here in time (burst instances launched as spot get it).
    #[arg(long, env = "AXLE_EC2_SPOT_NOTICES")]
    ec2_spot_notices: bool,
    /// The instance metadata service --ec2-spot-notices reads.
    #[arg(
        long,
        env = "AXLE_IMDS_ENDPOINT",
        default_value = axle_spoke_agent::spot::DEFAULT_IMDS_ENDPOINT,
        value_name = "URL"
    )]
    imds_endpoint: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DriverKind {
    Local,
    Kubernetes,
}

fn parse_cluster(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "invalid cluster name {s:?}: use letters, digits, '-', '_' and '.'"
        ))
    }
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("invalid label {s:?}: expected KEY=VALUE")),
    }
}

fn check_gpu_decl(s: &str) -> Result<String, String> {
    parse_gpu_decl(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        _ => {
            tracing::error!("cannot install signal handlers; stop the spoke with SIGKILL");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}

fn real_main(args: Args) -> anyhow::Result<()> {
    let (nodes, driver) = match args.driver {
        DriverKind::Local => {
            if !args.topology_labels.is_empty() {
                anyhow::bail!(
                    "--topology-label names a Kubernetes node label; the local driver takes --topology DOMAIN"
                );
            }
            let mut nodes = discover_gpus(&args.gpus, &args.nodes)
                .context("cannot determine the GPU inventory")?;
            for n in &mut nodes {
                n.topology = args.topology.clone().unwrap_or_default();
            }
            let gpus: usize = nodes.iter().map(|n| n.gpus.len()).sum();
            tracing::info!(nodes = nodes.len(), gpus, "inventory");
            (nodes, DriverConfig::Local)
        }
        DriverKind::Kubernetes => {
            if !args.gpus.is_empty() || !args.nodes.is_empty() || args.topology.is_some() {
                anyhow::bail!(
                    "--gpus, --node and --topology declare the local driver's nodes; the kubernetes driver reads them from the cluster's Nodes (--topology-label)"
                );
            }
            let tolerated_taints = if args.tolerate_taints.is_empty() {
                vec!["nvidia.com/gpu".to_string()]
            } else {
                args.tolerate_taints.clone()
            };
            (
                Vec::new(),
                DriverConfig::Kubernetes(KubernetesConfig {
                    kubeconfig: args.kubeconfig.clone(),
                    shared_resource: args.shared_gpu_resource.clone(),
                    default_image: args.default_image.clone().filter(|i| !i.is_empty()),
                    namespace_prefix: args.namespace_prefix.clone(),
                    member_subject: args.member_subject.clone(),
                    tolerated_taints,
                    topology_labels: if args.topology_labels.is_empty() {
                        KubernetesConfig::default().topology_labels
                    } else {
                        args.topology_labels.clone()
                    },
                }),
            )
        }
    };
    let data_dir = args
        .data_dir
        .unwrap_or_else(|| std::env::temp_dir().join(format!("axle-spoke-{}", args.cluster)));
    let hub_ca_pem = match &args.ca_file {
        Some(p) => Some(
            std::fs::read(p)
                .with_context(|| format!("--ca-file {}: cannot read it", p.display()))?,
        ),
        None => None,
    };
    let config = SpokeConfig {
        hub_ca_pem,
        hub_url: args.hub_url,
        cluster: args.cluster,
        region: args.region.unwrap_or_default(),
        labels: args.labels.into_iter().collect::<BTreeMap<_, _>>(),
        nodes,
        data_dir,
        token: args.token.filter(|t| !t.is_empty()),
        join_token: args.join_token.filter(|t| !t.is_empty()),
        spot_notices: args.ec2_spot_notices.then_some(args.imds_endpoint),
        driver,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(run(config, shutdown_signal()))
}

fn main() -> ExitCode {
    maybe_run_shim();
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: a log file or a pipe
        // once held ANSI escape codes.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        )
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    match real_main(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("axle-spoke: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
