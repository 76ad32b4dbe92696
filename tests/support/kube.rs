//! A hub and one `axle-spoke --driver kubernetes` against the in-memory
//! Kubernetes API server (`axle-kube-testserver`) on loopback: the cluster's
//! Nodes, Jobs and pods are the test's to shape and drive.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axle_kube_testserver::{Cluster, KubeTestServer};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Pod, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::{HubProc, Ports, SpokeProc, SpokeSpec, TempPolicy, temp_dir, wait_until};

/// The default image the test spokes run image-less workloads with.
pub const DEFAULT_IMAGE: &str = "registry.example/axle/runner:1";

/// A Ready GPU node as GPU feature discovery and the NVIDIA device plugin
/// label it: `product` (e.g. `NVIDIA-H100-80GB-HBM3`), `count` physical
/// GPUs of 80 GiB, and the allocatable resources given.
pub fn gpu_node(name: &str, product: &str, count: u32, allocatable: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), name.to_string()),
                ("nvidia.com/gpu.product".to_string(), product.to_string()),
                ("nvidia.com/gpu.count".to_string(), count.to_string()),
                ("nvidia.com/gpu.memory".to_string(), "81559".to_string()),
            ])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "nvidia.com/gpu".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            allocatable: Some(
                allocatable
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
            ),
            capacity: Some(
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

/// A kubeconfig for the test API server (plain HTTP on loopback, no user).
pub fn write_kubeconfig(dir: &Path, server: &KubeTestServer) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(&path, server.kubeconfig()).expect("write kubeconfig");
    path
}

/// A hub on fixture policies and one kubernetes spoke for `cluster`.
/// Fields drop in order: the spoke, the hub, the API server, the dirs.
pub struct KubeEnv {
    pub spoke: SpokeProc,
    pub hub: HubProc,
    pub kube: Option<KubeTestServer>,
    pub cluster: Cluster,
    pub kube_addr: std::net::SocketAddr,
    pub policy: TempPolicy,
    pub dir: tempfile::TempDir,
}

impl KubeEnv {
    /// Starts the API server with `nodes`, the hub on `fixtures`, and the
    /// spoke (`--driver kubernetes --default-image DEFAULT_IMAGE`, plus
    /// `extra` flags), and waits until the cluster is Ready at the hub.
    pub async fn start(fixtures: &[&str], cluster: &str, nodes: Vec<Node>, extra: &[&str]) -> Self {
        let dir = temp_dir("axle-e2e-kube");
        let state = Cluster::new();
        for n in nodes {
            state.add_node(n).expect("add node");
        }
        let kube = KubeTestServer::start_with(state.clone(), "127.0.0.1:0".parse().unwrap()).await;
        let kubeconfig = write_kubeconfig(dir.path(), &kube);
        let policy = TempPolicy::fixture(fixtures);
        let mut hub = HubProc::start(policy.path(), &dir.path().join("hub"), Ports::free());
        let mut spec = SpokeSpec::new(cluster, "eu-west", &[], &dir.path().join("spoke"));
        spec.extra_args = [
            "--driver",
            "kubernetes",
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--default-image",
            DEFAULT_IMAGE,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(extra.iter().map(|s| s.to_string()))
        .collect();
        let spoke = SpokeProc::start(&hub.grpc_url(), spec);
        hub.wait_ready(&[cluster]).await;
        KubeEnv {
            spoke,
            hub,
            kube_addr: kube.addr(),
            kube: Some(kube),
            cluster: state,
            policy,
            dir,
        }
    }

    pub fn api(&self) -> crate::Api {
        self.hub.api()
    }

    /// Stops the API server (connections break mid-stream).
    pub async fn stop_kube(&mut self) {
        if let Some(k) = self.kube.take() {
            k.stop().await;
        }
    }

    /// Starts it again on the same address with the same objects.
    pub async fn start_kube(&mut self) {
        assert!(self.kube.is_none(), "the API server is running");
        self.kube = Some(KubeTestServer::start_with(self.cluster.clone(), self.kube_addr).await);
    }

    /// The Jobs of workload `id` (any epoch), across namespaces.
    pub fn jobs_of(&self, id: u64) -> Vec<Job> {
        self.cluster
            .jobs(None)
            .into_iter()
            .filter(|j| label(&j.metadata, "axle.dev/workload") == Some(id.to_string()))
            .collect()
    }

    /// The pods of workload `id` (any epoch), across namespaces.
    pub fn pods_of(&self, id: u64) -> Vec<Pod> {
        self.cluster
            .pods(None)
            .into_iter()
            .filter(|p| label(&p.metadata, "axle.dev/workload") == Some(id.to_string()))
            .collect()
    }

    /// Waits until workload `id` has `n` pods of epoch `epoch`; returns them.
    pub async fn wait_pods(&self, id: u64, epoch: u64, n: usize) -> Vec<Pod> {
        wait_until(
            Duration::from_secs(30),
            &format!("{n} pods of workload {id} epoch {epoch}"),
            || async {
                let pods: Vec<Pod> = self
                    .pods_of(id)
                    .into_iter()
                    .filter(|p| label(&p.metadata, "axle.dev/epoch") == Some(epoch.to_string()))
                    .collect();
                if pods.len() == n {
                    Ok(pods)
                } else {
                    Err(format!("{} pods; jobs: {:?}", pods.len(), self.job_names()))
                }
            },
        )
        .await
    }

    fn job_names(&self) -> Vec<String> {
        self.cluster
            .jobs(None)
            .into_iter()
            .filter_map(|j| j.metadata.name)
            .collect()
    }

    /// Marks every pod of the workload's epoch Running.
    pub fn run_pods(&self, pods: &[Pod]) {
        for p in pods {
            self.cluster
                .set_pod_running(&ns(p), &name(p))
                .expect("set pod running");
        }
    }

    /// Marks every pod Succeeded.
    pub fn succeed_pods(&self, pods: &[Pod]) {
        for p in pods {
            self.cluster
                .set_pod_succeeded(&ns(p), &name(p))
                .expect("set pod succeeded");
        }
    }
}

pub fn label(meta: &ObjectMeta, key: &str) -> Option<String> {
    meta.labels.as_ref().and_then(|l| l.get(key)).cloned()
}

pub fn ns(p: &Pod) -> String {
    p.metadata.namespace.clone().unwrap_or_default()
}

pub fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

/// The first container's resource limits of a pod.
pub fn limits(p: &Pod) -> BTreeMap<String, String> {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.resources.as_ref())
        .and_then(|r| r.limits.as_ref())
        .map(|l| l.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default()
}

/// The first container's environment (literal values only).
pub fn env_of(p: &Pod) -> BTreeMap<String, String> {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.env.as_ref())
        .map(|e| {
            e.iter()
                .filter_map(|v| v.value.clone().map(|x| (v.name.clone(), x)))
                .collect()
        })
        .unwrap_or_default()
}

/// One recorded API request as RBAC sees it: (group, resource, verb), e.g.
/// `GET /apis/batch/v1/jobs?watch=true` is `("batch", "jobs", "watch")`.
/// `None` for discovery and other non-resource paths.
pub fn rbac_of(method: &str, path_and_query: &str) -> Option<(String, String, String)> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let (resource, named) = match rest {
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => return None,
    };
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method, named) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some((group.to_string(), resource, verb.to_string()))
}
