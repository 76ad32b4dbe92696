//! The gRPC port's connection limits against a real in-process hub on
//! loopback. Observed before: 20,000 idle TCP connections to the gRPC port
//! took the hub to its file-descriptor limit; `/healthz` timed out and
//! HTTP accept failed with "Too many open files". Nothing closed them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

mod common;

use axle_hub::grpc_serve::GrpcLimits;
use axle_proto::pb;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{from}:0").parse().expect("addr"))
        .expect("bind a loopback source");
    socket.connect(to).await.expect("connect")
}

/// Whether the hub closed `s` within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(within, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue, // a GOAWAY first is fine
            Err(_) => return false,
        }
    }
}

/// A user API call over gRPC from 127.0.0.1: the hub still serves.
async fn list(grpc: SocketAddr) -> Result<usize, String> {
    let mut c = pb::user_service_client::UserServiceClient::connect(format!("http://{grpc}"))
        .await
        .map_err(|e| e.to_string())?;
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        c.list_workloads(pb::ListWorkloadsRequest::default()),
    )
    .await
    .map_err(|_| "timed out".to_string())?
    .map_err(|e| e.to_string())?;
    Ok(r.into_inner().workloads.len())
}

fn hub_options(max_connections: usize, max_per_source: usize) -> common::Options {
    common::Options {
        grpc_limits: Some(GrpcLimits {
            max_connections,
            max_per_source,
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_grpc_connections_are_closed_and_one_source_gets_only_its_share() {
    let hub = common::start_hub(hub_options(4_096, 32)).await;
    let t0 = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..200 {
        idle.push(connect_from("127.0.0.2", hub.grpc).await);
    }
    // Beyond its 32, the source's connections are closed at once.
    let mut refused = 0;
    for s in idle.iter_mut() {
        if closed_within(s, Duration::from_millis(100)).await {
            refused += 1;
        }
    }
    assert!(refused >= 200 - 32, "{refused} of 200 refused");
    assert_eq!(list(hub.grpc).await, Ok(0), "another source is served");
    // The 32 it holds never sent the HTTP/2 preface: closed after 10 s.
    for (i, s) in idle.iter_mut().enumerate() {
        assert!(
            closed_within(s, Duration::from_secs(20)).await,
            "idle connection {i} still open after {:?}",
            t0.elapsed()
        );
    }
    eprintln!(
        "grpc limits: 200 idle from one source: {refused} refused at once, the rest closed within {:?}",
        t0.elapsed()
    );
    let _ = hub.stop.send(());
}

#[tokio::test(flavor = "multi_thread")]
async fn at_the_total_the_oldest_silent_connection_makes_room() {
    let hub = common::start_hub(hub_options(64, 32)).await;
    // Eight sources of 16 silent connections: twice the total.
    let mut idle = Vec::new();
    for src in 2..10 {
        for _ in 0..16 {
            idle.push(connect_from(&format!("127.0.0.{src}"), hub.grpc).await);
        }
    }
    for round in 0..5 {
        assert_eq!(list(hub.grpc).await, Ok(0), "round {round}");
    }
    assert!(closed_within(&mut idle[0], Duration::from_secs(2)).await);
    let _ = hub.stop.send(());
}
