//! Label and field selectors on lists, and paging with limit/continue.

use axle_kube_testserver::KubeTestServer;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams, PostParams};

use crate::support::{api_error, client, job, pod};

fn names<K: kube::Resource>(items: Vec<K>) -> Vec<String> {
    let mut n: Vec<String> = items
        .iter()
        .map(|i| i.meta().name.clone().unwrap_or_default())
        .collect();
    n.sort();
    n
}

#[tokio::test]
async fn label_and_field_selectors_filter_lists() {
    let server = KubeTestServer::start().await;
    let client = client(&server);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    pods.create(
        &pp,
        &pod("a", &[("tier", "front"), ("canary", "yes")], Some("n1")),
    )
    .await
    .unwrap();
    pods.create(&pp, &pod("b", &[("tier", "back")], Some("n1")))
        .await
        .unwrap();
    pods.create(&pp, &pod("c", &[("tier", "db")], Some("n2")))
        .await
        .unwrap();
    pods.create(&pp, &pod("d", &[], None)).await.unwrap();

    let list = |lp: ListParams| {
        let pods = pods.clone();
        async move { names(pods.list(&lp).await.unwrap().items) }
    };
    assert_eq!(
        list(ListParams::default().labels("tier=front")).await,
        ["a"]
    );
    assert_eq!(
        list(ListParams::default().labels("tier==back")).await,
        ["b"]
    );
    assert_eq!(
        list(ListParams::default().labels("tier!=front")).await,
        ["b", "c", "d"]
    );
    assert_eq!(
        list(ListParams::default().labels("tier")).await,
        ["a", "b", "c"]
    );
    assert_eq!(list(ListParams::default().labels("!tier")).await, ["d"]);
    assert_eq!(
        list(ListParams::default().labels("tier in (front,back),!canary")).await,
        ["b"]
    );
    assert_eq!(
        list(ListParams::default().labels("tier notin (front, back)")).await,
        ["c", "d"]
    );
    assert_eq!(
        list(ListParams::default().fields("spec.nodeName=n1")).await,
        ["a", "b"]
    );
    assert_eq!(
        list(ListParams::default().fields("spec.nodeName!=n1,metadata.name!=d")).await,
        ["c"]
    );
    assert_eq!(
        list(
            ListParams::default()
                .fields("metadata.name=c")
                .labels("tier")
        )
        .await,
        ["c"]
    );
    // Across namespaces.
    let all: Api<Pod> = Api::all(client.clone());
    assert_eq!(
        names(
            all.list(&ListParams::default().fields("metadata.namespace=default,spec.nodeName=n2"))
                .await
                .unwrap()
                .items
        ),
        ["c"]
    );

    let e = api_error(
        pods.list(&ListParams::default().fields("spec.bogus=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    assert!(e.message.contains("spec.bogus"), "{}", e.message);
    let e = api_error(
        pods.list(&ListParams::default().labels("tier in front"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);

    // Paging: limit and continue, with the first page's resourceVersion.
    let first = pods.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(names(first.items), ["a", "b", "c"]);
    let token = first.metadata.continue_.clone().unwrap();
    assert_eq!(first.metadata.remaining_item_count, Some(1));
    let second = pods
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(second.items), ["d"]);
    assert!(second.metadata.continue_.is_none());
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );

    // Events by the object they are about.
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    jobs.create(&pp, &job("j1", 1, None, None)).await.unwrap();
    jobs.create(&pp, &job("j2", 2, None, None)).await.unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let about_j2 = events
        .list(&ListParams::default().fields("involvedObject.name=j2"))
        .await
        .unwrap()
        .items;
    assert_eq!(about_j2.len(), 2);
    assert!(
        about_j2
            .iter()
            .all(|e| e.involved_object.kind.as_deref() == Some("Job"))
    );
    let by_kind = events
        .list(&ListParams::default().fields("involvedObject.kind=Job"))
        .await
        .unwrap()
        .items;
    assert_eq!(by_kind.len(), 3);
}
