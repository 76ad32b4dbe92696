//! From files to a replay: a parsed trace becomes the jobs a policy can
//! run, a node list becomes an inventory. Shared by `axle simulate` and the
//! trace tests, so both replay exactly the same thing.

use axle_policy::Policy;
use axle_scheduler::{ClusterInventory, Inventory, NodeInventory};

use crate::replay::SimJob;
use crate::trace::{NodeList, Trace};

/// The class a trace job gets when it names none or one the policy lacks:
/// `requested` if given, else `training` when the policy has it (traces are
/// mostly training jobs), else the policy's default class.
pub fn default_class(policy: &Policy, requested: Option<&str>) -> Result<String, String> {
    match requested {
        Some(p) if policy.priority_classes.contains_key(p) => Ok(p.to_string()),
        Some(p) => Err(format!(
            "unknown priority class {p:?}; the policy has: {}",
            policy
                .priority_classes
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )),
        None if policy.priority_classes.contains_key("training") => Ok("training".to_string()),
        None => Ok(policy.settings.default_priority_class.clone()),
    }
}

/// The trace's jobs, each in its own priority class when the policy has it,
/// else in `default_class`.
pub fn jobs_of(trace: &Trace, policy: &Policy, default_class: &str) -> Vec<SimJob> {
    trace
        .jobs
        .iter()
        .map(|j| SimJob {
            name: j.name.clone(),
            submit_time_s: j.submit_time_s,
            duration_s: j.duration_s,
            gpus_per_replica: j.gpus_per_replica,
            replicas: j.replicas,
            allow_spread: j.allow_spread,
            team: j.team.clone(),
            priority_class: j
                .priority
                .clone()
                .filter(|p| policy.priority_classes.contains_key(p))
                .unwrap_or_else(|| default_class.to_string()),
            gpu_model: j.gpu_model.clone(),
        })
        .collect()
}

/// The nodes of a node list as one cluster `sim`.
pub fn inventory_of(list: &NodeList) -> Inventory {
    Inventory {
        clusters: vec![ClusterInventory {
            name: "sim".to_string(),
            region: "sim".to_string(),
            schedulable: true,
            needs_image: false,
            price_per_gpu_hour: axle_policy::Usd::ZERO,
            owner_team: None,
            nodes: list
                .nodes
                .iter()
                .map(|n| NodeInventory {
                    name: n.name.clone(),
                    gpu_model: n.gpu_model.clone(),
                    gpu_count: n.gpu_count,
                    gpu_memory_mb: 0,
                    fractions_only: false,
                    whole_only: false,
                    units: Vec::new(),
                    topology: None,
                })
                .collect(),
        }],
    }
}
