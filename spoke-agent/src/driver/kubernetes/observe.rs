//! What a Job and its pods say about a run, in Axle's terms: waiting,
//! started (every replica running), succeeded, or failed with the reason a
//! person needs (OOMKilled, an image that cannot be pulled, a bad config,
//! refused by the namespace's quota, past its deadline). A pod the
//! scheduler cannot place yet waits, as on any cluster.
//! Pure: objects in, an observation out.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod};

use super::manifest::COMPLETION_INDEX_ANNOTATION;

/// Container waiting reasons that do not fix themselves: reported at once
/// as a failure instead of a silent hang.
pub const FATAL_WAITING_REASONS: &[&str] = &[
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// Not every replica runs yet (or the pods are still being made).
    Waiting,
    /// Every replica runs.
    Started,
    Succeeded,
    Failed {
        exit_code: i32,
        message: String,
    },
}

fn replica_of(pod: &Pod) -> String {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(COMPLETION_INDEX_ANNOTATION))
        .or_else(|| {
            pod.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(COMPLETION_INDEX_ANNOTATION))
        })
        .cloned()
        .unwrap_or_else(|| "0".into())
}

/// A pod whose final state has not been seen yet.
fn pod_is_live(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The failure a pod shows, if any.
fn pod_failure(pod: &Pod) -> Option<(i32, String)> {
    let status = pod.status.as_ref()?;
    let r = replica_of(pod);
    for c in status.container_statuses.iter().flatten() {
        let state = c.state.as_ref();
        if let Some(t) = state.and_then(|s| s.terminated.as_ref())
            && t.exit_code != 0
        {
            let reason = t.reason.clone().unwrap_or_else(|| "Error".into());
            return Some((
                t.exit_code,
                format!(
                    "replica {r}: container exited with code {} ({reason})",
                    t.exit_code
                ),
            ));
        }
        if let Some(w) = state.and_then(|s| s.waiting.as_ref())
            && let Some(reason) = &w.reason
            && FATAL_WAITING_REASONS.contains(&reason.as_str())
        {
            let detail = w.message.clone().unwrap_or_default();
            return Some((
                -1,
                format!("replica {r}: {reason}: {detail}")
                    .trim_end_matches(": ")
                    .to_string(),
            ));
        }
    }
    if status.phase.as_deref() == Some("Failed") {
        let why = status
            .reason
            .clone()
            .or_else(|| status.message.clone())
            .unwrap_or_else(|| "the pod failed".into());
        return Some((-1, format!("replica {r}: {why}")));
    }
    // A pod the scheduler cannot place now (PodScheduled False,
    // Unschedulable) is not a failure: like any Kubernetes pod it waits,
    // Pending, and is bound once its node has room (observed: three
    // quarters reported Failed with `Insufficient nvidia.com/gpu.shared`).
    None
}

/// The Job's state from itself, its pods and its events.
pub fn observe(job: &Job, pods: &[&Pod], events: &[&Event]) -> Observation {
    let spec = job.spec.as_ref();
    let want = spec.and_then(|s| s.parallelism).unwrap_or(1).max(1) as usize;
    let status = job.status.as_ref();
    for c in status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
    {
        if c.status != "True" {
            continue;
        }
        match c.type_.as_str() {
            "Complete" => return Observation::Succeeded,
            "Failed" => {
                // The pod's own reason says more than the Job's summary.
                if let Some((exit_code, message)) = pods.iter().find_map(|p| pod_failure(p)) {
                    return Observation::Failed { exit_code, message };
                }
                let reason = c.reason.clone().unwrap_or_default();
                // Jobs and pods come from separate watches: a Job failed
                // by its pods can arrive before those pods' final state —
                // whatever reason the condition carries, or none (observed:
                // a pod that exited 3 reported as `exit code -1 (: )`).
                // Wait for the pods' terminated state rather than report a
                // reason-less -1; only a deadline kills pods that never end.
                if reason != "DeadlineExceeded" && pods.iter().any(|p| pod_is_live(p)) {
                    return Observation::Waiting;
                }
                let detail = c.message.clone().unwrap_or_default();
                let message = match (reason.as_str(), detail.as_str()) {
                    ("DeadlineExceeded", _)
                        if job
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(super::controller::DEADLINE_ANNOTATION))
                            .is_some_and(|v| v == "lease") =>
                    {
                        "stopped by its deadline: the spoke could not confirm the run in time \
                         (it hung, or was cut off from the hub)"
                            .to_string()
                    }
                    ("DeadlineExceeded", _) => {
                        "exceeded its max runtime (activeDeadlineSeconds)".to_string()
                    }
                    ("", "") => "the Job failed; Kubernetes gave no reason".to_string(),
                    ("", d) => d.to_string(),
                    (r, "") => r.to_string(),
                    (r, d) => format!("{r}: {d}"),
                };
                return Observation::Failed {
                    exit_code: -1,
                    message,
                };
            }
            _ => {}
        }
    }
    if let Some((exit_code, message)) = pods.iter().find_map(|p| pod_failure(p)) {
        return Observation::Failed { exit_code, message };
    }
    // Pods the Job controller could not create: quota, admission.
    if let Some(e) = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FailedCreate"))
        .max_by_key(|e| {
            e.metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok())
        })
        && pods.len() < want
    {
        return Observation::Failed {
            exit_code: -1,
            message: format!(
                "Kubernetes refused its pods: {}",
                e.message.clone().unwrap_or_default()
            ),
        };
    }
    let succeeded = status.and_then(|s| s.succeeded).unwrap_or(0) as usize;
    if succeeded >= want {
        return Observation::Succeeded;
    }
    let running = pods
        .iter()
        .filter(|p| {
            matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Running") | Some("Succeeded")
            )
        })
        .count();
    if running >= want {
        Observation::Started
    } else {
        Observation::Waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{JobCondition, JobSpec, JobStatus};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
        PodCondition, PodStatus,
    };

    fn job(parallelism: i32) -> Job {
        Job {
            spec: Some(JobSpec {
                parallelism: Some(parallelism),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(phase: &str, state: Option<ContainerState>) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: state.map(|s| {
                    vec![ContainerStatus {
                        name: "workload".into(),
                        state: Some(s),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn started_once_every_replica_runs_then_succeeded_when_complete() {
        let j = job(2);
        let (p1, p2) = (pod("Running", None), pod("Pending", None));
        assert_eq!(observe(&j, &[&p1, &p2], &[]), Observation::Waiting);
        let p2 = pod("Running", None);
        assert_eq!(observe(&j, &[&p1, &p2], &[]), Observation::Started);
        let mut done = job(2);
        done.status = Some(JobStatus {
            conditions: Some(vec![JobCondition {
                type_: "Complete".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert_eq!(observe(&done, &[], &[]), Observation::Succeeded);
    }

    #[test]
    fn a_job_failed_by_its_pods_waits_for_the_pods_final_state() {
        let mut failed = job(1);
        failed.status = Some(JobStatus {
            conditions: Some(vec![JobCondition {
                type_: "Failed".into(),
                status: "True".into(),
                reason: Some("BackoffLimitExceeded".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        // The pod watch still shows it running: not yet a reason-less -1.
        let running = pod("Running", None);
        assert_eq!(observe(&failed, &[&running], &[]), Observation::Waiting);
        let oom = pod(
            "Failed",
            Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some("OOMKilled".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        );
        assert!(matches!(
            observe(&failed, &[&oom], &[]),
            Observation::Failed { exit_code: 137, .. }
        ));
        // Pods gone: the Job's own reason.
        assert!(matches!(
            observe(&failed, &[], &[]),
            Observation::Failed { exit_code: -1, .. }
        ));
    }

    #[test]
    fn a_failed_job_without_a_reason_reports_the_pods_exit_code() {
        // Observed: a pod that exited 3 was reported as `exit code -1 (: )`
        // when the Job's Failed condition carried no reason and the pod
        // watch had not yet shown the pod's end.
        let mut failed = job(1);
        failed.status = Some(JobStatus {
            conditions: Some(vec![JobCondition {
                type_: "Failed".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let running = pod("Running", None);
        assert_eq!(observe(&failed, &[&running], &[]), Observation::Waiting);
        let exited = pod(
            "Failed",
            Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 3,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        );
        assert_eq!(
            observe(&failed, &[&exited], &[]),
            Observation::Failed {
                exit_code: 3,
                message: "replica 0: container exited with code 3 (Error)".into()
            }
        );
        match observe(&failed, &[], &[]) {
            Observation::Failed { message, .. } => {
                assert_eq!(message, "the Job failed; Kubernetes gave no reason")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn oom_image_pull_and_config_are_failures_with_reasons_unschedulable_waits() {
        let j = job(1);
        let oom = pod(
            "Failed",
            Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some("OOMKilled".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        );
        assert_eq!(
            observe(&j, &[&oom], &[]),
            Observation::Failed {
                exit_code: 137,
                message: "replica 0: container exited with code 137 (OOMKilled)".into()
            }
        );
        for reason in [
            "ImagePullBackOff",
            "ErrImagePull",
            "CreateContainerConfigError",
        ] {
            let p = pod(
                "Pending",
                Some(ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.into()),
                        message: Some("details".into()),
                    }),
                    ..Default::default()
                }),
            );
            match observe(&j, &[&p], &[]) {
                Observation::Failed { message, .. } => {
                    assert!(message.contains(reason), "{message}")
                }
                other => panic!("{reason}: {other:?}"),
            }
        }
        let mut p = pod("Pending", None);
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some("0/3 nodes are available: insufficient nvidia.com/gpu".into()),
            ..Default::default()
        }]);
        // Unschedulable now: it waits, Pending, as Kubernetes retries it.
        assert_eq!(observe(&j, &[&p], &[]), Observation::Waiting);
    }

    #[test]
    fn a_quota_refusal_is_reported_with_kubernetes_message() {
        let j = job(1);
        let e = Event {
            reason: Some("FailedCreate".into()),
            message: Some("pods \"x\" is forbidden: exceeded quota: axle-gpus, requested: nvidia.com/gpu=2, used: nvidia.com/gpu=3, limited: nvidia.com/gpu=4".into()),
            ..Default::default()
        };
        match observe(&j, &[], &[&e]) {
            Observation::Failed { message, .. } => {
                assert!(message.contains("exceeded quota: axle-gpus"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}
