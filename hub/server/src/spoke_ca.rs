//! The hub's spoke CA: who a spoke is, proven by a certificate the hub issued.
//!
//! A platform admin mints a one-time join token for a cluster
//! (`axle cluster join-token CLUSTER`). The token carries the SHA-256 of the
//! CA's certificate, so a new spoke checks the hub against it before it sends
//! anything (no trust on first use). The spoke trades the token and a CSR for
//! a certificate naming its cluster, and from then on connects with mTLS; the
//! hub knows each certificate it issued by its SHA-256 fingerprint, so a
//! revoked cluster's certificates stop working at once.
//!
//! The CA is generated at a hub's first start and kept in its store (every HA
//! replica uses the same one), or given as files (`--spoke-ca-cert`,
//! `--spoke-ca-key`). The hub's gRPC port serves a certificate the CA issues
//! at each start.

use std::time::Duration;

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use ring::rand::SecureRandom;
use serde::{Deserialize, Serialize};

use crate::hub::HubError;
use crate::store::{Compare, Op, Store, Txn};

/// Every join token starts with this, so a leaked one is easy to search for.
pub const JOIN_TOKEN_PREFIX: &str = "axlej_";

/// Where the generated CA is kept in the store.
pub const CA_KEY: &str = "ca/spokes";

/// A join token's life when its creator names none: an hour, enough to start
/// a spoke, short enough that a token left in a shell history is dead.
pub const DEFAULT_JOIN_TOKEN_TTL_MS: u64 = 3_600_000;

/// Longest a join token lives: a week (a cluster being built over days).
pub const MAX_JOIN_TOKEN_TTL_MS: u64 = 7 * 86_400_000;

/// Most join tokens kept (unused and used, until they expire): far more than
/// clusters ever join at once; each costs a record.
pub const MAX_JOIN_TOKENS: usize = 10_000;

/// A spoke certificate's life unless `--spoke-cert-ttl-s` says otherwise: 30
/// days. Spokes renew at two thirds of it, so a hub can be down for days
/// without a spoke losing its identity.
pub const DEFAULT_SPOKE_CERT_TTL_MS: u64 = 30 * 86_400_000;

/// Shortest spoke certificate life accepted: a minute (tests of rotation).
pub const MIN_SPOKE_CERT_TTL_MS: u64 = 60_000;

/// Certificates are valid from this long before they are issued: clocks of
/// hub and spoke hosts differ by a little.
pub const CLOCK_SKEW_MS: u64 = 5 * 60_000;

/// Most certificates a cluster holds at once: the current one and the one it
/// replaced, which stays valid until it expires so a renewal drops nothing.
pub const MAX_CERTS_PER_CLUSTER: usize = 2;

/// Largest CSR accepted: an EC or RSA request is well under 4 KiB.
pub const MAX_CSR_BYTES: usize = 16 * 1024;

/// Life of the CA generated at first start: ten years.
const CA_LIFE: Duration = Duration::from_secs(10 * 365 * 86_400);

/// Life of the gRPC serving certificate, issued again at every start.
const SERVING_LIFE: Duration = Duration::from_secs(365 * 86_400);

/// The CA as stored under [`CA_KEY`].
#[derive(Clone, Serialize, Deserialize)]
pub struct CaRecord {
    pub v: u32,
    pub cert_pem: String,
    pub key_pem: String,
}

/// A join token as stored: its digest, never the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinTokenRecord {
    pub v: u32,
    pub id: String,
    pub cluster: String,
    pub sha256: String,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub created_by: String,
    /// When a spoke used it (then it is spent); kept until it expires, so a
    /// second use is told it was used.
    #[serde(default)]
    pub used_at_ms: Option<u64>,
    /// SHA-256 of the CSR it was used with: the same spoke asking again with
    /// the same CSR (the hub died before its answer arrived) is answered
    /// again; anyone else is told the token was used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_csr_sha256: Option<String>,
}

/// A certificate the hub issued to a spoke, by its fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpokeCertRecord {
    pub v: u32,
    /// Hex SHA-256 of the certificate's DER.
    pub fingerprint: String,
    pub cluster: String,
    pub issued_at_ms: u64,
    pub not_after_ms: u64,
    /// `join token <id>` or `renewal of <fingerprint prefix>`.
    pub via: String,
    /// Set by `axle cluster revoke`: refused from then on.
    #[serde(default)]
    pub revoked_at_ms: Option<u64>,
}

/// The CA, ready to issue.
pub struct SpokeCa {
    cert_pem: String,
    key_pem: String,
    cert_der: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for SpokeCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs and debug output.
        f.debug_struct("SpokeCa")
            .field("sha256", &self.pin())
            .finish_non_exhaustive()
    }
}

pub fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

fn unix(ms: u64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp((ms / 1000) as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl SpokeCa {
    /// A new CA (ECDSA P-256).
    pub fn generate() -> anyhow::Result<SpokeCa> {
        let key = KeyPair::generate().context("cannot generate the spoke CA's key")?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "Axle spoke CA");
        dn.push(DnType::OrganizationName, "Axle");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = now_ms();
        params.not_before = unix(now.saturating_sub(CLOCK_SKEW_MS));
        params.not_after = unix(now + CA_LIFE.as_millis() as u64);
        let cert = params
            .self_signed(&key)
            .context("cannot sign the spoke CA")?;
        let cert_pem = cert.pem();
        let key_pem = key.serialize_pem();
        Self::from_pem(&cert_pem, &key_pem)
    }

    /// From PEM: the CA's certificate and its private key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> anyhow::Result<SpokeCa> {
        let key = KeyPair::from_pem(key_pem).context("the CA key PEM")?;
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .map(|c: rustls::pki_types::CertificateDer<'static>| c.to_vec())
            .map_err(|e| anyhow::anyhow!("the CA certificate PEM: {e}"))?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)
            .context("the CA certificate PEM is not a certificate rcgen can issue from")?;
        Ok(SpokeCa {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            cert_der: der,
            issuer,
        })
    }

    /// From `--spoke-ca-cert` and `--spoke-ca-key` files.
    pub fn from_files(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<SpokeCa> {
        let cert_pem = crate::tls::read_pem("--spoke-ca-cert", cert)?;
        let key_pem = crate::tls::read_pem("--spoke-ca-key", key)?;
        let text = |b: Vec<u8>, flag: &str| {
            String::from_utf8(b).map_err(|_| anyhow::anyhow!("{flag}: not a PEM text file"))
        };
        Self::from_pem(
            &text(cert_pem, "--spoke-ca-cert")?,
            &text(key_pem, "--spoke-ca-key")?,
        )
        .with_context(|| {
            format!(
                "--spoke-ca-cert {} / --spoke-ca-key {}",
                cert.display(),
                key.display()
            )
        })
    }

    /// The CA from the store, or a new one written there if none is (one
    /// compare-and-swap, so HA replicas starting together agree on one).
    pub async fn load_or_create(store: &dyn Store) -> anyhow::Result<SpokeCa> {
        if let Some(kv) = store.get(CA_KEY).await.context("reading the spoke CA")? {
            return Self::from_record(&kv.value);
        }
        let ca = Self::generate()?;
        let record = serde_json::to_vec(&CaRecord {
            v: 1,
            cert_pem: ca.cert_pem.clone(),
            key_pem: ca.key_pem.clone(),
        })?;
        let res = store
            .txn(
                Txn::new()
                    .when(CA_KEY, Compare::Absent)
                    .and_then(Op::put(CA_KEY, record)),
            )
            .await
            .context("writing the spoke CA")?;
        if res.succeeded {
            tracing::info!("generated the spoke CA (SHA-256 {})", ca.pin());
            return Ok(ca);
        }
        // Another replica wrote one first: use it.
        let kv = store
            .get(CA_KEY)
            .await
            .context("reading the spoke CA")?
            .ok_or_else(|| anyhow::anyhow!("the spoke CA vanished from the store"))?;
        Self::from_record(&kv.value)
    }

    fn from_record(bytes: &[u8]) -> anyhow::Result<SpokeCa> {
        let r: CaRecord = serde_json::from_slice(bytes)
            .map_err(|e| anyhow::anyhow!("corrupt record {CA_KEY}: {e}"))?;
        Self::from_pem(&r.cert_pem, &r.key_pem).with_context(|| format!("record {CA_KEY}"))
    }

    /// Hex SHA-256 of the CA certificate's DER: what join tokens carry.
    pub fn pin(&self) -> String {
        sha256_hex(&self.cert_der)
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A serving certificate for the hub's gRPC port naming `names` (DNS names
    /// or IP addresses): the chain (certificate, then the CA) and its key, PEM.
    pub fn serving_cert(&self, names: &[String]) -> anyhow::Result<(String, String)> {
        let key = KeyPair::generate().context("cannot generate the serving key")?;
        let mut params = CertificateParams::new(names.to_vec())
            .context("the --tls-san names are not valid DNS names or IP addresses")?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "Axle hub");
        params.distinguished_name = dn;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = now_ms();
        params.not_before = unix(now.saturating_sub(CLOCK_SKEW_MS));
        params.not_after = unix(now + SERVING_LIFE.as_millis() as u64);
        let cert = params
            .signed_by(&key, &self.issuer)
            .context("cannot issue the hub's serving certificate")?;
        Ok((
            format!("{}{}", cert.pem(), self.cert_pem),
            key.serialize_pem(),
        ))
    }

    /// A certificate for `cluster` from the spoke's CSR, valid `ttl_ms` from
    /// `now_ms`. The names the CSR asks for are ignored: the hub names the
    /// cluster. Returns the certificate PEM and its fingerprint.
    pub fn issue_spoke(
        &self,
        csr_pem: &str,
        cluster: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<(String, String), HubError> {
        if csr_pem.len() > MAX_CSR_BYTES {
            return Err(HubError::bad(
                format!(
                    "the CSR is {} bytes, more than {MAX_CSR_BYTES}",
                    csr_pem.len()
                ),
                Some("csr_pem"),
            ));
        }
        let csr = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| {
            HubError::bad(
                format!("not a valid PKCS#10 certificate signing request (PEM): {e}"),
                Some("csr_pem"),
            )
        })?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cluster);
        dn.push(DnType::OrganizationalUnitName, "Axle spoke");
        params.distinguished_name = dn;
        params.subject_alt_names =
            match rcgen::string::Ia5String::try_from(format!("spiffe://axle/cluster/{cluster}")) {
                Ok(uri) => vec![SanType::URI(uri)],
                Err(_) => Vec::new(),
            };
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = unix(now_ms.saturating_sub(CLOCK_SKEW_MS));
        params.not_after = unix(now_ms.saturating_add(ttl_ms));
        let mut serial = [0u8; 16];
        ring::rand::SystemRandom::new()
            .fill(&mut serial)
            .map_err(|_| HubError::Internal("no randomness for a serial number".into()))?;
        serial[0] &= 0x7f;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        let csr = CertificateSigningRequestParams {
            params,
            public_key: csr.public_key,
        };
        let cert = csr
            .signed_by(&self.issuer)
            .map_err(|e| HubError::Internal(format!("cannot issue the certificate: {e}")))?;
        Ok((cert.pem(), sha256_hex(cert.der())))
    }
}

/// A new join token for a CA with pin `pin`: its id, the whole token (shown
/// once) and the digest of its secret.
pub fn mint_join_token(pin: &str) -> Result<(String, String, String), HubError> {
    let rng = ring::rand::SystemRandom::new();
    let mut id = [0u8; 6];
    let mut secret = [0u8; 32];
    rng.fill(&mut id)
        .and_then(|()| rng.fill(&mut secret))
        .map_err(|_| HubError::Internal("no randomness for a join token".into()))?;
    let (id, secret) = (hex(&id), hex(&secret));
    let token = format!("{JOIN_TOKEN_PREFIX}{id}_{secret}_{pin}");
    Ok((id, token, sha256_hex(secret.as_bytes())))
}

/// A join token's parts: id, secret and CA pin, if it has the shape of one.
pub fn parse_join_token(token: &str) -> Option<(&str, &str, &str)> {
    let rest = token.trim().strip_prefix(JOIN_TOKEN_PREFIX)?;
    let mut parts = rest.split('_');
    let (id, secret, pin) = (parts.next()?, parts.next()?, parts.next()?);
    let hexy = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (parts.next().is_none() && hexy(id, 12) && hexy(secret, 64) && hexy(pin, 64))
        .then_some((id, secret, pin))
}

/// Checks a spoke certificate's life against the bounds, in ms.
pub fn check_cert_ttl(ttl_ms: u64) -> anyhow::Result<u64> {
    if ttl_ms < MIN_SPOKE_CERT_TTL_MS {
        anyhow::bail!(
            "--spoke-cert-ttl-s {}: at least {} s",
            ttl_ms / 1000,
            MIN_SPOKE_CERT_TTL_MS / 1000
        );
    }
    Ok(ttl_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr() -> String {
        let key = KeyPair::generate().unwrap();
        CertificateParams::new(vec!["ignored.example".to_string()])
            .unwrap()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap()
    }

    #[test]
    fn join_tokens_round_trip_and_bad_shapes_are_refused() {
        let ca = SpokeCa::generate().unwrap();
        let (id, token, digest) = mint_join_token(&ca.pin()).unwrap();
        let (pid, secret, pin) = parse_join_token(&token).unwrap();
        assert_eq!((pid, pin), (id.as_str(), ca.pin().as_str()));
        assert_eq!(sha256_hex(secret.as_bytes()), digest);
        for bad in [
            "",
            "axlej_",
            "axle_0123456789ab_00",
            &token[..token.len() - 1],
            &format!("{token}_00"),
            &token.replace("axlej_", "axlej_x"),
        ] {
            assert!(parse_join_token(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_spoke_certificate_names_the_cluster_and_chains_to_the_ca() {
        let ca = SpokeCa::generate().unwrap();
        let (pem, fp) = ca
            .issue_spoke(&csr(), "us-1", now_ms(), DEFAULT_SPOKE_CERT_TTL_MS)
            .unwrap();
        let der: rustls::pki_types::CertificateDer<'static> =
            rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).unwrap();
        assert_eq!(sha256_hex(&der), fp);
        // The CA from its own PEM issues the same way (files, store).
        let again = SpokeCa::from_pem(ca.cert_pem(), &ca.key_pem).unwrap();
        assert_eq!(again.pin(), ca.pin());
        assert!(again.issue_spoke(&csr(), "eu-1", now_ms(), 60_000).is_ok());
    }

    #[test]
    fn bad_csrs_are_refused_clearly() {
        let ca = SpokeCa::generate().unwrap();
        for bad in ["", "not a csr", &"x".repeat(MAX_CSR_BYTES + 1)] {
            let e = ca.issue_spoke(bad, "us-1", now_ms(), 60_000).unwrap_err();
            assert!(matches!(e, HubError::BadRequest { .. }), "{e}");
        }
    }

    #[test]
    fn the_serving_chain_ends_with_the_ca() {
        let ca = SpokeCa::generate().unwrap();
        let (chain, key) = ca
            .serving_cert(&["localhost".into(), "127.0.0.1".into()])
            .unwrap();
        assert!(chain.ends_with(ca.cert_pem()));
        assert!(key.contains("PRIVATE KEY"));
        assert!(check_cert_ttl(1000).is_err());
    }
}
