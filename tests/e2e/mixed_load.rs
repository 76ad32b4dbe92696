//! 50 mixed workloads from three teams on two small spokes all succeed, and
//! no GPU is ever over-committed — checked from the workloads' own start/end
//! lines (what the spokes really ran), then cross-checked with the hub's
//! final placements.

use std::collections::BTreeMap;
use std::time::Duration;

use axle_e2e::{
    Env, Interval, intervals, is_terminal, overcommits, read_trace, request, sh, traced_script,
    wait_until,
};
use axle_proto::api::SubmitRequest;

/// GPUs per node on both spokes (the trace's device indices stay below it).
const GPUS_PER_NODE: u32 = 4;

/// (GPUs, gang, GPU model, how many) of the mix: fractions, whole GPUs,
/// multi-GPU workloads, gangs of 2×2 and model-pinned ones — 50 in all.
const MIX: &[(f64, u32, Option<&str>, usize)] = &[
    (0.25, 1, None, 8),
    (0.5, 1, None, 8),
    (1.0, 1, None, 12),
    (2.0, 1, None, 5),
    (4.0, 1, None, 5),
    (2.0, 2, None, 8),
    (1.0, 1, Some("H100"), 2),
    (0.5, 1, Some("A100"), 2),
];

const TEAMS: &[&str] = &["alpha", "beta", "gamma"];

#[tokio::test(flavor = "multi_thread")]
async fn fifty_mixed_workloads_succeed_without_overcommitting_any_gpu() {
    let env = Env::start(
        &["common", "two-clusters"],
        &[
            ("eu-1", "eu-west", &["4xH100:80GB", "4xH100:80GB"]),
            ("us-1", "us-east", &["4xA100:80GB"]),
        ],
    )
    .await;
    let api = env.api();
    let trace = env.path("trace.log");

    let mut reqs: Vec<SubmitRequest> = Vec::new();
    for &(gpus, gang, model, n) in MIX {
        for _ in 0..n {
            let i = reqs.len();
            // 0.3–0.6 s of "work": long enough to overlap, short enough to queue through.
            let sleep = format!("0.{}", 3 + i % 4);
            let mut r = request(
                TEAMS[i % TEAMS.len()],
                gpus,
                sh(&traced_script(&trace, &sleep)),
            );
            r.name = Some(format!("mix-{i}"));
            r.gang = (gang > 1).then_some(gang);
            r.gpu_model = model.map(str::to_string);
            reqs.push(r);
        }
    }
    assert_eq!(reqs.len(), 50);
    let mut ids = Vec::new();
    for r in &reqs {
        let w = api.submit_ok(r).await;
        ids.push(w.id);
    }

    // While they run, the hub's own view never over-commits a GPU either.
    let mut polls = 0;
    let all = wait_until(Duration::from_secs(120), "all 50 to finish", || {
        let api = api.clone();
        let ids = ids.clone();
        polls += 1;
        async move {
            for c in api.clusters().await {
                for n in &c.nodes {
                    for g in &n.gpus {
                        assert!(
                            g.allocated <= 1.0 + 1e-9,
                            "hub view: {} {} GPU {} allocated {}",
                            c.name,
                            n.name,
                            g.index,
                            g.allocated
                        );
                    }
                }
            }
            let all = api.try_workloads().await?;
            let going = all
                .iter()
                .filter(|w| ids.contains(&w.id) && !is_terminal(&w.state))
                .count();
            if going == 0 {
                Ok(all)
            } else {
                Err(format!("{going} still going"))
            }
        }
    })
    .await;
    assert!(polls > 1, "the run was too short to observe");
    let views: BTreeMap<u64, _> = all.into_iter().map(|w| (w.id, w)).collect();
    for id in &ids {
        let w = &views[id];
        assert_eq!(
            (w.state.as_str(), w.exit_code),
            ("Succeeded", Some(0)),
            "workload {id} did not succeed: {w:#?}"
        );
    }

    // The spokes' side: every replica run has a start and an end.
    let marks = read_trace(&trace);
    let runs = intervals(&marks);
    let open: Vec<_> = runs.values().filter(|i| i.end_ns.is_none()).collect();
    assert!(open.is_empty(), "replica runs without an end: {open:#?}");
    let complete: Vec<Interval> = runs.values().cloned().collect();
    for i in &complete {
        assert!(
            i.start.devices.iter().all(|d| *d < GPUS_PER_NODE),
            "device index out of range: {:?}",
            i.start
        );
    }

    // Invariant 1: summed shares per (cluster, node, GPU) never exceed 1.
    let bad = overcommits(&complete);
    assert!(bad.is_empty(), "over-committed GPUs:\n{}", bad.join("\n"));

    // A workload never runs two copies at once (earlier epochs ended first).
    for id in &ids {
        let mut spans: Vec<(u128, u128, u64)> = complete
            .iter()
            .filter(|i| i.start.id == *id)
            .map(|i| (i.start.ts_ns, i.end_ns.expect("complete"), i.start.epoch))
            .collect();
        spans.sort();
        for pair in spans.windows(2) {
            if pair[0].2 != pair[1].2 {
                assert!(
                    pair[0].1 <= pair[1].0,
                    "workload {id}: epochs {} and {} overlap: {pair:?}",
                    pair[0].2,
                    pair[1].2
                );
            }
        }
    }

    // Cross-check with the hub's final placements.
    for (idx, id) in ids.iter().enumerate() {
        let w = &views[id];
        let req = &reqs[idx];
        let cluster = w
            .cluster
            .as_deref()
            .expect("a finished workload keeps its placement");
        assert_eq!(
            w.replicas.len() as u32,
            w.gang,
            "workload {id}: replicas {w:#?}"
        );
        match req.gpu_model.as_deref() {
            Some("H100") => assert_eq!(cluster, "eu-1", "H100 workload {id} ran elsewhere"),
            Some("A100") => assert_eq!(cluster, "us-1", "A100 workload {id} ran elsewhere"),
            _ => {}
        }
        for (r, rv) in w.replicas.iter().enumerate() {
            let run = runs.get(&(*id, w.epoch, r as u32)).unwrap_or_else(|| {
                panic!(
                    "workload {id} epoch {} replica {r} never started on a spoke",
                    w.epoch
                )
            });
            let s = &run.start;
            assert_eq!(s.cluster, cluster, "workload {id} replica {r}: cluster");
            assert_eq!(s.node, rv.node, "workload {id} replica {r}: node");
            let mut hub_gpus: Vec<u32> = rv.gpus.iter().map(|g| g.index).collect();
            hub_gpus.sort_unstable();
            let mut seen = s.devices.clone();
            seen.sort_unstable();
            assert_eq!(
                seen, hub_gpus,
                "workload {id} replica {r}: CUDA_VISIBLE_DEVICES"
            );
            let per_replica = req.gpus;
            let expected_milli = if per_replica < 1.0 {
                (per_replica * 1000.0).round() as u32
            } else {
                1000
            };
            assert_eq!(
                s.milli, expected_milli,
                "workload {id} replica {r}: fraction"
            );
            assert_eq!(
                seen.len() as f64,
                per_replica.ceil(),
                "workload {id}: GPU count"
            );
            for g in &rv.gpus {
                let f = if per_replica < 1.0 { per_replica } else { 1.0 };
                assert!(
                    (g.fraction - f).abs() < 1e-9,
                    "workload {id}: hub share {g:?}"
                );
            }
        }
        // No replica ran under an epoch the hub does not know.
        let max_epoch = runs.keys().filter(|k| k.0 == *id).map(|k| k.1).max();
        assert_eq!(
            max_epoch,
            Some(w.epoch),
            "workload {id}: epochs seen on spokes"
        );
    }

    // Everything released its GPUs.
    let clusters = api.clusters().await;
    for c in &clusters {
        assert_eq!(
            c.gpus_allocated, 0.0,
            "cluster {} still allocated: {c:#?}",
            c.name
        );
        assert_eq!(c.running_workloads, 0);
    }
    let used_clusters: std::collections::BTreeSet<&str> =
        complete.iter().map(|i| i.start.cluster.as_str()).collect();
    assert_eq!(
        used_clusters.into_iter().collect::<Vec<_>>(),
        ["eu-1", "us-1"],
        "both spokes should have run work"
    );
}
