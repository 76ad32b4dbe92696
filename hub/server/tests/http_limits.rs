//! The HTTP API's connection limits against a real in-process hub on
//! loopback. Observed before: 1,000 connections that sent half a header
//! stayed open indefinitely, and a flood of idle connections stopped
//! `/healthz` from answering.

use std::net::SocketAddr;
use std::time::Duration;

mod common;

use axle_hub::http_serve::HttpLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `GET /healthz` on a fresh connection; the status line.
async fn healthz(addr: SocketAddr) -> Result<String, String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out);
    Ok(text.lines().next().unwrap_or("").to_string())
}

/// Whether the server closed `s` (EOF or reset) within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    match tokio::time::timeout(within, s.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) => {
            // An error answer first (e.g. 408) is fine; then it must close.
            tokio::time::timeout(within, s.read_to_end(&mut Vec::new()))
                .await
                .is_ok()
        }
        Err(_) => false,
    }
}

async fn wait_up(addr: SocketAddr) {
    for _ in 0..100 {
        if healthz(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("hub HTTP at {addr} did not come up");
}

#[tokio::test(flavor = "multi_thread")]
async fn half_headers_and_idle_connections_are_closed() {
    let hub = common::start_hub(common::Options {
        http_limits: Some(HttpLimits {
            max_connections: 4_096,
            idle_timeout: Duration::from_secs(2),
            header_read_timeout: Duration::from_secs(1),
            max_per_source: 4_096,
        }),
        ..Default::default()
    })
    .await;
    let addr = hub.http;
    wait_up(addr).await;
    let mut half = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /api/v1/workloads HTTP/1.1\r\nhost: x\r\nx-slow: ")
            .await
            .expect("write half a header");
        half.push(s);
    }
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    // Generous bound: the limits are 1 s and 2 s; the old hub never closed.
    for (i, s) in half.iter_mut().enumerate() {
        assert!(
            closed_within(s, Duration::from_secs(10)).await,
            "half-header connection {i} still open"
        );
    }
    assert!(
        closed_within(&mut silent, Duration::from_secs(10)).await,
        "a connection that sent nothing is still open"
    );
    assert_eq!(healthz(addr).await.as_deref(), Ok("HTTP/1.1 200 OK"));
    let _ = hub.stop.send(());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_idle_connections_does_not_lock_out_healthz() {
    let limit = 64;
    let hub = common::start_hub(common::Options {
        http_limits: Some(HttpLimits {
            max_connections: limit,
            idle_timeout: Duration::from_secs(600),
            header_read_timeout: Duration::from_secs(600),
            max_per_source: 4_096,
        }),
        ..Default::default()
    })
    .await;
    let addr = hub.http;
    wait_up(addr).await;
    // Ten times the limit, all idle and never timing out by themselves.
    let mut idle = Vec::new();
    for _ in 0..limit * 10 {
        idle.push(TcpStream::connect(addr).await.expect("connect"));
    }
    for round in 0..20 {
        let got = tokio::time::timeout(Duration::from_secs(5), healthz(addr)).await;
        assert_eq!(
            got.ok().and_then(Result::ok).as_deref(),
            Some("HTTP/1.1 200 OK"),
            "round {round}: /healthz did not answer under {} idle connections",
            idle.len()
        );
    }
    // The oldest idle connections were closed to make room.
    assert!(closed_within(&mut idle[0], Duration::from_secs(5)).await);
    let _ = hub.stop.send(());
}

/// A connection to `to` from the loopback address `from` (127.0.0.0/8 is
/// all loopback on Linux: each address is another source to the hub).
pub async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{from}:0").parse().expect("addr"))
        .expect("bind a loopback source");
    socket.connect(to).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread")]
async fn one_source_holds_at_most_its_share_of_http_connections() {
    let hub = common::start_hub(common::Options {
        http_limits: Some(HttpLimits {
            max_connections: 4_096,
            idle_timeout: Duration::from_secs(600),
            header_read_timeout: Duration::from_secs(600),
            max_per_source: 32,
        }),
        ..Default::default()
    })
    .await;
    let addr = hub.http;
    wait_up(addr).await;
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(connect_from("127.0.0.2", addr).await);
    }
    // The source's oldest idle connections made room for its newest.
    let mut closed = 0;
    for s in idle.iter_mut() {
        if closed_within(s, Duration::from_millis(200)).await {
            closed += 1;
        }
    }
    assert!(closed >= 100 - 32, "{closed} of 100 closed");
    assert_eq!(healthz(addr).await.as_deref(), Ok("HTTP/1.1 200 OK"));
    let _ = hub.stop.send(());
}
