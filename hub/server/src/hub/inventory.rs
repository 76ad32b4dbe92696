//! What a registering spoke may claim about its cluster, checked against the
//! policy: the cluster's region and labels are the policy's (a spoke that
//! says otherwise is refused, never believed), every node's GPUs are indexed
//! 0…n−1 with n within [`MAX_GPUS_PER_NODE`], and where the policy declares
//! the cluster's nodes, the spoke reports only models it declares and no more
//! GPUs of each than it declares. A refusal names what is wrong and where.

use std::collections::{BTreeMap, BTreeSet};

use axle_policy::Policy;
use axle_proto::pb;

use super::HubError;
use crate::records::{GpuRecord, NodeRecord};

/// Most GPUs one node may report: the largest servers hold 16 (MIG instances
/// and time-sliced shares are fractions of those, not more GPUs); 64 leaves
/// room for what comes next and refuses what no machine has.
pub const MAX_GPUS_PER_NODE: usize = 64;

/// Most nodes one spoke may report: ten times the largest single GPU
/// clusters run today, and a bound on what one registration costs the hub.
pub const MAX_NODES_PER_CLUSTER: usize = 10_000;

/// Longest node name: a Kubernetes node name (a DNS subdomain) is at most 253.
pub const MAX_NODE_NAME_BYTES: usize = 253;

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
    if r.nodes.len() > MAX_NODES_PER_CLUSTER {
        return Err(refused(
            format!(
                "{} nodes, more than the limit of {MAX_NODES_PER_CLUSTER} per cluster",
                r.nodes.len()
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
        if let Some(g) = n.gpus.iter().find(|g| g.model.is_empty()) {
            return Err(refused(
                format!("GPU {} of node {:?} has no model", g.index, n.name),
                &format!("{field}.gpus"),
            ));
        }
        nodes.push(NodeRecord {
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
        });
    }
    if let Some(c) = declared
        && !c.nodes.is_empty()
    {
        check_declared(c, &nodes)?;
    }
    Ok(Checked {
        region,
        labels,
        nodes,
    })
}

/// Where the policy declares a cluster's nodes, the spoke reports only those
/// models, no more GPUs of each than declared, and no more memory per GPU.
fn check_declared(c: &axle_policy::Cluster, nodes: &[NodeRecord]) -> Result<(), HubError> {
    let allowed = c.declared_gpus();
    let mut reported: BTreeMap<&str, u64> = BTreeMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for g in &n.gpus {
            let Some(group) = c.nodes.iter().find(|d| d.gpu_model == g.model) else {
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
            };
            let most_mb = group.gpu_memory_gb * 1024;
            if most_mb > 0 && g.memory_mb > most_mb {
                return Err(refused(
                    format!(
                        "GPU {} of node {:?} reports {} MiB; the policy declares {} GPUs of {} GB",
                        g.index, n.name, g.memory_mb, g.model, group.gpu_memory_gb
                    ),
                    &format!("nodes[{i}].gpus"),
                ));
            }
            *reported.entry(g.model.as_str()).or_insert(0) += 1;
        }
    }
    for (model, n) in reported {
        let most = allowed.get(model).copied().unwrap_or(0);
        if n > most {
            return Err(refused(
                format!(
                    "the spoke reports {n} {model} GPUs; the policy's Cluster {:?} declares {most} \
                     (add the nodes to its Cluster document first)",
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
        match check(&policy(), r) {
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
        // A cluster the policy declares without nodes takes any inventory.
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
        assert!(e.contains("64 H100") && e.contains("declares 16"), "{e}");
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
}
