//! Forged and replayed joins, and a spoke without a certificate, against a
//! hub on its default TLS (spokes join with certificates from its CA).

use axle_proto::pb;
use serde_json::json;

use crate::harness::{Hub, call_trusting, nodes};

/// A new key's CSR for `cluster` (what a joining spoke makes).
fn csr(cluster: &str) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["spoke.example".to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cluster);
    params.serialize_request(&key).unwrap().pem().unwrap()
}

async fn channel(hub: &Hub) -> tonic::transport::Channel {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    axle_e2e::install_crypto();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(hub.ca_pem()))
        .domain_name("127.0.0.1");
    Endpoint::from_shared(format!("https://{}", hub.grpc_addr()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("TLS gRPC")
}

async fn join(
    hub: &Hub,
    token: &str,
    cluster: &str,
) -> Result<pb::SpokeCertificate, tonic::Status> {
    pb::spoke_service_client::SpokeServiceClient::new(channel(hub).await)
        .join(pb::JoinRequest {
            token: token.into(),
            cluster: cluster.into(),
            csr_pem: csr(cluster),
        })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_replayed_and_misdirected_joins_are_refused() {
    let hub = Hub::with_tokens_tls().await;
    let ca = hub.ca_pem();
    let admin = hub.admin.clone().unwrap();
    let (status, v) = call_trusting(
        Some(&ca),
        &hub.http(),
        Some(&admin),
        reqwest::Method::POST,
        "/api/v1/clusters/lab/join-tokens",
        Some(json!({"ttl_s": 600})),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let token = v["token"].as_str().unwrap().to_string();
    let mut refused = 0;
    // A forged token of the right shape.
    let forged = format!("axlej_{}", "0".repeat(token.len() - 6));
    assert!(join(&hub, &forged, "lab").await.is_err());
    refused += 1;
    // The right token for another cluster.
    assert!(join(&hub, &token, "open-1").await.is_err());
    refused += 1;
    // Once for its cluster, then spent.
    let cert = join(&hub, &token, "lab")
        .await
        .expect("the token joins once");
    assert!(cert.certificate_pem.contains("BEGIN CERTIFICATE"));
    let replay = join(&hub, &token, "lab")
        .await
        .expect_err("a replay is refused");
    assert!(
        replay.message().contains("already used"),
        "{}",
        replay.message()
    );
    refused += 1;
    // A spoke without a certificate cannot register for a cluster.
    let mut client = pb::spoke_service_client::SpokeServiceClient::new(channel(&hub).await);
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::SpokeMessage>(4);
    tx.send(pb::SpokeMessage {
        msg: Some(pb::spoke_message::Msg::Register(pb::Register {
            cluster: "lab".into(),
            nodes: nodes(1, 8),
            instance_id: "forged".into(),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let outbound =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let forged_session = match client.session(outbound).await {
        Err(e) => Err(e),
        Ok(r) => r.into_inner().message().await.map(|_| ()),
    };
    let e = forged_session.expect_err("a spoke without a certificate is refused");
    assert!(
        matches!(
            e.code(),
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
        ),
        "{e:?}"
    );
    refused += 1;
    drop(tx);
    eprintln!(
        "adversary: joins on the default TLS: {refused} of 4 forged, misdirected, replayed or \
         certificate-less attempts refused; the real token joined once"
    );
}
