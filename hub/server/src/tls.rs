//! TLS for the hub's APIs from PEM files (`--tls-cert`, `--tls-key`): one certificate chain
//! and key serve both the HTTP API and gRPC (spokes and the user API). rustls with the ring
//! provider; nothing here touches OpenSSL.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A TLS handshake must finish within this time, as a request header must (see
/// `http_serve::DEFAULT_HEADER_READ_TIMEOUT`): a client that stalls it holds a connection.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest certificate or key file read: a chain of a few certificates is a few KiB.
pub const MAX_PEM_BYTES: u64 = 1 << 20;

/// The hub's serving certificate and key, checked when loaded.
#[derive(Clone)]
pub struct ServerTls {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    /// For the HTTP API (ALPN h2 and http/1.1).
    http: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs and debug output.
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

/// Reads a PEM file of at most [`MAX_PEM_BYTES`]; `flag` names it in errors.
pub fn read_pem(flag: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("{flag} {}: cannot read it", path.display()))?
        .len();
    if len > MAX_PEM_BYTES {
        anyhow::bail!(
            "{flag} {}: {len} bytes, more than a PEM file of {MAX_PEM_BYTES} bytes",
            path.display()
        );
    }
    std::fs::read(path).with_context(|| format!("{flag} {}: cannot read it", path.display()))
}

impl ServerTls {
    /// From `--tls-cert` and `--tls-key` files.
    pub fn from_files(cert: &Path, key: &Path) -> anyhow::Result<ServerTls> {
        let cert_pem = read_pem("--tls-cert", cert)?;
        let key_pem = read_pem("--tls-key", key)?;
        Self::from_pem(cert_pem, key_pem).with_context(|| {
            format!(
                "--tls-cert {} / --tls-key {}: not a usable certificate and key",
                cert.display(),
                key.display()
            )
        })
    }

    /// From PEM: a certificate chain (the hub's first) and its private key.
    pub fn from_pem(cert_pem: Vec<u8>, key_pem: Vec<u8>) -> anyhow::Result<ServerTls> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("the certificate PEM: {e}"))?;
        if chain.is_empty() {
            anyhow::bail!("the certificate PEM holds no certificate");
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| anyhow::anyhow!("the key PEM: {e}"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut http = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .context("the key does not match the certificate, or is of a kind TLS cannot use")?;
        http.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            cert_pem,
            key_pem,
            http: Arc::new(http),
        })
    }

    /// The acceptor of the HTTP API.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.http.clone())
    }

    /// The same certificate for the gRPC listener (`grpc_serve.rs`): ALPN
    /// h2 only; with `client_ca` (PEM), clients may present a certificate it
    /// issued (spoke mTLS), and those without one are still served (users,
    /// and spokes joining).
    pub fn grpc_config(
        &self,
        client_ca: Option<&str>,
    ) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&self.cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("the certificate PEM: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(&self.key_pem)
            .map_err(|e| anyhow::anyhow!("the key PEM: {e}"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                    roots
                        .add(c.map_err(|e| anyhow::anyhow!("the spoke CA PEM: {e}"))?)
                        .context("the spoke CA certificate")?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .allow_unauthenticated()
                .build()
                .context("the spoke CA as a client verifier")?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut cfg = builder
            .with_single_cert(chain, key)
            .context("the key does not match the certificate")?;
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(cfg))
    }
}
