//! The hub on an etcd that serves TLS and asks for client certificates (certificates
//! made by rcgen): the store works end to end with the right CA and certificate, a
//! replica started with `--etcd-ca/--etcd-cert/--etcd-key` leads, and a missing client
//! certificate, one from another CA, or a CA that did not sign etcd's certificate is
//! refused with an error naming etcd.

mod common;

use std::time::Duration;

use axle_hub::store::{EtcdOptions, EtcdStore, Op, Store, Txn, WatchEvent};
use common::{EtcdTls, TestCa};

fn options(etcd: &common::Etcd, tls: &EtcdTls) -> EtcdOptions {
    let mut o = EtcdOptions::new(vec![etcd.endpoint.clone()]);
    o.prefix = "/tls/".into();
    o.ca_pem = Some(tls.ca_pem.clone());
    o.client_cert_pem = Some((tls.client_cert_pem.clone(), tls.client_key_pem.clone()));
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_works_over_tls_with_a_client_certificate() {
    let ca = TestCa::new("etcd-ca");
    let tls = EtcdTls::new(&ca);
    let etcd = common::Etcd::start_tls(&tls).await;
    assert!(etcd.endpoint.starts_with("https://"), "{}", etcd.endpoint);
    let store = EtcdStore::connect(options(&etcd, &tls)).await.unwrap();
    let mut watch = store.watch("k/").await.unwrap();
    let lease = store.lease_grant(10_000).await.unwrap();
    store.lease_keepalive(lease).await.unwrap();
    let r = store
        .txn(
            Txn::new()
                .and_then(Op::put("k/1", "one"))
                .and_then(Op::put_with_lease("k/2", "two", lease)),
        )
        .await
        .unwrap();
    assert!(r.succeeded);
    let keys: Vec<String> = store
        .range("k/")
        .await
        .unwrap()
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(keys, ["k/1", "k/2"]);
    let seen = tokio::time::timeout(Duration::from_secs(10), watch.recv())
        .await
        .unwrap();
    assert!(matches!(seen, Some(WatchEvent::Put(kv)) if kv.key == "k/1"));
    store.lease_revoke(lease).await.unwrap();
    assert!(store.get("k/2").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_without_the_right_certificates_is_refused() {
    let ca = TestCa::new("etcd-ca");
    let tls = EtcdTls::new(&ca);
    let etcd = common::Etcd::start_tls(&tls).await;
    let refused = |o: EtcdOptions, what: &'static str| async move {
        match EtcdStore::connect(o).await {
            Ok(_) => panic!("{what}: connected"),
            Err(e) => assert!(e.to_string().contains("etcd"), "{what}: {e}"),
        }
    };
    // No client certificate.
    let mut o = options(&etcd, &tls);
    o.client_cert_pem = None;
    refused(o, "no client certificate").await;
    // A client certificate from another CA.
    let other = TestCa::new("other-ca");
    let (cert, key) = other.issue("intruder", &["intruder"]);
    let mut o = options(&etcd, &tls);
    o.client_cert_pem = Some((cert.into_bytes(), key.into_bytes()));
    refused(o, "a certificate of another CA").await;
    // A CA that did not sign etcd's certificate.
    let mut o = options(&etcd, &tls);
    o.ca_pem = Some(other.pem.clone().into_bytes());
    refused(o, "the wrong CA").await;
}

/// `GET /readyz` on `port`: whether it answered 200.
async fn ready(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let req = "GET /readyz HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n\r\n";
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out.starts_with("HTTP/1.1 200")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_leads_on_a_tls_etcd_from_its_flags() {
    let ca = TestCa::new("etcd-ca");
    let tls = EtcdTls::new(&ca);
    let etcd = common::Etcd::start_tls(&tls).await;
    let store = format!("etcd://{}", etcd.endpoint.trim_start_matches("https://"));
    let data = tempfile::tempdir().unwrap();
    let hub = |with_cert: bool| {
        let (http, grpc) = (common::free_port(), common::free_port());
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_axle-hub"));
        cmd.args(["--store", &store, "--insecure-no-tls", "--etcd-ca"])
            .arg(&tls.ca)
            .args(["--http", &format!("127.0.0.1:{http}")])
            .args(["--grpc", &format!("127.0.0.1:{grpc}")])
            .arg("--policy")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../deploy/examples/policy"
            ))
            .arg("--data-dir")
            .arg(data.path())
            .env_remove("AXLE_STORE")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        if with_cert {
            cmd.arg("--etcd-cert")
                .arg(&tls.client_cert)
                .arg("--etcd-key")
                .arg(&tls.client_key);
        }
        (cmd.spawn().expect("start axle-hub"), http)
    };

    // Without its client certificate the replica does not start, and says why.
    let (child, _) = hub(false);
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach etcd"), "{err}");

    let (mut child, http) = hub(true);
    let mut led = false;
    for _ in 0..300 {
        if ready(http).await {
            led = true;
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("axle-hub exited: {status}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(led, "{}", String::from_utf8_lossy(&out.stderr));
}
