//! The Job controller: pods from templates (indexed, pinned), status counts,
//! Complete and Failed, and deletion propagation to pods.

use std::collections::BTreeMap;

use axle_kube_testserver::KubeTestServer;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams, PropagationPolicy};

use crate::support::{client, job};

fn condition(job: &Job, type_: &str) -> Option<(String, Option<String>)> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test]
async fn indexed_job_runs_to_complete_and_a_failed_pod_fails_its_job() {
    let server = KubeTestServer::start().await;
    let cluster = server.state();
    let client = client(&server);
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    let mut indexed = job("train", 3, Some(3), None);
    let template = indexed
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap();
    template.node_selector = Some(BTreeMap::from([(
        "kubernetes.io/hostname".to_string(),
        "gpu-node-1".to_string(),
    )]));
    jobs.create(&PostParams::default(), &indexed).await.unwrap();

    let list = pods
        .list(&ListParams::default().labels("batch.kubernetes.io/job-name=train"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 3);
    let mut indexes = Vec::new();
    for p in &list.items {
        let labels = p.metadata.labels.as_ref().unwrap();
        let index = labels
            .get("batch.kubernetes.io/job-completion-index")
            .unwrap()
            .clone();
        assert_eq!(
            p.metadata
                .annotations
                .as_ref()
                .unwrap()
                .get("batch.kubernetes.io/job-completion-index"),
            Some(&index)
        );
        assert_eq!(labels.get("job-name").map(String::as_str), Some("train"));
        assert_eq!(labels.get("app").map(String::as_str), Some("train"));
        let name = p.metadata.name.clone().unwrap();
        assert!(
            name.starts_with(&format!("train-{index}-"))
                && name.len() == format!("train-{index}-").len() + 5,
            "{name}"
        );
        assert_eq!(
            p.spec.as_ref().unwrap().node_name.as_deref(),
            Some("gpu-node-1")
        );
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("Job", "train", Some(true))
        );
        assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
        assert!(p.spec.as_ref().unwrap().containers[0].env.is_none());
        indexes.push(index);
    }
    indexes.sort();
    assert_eq!(indexes, ["0", "1", "2"]);

    let names: Vec<String> = list
        .items
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    for n in &names {
        cluster.set_pod_running("default", n).unwrap();
    }
    let running = jobs.get("train").await.unwrap();
    assert_eq!(running.status.as_ref().unwrap().active, Some(3));
    assert_eq!(running.status.as_ref().unwrap().ready, Some(3));
    for n in &names {
        cluster.set_pod_succeeded("default", n).unwrap();
    }
    let done = jobs.get("train").await.unwrap();
    assert_eq!(
        condition(&done, "Complete").map(|c| c.0).as_deref(),
        Some("True")
    );
    let status = done.status.unwrap();
    assert_eq!(
        (
            status.succeeded,
            status.active,
            status.completed_indexes.as_deref()
        ),
        (Some(3), None, Some("0-2"))
    );
    assert!(status.completion_time.is_some());
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let created = events
        .list(&ListParams::default().fields("involvedObject.name=train,reason=SuccessfulCreate"))
        .await
        .unwrap();
    assert_eq!(created.items.len(), 3);

    // backoffLimit 0: the first failed pod fails the Job; the container's
    // terminated state keeps the exit code and reason.
    let mut pinned = job("oom", 1, None, None);
    pinned
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .node_name = Some("gpu-node-2".into());
    jobs.create(&PostParams::default(), &pinned).await.unwrap();
    let pod = cluster
        .pods(Some("default"))
        .into_iter()
        .find(|p| p.metadata.name.as_ref().unwrap().starts_with("oom-"))
        .unwrap();
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("gpu-node-2")
    );
    let pod_name = pod.metadata.name.unwrap();
    cluster.set_pod_running("default", &pod_name).unwrap();
    cluster
        .set_pod_failed("default", &pod_name, 137, "OOMKilled")
        .unwrap();
    let failed = jobs.get("oom").await.unwrap();
    assert_eq!(
        condition(&failed, "Failed"),
        Some(("True".into(), Some("BackoffLimitExceeded".into())))
    );
    assert_eq!(failed.status.unwrap().failed, Some(1));
    let pod = pods.get(&pod_name).await.unwrap();
    let status = pod.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    let terminated = status.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        (terminated.exit_code, terminated.reason.as_deref()),
        (137, Some("OOMKilled"))
    );

    // With retries left, a failed pod is replaced.
    let mut retried = job("retry", 1, None, None);
    retried.spec.as_mut().unwrap().backoff_limit = Some(2);
    jobs.create(&PostParams::default(), &retried).await.unwrap();
    let first = cluster
        .pods(Some("default"))
        .into_iter()
        .find(|p| p.metadata.name.as_ref().unwrap().starts_with("retry-"))
        .unwrap();
    cluster
        .set_pod_failed("default", first.metadata.name.as_ref().unwrap(), 1, "Error")
        .unwrap();
    let retry_pods: Vec<Pod> = cluster
        .pods(Some("default"))
        .into_iter()
        .filter(|p| p.metadata.name.as_ref().unwrap().starts_with("retry-"))
        .collect();
    assert_eq!(retry_pods.len(), 2);
    let retry = cluster.get_job("default", "retry").unwrap();
    assert_eq!(
        (
            retry.status.as_ref().unwrap().failed,
            retry.status.as_ref().unwrap().active
        ),
        (Some(1), Some(1))
    );
    assert!(condition(&retry, "Failed").is_none());

    // Kubelet-side states: waiting and unschedulable.
    let waiting = retry_pods
        .iter()
        .find(|p| p.metadata.uid != first.metadata.uid)
        .unwrap()
        .metadata
        .name
        .clone()
        .unwrap();
    cluster
        .set_pod_waiting(
            "default",
            &waiting,
            "ImagePullBackOff",
            "Back-off pulling image",
        )
        .unwrap();
    let p = pods.get(&waiting).await.unwrap();
    let state = p
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .state
        .clone()
        .unwrap();
    assert_eq!(
        state.waiting.unwrap().reason.as_deref(),
        Some("ImagePullBackOff")
    );
    cluster
        .set_pod_unschedulable("default", &waiting, "0/3 nodes are available")
        .unwrap();
    let p = pods.get(&waiting).await.unwrap();
    let sched = p
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .unwrap();
    assert_eq!(
        (sched.status.as_str(), sched.reason.as_deref()),
        ("False", Some("Unschedulable"))
    );
    assert!(cluster.set_pod_running("default", "no-such-pod").is_err());
}

#[tokio::test]
async fn deleting_a_job_propagates_to_its_pods() {
    let server = KubeTestServer::start().await;
    let cluster = server.state();
    let jobs: Api<Job> = Api::namespaced(client(&server), "default");
    jobs.create(&PostParams::default(), &job("bg", 2, None, None))
        .await
        .unwrap();
    assert_eq!(cluster.pods(Some("default")).len(), 2);
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        grace_period_seconds: Some(7),
        ..Default::default()
    };
    jobs.delete("bg", &dp).await.unwrap();
    assert!(cluster.pods(Some("default")).is_empty());
    assert!(cluster.get_job("default", "bg").is_none());
    let record = cluster
        .deletions()
        .into_iter()
        .find(|d| d.name == "bg")
        .unwrap();
    assert_eq!(record.kind, "Job");
    assert_eq!(record.propagation_policy.as_deref(), Some("Background"));
    assert_eq!(record.grace_period_seconds, Some(7));

    // Foreground also takes the pods; no policy orphans them (the batch/v1 default).
    jobs.create(&PostParams::default(), &job("fg", 1, None, None))
        .await
        .unwrap();
    jobs.delete("fg", &DeleteParams::foreground())
        .await
        .unwrap();
    assert!(cluster.pods(Some("default")).is_empty());
    jobs.create(&PostParams::default(), &job("orphan", 1, None, None))
        .await
        .unwrap();
    jobs.delete("orphan", &DeleteParams::default())
        .await
        .unwrap();
    let left = cluster.pods(Some("default"));
    assert_eq!(left.len(), 1);
    assert!(left[0].metadata.owner_references.is_none());
}

#[tokio::test]
async fn auto_complete_finishes_jobs_at_once() {
    let server = KubeTestServer::start().await;
    let cluster = server.state();
    cluster.set_auto_complete(true);
    let jobs: Api<Job> = Api::namespaced(client(&server), "default");
    for i in 0..20 {
        jobs.create(
            &PostParams::default(),
            &job(&format!("bench-{i}"), 2, Some(4), None),
        )
        .await
        .unwrap();
    }
    for j in cluster.jobs(Some("default")) {
        let status = j.status.unwrap();
        assert_eq!(
            (status.succeeded, status.completed_indexes.as_deref()),
            (Some(4), Some("0-3"))
        );
        assert!(
            status
                .conditions
                .unwrap()
                .iter()
                .any(|c| c.type_ == "Complete")
        );
    }
    assert_eq!(cluster.pods(Some("default")).len(), 80);
}
