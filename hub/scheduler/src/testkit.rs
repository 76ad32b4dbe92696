//! Builders for the crate's own unit tests: a policy with the four standard
//! classes, an inventory, requests, and running workloads placed by hand.

use std::collections::BTreeMap;
use std::sync::Arc;

use axle_policy::{
    CrossTeamPreemption, Milli, Policy, Quota, Settings, Team, TeamBurst, default_priority_classes,
};

use crate::state::State;
use crate::types::{Allocation, ClusterInventory, Inventory, NodeInventory, Shard, WorkloadSpec};

/// `(gpu class, guaranteed, limit)` in GPUs.
pub type QuotaDef<'a> = (&'a str, f64, f64);

/// `(team, quotas)`, the standard classes.
pub fn policy(teams: &[(&str, &[QuotaDef<'_>])], cross: CrossTeamPreemption) -> Arc<Policy> {
    let teams = teams
        .iter()
        .map(|(name, quotas)| {
            let quotas = quotas
                .iter()
                .map(|&(c, g, l)| {
                    (
                        c.to_string(),
                        Quota {
                            guaranteed: gpus(g),
                            limit: gpus(l),
                        },
                    )
                })
                .collect();
            (
                name.to_string(),
                Team {
                    name: name.to_string(),
                    quotas,
                    weight: 1.0,
                    members: Vec::new(),
                    groups: Vec::new(),
                    burst: TeamBurst::default(),
                },
            )
        })
        .collect();
    Arc::new(Policy {
        revision: "unit".into(),
        teams,
        priority_classes: default_priority_classes(),
        clusters: BTreeMap::new(),
        burst_providers: BTreeMap::new(),
        settings: Settings {
            cross_team_preemption: cross,
            ..Settings::default()
        },
    })
}

/// `p` with `class` laying out replicas larger than a node as `placement`.
pub fn with_placement(
    p: Arc<Policy>,
    class: &str,
    placement: axle_policy::GangPlacement,
) -> Arc<Policy> {
    let mut p = (*p).clone();
    if let Some(c) = p.priority_classes.get_mut(class) {
        c.placement = placement;
    }
    Arc::new(p)
}

pub fn gpus(g: f64) -> Milli {
    Milli::from_gpus_f64(g).expect("a GPU amount")
}

/// One cluster `c0` in region `eu` with nodes of `(model, GPUs)`.
pub fn inventory(nodes: &[(&str, u32)]) -> Inventory {
    Inventory {
        clusters: vec![ClusterInventory {
            name: "c0".into(),
            region: "eu".into(),
            schedulable: true,
            needs_image: false,
            price_per_gpu_hour: axle_policy::Usd::ZERO,
            owner_team: None,
            nodes: nodes
                .iter()
                .enumerate()
                .map(|(i, (m, n))| NodeInventory {
                    name: format!("n{i}"),
                    gpu_model: m.to_string(),
                    gpu_count: *n,
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

/// One replica of `g` GPUs for `team` in `class`, submitted at 0.
pub fn req(id: u64, team: &str, class: &str, g: f64) -> WorkloadSpec {
    WorkloadSpec {
        id,
        team: team.into(),
        priority_class: class.into(),
        gpus_per_replica: gpus(g),
        replicas: 1,
        gpu_model: None,
        regions: Vec::new(),
        allow_spread: false,
        burst_allowed: false,
        submit_time_ms: 0,
        checkpoint_interval_s: None,
        max_runtime_s: None,
        has_image: false,
        expected_runtime: None,
    }
}

/// Starts `spec` on node `node` of cluster 0, on `gpu_list` (each whole, or
/// the spec's fraction of one GPU), at `start_ms`.
pub fn run(s: &mut State, spec: WorkloadSpec, node: u32, gpu_list: &[u32], start_ms: u64) {
    let share = Milli(spec.gpus_per_replica.0.min(axle_policy::MILLI_PER_GPU));
    let alloc = Allocation {
        cluster: 0,
        replicas: vec![
            gpu_list
                .iter()
                .map(|&gpu| Shard {
                    node,
                    gpu,
                    milli: share,
                })
                .collect(),
        ],
    };
    s.start(Arc::new(spec), alloc, start_ms)
        .expect("the test's placement is valid");
}
