//! The hub's APIs over TLS from a certificate and key (made by rcgen): HTTPS and gRPC
//! answer a client that trusts the CA, refuse one that trusts another CA, and a plaintext
//! client on the TLS port gets no answer, leaving the hub serving.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axle_proto::pb;
use common::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn tls_hub(ca: &TestCa) -> common::TestHub {
    let (cert, key) = ca.issue("axle-hub", &["127.0.0.1", "localhost"]);
    let tls = axle_hub::tls::ServerTls::from_pem(cert.into_bytes(), key.into_bytes()).unwrap();
    common::start_hub(common::Options {
        tls: Some(tls),
        ..Default::default()
    })
    .await
}

/// `GET path` over TLS trusting `ca_pem`: the whole answer, or the TLS error.
async fn https_get(addr: std::net::SocketAddr, ca_pem: &str, path: &str) -> Result<String, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut s = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_serves_tls_to_clients_that_trust_its_ca() {
    let ca = TestCa::new("hub-ca");
    let hub = tls_hub(&ca).await;
    let mut answer = Err(String::new());
    for _ in 0..100 {
        answer = https_get(hub.http, &ca.pem, "/healthz").await;
        if answer.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ok = answer.expect("HTTPS answers");
    assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("ok"), "{ok}");

    // Another CA's client refuses the hub's certificate.
    let other = TestCa::new("other-ca");
    let e = https_get(hub.http, &other.pem, "/healthz")
        .await
        .unwrap_err();
    assert!(
        e.contains("UnknownIssuer") || e.contains("certificate"),
        "{e}"
    );

    // Plaintext on the TLS port gets no HTTP answer, and the hub goes on serving.
    let mut plain = tokio::net::TcpStream::connect(hub.http).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: hub\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut out)).await;
    assert!(!String::from_utf8_lossy(&out).contains("200 OK"), "{out:?}");
    assert!(https_get(hub.http, &ca.pem, "/healthz").await.is_ok());
    let _ = hub.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_serves_tls_to_clients_that_trust_its_ca() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    let ca = TestCa::new("hub-ca");
    let hub = tls_hub(&ca).await;
    let url = format!("https://{}", hub.grpc);
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca.pem))
        .domain_name("127.0.0.1");
    let endpoint = Endpoint::from_shared(url.clone())
        .unwrap()
        .tls_config(tls)
        .unwrap();
    let mut channel = None;
    for _ in 0..100 {
        if let Ok(c) = endpoint.connect().await {
            channel = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut c = pb::user_service_client::UserServiceClient::new(channel.expect("TLS gRPC"));
    let id = c
        .submit(pb::SubmitRequest {
            team: "nlp".into(),
            command: vec!["true".into()],
            gpus: 1.0,
            ..Default::default()
        })
        .await
        .expect("submit over TLS")
        .into_inner()
        .id;
    let w = c.get_workload(pb::GetWorkloadRequest { id }).await.unwrap();
    assert_eq!(w.into_inner().id, id);

    // A client trusting another CA cannot connect; nor can a plaintext one.
    let other = TestCa::new("other-ca");
    let wrong = Endpoint::from_shared(url)
        .unwrap()
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&other.pem)))
        .unwrap();
    assert!(wrong.connect().await.is_err());
    let plain = Endpoint::from_shared(format!("http://{}", hub.grpc)).unwrap();
    let refused = match plain.connect().await {
        Err(_) => true,
        Ok(ch) => pb::user_service_client::UserServiceClient::new(ch)
            .get_workload(pb::GetWorkloadRequest { id })
            .await
            .is_err(),
    };
    assert!(refused, "plaintext gRPC on the TLS port was answered");
    let _ = hub.stop.send(());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_tls_handshake_on_the_grpc_port_is_closed() {
    // Observed: the gRPC port took any connection and kept it; tonic's TLS
    // handshake had no deadline.
    let ca = TestCa::new("hub-ca");
    let hub = tls_hub(&ca).await;
    let t0 = std::time::Instant::now();
    let mut s = tokio::net::TcpStream::connect(hub.grpc).await.unwrap();
    // Half a TLS record header, then nothing.
    s.write_all(&[0x16, 0x03]).await.unwrap();
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "still open after {:?}",
        t0.elapsed()
    );
    assert!(t0.elapsed() >= Duration::from_secs(9), "{:?}", t0.elapsed());
    let _ = hub.stop.send(());
}

#[test]
fn a_certificate_and_key_that_do_not_match_are_refused_at_start() {
    let ca = TestCa::new("hub-ca");
    let (cert, _) = ca.issue("a", &["127.0.0.1"]);
    let (_, other_key) = ca.issue("b", &["127.0.0.1"]);
    let e =
        axle_hub::tls::ServerTls::from_pem(cert.into_bytes(), other_key.into_bytes()).unwrap_err();
    assert!(format!("{e:#}").contains("does not match"), "{e:#}");
    let e = axle_hub::tls::ServerTls::from_pem(b"junk".to_vec(), b"junk".to_vec()).unwrap_err();
    assert!(format!("{e:#}").contains("no certificate"), "{e:#}");
}
