//! Pod logs through `Api::logs` and `Api::log_stream` with follow.

use std::time::Duration;

use axle_kube_testserver::KubeTestServer;
use futures::AsyncReadExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams, PostParams};

use crate::support::{api_error, client, pod};

#[tokio::test]
async fn logs_read_and_follow_until_the_pod_finishes() {
    let server = KubeTestServer::start().await;
    let cluster = server.state();
    let pods: Api<Pod> = Api::namespaced(client(&server), "default");
    pods.create(&PostParams::default(), &pod("worker", &[], Some("n1")))
        .await
        .unwrap();
    // A container that has not started has no log yet: 400, as from the kubelet.
    let e = api_error(
        pods.logs("worker", &LogParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    assert!(
        e.message.contains("is waiting to start: ContainerCreating"),
        "{}",
        e.message
    );

    cluster.set_pod_running("default", "worker").unwrap();
    cluster.append_pod_log("default", "worker", "line 1\nline 2\n");
    assert_eq!(
        pods.logs("worker", &LogParams::default()).await.unwrap(),
        "line 1\nline 2\n"
    );
    assert_eq!(
        pods.logs(
            "worker",
            &LogParams {
                tail_lines: Some(1),
                ..Default::default()
            }
        )
        .await
        .unwrap(),
        "line 2\n"
    );
    assert_eq!(
        pods.logs(
            "worker",
            &LogParams {
                limit_bytes: Some(4),
                ..Default::default()
            }
        )
        .await
        .unwrap(),
        "line"
    );
    let e = api_error(
        pods.logs(
            "worker",
            &LogParams {
                container: Some("nope".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    assert_eq!(
        api_error(pods.logs("ghost", &LogParams::default()).await.unwrap_err()).code,
        404
    );

    let mut stream = pods
        .log_stream(
            "worker",
            &LogParams {
                follow: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let reader = tokio::spawn(async move {
        let mut out = Vec::new();
        stream
            .read_to_end(&mut out)
            .await
            .map(|_| String::from_utf8_lossy(&out).to_string())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    cluster.append_pod_log("default", "worker", "line 3\n");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !reader.is_finished(),
        "the follow stream ended while the pod runs"
    );
    cluster.append_pod_log("default", "worker", "done\n");
    cluster.set_pod_succeeded("default", "worker").unwrap();
    let all = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("follow ends when the pod succeeds")
        .unwrap()
        .unwrap();
    assert_eq!(all, "line 1\nline 2\nline 3\ndone\n");
}
