//! The Kubernetes objects an assignment becomes: names, labels, and the
//! `batch/v1` Job (an Indexed Job for a gang), pinned to the nodes the hub
//! chose, with the GPUs as device-plugin resources. Pure.

use std::collections::BTreeMap;

use axle_proto::pb;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvVar, EnvVarSource, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, ObjectFieldSelector, PodSpec, PodTemplateSpec, ResourceRequirements,
    Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::nodes::{LABEL_HOSTNAME, NodeFacts, WHOLE_GPU};

pub const LABEL_WORKLOAD: &str = "axle.dev/workload";
pub const LABEL_EPOCH: &str = "axle.dev/epoch";
pub const LABEL_TEAM: &str = "axle.dev/team";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "axle";
/// The completion index Kubernetes gives each pod of an Indexed Job.
pub const COMPLETION_INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";
/// Finished Jobs are deleted by the agent once their end is reported; this
/// is the fallback when the agent is gone: an hour keeps the pods' logs
/// readable meanwhile.
pub const JOB_TTL_AFTER_FINISHED_S: i32 = 3600;
/// The workload container's name in every pod.
pub const CONTAINER: &str = "workload";

/// How the driver names and shapes its objects.
#[derive(Debug, Clone)]
pub struct ManifestOptions {
    /// Namespaces are `<prefix><team>`.
    pub namespace_prefix: String,
    /// PriorityClasses are `<prefix><class>`.
    pub priority_class_prefix: String,
    /// The time-slicing resource for fractions on nodes without MIG.
    pub shared_resource: String,
    /// Taints the pods tolerate.
    pub tolerated_taints: Vec<String>,
    /// The image for workloads that name none.
    pub default_image: Option<String>,
}

pub fn namespace_of(opts: &ManifestOptions, team: &str) -> String {
    format!("{}{team}", opts.namespace_prefix)
}

/// `axle-<id>-e<epoch>`: unique per run, so a new epoch never meets the
/// old Job's name.
pub fn job_name(workload_id: u64, epoch: u64) -> String {
    format!("axle-{workload_id}-e{epoch}")
}

pub fn priority_class_name(opts: &ManifestOptions, class: &str) -> String {
    format!("{}{class}", opts.priority_class_prefix)
}

/// The device-plugin resources for one replica's GPUs on `node`: whole GPUs
/// as `nvidia.com/gpu`, a fraction as exactly the unit the hub placed it on
/// (the device the node reported at that index: a MIG profile or a
/// time-sliced replica). A fraction on an index the node does not report
/// as a unit (an inventory the hub had before the node changed) falls back
/// to the smallest MIG profile that holds it, else the time-slicing
/// resource; the pod then waits, Pending, until the cluster has one.
pub fn gpu_resources(
    replica: &pb::Replica,
    node: Option<&NodeFacts>,
    opts: &ManifestOptions,
) -> BTreeMap<String, Quantity> {
    let total: u32 = replica.gpus.iter().map(|g| g.milli).sum();
    let mut out = BTreeMap::new();
    if total >= 1000 || replica.gpus.len() > 1 {
        let whole = u64::from(total.div_ceil(1000));
        out.insert(WHOLE_GPU.to_string(), Quantity(whole.to_string()));
        return out;
    }
    let unit = replica.gpus.first().and_then(|g| {
        node?
            .spec
            .gpus
            .iter()
            .find(|d| d.index == g.index && !d.unit.is_empty())
    });
    if let Some(d) = unit {
        out.insert(d.unit.clone(), Quantity("1".into()));
        return out;
    }
    let mig = node.and_then(|n| n.mig.iter().find(|(_, milli)| *milli >= total));
    match mig {
        Some((resource, _)) => out.insert(resource.clone(), Quantity("1".into())),
        None => out.insert(opts.shared_resource.clone(), Quantity("1".into())),
    };
    out
}

/// The labels every object of the workload carries.
pub fn labels(assign: &pb::Assign) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_WORKLOAD.to_string(), assign.workload_id.to_string()),
        (LABEL_EPOCH.to_string(), assign.epoch.to_string()),
        (LABEL_TEAM.to_string(), assign.team.clone()),
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
    ])
}

fn env(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value),
        value_from: None,
    }
}

/// The Job for an assignment, or why it cannot run here.
///
/// `priority_classes`: the driver could create (or found) its
/// PriorityClasses, so pods may name them.
pub fn job_for(
    assign: &pb::Assign,
    nodes: &BTreeMap<String, NodeFacts>,
    opts: &ManifestOptions,
    priority_classes: bool,
) -> Result<Job, String> {
    let image = Some(assign.image.clone())
        .filter(|i| !i.is_empty())
        .or_else(|| opts.default_image.clone())
        .ok_or_else(|| {
            "the workload names no image and this cluster has no default image; submit it with --image".to_string()
        })?;
    if assign.command.is_empty() {
        return Err("the workload has no command".into());
    }
    let Some(first) = assign.replicas.first() else {
        return Err("the assignment has no replicas".into());
    };
    let resources = gpu_resources(first, nodes.get(&first.node), opts);
    for r in &assign.replicas {
        if gpu_resources(r, nodes.get(&r.node), opts) != resources {
            return Err(
                "replicas of different shapes (a replica spread over nodes) cannot run as one Job; submit it without --spread"
                    .into(),
            );
        }
    }
    let mut hosts: Vec<String> = assign
        .replicas
        .iter()
        .map(|r| {
            nodes
                .get(&r.node)
                .map(|n| n.hostname.clone())
                .unwrap_or_else(|| r.node.clone())
        })
        .collect();
    hosts.sort();
    hosts.dedup();
    let (node_selector, affinity) = match hosts.as_slice() {
        [one] => (
            Some(BTreeMap::from([(LABEL_HOSTNAME.to_string(), one.clone())])),
            None,
        ),
        many => (
            None,
            Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: LABEL_HOSTNAME.to_string(),
                                operator: "In".to_string(),
                                values: Some(many.to_vec()),
                            }]),
                            match_fields: None,
                        }],
                    }),
                    preferred_during_scheduling_ignored_during_execution: None,
                }),
                ..Default::default()
            }),
        ),
    };
    // The workload's own variables, then Axle's, which win.
    let mut vars: BTreeMap<String, EnvVar> = assign
        .env
        .iter()
        .map(|(k, v)| (k.clone(), env(k, v.clone())))
        .collect();
    let n = assign.replicas.len();
    for (k, v) in [
        ("AXLE_WORKLOAD_ID", assign.workload_id.to_string()),
        ("AXLE_EPOCH", assign.epoch.to_string()),
        ("AXLE_REPLICAS", n.to_string()),
        ("AXLE_RESTART_COUNT", assign.restart_count.to_string()),
    ] {
        vars.insert(k.to_string(), env(k, v));
    }
    vars.insert(
        "AXLE_REPLICA".to_string(),
        EnvVar {
            name: "AXLE_REPLICA".to_string(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: None,
                    field_path: format!("metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"),
                }),
                ..Default::default()
            }),
        },
    );
    let milli: u32 = first.gpus.iter().map(|g| g.milli).sum();
    if milli < 1000 {
        vars.insert(
            "AXLE_GPU_FRACTION".to_string(),
            env(
                "AXLE_GPU_FRACTION",
                format!("{}", f64::from(milli) / 1000.0),
            ),
        );
    } else {
        vars.remove("AXLE_GPU_FRACTION");
    }
    let labels = labels(assign);
    let replicas = i32::try_from(n).unwrap_or(i32::MAX);
    let tolerations: Vec<Toleration> = opts
        .tolerated_taints
        .iter()
        .map(|k| Toleration {
            key: Some(k.clone()),
            operator: Some("Exists".into()),
            ..Default::default()
        })
        .collect();
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(job_name(assign.workload_id, assign.epoch)),
            namespace: Some(namespace_of(opts, &assign.team)),
            labels: Some(labels.clone()),
            annotations: Some(BTreeMap::from([(
                "axle.dev/name".to_string(),
                assign.name.clone(),
            )])),
            ..Default::default()
        },
        spec: Some(JobSpec {
            completions: Some(replicas),
            parallelism: Some(replicas),
            completion_mode: Some("Indexed".into()),
            // Axle decides about re-runs; a failed pod fails the run.
            backoff_limit: Some(0),
            active_deadline_seconds: (assign.max_runtime_s > 0)
                .then(|| i64::try_from(assign.max_runtime_s).unwrap_or(i64::MAX)),
            ttl_seconds_after_finished: Some(JOB_TTL_AFTER_FINISHED_S),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    termination_grace_period_seconds: Some(
                        i64::try_from(assign.grace_period_s).unwrap_or(i64::MAX),
                    ),
                    priority_class_name: priority_classes
                        .then(|| priority_class_name(opts, &assign.priority))
                        .filter(|_| !assign.priority.is_empty()),
                    node_selector,
                    affinity,
                    tolerations: (!tolerations.is_empty()).then_some(tolerations),
                    containers: vec![Container {
                        name: CONTAINER.to_string(),
                        image: Some(image),
                        command: Some(assign.command.clone()),
                        env: Some(vars.into_values().collect()),
                        resources: Some(ResourceRequirements {
                            limits: Some(resources),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::driver::kubernetes::nodes::node_facts;
    use crate::driver::kubernetes::nodes::tests::{gpu_node, opts as inv_opts};

    pub(crate) fn opts() -> ManifestOptions {
        ManifestOptions {
            namespace_prefix: "axle-".into(),
            priority_class_prefix: "axle-".into(),
            shared_resource: "nvidia.com/gpu.shared".into(),
            tolerated_taints: vec!["nvidia.com/gpu".into()],
            default_image: None,
        }
    }

    pub(crate) fn assign(id: u64, replicas: &[(&str, &[(u32, u32)])]) -> pb::Assign {
        pb::Assign {
            workload_id: id,
            epoch: 2,
            name: "train".into(),
            team: "vision".into(),
            command: vec!["python".into(), "train.py".into()],
            env: [("FOO".to_string(), "bar".to_string())].into(),
            replicas: replicas
                .iter()
                .map(|(node, gpus)| pb::Replica {
                    node: node.to_string(),
                    gpus: gpus
                        .iter()
                        .map(|&(index, milli)| pb::GpuShare { index, milli })
                        .collect(),
                })
                .collect(),
            grace_period_s: 30,
            max_runtime_s: 3600,
            checkpoint_signal: String::new(),
            restart_count: 1,
            image: "pytorch:2".into(),
            priority: "training".into(),
        }
    }

    fn nodes() -> BTreeMap<String, NodeFacts> {
        [
            gpu_node("a", "NVIDIA-A100", &[("nvidia.com/gpu", "4")]),
            gpu_node("b", "NVIDIA-A100", &[("nvidia.com/gpu", "4")]),
            gpu_node(
                "mig",
                "NVIDIA-H100",
                &[
                    ("nvidia.com/mig-1g.10gb", "7"),
                    ("nvidia.com/mig-3g.40gb", "2"),
                ],
            ),
        ]
        .iter()
        .filter_map(|n| node_facts(n, &inv_opts()))
        .map(|f| (f.name.clone(), f))
        .collect()
    }

    #[test]
    fn a_gang_is_an_indexed_job_pinned_with_labels_resources_and_env() {
        let a = assign(
            7,
            &[
                ("a", &[(0, 1000), (1, 1000)]),
                ("b", &[(2, 1000), (3, 1000)]),
            ],
        );
        let job = job_for(&a, &nodes(), &opts(), true).unwrap();
        assert_eq!(job.metadata.name.as_deref(), Some("axle-7-e2"));
        assert_eq!(job.metadata.namespace.as_deref(), Some("axle-vision"));
        let labels = job.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_WORKLOAD], "7");
        assert_eq!(labels[LABEL_EPOCH], "2");
        let spec = job.spec.as_ref().unwrap();
        assert_eq!((spec.completions, spec.parallelism), (Some(2), Some(2)));
        assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
        assert_eq!(spec.backoff_limit, Some(0));
        assert_eq!(spec.active_deadline_seconds, Some(3600));
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.priority_class_name.as_deref(), Some("axle-training"));
        assert_eq!(pod.termination_grace_period_seconds, Some(30));
        let hosts = &pod
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms[0]
            .match_expressions
            .as_ref()
            .unwrap()[0];
        assert_eq!(
            hosts.values.as_deref(),
            Some(&["a.example".to_string(), "b.example".to_string()][..])
        );
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("pytorch:2"));
        assert_eq!(
            c.resources.as_ref().unwrap().limits.as_ref().unwrap()[WHOLE_GPU],
            Quantity("2".into())
        );
        let env: BTreeMap<&str, &EnvVar> = c
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.name.as_str(), e))
            .collect();
        assert_eq!(env["FOO"].value.as_deref(), Some("bar"));
        assert_eq!(env["AXLE_WORKLOAD_ID"].value.as_deref(), Some("7"));
        assert_eq!(env["AXLE_RESTART_COUNT"].value.as_deref(), Some("1"));
        assert!(env["AXLE_REPLICA"].value_from.is_some());
        // One node: a hostname selector.
        let a = assign(8, &[("a", &[(0, 1000)])]);
        let job = job_for(&a, &nodes(), &opts(), false).unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.node_selector.unwrap()[LABEL_HOSTNAME], "a.example");
        assert!(pod.priority_class_name.is_none(), "no classes were created");
    }

    #[test]
    fn fractions_use_a_fitting_mig_profile_else_the_shared_resource() {
        let n = nodes();
        // The unit the hub placed it on, exactly: devices 0–6 of node
        // `mig` are 1g.10gb, 7–8 3g.40gb.
        let mig = gpu_resources(
            &assign(1, &[("mig", &[(7, 250)])]).replicas[0],
            n.get("mig"),
            &opts(),
        );
        assert_eq!(mig.keys().collect::<Vec<_>>(), ["nvidia.com/mig-3g.40gb"]);
        assert_eq!(mig["nvidia.com/mig-3g.40gb"].0, "1");
        // A device the node does not report as a unit: the smallest MIG
        // profile that holds the fraction.
        let mig = gpu_resources(
            &assign(1, &[("mig", &[(40, 250)])]).replicas[0],
            n.get("mig"),
            &opts(),
        );
        assert_eq!(
            mig.keys().collect::<Vec<_>>(),
            ["nvidia.com/mig-3g.40gb"],
            "1g (1/7) is too small for 0.25"
        );
        let shared = gpu_resources(
            &assign(1, &[("a", &[(0, 500)])]).replicas[0],
            n.get("a"),
            &opts(),
        );
        assert_eq!(shared.keys().collect::<Vec<_>>(), ["nvidia.com/gpu.shared"]);
        let too_big = gpu_resources(
            &assign(1, &[("mig", &[(40, 750)])]).replicas[0],
            n.get("mig"),
            &opts(),
        );
        assert_eq!(
            too_big.keys().collect::<Vec<_>>(),
            ["nvidia.com/gpu.shared"]
        );
    }

    #[test]
    fn no_image_and_spread_shapes_are_refused_with_a_reason() {
        let mut a = assign(1, &[("a", &[(0, 1000)])]);
        a.image.clear();
        let e = job_for(&a, &nodes(), &opts(), true).unwrap_err();
        assert!(e.contains("--image"), "{e}");
        let mut o = opts();
        o.default_image = Some("base:1".into());
        let job = job_for(&a, &nodes(), &o, true).unwrap();
        assert_eq!(
            job.spec.unwrap().template.spec.unwrap().containers[0]
                .image
                .as_deref(),
            Some("base:1")
        );
        let spread = assign(2, &[("a", &[(0, 1000), (1, 1000)]), ("b", &[(0, 1000)])]);
        assert!(
            job_for(&spread, &nodes(), &opts(), true)
                .unwrap_err()
                .contains("--spread")
        );
    }
}
