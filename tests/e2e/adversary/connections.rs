//! Idle connections on both ports, from a few sources.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axle_e2e::Api;
use tokio::net::TcpStream;

use crate::harness::{Hub, nodes, register};

async fn connect_from(from: &str, to: &str) -> Option<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind(format!("{from}:0").parse().ok()?).ok()?;
    socket.connect(to.parse::<SocketAddr>().ok()?).await.ok()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_on_both_ports_leave_spokes_and_users_served() {
    // A share of 64 per source keeps what the hub holds well inside a
    // 1,024 file-descriptor limit (a CI machine's may be that low).
    let mut hub = Hub::open(&["--max-connections-per-source", "64"]).await;
    let api = Api::new(&hub.http());
    // Observed: 20,000 idle TCP connections to the gRPC port took the hub
    // to its file-descriptor limit: /healthz timed out and HTTP accept
    // failed with "Too many open files".
    let mut idle = Vec::new();
    let t0 = Instant::now();
    for src in ["127.0.0.2", "127.0.0.3"] {
        for _ in 0..1_500 {
            for port in [hub.grpc_addr(), hub.addr()] {
                if let Some(s) = connect_from(src, &port).await {
                    idle.push(s);
                }
            }
        }
    }
    let opened = idle.len();
    let fds = open_fds(hub.hub.pid());
    // Each source holds at most its share per port.
    assert!(fds < 4 * 64 + 200, "the hub holds {fds} descriptors");
    let (status, _) = api.get("/healthz").await;
    assert_eq!(status, 200);
    let session = register(&hub.grpc_addr(), "open-1", nodes(2, 8))
        .await
        .expect("a spoke registers during the flood");
    assert_eq!(api.workloads().await.len(), 0);
    hub.hub.check_alive().expect("the hub is up");
    drop(session);
    eprintln!(
        "adversary: {opened} idle connections from 2 sources on both ports in {:?}: the hub held \
         {fds} descriptors; /healthz 200, a spoke registered",
        t0.elapsed()
    );
    drop(idle);
    tokio::time::sleep(Duration::from_millis(100)).await;
}
