//! ResourceQuota admission: pods over quota are refused (FailedCreate on
//! the Job, 403 on a direct create) and `status.used` follows the pods.

use std::collections::BTreeMap;

use axle_kube_testserver::KubeTestServer;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod, PodSpec, ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};

use crate::support::{api_error, client, container, create_namespace, job, meta};

fn quota(name: &str, key: &str, value: &str) -> ResourceQuota {
    ResourceQuota {
        metadata: ObjectMeta {
            namespace: Some("gpu".into()),
            ..meta(name)
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(BTreeMap::from([(
                key.to_string(),
                Quantity(value.to_string()),
            )])),
            ..Default::default()
        }),
        status: None,
    }
}

fn used(q: &ResourceQuota, key: &str) -> Option<String> {
    q.status
        .as_ref()?
        .used
        .as_ref()?
        .get(key)
        .map(|q| q.0.clone())
}

#[tokio::test]
async fn quota_refuses_pods_over_the_limit() {
    let server = KubeTestServer::start().await;
    let cluster = server.state();
    let client = client(&server);
    let pp = PostParams::default();
    create_namespace(&client, "gpu").await;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), "gpu");
    quotas
        .create(&pp, &quota("gpu-quota", "requests.nvidia.com/gpu", "2"))
        .await
        .unwrap();
    let q = quotas.get("gpu-quota").await.unwrap();
    assert_eq!(used(&q, "requests.nvidia.com/gpu").as_deref(), Some("0"));

    let jobs: Api<Job> = Api::namespaced(client.clone(), "gpu");
    jobs.create(&pp, &job("big", 1, None, Some("3")))
        .await
        .unwrap();
    assert!(cluster.pods(Some("gpu")).is_empty());
    let events: Api<Event> = Api::namespaced(client.clone(), "gpu");
    let failed = events
        .list(&ListParams::default().fields("involvedObject.name=big,reason=FailedCreate"))
        .await
        .unwrap();
    assert_eq!(failed.items.len(), 1);
    let message = failed.items[0].message.clone().unwrap();
    assert!(
        message.starts_with("Error creating: pods \"big-"),
        "{message}"
    );
    assert!(
        message.ends_with(
            "is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=3, used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=2"
        ),
        "{message}"
    );
    assert_eq!(failed.items[0].type_.as_deref(), Some("Warning"));

    jobs.create(&pp, &job("small", 1, None, Some("1")))
        .await
        .unwrap();
    let small = cluster.pods(Some("gpu"));
    assert_eq!(small.len(), 1);
    assert_eq!(
        used(
            &quotas.get("gpu-quota").await.unwrap(),
            "requests.nvidia.com/gpu"
        )
        .as_deref(),
        Some("1")
    );

    // A direct create over quota is 403 Forbidden with the same wording.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "gpu");
    let direct = Pod {
        metadata: meta("direct"),
        spec: Some(PodSpec {
            containers: vec![container(Some("2"))],
            ..Default::default()
        }),
        status: None,
    };
    let e = api_error(pods.create(&pp, &direct).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        e.message,
        "pods \"direct\" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=2, used: requests.nvidia.com/gpu=1, limited: requests.nvidia.com/gpu=2"
    );

    // Finished pods stop counting; a bigger quota lets the blocked Job in.
    let small_name = small[0].metadata.name.clone().unwrap();
    cluster.set_pod_succeeded("gpu", &small_name).unwrap();
    assert_eq!(
        used(
            &quotas.get("gpu-quota").await.unwrap(),
            "requests.nvidia.com/gpu"
        )
        .as_deref(),
        Some("0")
    );
    assert!(
        cluster.pods(Some("gpu")).iter().all(|p| !p
            .metadata
            .name
            .as_ref()
            .unwrap()
            .starts_with("big-"))
    );
    let mut bigger = quotas.get("gpu-quota").await.unwrap();
    bigger
        .spec
        .as_mut()
        .unwrap()
        .hard
        .as_mut()
        .unwrap()
        .insert("requests.nvidia.com/gpu".into(), Quantity("4".into()));
    quotas.replace("gpu-quota", &pp, &bigger).await.unwrap();
    assert!(
        cluster.pods(Some("gpu")).iter().any(|p| p
            .metadata
            .name
            .as_ref()
            .unwrap()
            .starts_with("big-"))
    );
    assert_eq!(
        used(
            &quotas.get("gpu-quota").await.unwrap(),
            "requests.nvidia.com/gpu"
        )
        .as_deref(),
        Some("3")
    );

    // The bare resource name counts requests too.
    cluster
        .add_resource_quota(quota("bare", "nvidia.com/gpu", "3"))
        .unwrap();
    let e = api_error(pods.create(&pp, &direct).await.unwrap_err());
    assert!(e.message.contains("exceeded quota: bare, requested: nvidia.com/gpu=2, used: nvidia.com/gpu=3, limited: nvidia.com/gpu=3"), "{}", e.message);
    assert_eq!(
        used(
            &cluster.get_resource_quota("gpu", "bare").unwrap(),
            "nvidia.com/gpu"
        )
        .as_deref(),
        Some("3")
    );
}
