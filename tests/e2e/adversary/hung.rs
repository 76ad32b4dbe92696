//! A hung spoke agent (SIGSTOP of the agent process alone): its workloads
//! must stop by themselves before the hub runs them elsewhere.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axle_e2e::{Env, intervals, read_trace, request, sh, traced_script, wait_until};

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_agents_workloads_stop_before_they_run_elsewhere() {
    let mut env = Env::start(
        &["common", "two-clusters"],
        &[
            ("eu-1", "eu-west", &["4xH100:80GB", "4xH100:80GB"]),
            ("us-1", "us-east", &["4xA100:80GB"]),
        ],
    )
    .await;
    let api = env.api();
    let trace = env.path("trace.log");
    let mut ids = Vec::new();
    for (i, team) in ["alpha", "beta", "gamma", "alpha"].iter().enumerate() {
        let mut r = request(team, 1.0, sh(&traced_script(&trace, "120")));
        r.name = Some(format!("hung-{i}"));
        ids.push(api.submit_ok(&r).await.id);
    }
    let first = wait_until(Duration::from_secs(30), "all four to run", || {
        let trace = trace.clone();
        let n = ids.len();
        async move {
            let runs = intervals(&read_trace(&trace));
            if runs.len() == n {
                Ok(runs)
            } else {
                Err(format!("{} start lines", runs.len()))
            }
        }
    })
    .await;
    let mut per_cluster: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for i in first.values() {
        per_cluster
            .entry(i.start.cluster.clone())
            .or_default()
            .push(i.start.id);
    }
    let (victim, victims) = per_cluster
        .iter()
        .max_by_key(|(_, v)| v.len())
        .map(|(c, v)| (c.clone(), v.clone()))
        .expect("runs");
    // Observed: SIGSTOP of the agent alone for 65 s; the hub re-queued its
    // work elsewhere after ~45 s while the original processes kept running
    // under their shims: 16 of 16 workloads ran twice at once for ~24 s.
    let t0 = Instant::now();
    env.spoke(&victim).signal("STOP");
    let moved = wait_until(
        Duration::from_secs(40),
        "the hung spoke's work to run elsewhere",
        || {
            let trace = trace.clone();
            let victims = victims.clone();
            async move {
                let runs = intervals(&read_trace(&trace));
                let again = victims
                    .iter()
                    .filter(|id| runs.keys().filter(|(w, _, _)| w == *id).count() >= 2)
                    .count();
                if again == victims.len() {
                    Ok(runs)
                } else {
                    Err(format!("{again} of {} started again", victims.len()))
                }
            }
        },
    )
    .await;
    let moved_after = t0.elapsed();
    // Hold the agent a while longer, as the probe did, then let it go.
    tokio::time::sleep(Duration::from_secs(3)).await;
    env.spoke(&victim).signal("CONT");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let runs = intervals(&read_trace(&trace));
    let _ = moved;
    let mut overlaps = Vec::new();
    let mut gaps_ms = Vec::new();
    for id in &victims {
        let mut of: Vec<_> = runs.iter().filter(|((w, _, _), _)| w == id).collect();
        of.sort_by_key(|((_, e, _), _)| *e);
        let (old, new) = (of[0].1, of[1].1);
        match old.end_ns {
            Some(end) if end < new.start.ts_ns => {
                gaps_ms.push(((new.start.ts_ns - end) / 1_000_000) as u64);
            }
            end => overlaps.push(format!(
                "workload {id}: old run ended {end:?}, new one started {}",
                new.start.ts_ns
            )),
        }
    }
    assert!(overlaps.is_empty(), "ran twice at once: {overlaps:?}");
    eprintln!(
        "adversary: agent SIGSTOPped with {} workloads: re-queued elsewhere after {moved_after:?}; \
         0 of {} ran twice at once (old run ended {gaps_ms:?} ms before the new one started)",
        victims.len(),
        victims.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_kubernetes_agents_jobs_end_before_the_hub_requeues_them() {
    use axle_e2e::kube::{KubeEnv, gpu_node, label};
    let env = KubeEnv::start(
        &["kube"],
        "k8s",
        vec![gpu_node(
            "gpu-a",
            "NVIDIA-H100-80GB-HBM3",
            8,
            &[("nvidia.com/gpu", "8")],
        )],
        &[],
    )
    .await;
    let api = env.api();
    let w = api
        .submit_ok(&request("vision", 1.0, vec!["sleep".into(), "600".into()]))
        .await;
    let pods = env.wait_pods(w.id, w.epoch, 1).await;
    env.run_pods(&pods);
    api.wait_state(w.id, "Running", Duration::from_secs(30))
        .await;
    let job = env.jobs_of(w.id).remove(0);
    let deadline = |j: &k8s_openapi::api::batch::v1::Job| {
        j.spec.as_ref().and_then(|s| s.active_deadline_seconds)
    };
    // The Job's deadline is the lease's (spokeLostAfterSeconds 15 + 1 s),
    // extended while the hub confirms the spoke.
    assert!(
        deadline(&job).is_some_and(|d| d <= 16),
        "{:?}",
        deadline(&job)
    );
    let first = deadline(&job).unwrap();
    wait_until(
        Duration::from_secs(30),
        "the deadline to be extended",
        || {
            let j = env.jobs_of(w.id).remove(0);
            async move {
                match deadline(&j) {
                    Some(d) if d > first => Ok(()),
                    d => Err(format!("{d:?}")),
                }
            }
        },
    )
    .await;
    // Observed for local spokes: a hung agent's work ran twice at once.
    // Here the agent freezes; its Job must end by its deadline before the
    // hub re-queues the workload.
    let t0 = Instant::now();
    env.spoke.signal("STOP");
    let ended = wait_until(
        Duration::from_secs(60),
        "the Job to end by its deadline",
        || {
            let j = env.jobs_of(w.id).remove(0);
            let live = env
                .pods_of(w.id)
                .iter()
                .filter(|p| label(&p.metadata, "axle.dev/epoch") == Some(w.epoch.to_string()))
                .count();
            async move {
                let failed = j
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| {
                        c.iter().any(|c| {
                            c.type_ == "Failed" && c.reason.as_deref() == Some("DeadlineExceeded")
                        })
                    });
                if failed && live == 0 {
                    Ok(Instant::now())
                } else {
                    Err(format!("failed {failed}, {live} pods"))
                }
            }
        },
    )
    .await;
    let requeued = wait_until(Duration::from_secs(60), "the hub to re-queue it", || {
        let api = api.clone();
        async move {
            let now = api.workload(w.id).await;
            if now.epoch > w.epoch || now.state == "Pending" {
                Ok(Instant::now())
            } else {
                Err(now.state)
            }
        }
    })
    .await;
    env.spoke.signal("CONT");
    assert!(
        ended < requeued,
        "the Job ended {:?} after the freeze, the hub re-queued at {:?}",
        ended - t0,
        requeued - t0
    );
    eprintln!(
        "adversary: kubernetes agent frozen: its Job ended by its deadline {:?} after, the hub \
         re-queued the workload {:?} after; 0 overlapping runs",
        ended - t0,
        requeued - t0
    );
}
