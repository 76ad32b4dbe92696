//! Pod status as a kubelet reports it: running, succeeded, failed (with an
//! exit code and reason such as OOMKilled), waiting (image pull errors) and
//! unschedulable, each with the container states and conditions it implies.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::ClusterError;
use crate::kinds::{Kind, Object};
use crate::store::{State, now};

/// A status change a test (acting as the kubelet or scheduler) applies.
#[derive(Clone, Debug)]
pub(crate) enum PodTransition {
    Running,
    Succeeded,
    Failed { exit_code: i32, reason: String },
    Waiting { reason: String, message: String },
    Unschedulable { message: String },
}

fn set_condition(
    conditions: &mut Vec<PodCondition>,
    type_: &str,
    status: &str,
    reason: Option<&str>,
    message: Option<&str>,
) {
    let at = now();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Some(at);
            }
            c.status = status.into();
            c.reason = reason.map(Into::into);
            c.message = message.map(Into::into);
        }
        None => conditions.push(PodCondition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.map(Into::into),
            message: message.map(Into::into),
            last_transition_time: Some(at),
            ..Default::default()
        }),
    }
}

fn started_at(status: Option<&ContainerStatus>) -> Option<Time> {
    let state = status?.state.as_ref()?;
    state
        .running
        .as_ref()
        .and_then(|r| r.started_at.clone())
        .or_else(|| state.terminated.as_ref().and_then(|t| t.started_at.clone()))
}

/// Applies `t` to the pod `namespace/name`.
pub(crate) fn transition(
    s: &mut State,
    namespace: &str,
    name: &str,
    t: PodTransition,
) -> Result<(), ClusterError> {
    let key = (Kind::Pod, namespace.to_string(), name.to_string());
    let Some(Object::Pod(mut pod)) = s.get(&key).cloned() else {
        return Err(ClusterError::NotFound {
            kind: "Pod",
            namespace: Some(namespace.into()),
            name: name.into(),
        });
    };
    let phase = pod
        .status
        .as_ref()
        .and_then(|st| st.phase.clone())
        .unwrap_or_default();
    if phase == "Succeeded" || phase == "Failed" {
        return Err(ClusterError::Terminal {
            namespace: namespace.into(),
            name: name.into(),
            phase,
        });
    }
    let unschedulable = crate::scheduler::unschedulable(&pod).and_then(|c| c.message.clone());
    if let Some(message) = unschedulable
        && pod.spec.as_ref().is_some_and(|sp| sp.node_name.is_none())
        && !matches!(t, PodTransition::Unschedulable { .. })
    {
        return Err(ClusterError::Unschedulable {
            namespace: namespace.into(),
            name: name.into(),
            message,
        });
    }
    let container_id = format!("containerd://{}", s.new_uid().replace('-', ""));
    let pod_ip = format!("10.244.{}.{}", (s.rv >> 8) % 256, s.rv % 254 + 1);
    let status = pod.status.get_or_insert_with(Default::default);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let containers = pod
        .spec
        .as_ref()
        .map(|sp| sp.containers.clone())
        .unwrap_or_default();
    let old_statuses = status.container_statuses.clone().unwrap_or_default();
    let at = now();
    let names: Vec<String> = containers.iter().map(|c| c.name.clone()).collect();
    let state_for = |name: &str| -> (ContainerState, bool, Option<bool>) {
        let old = old_statuses.iter().find(|c| c.name == name);
        match &t {
            PodTransition::Running => (
                ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: started_at(old).or_else(|| Some(at.clone())),
                    }),
                    ..Default::default()
                },
                true,
                Some(true),
            ),
            PodTransition::Succeeded | PodTransition::Failed { .. } => {
                let (exit_code, reason) = match &t {
                    PodTransition::Failed { exit_code, reason } => (*exit_code, reason.clone()),
                    _ => (0, "Completed".to_string()),
                };
                (
                    ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code,
                            reason: Some(reason),
                            started_at: started_at(old).or_else(|| Some(at.clone())),
                            finished_at: Some(at.clone()),
                            container_id: Some(container_id.clone()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    false,
                    Some(false),
                )
            }
            PodTransition::Waiting { reason, message } => (
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.clone()),
                        message: Some(message.clone()),
                    }),
                    ..Default::default()
                },
                false,
                Some(false),
            ),
            PodTransition::Unschedulable { .. } => (
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("ContainerCreating".into()),
                        message: None,
                    }),
                    ..Default::default()
                },
                false,
                Some(false),
            ),
        }
    };
    let unready = format!("containers with unready status: [{}]", names.join(" "));
    match &t {
        PodTransition::Running => {
            status.phase = Some("Running".into());
            status.start_time.get_or_insert_with(|| at.clone());
            status.pod_ip = Some(pod_ip.clone());
            status.pod_ips = Some(vec![k8s_openapi::api::core::v1::PodIP { ip: pod_ip }]);
            for c in [
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled",
            ] {
                set_condition(conditions, c, "True", None, None);
            }
        }
        PodTransition::Succeeded | PodTransition::Failed { .. } => {
            let (phase, reason) = if matches!(t, PodTransition::Succeeded) {
                ("Succeeded", "PodCompleted")
            } else {
                ("Failed", "PodFailed")
            };
            status.phase = Some(phase.into());
            status.start_time.get_or_insert_with(|| at.clone());
            set_condition(conditions, "PodReadyToStartContainers", "False", None, None);
            set_condition(conditions, "Ready", "False", Some(reason), None);
            set_condition(conditions, "ContainersReady", "False", Some(reason), None);
        }
        PodTransition::Waiting { .. } => {
            status.phase = Some("Pending".into());
            set_condition(conditions, "PodScheduled", "True", None, None);
            set_condition(
                conditions,
                "Ready",
                "False",
                Some("ContainersNotReady"),
                Some(&unready),
            );
            set_condition(
                conditions,
                "ContainersReady",
                "False",
                Some("ContainersNotReady"),
                Some(&unready),
            );
        }
        PodTransition::Unschedulable { message } => {
            status.phase = Some("Pending".into());
            set_condition(
                conditions,
                "PodScheduled",
                "False",
                Some("Unschedulable"),
                Some(message),
            );
        }
    }
    if !matches!(t, PodTransition::Unschedulable { .. }) {
        status.container_statuses = Some(
            containers
                .iter()
                .map(|c| {
                    let (state, ready, started) = state_for(&c.name);
                    let old = old_statuses.iter().find(|o| o.name == c.name);
                    ContainerStatus {
                        name: c.name.clone(),
                        image: c.image.clone().unwrap_or_default(),
                        image_id: String::new(),
                        container_id: state.waiting.is_none().then(|| container_id.clone()),
                        ready,
                        started,
                        restart_count: old.map_or(0, |o| o.restart_count),
                        state: Some(state),
                        ..Default::default()
                    }
                })
                .collect(),
        );
    }
    s.replace(Object::Pod(pod));
    Ok(())
}

/// Whether a stored pod has finished (the log follower stops there).
pub(crate) fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The reason a pod's container has not started, when it has not: the
/// log endpoint answers 400 for such a pod, as the kubelet does.
pub(crate) fn waiting_to_start(pod: &Pod, container: &str) -> Option<String> {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    match statuses.and_then(|cs| cs.iter().find(|c| c.name == container)) {
        None => Some("ContainerCreating".into()),
        Some(c) => {
            let state = c.state.as_ref()?;
            if state.running.is_some() || state.terminated.is_some() {
                None
            } else {
                Some(
                    state
                        .waiting
                        .as_ref()
                        .and_then(|w| w.reason.clone())
                        .unwrap_or_else(|| "ContainerCreating".into()),
                )
            }
        }
    }
}
