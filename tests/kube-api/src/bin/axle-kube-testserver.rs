//! `axle-kube-testserver`: the Kubernetes API test server as a process, for
//! load runs and demos without a real cluster. It serves GPU nodes on
//! loopback, writes a kubeconfig that points at itself, and (with
//! `--auto-complete`) plays a kubelet that runs and succeeds every pod at
//! once, so `axle bench submit` through a kubernetes spoke measures Axle,
//! not the workloads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use axle_kube_testserver::{Cluster, KubeTestServer};
use clap::Parser;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Most nodes served: each is a few KiB in memory and in every node list.
const MAX_NODES: u32 = 10_000;
/// Most GPUs per node: the largest GPU servers carry 16.
const MAX_GPUS_PER_NODE: u32 = 16;

#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Address to serve (loopback; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// GPU nodes to serve, named gpu-0, gpu-1, …
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=MAX_NODES as i64))]
    nodes: u32,
    /// Whole GPUs per node (allocatable `nvidia.com/gpu`).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=MAX_GPUS_PER_NODE as i64))]
    gpus_per_node: u32,
    /// The GPU feature discovery product label.
    #[arg(long, default_value = "NVIDIA-H100-80GB-HBM3")]
    product: String,
    /// GPU memory in MiB (the `nvidia.com/gpu.memory` label).
    #[arg(long, default_value_t = 81_559)]
    memory_mib: u64,
    /// Run and succeed every pod as soon as the Job controller creates it.
    #[arg(long)]
    auto_complete: bool,
    /// Write a kubeconfig for this server here.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

fn node(name: &str, a: &Args) -> Node {
    let gpus = BTreeMap::from([(
        "nvidia.com/gpu".to_string(),
        Quantity(a.gpus_per_node.to_string()),
    )]);
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), name.to_string()),
                ("nvidia.com/gpu.product".to_string(), a.product.clone()),
                (
                    "nvidia.com/gpu.count".to_string(),
                    a.gpus_per_node.to_string(),
                ),
                (
                    "nvidia.com/gpu.memory".to_string(),
                    a.memory_mib.to_string(),
                ),
            ])),
            ..Default::default()
        },
        status: Some(NodeStatus {
            allocatable: Some(gpus.clone()),
            capacity: Some(gpus),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let a = Args::parse();
    if !a.listen.ip().is_loopback() {
        eprintln!(
            "error: --listen {}: the test server serves loopback only (it has no authentication)",
            a.listen
        );
        return std::process::ExitCode::from(2);
    }
    let cluster = Cluster::new();
    for i in 0..a.nodes {
        if let Err(e) = cluster.add_node(node(&format!("gpu-{i}"), &a)) {
            eprintln!("error: node gpu-{i}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    }
    cluster.set_auto_complete(a.auto_complete);
    let server = KubeTestServer::start_with(cluster, a.listen).await;
    let url = server.url();
    if let Some(path) = &a.kubeconfig {
        let text = server.kubeconfig();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("error: --kubeconfig {}: {e}", path.display());
            return std::process::ExitCode::FAILURE;
        }
    }
    println!(
        "serving {url} ({} nodes × {} GPUs{})",
        a.nodes,
        a.gpus_per_node,
        if a.auto_complete {
            ", pods complete at once"
        } else {
            ""
        }
    );
    let _ = tokio::signal::ctrl_c().await;
    server.stop().await;
    std::process::ExitCode::SUCCESS
}
