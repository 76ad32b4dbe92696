//! The gRPC user API against a real in-process hub on loopback: the same
//! operations and the same validation as the HTTP API.

mod common;

use std::time::Duration;

use axle_proto::pb;
use axle_proto::pb::user_service_client::UserServiceClient;

async fn client(url: &str) -> UserServiceClient<tonic::transport::Channel> {
    for _ in 0..100 {
        if let Ok(c) = UserServiceClient::connect(url.to_string()).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("hub gRPC at {url} did not come up");
}

fn request(team: &str, gpus: f64) -> pb::SubmitRequest {
    pb::SubmitRequest {
        team: team.into(),
        name: "grpc-job".into(),
        command: vec!["sleep".into(), "1".into()],
        gpus,
        priority: "development".into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn submit_get_list_cancel_over_grpc() {
    let hub = common::start_hub(common::Options::default()).await;
    let url = hub.grpc_url();
    let mut c = client(&url).await;

    let w = c
        .submit(request("vision", 0.5))
        .await
        .expect("submit")
        .into_inner();
    assert_eq!(w.team, "vision");
    assert_eq!(w.name, "grpc-job");
    assert_eq!(w.gpus, 0.5);
    // No spoke is connected, so it waits, and says why.
    assert_eq!(w.state, "Pending");
    assert!(!w.pending_reason.is_empty());

    let got = c
        .get_workload(pb::GetWorkloadRequest { id: w.id })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.id, w.id);

    let list = c
        .list_workloads(pb::ListWorkloadsRequest {
            team: "vision".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(list.workloads.len(), 1);

    let cancelled = c
        .cancel_workload(pb::GetWorkloadRequest { id: w.id })
        .await
        .expect("cancel")
        .into_inner();
    assert_eq!(cancelled.state, "Cancelled");
    assert_eq!(
        cancelled.history.last().map(|t| t.to.as_str()),
        Some("Cancelled")
    );
    let _ = hub.stop.send(());
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_are_invalid_argument_and_store_nothing() {
    let hub = common::start_hub(common::Options::default()).await;
    let url = hub.grpc_url();
    let mut c = client(&url).await;
    for (req, needle) in [
        (request("nobody", 1.0), "unknown team"),
        (request("vision", 0.3), "0.25"),
        (request("vision", 0.0), "gpus"),
        (request("vision", 9.0), "never fit"),
    ] {
        let e = c.submit(req).await.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains(needle),
            "{needle:?} not in {:?}",
            e.message()
        );
    }
    let e = c
        .get_workload(pb::GetWorkloadRequest { id: 42 })
        .await
        .expect_err("not found");
    assert_eq!(e.code(), tonic::Code::NotFound);
    let list = c
        .list_workloads(pb::ListWorkloadsRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert!(list.workloads.is_empty());
    let _ = hub.stop.send(());
}
