//! Every Kubernetes API call the driver makes, as RBAC rules: the spoke's
//! ClusterRole (`deploy/kustomize/spoke/rbac.yaml`) grants exactly these, and
//! tests check both that the role matches and that the driver's requests to
//! a test API server stay inside them.

/// One RBAC rule: an API group (`""` is core), a resource and its verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    /// What the driver does with it.
    pub why: &'static str,
}

pub const API_ACCESS: &[Access] = &[
    Access {
        group: "",
        resource: "nodes",
        verbs: &["list", "watch"],
        why: "inventory: GPU nodes, their labels, taints and readiness",
    },
    Access {
        group: "batch",
        resource: "jobs",
        verbs: &["create", "delete", "list", "patch", "watch"],
        why: "one Indexed Job per assignment, deleted at stop or preemption; its deadline \
              extended while the hub confirms the spoke",
    },
    Access {
        group: "",
        resource: "pods",
        // `get` is not called; the team reader Role grants it, and RBAC lets
        // the spoke grant only what it holds.
        verbs: &["get", "list", "watch"],
        why: "run state from the Job's pods",
    },
    Access {
        group: "",
        resource: "pods/log",
        verbs: &["get"],
        why: "workload output, followed into the spoke's log files",
    },
    Access {
        group: "",
        resource: "events",
        verbs: &["list", "watch"],
        why: "why a Job made no pods (quota refusals)",
    },
    Access {
        group: "",
        resource: "namespaces",
        verbs: &["create", "delete", "list", "patch"],
        why: "team namespaces (server-side apply), removed once a team leaves",
    },
    Access {
        group: "",
        resource: "resourcequotas",
        verbs: &["create", "patch"],
        why: "the team's GPU quota at its policy limit",
    },
    Access {
        group: "rbac.authorization.k8s.io",
        resource: "roles",
        verbs: &["create", "patch"],
        why: "the team reader Role",
    },
    Access {
        group: "rbac.authorization.k8s.io",
        resource: "rolebindings",
        verbs: &["create", "patch"],
        why: "the team members' binding to the reader Role",
    },
    Access {
        group: "scheduling.k8s.io",
        resource: "priorityclasses",
        verbs: &["create"],
        why: "one PriorityClass per policy class (preemptionPolicy Never)",
    },
];

/// Whether the table allows `verb` on `resource` (with its subresource, as
/// `pods/log`) of `group`.
pub fn allows(group: &str, resource: &str, verb: &str) -> bool {
    API_ACCESS
        .iter()
        .any(|a| a.group == group && a.resource == resource && a.verbs.contains(&verb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_no_wildcards_or_duplicates() {
        let mut seen = std::collections::BTreeSet::new();
        for a in API_ACCESS {
            assert!(
                !a.resource.contains('*') && !a.verbs.contains(&"*"),
                "{a:?}"
            );
            assert!(seen.insert((a.group, a.resource)), "{a:?} twice");
        }
        assert!(allows("batch", "jobs", "create"));
        assert!(!allows("batch", "jobs", "update"));
        assert!(!allows("", "secrets", "get"));
    }

    /// RBAC lets the spoke grant only what it holds itself: every rule of
    /// the team reader Role it creates must be in the table.
    #[test]
    fn the_team_reader_role_grants_nothing_the_spoke_lacks() {
        let team = crate::driver::kubernetes::isolation::tests::team();
        let o = crate::driver::kubernetes::isolation::team_objects(
            &team,
            &Default::default(),
            &crate::driver::kubernetes::manifest::tests::opts(),
            "{user}",
        );
        for rule in o.role.rules.unwrap_or_default() {
            for g in rule.api_groups.unwrap_or_default() {
                for r in rule.resources.clone().unwrap_or_default() {
                    for v in &rule.verbs {
                        assert!(allows(&g, &r, v), "the reader Role grants {v} {g}/{r}");
                    }
                }
            }
        }
    }
}
