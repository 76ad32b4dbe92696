//! What a registering spoke may claim about its cluster, checked against the
//! policy: the cluster's region and labels are the policy's (a spoke that
//! says otherwise is refused, never believed), every node's devices are
//! indexed 0…n−1 with n within [`MAX_GPUS_PER_NODE`], names are bounded and
//! printable, and every GPU has memory. Where the policy declares the
//! cluster's nodes, each node has the shape of a declared group (its model,
//! at most its GPUs per node and its memory) and the cluster no more nodes
//! or GPUs of a model than declared; where it declares none, Settings bound
//! the nodes, GPUs per node and memory (`maxNodesPerCluster`,
//! `maxGpusPerNode`, `maxGpuMemoryGb`). A refusal names what is wrong and
//! where; nothing a spoke reports can make a record the store refuses
//! (nodes are stored in pages, `records::node_pages`).

use std::collections::{BTreeMap, BTreeSet};

use axle_policy::Policy;
use axle_proto::pb;

use super::HubError;
use crate::records::{GpuRecord, NodeRecord};

/// Most devices one node may report (whole GPUs, MIG instances and
/// time-sliced replicas together): 8 GPUs cut into 7 MIG instances each is
/// 56; 64 refuses what no machine has and bounds a node's record.
pub const MAX_GPUS_PER_NODE: usize = 64;

/// Most nodes one spoke may report, whatever the policy says: ten times the
/// largest single GPU clusters run today, and a bound on what one
/// registration costs the hub.
pub const MAX_NODES_PER_CLUSTER: usize = axle_policy::MAX_NODES_PER_CLUSTER as usize;

/// Longest node name: a Kubernetes node name (a DNS subdomain) is at most 253.
pub const MAX_NODE_NAME_BYTES: usize = 253;

/// Longest GPU model or unit name (`H100`, `mig-3g.40gb`) or topology
/// domain (a Kubernetes label value is at most 63): with node names, what
/// bounds one node's record.
pub const MAX_DEVICE_NAME_BYTES: usize = 64;

/// The region of a cluster that no Cluster document declares and whose
/// spoke names none.
pub const UNDECLARED_REGION: &str = "local";

/// What the hub records of a registration once it passed the checks.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    pub region: String,
    pub labels: BTreeMap<String, String>,
    pub nodes: Vec<NodeRecord>,
}

fn refused(message: String, field: &str) -> HubError {
    HubError::bad(format!("register: {message}"), Some(field))
}

/// Checks spoke `r`'s claims about its cluster against `policy`.
pub fn check(policy: &Policy, r: &pb::Register) -> Result<Checked, HubError> {
    let declared = policy.clusters.get(&r.cluster);
    let (region, labels) = match declared {
        Some(c) => {
            if !r.region.is_empty() && r.region != c.region {
                return Err(refused(
                    format!(
                        "cluster {:?} is in region {:?} by the policy, and the spoke says {:?}; \
                         a cluster's region comes from its Cluster document (start the spoke \
                         with --region {} or without --region)",
                        r.cluster, c.region, r.region, c.region
                    ),
                    "region",
                ));
            }
            for (k, v) in &r.labels {
                if c.labels.get(k) != Some(v) {
                    return Err(refused(
                        format!(
                            "label {k}={v} is not in the policy's Cluster {:?} ({}); a cluster's \
                             labels come from its Cluster document",
                            r.cluster,
                            match c.labels.get(k) {
                                Some(p) => format!("it says {k}={p}"),
                                None => format!("it has no label {k}"),
                            }
                        ),
                        "labels",
                    ));
                }
            }
            (c.region.clone(), c.labels.clone())
        }
        // Nothing to hold the claims against (a policy that declares no
        // clusters): what the spoke says is all there is.
        None => (
            if r.region.is_empty() {
                UNDECLARED_REGION.to_string()
            } else {
                r.region.clone()
            },
            r.labels.clone().into_iter().collect(),
        ),
    };
    let shaped = declared.filter(|c| !c.nodes.is_empty());
    let bounds = policy.settings.undeclared;
    let most_nodes = match shaped {
        Some(c) => c.nodes.iter().map(|g| g.count).sum::<u64>(),
        None => bounds.max_nodes,
    }
    .min(MAX_NODES_PER_CLUSTER as u64);
    if r.nodes.len() as u64 > most_nodes {
        return Err(refused(
            format!(
                "{} nodes, more than the limit of {most_nodes} for cluster {:?} ({})",
                r.nodes.len(),
                r.cluster,
                if shaped.is_some() {
                    "the nodes its Cluster document declares"
                } else {
                    "Settings maxNodesPerCluster; its Cluster document declares no nodes"
                }
            ),
            "nodes",
        ));
    }
    if let Some(c) = shaped
        && r.nodes.is_empty()
    {
        return Err(refused(
            format!(
                "the spoke reports no nodes; the policy's Cluster {:?} declares {} \
                 (is the spoke looking at the right machines?)",
                c.name,
                c.nodes.iter().map(|g| g.count).sum::<u64>()
            ),
            "nodes",
        ));
    }
    let mut names = BTreeSet::new();
    let mut nodes = Vec::with_capacity(r.nodes.len());
    for (i, n) in r.nodes.iter().enumerate() {
        let field = format!("nodes[{i}]");
        if n.name.is_empty() || n.name.len() > MAX_NODE_NAME_BYTES {
            return Err(refused(
                format!("node {i} has no name or one longer than {MAX_NODE_NAME_BYTES} bytes"),
                &field,
            ));
        }
        if let Some(c) = axle_policy::text::hidden_char(&n.name) {
            return Err(refused(
                format!(
                    "the name of node {i} ({:?}) holds {}, a character that is not shown as \
                     itself; node names are printable text",
                    axle_policy::text::printable(&n.name),
                    c.escape_unicode()
                ),
                &field,
            ));
        }
        if !names.insert(n.name.as_str()) {
            return Err(refused(
                format!("node {:?} is listed twice", n.name),
                &field,
            ));
        }
        if n.gpus.is_empty() || n.gpus.len() > MAX_GPUS_PER_NODE {
            return Err(refused(
                format!(
                    "node {:?} reports {} GPUs; a node has 1 to {MAX_GPUS_PER_NODE}",
                    n.name,
                    n.gpus.len()
                ),
                &field,
            ));
        }
        let indices: BTreeSet<u32> = n.gpus.iter().map(|g| g.index).collect();
        let want = n.gpus.len() as u32;
        if indices.len() != n.gpus.len() || indices.last() != Some(&(want - 1)) {
            let got: Vec<u32> = n.gpus.iter().map(|g| g.index).collect();
            return Err(refused(
                format!(
                    "node {:?} reports GPU indices {got:?}; {} GPUs are indexed 0 to {}, \
                     each once",
                    n.name,
                    n.gpus.len(),
                    want - 1
                ),
                &format!("{field}.gpus"),
            ));
        }
        if let Some(g) = n
            .gpus
            .iter()
            .find(|g| !g.unit.is_empty() && !(1..=1000).contains(&g.share_milli))
        {
            return Err(refused(
                format!(
                    "device {} of node {:?} is a unit ({}) with a share of {} thousandths of a GPU; a unit is 1 to 1000",
                    g.index, n.name, g.unit, g.share_milli
                ),
                &format!("{field}.gpus"),
            ));
        }
        if n.topology.len() > MAX_DEVICE_NAME_BYTES
            || axle_policy::text::hidden_char(&n.topology).is_some()
        {
            return Err(refused(
                format!(
                    "node {:?} reports a topology domain ({:?}) longer than \
                     {MAX_DEVICE_NAME_BYTES} bytes or with characters that are not shown",
                    n.name,
                    axle_policy::text::printable(&n.topology)
                ),
                &format!("{field}.topology"),
            ));
        }
        if let Some(g) = n.gpus.iter().find(|g| g.model.is_empty()) {
            return Err(refused(
                format!("GPU {} of node {:?} has no model", g.index, n.name),
                &format!("{field}.gpus"),
            ));
        }
        if let Some(g) = n.gpus.iter().find(|g| {
            [&g.model, &g.unit].iter().any(|t| {
                t.len() > MAX_DEVICE_NAME_BYTES || axle_policy::text::hidden_char(t).is_some()
            })
        }) {
            return Err(refused(
                format!(
                    "GPU {} of node {:?} has a model or unit name ({:?}, {:?}) longer than \
                     {MAX_DEVICE_NAME_BYTES} bytes or with characters that are not shown",
                    g.index,
                    n.name,
                    axle_policy::text::printable(&g.model),
                    axle_policy::text::printable(&g.unit)
                ),
                &format!("{field}.gpus"),
            ));
        }
        if let Some(g) = n.gpus.iter().find(|g| {
            g.memory_mb == 0
                || (!g.unit.is_empty() && g.whole_memory_mb > 0 && g.memory_mb > g.whole_memory_mb)
        }) {
            return Err(refused(
                format!(
                    "GPU {} of node {:?} reports {} MiB of memory{}; every device has memory, \
                     and a unit no more than its GPU",
                    g.index,
                    n.name,
                    g.memory_mb,
                    if g.whole_memory_mb > 0 {
                        format!(" (its whole GPU {} MiB)", g.whole_memory_mb)
                    } else {
                        String::new()
                    }
                ),
                &format!("{field}.gpus"),
            ));
        }
        let node = NodeRecord {
            name: n.name.clone(),
            gpus: n
                .gpus
                .iter()
                .map(|g| GpuRecord {
                    index: g.index,
                    model: g.model.clone(),
                    memory_mb: g.memory_mb,
                    fractions_only: g.fractions_only,
                    unit: g.unit.clone(),
                    share_milli: g.share_milli,
                    whole_memory_mb: g.whole_memory_mb,
                })
                .collect(),
            whole_only: n.whole_only,
            topology: n.topology.clone(),
        };
        if shaped.is_none() {
            check_bounds(&bounds, &r.cluster, &node, &field)?;
        }
        nodes.push(node);
    }
    if let Some(c) = shaped {
        check_declared(c, &nodes)?;
    }
    Ok(Checked {
        region,
        labels,
        nodes,
    })
}

/// Milli-GPUs of device `g`: a whole GPU is 1000, a unit its share.
fn milli(g: &GpuRecord) -> u64 {
    if g.unit.is_empty() {
        1000
    } else {
        u64::from(g.share_milli)
    }
}

/// A node of a cluster whose shape the policy does not declare, within the
/// Settings bounds.
fn check_bounds(
    b: &axle_policy::InventoryBounds,
    cluster: &str,
    n: &NodeRecord,
    field: &str,
) -> Result<(), HubError> {
    let gpus: u64 = n.gpus.iter().map(milli).sum();
    if gpus > b.max_gpus_per_node * 1000 {
        return Err(refused(
            format!(
                "node {:?} reports {} GPUs, more than Settings maxGpusPerNode ({}) allows on \
                 cluster {cluster:?}, whose Cluster document declares no nodes",
                n.name,
                gpus as f64 / 1000.0,
                b.max_gpus_per_node
            ),
            field,
        ));
    }
    let most_mb = b.max_gpu_memory_gb * 1024;
    if let Some(g) = n
        .gpus
        .iter()
        .find(|g| g.memory_mb > most_mb || g.whole_memory_mb > most_mb)
    {
        return Err(refused(
            format!(
                "GPU {} of node {:?} reports {} MiB, more than Settings maxGpuMemoryGb ({} GB) \
                 allows on cluster {cluster:?}, whose Cluster document declares no nodes",
                g.index,
                n.name,
                g.memory_mb.max(g.whole_memory_mb),
                b.max_gpu_memory_gb
            ),
            &format!("{field}.gpus"),
        ));
    }
    Ok(())
}

/// Where the policy declares a cluster's nodes, every node has the shape of
/// a declared group — its model, at most its GPUs per node, at most its
/// memory per GPU — and the spoke reports no more GPUs of a model than
/// declared.
fn check_declared(c: &axle_policy::Cluster, nodes: &[NodeRecord]) -> Result<(), HubError> {
    let allowed = c.declared_gpus();
    let mut reported: BTreeMap<&str, u64> = BTreeMap::new();
    for (i, n) in nodes.iter().enumerate() {
        let mut per_model: BTreeMap<&str, u64> = BTreeMap::new();
        for g in &n.gpus {
            let groups: Vec<_> = c.nodes.iter().filter(|d| d.gpu_model == g.model).collect();
            if groups.is_empty() {
                return Err(refused(
                    format!(
                        "node {:?} reports a {} GPU; the policy's Cluster {:?} declares only {}",
                        n.name,
                        g.model,
                        c.name,
                        allowed.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                    &format!("nodes[{i}].gpus"),
                ));
            }
            let most_mb = groups
                .iter()
                .map(|d| d.gpu_memory_gb * 1024)
                .max()
                .unwrap_or(0);
            let mb = if g.unit.is_empty() {
                g.memory_mb
            } else {
                g.whole_memory_mb
            };
            if most_mb > 0 && mb > most_mb {
                return Err(refused(
                    format!(
                        "GPU {} of node {:?} reports {mb} MiB; the policy declares {} GPUs of {} GB",
                        g.index,
                        n.name,
                        g.model,
                        most_mb / 1024
                    ),
                    &format!("nodes[{i}].gpus"),
                ));
            }
            *per_model.entry(g.model.as_str()).or_insert(0) += milli(g);
        }
        for (model, got) in per_model {
            let most = c
                .nodes
                .iter()
                .filter(|d| d.gpu_model == model)
                .map(|d| d.gpus_per_node)
                .max()
                .unwrap_or(0);
            if got > most * 1000 {
                return Err(refused(
                    format!(
                        "node {:?} reports {} {model} GPUs; the policy's Cluster {:?} declares \
                         nodes of at most {most}",
                        n.name,
                        got as f64 / 1000.0,
                        c.name
                    ),
                    &format!("nodes[{i}].gpus"),
                ));
            }
            *reported.entry(model).or_insert(0) += got;
        }
    }
    for (model, n) in reported {
        let most = allowed.get(model).copied().unwrap_or(0);
        if n > most * 1000 {
            return Err(refused(
                format!(
                    "the spoke reports {} {model} GPUs; the policy's Cluster {:?} declares {most} \
                     (add the nodes to its Cluster document first)",
                    n as f64 / 1000.0,
                    c.name
                ),
                "nodes",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = r#"
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: eu-1}
spec:
  region: eu-west
  labels: {tier: prod}
  nodes: [{count: 2, gpuModel: H100, gpusPerNode: 8, gpuMemoryGb: 80}]
---
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: open}
spec:
  region: us-east
---
apiVersion: axle.dev/v1
kind: Team
metadata: {name: t}
spec:
  quotas: {H100: {guaranteed: 1, limit: 1}}
"#;

    fn policy() -> Policy {
        axle_policy::load_sources(&[("p.yaml".to_string(), POLICY.to_string())])
            .expect("policy")
            .policy
    }

    fn node(name: &str, model: &str, indices: &[u32]) -> pb::Node {
        pb::Node {
            name: name.into(),
            gpus: indices
                .iter()
                .map(|&index| pb::Gpu {
                    index,
                    model: model.into(),
                    memory_mb: 81_559,
                    fractions_only: false,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn register(cluster: &str, region: &str, nodes: Vec<pb::Node>) -> pb::Register {
        pb::Register {
            cluster: cluster.into(),
            region: region.into(),
            nodes,
            ..Default::default()
        }
    }

    fn refusal(r: &pb::Register) -> String {
        refusal_in(&policy(), r)
    }

    fn refusal_in(policy: &Policy, r: &pb::Register) -> String {
        match check(policy, r) {
            Ok(c) => panic!("accepted: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    const EIGHT: &[u32] = &[0, 1, 2, 3, 4, 5, 6, 7];

    #[test]
    fn region_and_labels_come_from_the_policy() {
        let ok = check(
            &policy(),
            &register("eu-1", "", vec![node("a", "H100", EIGHT)]),
        )
        .unwrap();
        assert_eq!(ok.region, "eu-west");
        assert_eq!(ok.labels.get("tier").map(String::as_str), Some("prod"));
        // Observed: a spoke rewrote its cluster's region to attacker-land.
        let e = refusal(&register(
            "eu-1",
            "attacker-land",
            vec![node("a", "H100", EIGHT)],
        ));
        assert!(e.contains("eu-west") && e.contains("attacker-land"), "{e}");
        let mut r = register("eu-1", "eu-west", vec![node("a", "H100", EIGHT)]);
        r.labels.insert("tier".into(), "dev".into());
        assert!(refusal(&r).contains("tier=dev"));
        // A cluster the policy declares without nodes takes any model.
        let open = check(
            &policy(),
            &register("open", "", vec![node("a", "A100", EIGHT)]),
        );
        assert_eq!(open.unwrap().region, "us-east");
    }

    #[test]
    fn gpu_indices_are_zero_to_n_minus_one() {
        // Observed: one GPU with index 99999 got a 4-GPU workload on 0–3.
        let e = refusal(&register("eu-1", "", vec![node("a", "H100", &[99_999])]));
        assert!(e.contains("99999") && e.contains("indexed 0 to 0"), "{e}");
        assert!(
            refusal(&register("eu-1", "", vec![node("a", "H100", &[0, 0])])).contains("each once")
        );
        assert!(
            refusal(&register("eu-1", "", vec![node("a", "H100", &[1, 2])])).contains("indices")
        );
        let many: Vec<u32> = (0..65).collect();
        assert!(refusal(&register("open", "", vec![node("a", "H100", &many)])).contains("1 to 64"));
        assert!(
            refusal(&register("eu-1", "", vec![node("a", "H100", &[])])).contains("reports 0 GPUs")
        );
        assert!(
            refusal(&register(
                "eu-1",
                "",
                vec![node("a", "H100", &[0]), node("a", "H100", &[0])]
            ))
            .contains("listed twice")
        );
    }

    #[test]
    fn models_and_counts_stay_within_what_the_policy_declares() {
        // Observed: 64 H100 reported where the policy declares 16.
        let nodes: Vec<pb::Node> = (0..8)
            .map(|i| node(&format!("n{i}"), "H100", EIGHT))
            .collect();
        let e = refusal(&register("eu-1", "", nodes));
        assert!(e.contains("8 nodes") && e.contains("limit of 2"), "{e}");
        let e = refusal(&register("eu-1", "", vec![node("a", "B200", EIGHT)]));
        assert!(
            e.contains("B200") && e.contains("declares only H100"),
            "{e}"
        );
        let mut big = node("a", "H100", EIGHT);
        big.gpus[3].memory_mb = 200_000;
        assert!(refusal(&register("eu-1", "", vec![big])).contains("200000 MiB"));
        let two = vec![node("a", "H100", EIGHT), node("b", "H100", EIGHT)];
        assert_eq!(
            check(&policy(), &register("eu-1", "eu-west", two))
                .unwrap()
                .nodes
                .len(),
            2
        );
    }

    fn nodes(n: usize, gpus: u32) -> Vec<pb::Node> {
        let indices: Vec<u32> = (0..gpus).collect();
        (0..n)
            .map(|i| node(&format!("n{i}"), "H100", &indices))
            .collect()
    }

    #[test]
    fn every_node_has_the_shape_of_a_declared_group() {
        // Observed on a declared cluster: one node of 16 GPUs, GPUs of 0 MB
        // and zero nodes were accepted.
        let e = refusal(&register("eu-1", "", nodes(1, 16)));
        assert!(
            e.contains("16 H100 GPUs") && e.contains("nodes of at most 8"),
            "{e}"
        );
        let mut none = node("a", "H100", EIGHT);
        none.gpus[2].memory_mb = 0;
        let e = refusal(&register("eu-1", "", vec![none]));
        assert!(e.contains("GPU 2") && e.contains("0 MiB"), "{e}");
        let e = refusal(&register("eu-1", "", Vec::new()));
        assert!(
            e.contains("reports no nodes") && e.contains("declares 2"),
            "{e}"
        );
        let e = refusal(&register("eu-1", "", nodes(3, 4)));
        assert!(e.contains("3 nodes") && e.contains("limit of 2"), "{e}");
        // MIG units count by their share: 6 whole GPUs and 14 units of 1/7.
        let mut mig = node("a", "H100", &(0..20).collect::<Vec<_>>());
        for g in &mut mig.gpus[6..] {
            g.unit = "mig-1g.10gb".into();
            g.share_milli = 142;
            g.memory_mb = 9_856;
            g.whole_memory_mb = 81_559;
        }
        assert!(check(&policy(), &register("eu-1", "", vec![mig.clone()])).is_ok());
        mig.gpus[7].memory_mb = 90_000;
        assert!(refusal(&register("eu-1", "", vec![mig])).contains("no more than its GPU"));
    }

    #[test]
    fn a_cluster_without_declared_nodes_is_bounded_by_settings() {
        // Observed: 100 nodes of 64 GPUs were accepted for a cluster whose
        // policy lists no nodes, and a 16×8 gang placed on GPUs that do not
        // exist.
        let e = refusal(&register("open", "", nodes(100, 64)));
        assert!(
            e.contains("64 GPUs") && e.contains("maxGpusPerNode (16)"),
            "{e}"
        );
        assert!(check(&policy(), &register("open", "", nodes(100, 16))).is_ok());
        let mut huge = node("a", "H100", EIGHT);
        huge.gpus[0].memory_mb = 300 * 1024;
        let e = refusal(&register("open", "", vec![huge]));
        assert!(e.contains("maxGpuMemoryGb (288 GB)"), "{e}");
        let e = refusal(&register("open", "", nodes(MAX_NODES_PER_CLUSTER + 1, 1)));
        assert!(
            e.contains("limit of 10000") && e.contains("maxNodesPerCluster"),
            "{e}"
        );
        let tight = format!(
            "{POLICY}---\napiVersion: axle.dev/v1\nkind: Settings\nmetadata: {{name: s}}\n\
             spec: {{maxNodesPerCluster: 2, maxGpusPerNode: 4, maxGpuMemoryGb: 40}}\n"
        );
        let tight = axle_policy::load_sources(&[("p.yaml".to_string(), tight)])
            .expect("policy")
            .policy;
        assert!(refusal_in(&tight, &register("open", "", nodes(3, 1))).contains("limit of 2"));
        assert!(refusal_in(&tight, &register("open", "", nodes(1, 5))).contains("(4)"));
        assert!(refusal_in(&tight, &register("open", "", nodes(1, 1))).contains("(40 GB)"));
    }

    #[test]
    fn a_topology_domain_is_kept_and_bounded() {
        let mut n = node("n0", "H100", &[0]);
        n.topology = "rack-7".into();
        let ok = check(&policy(), &register("open", "", vec![n.clone()])).expect("accepted");
        assert_eq!(ok.nodes[0].topology, "rack-7");
        for bad in [
            "r".repeat(MAX_DEVICE_NAME_BYTES + 1),
            "rack\u{202e}7".to_string(),
        ] {
            n.topology = bad;
            let e = refusal(&register("open", "", vec![n.clone()]));
            assert!(e.contains("topology domain"), "{e}");
        }
    }

    #[test]
    fn names_are_printable_and_bounded() {
        for bad in ["n\u{200B}1", "n\u{202E}1", "n\u{1b}]0;x\u{7}"] {
            let e = refusal(&register("open", "", vec![node(bad, "H100", EIGHT)]));
            assert!(e.contains("not shown as itself"), "{bad:?}: {e}");
        }
        let long = "H".repeat(MAX_DEVICE_NAME_BYTES + 1);
        let e = refusal(&register("open", "", vec![node("a", &long, EIGHT)]));
        assert!(e.contains("longer than 64 bytes"), "{e}");
    }
}
