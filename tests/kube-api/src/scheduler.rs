//! The test server's scheduler, as kube-scheduler's NodeResourcesFit:
//! whether a pod's node has the extended resources it requests beside what
//! the node's other pods hold (else it stays Pending/Unschedulable with the
//! scheduler's message), and the retry that binds such pods once room frees.

use k8s_openapi::api::core::v1::{Pod, PodCondition};

use crate::admission::{HOSTNAME_LABEL, affinity_hostnames, is_terminal, pod_usage};
use crate::kinds::{Kind, Object};
use crate::quantity::parse_millis;
use crate::store::{State, now};

/// The node named by a hostname (its `kubernetes.io/hostname` label, else
/// its name).
pub(crate) fn node_by_host<'a>(
    s: &'a State,
    host: &str,
) -> Option<&'a k8s_openapi::api::core::v1::Node> {
    s.iter_kind(Kind::Node, None).find_map(|o| match o {
        Object::Node(n)
            if n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(HOSTNAME_LABEL))
                .map_or(n.metadata.name.as_deref() == Some(host), |h| h == host) =>
        {
            Some(n)
        }
        _ => None,
    })
}

/// Why `pod` does not fit on the node of `host`, as kube-scheduler says it
/// (`0/3 nodes are available: 1 Insufficient nvidia.com/gpu.shared, 2
/// node(s) didn't match Pod's node affinity/selector.`); `None` when it
/// fits. Only extended resources (names with a `/`) are counted: the
/// test server's nodes declare no CPU or memory.
pub(crate) fn insufficient(s: &State, pod: &Pod, host: &str) -> Option<String> {
    let nodes = s.iter_kind(Kind::Node, None).count();
    let others = nodes.saturating_sub(1);
    let mismatch = if others > 0 {
        format!(", {others} node(s) didn't match Pod's node affinity/selector")
    } else {
        String::new()
    };
    // A host no Node has: bound as named (tests that bind pods to nodes
    // they never created keep working; a real scheduler would not bind).
    let node = node_by_host(s, host)?;
    let allocatable = node
        .status
        .as_ref()
        .and_then(|st| st.allocatable.clone())
        .unwrap_or_default();
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let me = pod.metadata.uid.clone();
    let mut short = Vec::new();
    for (resource, (want, _)) in pod_usage(pod) {
        if !resource.contains('/') || want <= 0 {
            continue;
        }
        let have = allocatable
            .get(&resource)
            .and_then(|q| parse_millis(&q.0))
            .unwrap_or(0);
        let used: i128 = s
            .iter_kind(Kind::Pod, None)
            .filter_map(|o| match o {
                Object::Pod(p)
                    if !is_terminal(p)
                        && p.metadata.uid != me
                        && p.spec.as_ref().and_then(|x| x.node_name.as_deref())
                            == Some(node_name.as_str()) =>
                {
                    Some(pod_usage(p).get(&resource).map_or(0, |u| u.0))
                }
                _ => None,
            })
            .sum();
        if used.saturating_add(want) > have {
            short.push(format!("Insufficient {resource}"));
        }
    }
    if short.is_empty() {
        return None;
    }
    Some(format!(
        "0/{nodes} nodes are available: 1 {}{mismatch}.",
        short.join(", 1 ")
    ))
}

/// The pod's `PodScheduled=False` condition with reason `Unschedulable`,
/// which kube-scheduler sets on a pod no node can take.
pub(crate) fn unschedulable(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()
        .and_then(|st| st.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
}

/// The scheduler's retry: binds every pod it left Unschedulable whose node
/// now has room (oldest first), as kube-scheduler does when capacity frees.
pub(crate) fn schedule_unscheduled(s: &mut State) {
    let waiting: Vec<Pod> = s
        .iter_kind(Kind::Pod, None)
        .filter_map(|o| match o {
            Object::Pod(p)
                if p.spec.as_ref().is_some_and(|x| x.node_name.is_none())
                    && !is_terminal(p)
                    && unschedulable(p).is_some() =>
            {
                Some(p.clone())
            }
            _ => None,
        })
        .collect();
    let mut waiting = waiting;
    waiting.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
    for mut pod in waiting {
        let Some(host) = pod
            .spec
            .as_ref()
            .and_then(|sp| sp.node_selector.as_ref())
            .and_then(|ns| ns.get(HOSTNAME_LABEL).cloned())
            .or_else(|| {
                pod.spec
                    .as_ref()
                    .and_then(affinity_hostnames)
                    .and_then(|h| h.first().cloned())
            })
        else {
            continue;
        };
        let Some(node_name) = node_by_host(s, &host).and_then(|n| n.metadata.name.clone()) else {
            continue;
        };
        if insufficient(s, &pod, &host).is_some() {
            continue;
        }
        if let Some(sp) = pod.spec.as_mut() {
            sp.node_name = Some(node_name);
        }
        if let Some(st) = pod.status.as_mut() {
            st.conditions = Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "True".into(),
                last_transition_time: Some(now()),
                ..Default::default()
            }]);
        }
        s.replace(Object::Pod(pod));
    }
}
