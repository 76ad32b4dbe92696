//! Stored records of the hub (versioned) and their keys. These are storage
//! types: the API views are built from them in `views.rs`, and the
//! scheduler's types in `hub.rs`.
//!
//! Versioning: every record has `v`. A reader accepts every version it knows
//! and upgrades it in memory; writers always write `RECORD_VERSION`. Version 1
//! is the first. Version 2 made a workload's unconfirmed stop a state of its
//! own (`Preempting`, `Cancelling`); version 1 kept it beside the state, as
//! `stopping.cancel` ([`WorkloadRecord::upgrade`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::lifecycle::WState;

pub const RECORD_VERSION: u32 = 2;

pub const WORKLOADS: &str = "workloads/";
pub const EVENTS: &str = "events/";
pub const CLUSTERS: &str = "clusters/";
/// API tokens (`crate::auth::TokenRecord`), by id.
pub const TOKENS: &str = "tokens/";

pub fn token_key(id: &str) -> String {
    format!("{TOKENS}{id}")
}

/// Join tokens of new spokes, by id (see `crate::spoke_ca`).
pub const JOIN_TOKENS: &str = "join_tokens/";

pub fn join_token_key(id: &str) -> String {
    format!("{JOIN_TOKENS}{id}")
}

/// Certificates issued to spokes, by SHA-256 fingerprint.
pub const SPOKE_CERTS: &str = "spoke_certs/";

pub fn spoke_cert_key(fingerprint: &str) -> String {
    format!("{SPOKE_CERTS}{fingerprint}")
}

/// The next workload id and event sequence. Retention deletes records, so
/// the highest stored id says nothing about the ids already handed out:
/// this record keeps ids and sequences from ever being reused.
pub const COUNTERS_KEY: &str = "meta/counters";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountersRecord {
    pub v: u32,
    pub next_workload_id: u64,
    pub next_event_seq: u64,
}

pub fn workload_key(id: u64) -> String {
    format!("{WORKLOADS}{id:020}")
}

pub fn event_key(seq: u64) -> String {
    format!("{EVENTS}{seq:020}")
}

pub fn cluster_key(name: &str) -> String {
    format!("{CLUSTERS}{name}")
}

/// A cluster's nodes, in pages ([`NodePageRecord`]) beside its
/// [`ClusterRecord`]: one record holding 10,000 nodes would pass the store's
/// value limit ([`crate::store::MAX_VALUE_BYTES`]).
pub const CLUSTER_NODES: &str = "cluster_nodes/";

pub fn node_page_key(cluster: &str, page: u32) -> String {
    format!("{CLUSTER_NODES}{cluster}/{page:06}")
}

/// Most bytes of nodes (as JSON) in one [`NodePageRecord`]: a third of the
/// store's value limit, so a page is far from it whatever its last node
/// holds (one node is at most ~30 KB: `inventory::MAX_GPUS_PER_NODE`
/// devices with bounded names).
pub const NODE_PAGE_BYTES: usize = 512 * 1024;

/// One page of a registered cluster's nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePageRecord {
    pub v: u32,
    pub cluster: String,
    pub page: u32,
    pub nodes: Vec<NodeRecord>,
}

/// Splits `nodes` into pages of at most [`NODE_PAGE_BYTES`] (a node larger
/// than that alone gets a page of its own), in order.
pub fn node_pages(nodes: &[NodeRecord]) -> Vec<Vec<NodeRecord>> {
    let mut pages: Vec<Vec<NodeRecord>> = Vec::new();
    let mut bytes = 0;
    for n in nodes {
        let b = serde_json::to_vec(n).map_or(0, |v| v.len() + 1);
        match pages.last_mut() {
            Some(last) if bytes + b <= NODE_PAGE_BYTES => {
                bytes += b;
                last.push(n.clone());
            }
            _ => {
                bytes = b;
                pages.push(vec![n.clone()]);
            }
        }
    }
    pages
}

/// At most this many transitions are kept per workload: enough to explain a
/// workload preempted a dozen times, small enough to keep records compact.
pub const MAX_HISTORY: usize = 64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransitionRecord {
    pub at_ms: u64,
    pub from: WState,
    pub to: WState,
    pub reason: String,
}

/// One replica's GPU shards: (node name, GPU index, milli-GPU). All on one
/// node unless the workload allows spreading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    pub shards: Vec<(String, u32, u32)>,
}

impl ReplicaRecord {
    /// The shards grouped by node, in node order of first appearance.
    pub fn by_node(&self) -> Vec<(&str, Vec<(u32, u32)>)> {
        let mut out: Vec<(&str, Vec<(u32, u32)>)> = Vec::new();
        for (node, gpu, milli) in &self.shards {
            match out.iter_mut().find(|(n, _)| n == node) {
                Some((_, v)) => v.push((*gpu, *milli)),
                None => out.push((node, vec![(*gpu, *milli)])),
            }
        }
        out
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementRecord {
    pub cluster: String,
    pub replicas: Vec<ReplicaRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadRecord {
    pub v: u32,
    pub id: u64,
    pub name: String,
    pub team: String,
    pub priority: String,
    pub gpus_milli: u64,
    pub replicas: u32,
    pub gpu_model: Option<String>,
    pub regions: Vec<String>,
    pub allow_spread: bool,
    pub burst_allowed: bool,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub max_runtime_s: Option<u64>,
    /// Container image, for clusters that run Jobs (absent in older records).
    #[serde(default)]
    pub image: Option<String>,
    /// `Some(interval)`: the workload checkpoints every `interval` seconds
    /// and resumes from `AXLE_CHECKPOINT_DIR` (resolved at submit from its
    /// priority class and the request). Absent in records written before
    /// checkpoints existed: not checkpointable.
    #[serde(default)]
    pub checkpoint_interval_s: Option<u64>,
    /// Signal sent at preemption to a checkpointable workload.
    #[serde(default)]
    pub checkpoint_signal: Option<String>,
    pub idempotency_key: Option<String>,
    pub submitted_at_ms: u64,
    /// The user who submitted it (absent in records written before users).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
    pub state: WState,
    /// Fencing token: bumped on every placement; a spoke runs only the current epoch.
    pub epoch: u64,
    pub placement: Option<PlacementRecord>,
    pub started_at_ms: Option<u64>,
    pub finished_at_ms: Option<u64>,
    pub exit_code: Option<i32>,
    pub preemptions: u32,
    /// Where and for which epoch the stop of a `Preempting` or `Cancelling`
    /// workload went (present exactly in those states): it is not re-queued
    /// (or marked cancelled) until that spoke confirms or is lost, so two
    /// copies never run at once.
    pub stopping: Option<StoppingRecord>,
    pub history: Vec<TransitionRecord>,
    /// The last [`MAX_HISTORY`] preemptions (absent in records written
    /// before they were kept).
    #[serde(default)]
    pub preemption_log: Vec<PreemptionRecord>,
    /// Work lost to every preemption, GPU-milliseconds.
    #[serde(default)]
    pub lost_gpu_ms: u64,
    /// Time spent running in runs that ended, ms (absent in older records:
    /// 0). The current run is counted from `started_at_ms`.
    #[serde(default)]
    pub run_ms: u64,
}

/// One preemption of a workload, for `axle describe`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreemptionRecord {
    pub at_ms: u64,
    pub by_workload: u64,
    pub by_team: String,
    pub by_priority: String,
    pub reason: String,
    /// GPU-milliseconds of work lost (the scheduler's estimate).
    pub lost_gpu_ms: u64,
}

impl WorkloadRecord {
    /// Holds GPUs in the scheduler's view: placed, running, or cancelling
    /// while still on its placement.
    pub fn holds_gpus(&self) -> bool {
        self.state.holds_gpus() && self.placement.is_some()
    }

    /// A record of any known version as the current version says it.
    pub fn upgrade(mut self) -> WorkloadRecord {
        if self.v < 2 {
            // Version 1: a stop outstanding beside Pending (preempted), or
            // beside any live state with `cancel` (cancelled by a user).
            if let Some(s) = &self.stopping
                && !self.state.is_terminal()
            {
                self.state = if s.legacy_cancel {
                    WState::Cancelling
                } else {
                    WState::Preempting
                };
            }
            if self.state.is_terminal() {
                self.stopping = None;
            }
            self.v = RECORD_VERSION;
        }
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoppingRecord {
    pub cluster: String,
    pub epoch: u64,
    /// A grace period shorter than the class's (the machine is reclaimed
    /// sooner); `None`: the class's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_s: Option<u64>,
    /// Version 1 records only: the stop was a user's cancel. Version 2 says
    /// it with the state (`Cancelling`); read by [`WorkloadRecord::upgrade`],
    /// never written.
    #[serde(rename = "cancel", default, skip_serializing)]
    pub legacy_cancel: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub v: u32,
    pub seq: u64,
    pub at_ms: u64,
    pub kind: String,
    pub workload: Option<u64>,
    pub cluster: Option<String>,
    pub message: String,
    pub policy_revision: String,
    /// The user whose call caused it (absent: the hub itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// How that user authenticated (`token <id>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRecord {
    pub index: u32,
    pub model: String,
    pub memory_mb: u64,
    /// Partitioned (MIG) or time-sliced: only fractions fit.
    #[serde(default)]
    pub fractions_only: bool,
    /// A fractional unit's device-plugin resource (`nvidia.com/mig-2g.20gb`);
    /// empty for a whole GPU.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unit: String,
    /// The unit's share of a GPU in thousandths; 0 for a whole GPU.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub share_milli: u32,
    /// The memory of the whole GPU a unit is part of (0: unknown).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub whole_memory_mb: u64,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

impl GpuRecord {
    /// A whole GPU.
    pub fn whole(index: u32, model: &str, memory_mb: u64, fractions_only: bool) -> GpuRecord {
        GpuRecord {
            index,
            model: model.to_string(),
            memory_mb,
            fractions_only,
            unit: String::new(),
            share_milli: 0,
            whole_memory_mb: 0,
        }
    }

    /// How `describe` names the unit: `MIG 2g.20gb`, `time-slice 1/4`;
    /// empty for a whole GPU.
    pub fn unit_name(&self) -> String {
        if self.unit.is_empty() {
            return String::new();
        }
        if let Some(profile) = self
            .unit
            .rsplit('/')
            .next()
            .and_then(|r| r.strip_prefix("mig-"))
        {
            return format!("MIG {profile}");
        }
        match self.share_milli {
            0 => self.unit.clone(),
            s => format!("time-slice 1/{}", (1000 / s).max(1)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub name: String,
    pub gpus: Vec<GpuRecord>,
    /// Whole GPUs are never split between workloads (Kubernetes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole_only: bool,
    /// The topology domain the spoke reported (a rack, an NVLink block).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub topology: String,
}

/// The last inventory a spoke registered, so a restarted hub knows the
/// clusters its running workloads are on before their spokes reconnect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRecord {
    pub v: u32,
    pub name: String,
    pub region: String,
    pub labels: BTreeMap<String, String>,
    pub nodes: Vec<NodeRecord>,
    /// How the spoke runs work (`local`, `kubernetes`); absent in records
    /// written before spokes said: `local`.
    #[serde(default)]
    pub driver: String,
    /// The spoke's image for workloads that name none (kubernetes).
    #[serde(default)]
    pub default_image: Option<String>,
    /// The nodes are in this many [`NodePageRecord`]s (`nodes` is then
    /// empty); 0 in records written before pages, which hold `nodes`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub node_pages: u32,
}

/// A pending record with the fewest fields set, for unit tests.
#[cfg(test)]
pub fn sample_record(id: u64) -> WorkloadRecord {
    serde_json::from_value(serde_json::json!({
        "v": RECORD_VERSION, "id": id, "name": format!("w-{id}"), "team": "t",
        "priority": "p", "gpus_milli": 1000, "replicas": 1, "gpu_model": null,
        "regions": [], "allow_spread": false, "burst_allowed": false,
        "command": ["true"], "env": {}, "max_runtime_s": null,
        "idempotency_key": null, "submitted_at_ms": 0, "state": "Pending",
        "epoch": 0, "placement": null, "started_at_ms": null,
        "finished_at_ms": null, "exit_code": null, "preemptions": 0,
        "stopping": null, "history": []
    }))
    .expect("a sample record")
}
