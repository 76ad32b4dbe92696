//! Fractional units on a Kubernetes spoke end to end: a real hub, a real
//! `axle-spoke --driver kubernetes` and the in-memory API server (which,
//! like a real cluster, leaves a pod Pending when its node lacks the
//! resource). Each MIG device and time-sliced replica is a unit; a fraction
//! goes only to a unit that serves it, and its pod asks for exactly that
//! unit.

use std::time::Duration;

use axle_e2e::kube::{KubeEnv, gpu_node, limits};
use axle_e2e::{request, wait_until};
use axle_proto::api::WorkloadView;

const CLUSTER: &str = "k8s";
const WAIT: Duration = Duration::from_secs(30);

async fn wait_state(env: &KubeEnv, id: u64, state: &str) -> WorkloadView {
    env.api().wait_state(id, state, WAIT).await
}

/// The nine quarters that once gave 6 Running and 3 Failed (`unschedulable:
/// 0/1 nodes are available: Insufficient nvidia.com/gpu.shared`): the hub
/// put quarters on a whole-GPU node without a shared resource, saw a node
/// of three `2g.20gb` MIG devices as one H100 in quarters, and offered a
/// node of `1g.10gb` devices quarters no device could hold. Now each MIG
/// device and time-sliced replica is a unit: 3 + 4 quarters run, each on
/// exactly the unit the hub chose; 2 wait, Pending with a reason; none
/// fails and none lands on the whole-GPU node or a `1g.10gb` device.
#[tokio::test(flavor = "multi_thread")]
async fn quarters_go_only_to_units_that_serve_them() {
    let product = "NVIDIA-H100-80GB-HBM3";
    let nodes = vec![
        gpu_node("whole", product, 8, &[("nvidia.com/gpu", "8")]),
        gpu_node("mig-b", product, 1, &[("nvidia.com/mig-2g.20gb", "3")]),
        gpu_node("sliced", product, 1, &[("nvidia.com/gpu.shared", "4")]),
        gpu_node("tiny", product, 1, &[("nvidia.com/mig-1g.10gb", "7")]),
    ];
    let env = KubeEnv::start(&["kube"], CLUSTER, nodes, &[]).await;
    let api = env.api();
    let mut ids = Vec::new();
    for i in 0..9 {
        let mut r = request("vision", 0.25, vec!["jupyter".into(), "lab".into()]);
        r.name = Some(format!("quarter-{i}"));
        r.gpu_model = Some("H100".into());
        ids.push(api.submit_ok(&r).await.id);
    }
    // Seven are placed; their pods ask for exactly the unit, on its node.
    let placed = wait_until(WAIT, "7 quarters placed, 2 pending", || async {
        let ws = api.workloads().await;
        let placed: Vec<WorkloadView> =
            ws.iter().filter(|w| w.state == "Placed").cloned().collect();
        let pending = ws.iter().filter(|w| w.state == "Pending").count();
        if placed.len() == 7 && pending == 2 {
            Ok(placed)
        } else {
            Err(format!("{ws:#?}"))
        }
    })
    .await;
    let mut by_node = std::collections::BTreeMap::<String, usize>::new();
    for w in &placed {
        let pods = env.wait_pods(w.id, w.epoch, 1).await;
        let node = pods[0]
            .spec
            .as_ref()
            .unwrap()
            .node_selector
            .as_ref()
            .unwrap()["kubernetes.io/hostname"]
            .clone();
        let want = match node.as_str() {
            "mig-b" => "nvidia.com/mig-2g.20gb",
            "sliced" => "nvidia.com/gpu.shared",
            other => panic!("a quarter on {other}: {w:#?}"),
        };
        assert_eq!(
            limits(&pods[0]),
            [(want.to_string(), "1".to_string())].into()
        );
        *by_node.entry(node).or_default() += 1;
        env.run_pods(&pods);
    }
    assert_eq!(
        by_node,
        [("mig-b".to_string(), 3), ("sliced".to_string(), 4)].into()
    );
    for w in &placed {
        wait_state(&env, w.id, "Running").await;
    }
    // describe names the unit.
    let described = api.workload(placed[0].id).await;
    let unit = described.replicas[0].gpus[0]
        .unit
        .clone()
        .unwrap_or_default();
    assert!(
        unit.starts_with("MIG 2g.20gb #") || unit.starts_with("time-slice 1/4 #"),
        "{described:#?}"
    );
    let ws = api.workloads().await;
    let running = ws.iter().filter(|w| w.state == "Running").count();
    let pending: Vec<&WorkloadView> = ws.iter().filter(|w| w.state == "Pending").collect();
    let failed = ws.iter().filter(|w| w.state == "Failed").count();
    eprintln!(
        "nine quarters: {running} Running, {} Pending, {failed} Failed",
        pending.len()
    );
    assert_eq!((running, pending.len(), failed), (7, 2, 0));
    for w in pending {
        assert!(
            w.pending_reason.as_deref().is_some_and(|r| !r.is_empty()),
            "{w:#?}"
        );
    }
    // A quarter ends: a waiting one takes its unit.
    let first = &placed[0];
    let pods = env.wait_pods(first.id, first.epoch, 1).await;
    env.succeed_pods(&pods);
    wait_state(&env, first.id, "Succeeded").await;
    wait_until(WAIT, "a waiting quarter placed", || async {
        let ws = api.workloads().await;
        let pending = ws.iter().filter(|w| w.state == "Pending").count();
        if pending == 1 {
            Ok(())
        } else {
            Err(format!("{pending} pending"))
        }
    })
    .await;
    assert_eq!(ids.len(), 9);
}
