//! What a spoke may claim and write, driven by scripted spokes over real gRPC streams
//! against a hub that requires the shared token: one live session per cluster (a second
//! spoke with the token is refused, the workload runs once), region, labels and inventory
//! from the policy, and logs only for runs the hub assigned to the writing cluster.

mod common;

use std::time::Duration;

use axle_proto::pb;
use axle_proto::pb::hub_message::Msg as Down;
use axle_proto::pb::spoke_message::Msg as Up;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

const TOKEN: &str = "s3cret";

const POLICY: &str = r#"
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: c1}
spec:
  region: eu-west
  labels: {site: ams}
  nodes: [{count: 1, gpuModel: H100, gpusPerNode: 4, gpuMemoryGb: 80}]
---
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: c2}
spec:
  region: eu-west
  nodes: [{count: 1, gpuModel: A100, gpusPerNode: 4}]
---
apiVersion: axle.dev/v1
kind: Team
metadata: {name: t}
spec:
  quotas: {H100: {guaranteed: 4, limit: 4}, A100: {guaranteed: 4, limit: 4}}
"#;

async fn start_hub() -> common::TestHub {
    let policy = axle_policy::load_sources(&[("p.yaml".to_string(), POLICY.to_string())])
        .expect("policy")
        .policy;
    common::start_hub(common::Options {
        policy: Some(policy),
        spoke_token: Some(TOKEN.into()),
        ..Default::default()
    })
    .await
}

fn up(m: Up) -> pb::SpokeMessage {
    pb::SpokeMessage { msg: Some(m) }
}

fn gpus(model: &str, n: u32) -> Vec<pb::Gpu> {
    (0..n)
        .map(|index| pb::Gpu {
            index,
            model: model.into(),
            memory_mb: 81_559,
            fractions_only: false,
            ..Default::default()
        })
        .collect()
}

fn register(cluster: &str, instance: &str, model: &str) -> pb::Register {
    pb::Register {
        cluster: cluster.into(),
        region: "eu-west".into(),
        nodes: vec![pb::Node {
            name: "n0".into(),
            gpus: gpus(model, 4),
            ..Default::default()
        }],
        instance_id: instance.into(),
        token: TOKEN.into(),
        ..Default::default()
    }
}

/// An open session: what the spoke sends, and what the hub sends it.
struct Session {
    tx: mpsc::Sender<pb::SpokeMessage>,
    rx: tonic::Streaming<pb::HubMessage>,
}

impl Session {
    async fn next(&mut self) -> Down {
        tokio::time::timeout(Duration::from_secs(10), self.rx.next())
            .await
            .expect("a hub message within 10 s")
            .expect("stream open")
            .expect("message")
            .msg
            .expect("non-empty")
    }

    /// The next message that is not a heartbeat ack, if one comes within `d`.
    async fn next_within(&mut self, d: Duration) -> Option<Down> {
        let deadline = tokio::time::Instant::now() + d;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.next()).await {
                Ok(Some(Ok(m))) => match m.msg {
                    Some(Down::HeartbeatAck(_)) | None => continue,
                    Some(other) => return Some(other),
                },
                _ => return None,
            }
        }
    }

    async fn send(&self, m: Up) {
        self.tx.send(up(m)).await.expect("send");
    }
}

/// Registers `r`; the session once the hub answered `Registered`.
async fn open(url: &str, r: pb::Register) -> Result<Session, tonic::Status> {
    let mut client = pb::spoke_service_client::SpokeServiceClient::new(common::channel(url).await);
    let (tx, rx) = mpsc::channel(64);
    tx.send(up(Up::Register(r))).await.expect("send register");
    let mut rx = client.session(ReceiverStream::new(rx)).await?.into_inner();
    match rx.message().await? {
        Some(pb::HubMessage {
            msg: Some(Down::Registered(_)),
        }) => Ok(Session { tx, rx }),
        other => panic!("expected Registered, got {other:?}"),
    }
}

async fn submit(url: &str, model: &str) -> u64 {
    let mut c = pb::user_service_client::UserServiceClient::new(common::channel(url).await);
    c.submit(pb::SubmitRequest {
        team: "t".into(),
        command: vec!["work".into()],
        gpus: 1.0,
        gpu_model: model.into(),
        ..Default::default()
    })
    .await
    .expect("submit")
    .into_inner()
    .id
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_spoke_for_a_connected_cluster_is_refused_and_the_workload_runs_once() {
    // Observed: a second spoke with the shared token took turns with the first every
    // ~100 ms; one workload was killed and restarted 383 times and ran twice at once.
    let hub = start_hub().await;
    let grpc = hub.grpc_url();
    let mut first = open(&grpc, register("c1", "first", "H100")).await.unwrap();
    let id = submit(&grpc, "H100").await;
    let Down::Assign(a) = first.next().await else {
        panic!("expected the assignment")
    };
    assert_eq!((a.workload_id, a.epoch), (id, 1));
    first
        .send(Up::Status(pb::WorkloadStatus {
            workload_id: id,
            epoch: 1,
            phase: pb::Phase::Started as i32,
            ..Default::default()
        }))
        .await;

    for _ in 0..5 {
        let e = open(&grpc, register("c1", "second", "H100"))
            .await
            .err()
            .expect("a second spoke for c1 is refused");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(
            e.message().contains("already has a live spoke session"),
            "{}",
            e.message()
        );
    }
    // The first session is untouched: no stop, no second assignment, still Ready.
    assert!(first.next_within(Duration::from_secs(2)).await.is_none());
    let body = common::http_get(&hub.http_url(), &format!("/api/v1/workloads/{id}")).await;
    assert!(
        body.contains("\"epoch\":1") && body.contains("\"Running\""),
        "{body}"
    );
    // The same spoke process reconnecting takes its session back, and adopts the run.
    let mut again = register("c1", "first", "H100");
    again.running = vec![pb::RunningWorkload {
        workload_id: id,
        epoch: 1,
    }];
    drop(first);
    let mut back = open(&grpc, again).await.expect("the same spoke reconnects");
    assert!(
        !matches!(
            back.next_within(Duration::from_secs(1)).await,
            Some(Down::Stop(_))
        ),
        "the adopted run is not stopped"
    );
    let _ = hub.stop.send(());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spokes_claims_are_checked_against_the_policy_and_change_nothing() {
    let hub = start_hub().await;
    let (grpc, http) = (hub.grpc_url(), hub.http_url());
    let refused = |r: pb::Register| {
        let grpc = grpc.clone();
        async move {
            let e = open(&grpc, r).await.err().expect("refused");
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
            e.message().to_string()
        }
    };
    // Observed: a spoke rewrote its cluster's region (eu-west → attacker-land).
    let mut r = register("c1", "x", "H100");
    r.region = "attacker-land".into();
    let m = refused(r).await;
    assert!(m.contains("eu-west") && m.contains("attacker-land"), "{m}");
    // ... its labels,
    let mut r = register("c1", "x", "H100");
    r.labels.insert("site".into(), "elsewhere".into());
    assert!(refused(r).await.contains("site=elsewhere"));
    // ... and its inventory (64 H100 instead of the 4 declared).
    let mut r = register("c1", "x", "H100");
    r.nodes = (0..8)
        .map(|i| pb::Node {
            name: format!("n{i}"),
            gpus: gpus("H100", 8),
            ..Default::default()
        })
        .collect();
    let m = refused(r).await;
    assert!(m.contains("8 nodes") && m.contains("limit of 1"), "{m}");
    // Observed: one GPU with index 99999 took a 4-GPU workload on indices 0–3.
    let mut r = register("c1", "x", "H100");
    r.nodes[0].gpus = vec![pb::Gpu {
        index: 99_999,
        model: "H100".into(),
        memory_mb: 81_559,
        fractions_only: false,
        ..Default::default()
    }];
    assert!(refused(r).await.contains("99999"));
    // A model the policy does not declare for the cluster.
    let m = refused(register("c1", "x", "B200")).await;
    assert!(m.contains("B200"), "{m}");

    // None of it changed the cluster: still Declared, in eu-west, 4 GPUs.
    let body = common::http_get(&http, "/api/v1/clusters").await;
    assert!(body.contains("\"Declared\""), "{body}");
    assert!(
        !body.contains("attacker-land") && !body.contains("elsewhere"),
        "{body}"
    );
    let ok = open(&grpc, register("c1", "x", "H100")).await;
    assert!(ok.is_ok(), "the honest claim is accepted");
    let _ = hub.stop.send(());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spoke_writes_logs_only_for_runs_assigned_to_its_cluster() {
    // Observed: a spoke could write into the log of a workload running on another
    // cluster, and log for a workload that does not exist.
    let hub = start_hub().await;
    let (grpc, http) = (hub.grpc_url(), hub.http_url());
    let mut c1 = open(&grpc, register("c1", "one", "H100")).await.unwrap();
    let c2 = open(&grpc, register("c2", "two", "A100")).await.unwrap();
    let id = submit(&grpc, "H100").await;
    let Down::Assign(_) = c1.next().await else {
        panic!("expected the assignment on c1")
    };
    let chunk = |workload_id, epoch, text: &str| {
        Up::Log(pb::LogChunk {
            workload_id,
            epoch,
            offset: 0,
            data: text.as_bytes().to_vec(),
            stderr: Vec::new(),
        })
    };
    c2.send(chunk(id, 1, "forged by c2\n")).await;
    c2.send(chunk(9_999, 1, "no such workload\n")).await;
    c1.send(chunk(id, 7, "an epoch never assigned\n")).await;
    c1.send(chunk(id, 1, "written by c1\n")).await;
    let mut body = String::new();
    for _ in 0..100 {
        body = common::http_get(&http, &format!("/api/v1/workloads/{id}/logs")).await;
        if body.contains("written by c1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(body.contains("written by c1"), "{body}");
    assert!(!body.contains("forged"), "{body}");
    let logs = hub.data.path().join("logs");
    let names: Vec<String> = std::fs::read_dir(&logs)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        names.iter().all(|n| n.starts_with(&format!("{id}-1."))),
        "only run 1 of workload {id} has a log: {names:?}"
    );
    let _ = hub.stop.send(());
}
