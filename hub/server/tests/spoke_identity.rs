//! Spokes with certificates from the hub's spoke CA, over real TLS: a spoke joins with a
//! one-time join token (checking the hub against the CA hash the token carries) and
//! registers with its certificate; forged, expired and reused join tokens, a token for
//! another hub, a certificate for cluster A used as B, one from another CA, an expired
//! one, none at all and a revoked cluster are all refused with a clear reason; a renewal
//! keeps the open session and the old certificate until it is replaced twice; the CA is
//! made once and kept in the store; only platform admins mint join tokens and revoke.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axle_hub::server::{CaSource, SpokeMtls};
use axle_hub::spoke_ca::SpokeCa;
use axle_proto::pb;
use axle_proto::pb::hub_message::Msg as Down;
use axle_proto::pb::spoke_message::Msg as Up;
use axle_proto::pb::spoke_service_client::SpokeServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

const POLICY: &str = r#"
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: c1}
spec:
  region: eu-west
  nodes: [{count: 1, gpuModel: H100, gpusPerNode: 4, gpuMemoryGb: 80}]
---
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: c2}
spec:
  region: eu-west
  nodes: [{count: 1, gpuModel: H100, gpusPerNode: 4, gpuMemoryGb: 80}]
---
apiVersion: axle.dev/v1
kind: Team
metadata: {name: t}
spec:
  quotas: {H100: {guaranteed: 4, limit: 8}}
"#;

struct Hub {
    hub: common::TestHub,
    ca_pem: String,
}

impl Hub {
    fn grpc(&self) -> String {
        format!("https://127.0.0.1:{}", self.hub.grpc.port())
    }
}

async fn start(ca: CaSource) -> Hub {
    let policy = axle_policy::load_sources(&[("p.yaml".to_string(), POLICY.to_string())])
        .expect("policy")
        .policy;
    let hub = common::start_hub(common::Options {
        policy: Some(policy),
        spoke_mtls: Some(SpokeMtls {
            ca,
            names: vec!["127.0.0.1".into(), "localhost".into()],
            cert_ttl_ms: 3_600_000,
        }),
        ..Default::default()
    })
    .await;
    let file = hub.data.path().join(axle_hub::server::CA_CERT_FILE);
    let mut ca_pem = String::new();
    for _ in 0..200 {
        if let Ok(pem) = std::fs::read_to_string(&file)
            && !pem.is_empty()
        {
            ca_pem = pem;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!ca_pem.is_empty(), "the hub wrote no {}", file.display());
    let h = Hub { hub, ca_pem };
    // Wait until HTTPS answers.
    for _ in 0..200 {
        if https(&h, "GET", "/healthz", "").await.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h
}

/// One HTTPS request trusting the hub's CA: (status, body).
async fn https(h: &Hub, method: &str, path: &str, body: &str) -> (u16, String) {
    https_as(h, method, path, body, None).await
}

/// [`https`] with an API token.
async fn https_as(
    h: &Hub,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, String) {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(h.ca_pem.as_bytes()) {
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
    let Ok(tcp) = tokio::net::TcpStream::connect(h.hub.http).await else {
        return (0, String::new());
    };
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let Ok(mut s) = connector.connect(name, tcp).await else {
        return (0, String::new());
    };
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: hub\r\nContent-Type: application/json\r\n{auth}\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

async fn join_token(h: &Hub, cluster: &str, ttl_s: u64) -> String {
    let (status, body) = https(
        h,
        "POST",
        &format!("/api/v1/clusters/{cluster}/join-tokens"),
        &format!("{{\"ttl_s\":{ttl_s}}}"),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["token"].as_str().unwrap().to_string()
}

/// TLS trusting the hub's CA, presenting `cert` and `key` if given.
fn tls(h: &Hub, client: Option<(&str, &str)>) -> ClientTlsConfig {
    let t = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&h.ca_pem));
    match client {
        Some((cert, key)) => t.identity(tonic::transport::Identity::from_pem(cert, key)),
        None => t,
    }
}

async fn client(
    h: &Hub,
    tls: ClientTlsConfig,
) -> Result<SpokeServiceClient<tonic::transport::Channel>, String> {
    let ch = Endpoint::from_shared(h.grpc())
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(SpokeServiceClient::new(ch))
}

fn register(cluster: &str, instance: &str) -> pb::SpokeMessage {
    pb::SpokeMessage {
        msg: Some(Up::Register(pb::Register {
            cluster: cluster.into(),
            region: "eu-west".into(),
            nodes: vec![pb::Node {
                name: "n0".into(),
                gpus: (0..4)
                    .map(|index| pb::Gpu {
                        index,
                        model: "H100".into(),
                        memory_mb: 81_559,
                        fractions_only: false,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            instance_id: instance.into(),
            ..Default::default()
        })),
    }
}

/// An open session: the stream down and the sender up.
type Session = (
    tonic::Streaming<pb::HubMessage>,
    mpsc::Sender<pb::SpokeMessage>,
);

/// Opens a session as `cluster` with `tls`: the session once Registered, or the refusal.
async fn session(h: &Hub, tls: ClientTlsConfig, cluster: &str) -> Result<Session, String> {
    let mut c = client(h, tls).await?;
    let (tx, rx) = mpsc::channel(16);
    tx.send(register(cluster, "spoke-1")).await.unwrap();
    let mut down = c
        .session(ReceiverStream::new(rx))
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    match down.message().await {
        Ok(Some(pb::HubMessage {
            msg: Some(Down::Registered(_)),
        })) => Ok((down, tx)),
        other => Err(format!("{other:?}")),
    }
}

/// What a spoke keeps after joining.
#[derive(Clone, Debug)]
struct SpokeIdentity {
    certificate_pem: String,
    key_pem: String,
    ca_pem: String,
}

impl SpokeIdentity {
    fn tls(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(tonic::transport::Identity::from_pem(
                &self.certificate_pem,
                &self.key_pem,
            ))
    }
}

/// A new key and a CSR for it (what a spoke makes before it joins or renews).
fn key_and_csr(cluster: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["anything.example".to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cluster);
    let csr = params.serialize_request(&key).unwrap().pem().unwrap();
    (key.serialize_pem(), csr)
}

/// A spoke's `Join` over TLS trusting the hub's CA: its identity, or the refusal.
async fn join(h: &Hub, token: &str, cluster: &str) -> Result<SpokeIdentity, String> {
    join_with(h, token, cluster, key_and_csr(cluster)).await
}

/// [`join`] with a given key and CSR.
async fn join_with(
    h: &Hub,
    token: &str,
    cluster: &str,
    (key_pem, csr_pem): (String, String),
) -> Result<SpokeIdentity, String> {
    let mut c = client(h, tls(h, None)).await?;
    let cert = c
        .join(pb::JoinRequest {
            token: token.to_string(),
            cluster: cluster.to_string(),
            csr_pem,
        })
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    assert_eq!(cert.cluster, cluster);
    Ok(SpokeIdentity {
        certificate_pem: cert.certificate_pem,
        key_pem,
        ca_pem: cert.ca_pem,
    })
}

async fn joined(h: &Hub, cluster: &str) -> SpokeIdentity {
    let token = join_token(h, cluster, 600).await;
    join(h, &token, cluster).await.expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoke_joins_once_and_registers_with_its_certificate() {
    let h = start(CaSource::Store).await;
    let token = join_token(&h, "c1", 600).await;
    let id = join(&h, &token, "c1").await.expect("join");
    assert_eq!(
        id.ca_pem, h.ca_pem,
        "the spoke trusts the CA it was pinned to"
    );
    let (_down, _up) = session(&h, id.tls(), "c1").await.expect("registered");

    // The same token again: refused, and it names why.
    let again = join(&h, &token, "c1").await.unwrap_err();
    assert!(again.contains("already used"), "{again}");

    // A forged secret under a real id, and a token of the right shape that the hub never made.
    let forged = format!("{}{}{}", &token[..19], "0".repeat(64), &token[83..]);
    let e = join(&h, &forged, "c1").await.unwrap_err();
    assert!(e.contains("not valid"), "{e}");

    // A token for c2 presented for c1.
    let t2 = join_token(&h, "c2", 600).await;
    let e = join(&h, &t2, "c1").await.unwrap_err();
    assert!(e.contains("is for cluster c2"), "{e}");
    // …which stays usable for c2 (a refusal spends nothing).
    assert!(join(&h, &t2, "c2").await.is_ok());

    // A join token for a cluster the policy does not declare: 404, nothing minted.
    let (status, body) = https(&h, "POST", "/api/v1/clusters/nope/join-tokens", "{}").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("not declared"), "{body}");
}

/// Seen: a hub killed after it committed a join but before its answer
/// reached the spoke; the spoke's retry was refused ("already used") and the
/// burst instance never joined. The same CSR again is answered again; any
/// other CSR is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_retried_with_the_same_csr_is_answered_again_and_no_other() {
    let h = start(CaSource::Store).await;
    let token = join_token(&h, "c1", 600).await;
    let keys = key_and_csr("c1");
    let first = join_with(&h, &token, "c1", keys.clone())
        .await
        .expect("join");
    let again = join_with(&h, &token, "c1", keys)
        .await
        .expect("the same spoke again");
    let (_down, _up) = session(&h, again.tls(), "c1").await.expect("registered");
    assert_ne!(first.certificate_pem, again.certificate_pem);
    let other = join(&h, &token, "c1").await.unwrap_err();
    assert!(other.contains("already used"), "{other}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_join_tokens_and_tokens_of_another_hub_are_refused() {
    let h = start(CaSource::Store).await;
    let token = join_token(&h, "c1", 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let e = join(&h, &token, "c1").await.unwrap_err();
    assert!(e.contains("expired"), "{e}");

    // A token whose CA hash is another hub's (a spoke checks that before it talks to
    // the hub at all; the hub refuses it too).
    let other = SpokeCa::generate().unwrap();
    let fake = format!("{}{}", &token[..84], other.pin());
    let e = join(&h, &fake, "c1").await.unwrap_err();
    assert!(e.contains("for another hub"), "{e}");
    // Malformed.
    let e = join(&h, "axlej_nonsense", "c1").await.unwrap_err();
    assert!(e.contains("not valid for this hub"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_checked_against_the_cluster_the_ca_and_the_clock() {
    let ca = Arc::new(SpokeCa::generate().unwrap());
    let h = start(CaSource::Given(ca.clone())).await;
    let a = joined(&h, "c1").await;

    // A's certificate registering as B.
    let e = session(&h, a.tls(), "c2").await.unwrap_err();
    assert!(e.contains("PermissionDenied"), "{e}");
    assert!(
        e.contains("names cluster c1; it cannot register as cluster c2"),
        "{e}"
    );

    // No certificate at all.
    let e = session(&h, tls(&h, None), "c1").await.unwrap_err();
    assert!(
        e.contains("Unauthenticated") && e.contains("presented none"),
        "{e}"
    );

    // A certificate from another CA: the TLS handshake fails.
    let stranger = common::TestCa::new("stranger");
    let (cert, key) = stranger.issue("c1", &["c1"]);
    let e = session(&h, tls(&h, Some((&cert, &key))), "c1")
        .await
        .unwrap_err();
    assert!(!e.contains("Registered"), "{e}");

    // A certificate from the hub's own CA that expired: refused at the handshake too.
    let (key, csr) = key_and_csr("c1");
    let long_ago = 1_600_000_000_000;
    let (old, _) = ca.issue_spoke(&csr, "c1", long_ago, 3_600_000).unwrap();
    let e = session(&h, tls(&h, Some((&old, &key))), "c1")
        .await
        .unwrap_err();
    assert!(!e.contains("Registered"), "{e}");

    // A valid certificate from the hub's CA that the hub never recorded (its CA key
    // leaked into a test, say): refused by fingerprint.
    let (fresh, _) = ca.issue_spoke(&csr, "c1", now_ms(), 3_600_000).unwrap();
    let e = session(&h, tls(&h, Some((&fresh, &key))), "c1")
        .await
        .unwrap_err();
    assert!(e.contains("not one this hub holds"), "{e}");

    // And A, as itself, registers.
    assert!(session(&h, a.tls(), "c1").await.is_ok());
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_cluster_is_cut_off_at_once() {
    let h = start(CaSource::Store).await;
    let a = joined(&h, "c1").await;
    let (mut down, _up) = session(&h, a.tls(), "c1").await.expect("registered");
    let unused = join_token(&h, "c1", 600).await;

    let (status, body) = https(&h, "POST", "/api/v1/clusters/c1/revoke", "").await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["certificates_revoked"], 1, "{body}");
    assert_eq!(v["join_tokens_revoked"], 1, "{body}");
    assert_eq!(v["session_ended"], true, "{body}");

    // The open session ends.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = down.message().await {}
    })
    .await;
    assert!(ended.is_ok(), "the revoked spoke's session is still open");
    // It cannot come back with its certificate, nor with the token minted before.
    let e = session(&h, a.tls(), "c1").await.unwrap_err();
    assert!(e.contains("was revoked"), "{e}");
    let e = join(&h, &unused, "c1").await.unwrap_err();
    assert!(e.contains("not valid"), "{e}");
    // A new join token lets it in again.
    let b = joined(&h, "c1").await;
    assert!(session(&h, b.tls(), "c1").await.is_ok());
    // The revocation is an event with its actor.
    let (_, events) = https(&h, "GET", "/api/v1/events", "").await;
    assert!(events.contains("cluster_revoked"), "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_keeps_the_session_and_the_previous_certificate() {
    let h = start(CaSource::Store).await;
    let first = joined(&h, "c1").await;
    let (mut down, up) = session(&h, first.tls(), "c1").await.expect("registered");

    let renew = |id: SpokeIdentity| {
        let h = &h;
        async move {
            let (key, csr) = key_and_csr("c1");
            let mut c = client(h, id.tls()).await.unwrap();
            let cert = c
                .renew(pb::RenewRequest { csr_pem: csr })
                .await
                .expect("renewed")
                .into_inner();
            assert_eq!(cert.cluster, "c1");
            assert!(cert.not_after_ms > cert.issued_at_ms);
            SpokeIdentity {
                certificate_pem: cert.certificate_pem,
                key_pem: key,
                ca_pem: cert.ca_pem,
            }
        }
    };
    let second = renew(first.clone()).await;
    assert_ne!(second.certificate_pem, first.certificate_pem);

    // The open session goes on: a heartbeat is still answered.
    up.send(pb::SpokeMessage {
        msg: Some(Up::Heartbeat(pb::Heartbeat::default())),
    })
    .await
    .unwrap();
    let acked = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(m)) = down.message().await {
            if matches!(m.msg, Some(Down::HeartbeatAck(_))) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(acked, Ok(true), "the session ended with the renewal");

    // Both certificates are good until the second renewal replaces the first.
    assert!(session(&h, second.tls(), "c1").await.is_ok());
    assert!(session(&h, first.tls(), "c1").await.is_ok());
    let third = renew(second.clone()).await;
    let e = session(&h, first.tls(), "c1").await.unwrap_err();
    assert!(e.contains("not one this hub holds"), "{e}");
    assert!(session(&h, third.tls(), "c1").await.is_ok());
    // A renewal with no certificate is refused.
    let (_, csr) = key_and_csr("c1");
    let mut anon = client(&h, tls(&h, None)).await.unwrap();
    let e = anon
        .renew(pb::RenewRequest { csr_pem: csr })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spoke_ca_is_made_once_and_kept_in_the_store() {
    // redb: a second start reads the CA the first one made.
    let dir = tempfile::tempdir().unwrap();
    let store = axle_hub::store::RedbStore::open(&dir.path().join("axle.redb")).unwrap();
    let first = SpokeCa::load_or_create(store.as_ref()).await.unwrap();
    let again = SpokeCa::load_or_create(store.as_ref()).await.unwrap();
    assert_eq!(first.pin(), again.pin());
    // etcd: replicas starting together agree on one CA.
    let etcd = common::Etcd::start().await;
    let (a, b) = (etcd.store("/r/").await, etcd.store("/r/").await);
    let (x, y) = tokio::join!(SpokeCa::load_or_create(&a), SpokeCa::load_or_create(&b));
    assert_eq!(x.unwrap().pin(), y.unwrap().pin());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_platform_admins_mint_join_tokens_and_revoke_clusters() {
    let policy = axle_policy::load_sources(&[(
        "p.yaml".to_string(),
        format!(
            "{POLICY}\n---\napiVersion: axle.dev/v1\nkind: Settings\nmetadata: {{name: default}}\n\
             spec: {{platformAdmins: [root]}}\n"
        ),
    )])
    .expect("policy")
    .policy;
    let (id, root, sha256) = axle_hub::auth::mint().unwrap();
    let hub = common::start_hub(common::Options {
        policy: Some(policy),
        auth: Some(axle_hub::auth::AuthMode::Tokens),
        bootstrap_token: Some(axle_hub::auth::TokenRecord::new(
            id,
            sha256,
            "root",
            "test",
            0,
            u64::MAX / 2,
        )),
        spoke_mtls: Some(SpokeMtls {
            ca: CaSource::Store,
            names: vec!["127.0.0.1".into()],
            cert_ttl_ms: 3_600_000,
        }),
        ..Default::default()
    })
    .await;
    let ca_file = hub.data.path().join(axle_hub::server::CA_CERT_FILE);
    let mut ca_pem = String::new();
    for _ in 0..200 {
        ca_pem = std::fs::read_to_string(&ca_file).unwrap_or_default();
        if !ca_pem.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let h = Hub { hub, ca_pem };
    let (status, body) = https_as(
        &h,
        "POST",
        "/api/v1/tokens",
        r#"{"user":"bob"}"#,
        Some(&root),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let bob: serde_json::Value = serde_json::from_str(&body).unwrap();
    let bob = bob["token"].as_str().unwrap().to_string();
    for (path, body) in [
        ("/api/v1/clusters/c1/join-tokens", "{}"),
        ("/api/v1/clusters/c1/revoke", ""),
    ] {
        let (status, answer) = https_as(&h, "POST", path, body, None).await;
        assert_eq!(status, 401, "{path}: {answer}");
        let (status, answer) = https_as(&h, "POST", path, body, Some(&bob)).await;
        assert_eq!(status, 403, "{path}: {answer}");
        assert!(
            answer.contains("only they join and revoke clusters"),
            "{answer}"
        );
    }
    let (status, body) = https_as(
        &h,
        "POST",
        "/api/v1/clusters/c1/join-tokens",
        "{}",
        Some(&root),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    // A join token is no API token.
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let (status, _) = https_as(&h, "GET", "/api/v1/workloads", "", v["token"].as_str()).await;
    assert_eq!(status, 401);
}
