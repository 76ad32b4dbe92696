//! `Cluster`: the shared in-memory cluster a server serves, and the controls
//! a test uses on it directly (acting as kubelet, scheduler and admin).

use std::sync::{Arc, Mutex, MutexGuard};

use axum::http::Method;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ResourceQuota};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::watch;

use crate::admission::SYSTEM_PRIORITY_CLASSES;
use crate::kinds::{Kind, Object};
use crate::kubelet::{self, PodTransition};
use crate::store::State;
use crate::{api, controller};

/// Why a test control could not do what it was asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// The object does not exist.
    #[error("{kind} {}{name} not found", namespace.as_ref().map(|n| format!("{n}/")).unwrap_or_default())]
    NotFound {
        /// The kind ("Pod", "Node").
        kind: &'static str,
        /// The namespace, for namespaced kinds.
        namespace: Option<String>,
        /// The name.
        name: String,
    },
    /// The pod already finished; a kubelet never restarts a terminal pod.
    #[error("pod {namespace}/{name} already finished ({phase})")]
    Terminal {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        name: String,
        /// Its phase, Succeeded or Failed.
        phase: String,
    },
    /// The API server's admission or validation refused it (the message is
    /// the one an HTTP client would get).
    #[error("{0}")]
    Rejected(String),
    /// The scheduler left the pod unbound (its node lacks a resource): no
    /// kubelet has it, so it cannot run or end.
    #[error("pod {namespace}/{name} is unschedulable: {message}")]
    Unschedulable {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        name: String,
        /// The scheduler's message (`0/2 nodes are available: …`).
        message: String,
    },
}

/// One deletion a client requested over the API, with the options it sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeleteRecord {
    /// The kind ("Job").
    pub kind: String,
    /// The namespace, for namespaced kinds.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
    /// `propagationPolicy` as sent (None: the server default applied, which
    /// for batch/v1 Jobs is Orphan).
    pub propagation_policy: Option<String>,
    /// `gracePeriodSeconds` as sent.
    pub grace_period_seconds: Option<i64>,
}

struct Inner {
    state: Mutex<State>,
    /// Bumped after every write batch; watches and log followers wait on it.
    changed: watch::Sender<u64>,
}

/// The in-memory cluster ("etcd" plus test controls). Cloning shares it; it
/// outlives the servers that serve it.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster::new()
    }
}

impl Cluster {
    /// A cluster with the namespaces and priority classes every cluster has
    /// (`default`, `kube-system`, `kube-public`, `kube-node-lease`;
    /// `system-cluster-critical`, `system-node-critical`).
    pub fn new() -> Cluster {
        let cluster = Cluster {
            inner: Arc::new(Inner {
                state: Mutex::new(State::new()),
                changed: watch::channel(0).0,
            }),
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let _ = cluster.add_namespace(Namespace {
                metadata: meta(ns),
                ..Default::default()
            });
        }
        for (name, value) in SYSTEM_PRIORITY_CLASSES {
            let _ = cluster.add_priority_class(PriorityClass {
                metadata: meta(name),
                value,
                ..Default::default()
            });
        }
        cluster
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves the state usable
        // for the test that is failing anyway; never cascade panics.
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs a write, then the controllers, then wakes watchers.
    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut s = self.lock();
        let r = f(&mut s);
        controller::run(&mut s);
        if std::mem::take(&mut s.dirty) {
            self.inner.changed.send_modify(|g| *g += 1);
        }
        r
    }

    /// Syncs every unfinished Job with an `activeDeadlineSeconds`: the Job
    /// controller's delayed requeue at the deadline, so a deadline passes
    /// even when nothing else touches the Job.
    pub(crate) fn sync_deadlines(&self) {
        let due: Vec<(String, String)> = self.read(|s| {
            s.iter_kind(Kind::Job, None)
                .filter_map(|o| match o {
                    Object::Job(j) => Some(j),
                    _ => None,
                })
                .filter(|j| {
                    j.spec
                        .as_ref()
                        .is_some_and(|sp| sp.active_deadline_seconds.is_some())
                })
                .filter(|j| {
                    !j.status.as_ref().is_some_and(|st| {
                        st.conditions.as_ref().is_some_and(|c| {
                            c.iter().any(|c| {
                                (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True"
                            })
                        })
                    })
                })
                .filter_map(|j| Some((j.metadata.namespace.clone()?, j.metadata.name.clone()?)))
                .collect()
        });
        if !due.is_empty() {
            self.write(|s| s.jobs_to_sync.extend(due));
        }
    }

    /// Runs a read.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.lock())
    }

    /// A receiver that changes after every write.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    fn create(&self, obj: Object) -> Result<Object, ClusterError> {
        self.write(|s| api::create_object(s, obj, false))
            .map_err(|e| ClusterError::Rejected(e.message))
    }

    fn list<K>(&self, kind: Kind, namespace: Option<&str>, f: fn(&Object) -> Option<K>) -> Vec<K> {
        self.read(|s| {
            s.iter_kind(kind, namespace.filter(|_| kind.namespaced()))
                .filter_map(f)
                .collect()
        })
    }

    fn get<K>(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        f: fn(&Object) -> Option<K>,
    ) -> Option<K> {
        let ns = if kind.namespaced() {
            namespace.to_string()
        } else {
            String::new()
        };
        self.read(|s| s.get(&(kind, ns, name.to_string())).and_then(f))
    }

    /// Adds a node (as the kubelet registering it).
    pub fn add_node(&self, node: Node) -> Result<Node, ClusterError> {
        self.create(Object::Node(node))
            .map(|o| node_of(&o).unwrap_or_default())
    }

    /// Changes a node in place (cordon, taints, labels, allocatable, the
    /// Ready condition); one MODIFIED event.
    pub fn update_node(&self, name: &str, f: impl FnOnce(&mut Node)) -> Result<Node, ClusterError> {
        self.write(|s| {
            let key = (Kind::Node, String::new(), name.to_string());
            let Some(Object::Node(mut node)) = s.get(&key).cloned() else {
                return Err(ClusterError::NotFound {
                    kind: "Node",
                    namespace: None,
                    name: name.into(),
                });
            };
            f(&mut node);
            node.metadata.name = Some(name.to_string());
            Ok(node_of(&s.replace(Object::Node(node))).unwrap_or_default())
        })
    }

    /// Removes a node (pods bound to it stay, as until the pod GC runs).
    pub fn delete_node(&self, name: &str) -> Result<(), ClusterError> {
        self.write(|s| s.remove(&(Kind::Node, String::new(), name.to_string())))
            .map(|_| ())
            .ok_or_else(|| ClusterError::NotFound {
                kind: "Node",
                namespace: None,
                name: name.into(),
            })
    }

    /// Adds a namespace (admin).
    pub fn add_namespace(&self, namespace: Namespace) -> Result<Namespace, ClusterError> {
        self.create(Object::Namespace(namespace)).map(|o| {
            if let Object::Namespace(n) = o {
                n
            } else {
                Namespace::default()
            }
        })
    }

    /// Adds a ResourceQuota (admin); its status is computed at once.
    pub fn add_resource_quota(&self, quota: ResourceQuota) -> Result<ResourceQuota, ClusterError> {
        let ns = quota.metadata.namespace.clone().unwrap_or_default();
        let name = quota.metadata.name.clone().unwrap_or_default();
        self.create(Object::ResourceQuota(quota))?;
        self.get_resource_quota(&ns, &name)
            .ok_or(ClusterError::NotFound {
                kind: "ResourceQuota",
                namespace: Some(ns),
                name,
            })
    }

    /// Adds a PriorityClass (admin).
    pub fn add_priority_class(&self, class: PriorityClass) -> Result<PriorityClass, ClusterError> {
        self.create(Object::PriorityClass(class)).map(|o| {
            if let Object::PriorityClass(p) = o {
                p
            } else {
                PriorityClass::default()
            }
        })
    }

    /// The nodes.
    pub fn nodes(&self) -> Vec<Node> {
        self.list(Kind::Node, None, node_of)
    }

    /// Pods in a namespace, or in all (None).
    pub fn pods(&self, namespace: Option<&str>) -> Vec<Pod> {
        self.list(Kind::Pod, namespace, |o| {
            if let Object::Pod(p) = o {
                Some(p.clone())
            } else {
                None
            }
        })
    }

    /// One pod.
    pub fn get_pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.get(Kind::Pod, namespace, name, |o| {
            if let Object::Pod(p) = o {
                Some(p.clone())
            } else {
                None
            }
        })
    }

    /// Jobs in a namespace, or in all (None).
    pub fn jobs(&self, namespace: Option<&str>) -> Vec<Job> {
        self.list(Kind::Job, namespace, |o| {
            if let Object::Job(j) = o {
                Some(j.clone())
            } else {
                None
            }
        })
    }

    /// One job.
    pub fn get_job(&self, namespace: &str, name: &str) -> Option<Job> {
        self.get(Kind::Job, namespace, name, |o| {
            if let Object::Job(j) = o {
                Some(j.clone())
            } else {
                None
            }
        })
    }

    /// The namespaces.
    pub fn namespaces(&self) -> Vec<Namespace> {
        self.list(Kind::Namespace, None, |o| {
            if let Object::Namespace(n) = o {
                Some(n.clone())
            } else {
                None
            }
        })
    }

    /// ResourceQuotas in a namespace, or in all (None).
    pub fn resource_quotas(&self, namespace: Option<&str>) -> Vec<ResourceQuota> {
        self.list(Kind::ResourceQuota, namespace, |o| {
            if let Object::ResourceQuota(q) = o {
                Some(q.clone())
            } else {
                None
            }
        })
    }

    /// One ResourceQuota.
    pub fn get_resource_quota(&self, namespace: &str, name: &str) -> Option<ResourceQuota> {
        self.get(Kind::ResourceQuota, namespace, name, |o| {
            if let Object::ResourceQuota(q) = o {
                Some(q.clone())
            } else {
                None
            }
        })
    }

    /// Roles in a namespace, or in all (None).
    pub fn roles(&self, namespace: Option<&str>) -> Vec<Role> {
        self.list(Kind::Role, namespace, |o| {
            if let Object::Role(r) = o {
                Some(r.clone())
            } else {
                None
            }
        })
    }

    /// RoleBindings in a namespace, or in all (None).
    pub fn role_bindings(&self, namespace: Option<&str>) -> Vec<RoleBinding> {
        self.list(Kind::RoleBinding, namespace, |o| {
            if let Object::RoleBinding(r) = o {
                Some(r.clone())
            } else {
                None
            }
        })
    }

    /// The PriorityClasses.
    pub fn priority_classes(&self) -> Vec<PriorityClass> {
        self.list(Kind::PriorityClass, None, |o| {
            if let Object::PriorityClass(p) = o {
                Some(p.clone())
            } else {
                None
            }
        })
    }

    /// core/v1 Events in a namespace, or in all (None), oldest name first.
    pub fn events(&self, namespace: Option<&str>) -> Vec<Event> {
        self.list(Kind::Event, namespace, |o| {
            if let Object::Event(e) = o {
                Some(e.clone())
            } else {
                None
            }
        })
    }

    fn transition(&self, namespace: &str, pod: &str, t: PodTransition) -> Result<(), ClusterError> {
        self.write(|s| kubelet::transition(s, namespace, pod, t))
    }

    /// The pod's containers run and are ready (phase Running).
    pub fn set_pod_running(&self, namespace: &str, pod: &str) -> Result<(), ClusterError> {
        self.transition(namespace, pod, PodTransition::Running)
    }

    /// The pod's containers exited 0 (phase Succeeded).
    pub fn set_pod_succeeded(&self, namespace: &str, pod: &str) -> Result<(), ClusterError> {
        self.transition(namespace, pod, PodTransition::Succeeded)
    }

    /// The pod's containers terminated with `exit_code` and `reason` (e.g.
    /// 137 and "OOMKilled", or 1 and "Error"); phase Failed.
    pub fn set_pod_failed(
        &self,
        namespace: &str,
        pod: &str,
        exit_code: i32,
        reason: &str,
    ) -> Result<(), ClusterError> {
        self.transition(
            namespace,
            pod,
            PodTransition::Failed {
                exit_code,
                reason: reason.into(),
            },
        )
    }

    /// The pod's containers wait with `reason` ("ImagePullBackOff",
    /// "ErrImagePull", "CreateContainerConfigError"); phase Pending.
    pub fn set_pod_waiting(
        &self,
        namespace: &str,
        pod: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), ClusterError> {
        self.transition(
            namespace,
            pod,
            PodTransition::Waiting {
                reason: reason.into(),
                message: message.into(),
            },
        )
    }

    /// The scheduler cannot place the pod: PodScheduled False, reason
    /// Unschedulable, with `message` (e.g. "0/3 nodes are available: 3
    /// Insufficient nvidia.com/gpu.").
    pub fn set_pod_unschedulable(
        &self,
        namespace: &str,
        pod: &str,
        message: &str,
    ) -> Result<(), ClusterError> {
        self.transition(
            namespace,
            pod,
            PodTransition::Unschedulable {
                message: message.into(),
            },
        )
    }

    /// Appends bytes to the pod's log (served by `.../pods/{name}/log`).
    pub fn append_pod_log(&self, namespace: &str, pod: &str, bytes: impl AsRef<[u8]>) {
        self.write(|s| s.append_log(namespace, pod, bytes.as_ref()));
    }

    /// When on, every pod the Job controller creates goes Running and then
    /// Succeeded at once (dispatch-rate benchmarks).
    pub fn set_auto_complete(&self, on: bool) {
        self.write(|s| s.auto_complete = on);
    }

    /// Forgets the watch history up to now: open watches end with an ERROR
    /// event (410 Expired) and a watch resuming from an older
    /// resourceVersion gets the same, so clients relist — what an etcd
    /// compaction or a watch-cache reset does to them.
    pub fn compact(&self) {
        self.write(State::compact);
    }

    /// The cluster's current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.read(|s| s.rv)
    }

    /// The requests served so far (method and path with query), oldest
    /// first; the last `MAX_REQUEST_LOG` only.
    pub fn requests(&self) -> Vec<(Method, String)> {
        self.read(|s| s.requests.iter().cloned().collect())
    }

    /// The deletions clients requested, with their options, oldest first.
    pub fn deletions(&self) -> Vec<DeleteRecord> {
        self.read(|s| s.deletions.iter().cloned().collect())
    }
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        ..Default::default()
    }
}

fn node_of(o: &Object) -> Option<Node> {
    if let Object::Node(n) = o {
        Some(n.clone())
    } else {
        None
    }
}
