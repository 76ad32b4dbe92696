//! Restore: the applier's state from the store at start. Workloads and
//! clusters are read in full (they are what the hub schedules); events only
//! by their tail, through the index of their keys (sequence order), so
//! start-up does not scan the audit log.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axle_policy::Policy;
use axle_scheduler::{Inventory, State};

use super::spokes::{ClusterEntry, SpokeState};
use super::{EVENTS_IN_MEMORY, Inner, Workloads};
use crate::records::*;
use crate::store::Store;

pub(super) async fn load(
    store: &dyn Store,
    policy: Arc<Policy>,
    now: u64,
) -> anyhow::Result<Inner> {
    let mut workloads = Workloads::default();
    let mut finished = BTreeSet::new();
    for kv in store.range(WORKLOADS).await? {
        let w: WorkloadRecord = serde_json::from_slice::<WorkloadRecord>(&kv.value)
            .map_err(|e| anyhow::anyhow!("corrupt record {}: {e}", kv.key))?
            .upgrade();
        if w.state.is_terminal() {
            finished.insert((w.finished_at_ms.unwrap_or(w.submitted_at_ms), w.id));
        }
        workloads.insert(w);
    }
    let mut clusters = BTreeMap::new();
    for kv in store.range(CLUSTERS).await? {
        let c: ClusterRecord = serde_json::from_slice(&kv.value)
            .map_err(|e| anyhow::anyhow!("corrupt record {}: {e}", kv.key))?;
        let mut entry = ClusterEntry::new(SpokeState::Disconnected, now);
        entry.region = c.region;
        entry.labels = c.labels;
        entry.nodes = c.nodes;
        entry.driver = c.driver;
        entry.default_image = c.default_image;
        entry.node_pages = c.node_pages;
        clusters.insert(c.name.clone(), entry);
    }
    // Pages in key order are pages in order; a page beyond its cluster's
    // count (or of a cluster with no record) is left from an interrupted
    // write of an older store and ignored.
    for kv in store.range(CLUSTER_NODES).await? {
        let p: NodePageRecord = serde_json::from_slice(&kv.value)
            .map_err(|e| anyhow::anyhow!("corrupt record {}: {e}", kv.key))?;
        if let Some(entry) = clusters.get_mut(&p.cluster)
            && p.page < entry.node_pages
        {
            entry.nodes.extend(p.nodes);
        }
    }
    add_declared_clusters(&policy, &mut clusters);
    let mut events = imbl::Vector::new();
    let tail = store.range_tail(EVENTS, EVENTS_IN_MEMORY).await?;
    let (oldest_event, oldest_event_at_ms) = match store.range_page(EVENTS, None, 1).await?.first()
    {
        Some(kv) => match serde_json::from_slice::<EventRecord>(&kv.value) {
            Ok(e) => (e.seq, e.at_ms),
            // Undecodable: retention looks at it (and deletes it) first.
            Err(_) => (1, 0),
        },
        None => (1, u64::MAX),
    };
    let mut next_event = 1;
    for kv in tail {
        if let Ok(e) = serde_json::from_slice::<EventRecord>(&kv.value) {
            next_event = next_event.max(e.seq + 1);
            events.push_back(Arc::new(e));
        }
    }
    let counters: Option<CountersRecord> = match store.get(COUNTERS_KEY).await? {
        Some(kv) => Some(
            serde_json::from_slice(&kv.value)
                .map_err(|e| anyhow::anyhow!("corrupt record {COUNTERS_KEY}: {e}"))?,
        ),
        None => None,
    };
    // Whichever is higher: the counters, or what is stored (a store
    // written before the counters existed).
    let next_id = workloads
        .last_id()
        .map(|id| id + 1)
        .unwrap_or(1)
        .max(counters.map_or(1, |c| c.next_workload_id));
    let next_event = next_event.max(counters.map_or(1, |c| c.next_event_seq));
    let idem = workloads
        .values()
        .filter_map(|w| {
            w.idempotency_key
                .as_ref()
                .map(|k| ((w.team.clone(), k.clone()), w.id))
        })
        .collect();
    let mut tokens = BTreeMap::new();
    for kv in store.range(TOKENS).await? {
        let t: crate::auth::TokenRecord = serde_json::from_slice(&kv.value)
            .map_err(|e| anyhow::anyhow!("corrupt record {}: {e}", kv.key))?;
        tokens.insert(t.id.clone(), t);
    }
    let mut join_tokens = BTreeMap::new();
    for kv in store.range(JOIN_TOKENS).await? {
        let t: crate::spoke_ca::JoinTokenRecord = serde_json::from_slice(&kv.value)
            .map_err(|e| anyhow::anyhow!("corrupt record {}: {e}", kv.key))?;
        join_tokens.insert(t.id.clone(), t);
    }
    let mut spoke_certs = BTreeMap::new();
    for kv in store.range(SPOKE_CERTS).await? {
        let c: crate::spoke_ca::SpokeCertRecord = serde_json::from_slice(&kv.value)
            .map_err(|e| anyhow::anyhow!("corrupt record {}: {e}", kv.key))?;
        spoke_certs.insert(c.fingerprint.clone(), c);
    }
    let state = State::new(policy.clone(), &Inventory::default());
    let mut bursts = BTreeMap::new();
    for kv in store.range(crate::burst::record::BURSTS).await? {
        let r: crate::burst::record::BurstRecord = serde_json::from_slice(&kv.value)
            .map_err(|e| anyhow::anyhow!("corrupt record {}: {e}", kv.key))?;
        bursts.insert(r.id.clone(), r);
    }
    let ledger = crate::burst::ledger::Ledger::from_reservations(
        bursts
            .values()
            .map(crate::burst::record::BurstRecord::reservation),
    );
    // Run times of what finished and is still retained (a week by default).
    let mut runtimes = axle_scheduler::RuntimeStats::new();
    for w in workloads.values() {
        if w.state == crate::lifecycle::WState::Succeeded {
            runtimes.record(&w.team, &w.priority, &w.name, w.run_ms / 1000);
        }
    }
    Ok(Inner {
        refusals_noted: BTreeMap::new(),
        runtimes,
        bursts,
        ledger,
        burst_rt: super::burst::BurstRuntime::default(),
        burst_cfg: None,
        spoke_ca: None,
        burst_snapshot: Arc::new(Vec::new()),
        burst_snapshot_stale: true,
        policy,
        state,
        clusters,
        workloads,
        reasons: imbl::OrdMap::new(),
        idem,
        next_id,
        next_event,
        events,
        burst_noted: BTreeSet::new(),
        started_ms: now,
        dirty: true,
        explain_stale: true,
        last_explain_ms: 0,
        finished,
        oldest_event,
        oldest_event_at_ms,
        saved_counters: (0, 0),
        tokens: Arc::new(tokens),
        join_tokens: Arc::new(join_tokens),
        spoke_certs: Arc::new(spoke_certs),
        actor: None,
    })
}

/// Adds every cluster the policy declares and no spoke has registered yet,
/// with the capacity [`axle_scheduler::inventory::declared`] expands it to
/// (the same nodes the simulator plans on).
pub(super) fn add_declared_clusters(
    policy: &Policy,
    clusters: &mut BTreeMap<String, ClusterEntry>,
) {
    for c in axle_scheduler::inventory::declared(policy).clusters {
        if clusters.contains_key(&c.name) {
            continue;
        }
        let nodes = c
            .nodes
            .iter()
            .map(|n| NodeRecord {
                name: n.name.clone(),
                gpus: (0..n.gpu_count)
                    .map(|index| {
                        GpuRecord::whole(index, &n.gpu_model, n.gpu_memory_mb, n.fractions_only)
                    })
                    .collect(),
                whole_only: n.whole_only,
                topology: n.topology.clone().unwrap_or_default(),
            })
            .collect();
        let labels = policy
            .clusters
            .get(&c.name)
            .map(|p| p.labels.clone())
            .unwrap_or_default();
        let mut entry = ClusterEntry::new(SpokeState::Declared, 0);
        entry.region = c.region;
        entry.labels = labels;
        entry.nodes = nodes;
        clusters.insert(c.name, entry);
    }
}
