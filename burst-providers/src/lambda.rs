//! Lambda Cloud (`https://cloud.lambda.ai/api/v1`) as a burst provider.
//!
//! Every call carries `Authorization: Bearer <API key>`, is bounded by
//! [`CALL_TIMEOUT`] and reads at most [`crate::MAX_RESPONSE_BYTES`] of answer.
//! Calls are paced to Lambda's published limits ([`MIN_CALL_INTERVAL`] between
//! any two calls, [`MIN_LAUNCH_INTERVAL`] between two launches); a call whose
//! turn is more than [`MAX_PACING_WAIT`] away fails retryable, with the wait
//! as its retry-after, instead of queueing without bound.
//!
//! - **catalog**: `GET /instance-types` gives one [`Offer`] per instance type
//!   and region Lambda lists in `regions_with_capacity_available` (only the
//!   configured regions, when some are configured). The price is
//!   `price_cents_per_hour`, exact. Types without GPUs are left out. Lambda
//!   has no spot capacity, so every offer is on-demand and available.
//! - **launch**: `POST /instance-operations/launch` with one instance, the SSH
//!   key configured with [`Lambda::with_ssh_key_name`] (Lambda requires exactly
//!   one), the launch's idempotency key as the instance **name**, the
//!   user-data, Axle's tags as `[{key, value}]` and the image if one is given.
//!   Lambda has no idempotency key: a caller whose launch answer was lost
//!   lists (see below) before it launches again.
//! - **list**: `GET /instances`, every region. An instance Lambda returns with
//!   a `tags` field matches `key` = `value` on its tags and on nothing else. An
//!   instance returned without a `tags` field (an API that predates instance
//!   tags) matches when its name is exactly `value` and `key` is neither
//!   [`TAG_MANAGED_BY`] nor [`TAG_HUB`] (whose values many instances share):
//!   Axle names every instance with its launch's idempotency key, so listing
//!   by that key (say under [`crate::TAG_BURST_ID`]) finds the first launch.
//!   Such an instance comes back with no tags, so [`Instance::is_axles`] is
//!   false for it.
//! - **describe**: `GET /instances/{id}`; 404 is `None`.
//! - **terminate**: `POST /instance-operations/terminate`; an instance Lambda
//!   no longer knows (404), or that a follow-up describe shows gone or
//!   terminated, counts as terminated.
//!
//! Lambda's error codes decide what failed: `…/insufficient-capacity` is
//! [`ProviderError::capacity`] (try the next offer), `global/quota-exceeded`
//! is permanent, everything else follows [`http_error`]. The API key is cut
//! out of any answer text that ends up in an error.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use axle_policy::Usd;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::credentials::{self, Secret};
use crate::{
    CALL_TIMEOUT, Instance, InstanceState, LaunchSpec, Offer, Provider, ProviderError, TAG_HUB,
    TAG_MANAGED_BY, gpu_class, http_client, http_error, read_body, transport_error,
};

const KIND: &str = "lambda";

/// Lambda Cloud's API root.
pub const DEFAULT_BASE_URL: &str = "https://cloud.lambda.ai/api/v1";

/// The variable holding the API key (or `LAMBDA_API_KEY_FILE`, a file holding it).
pub const API_KEY_VAR: &str = "LAMBDA_API_KEY";

/// The variable naming the SSH key (registered in the Lambda account) that
/// instances are launched with.
pub const SSH_KEY_NAME_VAR: &str = "LAMBDA_SSH_KEY_NAME";

/// Shortest gap between two calls to the API: Lambda allows about one
/// request a second per account.
pub const MIN_CALL_INTERVAL: Duration = Duration::from_secs(1);

/// Shortest gap between two launches: Lambda allows one launch request every
/// ten seconds.
pub const MIN_LAUNCH_INTERVAL: Duration = Duration::from_secs(10);

/// Longest a call waits for its turn under the pacing: as long as a call
/// itself may take; a longer queue means the hub is asking faster than Lambda
/// answers, and the caller is better told to come back.
pub const MAX_PACING_WAIT: Duration = CALL_TIMEOUT;

/// Longest instance name Lambda accepts (its `instanceName` schema), and so
/// the longest idempotency key a launch can carry.
pub const MAX_NAME_CHARS: usize = 64;

/// Longest SSH key name Lambda accepts (its `sshKeyName` schema).
pub const MAX_SSH_KEY_NAME_CHARS: usize = 64;

/// Largest user-data Lambda accepts: "cannot exceed 1MB", read as the
/// smaller, decimal megabyte.
pub const MAX_USER_DATA_BYTES: usize = 1_000_000;

/// Longest tag key Lambda accepts.
pub const MAX_TAG_KEY_CHARS: usize = 55;

/// Longest tag value Lambda accepts.
pub const MAX_TAG_VALUE_CHARS: usize = 128;

/// Highest hourly price read from the catalog, in cents: $1,000,000 an hour is
/// far above any instance Lambda rents, and keeps the conversion to [`Usd`]
/// far from overflowing; a higher price is a broken answer.
pub const MAX_PRICE_CENTS_PER_HOUR: u64 = 100_000_000;

/// Longest instance id accepted: Lambda's ids are 32 hex digits; anything
/// much longer is not one.
pub const MAX_ID_CHARS: usize = 128;

/// Longest provider message quoted in an error.
const MAX_QUOTED_CHARS: usize = 300;

/// One Lambda Cloud account.
#[derive(Debug)]
pub struct Lambda {
    base: reqwest::Url,
    api_key: Secret,
    regions: Vec<String>,
    ssh_key_name: Option<String>,
    client: reqwest::Client,
    pacing: Pacing,
}

impl Lambda {
    /// An account at `base_url` (normally [`DEFAULT_BASE_URL`]) serving
    /// `regions` (empty: every region). Launching also needs an SSH key name
    /// ([`Lambda::with_ssh_key_name`]).
    pub fn new(
        base_url: impl Into<String>,
        api_key: Secret,
        regions: Vec<String>,
    ) -> Result<Lambda, ProviderError> {
        let base_url = base_url.into();
        let base = reqwest::Url::parse(base_url.trim().trim_end_matches('/'))
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .ok_or_else(|| ProviderError::permanent(KIND, "the base URL is not an http(s) URL"))?;
        if api_key.expose().is_empty()
            || reqwest::header::HeaderValue::from_str(&format!("Bearer {}", api_key.expose()))
                .is_err()
        {
            return Err(ProviderError::permanent(
                KIND,
                "the API key is empty or holds characters an HTTP header cannot carry",
            ));
        }
        Ok(Lambda {
            base,
            api_key,
            regions,
            ssh_key_name: None,
            client: http_client(KIND)?,
            pacing: Pacing::new(MIN_CALL_INTERVAL, MIN_LAUNCH_INTERVAL),
        })
    }

    /// The account whose key is in `LAMBDA_API_KEY` (or the file
    /// `LAMBDA_API_KEY_FILE` names), at [`DEFAULT_BASE_URL`], launching with
    /// the SSH key `LAMBDA_SSH_KEY_NAME` names when it is set.
    pub fn from_env(regions: Vec<String>) -> Result<Lambda, ProviderError> {
        let key = credentials::secret(API_KEY_VAR)
            .map_err(|e| ProviderError::permanent(KIND, e.to_string()))?;
        let lambda = Lambda::new(DEFAULT_BASE_URL, key, regions)?;
        Ok(
            match std::env::var(SSH_KEY_NAME_VAR)
                .ok()
                .filter(|v| !v.trim().is_empty())
            {
                Some(name) => lambda.with_ssh_key_name(name.trim()),
                None => lambda,
            },
        )
    }

    /// The SSH key (by its name in the Lambda account) every instance is
    /// launched with; Lambda launches nothing without exactly one.
    pub fn with_ssh_key_name(mut self, name: impl Into<String>) -> Lambda {
        self.ssh_key_name = Some(name.into());
        self
    }

    /// Paces calls `call` apart and launches `launch` apart instead of
    /// [`MIN_CALL_INTERVAL`] and [`MIN_LAUNCH_INTERVAL`] (an account with
    /// other limits, or a test).
    pub fn with_pacing(mut self, call: Duration, launch: Duration) -> Lambda {
        self.pacing = Pacing::new(call, launch);
        self
    }

    fn url(&self, segments: &[&str]) -> Result<reqwest::Url, ProviderError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| ProviderError::permanent(KIND, "the base URL cannot take a path"))?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }

    async fn send(
        &self,
        what: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<Answer, ProviderError> {
        self.pacing.turn(what, &self.pacing.call).await?;
        let resp = request
            .bearer_auth(self.api_key.expose())
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| transport_error(KIND, what, &e))?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = read_body(KIND, resp).await?;
        Ok(Answer {
            status,
            retry_after,
            body,
        })
    }

    async fn get(&self, what: &str, segments: &[&str]) -> Result<Answer, ProviderError> {
        let url = self.url(segments)?;
        self.send(what, self.client.get(url)).await
    }

    async fn post(
        &self,
        what: &str,
        segments: &[&str],
        body: &Value,
    ) -> Result<Answer, ProviderError> {
        let url = self.url(segments)?;
        self.send(what, self.client.post(url).json(body)).await
    }

    /// The error an unsuccessful answer stands for.
    fn error(&self, what: &str, answer: &Answer) -> ProviderError {
        let body = redact(&answer.body, self.api_key.expose());
        if let Some((code, message)) = api_error(&body) {
            let quoted: String = message.chars().take(MAX_QUOTED_CHARS).collect();
            let reason = format!("{what}: HTTP {}: {code}: {}", answer.status, quoted.trim());
            if code.contains("insufficient-capacity") {
                return ProviderError::capacity(KIND, reason);
            }
            if code.contains("quota-exceeded") {
                return ProviderError::permanent(KIND, reason);
            }
        }
        http_error(
            KIND,
            answer.status,
            answer.retry_after.as_deref(),
            what,
            &body,
        )
    }

    fn json(&self, what: &str, answer: &Answer) -> Result<Value, ProviderError> {
        serde_json::from_str(&answer.body).map_err(|e| {
            ProviderError::retryable(KIND, format!("{what}: the answer is not JSON: {e}"))
        })
    }

    async fn describe_instance(&self, id: &str) -> Result<Option<Instance>, ProviderError> {
        const WHAT: &str = "describing an instance";
        check_id(WHAT, id)?;
        let answer = self.get(WHAT, &["instances", id]).await?;
        if answer.status == 404 {
            return Ok(None);
        }
        if !answer.is_success() {
            return Err(self.error(WHAT, &answer));
        }
        let v = self.json(WHAT, &answer)?;
        let data = v
            .get("data")
            .ok_or_else(|| malformed(WHAT, "it has no data"))?;
        Ok(Some(parse_instance(WHAT, data)?.instance))
    }

    async fn terminate_instance(&self, id: &str) -> Result<(), ProviderError> {
        const WHAT: &str = "terminating an instance";
        check_id(WHAT, id)?;
        let answer = self
            .post(
                WHAT,
                &["instance-operations", "terminate"],
                &json!({ "instance_ids": [id] }),
            )
            .await?;
        if answer.is_success() || answer.status == 404 {
            return Ok(());
        }
        let err = self.error(WHAT, &answer);
        // Lambda may refuse to terminate an instance that is already gone or
        // terminated; ask which before calling it a failure.
        if !err.is_retryable() && !matches!(answer.status, 401 | 403) {
            match self.describe_instance(id).await {
                Ok(None) => return Ok(()),
                Ok(Some(i)) if i.state == InstanceState::Terminated => return Ok(()),
                _ => {}
            }
        }
        Err(err)
    }

    async fn launch_instance(&self, spec: &LaunchSpec) -> Result<Instance, ProviderError> {
        const WHAT: &str = "launching an instance";
        let body = self.launch_body(spec)?;
        self.pacing.turn(WHAT, &self.pacing.launch).await?;
        tracing::info!(
            name = %spec.idempotency_key,
            instance_type = %spec.instance_type,
            region = %spec.region,
            "launching a Lambda instance"
        );
        let answer = self
            .post(WHAT, &["instance-operations", "launch"], &body)
            .await?;
        if !answer.is_success() {
            return Err(self.error(WHAT, &answer));
        }
        let v = self.json(WHAT, &answer)?;
        let ids = v
            .pointer("/data/instance_ids")
            .and_then(Value::as_array)
            .ok_or_else(|| malformed(WHAT, "it has no data.instance_ids"))?;
        let id = match ids.as_slice() {
            [] => {
                return Err(ProviderError::capacity(
                    KIND,
                    format!("{WHAT}: Lambda launched no instance"),
                ));
            }
            [id] => id,
            [id, ..] => {
                tracing::warn!(count = ids.len(), "a launch of one instance named several");
                id
            }
        };
        let id = id
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| malformed(WHAT, "its instance id is not a string"))?;
        Ok(Instance {
            id: id.to_string(),
            name: spec.idempotency_key.clone(),
            instance_type: spec.instance_type.clone(),
            region: spec.region.clone(),
            state: InstanceState::Pending,
            tags: spec.tags.clone(),
        })
    }

    /// The launch request for `spec`, or why Lambda would refuse it.
    fn launch_body(&self, spec: &LaunchSpec) -> Result<Value, ProviderError> {
        let refuse =
            |why: String| ProviderError::permanent(KIND, format!("launching an instance: {why}"));
        let ssh = self
            .ssh_key_name
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                refuse(format!(
                    "Lambda launches only with an SSH key: set {SSH_KEY_NAME_VAR} to a key's name in the account"
                ))
            })?;
        if ssh.chars().count() > MAX_SSH_KEY_NAME_CHARS {
            return Err(refuse(format!(
                "the SSH key name is longer than {MAX_SSH_KEY_NAME_CHARS} characters"
            )));
        }
        if spec.spot {
            return Err(refuse("Lambda has no spot capacity".into()));
        }
        if spec.instance_type.is_empty() || spec.region.is_empty() {
            return Err(refuse("no instance type or no region".into()));
        }
        if !self.regions.is_empty() && !self.regions.contains(&spec.region) {
            return Err(refuse(format!(
                "region {} is not one this account is configured for",
                spec.region
            )));
        }
        let name_chars = spec.idempotency_key.chars().count();
        if name_chars == 0 || name_chars > MAX_NAME_CHARS {
            return Err(refuse(format!(
                "the idempotency key names the instance and must be 1 to {MAX_NAME_CHARS} characters, not {name_chars}"
            )));
        }
        if spec.user_data.len() > MAX_USER_DATA_BYTES {
            return Err(refuse(format!(
                "the user-data is {} bytes, more than Lambda's {MAX_USER_DATA_BYTES}",
                spec.user_data.len()
            )));
        }
        for (key, value) in &spec.tags {
            if !valid_tag_key(key) {
                return Err(refuse(format!(
                    "tag key {key:?} is not 2 to {MAX_TAG_KEY_CHARS} characters of a-z, 0-9, '-' and ':' starting with a letter"
                )));
            }
            if value.chars().count() > MAX_TAG_VALUE_CHARS {
                return Err(refuse(format!(
                    "tag {key}'s value is longer than {MAX_TAG_VALUE_CHARS} characters"
                )));
            }
        }
        let mut body = json!({
            "region_name": spec.region,
            "instance_type_name": spec.instance_type,
            "ssh_key_names": [ssh],
            "quantity": 1,
            "name": spec.idempotency_key,
        });
        if !spec.user_data.is_empty() {
            body["user_data"] = Value::from(spec.user_data.as_str());
        }
        if !spec.tags.is_empty() {
            body["tags"] = spec
                .tags
                .iter()
                .map(|(key, value)| json!({ "key": key, "value": value }))
                .collect();
        }
        if let Some(image) = spec.image.as_deref().filter(|i| !i.trim().is_empty()) {
            body["image"] = image_spec(image.trim());
        }
        Ok(body)
    }

    async fn catalog_offers(&self) -> Result<Vec<Offer>, ProviderError> {
        const WHAT: &str = "reading the instance types";
        let answer = self.get(WHAT, &["instance-types"]).await?;
        if !answer.is_success() {
            return Err(self.error(WHAT, &answer));
        }
        parse_catalog(&self.json(WHAT, &answer)?, &self.regions)
    }

    async fn list_instances(&self, key: &str, value: &str) -> Result<Vec<Instance>, ProviderError> {
        const WHAT: &str = "listing instances";
        let answer = self.get(WHAT, &["instances"]).await?;
        if !answer.is_success() {
            return Err(self.error(WHAT, &answer));
        }
        let v = self.json(WHAT, &answer)?;
        let data = v
            .get("data")
            .and_then(Value::as_array)
            .ok_or_else(|| malformed(WHAT, "it has no data list"))?;
        let mut found = Vec::new();
        for item in data {
            let parsed = parse_instance(WHAT, item)?;
            if parsed.matches(key, value) {
                found.push(parsed.instance);
            }
        }
        Ok(found)
    }
}

impl Provider for Lambda {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn catalog(&self) -> BoxFuture<'_, Result<Vec<Offer>, ProviderError>> {
        Box::pin(self.catalog_offers())
    }

    fn launch<'a>(
        &'a self,
        spec: &'a LaunchSpec,
    ) -> BoxFuture<'a, Result<Instance, ProviderError>> {
        Box::pin(self.launch_instance(spec))
    }

    fn list<'a>(
        &'a self,
        key: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(self.list_instances(key, value))
    }

    fn describe<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>> {
        Box::pin(self.describe_instance(id))
    }

    fn terminate<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(self.terminate_instance(id))
    }
}

/// One answer, read whole.
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

impl Answer {
    fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// The next free turn for any call and for a launch.
#[derive(Debug)]
struct Pacing {
    call: Slot,
    launch: Slot,
}

#[derive(Debug)]
struct Slot {
    gap: Duration,
    next: Mutex<Instant>,
}

impl Pacing {
    fn new(call: Duration, launch: Duration) -> Pacing {
        let now = Instant::now();
        Pacing {
            call: Slot {
                gap: call,
                next: Mutex::new(now),
            },
            launch: Slot {
                gap: launch,
                next: Mutex::new(now),
            },
        }
    }

    /// Waits for `slot`'s next turn and takes it, or fails retryable when the
    /// turn is more than [`MAX_PACING_WAIT`] away.
    async fn turn(&self, what: &str, slot: &Slot) -> Result<(), ProviderError> {
        let at = {
            let mut next = slot
                .next
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            let at = (*next).max(now);
            let wait = at - now;
            if wait > MAX_PACING_WAIT {
                return Err(ProviderError::Retryable {
                    provider: KIND,
                    reason: format!("{what}: too many calls queued for Lambda's rate limit"),
                    capacity: false,
                    retry_after: Some(Duration::from_secs(wait.as_secs() + 1)),
                });
            }
            *next = at + slot.gap;
            at
        };
        tokio::time::sleep_until(at).await;
        Ok(())
    }
}

/// An instance as Lambda described it, and whether Lambda gave its tags.
struct Parsed {
    instance: Instance,
    tagged: bool,
}

impl Parsed {
    fn matches(&self, key: &str, value: &str) -> bool {
        if self.tagged {
            self.instance.tags.get(key).map(String::as_str) == Some(value)
        } else {
            // A name is unique to one launch, so it can stand only for a tag
            // unique to one launch, never for one many instances share.
            key != TAG_MANAGED_BY
                && key != TAG_HUB
                && !value.is_empty()
                && self.instance.name == value
        }
    }
}

/// Refuses an id that cannot be Lambda's (empty, too long, or with characters
/// beyond letters, digits, `-` and `_`), before it becomes part of a URL.
fn check_id(what: &str, id: &str) -> Result<(), ProviderError> {
    if id.is_empty()
        || id.len() > MAX_ID_CHARS
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        let shown: String = id.chars().take(40).collect();
        return Err(ProviderError::permanent(
            KIND,
            format!("{what}: {shown:?} is not a Lambda instance id"),
        ));
    }
    Ok(())
}

fn malformed(what: &str, why: &str) -> ProviderError {
    ProviderError::retryable(KIND, format!("{what}: the answer is malformed: {why}"))
}

/// `text` with every occurrence of `secret` cut out.
fn redact(text: &str, secret: &str) -> String {
    if secret.is_empty() {
        text.to_string()
    } else {
        text.replace(secret, "…")
    }
}

/// The code and message of Lambda's `{"error": {"code", "message"}}` body.
fn api_error(body: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(body).ok()?;
    let e = v.get("error")?;
    let code = e.get("code")?.as_str()?.to_string();
    let message = e
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Some((code, message))
}

/// Lambda's tag key rule: `^[a-z][a-z0-9-:]+$`, at most [`MAX_TAG_KEY_CHARS`].
fn valid_tag_key(key: &str) -> bool {
    let mut chars = key.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && key.len() >= 2
        && key.len() <= MAX_TAG_KEY_CHARS
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == ':')
}

/// The launch's `image`: `id:<id>` picks an image by its id, anything else
/// (optionally written `family:<name>`) by its family name.
fn image_spec(image: &str) -> Value {
    if let Some(id) = image.strip_prefix("id:") {
        json!({ "id": id.trim() })
    } else {
        let family = image.strip_prefix("family:").unwrap_or(image);
        json!({ "family": family.trim() })
    }
}

/// Axle's state for Lambda's status; unknown ones are kept as named.
fn state(status: &str) -> InstanceState {
    match status {
        "booting" => InstanceState::Pending,
        "active" => InstanceState::Running,
        "terminating" => InstanceState::Stopping,
        "terminated" => InstanceState::Terminated,
        "preempted" => InstanceState::Interrupted,
        other => InstanceState::Other(other.to_string()),
    }
}

fn parse_instance(what: &str, v: &Value) -> Result<Parsed, ProviderError> {
    let id = v
        .get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| malformed(what, "an instance has no id"))?;
    let status = v
        .get("status")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(what, "an instance has no status"))?;
    let text = |pointer: &str| {
        v.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (tags, tagged) = match v.get("tags") {
        None | Some(Value::Null) => (BTreeMap::new(), false),
        Some(Value::Array(items)) => (
            items
                .iter()
                .filter_map(|t| {
                    Some((
                        t.get("key")?.as_str()?.to_string(),
                        t.get("value")?.as_str()?.to_string(),
                    ))
                })
                .collect(),
            true,
        ),
        Some(_) => return Err(malformed(what, "an instance's tags are not a list")),
    };
    Ok(Parsed {
        instance: Instance {
            id: id.to_string(),
            name: text("/name"),
            instance_type: text("/instance_type/name"),
            region: text("/region/name"),
            state: state(status),
            tags,
        },
        tagged,
    })
}

fn parse_catalog(v: &Value, regions: &[String]) -> Result<Vec<Offer>, ProviderError> {
    const WHAT: &str = "reading the instance types";
    let data = v
        .get("data")
        .and_then(Value::as_object)
        .ok_or_else(|| malformed(WHAT, "it has no data object"))?;
    let mut offers = Vec::new();
    for (key, entry) in data {
        let bad = |why: &str| malformed(WHAT, &format!("instance type {key}: {why}"));
        let it = entry
            .get("instance_type")
            .filter(|t| t.is_object())
            .ok_or_else(|| bad("no instance_type"))?;
        let name = it
            .get("name")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("no name"))?;
        let description = it
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let gpu_description = it
            .get("gpu_description")
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty());
        let cents = it
            .get("price_cents_per_hour")
            .and_then(|p| match p {
                Value::Number(n) => n.as_u64(),
                // An older API wrote the price as a string of digits.
                Value::String(s) => s.trim().parse::<u64>().ok(),
                _ => None,
            })
            .filter(|c| *c <= MAX_PRICE_CENTS_PER_HOUR)
            .ok_or_else(|| {
                bad(&format!(
                    "price_cents_per_hour is not a whole number of cents up to {MAX_PRICE_CENTS_PER_HOUR}"
                ))
            })?;
        let listed = entry
            .get("regions_with_capacity_available")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no regions_with_capacity_available list"))?;
        let gpus = match it.pointer("/specs/gpus") {
            Some(n) => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad("specs.gpus is not a count"))?,
            None => gpus_from_name(name)
                .or_else(|| gpus_from_description(description))
                .unwrap_or(0),
        };
        if gpus == 0 {
            continue;
        }
        let gpu = gpu_description.unwrap_or(description);
        let mut gpu_model = gpu_class(gpu_name(gpu));
        if gpu_model.is_empty() {
            gpu_model = name.split('_').nth(2).unwrap_or(name).to_ascii_uppercase();
        }
        let gpu_memory_mb = gpu_description
            .and_then(gpu_memory_gb)
            .or_else(|| gpu_memory_gb(description))
            .and_then(|gb| gb.checked_mul(1024))
            .unwrap_or(0);
        for region in listed {
            let region = region
                .get("name")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| bad("a region has no name"))?;
            if !regions.is_empty() && !regions.iter().any(|r| r == region) {
                continue;
            }
            offers.push(Offer {
                provider: KIND,
                instance_type: name.to_string(),
                gpu_model: gpu_model.clone(),
                gpus,
                gpu_memory_mb,
                region: region.to_string(),
                price_per_hour: Usd::from_cents(cents),
                spot: false,
                available: true,
            });
        }
    }
    offers.sort_by(|a, b| (&a.instance_type, &a.region).cmp(&(&b.instance_type, &b.region)));
    offers.dedup_by(|a, b| a.instance_type == b.instance_type && a.region == b.region);
    Ok(offers)
}

/// The GPU count of a `gpu_8x_h100_sxm5`-style name.
fn gpus_from_name(name: &str) -> Option<u32> {
    name.strip_prefix("gpu_")?
        .split('_')
        .next()?
        .strip_suffix('x')?
        .parse()
        .ok()
}

/// The GPU count of an `8x H100 (80 GB SXM5)`-style description.
fn gpus_from_description(description: &str) -> Option<u32> {
    description
        .split_whitespace()
        .next()?
        .strip_suffix('x')?
        .parse()
        .ok()
}

/// The GPU's name in a description: `8x H100 (80 GB SXM5)` → `H100`.
fn gpu_name(description: &str) -> &str {
    let d = description.trim();
    let d = match d.split_once(char::is_whitespace) {
        Some((count, rest)) if gpus_from_description(count).is_some() => rest,
        _ => d,
    };
    d.split('(').next().unwrap_or(d).trim()
}

/// The GPU memory in a description: `8x H100 (80 GB SXM5)` → 80.
fn gpu_memory_gb(description: &str) -> Option<u64> {
    let inside = description.split_once('(')?.1;
    let inside = inside.split(')').next().unwrap_or(inside);
    let mut words = inside.split_whitespace();
    let first = words.next()?;
    if let Some(n) = first
        .strip_suffix("GB")
        .or_else(|| first.strip_suffix("GiB"))
        .filter(|n| !n.is_empty())
    {
        return n.parse().ok();
    }
    let unit = words.next()?;
    if unit.starts_with("GB") || unit.starts_with("GiB") {
        first.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_states_and_unknown_ones_are_kept() {
        assert_eq!(state("booting"), InstanceState::Pending);
        assert_eq!(state("active"), InstanceState::Running);
        assert_eq!(state("terminating"), InstanceState::Stopping);
        assert_eq!(state("terminated"), InstanceState::Terminated);
        assert_eq!(state("preempted"), InstanceState::Interrupted);
        assert_eq!(state("unhealthy"), InstanceState::Other("unhealthy".into()));
        assert_eq!(state("rebooting"), InstanceState::Other("rebooting".into()));
    }

    #[test]
    fn gpu_counts_models_and_memory_come_from_names_and_descriptions() {
        assert_eq!(gpus_from_name("gpu_8x_h100_sxm5"), Some(8));
        assert_eq!(gpus_from_name("gpu_1x_a100"), Some(1));
        assert_eq!(gpus_from_name("cpu_4x_general"), None);
        assert_eq!(gpus_from_name("gpu_x_a100"), None);
        assert_eq!(gpus_from_description("2x A6000 (48 GB)"), Some(2));
        assert_eq!(gpus_from_description(""), None);
        assert_eq!(gpu_name("8x H100 (80 GB SXM5)"), "H100");
        assert_eq!(gpu_name("A100 (40 GB SXM4)"), "A100");
        assert_eq!(gpu_name("(80 GB)"), "");
        assert_eq!(gpu_class(gpu_name("1x RTX A6000 (48 GB)")), "A6000");
        assert_eq!(gpu_memory_gb("8x H100 (80 GB SXM5)"), Some(80));
        assert_eq!(gpu_memory_gb("1x GH200 (96GB)"), Some(96));
        assert_eq!(gpu_memory_gb("1x A10 (24 GiB PCIe)"), Some(24));
        assert_eq!(gpu_memory_gb("1x A10"), None);
        assert_eq!(gpu_memory_gb("1x A10 (PCIe)"), None);
        assert_eq!(gpu_memory_gb("1x A10 (99999999999999999999999 GB)"), None);
        assert_eq!(gpu_memory_gb("("), None);
    }

    #[test]
    fn tag_keys_follow_lambdas_rule() {
        for ok in ["axle-managed-by", "axle-hub", "axle-burst-id", "a:b", "ab"] {
            assert!(valid_tag_key(ok), "{ok}");
        }
        for bad in ["", "a", "Axle", "1abc", "a_b", "a b", &"a".repeat(56)] {
            assert!(!valid_tag_key(bad), "{bad}");
        }
    }

    #[test]
    fn images_are_picked_by_family_unless_an_id_is_written() {
        assert_eq!(
            image_spec("lambda-stack-22-04"),
            json!({"family": "lambda-stack-22-04"})
        );
        assert_eq!(image_spec("family:x"), json!({"family": "x"}));
        assert_eq!(image_spec("id:0920582c"), json!({"id": "0920582c"}));
    }

    #[test]
    fn secrets_are_cut_out_of_answers() {
        assert_eq!(redact("bad key sk-123 given", "sk-123"), "bad key … given");
        assert_eq!(redact("x", ""), "x");
    }

    #[test]
    fn odd_catalog_answers_are_errors_not_panics() {
        for v in [
            json!(null),
            json!({"data": []}),
            json!({"data": {"t": 1}}),
            json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10"}, "regions_with_capacity_available": []}}}),
            json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": -5}, "regions_with_capacity_available": []}}}),
            json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": 1.5}, "regions_with_capacity_available": []}}}),
            json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": u64::MAX}, "regions_with_capacity_available": []}}}),
            json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": 5}}}}),
            json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": 5, "specs": {"gpus": -1}}, "regions_with_capacity_available": []}}}),
            json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": 5}, "regions_with_capacity_available": [{}]}}}),
        ] {
            assert!(parse_catalog(&v, &[]).is_err(), "{v}");
        }
        let old = json!({"data": {"gpu_1x_a10": {
            "instance_type": {"name": "gpu_1x_a10", "description": "1x A10 (24 GB PCIe)", "price_cents_per_hour": "75"},
            "regions_with_capacity_available": [{"name": "us-east-1", "description": "Virginia"}]
        }}});
        let offers = parse_catalog(&old, &[]).unwrap();
        assert_eq!(offers.len(), 1);
        assert_eq!(offers[0].price_per_hour, Usd::from_cents(75));
        assert_eq!(offers[0].gpu_model, "A10");
        assert_eq!(offers[0].gpu_memory_mb, 24 * 1024);
    }

    #[test]
    fn odd_instances_are_errors_not_panics() {
        for v in [
            json!(null),
            json!({}),
            json!({"id": 5, "status": "active"}),
            json!({"id": "", "status": "active"}),
            json!({"id": "i", "status": 3}),
            json!({"id": "i", "status": "active", "tags": "x"}),
        ] {
            assert!(parse_instance("t", &v).is_err(), "{v}");
        }
        let p = parse_instance(
            "t",
            &json!({"id": "i", "status": "preempted", "name": null, "tags": [{"key": "a"}, {"key": "b", "value": "c"}]}),
        )
        .unwrap();
        assert!(p.tagged);
        assert_eq!(p.instance.state, InstanceState::Interrupted);
        assert_eq!(
            p.instance.tags,
            BTreeMap::from([("b".to_string(), "c".to_string())])
        );
        assert!(p.matches("b", "c"));
        assert!(!p.matches("a", ""));
        let untagged =
            parse_instance("t", &json!({"id": "i", "status": "active", "name": "k1"})).unwrap();
        assert!(!untagged.tagged);
        assert!(untagged.matches("axle-burst-id", "k1"));
        assert!(!untagged.matches("axle-burst-id", "k2"));
        let named_like_a_tag =
            parse_instance("t", &json!({"id": "i", "status": "active", "name": "axle"})).unwrap();
        assert!(!named_like_a_tag.matches(TAG_MANAGED_BY, "axle"));
        assert!(!named_like_a_tag.matches(TAG_HUB, "axle"));
        let nameless = parse_instance("t", &json!({"id": "i", "status": "active"})).unwrap();
        assert!(!nameless.matches("axle-burst-id", ""));
    }
}
