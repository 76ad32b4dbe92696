//! Oversized and malformed inventories from a forged spoke.

use std::time::{Duration, Instant};

use axle_e2e::{Api, wait_until};

use crate::harness::{Hub, nodes, register};

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_inventory_is_stored_in_pages_and_a_bad_one_is_refused_while_the_hub_serves() {
    let mut hub = Hub::open(&[]).await;
    let api = Api::new(&hub.http());
    // Observed: 3,000 nodes × 8 H100 for a cluster whose policy lists no
    // nodes made the hub exit ("value of clusters/open-1 has 1720992
    // bytes"), and again at every restart as the spoke reconnected.
    let t0 = Instant::now();
    let session = register(&hub.grpc_addr(), "open-1", nodes(3_000, 8))
        .await
        .expect("3,000 nodes register");
    let registered = t0.elapsed();
    let gpus = |api: Api| async move {
        api.clusters()
            .await
            .into_iter()
            .find(|c| c.name == "open-1")
            .map_or(0.0, |c| c.gpus_total)
    };
    assert_eq!(gpus(api.clone()).await, 24_000.0);
    hub.hub.check_alive().expect("the hub is up");
    // A restart reads the pages back, before the spoke is there again.
    drop(session);
    hub.hub.restart();
    hub.hub.wait_ready(&[]).await;
    let t1 = Instant::now();
    wait_until(
        Duration::from_secs(30),
        "open-1's inventory restored",
        || {
            let api = api.clone();
            async move {
                match gpus(api).await {
                    24_000.0 => Ok(()),
                    n => Err(format!("{n} GPUs")),
                }
            }
        },
    )
    .await;
    let restored = t1.elapsed();
    // Shapes no node has are refused with a reason; nothing changes.
    let refusals = [
        ("open-2", nodes(100, 64), "maxGpusPerNode (16)"),
        ("lab", nodes(1, 16), "nodes of at most 8"),
        ("lab", Vec::new(), "reports no nodes"),
        ("lab", nodes(2, 8), "limit of 1"),
    ];
    for (cluster, inventory, why) in refusals {
        let n = inventory.len();
        let e = register(&hub.grpc_addr(), cluster, inventory)
            .await
            .expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains(why),
            "{cluster} × {n}: {}",
            e.message()
        );
    }
    let mut zero = nodes(1, 8);
    zero[0].gpus[3].memory_mb = 0;
    let e = register(&hub.grpc_addr(), "lab", zero)
        .await
        .expect_err("refused");
    assert!(e.message().contains("0 MiB"), "{}", e.message());
    let mut bidi = nodes(1, 8);
    bidi[0].name = "lab-\u{202E}1".into();
    let e = register(&hub.grpc_addr(), "lab", bidi)
        .await
        .expect_err("refused");
    assert!(
        e.message().contains("not shown as itself"),
        "{}",
        e.message()
    );
    assert_eq!(gpus(api.clone()).await, 24_000.0);
    // Platform teams see who was refused and why (one event a minute per
    // cluster, however often the spoke retries).
    let refused: Vec<_> = api
        .events()
        .await
        .into_iter()
        .filter(|e| e.kind == "spoke_refused")
        .collect();
    assert!(
        refused
            .iter()
            .any(|e| e.message.contains("open-2") && e.message.contains("maxGpusPerNode")),
        "{refused:?}"
    );
    assert_eq!(
        refused
            .iter()
            .filter(|e| e.message.contains("\"lab\""))
            .count(),
        1,
        "{refused:?}"
    );
    let (status, _) = api.get("/healthz").await;
    assert_eq!(status, 200);
    hub.hub.check_alive().expect("the hub is up");
    eprintln!(
        "adversary: inventory of 3,000 nodes × 8 GPUs registered in {registered:?}, restored \
         after a restart in {restored:?}; 6 of 6 impossible shapes refused with a reason"
    );
}
