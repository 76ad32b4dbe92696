//! `axle-hub migrate-store`: a stopped hub's state moved from redb to a real etcd on
//! loopback, served from there by a replica, and moved back into a new redb file; each
//! copy equal to its source key for key; a non-empty destination refused.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use axle_hub::store::{EtcdOptions, EtcdStore, RedbStore, Store};
use axle_proto::pb;
use axle_proto::pb::user_service_client::UserServiceClient;

/// Every key and value of a store, paged.
async fn dump(store: &dyn Store) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.range_page("", after.as_deref(), 1000).await.unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.key.clone());
        out.extend(page.into_iter().map(|kv| (kv.key, kv.value)));
    }
    out
}

fn migrate(from: &str, to: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_axle-hub"))
        .args([
            "migrate-store",
            "--from",
            from,
            "--to",
            to,
            "--etcd-prefix",
            "/moved/",
        ])
        .env_remove("AXLE_STORE")
        .output()
        .expect("run axle-hub migrate-store")
}

async fn user_client(url: String) -> UserServiceClient<tonic::transport::Channel> {
    for _ in 0..100 {
        if let Ok(c) = UserServiceClient::connect(url.clone()).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no hub at {url}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_moves_from_redb_to_etcd_and_back_with_every_record() {
    // A hub on redb with 300 workloads (more than one etcd txn holds).
    let hub = common::start_hub(common::Options::default()).await;
    let mut c = user_client(hub.grpc_url()).await;
    for i in 0..300 {
        c.submit(pb::SubmitRequest {
            team: "nlp".into(),
            name: format!("moved-{i}"),
            command: vec!["true".into()],
            gpus: 1.0,
            ..Default::default()
        })
        .await
        .expect("submit");
    }
    drop(c);
    let _ = hub.stop.send(());
    hub.run.await.unwrap().unwrap();
    let redb_path = hub.data.path().join(axle_hub::server::STORE_FILE);

    let etcd = common::Etcd::start().await;
    let etcd_url = format!("etcd://{}", etcd.endpoint.trim_start_matches("http://"));
    let out = migrate(&format!("redb:{}", redb_path.display()), &etcd_url);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.starts_with("copied "), "{said}");

    let source = dump(RedbStore::open(&redb_path).unwrap().as_ref()).await;
    let mut o = EtcdOptions::new(vec![etcd.endpoint.clone()]);
    o.prefix = "/moved/".into();
    let moved = EtcdStore::connect(o.clone()).await.unwrap();
    assert_eq!(
        dump(&moved).await,
        source,
        "etcd holds exactly the redb records"
    );
    assert!(
        said.contains(&format!("copied {} records", source.len())),
        "{said}"
    );
    assert!(
        source
            .keys()
            .filter(|k| k.starts_with("workloads/"))
            .count()
            == 300
    );

    // Into a store that is not empty: refused, nothing changed.
    let again = migrate(&format!("redb:{}", redb_path.display()), &etcd_url);
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("not empty"), "{err}");
    assert_eq!(dump(&moved).await, source);

    // A replica on etcd serves the moved state.
    let listeners = axle_hub::server::Listeners::bind(
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let grpc = format!("http://{}", listeners.grpc.local_addr().unwrap());
    let data = tempfile::tempdir().unwrap();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let replica = tokio::spawn(axle_hub::ha::run(
        data.path().to_path_buf(),
        axle_hub::dev::example_policy().unwrap(),
        None,
        listeners,
        EtcdStore::connect(o).await.unwrap(),
        axle_hub::ha::HaOptions {
            replica_id: "r0".into(),
            advertise_http: "http://127.0.0.1:1".into(),
            advertise_grpc: grpc.clone(),
            lease_ttl: Duration::from_secs(2),
            compaction_interval: axle_hub::ha::DEFAULT_COMPACTION_INTERVAL,
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    let mut c = user_client(grpc).await;
    let listed = loop {
        match c
            .list_workloads(pb::ListWorkloadsRequest {
                limit: 1000,
                ..Default::default()
            })
            .await
        {
            Ok(r) => break r.into_inner(),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let names: Vec<&str> = listed.workloads.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names.len(), 300, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("moved-")));
    drop(c);
    let _ = stop.send(());
    replica.await.unwrap().unwrap();

    // And back into a new redb file: the replica's own keys stay behind. The stopped
    // replica resigns and revokes its lease; should that call be lost, its lease (2 s
    // here) ends the lead by itself, so the migration is tried until then.
    let back_dir = tempfile::tempdir().unwrap();
    let back = back_dir.path().join("back.redb");
    let mut out = migrate(&etcd_url, &format!("redb:{}", back.display()));
    for _ in 0..50 {
        if out.status.success()
            || !String::from_utf8_lossy(&out.stderr).contains("leads on the source")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        out = migrate(&etcd_url, &format!("redb:{}", back.display()));
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let returned = dump(RedbStore::open(&back).unwrap().as_ref()).await;
    let workloads = |m: &BTreeMap<String, Vec<u8>>| {
        m.iter()
            .filter(|(k, _)| k.starts_with("workloads/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(workloads(&returned), workloads(&source));
    assert!(
        !returned
            .keys()
            .any(|k| k.starts_with("hubs/") || k == "leader")
    );
}
