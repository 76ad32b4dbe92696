//! The identity provider's signing keys: a JWKS read from a file or a URL,
//! bounded in size, keeping only the RS256 and ES256 signing keys.

use base64::Engine as _;
use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use serde_json::Value;
use tokio::io::AsyncReadExt as _;

use super::*;

/// One usable key of the JWKS.
pub(super) struct Key {
    pub kid: Option<String>,
    pub alg: Algorithm,
    pub key: DecodingKey,
}

/// The usable keys of one JWKS read.
pub(super) struct KeySet {
    pub keys: Vec<Key>,
}

impl KeySet {
    pub(super) fn kids(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|k| k.kid.clone().unwrap_or_else(|| "(no kid)".to_string()))
            .collect()
    }
}

/// A reqwest client for the JWKS: bounded in time, rustls with ring.
pub(super) fn http_client() -> Result<reqwest::Client, String> {
    // reqwest built without a crypto provider takes the process default and
    // panics without one; the rest of the hub passes ring explicitly.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: one is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    reqwest::Client::builder()
        .timeout(JWKS_TIMEOUT)
        .connect_timeout(JWKS_TIMEOUT)
        .user_agent(concat!("axle-hub/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| error_chain(&e))
}

/// Reads and parses the JWKS.
pub(super) async fn fetch(
    source: &JwksSource,
    client: Option<&reqwest::Client>,
) -> Result<KeySet, OidcError> {
    let body = match (source, client) {
        (JwksSource::File(path), _) => read_file(path).await,
        (JwksSource::Url(url), Some(client)) => read_url(client, url).await,
        (JwksSource::Url(_), None) => Err("no HTTP client".to_string()),
    };
    body.and_then(|body| parse_jwks(&body))
        .map_err(|reason| OidcError::Jwks {
            jwks: source.to_string(),
            reason,
        })
}

pub(super) async fn read_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    file.take(MAX_JWKS_BYTES as u64 + 1)
        .read_to_end(&mut body)
        .await
        .map_err(|e| e.to_string())?;
    if body.len() > MAX_JWKS_BYTES {
        return Err(format!("it is larger than {MAX_JWKS_BYTES} bytes"));
    }
    Ok(body)
}

pub(super) async fn read_url(client: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let mut response = client
        .get(url)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| error_chain(&e))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("the server answered HTTP {status}"));
    }
    if let Some(len) = response.content_length()
        && len > MAX_JWKS_BYTES as u64
    {
        return Err(format!(
            "the body is {len} bytes, more than {MAX_JWKS_BYTES}"
        ));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| error_chain(&e))? {
        if body.len() + chunk.len() > MAX_JWKS_BYTES {
            return Err(format!("the body is more than {MAX_JWKS_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An error and its causes, `outer: inner: …`.
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// The fields of a JWK this hub reads; the others are ignored.
#[derive(Deserialize)]
pub(super) struct RawJwk {
    kty: Option<String>,
    kid: Option<String>,
    alg: Option<String>,
    #[serde(rename = "use")]
    use_: Option<String>,
    key_ops: Option<Vec<String>>,
    n: Option<String>,
    e: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

/// Parses a JWKS, keeping the RS256 and ES256 signing keys and skipping
/// the others (encryption keys, other key types and curves).
pub(super) fn parse_jwks(body: &[u8]) -> Result<KeySet, String> {
    #[derive(Deserialize)]
    struct RawJwks {
        keys: Vec<Value>,
    }
    let raw: RawJwks = serde_json::from_slice(body)
        .map_err(|e| format!("it is not a JWKS (a JSON object with a keys array): {e}"))?;
    if raw.keys.len() > MAX_JWKS_KEYS {
        return Err(format!(
            "it has {} keys, more than the {MAX_JWKS_KEYS} allowed",
            raw.keys.len()
        ));
    }
    let mut keys = Vec::new();
    let mut skipped = Vec::new();
    for (i, value) in raw.keys.into_iter().enumerate() {
        let jwk = match RawJwk::deserialize(value) {
            Ok(jwk) => jwk,
            Err(e) => {
                skipped.push(format!("key {i}: {e}"));
                continue;
            }
        };
        let name = match &jwk.kid {
            Some(kid) => format!("key {}", shown(kid)),
            None => format!("key {i}"),
        };
        match parse_jwk(&jwk) {
            Ok(key) => keys.push(key),
            Err(why) => skipped.push(format!("{name}: {why}")),
        }
    }
    for why in &skipped {
        tracing::debug!("JWKS: skipped {why}");
    }
    if keys.is_empty() {
        let why = if skipped.is_empty() {
            "it has no keys".to_string()
        } else {
            format!(
                "it has no usable RS256 or ES256 signing key (skipped {})",
                skipped.join("; ")
            )
        };
        return Err(why);
    }
    Ok(KeySet { keys })
}

pub(super) fn parse_jwk(jwk: &RawJwk) -> Result<Key, String> {
    if let Some(use_) = &jwk.use_
        && use_ != "sig"
    {
        return Err(format!("its use is {}, not sig", shown(use_)));
    }
    if let Some(ops) = &jwk.key_ops
        && !ops.iter().any(|op| op == "verify")
    {
        return Err("its key_ops do not include verify".to_string());
    }
    let field = |value: &Option<String>, name: &str| {
        value
            .as_deref()
            .ok_or_else(|| format!("it has no {name}"))
            .and_then(|v| b64_decode(v).map_err(|e| format!("its {name} is not base64url: {e}")))
    };
    let (alg, key) = match jwk.kty.as_deref() {
        Some("RSA") => {
            check_alg(jwk, "RS256")?;
            let n = field(&jwk.n, "n")?;
            let e = field(&jwk.e, "e")?;
            let n = strip_zeros(&n);
            let e = strip_zeros(&e);
            let bits = n
                .first()
                .map_or(0, |b| (n.len() - 1) * 8 + (8 - b.leading_zeros() as usize));
            if !(2048..=8192).contains(&bits) {
                return Err(format!(
                    "its modulus has {bits} bits (2048 to 8192 accepted)"
                ));
            }
            if e.is_empty() || e.len() > 4 {
                return Err("its exponent is out of range".to_string());
            }
            (Algorithm::RS256, DecodingKey::from_rsa_raw_components(n, e))
        }
        Some("EC") => {
            check_alg(jwk, "ES256")?;
            match jwk.crv.as_deref() {
                Some("P-256") => {}
                Some(crv) => {
                    return Err(format!("its curve {} is not supported (P-256)", shown(crv)));
                }
                None => return Err("it has no crv".to_string()),
            }
            let x = field(&jwk.x, "x")?;
            let y = field(&jwk.y, "y")?;
            if x.len() != 32 || y.len() != 32 {
                return Err("its x and y are not 32 bytes each".to_string());
            }
            let key = DecodingKey::from_ec_components(
                &URL_SAFE_NO_PAD.encode(&x),
                &URL_SAFE_NO_PAD.encode(&y),
            )
            .map_err(|e| e.to_string())?;
            (Algorithm::ES256, key)
        }
        Some(kty) => {
            return Err(format!(
                "its kty {} is not supported (RSA or EC)",
                shown(kty)
            ));
        }
        None => return Err("it has no kty".to_string()),
    };
    Ok(Key {
        kid: jwk.kid.clone(),
        alg,
        key,
    })
}

pub(super) fn check_alg(jwk: &RawJwk, want: &str) -> Result<(), String> {
    match jwk.alg.as_deref() {
        None => Ok(()),
        Some(alg) if alg == want => Ok(()),
        Some(alg) => Err(format!("its alg {} is not accepted ({want})", shown(alg))),
    }
}

/// Base64url, with or without padding.
pub(super) fn b64_decode(s: &str) -> Result<Vec<u8>, base64::DecodeError> {
    if s.ends_with('=') {
        URL_SAFE.decode(s)
    } else {
        URL_SAFE_NO_PAD.decode(s)
    }
}

pub(super) fn strip_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    &bytes[first..]
}
