//! Spoke configuration and the inventory types the spoke reports to the hub.

use std::collections::BTreeMap;
use std::path::PathBuf;

use axle_proto::pb;

/// One GPU on a node, as the spoke reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSpec {
    /// Device index as the driver numbers it (what `CUDA_VISIBLE_DEVICES` takes).
    pub index: u32,
    /// Axle GPU class, e.g. `H100` (see [`crate::gpu_class`]).
    pub model: String,
    pub memory_mb: u64,
    /// Partitioned (MIG) or time-sliced: only fractions fit.
    pub fractions_only: bool,
    /// A fractional unit handed out whole: its device-plugin resource
    /// (`nvidia.com/mig-2g.20gb`); empty for a whole GPU.
    pub unit: String,
    /// The unit's share of a GPU in thousandths; 0 for a whole GPU.
    pub share_milli: u32,
    /// The memory of the whole GPU a unit is part of (0: unknown).
    pub whole_memory_mb: u64,
}

impl GpuSpec {
    /// A whole GPU.
    pub fn whole(index: u32, model: &str, memory_mb: u64) -> GpuSpec {
        GpuSpec {
            index,
            model: model.to_string(),
            memory_mb,
            fractions_only: false,
            unit: String::new(),
            share_milli: 0,
            whole_memory_mb: 0,
        }
    }
}

/// One node of the cluster with its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    pub name: String,
    pub gpus: Vec<GpuSpec>,
    /// Whole GPUs are never split between workloads (Kubernetes).
    pub whole_only: bool,
    /// The node's topology domain (a rack, an NVLink block); empty when
    /// unknown.
    pub topology: String,
}

/// Everything [`crate::run`] needs to know about the cluster it serves.
#[derive(Debug, Clone)]
pub struct SpokeConfig {
    /// The hub's gRPC address, e.g. `http://127.0.0.1:7071`, or several
    /// replicas' comma-separated.
    pub hub_url: String,
    pub cluster: String,
    /// What the spoke claims; empty: the policy's Cluster document decides
    /// (the hub refuses a region that differs from it).
    pub region: String,
    pub labels: BTreeMap<String, String>,
    pub nodes: Vec<NodeSpec>,
    /// Logs go to `<data_dir>/logs`, workload working directories to `<data_dir>/work`.
    pub data_dir: PathBuf,
    /// Shared secret when the hub requires one.
    pub token: Option<String>,
    /// PEM CA certificate(s) that signed the hub's TLS certificate, for `https://` hub
    /// URLs of a hub that admits spokes by token; a spoke with a certificate
    /// (see [`crate::identity`]) trusts the CA it joined.
    pub hub_ca_pem: Option<Vec<u8>>,
    /// A one-time join token (`axle cluster join-token`): with it, a spoke
    /// with no certificate in its data dir joins the hub and gets one.
    pub join_token: Option<String>,
    /// The instance metadata service to read EC2 spot interruption notices
    /// from (see [`crate::spot`]); `None`: not a spot instance, nothing read.
    pub spot_notices: Option<String>,
    /// How the spoke runs work.
    pub driver: DriverConfig,
}

/// Which driver runs the spoke's work, with its settings.
#[derive(Debug, Clone, Default)]
pub enum DriverConfig {
    /// Processes on this host, on the GPUs of `SpokeConfig::nodes`.
    #[default]
    Local,
    Kubernetes(KubernetesConfig),
}

/// Settings of the `kubernetes` driver.
#[derive(Debug, Clone)]
pub struct KubernetesConfig {
    /// A kubeconfig file; `None`: in-cluster config or `$KUBECONFIG`/`~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// The time-slicing resource fractions use on nodes without MIG.
    pub shared_resource: String,
    /// The image for workloads that name none.
    pub default_image: Option<String>,
    /// Team namespaces are `<prefix><team>`.
    pub namespace_prefix: String,
    /// A member's Kubernetes user name (`{user}` is their policy name).
    pub member_subject: String,
    /// Taints the workload pods tolerate (and that do not exclude a node).
    pub tolerated_taints: Vec<String>,
    /// Node labels that name a node's topology domain, the first present
    /// wins.
    pub topology_labels: Vec<String>,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            kubeconfig: None,
            shared_resource: "nvidia.com/gpu.shared".into(),
            default_image: None,
            namespace_prefix: "axle-".into(),
            member_subject: "{user}".into(),
            tolerated_taints: vec!["nvidia.com/gpu".into()],
            topology_labels: vec![crate::driver::kubernetes::nodes::LABEL_CLIQUE.into()],
        }
    }
}

impl From<&GpuSpec> for pb::Gpu {
    fn from(gpu: &GpuSpec) -> Self {
        pb::Gpu {
            index: gpu.index,
            model: gpu.model.clone(),
            memory_mb: gpu.memory_mb,
            fractions_only: gpu.fractions_only,
            unit: gpu.unit.clone(),
            share_milli: gpu.share_milli,
            whole_memory_mb: gpu.whole_memory_mb,
        }
    }
}

impl From<&NodeSpec> for pb::Node {
    fn from(node: &NodeSpec) -> Self {
        pb::Node {
            name: node.name.clone(),
            gpus: node.gpus.iter().map(pb::Gpu::from).collect(),
            whole_only: node.whole_only,
            topology: node.topology.clone(),
        }
    }
}
