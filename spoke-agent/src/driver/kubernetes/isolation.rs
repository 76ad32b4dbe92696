//! Team isolation on the cluster, mirroring the policy: per team a
//! namespace (labelled `axle.dev/team`), a `ResourceQuota` that caps its GPU
//! requests at the team's limit for the models this cluster has — so work
//! applied behind Axle's back cannot exceed it —, and a Role and RoleBinding
//! that let the team's members read pods and logs in their namespace only.
//! Also Axle's PriorityClasses. Pure: the policy's teams in, objects out.

use std::collections::{BTreeMap, BTreeSet};

use axle_proto::pb;
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::manifest::{
    LABEL_MANAGED_BY, LABEL_TEAM, MANAGED_BY, ManifestOptions, namespace_of, priority_class_name,
};
use super::nodes::{NodeFacts, WHOLE_GPU};

pub const QUOTA_NAME: &str = "axle-gpus";
pub const READER_ROLE: &str = "axle-team-reader";
pub const MEMBERS_BINDING: &str = "axle-team-members";
/// Kubernetes reserves PriorityClass values above this for the system.
pub const MAX_USER_PRIORITY: i32 = 1_000_000_000;

/// What isolation the driver keeps for one team.
#[derive(Debug, Clone, PartialEq)]
pub struct TeamObjects {
    pub namespace: Namespace,
    pub quota: ResourceQuota,
    pub role: Role,
    pub binding: RoleBinding,
}

fn meta(name: &str, namespace: Option<&str>, team: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: Some(BTreeMap::from([
            (LABEL_TEAM.to_string(), team.to_string()),
            (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        ])),
        ..Default::default()
    }
}

/// The objects of one team. `member_subject` names a member's Kubernetes
/// user from their policy name (`{user}` is replaced).
pub fn team_objects(
    team: &pb::TeamIsolation,
    nodes: &BTreeMap<String, NodeFacts>,
    opts: &ManifestOptions,
    member_subject: &str,
) -> TeamObjects {
    let ns = namespace_of(opts, &team.name);
    let whole = team.gpu_limit_milli / 1000;
    let granularity = team.fraction_granularity_milli.max(1);
    // A fraction takes one slice (MIG or shared) at least the granularity.
    let slices = team.gpu_limit_milli / granularity;
    let mut hard = BTreeMap::from([(format!("requests.{WHOLE_GPU}"), Quantity(whole.to_string()))]);
    let mut sliced: BTreeSet<String> = nodes
        .values()
        .flat_map(|n| n.mig.iter().map(|(r, _)| r.clone()))
        .collect();
    if nodes.values().any(|n| n.shared > 0) {
        sliced.insert(opts.shared_resource.clone());
    }
    for r in sliced {
        hard.insert(format!("requests.{r}"), Quantity(slices.to_string()));
    }
    let subjects: Vec<Subject> = team
        .members
        .iter()
        .map(|m| Subject {
            kind: "User".into(),
            name: member_subject.replace("{user}", &m.user),
            api_group: Some("rbac.authorization.k8s.io".into()),
            namespace: None,
        })
        .collect();
    TeamObjects {
        namespace: Namespace {
            metadata: meta(&ns, None, &team.name),
            ..Default::default()
        },
        quota: ResourceQuota {
            metadata: meta(QUOTA_NAME, Some(&ns), &team.name),
            spec: Some(ResourceQuotaSpec {
                hard: Some(hard),
                ..Default::default()
            }),
            status: None,
        },
        role: Role {
            metadata: meta(READER_ROLE, Some(&ns), &team.name),
            rules: Some(vec![
                PolicyRule {
                    api_groups: Some(vec![String::new()]),
                    resources: Some(vec!["pods".into()]),
                    verbs: vec!["get".into(), "list".into(), "watch".into()],
                    ..Default::default()
                },
                PolicyRule {
                    api_groups: Some(vec![String::new()]),
                    resources: Some(vec!["pods/log".into()]),
                    verbs: vec!["get".into()],
                    ..Default::default()
                },
            ]),
        },
        binding: RoleBinding {
            metadata: meta(MEMBERS_BINDING, Some(&ns), &team.name),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: READER_ROLE.into(),
            },
            subjects: Some(subjects),
        },
    }
}

/// Axle's PriorityClasses: its classes' order, and never preempting on
/// their own (Axle's hub decides preemption).
pub fn priority_classes(
    classes: &[pb::PriorityClassInfo],
    opts: &ManifestOptions,
) -> Vec<PriorityClass> {
    classes
        .iter()
        .map(|c| PriorityClass {
            metadata: ObjectMeta {
                name: Some(priority_class_name(opts, &c.name)),
                labels: Some(BTreeMap::from([(
                    LABEL_MANAGED_BY.to_string(),
                    MANAGED_BY.to_string(),
                )])),
                ..Default::default()
            },
            value: c.value.clamp(-MAX_USER_PRIORITY, MAX_USER_PRIORITY),
            preemption_policy: Some("Never".into()),
            global_default: Some(false),
            description: Some(format!("Axle priority class {}", c.name)),
        })
        .collect()
}

/// Namespaces of teams no longer in the policy: `(namespace, team)` of
/// every Axle namespace whose team is not in `teams`.
pub fn orphaned(namespaces: &[Namespace], teams: &[pb::TeamIsolation]) -> Vec<String> {
    let known: BTreeSet<&str> = teams.iter().map(|t| t.name.as_str()).collect();
    namespaces
        .iter()
        .filter(|n| {
            let labels = n.metadata.labels.as_ref();
            labels
                .and_then(|l| l.get(LABEL_MANAGED_BY))
                .map(String::as_str)
                == Some(MANAGED_BY)
                && labels
                    .and_then(|l| l.get(LABEL_TEAM))
                    .is_some_and(|t| !known.contains(t.as_str()))
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::driver::kubernetes::manifest::tests::opts;
    use crate::driver::kubernetes::nodes::node_facts;
    use crate::driver::kubernetes::nodes::tests::{gpu_node, opts as inv_opts};

    pub(crate) fn team() -> pb::TeamIsolation {
        pb::TeamIsolation {
            name: "vision".into(),
            members: vec![
                pb::TeamMember {
                    user: "alice".into(),
                    role: "admin".into(),
                },
                pb::TeamMember {
                    user: "bob".into(),
                    role: "member".into(),
                },
            ],
            gpu_limit_milli: 4000,
            fraction_granularity_milli: 250,
        }
    }

    #[test]
    fn a_team_gets_its_namespace_quota_and_readers() {
        let nodes: BTreeMap<String, NodeFacts> = [
            gpu_node("a", "NVIDIA-A100", &[("nvidia.com/gpu", "4")]),
            gpu_node("m", "NVIDIA-H100", &[("nvidia.com/mig-1g.10gb", "7")]),
            gpu_node("s", "NVIDIA-L4", &[("nvidia.com/gpu.shared", "8")]),
        ]
        .iter()
        .filter_map(|n| node_facts(n, &inv_opts()))
        .map(|f| (f.name.clone(), f))
        .collect();
        let o = team_objects(&team(), &nodes, &opts(), "{user}@corp");
        assert_eq!(o.namespace.metadata.name.as_deref(), Some("axle-vision"));
        assert_eq!(
            o.namespace.metadata.labels.as_ref().unwrap()[LABEL_TEAM],
            "vision"
        );
        let hard = o.quota.spec.unwrap().hard.unwrap();
        assert_eq!(hard["requests.nvidia.com/gpu"], Quantity("4".into()));
        assert_eq!(
            hard["requests.nvidia.com/mig-1g.10gb"],
            Quantity("16".into())
        );
        assert_eq!(
            hard["requests.nvidia.com/gpu.shared"],
            Quantity("16".into())
        );
        let subjects = o.binding.subjects.unwrap();
        assert_eq!(subjects[0].name, "alice@corp");
        assert_eq!(o.binding.role_ref.name, READER_ROLE);
        let verbs: Vec<&str> = o.role.rules.as_ref().unwrap()[1]
            .verbs
            .iter()
            .map(String::as_str)
            .collect();
        assert_eq!(verbs, ["get"]);
    }

    #[test]
    fn classes_never_preempt_by_themselves_and_removed_teams_are_found() {
        let pcs = priority_classes(
            &[pb::PriorityClassInfo {
                name: "production".into(),
                value: 1000,
            }],
            &opts(),
        );
        assert_eq!(pcs[0].metadata.name.as_deref(), Some("axle-production"));
        assert_eq!(pcs[0].preemption_policy.as_deref(), Some("Never"));
        let keep = team_objects(&team(), &BTreeMap::new(), &opts(), "{user}").namespace;
        let mut gone = keep.clone();
        gone.metadata.name = Some("axle-old".into());
        gone.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_TEAM.into(), "old".into());
        assert_eq!(
            orphaned(&[keep, gone], &[team()]),
            vec!["axle-old".to_string()]
        );
    }
}
