//! Single sign-on: OIDC ID tokens (JWTs) as credentials.
//!
//! Besides its own API tokens, the hub accepts an ID token issued by the
//! identity provider named in its configuration. [`Oidc`] holds that
//! provider's signing keys (its JWKS, read from a file or an HTTPS URL and
//! re-read every [`JWKS_REFRESH`]) and checks a token offline:
//!
//! - the algorithm is RS256 or ES256, nothing else (`none` and the HMAC
//!   algorithms are refused);
//! - the header's `kid` names the key; a token without `kid` is checked
//!   against the only key of its algorithm, if there is exactly one;
//! - the signature verifies against that key;
//! - `iss` is exactly the configured issuer and `aud` includes the
//!   configured audience;
//! - `exp` is present and has not passed, `nbf` and `iat` are not in the
//!   future, each against the clock the caller passes in, with
//!   [`CLOCK_SKEW_S`] of leeway;
//! - the user is the string claim named in the configuration (`email` by
//!   default; a token with `email_verified: false` is refused), the groups
//!   an optional claim holding a string or a list of strings.
//!
//! Of a JWKS, the RS256 and ES256 (P-256) signing keys are kept; others
//! (encryption keys, other key types, curves or algorithms) are skipped, and
//! a set with no usable key is refused.
//!
//! Every refusal is an [`OidcError`] whose message names what is wrong, and
//! no input panics: tokens, key sets and claims are bounded in size.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::Algorithm;
use serde_json::Value;

mod jwks;
use jwks::{Key, KeySet, fetch, http_client};

/// Largest ID token accepted: real ones are a few KiB even with many
/// groups; the bound keeps a hostile header cheap to refuse.
pub const MAX_JWT_BYTES: usize = 16 * 1024;

/// Largest JWKS document read: a provider publishes a handful of keys, a
/// few KiB; the bound keeps a broken or hostile endpoint from filling memory.
pub const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// Most keys in a JWKS: providers keep two or three during a rotation; a
/// token's `kid` is looked up among them on every request.
pub const MAX_JWKS_KEYS: usize = 64;

/// Most groups one token may carry: each becomes part of the caller's
/// identity on every request, so the list stays small.
pub const MAX_GROUPS: usize = 256;

/// Longest user or group name: an e-mail address is at most 254 characters,
/// the same bound as the hub's own user names.
pub const MAX_NAME_BYTES: usize = 254;

/// Leeway on `exp`, `nbf` and `iat`, in seconds: the clocks of the hub and
/// of the identity provider drift apart a little.
pub const CLOCK_SKEW_S: u64 = 60;

/// How often [`Oidc::spawn_refresh`] re-reads the JWKS by default: a
/// provider announces a new key well before signing with it.
pub const JWKS_REFRESH: Duration = Duration::from_secs(5 * 60);

/// Longest a JWKS download may take, connecting included, so a stalled
/// endpoint never holds up start-up or a refresh for long.
pub const JWKS_TIMEOUT: Duration = Duration::from_secs(10);

/// The claim that names the user when the configuration names none.
pub const DEFAULT_USER_CLAIM: &str = "email";

/// Longest piece of a token (a `kid`, an algorithm, an issuer) repeated in
/// an error message, in characters, so a hostile token cannot flood logs.
const SHOWN_CHARS: usize = 128;

/// Where the hub trusts ID tokens from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcConfig {
    /// The provider's issuer: a token's `iss` must equal it exactly.
    pub issuer: String,
    /// The hub's client ID at the provider: a token's `aud` must include it.
    pub audience: String,
    /// Where the provider's public keys are read from.
    pub jwks: JwksSource,
    /// The string claim that names the user ([`DEFAULT_USER_CLAIM`] unless
    /// set).
    pub user_claim: String,
    /// The claim listing the user's groups (e.g. `groups`); none when unset.
    pub groups_claim: Option<String>,
}

impl OidcConfig {
    /// A configuration with the user in `email` and no groups.
    pub fn new(issuer: impl Into<String>, audience: impl Into<String>, jwks: JwksSource) -> Self {
        OidcConfig {
            issuer: issuer.into(),
            audience: audience.into(),
            jwks,
            user_claim: DEFAULT_USER_CLAIM.to_string(),
            groups_claim: None,
        }
    }
}

/// Where the JWKS (the provider's public signing keys) comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// A local JSON file, re-read on each refresh.
    File(PathBuf),
    /// An HTTP(S) URL, fetched with a GET on each refresh.
    Url(String),
}

impl fmt::Display for JwksSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JwksSource::File(path) => write!(f, "file {}", path.display()),
            JwksSource::Url(url) => f.write_str(url),
        }
    }
}

/// Who a verified ID token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcUser {
    /// The value of the configured user claim.
    pub user: String,
    /// The values of the configured groups claim, in the token's order;
    /// empty when no groups claim is configured or the token has none.
    pub groups: Vec<String>,
    /// The token's issuer (the configured one).
    pub issuer: String,
}

/// Why an ID token or a JWKS was refused.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// The configuration cannot work.
    #[error("the OIDC configuration is invalid: {reason}")]
    Config { reason: String },
    /// The JWKS could not be read, or had no usable key.
    #[error("cannot read the JWKS from {jwks}: {reason}")]
    Jwks { jwks: String, reason: String },
    /// The token is larger than [`MAX_JWT_BYTES`].
    #[error("the ID token is {len} bytes, more than the {MAX_JWT_BYTES} this hub accepts")]
    TooLarge { len: usize },
    /// The token is not a well-formed JWT.
    #[error("the ID token is not a well-formed JWT: {reason}")]
    Malformed { reason: String },
    /// The token is signed with an algorithm other than RS256 or ES256.
    #[error("the ID token's algorithm {alg} is not accepted (RS256 or ES256)")]
    Algorithm { alg: String },
    /// The token's `kid` is not in the JWKS.
    #[error("no key {kid} in the JWKS from {jwks}")]
    UnknownKey { kid: String, jwks: String },
    /// The token has no `kid` and the JWKS has not exactly one key of its
    /// algorithm.
    #[error(
        "the ID token names no key (kid) and the JWKS from {jwks} has {count} {alg} keys, \
         not exactly one"
    )]
    NoKid {
        alg: &'static str,
        count: usize,
        jwks: String,
    },
    /// The token's `kid` names a key of another algorithm.
    #[error("key {kid} of the JWKS is for {key_alg}, the ID token is signed with {alg}")]
    KeyAlgorithm {
        kid: String,
        key_alg: &'static str,
        alg: &'static str,
    },
    /// The signature does not verify.
    #[error("the ID token's signature does not verify against {key}")]
    Signature { key: String },
    /// `iss` is not the configured issuer.
    #[error("the ID token's issuer is {got}, this hub accepts {want}")]
    Issuer { got: String, want: String },
    /// `aud` does not include the configured audience.
    #[error("the ID token's audience [{}] does not include {want}", .got.join(", "))]
    Audience { got: Vec<String>, want: String },
    /// `exp` has passed.
    #[error("the ID token expired at {} (exp {exp}); sign in again", utc(*.exp))]
    Expired { exp: u64 },
    /// `nbf` is in the future.
    #[error(
        "the ID token is not valid before {} (nbf {nbf}); check the clocks of this hub \
         and of the identity provider",
        utc(*.nbf)
    )]
    NotYetValid { nbf: u64 },
    /// `iat` is in the future.
    #[error(
        "the ID token was issued at {} (iat {iat}), after this hub's time; check the clocks \
         of this hub and of the identity provider",
        utc(*.iat)
    )]
    IssuedInFuture { iat: u64 },
    /// A required claim is absent.
    #[error("the ID token has no {claim} claim")]
    MissingClaim { claim: String },
    /// A claim has the wrong JSON type.
    #[error("the ID token's {claim} claim is not {want}")]
    ClaimType { claim: String, want: &'static str },
    /// A claim's value is unusable (empty, too long, control characters).
    #[error("the ID token's {claim} claim {reason}")]
    InvalidClaim { claim: String, reason: String },
    /// More groups than [`MAX_GROUPS`].
    #[error("the ID token's {claim} claim has {count} groups, more than the {MAX_GROUPS} allowed")]
    TooManyGroups { claim: String, count: usize },
    /// The user is an e-mail address the provider has not verified.
    #[error("the ID token's email is not verified (email_verified is false)")]
    EmailNotVerified,
}

/// The provider's verifier: configuration plus the current keys.
pub struct Oidc {
    config: OidcConfig,
    keys: ArcSwap<KeySet>,
    /// Only for [`JwksSource::Url`].
    client: Option<reqwest::Client>,
}

impl fmt::Debug for Oidc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Oidc")
            .field("config", &self.config)
            .field("kids", &self.keys.load().kids())
            .finish_non_exhaustive()
    }
}

impl Oidc {
    /// Checks the configuration and reads the JWKS once; an error names the
    /// source and why. For a URL source this installs rustls' ring crypto
    /// provider as the process default when none is installed yet.
    pub async fn load(config: OidcConfig) -> Result<Oidc, OidcError> {
        for (name, value) in [
            ("issuer", &config.issuer),
            ("audience", &config.audience),
            ("user claim", &config.user_claim),
        ] {
            if value.is_empty() {
                return Err(OidcError::Config {
                    reason: format!("the {name} is empty"),
                });
            }
        }
        if config.groups_claim.as_deref() == Some("") {
            return Err(OidcError::Config {
                reason: "the groups claim is empty".to_string(),
            });
        }
        let client = match &config.jwks {
            JwksSource::File(_) => None,
            JwksSource::Url(_) => Some(http_client().map_err(|reason| OidcError::Jwks {
                jwks: config.jwks.to_string(),
                reason,
            })?),
        };
        let keys = fetch(&config.jwks, client.as_ref()).await?;
        tracing::info!(jwks = %config.jwks, kids = ?keys.kids(), "OIDC keys loaded");
        Ok(Oidc {
            config,
            keys: ArcSwap::from_pointee(keys),
            client,
        })
    }

    /// The configuration this verifier was loaded with.
    pub fn config(&self) -> &OidcConfig {
        &self.config
    }

    /// Re-reads the JWKS and returns how many usable keys it has. On an
    /// error the keys read before stay in use.
    pub async fn refresh(&self) -> Result<usize, OidcError> {
        let keys = fetch(&self.config.jwks, self.client.as_ref()).await?;
        let count = keys.keys.len();
        let old = self.keys.load().kids();
        let new = keys.kids();
        if old != new {
            tracing::info!(jwks = %self.config.jwks, ?old, ?new, "OIDC keys changed");
        }
        self.keys.store(Arc::new(keys));
        Ok(count)
    }

    /// Refreshes the keys every `every` ([`JWKS_REFRESH`] is the usual
    /// choice; held between a second and a day) on the current tokio
    /// runtime. The task holds no strong reference: it ends once the last
    /// `Arc` of the verifier is dropped. A failed refresh is logged and the
    /// old keys stay.
    pub fn spawn_refresh(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let every = every.clamp(Duration::from_secs(1), Duration::from_secs(86_400));
        let this: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(oidc) = this.upgrade() else { return };
                if let Err(e) = oidc.refresh().await {
                    tracing::warn!(error = %e, "OIDC key refresh failed; the old keys stay in use");
                }
            }
        })
    }

    /// Verifies an ID token at `now_s` (seconds since 1970) and returns the
    /// user and groups it names.
    pub fn verify(&self, token: &str, now_s: u64) -> Result<OidcUser, OidcError> {
        if token.len() > MAX_JWT_BYTES {
            return Err(OidcError::TooLarge { len: token.len() });
        }
        let mut parts = token.split('.');
        let (Some(header_b64), Some(payload_b64), Some(signature_b64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed("it is not three segments separated by dots"));
        };
        let header = parse_segment(header_b64, "header")?;
        let alg = match header.get("alg") {
            Some(Value::String(alg)) => alg.as_str(),
            Some(_) => return Err(malformed("its header's alg is not a string")),
            None => return Err(malformed("its header has no alg")),
        };
        let alg = match alg {
            "RS256" => Algorithm::RS256,
            "ES256" => Algorithm::ES256,
            other => {
                return Err(OidcError::Algorithm { alg: shown(other) });
            }
        };
        if header.contains_key("crit") {
            return Err(malformed(
                "its header lists critical extensions (crit), which this hub does not support",
            ));
        }
        let kid = match header.get("kid") {
            None | Some(Value::Null) => None,
            Some(Value::String(kid)) => Some(kid.as_str()),
            Some(_) => return Err(malformed("its header's kid is not a string")),
        };

        let keys = self.keys.load();
        let key = self.select(&keys, alg, kid)?;

        // The signature is checked with jsonwebtoken's primitive rather than
        // its `decode`: the claims are read and checked here, time against
        // `now_s` (not the system clock), each refusal naming its claim.
        let message = &token[..header_b64.len() + 1 + payload_b64.len()];
        let key_name = || match kid {
            Some(kid) => format!("key {} of the JWKS", shown(kid)),
            None => format!("the only {} key of the JWKS", alg_name(alg)),
        };
        match jsonwebtoken::crypto::verify(signature_b64, message.as_bytes(), &key.key, alg) {
            Ok(true) => {}
            Ok(false) => return Err(OidcError::Signature { key: key_name() }),
            Err(e) => match e.kind() {
                jsonwebtoken::errors::ErrorKind::Base64(e) => {
                    return Err(malformed(format!("its signature is not base64url: {e}")));
                }
                _ => return Err(OidcError::Signature { key: key_name() }),
            },
        }
        let claims = parse_segment(payload_b64, "payload")?;
        self.check_claims(&claims, now_s)
    }

    /// The key a token's header names.
    fn select<'k>(
        &self,
        keys: &'k KeySet,
        alg: Algorithm,
        kid: Option<&str>,
    ) -> Result<&'k Key, OidcError> {
        match kid {
            Some(kid) => {
                let mut same_kid = keys.keys.iter().filter(|k| k.kid.as_deref() == Some(kid));
                let first = same_kid.clone().next();
                match same_kid.find(|k| k.alg == alg) {
                    Some(key) => Ok(key),
                    None => Err(match first {
                        Some(other) => OidcError::KeyAlgorithm {
                            kid: shown(kid),
                            key_alg: alg_name(other.alg),
                            alg: alg_name(alg),
                        },
                        None => OidcError::UnknownKey {
                            kid: shown(kid),
                            jwks: self.config.jwks.to_string(),
                        },
                    }),
                }
            }
            None => {
                let mut of_alg = keys.keys.iter().filter(|k| k.alg == alg);
                match (of_alg.next(), of_alg.count()) {
                    (Some(key), 0) => Ok(key),
                    (first, rest) => Err(OidcError::NoKid {
                        alg: alg_name(alg),
                        count: usize::from(first.is_some()) + rest,
                        jwks: self.config.jwks.to_string(),
                    }),
                }
            }
        }
    }

    /// The checks on a signed token's claims.
    fn check_claims(
        &self,
        claims: &serde_json::Map<String, Value>,
        now_s: u64,
    ) -> Result<OidcUser, OidcError> {
        let iss = required_string(claims, "iss")?;
        if iss != self.config.issuer {
            return Err(OidcError::Issuer {
                got: shown(iss),
                want: self.config.issuer.clone(),
            });
        }
        let aud = match claims.get("aud") {
            None | Some(Value::Null) => return Err(missing("aud")),
            Some(Value::String(aud)) => vec![aud.as_str()],
            Some(Value::Array(auds)) => auds
                .iter()
                .map(|a| a.as_str())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| claim_type("aud", "a string or an array of strings"))?,
            Some(_) => return Err(claim_type("aud", "a string or an array of strings")),
        };
        if !aud.contains(&self.config.audience.as_str()) {
            let mut got: Vec<String> = aud.iter().take(8).map(|a| shown(a)).collect();
            if aud.len() > got.len() {
                got.push("…".to_string());
            }
            return Err(OidcError::Audience {
                got,
                want: self.config.audience.clone(),
            });
        }
        let exp = numeric_date(claims, "exp")?.ok_or_else(|| missing("exp"))?;
        if exp.saturating_add(CLOCK_SKEW_S) <= now_s {
            return Err(OidcError::Expired { exp });
        }
        if let Some(nbf) = numeric_date(claims, "nbf")?
            && nbf > now_s.saturating_add(CLOCK_SKEW_S)
        {
            return Err(OidcError::NotYetValid { nbf });
        }
        if let Some(iat) = numeric_date(claims, "iat")?
            && iat > now_s.saturating_add(CLOCK_SKEW_S)
        {
            return Err(OidcError::IssuedInFuture { iat });
        }

        let user_claim = self.config.user_claim.as_str();
        let user = required_string(claims, user_claim)?;
        check_name(user_claim, user)?;
        if user_claim == "email"
            && matches!(claims.get("email_verified"), Some(v) if v == false || v == "false")
        {
            return Err(OidcError::EmailNotVerified);
        }

        let groups = match &self.config.groups_claim {
            None => Vec::new(),
            Some(name) => groups(claims, name)?,
        };
        Ok(OidcUser {
            user: user.to_string(),
            groups,
            issuer: iss.to_string(),
        })
    }
}

/// Whether `token` has the shape of a JWT (three base64url segments, the
/// first starting `eyJ` as an encoded JSON object does), as opposed to one
/// of the hub's `axle_` tokens; it says nothing of validity. The
/// signature segment may be empty, so that an unsigned token reaches
/// [`Oidc::verify`] and is refused there with a clear message.
pub fn looks_like_jwt(token: &str) -> bool {
    let b64url = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    let mut parts = token.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(header), Some(payload), Some(signature), None) => {
            header.starts_with("eyJ")
                && !payload.is_empty()
                && b64url(header)
                && b64url(payload)
                && b64url(signature)
        }
        _ => false,
    }
}

fn parse_segment(segment: &str, what: &str) -> Result<serde_json::Map<String, Value>, OidcError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(segment)
        .map_err(|e| malformed(format!("its {what} is not base64url: {e}")))?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(malformed(format!("its {what} is not a JSON object"))),
        Err(e) => Err(malformed(format!("its {what} is not JSON: {e}"))),
    }
}

fn required_string<'c>(
    claims: &'c serde_json::Map<String, Value>,
    claim: &str,
) -> Result<&'c str, OidcError> {
    match claims.get(claim) {
        None | Some(Value::Null) => Err(missing(claim)),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(claim_type(claim, "a string")),
    }
}

/// A NumericDate claim (seconds since 1970, possibly fractional), rounded
/// down; a negative one is 0.
fn numeric_date(
    claims: &serde_json::Map<String, Value>,
    claim: &str,
) -> Result<Option<u64>, OidcError> {
    let want = "a number of seconds since 1970";
    match claims.get(claim) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
            (Some(u), _) => Ok(Some(u)),
            // `as` saturates: negative to 0, huge to u64::MAX.
            (None, Some(f)) if f.is_finite() => Ok(Some(f as u64)),
            _ => Err(claim_type(claim, want)),
        },
        Some(_) => Err(claim_type(claim, want)),
    }
}

/// A user or group name: 1 to [`MAX_NAME_BYTES`] printable characters
/// without surrounding spaces, as the hub's own user names.
fn check_name(claim: &str, name: &str) -> Result<(), OidcError> {
    let reason = if name.is_empty() {
        "is empty".to_string()
    } else if name.len() > MAX_NAME_BYTES {
        format!("is {} bytes, more than {MAX_NAME_BYTES}", name.len())
    } else if name.chars().any(char::is_control) {
        "has control characters".to_string()
    } else if name.trim() != name {
        "has surrounding spaces".to_string()
    } else {
        return Ok(());
    };
    Err(OidcError::InvalidClaim {
        claim: claim.to_string(),
        reason,
    })
}

fn groups(claims: &serde_json::Map<String, Value>, claim: &str) -> Result<Vec<String>, OidcError> {
    let want = "a string or an array of strings";
    let values: Vec<&str> = match claims.get(claim) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(group)) => vec![group.as_str()],
        Some(Value::Array(groups)) => {
            if groups.len() > MAX_GROUPS {
                return Err(OidcError::TooManyGroups {
                    claim: claim.to_string(),
                    count: groups.len(),
                });
            }
            groups
                .iter()
                .map(|g| g.as_str())
                .collect::<Option<_>>()
                .ok_or_else(|| claim_type(claim, want))?
        }
        Some(_) => return Err(claim_type(claim, want)),
    };
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(values.len());
    for group in values {
        check_name(claim, group)?;
        if seen.insert(group) {
            out.push(group.to_string());
        }
    }
    Ok(out)
}

fn malformed(reason: impl Into<String>) -> OidcError {
    OidcError::Malformed {
        reason: reason.into(),
    }
}

fn missing(claim: &str) -> OidcError {
    OidcError::MissingClaim {
        claim: claim.to_string(),
    }
}

fn claim_type(claim: &str, want: &'static str) -> OidcError {
    OidcError::ClaimType {
        claim: claim.to_string(),
        want,
    }
}

fn alg_name(alg: Algorithm) -> &'static str {
    match alg {
        Algorithm::RS256 => "RS256",
        Algorithm::ES256 => "ES256",
        _ => "other",
    }
}

/// A piece of an untrusted token for a message: at most [`SHOWN_CHARS`]
/// characters, control characters escaped.
fn shown(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == SHOWN_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Seconds since 1970 as a UTC date and time, `2026-09-21T14:13:20Z`.
fn utc(s: u64) -> String {
    let days = (s / 86_400) as i64;
    let rem = s % 86_400;
    let (hour, min, sec) = (rem / 3600, rem / 60 % 60, rem % 60);
    // Days to a civil date (proleptic Gregorian), after H. Hinnant.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{min:02}:{sec:02}Z")
}

#[cfg(test)]
mod tests;
