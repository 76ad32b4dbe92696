//! The names and indices a `State` resolves requests against: teams with
//! their quota slots, priority classes, GPU models and the largest node of
//! each model. Built once from a policy and an inventory; admission checks
//! (`validate.rs`) need nothing else.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axle_policy::{CrossTeamPreemption, Milli, Policy};

use crate::types::Inventory;

#[derive(Debug, Clone)]
pub(crate) struct TeamInfo {
    pub name: String,
    pub weight: f64,
    /// Quota slots: (class name, guaranteed, limit).
    pub slots: Vec<(String, Milli, Milli)>,
    /// Slot index charged for each GPU model index; `None`: no quota.
    pub charge: Vec<Option<u16>>,
    pub burst_providers: Vec<String>,
    pub burst_budget_per_month: axle_policy::Usd,
}

#[derive(Debug, Clone)]
pub(crate) struct ClassInfo {
    pub name: String,
    pub value: i32,
    /// Bit i set: class i may preempt this class.
    pub preemptible_by: u64,
    pub grace_period_s: u64,
    pub idle_only: bool,
    pub burst_allowed: bool,
    pub placement: axle_policy::GangPlacement,
    /// Not preempted by priority before running this long.
    pub min_runtime_ms: u64,
    /// Does not preempt by priority when it will fit within this long.
    pub tolerable_wait_ms: u64,
}

impl ClassInfo {
    pub fn is_preemptible(&self) -> bool {
        self.preemptible_by != 0
    }

    /// May work of class index `class` preempt this class?
    pub fn preemptible_by(&self, class: u16) -> bool {
        (self.preemptible_by >> (class % 64)) & 1 == 1
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Catalog {
    pub policy: Arc<Policy>,
    pub teams: Vec<TeamInfo>,
    pub team_index: BTreeMap<String, u32>,
    pub classes: Vec<ClassInfo>,
    pub class_index: BTreeMap<String, u16>,
    pub models: Vec<String>,
    pub model_index: BTreeMap<String, u16>,
    /// Largest node size per model, for "can never fit" checks. Every
    /// cluster counts, schedulable or not: "can never fit" is about the
    /// inventory, not about which spokes are connected right now. (Counting
    /// only schedulable clusters made the hub re-queue every running
    /// workload when it restarted before its spokes reconnected, and cancel
    /// pending ones whose only cluster was briefly disconnected.)
    pub largest_node: Vec<u32>,
    /// GPUs of each model in each cluster: `[cluster][model]`.
    pub cluster_model_gpus: Vec<Vec<u32>>,
    /// Every region a cluster is in, for checking requests.
    pub regions: BTreeSet<String>,
    /// `crossTeamPreemption: borrowedOnly`: another team's work is taken
    /// only from what that team borrows, and work that is never preempted
    /// runs only within its own team's guarantee.
    pub guarantees_hard: bool,
}

impl Catalog {
    /// The index of the GPU model a request names (`None`: it names none,
    /// or one no cluster has).
    pub fn model_of(&self, name: Option<&str>) -> Option<u16> {
        name.and_then(|m| self.model_index.get(m).copied())
    }

    pub fn new(policy: Arc<Policy>, inventory: &Inventory) -> Catalog {
        let mut models: BTreeSet<String> = BTreeSet::new();
        for c in &inventory.clusters {
            for n in &c.nodes {
                models.insert(n.gpu_model.clone());
            }
        }
        let models: Vec<String> = models.into_iter().collect();
        let model_index: BTreeMap<String, u16> = models
            .iter()
            .enumerate()
            .map(|(i, m)| (m.clone(), i as u16))
            .collect();

        let mut teams = Vec::new();
        let mut team_index = BTreeMap::new();
        for (i, (name, t)) in policy.teams.iter().enumerate() {
            let slots: Vec<(String, Milli, Milli)> = t
                .quotas
                .iter()
                .map(|(k, q)| (k.clone(), q.guaranteed, q.limit))
                .collect();
            let charge = models
                .iter()
                .map(|m| {
                    t.quota_class_for(m)
                        .and_then(|c| slots.iter().position(|s| s.0 == c))
                        .map(|p| p as u16)
                })
                .collect();
            teams.push(TeamInfo {
                name: name.clone(),
                weight: t.weight,
                slots,
                charge,
                burst_providers: t.burst.providers.clone(),
                burst_budget_per_month: t.burst.monthly_budget,
            });
            team_index.insert(name.clone(), i as u32);
        }

        let class_index: BTreeMap<String, u16> = policy
            .priority_classes
            .keys()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u16))
            .collect();
        let classes: Vec<ClassInfo> = policy
            .priority_classes
            .values()
            .map(|pc| ClassInfo {
                name: pc.name.clone(),
                value: pc.value,
                preemptible_by: pc
                    .preemptible_by
                    .iter()
                    .filter_map(|n| class_index.get(n))
                    .fold(0u64, |acc, &i| acc | (1u64 << (i % 64))),
                grace_period_s: pc.grace_period_s,
                idle_only: pc.idle_only,
                burst_allowed: pc.burst_allowed,
                placement: pc.placement,
                min_runtime_ms: pc.min_runtime_s.saturating_mul(1000),
                tolerable_wait_ms: pc.tolerable_wait_s.saturating_mul(1000),
            })
            .collect();

        let mut largest_node = vec![0u32; models.len()];
        let mut cluster_model_gpus = vec![vec![0u32; models.len()]; inventory.clusters.len()];
        let mut regions = BTreeSet::new();
        for (ci, c) in inventory.clusters.iter().enumerate() {
            regions.insert(c.region.clone());
            for n in &c.nodes {
                let m = model_index[&n.gpu_model] as usize;
                let l = &mut largest_node[m];
                // Only whole GPUs hold a whole-GPU replica.
                let whole = if n.units.is_empty() {
                    n.gpu_count
                } else {
                    n.units.iter().filter(|u| u.is_whole()).count() as u32
                };
                *l = (*l).max(whole);
                cluster_model_gpus[ci][m] += n.gpu_count;
            }
        }
        Catalog {
            guarantees_hard: policy.settings.cross_team_preemption
                == CrossTeamPreemption::BorrowedOnly,
            policy,
            teams,
            team_index,
            classes,
            class_index,
            models,
            model_index,
            largest_node,
            cluster_model_gpus,
            regions,
        }
    }
}
