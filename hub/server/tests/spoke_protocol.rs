//! The hub's side of the spoke protocol, driven by a scripted spoke over a
//! real gRPC stream: assignments, preemption stops, fencing of stale epochs,
//! and a preempted workload that finishes before its stop takes effect.

mod common;

use std::time::Duration;

use axle_proto::pb;
use axle_proto::pb::hub_message::Msg as Down;
use axle_proto::pb::spoke_message::Msg as Up;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

const POLICY: &str = r#"
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: c1}
spec:
  region: test
  nodes: [{count: 1, gpuModel: H100, gpusPerNode: 1}]
---
apiVersion: axle.dev/v1
kind: Team
metadata: {name: owners}
spec:
  quotas: {H100: {guaranteed: 1, limit: 1}}
---
apiVersion: axle.dev/v1
kind: Team
metadata: {name: borrowers}
spec:
  quotas: {H100: {guaranteed: 0, limit: 1}}
"#;

struct Spoke {
    tx: mpsc::Sender<pb::SpokeMessage>,
    rx: tonic::Streaming<pb::HubMessage>,
}

impl Spoke {
    async fn connect(url: &str, running: Vec<pb::RunningWorkload>) -> Spoke {
        let mut client =
            pb::spoke_service_client::SpokeServiceClient::new(common::channel(url).await);
        let (tx, rx) = mpsc::channel(16);
        tx.send(up(Up::Register(pb::Register {
            cluster: "c1".into(),
            region: "test".into(),
            nodes: vec![pb::Node {
                name: "n0".into(),
                gpus: vec![pb::Gpu {
                    index: 0,
                    model: "H100".into(),
                    memory_mb: 81920,
                    fractions_only: false,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            instance_id: "scripted".into(),
            running,
            ..Default::default()
        })))
        .await
        .expect("send register");
        let mut rx = client
            .session(ReceiverStream::new(rx))
            .await
            .expect("session")
            .into_inner();
        match next(&mut rx).await {
            Down::Registered(r) => assert_eq!(r.cluster, "c1"),
            other => panic!("expected Registered, got {other:?}"),
        }
        Spoke { tx, rx }
    }

    async fn status(&self, id: u64, epoch: u64, phase: pb::Phase, exit_code: i32) {
        self.tx
            .send(up(Up::Status(pb::WorkloadStatus {
                workload_id: id,
                epoch,
                phase: phase as i32,
                exit_code,
                message: String::new(),
            })))
            .await
            .expect("send status");
    }
}

fn up(m: Up) -> pb::SpokeMessage {
    pb::SpokeMessage { msg: Some(m) }
}

async fn next(rx: &mut tonic::Streaming<pb::HubMessage>) -> Down {
    let m = tokio::time::timeout(Duration::from_secs(10), rx.next())
        .await
        .expect("a hub message within 10 s")
        .expect("stream open")
        .expect("message");
    m.msg.expect("non-empty")
}

async fn start_hub() -> common::TestHub {
    start_hub_with_token(None).await
}

async fn start_hub_with_token(token: Option<String>) -> common::TestHub {
    let policy = axle_policy::load_sources(&[("p.yaml".to_string(), POLICY.to_string())])
        .expect("policy")
        .policy;
    common::start_hub(common::Options {
        policy: Some(policy),
        spoke_token: token,
        ..Default::default()
    })
    .await
}

async fn submit(url: &str, team: &str, priority: &str) -> u64 {
    let mut c = pb::user_service_client::UserServiceClient::new(common::channel(url).await);
    c.submit(pb::SubmitRequest {
        team: team.into(),
        command: vec!["work".into()],
        gpus: 1.0,
        priority: priority.into(),
        ..Default::default()
    })
    .await
    .expect("submit")
    .into_inner()
    .id
}

async fn workload(url: &str, id: u64) -> pb::Workload {
    let mut c = pb::user_service_client::UserServiceClient::new(common::channel(url).await);
    c.get_workload(pb::GetWorkloadRequest { id })
        .await
        .expect("get")
        .into_inner()
}

async fn wait_state(url: &str, id: u64, state: &str) -> pb::Workload {
    for _ in 0..200 {
        let w = workload(url, id).await;
        if w.state == state {
            return w;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "workload {id} never reached {state}: {:?}",
        workload(url, id).await
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn preemption_stop_then_assign_and_early_exit_counts_as_success() {
    let hub = start_hub().await;
    let grpc = hub.grpc_url();
    let mut spoke = Spoke::connect(&grpc, Vec::new()).await;

    let batch = submit(&grpc, "borrowers", "batch").await;
    let Down::Assign(a) = next(&mut spoke.rx).await else {
        panic!("expected an assignment")
    };
    assert_eq!((a.workload_id, a.epoch), (batch, 1));
    assert_eq!(a.replicas[0].gpus[0].index, 0);
    spoke.status(batch, 1, pb::Phase::Started, 0).await;
    wait_state(&grpc, batch, "Running").await;

    // The owners reclaim their guaranteed GPU with higher priority work.
    let training = submit(&grpc, "owners", "training").await;
    let Down::Stop(s) = next(&mut spoke.rx).await else {
        panic!("expected the victim's stop first")
    };
    assert_eq!((s.workload_id, s.epoch), (batch, 1));
    assert_eq!(s.reason, pb::StopReason::Preempted as i32);
    let Down::Assign(a) = next(&mut spoke.rx).await else {
        panic!("expected the preemptor's assignment after the stop")
    };
    assert_eq!(a.workload_id, training);

    // The victim exits 0 on its own before the stop takes effect: it is done.
    spoke.status(batch, 1, pb::Phase::Succeeded, 0).await;
    let w = wait_state(&grpc, batch, "Succeeded").await;
    assert_eq!(w.exit_code, 0);
    assert!(
        w.history
            .iter()
            .any(|t| t.reason.contains("preempted for workload"))
    );
    let _ = hub.stop.send(());
}

#[tokio::test(flavor = "multi_thread")]
async fn stale_epochs_are_fenced_and_a_preempted_workload_waits_for_its_stop() {
    let hub = start_hub().await;
    let grpc = hub.grpc_url();
    let mut spoke = Spoke::connect(&grpc, Vec::new()).await;

    let batch = submit(&grpc, "borrowers", "batch").await;
    let Down::Assign(_) = next(&mut spoke.rx).await else {
        panic!("expected an assignment")
    };
    spoke.status(batch, 1, pb::Phase::Started, 0).await;
    wait_state(&grpc, batch, "Running").await;

    // A report for an epoch the hub never assigned is fenced off.
    spoke.status(batch, 7, pb::Phase::Started, 0).await;
    let Down::Stop(s) = next(&mut spoke.rx).await else {
        panic!("expected a stale stop")
    };
    assert_eq!((s.workload_id, s.epoch), (batch, 7));
    assert_eq!(s.reason, pb::StopReason::Stale as i32);

    let training = submit(&grpc, "owners", "training").await;
    let Down::Stop(_) = next(&mut spoke.rx).await else {
        panic!("expected the victim's stop")
    };
    let Down::Assign(_) = next(&mut spoke.rx).await else {
        panic!("expected the preemptor's assignment")
    };
    // Until the stop is confirmed the victim waits (Preempting), and is not
    // placed again.
    let w = wait_state(&grpc, batch, "Preempting").await;
    assert!(
        w.pending_reason.contains("waiting for its stop"),
        "{}",
        w.pending_reason
    );
    spoke.status(batch, 1, pb::Phase::Stopped, 143).await;
    spoke.status(training, 1, pb::Phase::Started, 0).await;
    wait_state(&grpc, training, "Running").await;
    spoke.status(training, 1, pb::Phase::Succeeded, 0).await;
    // The GPU frees and the victim runs again, as epoch 2.
    let Down::Assign(a) = next(&mut spoke.rx).await else {
        panic!("expected the victim to be assigned again")
    };
    assert_eq!((a.workload_id, a.epoch), (batch, 2));
    let _ = hub.stop.send(());
}

/// Opens a session with one Register and returns the hub's answer.
async fn register(url: &str, cluster: &str, token: &str) -> Result<pb::HubMessage, tonic::Status> {
    let mut client = pb::spoke_service_client::SpokeServiceClient::new(common::channel(url).await);
    let (tx, rx) = mpsc::channel(4);
    tx.send(up(Up::Register(pb::Register {
        cluster: cluster.into(),
        nodes: vec![pb::Node {
            name: "n0".into(),
            gpus: vec![pb::Gpu {
                index: 0,
                model: "H100".into(),
                memory_mb: 81920,
                fractions_only: false,
                ..Default::default()
            }],
            ..Default::default()
        }],
        token: token.into(),
        ..Default::default()
    })))
    .await
    .expect("send register");
    let mut stream = client.session(ReceiverStream::new(rx)).await?.into_inner();
    let first = stream.message().await?;
    first.ok_or_else(|| tonic::Status::aborted("stream closed"))
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_spokes_are_refused_and_change_nothing() {
    let hub = start_hub_with_token(Some("s3cret".into())).await;
    let (grpc, http) = (hub.grpc_url(), hub.http_url());
    let e = register(&grpc, "c1", "guess")
        .await
        .expect_err("wrong token");
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("token"), "{}", e.message());
    let e = register(&grpc, "rogue", "s3cret")
        .await
        .expect_err("undeclared cluster");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("rogue"), "{}", e.message());
    // Neither attempt registered anything: c1 is still only declared.
    let body = common::http_get(&http, "/api/v1/clusters").await;
    assert!(body.contains("\"Declared\""), "{body}");
    assert!(!body.contains("rogue"), "{body}");
    let ok = register(&grpc, "c1", "s3cret").await.expect("right token");
    assert!(matches!(ok.msg, Some(Down::Registered(_))));
    let _ = hub.stop.send(());
}
