//! Kubernetes spokes end to end: a real hub, a real `axle-spoke --driver
//! kubernetes`, and the in-memory Kubernetes API server on loopback whose
//! Nodes, Jobs and pods the tests shape and drive (a pod runs, writes its
//! log, succeeds or fails when the test says so).
//!
//! Covered: the inventory from labelled Nodes (whole GPUs, MIG, time-sliced;
//! cordoned and NotReady nodes left out); a CLI submit becoming a Job pinned
//! to the hub's node with its GPUs, labels, image and namespace; gangs as
//! Indexed Jobs; fractions on MIG and time-sliced nodes; pod logs; OOMKilled,
//! ImagePullBackOff and quota refusals reported with their reason;
//! preemption deleting a Job and a later epoch re-running it; team
//! namespaces, quotas, member RBAC and PriorityClasses; an agent restart
//! adopting its running Jobs; a watch history compaction (410) and a 10 s
//! API server outage losing nothing; every request the driver made is one
//! its ClusterRole grants.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use axle_e2e::kube::{DEFAULT_IMAGE, KubeEnv, env_of, gpu_node, label, limits, name, ns, rbac_of};
use axle_e2e::{axle_cli, request, wait_until};
use axle_proto::api::WorkloadView;
use axle_spoke_agent::driver::kubernetes::access::allows;
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The scenarios share two cores; one at a time keeps heartbeats on time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const CLUSTER: &str = "k8s";
const WAIT: Duration = Duration::from_secs(30);

/// Two 8×H100 nodes, an A100 split into MIG slices, an L40S shared by
/// time-slicing, and two nodes that must not be used.
fn nodes() -> Vec<Node> {
    let mut cordoned = gpu_node(
        "gpu-c",
        "NVIDIA-H100-80GB-HBM3",
        8,
        &[("nvidia.com/gpu", "8")],
    );
    cordoned.spec.as_mut().unwrap().unschedulable = Some(true);
    let mut not_ready = gpu_node(
        "gpu-d",
        "NVIDIA-H100-80GB-HBM3",
        8,
        &[("nvidia.com/gpu", "8")],
    );
    not_ready
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()[0]
        .status = "False".into();
    vec![
        gpu_node(
            "gpu-a",
            "NVIDIA-H100-80GB-HBM3",
            8,
            &[("nvidia.com/gpu", "8")],
        ),
        gpu_node(
            "gpu-b",
            "NVIDIA-H100-80GB-HBM3",
            8,
            &[("nvidia.com/gpu", "8")],
        ),
        gpu_node(
            "mig-a",
            "NVIDIA-A100-SXM4-80GB",
            1,
            &[
                ("nvidia.com/mig-1g.10gb", "1"),
                ("nvidia.com/mig-3g.40gb", "2"),
            ],
        ),
        gpu_node(
            "shared-a",
            "NVIDIA-L40S",
            1,
            &[("nvidia.com/gpu.shared", "4")],
        ),
        cordoned,
        not_ready,
    ]
}

async fn start(extra: &[&str]) -> KubeEnv {
    KubeEnv::start(&["kube"], CLUSTER, nodes(), extra).await
}

async fn wait_state(env: &KubeEnv, id: u64, state: &str) -> WorkloadView {
    env.api().wait_state(id, state, WAIT).await
}

fn last_reason(w: &WorkloadView) -> String {
    w.history
        .last()
        .map(|h| h.reason.clone())
        .unwrap_or_default()
}

/// Every request the driver sent is one its ClusterRole grants.
fn assert_requests_within_access(env: &KubeEnv) {
    let mut seen = BTreeSet::new();
    for (method, path) in env.cluster.requests() {
        if let Some((g, r, v)) = rbac_of(method.as_str(), &path) {
            assert!(
                allows(&g, &r, &v),
                "the driver called {v} {g}/{r} ({method} {path}), which API_ACCESS does not grant"
            );
            seen.insert((g, r, v));
        }
    }
    assert!(seen.len() >= 8, "too few distinct calls recorded: {seen:?}");
}

/// Submits through the CLI and returns the workload.
async fn cli_submit(env: &KubeEnv, args: &[&str]) -> WorkloadView {
    let mut all = vec!["submit"];
    all.extend_from_slice(args);
    let out = axle_cli(&env.hub.http_url(), &all).await;
    assert_eq!(out.code, 0, "axle submit: {out:?}");
    let name = args
        .windows(2)
        .find(|w| w[0] == "--name")
        .map(|w| w[1].to_string())
        .expect("--name");
    env.api()
        .workloads()
        .await
        .into_iter()
        .find(|w| w.name == name)
        .unwrap_or_else(|| panic!("no workload {name}: {out:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn jobs_gangs_fractions_logs_and_team_isolation() {
    let _one = SERIAL.lock().await;
    let started = Instant::now();
    let env = start(&[]).await;
    let api = env.api();

    // Inventory: the usable nodes only, with their GPUs.
    let c = api
        .clusters()
        .await
        .into_iter()
        .find(|c| c.name == CLUSTER)
        .expect("the cluster");
    assert_eq!(c.driver, "kubernetes");
    let names: BTreeSet<String> = c.nodes.iter().map(|n| n.name.clone()).collect();
    assert_eq!(
        names,
        ["gpu-a", "gpu-b", "mig-a", "shared-a"]
            .map(String::from)
            .into(),
        "cordoned and NotReady nodes take no work"
    );
    // 16 H100, the A100's MIG devices by compute share (1g: 1/7, 3g: 3/7
    // each, rounded down to thousandths) and the L40S's four quarter
    // replicas: each unit counts its share, not a GPU per device.
    assert!(
        (c.gpus_total - (16.0 + 0.142 + 2.0 * 0.428 + 1.0)).abs() < 1e-9,
        "{}",
        c.gpus_total
    );
    let models: BTreeSet<String> = c
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter().map(|g| g.model.clone()))
        .collect();
    assert_eq!(models, ["A100", "H100", "L40S"].map(String::from).into());

    // A CLI submit becomes a Job in the team's namespace, pinned and sized.
    let w = cli_submit(
        &env,
        &[
            "--team",
            "vision",
            "--gpus",
            "2",
            "--gpu-model",
            "H100",
            "--name",
            "train",
            "--env",
            "LR=0.1",
            "--",
            "python",
            "train.py",
        ],
    )
    .await;
    let w = wait_state(&env, w.id, "Placed").await;
    let pods = env.wait_pods(w.id, w.epoch, 1).await;
    let jobs = env.jobs_of(w.id);
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(
        job.metadata.name.as_deref(),
        Some(format!("axle-{}-e{}", w.id, w.epoch).as_str())
    );
    assert_eq!(job.metadata.namespace.as_deref(), Some("axle-vision"));
    for (k, v) in [
        ("axle.dev/workload", w.id.to_string()),
        ("axle.dev/epoch", w.epoch.to_string()),
        ("axle.dev/team", "vision".to_string()),
        ("app.kubernetes.io/managed-by", "axle".to_string()),
    ] {
        assert_eq!(label(&job.metadata, k), Some(v), "job label {k}");
    }
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
    assert_eq!((spec.completions, spec.backoff_limit), (Some(1), Some(0)));
    let pod = &pods[0];
    let ps = pod.spec.as_ref().unwrap();
    let hub_node = w.replicas[0].node.clone();
    assert_eq!(
        ps.node_selector
            .as_ref()
            .and_then(|s| s.get("kubernetes.io/hostname")),
        Some(&hub_node),
        "pinned to the node the hub chose"
    );
    assert_eq!(ps.node_name.as_deref(), Some(hub_node.as_str()));
    assert_eq!(
        limits(pod),
        [("nvidia.com/gpu".to_string(), "2".to_string())].into()
    );
    assert_eq!(ps.containers[0].image.as_deref(), Some(DEFAULT_IMAGE));
    assert_eq!(
        ps.containers[0].command.clone().unwrap_or_default(),
        ["python", "train.py"]
    );
    let env_vars = env_of(pod);
    assert_eq!(env_vars.get("LR").map(String::as_str), Some("0.1"));
    assert_eq!(env_vars.get("AXLE_WORKLOAD_ID"), Some(&w.id.to_string()));
    assert_eq!(ps.priority_class_name.as_deref(), Some("axle-development"));
    assert!(
        ps.tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some("nvidia.com/gpu")),
        "tolerates the GPU taint"
    );
    env.run_pods(&pods);
    wait_state(&env, w.id, "Running").await;
    env.cluster
        .append_pod_log(&ns(pod), &name(pod), "step 1 loss 0.52\n");
    wait_until(WAIT, "the pod's log at the hub", || async {
        let out = axle_cli(&env.hub.http_url(), &["logs", &w.id.to_string()]).await;
        if out.stdout.contains("step 1 loss 0.52") {
            Ok(())
        } else {
            Err(format!("{out:?}"))
        }
    })
    .await;
    env.succeed_pods(&pods);
    let done = wait_state(&env, w.id, "Succeeded").await;
    assert_eq!(done.exit_code, Some(0));
    wait_until(WAIT, "the finished Job to be deleted", || async {
        if env.jobs_of(w.id).is_empty() {
            Ok(())
        } else {
            Err("still there".to_string())
        }
    })
    .await;
    let del = env
        .cluster
        .deletions()
        .into_iter()
        .find(|d| d.name == format!("axle-{}-e{}", w.id, w.epoch))
        .expect("the Job's deletion");
    assert_eq!(del.propagation_policy.as_deref(), Some("Background"));

    // A gang of two 8-GPU replicas: one Indexed Job over both H100 nodes.
    let mut g = request("vision", 8.0, vec!["torchrun".into(), "train.py".into()]);
    g.name = Some("gang".into());
    g.gang = Some(2);
    g.gpu_model = Some("H100".into());
    g.image = Some("registry.example/team/trainer:2".into());
    let g = api.submit_ok(&g).await;
    let g = wait_state(&env, g.id, "Placed").await;
    let gpods = env.wait_pods(g.id, g.epoch, 2).await;
    let gjob = &env.jobs_of(g.id)[0];
    let gspec = gjob.spec.as_ref().unwrap();
    assert_eq!((gspec.completions, gspec.parallelism), (Some(2), Some(2)));
    let hosts: BTreeSet<String> = gpods
        .iter()
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    assert_eq!(hosts, ["gpu-a", "gpu-b"].map(String::from).into());
    for p in &gpods {
        assert_eq!(limits(p), [("nvidia.com/gpu".into(), "8".into())].into());
        assert_eq!(
            env_of(p).get("AXLE_REPLICAS").map(String::as_str),
            Some("2")
        );
        assert_eq!(
            p.spec.as_ref().unwrap().containers[0].image.as_deref(),
            Some("registry.example/team/trainer:2")
        );
    }
    env.run_pods(&gpods);
    wait_state(&env, g.id, "Running").await;
    for p in &gpods {
        let idx = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("batch.kubernetes.io/job-completion-index"))
            .cloned()
            .expect("completion index");
        env.cluster
            .append_pod_log(&ns(p), &name(p), format!("hello from rank {idx}\n"));
    }
    wait_until(WAIT, "both ranks' lines, prefixed", || async {
        let out = axle_cli(&env.hub.http_url(), &["logs", &g.id.to_string()]).await;
        if out.stdout.contains("[r0] hello from rank 0")
            && out.stdout.contains("[r1] hello from rank 1")
        {
            Ok(())
        } else {
            Err(format!("{out:?}"))
        }
    })
    .await;
    env.succeed_pods(&gpods);
    wait_state(&env, g.id, "Succeeded").await;

    // Fractions: a MIG slice on the A100, a time-sliced share of the L40S.
    let mut m = request("nlp", 0.25, vec!["jupyter".into(), "lab".into()]);
    m.name = Some("notebook-mig".into());
    m.gpu_model = Some("A100".into());
    let m = api.submit_ok(&m).await;
    // A quarter: one of the L40S's four time-sliced replicas serves it.
    let mut s = request("nlp", 0.25, vec!["jupyter".into(), "lab".into()]);
    s.name = Some("notebook-shared".into());
    s.gpu_model = Some("L40S".into());
    let s = api.submit_ok(&s).await;
    let m = wait_state(&env, m.id, "Placed").await;
    let s = wait_state(&env, s.id, "Placed").await;
    let mpods = env.wait_pods(m.id, m.epoch, 1).await;
    let spods = env.wait_pods(s.id, s.epoch, 1).await;
    assert_eq!(
        limits(&mpods[0]),
        [("nvidia.com/mig-3g.40gb".into(), "1".into())].into(),
        "the smallest MIG profile that holds a quarter GPU"
    );
    assert_eq!(
        mpods[0].spec.as_ref().unwrap().node_name.as_deref(),
        Some("mig-a")
    );
    assert_eq!(
        env_of(&mpods[0])
            .get("AXLE_GPU_FRACTION")
            .map(String::as_str),
        Some("0.25")
    );
    assert_eq!(
        limits(&spods[0]),
        [("nvidia.com/gpu.shared".into(), "1".into())].into()
    );
    assert_eq!(
        spods[0].spec.as_ref().unwrap().node_name.as_deref(),
        Some("shared-a")
    );
    assert_eq!(mpods[0].metadata.namespace.as_deref(), Some("axle-nlp"));
    env.run_pods(&mpods);
    env.run_pods(&spods);
    wait_state(&env, m.id, "Running").await;
    wait_state(&env, s.id, "Running").await;
    env.succeed_pods(&mpods);
    env.succeed_pods(&spods);
    wait_state(&env, m.id, "Succeeded").await;
    wait_state(&env, s.id, "Succeeded").await;

    // Team isolation: namespaces, quotas at the limit, readers, classes.
    let namespaces: BTreeSet<String> = env
        .cluster
        .namespaces()
        .into_iter()
        .filter(|n| label(&n.metadata, "app.kubernetes.io/managed-by").as_deref() == Some("axle"))
        .filter_map(|n| n.metadata.name)
        .collect();
    assert_eq!(
        namespaces,
        ["axle-nlp", "axle-vision"].map(String::from).into()
    );
    let quota = env
        .cluster
        .get_resource_quota("axle-vision", "axle-gpus")
        .expect("the team's GPU quota");
    let hard = quota.spec.unwrap().hard.unwrap_or_default();
    assert_eq!(
        hard.get("requests.nvidia.com/gpu").map(|q| q.0.as_str()),
        Some("18"),
        "vision's limit: 16 H100 + 2 of any model; {hard:?}"
    );
    let binding = env
        .cluster
        .role_bindings(Some("axle-vision"))
        .into_iter()
        .find(|b| b.metadata.name.as_deref() == Some("axle-team-members"))
        .expect("the members' binding");
    let users: BTreeSet<String> = binding
        .subjects
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(users, ["alice", "bob"].map(String::from).into());
    let classes: BTreeSet<String> = env
        .cluster
        .priority_classes()
        .into_iter()
        .filter(|p| p.preemption_policy.as_deref() == Some("Never"))
        .filter_map(|p| p.metadata.name)
        .collect();
    for c in [
        "axle-production",
        "axle-training",
        "axle-development",
        "axle-batch",
    ] {
        assert!(classes.contains(c), "PriorityClass {c}: {classes:?}");
    }
    assert_requests_within_access(&env);
    eprintln!(
        "jobs, gangs, fractions and isolation: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_carry_their_kubernetes_reason() {
    let _one = SERIAL.lock().await;
    let started = Instant::now();
    let env = start(&[]).await;
    let api = env.api();

    // OOMKilled.
    let mut o = request("vision", 1.0, vec!["python".into(), "big.py".into()]);
    o.name = Some("oom".into());
    let o = api.submit_ok(&o).await;
    let o = wait_state(&env, o.id, "Placed").await;
    let pods = env.wait_pods(o.id, o.epoch, 1).await;
    env.run_pods(&pods);
    wait_state(&env, o.id, "Running").await;
    env.cluster
        .set_pod_failed(&ns(&pods[0]), &name(&pods[0]), 137, "OOMKilled")
        .unwrap();
    let o = wait_state(&env, o.id, "Failed").await;
    assert_eq!(o.exit_code, Some(137));
    assert!(last_reason(&o).contains("OOMKilled"), "{:?}", o.history);

    // An image that cannot be pulled fails at once, naming the image.
    let mut i = request("vision", 1.0, vec!["python".into(), "x.py".into()]);
    i.name = Some("bad-image".into());
    i.image = Some("registry.example/nope:404".into());
    let i = api.submit_ok(&i).await;
    let i = wait_state(&env, i.id, "Placed").await;
    let pods = env.wait_pods(i.id, i.epoch, 1).await;
    env.cluster
        .set_pod_waiting(
            &ns(&pods[0]),
            &name(&pods[0]),
            "ImagePullBackOff",
            "Back-off pulling image \"registry.example/nope:404\"",
        )
        .unwrap();
    let i = wait_state(&env, i.id, "Failed").await;
    let why = last_reason(&i);
    assert!(
        why.contains("ImagePullBackOff") && why.contains("registry.example/nope:404"),
        "{why}"
    );

    // A quota the cluster's admins set below Axle's: the refusal is the reason.
    wait_until(WAIT, "the nlp namespace", || async {
        env.cluster
            .namespaces()
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some("axle-nlp"))
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    env.cluster
        .add_resource_quota(ResourceQuota {
            metadata: ObjectMeta {
                name: Some("admin-cap".into()),
                namespace: Some("axle-nlp".into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::ResourceQuotaSpec {
                hard: Some([("requests.nvidia.com/gpu".to_string(), Quantity("1".into()))].into()),
                ..Default::default()
            }),
            status: None,
        })
        .unwrap();
    let mut q = request("nlp", 2.0, vec!["python".into(), "q.py".into()]);
    q.name = Some("over-quota".into());
    q.gpu_model = Some("H100".into());
    let q = api.submit_ok(&q).await;
    let q = wait_state(&env, q.id, "Failed").await;
    let why = last_reason(&q);
    assert!(
        why.contains("exceeded quota: admin-cap") && why.contains("nvidia.com/gpu"),
        "{why}"
    );
    let c = &api.clusters().await[0];
    assert_eq!(c.gpus_allocated, 0.0, "failed work holds no GPUs");
    assert_requests_within_access(&env);
    eprintln!("failures: {:?}", started.elapsed());
}

fn pods_of_epoch(env: &KubeEnv, id: u64, epoch: u64) -> Vec<Pod> {
    env.pods_of(id)
        .into_iter()
        .filter(|p| label(&p.metadata, "axle.dev/epoch") == Some(epoch.to_string()))
        .collect()
}

fn job_creations(env: &KubeEnv) -> usize {
    env.cluster
        .requests()
        .iter()
        .filter(|(m, p)| m.as_str() == "POST" && p.contains("/jobs"))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn preemption_restart_relist_and_outage_lose_nothing() {
    let _one = SERIAL.lock().await;
    let started = Instant::now();
    let mut env = start(&[]).await;
    let api = env.api();

    // Preemption: nlp's batch gang borrows both H100 nodes; vision's
    // training within its guarantee deletes that Job; the batch runs again
    // under a later epoch once training is done.
    let mut b = request("nlp", 8.0, vec!["python".into(), "batch.py".into()]);
    b.name = Some("batch".into());
    b.gang = Some(2);
    b.gpu_model = Some("H100".into());
    b.priority = Some("batch".into());
    let b = api.submit_ok(&b).await;
    let b = wait_state(&env, b.id, "Placed").await;
    let bpods = env.wait_pods(b.id, b.epoch, 2).await;
    env.run_pods(&bpods);
    wait_state(&env, b.id, "Running").await;
    let mut t = request("vision", 8.0, vec!["python".into(), "train.py".into()]);
    t.name = Some("training".into());
    t.gpu_model = Some("H100".into());
    t.priority = Some("training".into());
    let t = api.submit_ok(&t).await;
    let t = wait_state(&env, t.id, "Placed").await;
    let tpods = env.wait_pods(t.id, t.epoch, 1).await;
    let first = format!("axle-{}-e{}", b.id, b.epoch);
    let del = env
        .cluster
        .deletions()
        .into_iter()
        .find(|d| d.name == first)
        .expect("the preempted Job was deleted");
    assert_eq!(del.propagation_policy.as_deref(), Some("Background"));
    assert!(
        pods_of_epoch(&env, b.id, b.epoch).is_empty(),
        "its pods are gone first"
    );
    env.run_pods(&tpods);
    wait_state(&env, t.id, "Running").await;
    env.succeed_pods(&tpods);
    wait_state(&env, t.id, "Succeeded").await;
    let again = wait_until(WAIT, "the batch to be placed again", || async {
        let w = api.workload(b.id).await;
        if w.epoch > b.epoch && w.state == "Placed" {
            Ok(w)
        } else {
            Err(format!("{} epoch {}", w.state, w.epoch))
        }
    })
    .await;
    let apods = env.wait_pods(b.id, again.epoch, 2).await;
    env.run_pods(&apods);
    wait_state(&env, b.id, "Running").await;
    env.succeed_pods(&apods);
    let bw = wait_state(&env, b.id, "Succeeded").await;
    assert_eq!(bw.preemptions, 1);

    // An agent restart adopts the running Job: no second Job, no re-queue.
    let mut r = request("vision", 1.0, vec!["python".into(), "long.py".into()]);
    r.name = Some("long".into());
    let r = api.submit_ok(&r).await;
    let r = wait_state(&env, r.id, "Placed").await;
    let rpods = env.wait_pods(r.id, r.epoch, 1).await;
    env.run_pods(&rpods);
    wait_state(&env, r.id, "Running").await;
    env.cluster
        .append_pod_log(&ns(&rpods[0]), &name(&rpods[0]), "before the restart\n");
    let creations = job_creations(&env);
    env.spoke.restart();
    env.hub.wait_ready(&[CLUSTER]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rw = api.workload(r.id).await;
    assert_eq!(
        (rw.state.as_str(), rw.epoch),
        ("Running", r.epoch),
        "{rw:#?}"
    );
    assert_eq!(
        job_creations(&env),
        creations,
        "the restarted agent made no new Job"
    );
    assert_eq!(env.jobs_of(r.id).len(), 1);

    // The watch history is compacted (410 Gone): the watchers relist.
    env.cluster.compact();
    env.cluster
        .append_pod_log(&ns(&rpods[0]), &name(&rpods[0]), "after the relist\n");
    env.succeed_pods(&rpods);
    wait_state(&env, r.id, "Succeeded").await;
    let out = axle_cli(&env.hub.http_url(), &["logs", &r.id.to_string()]).await;
    assert!(
        out.stdout.contains("after the relist"),
        "the adopted pod's log: {out:?}"
    );

    // The API server goes away for 10 s: a running workload finishes
    // meanwhile and a new one is submitted; nothing is lost or doubled.
    let mut a = request("vision", 1.0, vec!["python".into(), "a.py".into()]);
    a.name = Some("during-a".into());
    let a = api.submit_ok(&a).await;
    let a = wait_state(&env, a.id, "Placed").await;
    let apods = env.wait_pods(a.id, a.epoch, 1).await;
    env.run_pods(&apods);
    wait_state(&env, a.id, "Running").await;
    env.cluster
        .append_pod_log(&ns(&apods[0]), &name(&apods[0]), "line one\n");
    wait_until(WAIT, "the first line at the hub", || async {
        let out = axle_cli(&env.hub.http_url(), &["logs", &a.id.to_string()]).await;
        out.stdout
            .contains("line one")
            .then_some(())
            .ok_or(format!("{out:?}"))
    })
    .await;
    let before = job_creations(&env);
    env.stop_kube().await;
    let outage = Instant::now();
    let mut n = request("vision", 1.0, vec!["python".into(), "n.py".into()]);
    n.name = Some("during-n".into());
    let n = api.submit_ok(&n).await;
    env.cluster
        .append_pod_log(&ns(&apods[0]), &name(&apods[0]), "line two\n");
    env.cluster
        .set_pod_succeeded(&ns(&apods[0]), &name(&apods[0]))
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(outage.elapsed())).await;
    let c = &api.clusters().await[0];
    assert_eq!(c.state, "Ready", "the spoke stays connected to the hub");
    env.start_kube().await;
    let aw = wait_state(&env, a.id, "Succeeded").await;
    let n = wait_state(&env, n.id, "Placed").await;
    let npods = env.wait_pods(n.id, n.epoch, 1).await;
    env.run_pods(&npods);
    env.succeed_pods(&npods);
    wait_state(&env, n.id, "Succeeded").await;
    assert_eq!(aw.preemptions, 0);
    assert_eq!(
        job_creations(&env) - before,
        1,
        "exactly one new Job (the one submitted during the outage)"
    );
    let out = axle_cli(&env.hub.http_url(), &["logs", &a.id.to_string()]).await;
    assert_eq!(
        out.stdout.matches("line one").count(),
        1,
        "no line twice: {out:?}"
    );
    assert!(out.stdout.contains("line two"), "no line lost: {out:?}");
    assert_requests_within_access(&env);
    eprintln!(
        "preemption, restart, relist, outage: {:?}",
        started.elapsed()
    );
}
