//! The controllers that run inside the server after every write: the Job
//! controller (pods from templates, status counts, completion and failure)
//! and the ResourceQuota status controller, plus the event recorder.

use std::collections::{BTreeMap, BTreeSet};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::admission::{self, COMPLETION_INDEX};
use crate::api;
use crate::kinds::{Kind, Object};
use crate::kubelet::{self, PodTransition};
use crate::store::{Key, State, now};

pub(crate) use crate::admission::{admit_create, admit_update};

/// Most controller steps (one job sync or one namespace's quota sync) one
/// write may trigger. A real write triggers a handful; auto-complete of a
/// large indexed job a few per index. The cap turns a feedback-loop bug
/// into a logged error instead of a hung server.
const MAX_CONTROLLER_STEPS: usize = 1_000_000;

/// Most pods one Job sync creates, as in the real controller
/// (`MaxPodCreateDeletePerSync`); the created pods queue the Job again, so a
/// wide Job fills up over a few passes instead of in one unbounded loop.
const MAX_PODS_PER_SYNC: usize = 500;

/// The job controller's name in events.
const JOB_CONTROLLER: &str = "job-controller";

/// Per-Job bookkeeping the real controller keeps with finalizers and
/// `uncountedTerminatedPods`: which pods were already counted, so counts
/// survive the pods' deletion and nothing is counted twice.
#[derive(Clone, Debug, Default)]
pub(crate) struct JobTracking {
    succeeded: BTreeSet<String>,
    failed: BTreeSet<String>,
    active: BTreeSet<String>,
    succeeded_indexes: BTreeSet<i32>,
}

fn controller_job(obj: &Object) -> Option<String> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true) && r.kind == "Job" && r.api_version == "batch/v1")
        .map(|r| r.name.clone())
}

fn pod_terminal(obj: Option<&Object>) -> bool {
    matches!(obj, Some(Object::Pod(p)) if matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")))
}

fn spec_of(obj: Option<&Object>) -> Option<serde_json::Value> {
    obj.map(|o| o.to_value().get("spec").cloned().unwrap_or_default())
}

/// Queues controller work for a write (called by the store on every change).
pub(crate) fn note_write(s: &mut State, key: &Key, old: Option<&Object>, new: Option<&Object>) {
    let ns = key.1.clone();
    match key.0 {
        Kind::Pod => {
            if let Some(job) = new.or(old).and_then(controller_job) {
                s.jobs_to_sync.insert((ns.clone(), job));
            }
            s.quota_namespaces_to_sync.insert(ns.clone());
            // Capacity came free: jobs refused by quota try again, and
            // pods left unschedulable may now fit their node.
            if new.is_none() || (pod_terminal(new) && !pod_terminal(old)) {
                retry_blocked(s, &ns);
                s.reschedule = true;
            }
        }
        Kind::Job => match new {
            // The controller's own status writes leave the spec alone and
            // so do not queue another pass.
            Some(_) if old.is_none() || spec_of(old) != spec_of(new) => {
                s.jobs_to_sync.insert((ns, key.2.clone()));
            }
            Some(_) => {}
            None => {
                if let Some(uid) = old.and_then(|o| o.meta().uid.clone()) {
                    s.tracking.remove(&uid);
                }
                s.blocked_jobs.remove(&(ns, key.2.clone()));
            }
        },
        Kind::ResourceQuota if new.is_none() || spec_of(old) != spec_of(new) => {
            s.quota_namespaces_to_sync.insert(ns.clone());
            retry_blocked(s, &ns);
        }
        Kind::PriorityClass => {
            let all: Vec<String> = s.blocked_jobs.iter().map(|(ns, _)| ns.clone()).collect();
            for ns in all {
                retry_blocked(s, &ns);
            }
        }
        _ => {}
    }
}

fn retry_blocked(s: &mut State, ns: &str) {
    let start = (ns.to_string(), String::new());
    let blocked: Vec<(String, String)> = s
        .blocked_jobs
        .range(start..)
        .take_while(|(n, _)| n == ns)
        .cloned()
        .collect();
    for job in blocked {
        s.blocked_jobs.remove(&job);
        s.jobs_to_sync.insert(job);
    }
}

/// Runs queued controller work until the cluster is quiet.
pub(crate) fn run(s: &mut State) {
    for _ in 0..MAX_CONTROLLER_STEPS {
        if let Some((ns, name)) = s.jobs_to_sync.pop_first() {
            sync_job(s, &ns, &name);
        } else if let Some(ns) = s.quota_namespaces_to_sync.pop_first() {
            admission::sync_quotas(s, &ns);
        } else if std::mem::take(&mut s.reschedule) {
            crate::scheduler::schedule_unscheduled(s);
        } else {
            return;
        }
    }
    tracing::error!(
        "kube test server: controllers did not settle after {MAX_CONTROLLER_STEPS} steps; dropping queued work"
    );
    s.jobs_to_sync.clear();
    s.quota_namespaces_to_sync.clear();
}

/// Records (or aggregates into `count`) a core/v1 Event about `involved`.
pub(crate) fn record_event(
    s: &mut State,
    involved: &Object,
    type_: &str,
    reason: &str,
    message: &str,
    component: &str,
) {
    let meta = involved.meta();
    let uid = meta.uid.clone().unwrap_or_default();
    let index_key = format!("{uid}\u{0}{type_}\u{0}{reason}\u{0}{message}");
    if let Some(key) = s.event_index.get(&index_key).cloned()
        && let Some(Object::Event(mut event)) = s.get(&key).cloned()
    {
        event.count = Some(event.count.unwrap_or(1) + 1);
        event.last_timestamp = Some(now());
        s.replace(Object::Event(event));
        return;
    }
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let name = format!(
        "{}.{:x}{}",
        meta.name.clone().unwrap_or_default(),
        Timestamp::now().as_nanosecond(),
        s.random_suffix()
    );
    let at = now();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(involved.kind().api_version().into()),
            kind: Some(involved.kind().name().into()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            field_path: None,
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some(type_.into()),
        count: Some(1),
        first_timestamp: Some(at.clone()),
        last_timestamp: Some(at),
        source: Some(EventSource {
            component: Some(component.into()),
            host: None,
        }),
        reporting_component: Some(component.into()),
        reporting_instance: Some(String::new()),
        ..Default::default()
    };
    s.insert(Object::Event(event));
    s.event_index
        .insert(index_key, (Kind::Event, namespace, name));
}

fn job_condition(type_: &str, reason: &str, message: &str) -> JobCondition {
    let at = now();
    JobCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_probe_time: Some(at.clone()),
        last_transition_time: Some(at),
    }
}

fn is_finished(status: &JobStatus) -> bool {
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
}

/// "0-2,4,6-7": the API's compressed index list.
fn format_indexes(indexes: &BTreeSet<i32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = indexes.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    out.join(",")
}

fn pod_index(pod: &Pod) -> Option<i32> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(COMPLETION_INDEX))
        .and_then(|i| i.parse().ok())
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// One Job controller pass: count pods, finish or fail the Job, or create
/// the pods it is missing.
fn sync_job(s: &mut State, ns: &str, name: &str) {
    let job_key = (Kind::Job, ns.to_string(), name.to_string());
    let Some(Object::Job(job)) = s.get(&job_key).cloned() else {
        return;
    };
    let Some(spec) = job.spec.clone() else { return };
    if spec
        .managed_by
        .as_deref()
        .is_some_and(|m| m != "kubernetes.io/job-controller")
    {
        return;
    }
    let mut status = job.status.clone().unwrap_or_default();
    if is_finished(&status) {
        return;
    }
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let mut track = s.tracking.remove(&uid).unwrap_or_default();
    let pods: Vec<Pod> = s
        .owned_by(&uid)
        .into_iter()
        .filter(|k| k.0 == Kind::Pod)
        .filter_map(|k| match s.get(&k) {
            Some(Object::Pod(p)) => Some(p.clone()),
            _ => None,
        })
        .collect();
    let mut active: Vec<Pod> = Vec::new();
    for pod in pods {
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => {
                if track.succeeded.insert(pod_uid)
                    && let Some(i) = pod_index(&pod)
                {
                    track.succeeded_indexes.insert(i);
                }
            }
            Some("Failed") => {
                track.failed.insert(pod_uid);
            }
            _ => active.push(pod),
        }
    }
    // A pod deleted while active counts as failed (podReplacementPolicy
    // TerminatingOrFailed, pod tracking with finalizers).
    let present: BTreeSet<String> = active
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    for gone in track
        .active
        .difference(&present)
        .cloned()
        .collect::<Vec<_>>()
    {
        if !track.succeeded.contains(&gone) {
            track.failed.insert(gone);
        }
    }
    track.active = present;

    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let parallelism = spec.parallelism.unwrap_or(1).max(0) as usize;
    let backoff_limit = spec.backoff_limit.unwrap_or(6).max(0) as usize;
    let suspended = spec.suspend == Some(true);
    let succeeded = track.succeeded.len();
    let failed = track.failed.len();
    let complete = match (indexed, spec.completions) {
        (true, Some(c)) => track.succeeded_indexes.len() >= c.max(0) as usize,
        (false, Some(c)) => succeeded >= c.max(0) as usize,
        // Work-queue mode: done once any pod succeeded and none still runs.
        (_, None) => succeeded >= 1 && active.is_empty(),
    };
    if status.start_time.is_none() && !suspended {
        status.start_time = Some(now());
    }
    // activeDeadlineSeconds is checked lazily, whenever the Job is synced.
    let deadline_passed = spec
        .active_deadline_seconds
        .zip(status.start_time.as_ref())
        .is_some_and(|(d, start)| {
            start
                .0
                .checked_add(SignedDuration::from_secs(d))
                .is_ok_and(|end| end <= Timestamp::now())
        });
    let failure = if complete {
        None
    } else if failed > backoff_limit {
        Some((
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
        ))
    } else if deadline_passed {
        Some((
            "DeadlineExceeded",
            "Job was active longer than specified deadline",
        ))
    } else {
        None
    };
    let job_obj = Object::Job(job.clone());
    let stop_active = |s: &mut State, track: &mut JobTracking, active: &mut Vec<Pod>| {
        for pod in active.drain(..) {
            let pod_name = pod.metadata.name.clone().unwrap_or_default();
            if let Some(uid) = &pod.metadata.uid {
                track.active.remove(uid);
            }
            api::delete_with_policy(
                s,
                &(Kind::Pod, ns.to_string(), pod_name.clone()),
                "Background",
            );
            record_event(
                s,
                &job_obj,
                "Normal",
                "SuccessfulDelete",
                &format!("Deleted pod: {pod_name}"),
                JOB_CONTROLLER,
            );
        }
    };
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if let Some((reason, message)) = failure {
        stop_active(s, &mut track, &mut active);
        conditions.push(job_condition("FailureTarget", reason, message));
        conditions.push(job_condition("Failed", reason, message));
        record_event(s, &job_obj, "Warning", reason, message, JOB_CONTROLLER);
    } else if complete {
        stop_active(s, &mut track, &mut active);
        let message = "Reached expected number of succeeded pods";
        conditions.push(job_condition(
            "SuccessCriteriaMet",
            "CompletionsReached",
            message,
        ));
        conditions.push(job_condition("Complete", "CompletionsReached", message));
        status.completion_time = Some(now());
        record_event(
            s,
            &job_obj,
            "Normal",
            "Completed",
            "Job completed",
            JOB_CONTROLLER,
        );
    } else if suspended {
        stop_active(s, &mut track, &mut active);
        if !conditions
            .iter()
            .any(|c| c.type_ == "Suspended" && c.status == "True")
        {
            conditions.retain(|c| c.type_ != "Suspended");
            conditions.push(job_condition("Suspended", "JobSuspended", "Job suspended"));
            record_event(
                s,
                &job_obj,
                "Normal",
                "Suspended",
                "Job suspended",
                JOB_CONTROLLER,
            );
        }
    } else {
        if let Some(c) = conditions
            .iter_mut()
            .find(|c| c.type_ == "Suspended" && c.status == "True")
        {
            *c = JobCondition {
                status: "False".into(),
                ..job_condition("Suspended", "JobResumed", "Job resumed")
            };
            record_event(
                s,
                &job_obj,
                "Normal",
                "Resumed",
                "Job resumed",
                JOB_CONTROLLER,
            );
        }
        let wanted: Vec<Option<i32>> = if indexed {
            let running: BTreeSet<i32> = active.iter().filter_map(pod_index).collect();
            (0..spec.completions.unwrap_or(0))
                .filter(|i| !track.succeeded_indexes.contains(i) && !running.contains(i))
                .take(
                    parallelism
                        .saturating_sub(active.len())
                        .min(MAX_PODS_PER_SYNC),
                )
                .map(Some)
                .collect()
        } else {
            let remaining = match spec.completions {
                Some(c) => (c.max(0) as usize).saturating_sub(succeeded),
                None if succeeded > 0 => 0,
                None => parallelism,
            };
            vec![
                None;
                parallelism
                    .min(remaining)
                    .saturating_sub(active.len())
                    .min(MAX_PODS_PER_SYNC)
            ]
        };
        let mut created = false;
        for index in wanted {
            match create_job_pod(s, &job, index) {
                Ok(pod_name) => {
                    created = true;
                    record_event(
                        s,
                        &job_obj,
                        "Normal",
                        "SuccessfulCreate",
                        &format!("Created pod: {pod_name}"),
                        JOB_CONTROLLER,
                    );
                    if s.auto_complete {
                        let _ = kubelet::transition(s, ns, &pod_name, PodTransition::Running);
                        let _ = kubelet::transition(s, ns, &pod_name, PodTransition::Succeeded);
                    }
                }
                Err(e) => {
                    record_event(
                        s,
                        &job_obj,
                        "Warning",
                        "FailedCreate",
                        &format!("Error creating: {}", e.message),
                        JOB_CONTROLLER,
                    );
                    s.blocked_jobs.insert((ns.to_string(), name.to_string()));
                    break;
                }
            }
        }
        if created {
            // The new pods queued this Job again; that pass writes the status.
            s.tracking.insert(uid, track);
            return;
        }
    }
    status.active = (!active.is_empty()).then_some(active.len() as i32);
    status.ready = Some(active.iter().filter(|p| pod_ready(p)).count() as i32);
    status.succeeded = (succeeded > 0).then_some(succeeded as i32);
    status.failed = (!track.failed.is_empty()).then_some(track.failed.len() as i32);
    status.terminating = Some(0);
    status.completed_indexes = (indexed && !track.succeeded_indexes.is_empty())
        .then(|| format_indexes(&track.succeeded_indexes));
    if status.conditions.as_ref().is_some_and(Vec::is_empty) {
        status.conditions = None;
    }
    s.tracking.insert(uid, track);
    if job.status.as_ref() != Some(&status) {
        // Re-read: events above do not touch the Job, but be exact about
        // what is written.
        if let Some(Object::Job(mut current)) = s.get(&job_key).cloned() {
            current.status = Some(status);
            s.replace(Object::Job(current));
        }
    }
}

/// Creates one pod from a Job's template, as the Job controller does.
fn create_job_pod(
    s: &mut State,
    job: &Job,
    index: Option<i32>,
) -> Result<String, crate::errors::ApiError> {
    let job_name = job.metadata.name.clone().unwrap_or_default();
    let spec = job.spec.clone().unwrap_or_default();
    let template = spec.template;
    let mut meta = template.metadata.unwrap_or_default();
    let prefix = match index {
        Some(i) => format!("{job_name}-{i}-"),
        None => format!("{job_name}-"),
    };
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(admission::JOB_NAME_LABEL.into(), job_name.clone());
    labels.insert(admission::LEGACY_JOB_NAME_LABEL.into(), job_name.clone());
    labels.insert(admission::CONTROLLER_UID_LABEL.into(), uid.clone());
    labels.insert(admission::LEGACY_CONTROLLER_UID_LABEL.into(), uid.clone());
    if let Some(i) = index {
        labels.insert(COMPLETION_INDEX.into(), i.to_string());
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(COMPLETION_INDEX.into(), i.to_string());
    }
    meta.name = None;
    meta.generate_name = Some(prefix);
    meta.namespace = job.metadata.namespace.clone();
    meta.owner_references = Some(vec![OwnerReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: job_name.clone(),
        uid,
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    let mut pod_spec = template.spec.unwrap_or_default();
    if let Some(i) = index {
        pod_spec
            .hostname
            .get_or_insert_with(|| format!("{job_name}-{i}"));
    }
    let pod = Pod {
        metadata: meta,
        spec: Some(pod_spec),
        status: None,
    };
    let created = api::create_object(s, Object::Pod(pod), false)?;
    Ok(created.meta().name.clone().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_compress_into_ranges() {
        let set: BTreeSet<i32> = [0, 1, 2, 4, 6, 7].into_iter().collect();
        assert_eq!(format_indexes(&set), "0-2,4,6-7");
        assert_eq!(format_indexes(&BTreeSet::new()), "");
    }
}
