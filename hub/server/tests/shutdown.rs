//! Shutdown: a SIGTERM'd hub (its shutdown future) drains and exits within
//! its deadline even with a spoke session and idle HTTP connections open.

mod common;

use std::time::{Duration, Instant};

use axle_hub::server;
use axle_proto::pb;
use tokio::io::AsyncWriteExt;
use tokio_stream::wrappers::ReceiverStream;

#[tokio::test]
async fn shutdown_ends_spoke_sessions_and_returns_within_the_drain_deadline() {
    // Observed: the shutdown waited for every gRPC stream to end, and a
    // spoke's session never ends by itself.
    let hub = common::start_hub(common::Options::default()).await;
    let (http, grpc) = (hub.http, hub.grpc);

    // A spoke session, open and idle.
    let channel = loop {
        match tonic::transport::Channel::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect()
            .await
        {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let mut client = pb::spoke_service_client::SpokeServiceClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::SpokeMessage {
        msg: Some(pb::spoke_message::Msg::Register(pb::Register {
            cluster: "eu-1".into(),
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
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut down = client
        .session(ReceiverStream::new(rx))
        .await
        .expect("session")
        .into_inner();
    assert!(matches!(
        down.message().await.unwrap().unwrap().msg,
        Some(pb::hub_message::Msg::Registered(_))
    ));
    // Like a spoke, close the upstream when the hub ends the session.
    let spoke = tokio::spawn(async move {
        while let Ok(Some(_)) = down.message().await {}
        drop(tx);
    });
    // An idle HTTP connection, half a request sent.
    let mut idle = tokio::net::TcpStream::connect(http).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();

    let t = Instant::now();
    hub.stop.send(()).unwrap();
    let res = tokio::time::timeout(server::DRAIN_DEADLINE + Duration::from_secs(3), hub.run)
        .await
        .expect("the hub returns within its drain deadline");
    res.expect("hub task").expect("clean shutdown");
    let took = t.elapsed();
    eprintln!("shutdown took {took:?}");
    // The spoke saw its session end (it redials another hub) and the drain
    // did not need its deadline.
    tokio::time::timeout(Duration::from_secs(1), spoke)
        .await
        .expect("the session stream ended")
        .unwrap();
    assert!(took < server::DRAIN_DEADLINE, "{took:?}");
}
