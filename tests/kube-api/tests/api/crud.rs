//! Create, get, list, update, patch and delete with `kube::Api`, and the
//! error statuses a client sees.

use axle_kube_testserver::KubeTestServer;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::{api_error, client, job, meta, raw, raw_declared};

#[tokio::test]
async fn namespace_and_job_crud() {
    let server = KubeTestServer::start().await;
    let client = client(&server);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let created = namespaces
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: meta("team-a"),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    let rv: u64 = created
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv > 0);
    assert_eq!(
        created.status.and_then(|s| s.phase).as_deref(),
        Some("Active")
    );
    assert_eq!(
        namespaces.get("team-a").await.unwrap().metadata.uid,
        created.metadata.uid
    );
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(
        names.contains(&"team-a".to_string()) && names.contains(&"default".to_string()),
        "{names:?}"
    );

    // A duplicate name is 409 AlreadyExists; a missing object 404 NotFound.
    let dup = api_error(
        namespaces
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: meta("team-a"),
                    ..Default::default()
                },
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(dup.message, "namespaces \"team-a\" already exists");
    let missing = api_error(namespaces.get("nope").await.unwrap_err());
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));
    assert!(namespaces.get_opt("nope").await.unwrap().is_none());

    let jobs: Api<Job> = Api::namespaced(client.clone(), "team-a");
    let j = jobs
        .create(&PostParams::default(), &job("train", 1, None, None))
        .await
        .unwrap();
    assert_eq!(
        jobs.get("train").await.unwrap().metadata.uid,
        j.metadata.uid
    );
    assert_eq!(
        jobs.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let dup = api_error(
        jobs.create(&PostParams::default(), &job("train", 1, None, None))
            .await
            .unwrap_err(),
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(dup.message, "jobs.batch \"train\" already exists");
    // A job in a namespace that does not exist: 404 on the namespace.
    let other: Api<Job> = Api::namespaced(client.clone(), "ghost");
    let e = api_error(
        other
            .create(&PostParams::default(), &job("x", 1, None, None))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, "namespaces \"ghost\" not found")
    );

    // Optimistic concurrency: a stale resourceVersion is 409 Conflict.
    let mut stale = j.clone();
    jobs.patch(
        "train",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"a": "1"}}})),
    )
    .await
    .unwrap();
    stale.metadata.labels = Some([("b".to_string(), "2".to_string())].into());
    let conflict = api_error(
        jobs.replace("train", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));
    let mut fresh = jobs.get("train").await.unwrap();
    fresh
        .metadata
        .labels
        .get_or_insert_default()
        .insert("b".into(), "2".into());
    let replaced = jobs
        .replace("train", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert_eq!(
        replaced
            .metadata
            .labels
            .unwrap()
            .get("a")
            .map(String::as_str),
        Some("1")
    );
    // Changing an immutable field is 422 Invalid.
    let mut changed = jobs.get("train").await.unwrap();
    changed
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers[0]
        .image = Some("other".into());
    let invalid = api_error(
        jobs.replace("train", &PostParams::default(), &changed)
            .await
            .unwrap_err(),
    );
    assert_eq!((invalid.code, invalid.reason.as_str()), (422, "Invalid"));

    // Server-side apply: patches an existing object and creates a missing one.
    let applied = jobs
        .patch("train", &PatchParams::apply("axle-test"), &Patch::Apply(json!({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "annotations": {"axle/x": "y"}}
        })))
        .await
        .unwrap();
    assert_eq!(
        applied
            .metadata
            .annotations
            .unwrap()
            .get("axle/x")
            .map(String::as_str),
        Some("y")
    );
    let mut fresh_job = job("applied", 1, None, None);
    fresh_job.metadata.namespace = Some("team-a".into());
    let created = jobs
        .patch(
            "applied",
            &PatchParams::apply("axle-test"),
            &Patch::Apply(&fresh_job),
        )
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());

    // generateName picks a free name.
    let mut generated = job("", 1, None, None);
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let g = jobs
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    let gname = g.metadata.name.unwrap();
    assert!(gname.starts_with("gen-") && gname.len() == 9, "{gname}");

    // A Job without restartPolicy Never/OnFailure is 422, like the real server.
    let mut bad = job("bad", 1, None, None);
    bad.spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .restart_policy = None;
    let e = api_error(jobs.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("spec.template.spec.restartPolicy"),
        "{}",
        e.message
    );

    jobs.delete("train", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_error(jobs.get("train").await.unwrap_err()).code, 404);
    namespaces
        .delete("team-a", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        api_error(namespaces.get("team-a").await.unwrap_err()).code,
        404
    );
    // Deleting the namespace deleted what was in it.
    assert!(server.state().jobs(Some("team-a")).is_empty());
}

#[tokio::test]
async fn malformed_requests_get_status_bodies() {
    let server = KubeTestServer::start().await;
    let (code, body) = raw(
        &server,
        "POST",
        "/api/v1/namespaces",
        "application/json",
        b"{not json",
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("\"kind\":\"Status\"") && body.contains("BadRequest"),
        "{body}"
    );
    let (code, body) = raw(
        &server,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        br#"{"spec": 5}"#,
    )
    .await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = raw(
        &server,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        br#"{"metadata":{"name":"p"},"spec":{"containers":[]}}"#,
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("spec.containers: Required value"), "{body}");
    let (code, body) = raw(
        &server,
        "PATCH",
        "/api/v1/namespaces/default",
        "application/json-patch+json",
        b"[]",
    )
    .await;
    assert_eq!(code, 415, "{body}");
    let (code, body) = raw(
        &server,
        "GET",
        "/apis/apps/v1/deployments",
        "application/json",
        b"",
    )
    .await;
    assert_eq!(code, 404, "{body}");
    let (code, _) = raw(
        &server,
        "GET",
        "/api/v1/pods?labelSelector=a%20in%20b",
        "application/json",
        b"",
    )
    .await;
    assert_eq!(code, 400);
    let (code, _) = raw(
        &server,
        "GET",
        "/api/v1/pods?limit=-1",
        "application/json",
        b"",
    )
    .await;
    assert_eq!(code, 400);
    let (code, _) = raw(
        &server,
        "GET",
        "/api/v1/pods?watch=true&resourceVersion=abc",
        "application/json",
        b"",
    )
    .await;
    assert_eq!(code, 400);
    let (code, body) = raw_declared(
        &server,
        "POST",
        "/api/v1/namespaces",
        "application/json",
        b"",
        4 * 1024 * 1024,
    )
    .await;
    assert_eq!(code, 413, "{body}");
    let (code, body) = raw(&server, "GET", "/version", "application/json", b"").await;
    assert_eq!(code, 200);
    assert!(body.contains("gitVersion"), "{body}");
    let (code, body) = raw(&server, "GET", "/apis", "application/json", b"").await;
    assert_eq!(code, 200);
    assert!(body.contains("batch/v1"), "{body}");
    // The server still serves after all that.
    let (code, _) = raw(
        &server,
        "GET",
        "/api/v1/namespaces/default",
        "application/json",
        b"",
    )
    .await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn status_subresource_dry_run_collections_and_priority_classes() {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::scheduling::v1::PriorityClass;
    use kube::api::DeleteParams;

    use crate::support::pod;

    let server = KubeTestServer::start().await;
    let client = client(&server);
    let pp = PostParams::default();
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    jobs.create(&pp, &job("s", 1, None, None)).await.unwrap();

    // A main-resource patch ignores status; the status subresource takes it
    // and leaves the rest.
    let main = jobs
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}, "status": {"failed": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(main.status.as_ref().unwrap().failed, None);
    assert_eq!(
        main.metadata
            .labels
            .as_ref()
            .unwrap()
            .get("x")
            .map(String::as_str),
        Some("1")
    );
    let status = jobs
        .patch_status(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"y": "2"}}, "status": {"failed": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(status.status.as_ref().unwrap().failed, Some(9));
    assert!(!status.metadata.labels.as_ref().unwrap().contains_key("y"));
    assert_eq!(
        jobs.get_status("s").await.unwrap().status.unwrap().failed,
        Some(9)
    );

    // dryRun=All validates without storing.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    jobs.create(&dry, &job("dry", 1, None, None)).await.unwrap();
    assert!(jobs.get_opt("dry").await.unwrap().is_none());

    // Priority classes: a missing one is refused at admission, a known one
    // resolves to its value.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut classed = pod("classed", &[("group", "g")], None);
    classed.spec.as_mut().unwrap().priority_class_name = Some("gpu-high".into());
    let e = api_error(pods.create(&pp, &classed).await.unwrap_err());
    assert_eq!(
        (e.code, e.message.as_str()),
        (
            403,
            "pods \"classed\" is forbidden: no PriorityClass with name gpu-high was found"
        )
    );
    let classes: Api<PriorityClass> = Api::all(client.clone());
    classes
        .create(
            &pp,
            &PriorityClass {
                metadata: meta("gpu-high"),
                value: 1000,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let created = pods.create(&pp, &classed).await.unwrap();
    assert_eq!(created.spec.unwrap().priority, Some(1000));
    assert_eq!(server.state().priority_classes().len(), 3);

    // Deleting a collection by label selector.
    pods.create(&pp, &pod("other", &[("group", "h")], None))
        .await
        .unwrap();
    pods.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("group=g"),
    )
    .await
    .unwrap();
    let left: Vec<String> = server
        .state()
        .pods(Some("default"))
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert!(
        left.contains(&"other".to_string()) && !left.contains(&"classed".to_string()),
        "{left:?}"
    );
}
