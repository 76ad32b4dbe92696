//! Inventory from Kubernetes Nodes: which nodes can take Axle's work, their
//! GPUs (whole, MIG slices, time-sliced) and model, from allocatable
//! resources and GPU feature discovery labels. Pure: a `Node` in, facts out.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

use crate::config::{GpuSpec, NodeSpec};
use crate::gpu_class::gpu_class;

/// The device plugin's whole-GPU resource.
pub const WHOLE_GPU: &str = "nvidia.com/gpu";
/// Prefix of the device plugin's MIG resources (`nvidia.com/mig-1g.10gb`).
pub const MIG_PREFIX: &str = "nvidia.com/mig-";
/// GPU feature discovery labels.
pub const LABEL_PRODUCT: &str = "nvidia.com/gpu.product";
pub const LABEL_MEMORY_MIB: &str = "nvidia.com/gpu.memory";
pub const LABEL_COUNT: &str = "nvidia.com/gpu.count";
/// GPU feature discovery's time-slicing replicas per GPU.
pub const LABEL_REPLICAS: &str = "nvidia.com/gpu.replicas";
/// Most devices one node reports: 8 GPUs × 7 MIG devices is 56, and
/// time-slicing 8 GPUs 16 ways is 128; far past that it is not a GPU node.
pub const MAX_DEVICES_PER_NODE: usize = 1024;
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// The NVLink domain (clique) the NVIDIA GPU Operator labels a node with
/// on multi-node NVLink systems: the default topology domain.
pub const LABEL_CLIQUE: &str = "nvidia.com/gpu.clique";
/// Compute slices of the GPUs MIG partitions (A100, H100, H200): a profile
/// `Ng.*` is N sevenths of the GPU.
pub const MIG_SLICES_PER_GPU: u32 = 7;

/// What the driver needs to know of a node to run work there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    /// The value of `kubernetes.io/hostname`, which pods are pinned with.
    pub hostname: String,
    pub spec: NodeSpec,
    /// MIG resources the node offers: (resource, thousandths of a GPU each).
    pub mig: Vec<(String, u32)>,
    /// Units of the time-slicing resource the node offers.
    pub shared: u64,
}

/// Options of the inventory.
#[derive(Debug, Clone)]
pub struct InventoryOptions {
    /// The time-slicing resource (the device plugin's renamed shared GPUs).
    pub shared_resource: String,
    /// Taints the driver's pods tolerate, so they do not exclude a node
    /// (GPU nodes are commonly tainted `nvidia.com/gpu:NoSchedule`).
    pub tolerated_taints: Vec<String>,
    /// Labels that name the node's topology domain, the first present wins
    /// (default [`LABEL_CLIQUE`]; a rack label is a common addition).
    pub topology_labels: Vec<String>,
}

fn quantity_count(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> u64 {
    q.0.trim().parse::<u64>().unwrap_or(0)
}

/// The memory of a MIG profile (`3g.40gb`: 40 GB), in MiB.
pub fn mig_memory_mb(profile: &str) -> Option<u64> {
    let gb = profile
        .split('.')
        .nth(1)?
        .strip_suffix("gb")?
        .parse::<u64>()
        .ok()?;
    Some(gb * 1024)
}

/// The thousandths of a GPU a MIG profile (`3g.40gb`) is, by compute slices.
pub fn mig_milli(profile: &str) -> Option<u32> {
    let g = profile.split('g').next()?.parse::<u32>().ok()?;
    (1..=MIG_SLICES_PER_GPU)
        .contains(&g)
        .then(|| g * 1000 / MIG_SLICES_PER_GPU)
}

/// Why a node takes no work, if it does not: cordoned, tainted against
/// Axle's pods, not Ready, or without GPUs.
pub fn excluded(node: &Node, opts: &InventoryOptions) -> Option<String> {
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return Some("cordoned".into());
    }
    for t in spec.and_then(|s| s.taints.as_ref()).into_iter().flatten() {
        let blocks = t.effect == "NoSchedule" || t.effect == "NoExecute";
        if blocks && !opts.tolerated_taints.contains(&t.key) {
            return Some(format!("tainted {}:{}", t.key, t.effect));
        }
    }
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return Some("not Ready".into());
    }
    None
}

/// The node as Axle's inventory, or `None` when it takes no work.
pub fn node_facts(node: &Node, opts: &InventoryOptions) -> Option<NodeFacts> {
    let name = node.metadata.name.clone()?;
    if excluded(node, opts).is_some() {
        return None;
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let allocatable: BTreeMap<String, _> = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.clone())
        .unwrap_or_default();
    let whole = allocatable.get(WHOLE_GPU).map(quantity_count).unwrap_or(0);
    let mut mig = Vec::new();
    for (resource, q) in &allocatable {
        if let Some(profile) = resource.strip_prefix(MIG_PREFIX)
            && quantity_count(q) > 0
            && let Some(milli) = mig_milli(profile)
        {
            mig.push((resource.clone(), milli));
        }
    }
    mig.sort_by_key(|(r, m)| (*m, r.clone()));
    let shared = allocatable
        .get(&opts.shared_resource)
        .map(quantity_count)
        .unwrap_or(0);
    // Physical GPUs: the whole-GPU resource, or (all partitioned or shared)
    // the GPU feature discovery count.
    let labelled = labels
        .get(LABEL_COUNT)
        .and_then(|c| c.parse::<u64>().ok())
        .unwrap_or(0);
    let count = if whole > 0 { whole } else { labelled };
    if count == 0 && mig.is_empty() && shared == 0 {
        return None;
    }
    let model = labels
        .get(LABEL_PRODUCT)
        .map(|p| gpu_class(p))
        .unwrap_or_else(|| "UNKNOWN".to_string());
    let memory_mb = labels
        .get(LABEL_MEMORY_MIB)
        .and_then(|m| m.parse::<u64>().ok())
        .unwrap_or(0);
    // Every device the node hands out, each a schedulable unit: whole
    // GPUs (index 0…), then each MIG device, then each time-sliced
    // replica. A pod gets exactly one of these resources for a fraction.
    let mut gpus: Vec<GpuSpec> = Vec::new();
    for _ in 0..whole {
        let index = gpus.len() as u32;
        gpus.push(GpuSpec::whole(index, &model, memory_mb));
    }
    for (resource, q) in &allocatable {
        let Some(profile) = resource.strip_prefix(MIG_PREFIX) else {
            continue;
        };
        let (Some(share), Some(mem)) = (mig_milli(profile), mig_memory_mb(profile)) else {
            continue;
        };
        for _ in 0..quantity_count(q).min(MAX_DEVICES_PER_NODE as u64) {
            let index = gpus.len() as u32;
            gpus.push(GpuSpec {
                index,
                model: model.clone(),
                memory_mb: mem,
                fractions_only: true,
                unit: resource.clone(),
                share_milli: share,
                whole_memory_mb: memory_mb,
            });
        }
    }
    if shared > 0 {
        // Replicas per GPU: feature discovery's label, else the replicas
        // spread over the physical GPUs.
        let per_gpu = labels
            .get(LABEL_REPLICAS)
            .and_then(|r| r.parse::<u64>().ok())
            .filter(|&r| r > 0)
            .unwrap_or_else(|| shared.div_ceil(labelled.max(1)))
            .max(1);
        let share = u32::try_from((1000 / per_gpu).max(1)).unwrap_or(1);
        for _ in 0..shared.min(MAX_DEVICES_PER_NODE as u64) {
            let index = gpus.len() as u32;
            gpus.push(GpuSpec {
                index,
                model: model.clone(),
                memory_mb,
                fractions_only: true,
                unit: opts.shared_resource.clone(),
                share_milli: share,
                whole_memory_mb: memory_mb,
            });
        }
    }
    gpus.truncate(MAX_DEVICES_PER_NODE);
    if gpus.is_empty() {
        return None;
    }
    Some(NodeFacts {
        hostname: labels
            .get(LABEL_HOSTNAME)
            .cloned()
            .unwrap_or_else(|| name.clone()),
        spec: NodeSpec {
            name: name.clone(),
            gpus,
            // A pod gets whole devices: GPUs are never split in software.
            whole_only: true,
            topology: opts
                .topology_labels
                .iter()
                .find_map(|l| labels.get(l).filter(|v| !v.is_empty()))
                .cloned()
                .unwrap_or_default(),
        },
        name,
        mig,
        shared,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use axle_proto::pb;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec as K8sNodeSpec, NodeStatus, Taint};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    pub(crate) fn opts() -> InventoryOptions {
        InventoryOptions {
            shared_resource: "nvidia.com/gpu.shared".into(),
            tolerated_taints: vec!["nvidia.com/gpu".into()],
            topology_labels: vec![LABEL_CLIQUE.into(), "example.com/rack".into()],
        }
    }

    /// A Ready node with `allocatable` resources and GPU discovery labels.
    pub(crate) fn gpu_node(name: &str, product: &str, allocatable: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([
                    (LABEL_PRODUCT.to_string(), product.to_string()),
                    (LABEL_MEMORY_MIB.to_string(), "81920".to_string()),
                    (LABEL_COUNT.to_string(), "4".to_string()),
                    (LABEL_HOSTNAME.to_string(), format!("{name}.example")),
                ])),
                ..Default::default()
            },
            spec: Some(K8sNodeSpec::default()),
            status: Some(NodeStatus {
                allocatable: Some(
                    allocatable
                        .iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect(),
                ),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn the_topology_domain_comes_from_the_first_label_a_node_has() {
        let mut n = gpu_node("a", "NVIDIA-H100-80GB-HBM3", &[("nvidia.com/gpu", "8")]);
        assert_eq!(
            node_facts(&n, &opts()).unwrap().spec.topology,
            "",
            "no label"
        );
        let labels = n.metadata.labels.as_mut().unwrap();
        labels.insert("example.com/rack".into(), "rack-12".into());
        assert_eq!(node_facts(&n, &opts()).unwrap().spec.topology, "rack-12");
        // The NVLink clique is listed first: it wins over the rack.
        let labels = n.metadata.labels.as_mut().unwrap();
        labels.insert(LABEL_CLIQUE.into(), "c0ffee.3".into());
        let f = node_facts(&n, &opts()).unwrap();
        assert_eq!(f.spec.topology, "c0ffee.3");
        assert_eq!(
            pb::Node::from(&f.spec).topology,
            "c0ffee.3",
            "reported to the hub"
        );
    }

    #[test]
    fn whole_mig_and_shared_gpus_with_model_and_memory() {
        let n = gpu_node("a", "NVIDIA-A100-SXM4-80GB", &[("nvidia.com/gpu", "4")]);
        let f = node_facts(&n, &opts()).unwrap();
        assert_eq!(f.spec.gpus.len(), 4);
        assert_eq!(f.spec.gpus[0].model, "A100");
        assert_eq!(f.spec.gpus[0].memory_mb, 81920);
        assert_eq!(f.hostname, "a.example");
        let n = gpu_node(
            "m",
            "NVIDIA-H100-80GB-HBM3",
            &[
                ("nvidia.com/mig-1g.10gb", "7"),
                ("nvidia.com/mig-3g.40gb", "2"),
            ],
        );
        let f = node_facts(&n, &opts()).unwrap();
        // Observed: a MIG node was reported as its physical GPUs, split in
        // quarters by the hub; each MIG device is now a unit of its own.
        assert_eq!(f.spec.gpus.len(), 9, "7 × 1g.10gb and 2 × 3g.40gb");
        assert!(f.spec.whole_only);
        let g = &f.spec.gpus;
        assert_eq!(
            (
                g[0].unit.as_str(),
                g[0].share_milli,
                g[0].memory_mb,
                g[0].whole_memory_mb
            ),
            ("nvidia.com/mig-1g.10gb", 142, 10 * 1024, 81920)
        );
        assert_eq!(
            (
                g[8].index,
                g[8].unit.as_str(),
                g[8].share_milli,
                g[8].memory_mb
            ),
            (8, "nvidia.com/mig-3g.40gb", 428, 40 * 1024)
        );
        assert_eq!(
            f.mig,
            vec![
                ("nvidia.com/mig-1g.10gb".to_string(), 142),
                ("nvidia.com/mig-3g.40gb".to_string(), 428)
            ]
        );
        let n = gpu_node("s", "NVIDIA-L4", &[("nvidia.com/gpu.shared", "16")]);
        let f = node_facts(&n, &opts()).unwrap();
        assert_eq!((f.shared, f.spec.gpus[0].model.as_str()), (16, "L4"));
        // 16 replicas over the 4 GPUs the label counts: each is a quarter.
        assert_eq!(f.spec.gpus.len(), 16);
        assert!(
            f.spec
                .gpus
                .iter()
                .all(|g| g.unit == "nvidia.com/gpu.shared" && g.share_milli == 250)
        );
    }

    #[test]
    fn cordoned_tainted_not_ready_and_gpu_less_nodes_take_no_work() {
        let mut n = gpu_node("a", "NVIDIA-A100", &[("nvidia.com/gpu", "4")]);
        n.spec.as_mut().unwrap().unschedulable = Some(true);
        assert_eq!(excluded(&n, &opts()).as_deref(), Some("cordoned"));
        let mut n = gpu_node("a", "NVIDIA-A100", &[("nvidia.com/gpu", "4")]);
        n.spec.as_mut().unwrap().taints = Some(vec![Taint {
            key: "maintenance".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        assert!(node_facts(&n, &opts()).is_none());
        // The GPU taint the driver's pods tolerate does not exclude it.
        n.spec.as_mut().unwrap().taints = Some(vec![Taint {
            key: "nvidia.com/gpu".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        assert!(node_facts(&n, &opts()).is_some());
        let mut n = gpu_node("a", "NVIDIA-A100", &[("nvidia.com/gpu", "4")]);
        n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
        assert_eq!(excluded(&n, &opts()).as_deref(), Some("not Ready"));
        let mut n = gpu_node("cpu", "", &[("cpu", "64")]);
        n.metadata.labels = None;
        assert!(node_facts(&n, &opts()).is_none());
    }

    #[test]
    fn mig_profiles_are_sevenths() {
        assert_eq!(mig_milli("1g.10gb"), Some(142));
        assert_eq!(mig_milli("7g.80gb"), Some(1000));
        assert_eq!(mig_milli("9g.x"), None);
        assert_eq!(mig_milli("junk"), None);
    }
}
