//! Cloud GPU providers Axle bursts to, behind one [`Provider`] trait.
//!
//! Each adapter (a cargo feature, all on by default) turns one provider's API
//! into the same five calls: the **catalog** of GPU offers with their hourly
//! price, **launch** an instance with Axle's tags, a name unique to the launch
//! and user-data carrying the spoke's one-time join token, **list** the
//! instances carrying a tag, **describe** one, and **terminate** one.
//!
//! Every failure is a [`ProviderError`] that says whether trying again can
//! help ([`ProviderError::Retryable`]: no capacity, throttling with the
//! provider's Retry-After, a server error or a timeout) or not
//! ([`ProviderError::Permanent`]: bad credentials, an invalid request).
//! Providers without an idempotency key (RunPod, Lambda) get a unique name per
//! launch, and the caller lists by tag before it retries a launch.
//!
//! Credentials come from the environment or from `*_FILE` paths
//! ([`credentials::secret`]); they are never logged, never part of an error,
//! and never stored.

use std::collections::BTreeMap;
use std::time::Duration;

use axle_policy::Usd;
use futures::future::BoxFuture;

pub mod credentials;

#[cfg(feature = "aws")]
pub mod aws;
#[cfg(feature = "lambda")]
pub mod lambda;
#[cfg(feature = "runpod")]
pub mod runpod;

/// The tag every instance Axle launches carries, with [`MANAGED_BY_VALUE`]:
/// what the orphan reaper lists by.
pub const TAG_MANAGED_BY: &str = "axle-managed-by";
pub const MANAGED_BY_VALUE: &str = "axle";
/// The tag naming the hub (its store) that launched the instance, so two hubs
/// sharing an account never reap each other's instances.
pub const TAG_HUB: &str = "axle-hub";
/// The tag carrying the burst instance's id in the hub's ledger.
pub const TAG_BURST_ID: &str = "axle-burst-id";

/// Longest a provider call may take before it counts as failed (and
/// retryable): providers answer in a second or two, a launch in a few.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest answer read from a provider: a catalog or an instance list is a
/// few hundred KiB at most.
pub const MAX_RESPONSE_BYTES: usize = 8 << 20;

/// One kind of instance a provider offers in one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// The adapter's kind (`aws`, `runpod`, `lambda`).
    pub provider: &'static str,
    /// The provider's name for it (`p5.48xlarge`, `gpu_1x_a100`, a RunPod GPU type id).
    pub instance_type: String,
    /// Axle's GPU class (`H100`, `A100`, …).
    pub gpu_model: String,
    pub gpus: u32,
    /// Memory per GPU.
    pub gpu_memory_mb: u64,
    pub region: String,
    pub price_per_hour: Usd,
    /// Spot or interruptible capacity: cheaper, and may be taken back.
    pub spot: bool,
    /// Whether the provider says it has capacity now (unknown: true).
    pub available: bool,
}

/// What to launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    /// Unique per launch and stable across its retries: EC2's ClientToken,
    /// and the instance name on providers without one.
    pub idempotency_key: String,
    pub instance_type: String,
    pub region: String,
    pub spot: bool,
    /// Axle's tags ([`TAG_MANAGED_BY`], [`TAG_HUB`], [`TAG_BURST_ID`]).
    pub tags: BTreeMap<String, String>,
    /// Boot script (cloud-init user-data) that starts `axle-spoke` with its
    /// one-time join token.
    pub user_data: String,
    /// A machine image or container image, where the provider takes one.
    pub image: Option<String>,
}

/// Where a provider's instance is in its life, as the provider says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceState {
    Pending,
    Running,
    /// Being stopped or terminated.
    Stopping,
    Terminated,
    /// Running, but the provider has given notice that it takes the
    /// capacity back at `at_ms` (milliseconds since the Unix epoch): EC2's
    /// two-minute spot interruption notice.
    Interrupting {
        at_ms: u64,
    },
    /// Spot capacity taken back.
    Interrupted,
    /// A state this adapter does not know, as the provider named it.
    Other(String),
}

/// One instance as the provider lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub id: String,
    /// The instance's name (the launch's idempotency key on providers that
    /// have no tags to match).
    pub name: String,
    pub instance_type: String,
    pub region: String,
    pub state: InstanceState,
    pub tags: BTreeMap<String, String>,
}

impl Instance {
    /// Whether Axle launched it (it carries [`TAG_MANAGED_BY`]).
    pub fn is_axles(&self) -> bool {
        self.tags.get(TAG_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY_VALUE)
    }
}

/// Why a provider call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// Trying again (later, or elsewhere) can work.
    #[error("{provider}: {reason}{}", retry_after.map(|d| format!(" (retry after {} s)", d.as_secs())).unwrap_or_default())]
    Retryable {
        provider: &'static str,
        reason: String,
        /// The provider has no capacity for this offer: try the next one.
        capacity: bool,
        /// The provider's Retry-After, when it gave one.
        retry_after: Option<Duration>,
    },
    /// Trying again cannot work until someone changes something.
    #[error("{provider}: {reason}")]
    Permanent {
        provider: &'static str,
        reason: String,
    },
}

impl ProviderError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, ProviderError::Retryable { .. })
    }

    /// No capacity for this offer: the next offer may have some.
    pub fn is_capacity(&self) -> bool {
        matches!(self, ProviderError::Retryable { capacity: true, .. })
    }

    pub fn retryable(provider: &'static str, reason: impl Into<String>) -> ProviderError {
        ProviderError::Retryable {
            provider,
            reason: reason.into(),
            capacity: false,
            retry_after: None,
        }
    }

    pub fn capacity(provider: &'static str, reason: impl Into<String>) -> ProviderError {
        ProviderError::Retryable {
            provider,
            reason: reason.into(),
            capacity: true,
            retry_after: None,
        }
    }

    pub fn permanent(provider: &'static str, reason: impl Into<String>) -> ProviderError {
        ProviderError::Permanent {
            provider,
            reason: reason.into(),
        }
    }
}

/// One cloud provider account. Implementations are cheap to share
/// (`Arc<dyn Provider>`) and bound every call by [`CALL_TIMEOUT`].
pub trait Provider: Send + Sync {
    /// `aws`, `runpod` or `lambda`.
    fn kind(&self) -> &'static str;

    /// The GPU offers, with prices and, where the provider says, availability.
    fn catalog(&self) -> BoxFuture<'_, Result<Vec<Offer>, ProviderError>>;

    /// Launches one instance; the same `idempotency_key` never launches two
    /// (EC2: ClientToken; others: the caller lists before a retry).
    fn launch<'a>(&'a self, spec: &'a LaunchSpec)
    -> BoxFuture<'a, Result<Instance, ProviderError>>;

    /// Every instance carrying tag `key` = `value`, in every region the
    /// adapter serves.
    fn list<'a>(
        &'a self,
        key: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>>;

    /// One instance by id; `None` when the provider no longer knows it.
    fn describe<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>>;

    /// Terminates an instance; terminating one that is already gone succeeds.
    fn terminate<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>>;
}

/// A retryable or permanent error from an HTTP status, for the REST adapters:
/// 429 and 5xx are retryable (with the Retry-After header's seconds), 401/403
/// and other 4xx are permanent.
pub fn http_error(
    provider: &'static str,
    status: u16,
    retry_after: Option<&str>,
    what: &str,
    body: &str,
) -> ProviderError {
    let detail: String = body.chars().take(300).collect();
    let reason = format!("{what}: HTTP {status}: {}", detail.trim());
    match status {
        429 | 500..=599 => ProviderError::Retryable {
            provider,
            reason,
            capacity: false,
            retry_after: retry_after
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs),
        },
        401 | 403 => ProviderError::permanent(
            provider,
            format!("{what}: HTTP {status}: the credentials were refused; check the API key"),
        ),
        _ => ProviderError::permanent(provider, reason),
    }
}

/// A reqwest client with Axle's timeouts (rustls with ring; the process
/// installs the provider).
pub fn http_client(provider: &'static str) -> Result<reqwest::Client, ProviderError> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    reqwest::Client::builder()
        .timeout(CALL_TIMEOUT)
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("axle-burst/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| {
            ProviderError::permanent(provider, format!("cannot build an HTTP client: {e}"))
        })
}

/// One answer of a REST provider, read whole: its status, Retry-After header
/// and body (at most [`MAX_RESPONSE_BYTES`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<String>,
    pub body: String,
}

impl Answer {
    pub async fn read(
        provider: &'static str,
        resp: reqwest::Response,
    ) -> Result<Answer, ProviderError> {
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = read_body(provider, resp).await?;
        Ok(Answer {
            status,
            retry_after,
            body,
        })
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// A response body of at most [`MAX_RESPONSE_BYTES`], as text.
pub async fn read_body(
    provider: &'static str,
    mut resp: reqwest::Response,
) -> Result<String, ProviderError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| ProviderError::retryable(provider, format!("reading the answer: {e}")))?
    {
        if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(ProviderError::retryable(
                provider,
                format!("the answer is larger than {MAX_RESPONSE_BYTES} bytes"),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body)
        .map_err(|_| ProviderError::retryable(provider, "the answer is not UTF-8"))
}

/// A network failure (connect, timeout) as a retryable error; never includes
/// the request, which carries credentials.
pub fn transport_error(provider: &'static str, what: &str, e: &reqwest::Error) -> ProviderError {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    ProviderError::retryable(provider, format!("{what}: {kind}"))
}

/// Axle's GPU class of a provider's GPU name (`NVIDIA H100 80GB HBM3` → `H100`).
pub fn gpu_class(name: &str) -> String {
    let upper = name.to_ascii_uppercase();
    for class in [
        "GH200", "H200", "H100", "B200", "A100", "A10G", "A6000", "A40", "A10", "L40S", "L40",
        "L4", "V100", "T4", "RTX 4090", "RTX 3090",
    ] {
        if upper.contains(class) {
            return class.replace(' ', "");
        }
    }
    name.split_whitespace()
        .last()
        .unwrap_or(name)
        .to_ascii_uppercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_statuses_say_whether_to_retry() {
        let e = http_error("lambda", 429, Some("7"), "launch", "slow down");
        assert!(e.is_retryable());
        assert_eq!(
            e,
            ProviderError::Retryable {
                provider: "lambda",
                reason: "launch: HTTP 429: slow down".into(),
                capacity: false,
                retry_after: Some(Duration::from_secs(7)),
            }
        );
        assert!(http_error("lambda", 503, None, "x", "").is_retryable());
        assert!(!http_error("lambda", 401, None, "x", "secret-echo").is_retryable());
        assert!(
            !http_error("lambda", 401, None, "x", "secret-echo")
                .to_string()
                .contains("secret-echo")
        );
        assert!(!http_error("lambda", 400, None, "x", "").is_retryable());
    }

    #[test]
    fn gpu_names_map_to_classes() {
        assert_eq!(gpu_class("NVIDIA H100 80GB HBM3"), "H100");
        assert_eq!(gpu_class("NVIDIA A100-SXM4-80GB"), "A100");
        assert_eq!(gpu_class("NVIDIA GeForce RTX 4090"), "RTX4090");
        assert_eq!(gpu_class("A10G"), "A10G");
        assert_eq!(gpu_class("NVIDIA L40S"), "L40S");
    }
}
