//! What the hub's benchmarks share: a policy, a stored record, filling a
//! store, RSS, and a hub started on a directory.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axle_hub::hub::{Clock, Hub, HubConfig};
use axle_hub::lifecycle::WState;
use axle_hub::records::*;
use axle_hub::store::{MAX_OPS_PER_TXN, Op, RedbStore, Store, Txn};

pub const POLICY: &str = r#"
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: c1}
spec:
  region: bench
  nodes: [{count: 1, gpuModel: H100, gpusPerNode: 8}]
---
apiVersion: axle.dev/v1
kind: Team
metadata: {name: vision}
spec:
  quotas: {H100: {guaranteed: 8, limit: 8}}
---
apiVersion: axle.dev/v1
kind: Settings
metadata: {name: settings}
spec:
  retainFinishedHours: 168
"#;

/// Records per atomic write while filling the store.
const FILL_GROUP: usize = 10_000;

/// Stores workloads 1..=n, made by `make`, in the store in `dir`.
pub async fn fill(dir: &std::path::Path, n: u64, make: impl Fn(u64) -> WorkloadRecord) {
    let store = RedbStore::open_in_dir(dir).expect("store");
    let mut id = 1;
    while id <= n {
        let end = (id + FILL_GROUP as u64 - 1).min(n);
        let ops: Vec<Op> = (id..=end)
            .map(|i| {
                Op::put(
                    workload_key(i),
                    serde_json::to_vec(&make(i)).expect("encode"),
                )
            })
            .collect();
        let txns = ops
            .chunks(MAX_OPS_PER_TXN)
            .map(|c| Txn {
                compares: Vec::new(),
                success: c.to_vec(),
                failure: Vec::new(),
            })
            .collect();
        store.txn_atomic(txns).await.expect("fill");
        id = end + 1;
    }
}

pub fn record(id: u64, finished_at_ms: u64) -> WorkloadRecord {
    WorkloadRecord {
        v: RECORD_VERSION,
        id,
        name: format!("train-{id}"),
        team: "vision".into(),
        priority: "development".into(),
        gpus_milli: 1000,
        replicas: 1,
        gpu_model: None,
        regions: Vec::new(),
        allow_spread: false,
        burst_allowed: false,
        command: vec!["python".into(), "train.py".into(), "--epochs=3".into()],
        env: Default::default(),
        max_runtime_s: None,
        image: None,
        checkpoint_interval_s: None,
        checkpoint_signal: None,
        idempotency_key: None,
        submitted_at_ms: finished_at_ms - 60_000,
        submitted_by: None,
        state: WState::Succeeded,
        epoch: 1,
        placement: None,
        started_at_ms: Some(finished_at_ms - 50_000),
        finished_at_ms: Some(finished_at_ms),
        exit_code: Some(0),
        preemptions: 0,
        stopping: None,
        history: vec![
            TransitionRecord {
                at_ms: finished_at_ms - 55_000,
                from: WState::Pending,
                to: WState::Placed,
                reason: "placed on c1 (n0 GPU 0)".into(),
            },
            TransitionRecord {
                at_ms: finished_at_ms - 50_000,
                from: WState::Placed,
                to: WState::Running,
                reason: "started on c1".into(),
            },
            TransitionRecord {
                at_ms: finished_at_ms,
                from: WState::Running,
                to: WState::Succeeded,
                reason: "exited 0".into(),
            },
        ],
        preemption_log: Vec::new(),
        lost_gpu_ms: 0,
        run_ms: 0,
    }
}

pub fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

pub async fn start(dir: &std::path::Path) -> (Arc<Hub>, axle_hub::hub::HubTasks, Duration) {
    let policy = axle_policy::load_sources(&[("p.yaml".into(), POLICY.into())])
        .expect("policy")
        .policy;
    let t = Instant::now();
    let store = RedbStore::open_in_dir(dir).expect("store");
    let (hub, tasks) = Hub::start(
        store,
        policy,
        HubConfig {
            data_dir: dir.to_path_buf(),
            spoke_token: None,
            log_limits: Default::default(),
            clock: Clock::system(),
            on_store_failure: Default::default(),
            auth: axle_hub::auth::AuthMode::None,
            bootstrap_token: None,
            rate_limits: Default::default(),
            spoke_ca: None,
            spoke_cert_ttl_ms: 0,
            oidc: None,
            burst: None,
        },
    )
    .await
    .expect("hub starts");
    (hub, tasks, t.elapsed())
}
