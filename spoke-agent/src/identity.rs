//! The spoke's identity: a certificate from the hub's spoke CA.
//!
//! A new spoke is started once with a join token (`axle cluster join-token
//! CLUSTER`). The token carries the SHA-256 of the hub's CA certificate: the
//! spoke connects over TLS, accepts the hub only if its certificate chains to
//! a CA with that hash (no trust on first use), and trades the token and a
//! CSR for a certificate naming its cluster. Key, certificate and the CA are
//! kept in `<data-dir>/identity/` (mode 0600); from then on the spoke
//! connects with mTLS only, and renews the certificate at two thirds of its
//! life without dropping its session or its workloads.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use axle_proto::pb;
use axle_proto::pb::spoke_service_client::SpokeServiceClient;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::session;

/// The folder of the data dir that holds the identity.
pub const IDENTITY_DIR: &str = "identity";

/// Every join token starts with this (the hub's `spoke_ca::JOIN_TOKEN_PREFIX`).
pub const JOIN_TOKEN_PREFIX: &str = "axlej_";

/// Shortest wait before a failed renewal is tried again, and the longest: a
/// hub being restarted is back within seconds, and a renewal starts at two
/// thirds of the certificate's life, so there is time for many tries.
/// How long a joining spoke keeps trying a hub it cannot reach (a hub
/// restarting or changing leader, an instance booting before its network
/// is up): a burst instance that gave up would be paid for and never used.
/// A refusal (a bad, spent or expired token, a hub with another CA) ends
/// the join at once.
pub const JOIN_RETRY_FOR: Duration = Duration::from_secs(10 * 60);
/// One try (TLS session and the Join call): a hub answers a join in
/// milliseconds; one killed mid-call may leave the call hanging.
const JOIN_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest pause between two tries of an unreachable hub.
const JOIN_RETRY_MAX: Duration = Duration::from_secs(10);
const RENEW_RETRY_MIN: Duration = Duration::from_secs(1);
const RENEW_RETRY_MAX: Duration = Duration::from_secs(60);

/// The spoke's certificate, key and the hub's CA.
#[derive(Clone, Serialize, Deserialize)]
pub struct SpokeIdentity {
    pub cluster: String,
    pub certificate_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
    pub issued_at_ms: u64,
    pub not_after_ms: u64,
}

impl std::fmt::Debug for SpokeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        f.debug_struct("SpokeIdentity")
            .field("cluster", &self.cluster)
            .field("not_after_ms", &self.not_after_ms)
            .finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// Most bytes of the identity file read: a few certificates and a key.
const MAX_IDENTITY_BYTES: u64 = 1 << 20;

impl SpokeIdentity {
    fn file(data_dir: &Path) -> PathBuf {
        data_dir.join(IDENTITY_DIR).join("identity.json")
    }

    /// The identity kept in `data_dir`, if any.
    pub fn load(data_dir: &Path) -> anyhow::Result<Option<SpokeIdentity>> {
        let path = Self::file(data_dir);
        let len = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        if len > MAX_IDENTITY_BYTES {
            anyhow::bail!("{}: {len} bytes, not an identity file", path.display());
        }
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let id: SpokeIdentity = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{} is not a spoke identity; remove it and join again",
                path.display()
            )
        })?;
        Ok(Some(id))
    }

    /// Writes the identity into `data_dir` (folder 0700, file 0600), replacing
    /// the old one in one rename, so a crash leaves one or the other.
    pub fn save(&self, data_dir: &Path) -> anyhow::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
        let dir = data_dir.join(IDENTITY_DIR);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot restrict {}", dir.display()))?;
        let tmp = dir.join("identity.json.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(&serde_json::to_vec_pretty(self)?)
            .and_then(|()| f.sync_all())
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, Self::file(data_dir))
            .with_context(|| format!("cannot write {}", Self::file(data_dir).display()))?;
        Ok(())
    }

    /// TLS to the hub with this identity: trust the hub's CA, present the certificate.
    pub fn tls(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.certificate_pem, &self.key_pem))
    }

    /// When to renew: at two thirds of the certificate's life.
    pub fn renew_at_ms(&self) -> u64 {
        let life = self.not_after_ms.saturating_sub(self.issued_at_ms);
        self.issued_at_ms + life / 3 * 2
    }

    fn from_pb(c: pb::SpokeCertificate, key_pem: String) -> SpokeIdentity {
        SpokeIdentity {
            cluster: c.cluster,
            certificate_pem: c.certificate_pem,
            key_pem,
            ca_pem: c.ca_pem,
            issued_at_ms: c.issued_at_ms,
            not_after_ms: c.not_after_ms,
        }
    }
}

/// A new key (ECDSA P-256) and a CSR for it: (key PEM, CSR PEM).
pub fn key_and_csr(cluster: &str) -> anyhow::Result<(String, String)> {
    let key = rcgen::KeyPair::generate().context("cannot generate the spoke's key")?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cluster);
    let csr = params
        .serialize_request(&key)
        .and_then(|c| c.pem())
        .context("cannot make the certificate signing request")?;
    Ok((key.serialize_pem(), csr))
}

/// The CA hash a join token carries, if it has the shape of one.
pub fn token_pin(token: &str) -> Option<&str> {
    let rest = token.trim().strip_prefix(JOIN_TOKEN_PREFIX)?;
    let parts: Vec<&str> = rest.split('_').collect();
    let hexy = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    match parts.as_slice() {
        [id, secret, pin] if hexy(id, 12) && hexy(secret, 64) && hexy(pin, 64) => Some(pin),
        _ => None,
    }
}

/// Accepts the hub only if its chain holds the CA with the pinned hash, and
/// its certificate verifies against that CA for the name dialled.
#[derive(Debug)]
struct PinnedCa {
    pin: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for PinnedCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| sha256_hex(c) == self.pin)
            .ok_or_else(|| {
                rustls::Error::General(
                    "the hub's certificate does not chain to the CA the join token names \
                     (wrong hub, or someone in between)"
                        .into(),
                )
            })?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            self.provider.clone(),
        )
        .build()
        .map_err(|e| rustls::Error::General(format!("the pinned CA: {e}")))?;
        verifier.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A channel to the hub at `url` over TLS that trusts only the CA with hash `pin`.
async fn pinned_channel(url: &str, pin: &str) -> anyhow::Result<tonic::transport::Channel> {
    let uri: tonic::transport::Uri = url
        .parse()
        .with_context(|| format!("invalid hub URL {url:?}"))?;
    if uri.scheme_str() != Some("https") {
        anyhow::bail!(
            "hub URL {url:?}: a spoke joins over TLS only; use the hub's https:// gRPC URL"
        );
    }
    let host = uri
        .host()
        .ok_or_else(|| anyhow::anyhow!("hub URL {url:?} names no host"))?
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let name = ServerName::try_from(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
    )
    .with_context(|| format!("hub URL {url:?}: not a host name"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedCa {
            pin: pin.to_ascii_lowercase(),
            provider,
        }))
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let addr = format!("{host}:{port}");
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .with_context(|| format!("invalid hub URL {url:?}"))?
        .connect_timeout(session::CONNECT_TIMEOUT);
    let channel = endpoint
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let (connector, addr, name) = (connector.clone(), addr.clone(), name.clone());
            async move {
                let tcp = tokio::net::TcpStream::connect(&addr).await?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| {
            let err = anyhow::anyhow!("{}", session::chain(&e));
            let err = err.context(format!("cannot reach the hub at {url} to join"));
            if no_connection(&e) {
                err.context(Unreachable)
            } else {
                err
            }
        })?;
    Ok(channel)
}

/// Marks a join failure worth trying again: nothing answered (as opposed
/// to a hub that answered and refused, or a certificate that did not match).
#[derive(Debug)]
struct Unreachable;

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the hub is unreachable")
    }
}

/// Whether `e` is a connection that never came up (refused, reset, timed
/// out, no route), not a TLS handshake that failed.
fn no_connection(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::*;
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | NotConnected
                    | TimedOut
                    | HostUnreachable
                    | NetworkUnreachable
                    | AddrNotAvailable
            )
        {
            return true;
        }
        if err.to_string().contains("timed out") {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The hub URLs of `--hub a,b,c`.
fn urls(hub_urls: &str) -> Vec<String> {
    hub_urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect()
}

/// Joins the hub with a join token: the certificate for `cluster`. While
/// no hub answers it tries again, for up to [`JOIN_RETRY_FOR`].
pub async fn join(hub_urls: &str, token: &str, cluster: &str) -> anyhow::Result<SpokeIdentity> {
    let started = std::time::Instant::now();
    let mut delay = Duration::from_millis(500);
    // One key for every try: a hub that committed the join but died before
    // answering answers the same CSR again.
    let keys = key_and_csr(cluster)?;
    loop {
        match join_once(hub_urls, token, cluster, &keys).await {
            Err(e)
                if e.downcast_ref::<Unreachable>().is_some()
                    && started.elapsed() + delay < JOIN_RETRY_FOR =>
            {
                tracing::warn!("{e:#}; trying again in {} ms", delay.as_millis());
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(JOIN_RETRY_MAX);
            }
            other => return other,
        }
    }
}

async fn join_once(
    hub_urls: &str,
    token: &str,
    cluster: &str,
    (key_pem, csr_pem): &(String, String),
) -> anyhow::Result<SpokeIdentity> {
    let pin = token_pin(token).ok_or_else(|| {
        anyhow::anyhow!(
            "--join-token is not an Axle join token (axlej_…); mint one with \
             `axle cluster join-token {cluster}`"
        )
    })?;
    let mut last = None;
    let mut queue = urls(hub_urls);
    let mut tried = 0;
    while let Some(url) = queue.first().cloned() {
        queue.remove(0);
        tried += 1;
        if tried > session::MAX_HUB_ADDRESSES + 1 {
            break;
        }
        let channel =
            match tokio::time::timeout(JOIN_ATTEMPT_TIMEOUT, pinned_channel(&url, pin)).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    last = Some(e);
                    continue;
                }
                Err(_) => {
                    last = Some(
                        anyhow::anyhow!(
                            "no TLS session with the hub at {url} within {JOIN_ATTEMPT_TIMEOUT:?}"
                        )
                        .context(Unreachable),
                    );
                    continue;
                }
            };
        let req = pb::JoinRequest {
            token: token.trim().to_string(),
            cluster: cluster.to_string(),
            csr_pem: csr_pem.clone(),
        };
        let answer = tokio::time::timeout(
            JOIN_ATTEMPT_TIMEOUT,
            SpokeServiceClient::new(channel).join(req),
        )
        .await;
        let Ok(answer) = answer else {
            // A hub that died or restarted mid-call: the token is unspent
            // unless the hub answered, and then a second try is refused.
            last = Some(
                anyhow::anyhow!("the hub at {url} did not answer within {JOIN_ATTEMPT_TIMEOUT:?}")
                    .context(Unreachable),
            );
            continue;
        };
        match answer {
            Ok(resp) => {
                let cert = resp.into_inner();
                let ca_der: CertificateDer<'static> =
                    rustls::pki_types::pem::PemObject::from_pem_slice(cert.ca_pem.as_bytes())
                        .map_err(|e| anyhow::anyhow!("the hub sent no usable CA: {e}"))?;
                if sha256_hex(&ca_der) != pin.to_ascii_lowercase() {
                    anyhow::bail!("the hub sent a CA whose hash differs from the join token's");
                }
                if cert.cluster != cluster {
                    anyhow::bail!(
                        "the hub issued a certificate for cluster {}, not {cluster}",
                        cert.cluster
                    );
                }
                return Ok(SpokeIdentity::from_pb(cert, key_pem.clone()));
            }
            Err(status) => {
                if let Some(leader) = session::leader_url(&status) {
                    // A follower (a restarted replica waits out the old
                    // leader's lease, and may name itself): worth trying again.
                    last = Some(
                        anyhow::anyhow!("the hub at {url} does not lead; it names {leader}")
                            .context(Unreachable),
                    );
                    queue.insert(0, leader);
                    continue;
                }
                // Only the hub's own verdicts end the join; a call that
                // broke (the hub died mid-call: "transport error") or a hub
                // not ready is tried again.
                use tonic::Code::*;
                if !matches!(
                    status.code(),
                    Unauthenticated
                        | PermissionDenied
                        | InvalidArgument
                        | FailedPrecondition
                        | NotFound
                        | AlreadyExists
                        | ResourceExhausted
                        | OutOfRange
                        | Unimplemented
                ) {
                    last = Some(
                        anyhow::anyhow!("{:?}: {}", status.code(), status.message())
                            .context(Unreachable),
                    );
                    continue;
                }
                anyhow::bail!("the hub refused to join: {}", status.message());
            }
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no hub address given")))
        .context("cannot join the hub")
}

/// A new certificate for the identity in `creds`, from whichever hub replica leads.
async fn renew_once(hub_urls: &str, current: &SpokeIdentity) -> anyhow::Result<SpokeIdentity> {
    let (key_pem, csr_pem) = key_and_csr(&current.cluster)?;
    let tls = current.tls();
    let mut queue = urls(hub_urls);
    let mut last = None;
    let mut tried = 0;
    while let Some(url) = queue.first().cloned() {
        queue.remove(0);
        tried += 1;
        if tried > session::MAX_HUB_ADDRESSES + 1 {
            break;
        }
        let channel = match session::endpoint(&url, Some(&tls))?.connect().await {
            Ok(c) => c,
            Err(e) => {
                last = Some(anyhow::anyhow!("{}: {}", url, session::chain(&e)));
                continue;
            }
        };
        let req = pb::RenewRequest {
            csr_pem: csr_pem.clone(),
        };
        match SpokeServiceClient::new(channel).renew(req).await {
            Ok(resp) => return Ok(SpokeIdentity::from_pb(resp.into_inner(), key_pem)),
            Err(status) => {
                if let Some(leader) = session::leader_url(&status) {
                    // A follower (a restarted replica waits out the old
                    // leader's lease, and may name itself): worth trying again.
                    last = Some(
                        anyhow::anyhow!("the hub at {url} does not lead; it names {leader}")
                            .context(Unreachable),
                    );
                    queue.insert(0, leader);
                    continue;
                }
                last = Some(anyhow::anyhow!("{url}: {}", status.message()));
                if status.code() != tonic::Code::Unavailable {
                    break;
                }
            }
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no hub address given")))
}

/// The identity in use and the TLS settings new connections take.
pub struct Credentials {
    identity: RwLock<SpokeIdentity>,
    tls: RwLock<ClientTlsConfig>,
}

impl Credentials {
    pub fn new(identity: SpokeIdentity) -> Arc<Credentials> {
        Arc::new(Credentials {
            tls: RwLock::new(identity.tls()),
            identity: RwLock::new(identity),
        })
    }

    /// The TLS settings of the next connection.
    pub fn tls(&self) -> ClientTlsConfig {
        self.tls.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn identity(&self) -> SpokeIdentity {
        self.identity
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn replace(&self, id: SpokeIdentity) {
        *self.tls.write().unwrap_or_else(|p| p.into_inner()) = id.tls();
        *self.identity.write().unwrap_or_else(|p| p.into_inner()) = id;
    }
}

/// The identity this spoke connects with: the one kept in `data_dir`, or a
/// new one from `join_token`.
pub async fn establish(
    hub_urls: &str,
    cluster: &str,
    data_dir: &Path,
    join_token: Option<&str>,
) -> anyhow::Result<Arc<Credentials>> {
    let kept = SpokeIdentity::load(data_dir)?;
    if let Some(id) = &kept {
        if id.cluster != cluster {
            anyhow::bail!(
                "{} holds the identity of cluster {}, not {cluster}; give this spoke its own --data-dir",
                data_dir.join(IDENTITY_DIR).display(),
                id.cluster
            );
        }
        if id.not_after_ms > now_ms() {
            if join_token.is_some() {
                tracing::info!(
                    "this spoke already joined as {cluster}; the join token is not used"
                );
            }
            return Ok(Credentials::new(id.clone()));
        }
        if join_token.is_none() {
            anyhow::bail!(
                "the certificate of cluster {cluster} in {} expired; start the spoke with a new \
                 --join-token (axle cluster join-token {cluster})",
                data_dir.join(IDENTITY_DIR).display()
            );
        }
    }
    let Some(token) = join_token else {
        anyhow::bail!(
            "this spoke has no certificate yet: start it once with --join-token (or \
             AXLE_JOIN_TOKEN), minted by a platform admin with `axle cluster join-token {cluster}`"
        );
    };
    let id = join(hub_urls, token, cluster).await?;
    id.save(data_dir)?;
    tracing::info!(
        "joined the hub as cluster {cluster}; certificate kept in {} until {} ms",
        data_dir.join(IDENTITY_DIR).display(),
        id.not_after_ms
    );
    Ok(Credentials::new(id))
}

/// Renews the certificate at two thirds of its life, for as long as the
/// spoke runs; the open session goes on, new connections use the new one.
pub async fn renew_loop(creds: Arc<Credentials>, hub_urls: String, data_dir: PathBuf) {
    let mut retry = RENEW_RETRY_MIN;
    loop {
        let current = creds.identity();
        let wait = current.renew_at_ms().saturating_sub(now_ms());
        tokio::time::sleep(Duration::from_millis(wait)).await;
        match renew_once(&hub_urls, &current).await {
            Ok(id) => {
                if let Err(e) = id.save(&data_dir) {
                    tracing::warn!("renewed the certificate but cannot keep it: {e:#}");
                }
                tracing::info!(
                    "renewed the certificate; valid until {} ms",
                    id.not_after_ms
                );
                creds.replace(id);
                retry = RENEW_RETRY_MIN;
            }
            Err(e) => {
                let left = current.not_after_ms.saturating_sub(now_ms());
                tracing::warn!(
                    "cannot renew the certificate ({e:#}); {} s of it left, retrying",
                    left / 1000
                );
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(RENEW_RETRY_MAX);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_pins_are_read_and_bad_tokens_refused() {
        let pin = "ab".repeat(32);
        let t = format!("axlej_{}_{}_{pin}", "0".repeat(12), "1".repeat(64));
        assert_eq!(token_pin(&t), Some(pin.as_str()));
        for bad in ["", "axle_x", &t[..t.len() - 2], &format!("{t}_1")] {
            assert!(token_pin(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn identities_are_kept_with_mode_0600_and_renew_at_two_thirds() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        assert!(SpokeIdentity::load(dir.path()).unwrap().is_none());
        let id = SpokeIdentity {
            cluster: "us-1".into(),
            certificate_pem: "c".into(),
            key_pem: "k".into(),
            ca_pem: "a".into(),
            issued_at_ms: 3000,
            not_after_ms: 6000,
        };
        id.save(dir.path()).unwrap();
        let back = SpokeIdentity::load(dir.path()).unwrap().unwrap();
        assert_eq!(back.cluster, "us-1");
        assert_eq!(back.renew_at_ms(), 5000);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&SpokeIdentity::file(dir.path())), 0o600);
        assert_eq!(mode(&dir.path().join(IDENTITY_DIR)), 0o700);
        assert!(!format!("{back:?}").contains("\"k\""));
    }
}
