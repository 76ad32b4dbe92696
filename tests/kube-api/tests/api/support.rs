//! Test helpers: a kube client for a server, object builders, polling and
//! a raw HTTP request for malformed input.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use axle_kube_testserver::KubeTestServer;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a test waits for something asynchronous (a watcher catching up,
/// a reconnect after a pause) before failing.
pub const WAIT_MS: u64 = 10_000;

/// A kube client for the server (plain HTTP, ring provider installed).
pub fn client(server: &KubeTestServer) -> kube::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = kube::Config::new(server.url().parse().expect("server url"));
    kube::Client::try_from(config).expect("kube client")
}

/// Creates namespace `name` through the API.
pub async fn create_namespace(client: &kube::Client, name: &str) {
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &kube::api::PostParams::default(),
            &k8s_openapi::api::core::v1::Namespace {
                metadata: meta(name),
                ..Default::default()
            },
        )
        .await
        .expect("create namespace");
}

pub fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        ..Default::default()
    }
}

pub fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

pub fn container(gpus: Option<&str>) -> Container {
    Container {
        name: "main".into(),
        image: Some("busybox:1.36".into()),
        resources: gpus.map(|g| {
            let r = BTreeMap::from([("nvidia.com/gpu".to_string(), Quantity(g.to_string()))]);
            ResourceRequirements {
                requests: Some(r.clone()),
                limits: Some(r),
                ..Default::default()
            }
        }),
        ..Default::default()
    }
}

pub fn pod(name: &str, pod_labels: &[(&str, &str)], node: Option<&str>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            labels: labels(pod_labels),
            ..meta(name)
        },
        spec: Some(PodSpec {
            containers: vec![container(None)],
            node_name: node.map(Into::into),
            ..Default::default()
        }),
        status: None,
    }
}

/// A Job with `parallelism` pods, Indexed when `completions` is given.
pub fn job(
    name: &str,
    parallelism: i32,
    indexed_completions: Option<i32>,
    gpus: Option<&str>,
) -> Job {
    Job {
        metadata: meta(name),
        spec: Some(JobSpec {
            parallelism: Some(parallelism),
            completions: indexed_completions.or(Some(parallelism)),
            completion_mode: indexed_completions.map(|_| "Indexed".to_string()),
            backoff_limit: Some(0),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: labels(&[("app", name)]),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container(gpus)],
                    restart_policy: Some("Never".into()),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// Polls `check` until it returns Some, or panics after `WAIT_MS`.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_millis(WAIT_MS);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The API error inside a kube error.
pub fn api_error(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Sends one raw HTTP/1.1 request; returns the status code and body.
pub async fn raw(
    server: &KubeTestServer,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, String) {
    raw_declared(server, method, path, content_type, body, body.len()).await
}

/// Like `raw`, declaring `content_length` whatever `body` is (to claim an
/// oversized body without sending it). A server may answer and close before
/// reading all of it, so write errors are ignored and what was read counts.
pub async fn raw_declared(
    server: &KubeTestServer,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
    content_length: usize,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: {content_type}\r\nContent-Length: {content_length}\r\nConnection: close\r\n\r\n"
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body).await;
    let mut response = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        stream.read_to_end(&mut response),
    )
    .await;
    let text = String::from_utf8_lossy(&response).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}
