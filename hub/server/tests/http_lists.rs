//! The workload list over HTTP against a real in-process hub on loopback:
//! a client that accepts gzip gets large pages compressed, and the same
//! JSON as a plain client once decoded.

mod common;

use std::io::Read;
use std::net::SocketAddr;
use std::time::Duration;

use axle_proto::pb;
use axle_proto::pb::user_service_client::UserServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `GET path` with `headers`; the response's header block (lowercased)
/// and body.
async fn get(addr: SocketAddr, path: &str, headers: &str) -> (String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{headers}\r\n");
    s.write_all(req.as_bytes()).await.expect("send");
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.expect("read");
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8_lossy(&out[..split]).to_lowercase();
    (head, out[split + 4..].to_vec())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gzip_client_gets_the_same_page_compressed() {
    let hub = common::start_hub(common::Options::default()).await;
    let mut c = loop {
        match UserServiceClient::connect(hub.grpc_url()).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    // ~60 workloads: a page well above the hub's gzip threshold.
    for i in 0..60 {
        c.submit(pb::SubmitRequest {
            team: "nlp".into(),
            name: format!("list-{i}"),
            command: vec!["sleep".into(), "3600".into()],
            gpus: 1.0,
            ..Default::default()
        })
        .await
        .expect("submit");
    }
    let (plain_head, plain) = get(hub.http, "/api/v1/workloads", "").await;
    assert!(plain_head.starts_with("http/1.1 200"), "{plain_head}");
    assert!(!plain_head.contains("content-encoding"), "{plain_head}");
    assert!(
        plain.len() > axle_hub::page_cache::GZIP_MIN_BYTES,
        "{} bytes",
        plain.len()
    );

    let (head, z) = get(hub.http, "/api/v1/workloads", "accept-encoding: gzip\r\n").await;
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert!(head.contains("vary: accept-encoding"), "{head}");
    assert!(
        z.len() * 4 < plain.len(),
        "{} of {} bytes",
        z.len(),
        plain.len()
    );
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(&z[..])
        .read_to_end(&mut json)
        .expect("gzip");
    assert_eq!(json, plain);

    // Refused with q=0: plain again.
    let (head, body) = get(
        hub.http,
        "/api/v1/workloads",
        "accept-encoding: gzip;q=0, identity\r\n",
    )
    .await;
    assert!(!head.contains("content-encoding"), "{head}");
    assert_eq!(body, plain);
    let _ = hub.stop.send(());
}
