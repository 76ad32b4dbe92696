//! What a spoke mirrors onto its cluster of the policy's team isolation:
//! each team's members and its GPU limit for the models the cluster has,
//! and the priority classes. Sent in `Registered`.

use std::collections::BTreeSet;

use axle_policy::{MILLI_PER_GPU, Policy, Role};
use axle_proto::pb;

use crate::records::NodeRecord;

/// Every team of the policy, with its limit on the models of `nodes`: the
/// sum of the limits of its quota classes those models are charged to.
pub fn teams_for(policy: &Policy, nodes: &[NodeRecord]) -> Vec<pb::TeamIsolation> {
    let models: BTreeSet<&str> = nodes
        .iter()
        .flat_map(|n| n.gpus.iter().map(|g| g.model.as_str()))
        .collect();
    policy
        .teams
        .values()
        .map(|t| {
            let classes: BTreeSet<&str> =
                models.iter().filter_map(|m| t.quota_class_for(m)).collect();
            let limit: u64 = classes
                .iter()
                .filter_map(|c| t.quotas.get(*c))
                .map(|q| q.limit.0)
                .sum();
            pb::TeamIsolation {
                name: t.name.clone(),
                members: t
                    .members
                    .iter()
                    .map(|m| pb::TeamMember {
                        user: m.user.clone(),
                        role: match m.role {
                            Role::Admin => "admin",
                            Role::Member => "member",
                            Role::Viewer => "viewer",
                        }
                        .to_string(),
                    })
                    .collect(),
                gpu_limit_milli: limit,
                fraction_granularity_milli: policy
                    .settings
                    .fraction_granularity
                    .0
                    .clamp(1, MILLI_PER_GPU),
            }
        })
        .collect()
}

/// The policy's priority classes, highest first.
pub fn priority_classes(policy: &Policy) -> Vec<pb::PriorityClassInfo> {
    let mut v: Vec<pb::PriorityClassInfo> = policy
        .priority_classes
        .values()
        .map(|c| pb::PriorityClassInfo {
            name: c.name.clone(),
            value: c.value,
        })
        .collect();
    v.sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.name.cmp(&b.name)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::GpuRecord;

    #[test]
    fn limits_count_only_the_models_the_cluster_has() {
        let policy = crate::dev::example_policy().expect("example policy");
        let a100 = vec![NodeRecord {
            name: "n".into(),
            gpus: vec![GpuRecord::whole(0, "A100", 0, false)],
            whole_only: false,
            topology: String::new(),
        }];
        let teams = teams_for(&policy, &a100);
        let vision = teams.iter().find(|t| t.name == "vision").expect("vision");
        // vision: A100 limit 4 (its H100 and `any` quotas do not apply here).
        assert_eq!(vision.gpu_limit_milli, 4000);
        assert!(
            vision
                .members
                .iter()
                .any(|m| m.user == "alice" && m.role == "admin")
        );
        let research = teams
            .iter()
            .find(|t| t.name == "research")
            .expect("research");
        // research has no A100 class: `any` (limit 4) is charged.
        assert_eq!(research.gpu_limit_milli, 4000);
        let classes = priority_classes(&policy);
        assert_eq!(classes[0].name, "production");
    }
}
