//! Admission for creates and updates: defaults, the validation an agent is
//! likely to trip over, priority classes, the "scheduler" binding of pinned
//! pods, and ResourceQuota accounting and enforcement.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodStatus, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use crate::errors::ApiError;
use crate::kinds::{Kind, Object};
use crate::quantity::{format_millis, parse_millis};
use crate::store::{State, now};

/// The node label a hostname nodeSelector pins on.
pub(crate) const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The labels and annotation the job controller puts on its pods.
pub(crate) const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
pub(crate) const LEGACY_JOB_NAME_LABEL: &str = "job-name";
pub(crate) const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";
pub(crate) const LEGACY_CONTROLLER_UID_LABEL: &str = "controller-uid";
pub(crate) const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// Defaults, validates and admits a new object.
pub(crate) fn admit_create(s: &mut State, obj: &mut Object) -> Result<(), ApiError> {
    match obj {
        Object::Pod(pod) => admit_pod(s, pod),
        Object::Job(job) => admit_job(s, job),
        Object::Namespace(ns) => {
            let name = ns.metadata.name.clone().unwrap_or_default();
            ns.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert("kubernetes.io/metadata.name".into(), name);
            ns.spec
                .get_or_insert_with(Default::default)
                .finalizers
                .get_or_insert_with(|| vec!["kubernetes".into()]);
            ns.status.get_or_insert_with(Default::default).phase = Some("Active".into());
            Ok(())
        }
        Object::ResourceQuota(q) => {
            validate_quota(q)?;
            // Status is the quota controller's; it fills it in right after.
            q.status = None;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Validates an update against the stored object (immutable fields).
pub(crate) fn admit_update(
    _s: &mut State,
    stored: &Object,
    obj: &mut Object,
) -> Result<(), ApiError> {
    let name = stored.meta().name.clone().unwrap_or_default();
    match (stored, obj) {
        (Object::Job(old), Object::Job(new)) => {
            let spec = |j: &Job, f: &str| {
                serde_json::to_value(&j.spec)
                    .ok()
                    .and_then(|v| v.get(f).cloned())
            };
            let mut causes = Vec::new();
            for field in ["template", "selector", "completionMode"] {
                if spec(old, field) != spec(new, field) {
                    causes.push(format!("spec.{field}: Invalid value: field is immutable"));
                }
            }
            if causes.is_empty() {
                Ok(())
            } else {
                Err(ApiError::invalid(Kind::Job, &name, &causes))
            }
        }
        (Object::Pod(old), Object::Pod(new)) => {
            if mutable_pod_spec_stripped(old) != mutable_pod_spec_stripped(new) {
                return Err(ApiError::invalid(
                    Kind::Pod,
                    &name,
                    &["spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`, \
                       `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions \
                       to existing tolerations), `spec.terminationGracePeriodSeconds`"
                        .to_string()],
                ));
            }
            Ok(())
        }
        (Object::ResourceQuota(_), Object::ResourceQuota(new)) => validate_quota(new),
        _ => Ok(()),
    }
}

/// A pod spec without the fields an update may change.
fn mutable_pod_spec_stripped(pod: &Pod) -> Value {
    let mut spec = serde_json::to_value(&pod.spec).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut spec {
        for f in [
            "activeDeadlineSeconds",
            "tolerations",
            "terminationGracePeriodSeconds",
        ] {
            map.remove(f);
        }
        for list in ["containers", "initContainers"] {
            for c in map
                .get_mut(list)
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Value::Object(c) = c {
                    c.remove("image");
                }
            }
        }
    }
    spec
}

fn validate_quota(q: &ResourceQuota) -> Result<(), ApiError> {
    let name = q.metadata.name.clone().unwrap_or_default();
    let bad: Vec<String> = q
        .spec
        .iter()
        .flat_map(|s| s.hard.iter().flatten())
        .filter(|(_, v)| parse_millis(&v.0).is_none_or(|m| m < 0))
        .map(|(k, v)| {
            format!(
                "spec.hard[{k}]: Invalid value: \"{}\": must be a non-negative quantity",
                v.0
            )
        })
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(Kind::ResourceQuota, &name, &bad))
    }
}

fn validate_containers(prefix: &str, containers: &[Container], causes: &mut Vec<String>) {
    if containers.is_empty() {
        causes.push(format!("{prefix}.containers: Required value"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, c) in containers.iter().enumerate() {
        if c.name.is_empty() {
            causes.push(format!("{prefix}.containers[{i}].name: Required value"));
        } else if !seen.insert(c.name.as_str()) {
            causes.push(format!(
                "{prefix}.containers[{i}].name: Duplicate value: \"{}\"",
                c.name
            ));
        }
        if c.image.as_deref().is_none_or(str::is_empty) {
            causes.push(format!("{prefix}.containers[{i}].image: Required value"));
        }
        for (what, list) in [
            (
                "requests",
                c.resources.as_ref().and_then(|r| r.requests.as_ref()),
            ),
            (
                "limits",
                c.resources.as_ref().and_then(|r| r.limits.as_ref()),
            ),
        ] {
            for (r, q) in list.into_iter().flatten() {
                if parse_millis(&q.0).is_none_or(|m| m < 0) {
                    causes.push(format!("{prefix}.containers[{i}].resources.{what}[{r}]: Invalid value: \"{}\": must be a valid non-negative quantity", q.0));
                }
            }
        }
    }
}

fn admit_job(s: &mut State, job: &mut Job) -> Result<(), ApiError> {
    let name = job.metadata.name.clone().unwrap_or_default();
    let mut causes = Vec::new();
    // The job name becomes a label value on its pods.
    if name.len() > 63 {
        causes.push(format!(
            "metadata.name: Invalid value: \"{name}\": must be no more than 63 characters"
        ));
    }
    let Some(spec) = job.spec.as_mut() else {
        return Err(ApiError::invalid(
            Kind::Job,
            &name,
            &["spec: Required value".into()],
        ));
    };
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    match spec.completion_mode.as_deref() {
        None | Some("NonIndexed") | Some("Indexed") => {}
        Some(other) => causes.push(format!("spec.completionMode: Unsupported value: \"{other}\": supported values: \"NonIndexed\", \"Indexed\"")),
    }
    if indexed && spec.completions.is_none() {
        causes.push("spec.completions: Required value: when completion mode is Indexed".into());
    }
    for (field, v) in [
        ("parallelism", spec.parallelism),
        ("completions", spec.completions),
        ("backoffLimit", spec.backoff_limit),
    ] {
        if v.is_some_and(|v| v < 0) {
            causes.push(format!(
                "spec.{field}: Invalid value: {}: must be greater than or equal to 0",
                v.unwrap_or_default()
            ));
        }
    }
    match spec.template.spec.as_ref() {
        None => causes.push("spec.template.spec.containers: Required value".into()),
        Some(pod) => {
            validate_containers("spec.template.spec", &pod.containers, &mut causes);
            match pod.restart_policy.as_deref() {
                Some("Never") | Some("OnFailure") => {}
                None => causes.push("spec.template.spec.restartPolicy: Required value: valid values: \"OnFailure\", \"Never\"".into()),
                Some(other) => causes.push(format!(
                    "spec.template.spec.restartPolicy: Unsupported value: \"{other}\": supported values: \"OnFailure\", \"Never\""
                )),
            }
        }
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(Kind::Job, &name, &causes));
    }
    // Defaults, as the API server applies them. The uid is fixed here since
    // the selector and template labels carry it.
    let uid = s.new_uid();
    job.metadata.uid = Some(uid.clone());
    if spec.completions.is_none() && spec.parallelism.is_none() {
        spec.completions = Some(1);
    }
    spec.parallelism.get_or_insert(1);
    if spec.backoff_limit_per_index.is_none() {
        spec.backoff_limit.get_or_insert(6);
    }
    spec.completion_mode
        .get_or_insert_with(|| "NonIndexed".into());
    spec.suspend.get_or_insert(false);
    spec.pod_replacement_policy
        .get_or_insert_with(|| "TerminatingOrFailed".into());
    if spec.manual_selector != Some(true) {
        spec.selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                CONTROLLER_UID_LABEL.to_string(),
                uid.clone(),
            )])),
            ..Default::default()
        });
        let meta = spec.template.metadata.get_or_insert_with(Default::default);
        let labels = meta.labels.get_or_insert_with(Default::default);
        for (k, v) in [
            (CONTROLLER_UID_LABEL, &uid),
            (LEGACY_CONTROLLER_UID_LABEL, &uid),
            (JOB_NAME_LABEL, &name),
            (LEGACY_JOB_NAME_LABEL, &name),
        ] {
            labels.insert(k.to_string(), v.clone());
        }
    }
    job.status = None;
    Ok(())
}

/// The priority classes every cluster has.
pub(crate) const SYSTEM_PRIORITY_CLASSES: [(&str, i32); 2] = [
    ("system-cluster-critical", 2_000_000_000),
    ("system-node-critical", 2_000_001_000),
];

fn admit_pod(s: &mut State, pod: &mut Pod) -> Result<(), ApiError> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut causes = Vec::new();
    let Some(spec) = pod.spec.as_mut() else {
        return Err(ApiError::invalid(
            Kind::Pod,
            &name,
            &["spec.containers: Required value".into()],
        ));
    };
    validate_containers("spec", &spec.containers, &mut causes);
    match spec.restart_policy.as_deref() {
        None | Some("Always") | Some("OnFailure") | Some("Never") => {}
        Some(other) => causes.push(format!(
            "spec.restartPolicy: Unsupported value: \"{other}\": supported values: \"Always\", \"OnFailure\", \"Never\""
        )),
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(Kind::Pod, &name, &causes));
    }
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".into());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.service_account_name
        .get_or_insert_with(|| "default".into());
    // Priority admission resolves the class name to its value.
    let class = match spec.priority_class_name.as_deref() {
        Some(class) => {
            let found = s
                .iter_kind(Kind::PriorityClass, None)
                .find_map(|o| match o {
                    Object::PriorityClass(pc) if pc.metadata.name.as_deref() == Some(class) => {
                        Some((pc.value, pc.preemption_policy.clone()))
                    }
                    _ => None,
                });
            Some(found.ok_or_else(|| {
                ApiError::forbidden(
                    Kind::Pod,
                    &name,
                    &format!("no PriorityClass with name {class} was found"),
                )
            })?)
        }
        None => s
            .iter_kind(Kind::PriorityClass, None)
            .find_map(|o| match o {
                Object::PriorityClass(pc) if pc.global_default == Some(true) => {
                    Some((pc.value, pc.preemption_policy.clone()))
                }
                _ => None,
            }),
    };
    spec.priority = Some(class.as_ref().map_or(0, |c| c.0));
    spec.preemption_policy = class
        .and_then(|c| c.1)
        .or_else(|| Some("PreemptLowerPriority".into()));
    // The "scheduler": a pod pinned by a hostname nodeSelector is bound to
    // that node; one whose required node affinity names hostnames goes to
    // the named node with the fewest active pods (spreading a Job's pods);
    // others wait for a test to bind or run them.
    // A client that names the node itself bypasses the scheduler, as on a
    // real cluster.
    let scheduled = spec.node_name.is_none();
    if spec.node_name.is_none() {
        if let Some(host) = spec
            .node_selector
            .as_ref()
            .and_then(|ns| ns.get(HOSTNAME_LABEL))
        {
            spec.node_name = Some(host.clone());
        } else if let Some(hosts) = affinity_hostnames(spec) {
            spec.node_name = hosts.iter().min_by_key(|h| active_pods_on(s, h)).cloned();
        }
    }
    check_quota(s, &namespace, pod)?;
    // Like kube-scheduler's NodeResourcesFit: a pod whose node lacks the
    // extended resources it requests (GPUs, MIG devices, time-sliced
    // replicas) beside what the node's other pods hold is not bound; it
    // stays Pending with PodScheduled False/Unschedulable and the
    // scheduler's message, and is bound once the node has room.
    let unfit = pod
        .spec
        .as_ref()
        .and_then(|sp| sp.node_name.clone())
        .filter(|_| scheduled)
        .and_then(|host| crate::scheduler::insufficient(s, pod, &host));
    if unfit.is_some()
        && let Some(sp) = pod.spec.as_mut()
    {
        sp.node_name = None;
    }
    let bound = pod.spec.as_ref().is_some_and(|sp| sp.node_name.is_some());
    pod.status = Some(PodStatus {
        phase: Some("Pending".into()),
        qos_class: Some(qos_class(pod).into()),
        conditions: match &unfit {
            Some(message) => Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some(message.clone()),
                last_transition_time: Some(now()),
                ..Default::default()
            }]),
            None => bound.then(|| {
                vec![PodCondition {
                    type_: "PodScheduled".into(),
                    status: "True".into(),
                    last_transition_time: Some(now()),
                    ..Default::default()
                }]
            }),
        },
        ..Default::default()
    });
    Ok(())
}

/// The hostnames of a pod's required node affinity, when it is one term
/// `kubernetes.io/hostname In [...]`.
pub(crate) fn affinity_hostnames(
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> Option<Vec<String>> {
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    let [term] = terms.as_slice() else {
        return None;
    };
    let [req] = term.match_expressions.as_deref()? else {
        return None;
    };
    (req.key == HOSTNAME_LABEL && req.operator == "In")
        .then(|| req.values.clone().unwrap_or_default())
        .filter(|v| !v.is_empty())
}

fn active_pods_on(s: &State, host: &str) -> usize {
    s.iter_kind(Kind::Pod, None)
        .filter(|o| match o {
            Object::Pod(p) => {
                p.spec.as_ref().and_then(|x| x.node_name.as_deref()) == Some(host)
                    && !matches!(
                        p.status.as_ref().and_then(|x| x.phase.as_deref()),
                        Some("Succeeded" | "Failed")
                    )
            }
            _ => false,
        })
        .count()
}

fn qos_class(pod: &Pod) -> &'static str {
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    fn has<'a>(c: &'a Container, r: &str) -> (Option<&'a Quantity>, Option<&'a Quantity>) {
        let res = c.resources.as_ref();
        (
            res.and_then(|x| x.requests.as_ref()).and_then(|m| m.get(r)),
            res.and_then(|x| x.limits.as_ref()).and_then(|m| m.get(r)),
        )
    }
    let none = containers
        .iter()
        .all(|c| ["cpu", "memory"].iter().all(|r| has(c, r) == (None, None)));
    let guaranteed = containers.iter().all(|c| {
        ["cpu", "memory"].iter().all(|r| match has(c, r) {
            (req, Some(lim)) => req.is_none_or(|q| parse_millis(&q.0) == parse_millis(&lim.0)),
            _ => false,
        })
    });
    if none {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// A pod's requests and limits per resource, in milli-units: containers
/// summed, init containers as a max (they run one at a time), requests
/// defaulting to limits as the API server defaults them. Pod-level
/// `spec.resources` wins when set.
pub(crate) fn pod_usage(pod: &Pod) -> BTreeMap<String, (i128, i128)> {
    let mut usage: BTreeMap<String, (i128, i128)> = BTreeMap::new();
    let Some(spec) = pod.spec.as_ref() else {
        return usage;
    };
    let of = |r: Option<&k8s_openapi::api::core::v1::ResourceRequirements>| {
        let mut m: BTreeMap<String, (i128, i128)> = BTreeMap::new();
        let reqs = r.and_then(|r| r.requests.as_ref());
        let lims = r.and_then(|r| r.limits.as_ref());
        for (name, q) in lims.into_iter().flatten() {
            m.entry(name.clone()).or_default().1 = parse_millis(&q.0).unwrap_or(0);
        }
        for name in reqs
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
            .chain(lims.into_iter().flatten().map(|(k, _)| k))
        {
            let req = reqs
                .and_then(|r| r.get(name))
                .or_else(|| lims.and_then(|l| l.get(name)));
            m.entry(name.clone()).or_default().0 =
                req.and_then(|q| parse_millis(&q.0)).unwrap_or(0);
        }
        m
    };
    if let Some(pod_level) = spec
        .resources
        .as_ref()
        .filter(|r| r.requests.is_some() || r.limits.is_some())
    {
        return of(Some(pod_level));
    }
    for c in &spec.containers {
        for (name, (req, lim)) in of(c.resources.as_ref()) {
            let e = usage.entry(name).or_default();
            e.0 = e.0.saturating_add(req);
            e.1 = e.1.saturating_add(lim);
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (name, (req, lim)) in of(c.resources.as_ref()) {
            let e = usage.entry(name).or_default();
            e.0 = e.0.max(req);
            e.1 = e.1.max(lim);
        }
    }
    for (name, q) in spec.overhead.iter().flatten() {
        let m = parse_millis(&q.0).unwrap_or(0);
        let e = usage.entry(name.clone()).or_default();
        e.0 = e.0.saturating_add(m);
        e.1 = e.1.saturating_add(m);
    }
    usage
}

/// Compute resources whose quota requires every pod to state them.
const MUST_SPECIFY: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// What a pod charges against one quota key, or None when the key is not one
/// this server tracks (e.g. `count/services`). A bare resource name means
/// its requests, as for `cpu` and the extended GPU resources.
fn charge(usage: &BTreeMap<String, (i128, i128)>, key: &str) -> Option<i128> {
    if key == "pods" || key == "count/pods" {
        return Some(1000);
    }
    if key.starts_with("count/")
        || matches!(
            key,
            "services"
                | "secrets"
                | "configmaps"
                | "persistentvolumeclaims"
                | "replicationcontrollers"
                | "resourcequotas"
        )
    {
        return None;
    }
    if let Some(r) = key.strip_prefix("requests.") {
        return Some(usage.get(r).map_or(0, |u| u.0));
    }
    if let Some(r) = key.strip_prefix("limits.") {
        return Some(usage.get(r).map_or(0, |u| u.1));
    }
    Some(usage.get(key).map_or(0, |u| u.0))
}

pub(crate) fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// Whether a quota's scopes select a pod (PriorityClass, Terminating,
/// NotTerminating, BestEffort, NotBestEffort; other scopes select all).
fn in_scope(quota: &ResourceQuota, pod: &Pod) -> bool {
    let spec = quota.spec.as_ref();
    let class = pod
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.clone());
    let terminating = pod
        .spec
        .as_ref()
        .is_some_and(|s| s.active_deadline_seconds.is_some());
    let best_effort = qos_class(pod) == "BestEffort";
    let scope_ok = |name: &str| match name {
        "Terminating" => terminating,
        "NotTerminating" => !terminating,
        "BestEffort" => best_effort,
        "NotBestEffort" => !best_effort,
        _ => true,
    };
    let scopes_ok = spec
        .and_then(|s| s.scopes.as_ref())
        .into_iter()
        .flatten()
        .all(|s| scope_ok(s));
    let selector_ok = spec
        .and_then(|s| s.scope_selector.as_ref())
        .and_then(|s| s.match_expressions.as_ref())
        .into_iter()
        .flatten()
        .all(|req| {
            if req.scope_name != "PriorityClass" {
                return scope_ok(&req.scope_name);
            }
            let values = req.values.clone().unwrap_or_default();
            match req.operator.as_str() {
                "In" => class.as_ref().is_some_and(|c| values.contains(c)),
                "NotIn" => class.as_ref().is_none_or(|c| !values.contains(c)),
                "Exists" => class.is_some(),
                "DoesNotExist" => class.is_none(),
                _ => true,
            }
        });
    scopes_ok && selector_ok
}

/// Current usage of `quota` in its namespace, for the keys it limits.
fn quota_used(s: &State, quota: &ResourceQuota) -> BTreeMap<String, i128> {
    let ns = quota.metadata.namespace.as_deref().unwrap_or_default();
    let hard = quota
        .spec
        .as_ref()
        .and_then(|s| s.hard.clone())
        .unwrap_or_default();
    let mut used: BTreeMap<String, i128> = BTreeMap::new();
    for key in hard.keys() {
        if charge(&BTreeMap::new(), key).is_some() {
            used.insert(key.clone(), 0);
        }
    }
    for obj in s.iter_kind(Kind::Pod, Some(ns)) {
        let Object::Pod(pod) = obj else { continue };
        if is_terminal(pod) || !in_scope(quota, pod) {
            continue;
        }
        let usage = pod_usage(pod);
        for (key, total) in used.iter_mut() {
            *total = total.saturating_add(charge(&usage, key).unwrap_or(0));
        }
    }
    used
}

fn pretty(list: &[(String, i128)]) -> String {
    list.iter()
        .map(|(k, v)| format!("{k}={}", format_millis(*v)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Quota admission: refuses a pod that would take a namespace quota over
/// its hard limits, with the API server's message.
fn check_quota(s: &State, namespace: &str, pod: &Pod) -> Result<(), ApiError> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let usage = pod_usage(pod);
    for obj in s.iter_kind(Kind::ResourceQuota, Some(namespace)) {
        let Object::ResourceQuota(quota) = obj else {
            continue;
        };
        if !in_scope(quota, pod) {
            continue;
        }
        let qname = quota.metadata.name.clone().unwrap_or_default();
        let hard = quota
            .spec
            .as_ref()
            .and_then(|s| s.hard.clone())
            .unwrap_or_default();
        let missing: Vec<String> = hard
            .keys()
            .filter(|k| {
                let r = k
                    .strip_prefix("requests.")
                    .or_else(|| k.strip_prefix("limits."))
                    .unwrap_or(k);
                MUST_SPECIFY.contains(&r) && !usage.contains_key(r)
            })
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(ApiError::forbidden(
                Kind::Pod,
                &name,
                &format!("failed quota: {qname}: must specify {}", missing.join(",")),
            ));
        }
        let used = quota_used(s, quota);
        let (mut requested, mut used_list, mut limited) = (Vec::new(), Vec::new(), Vec::new());
        for (key, limit) in &hard {
            let Some(want) = charge(&usage, key).filter(|w| *w > 0) else {
                continue;
            };
            let (have, limit) = (
                used.get(key).copied().unwrap_or(0),
                parse_millis(&limit.0).unwrap_or(0),
            );
            if have.saturating_add(want) > limit {
                requested.push((key.clone(), want));
                used_list.push((key.clone(), have));
                limited.push((key.clone(), limit));
            }
        }
        if !requested.is_empty() {
            return Err(ApiError::forbidden(
                Kind::Pod,
                &name,
                &format!(
                    "exceeded quota: {qname}, requested: {}, used: {}, limited: {}",
                    pretty(&requested),
                    pretty(&used_list),
                    pretty(&limited)
                ),
            ));
        }
    }
    Ok(())
}

/// Recomputes `status.hard`/`status.used` of the quotas in a namespace,
/// writing only those that changed.
pub(crate) fn sync_quotas(s: &mut State, namespace: &str) {
    let quotas: Vec<ResourceQuota> = s
        .iter_kind(Kind::ResourceQuota, Some(namespace))
        .filter_map(|o| {
            if let Object::ResourceQuota(q) = o {
                Some(q.clone())
            } else {
                None
            }
        })
        .collect();
    for mut quota in quotas {
        let hard = quota
            .spec
            .as_ref()
            .and_then(|s| s.hard.clone())
            .unwrap_or_default();
        let used: BTreeMap<String, Quantity> = quota_used(s, &quota)
            .into_iter()
            .map(|(k, v)| (k, Quantity(format_millis(v))))
            .collect();
        let status = k8s_openapi::api::core::v1::ResourceQuotaStatus {
            hard: Some(hard),
            used: Some(used),
        };
        if quota.status.as_ref() != Some(&status) {
            quota.status = Some(status);
            s.replace(Object::ResourceQuota(quota));
        }
    }
}
