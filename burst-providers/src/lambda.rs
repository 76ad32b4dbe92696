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

mod parse;
use crate::{
    Answer, CALL_TIMEOUT, Instance, InstanceState, LaunchSpec, Offer, Provider, ProviderError,
    TAG_HUB, TAG_MANAGED_BY, gpu_class, http_client, http_error, transport_error,
};
use parse::*;

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
        Answer::read(KIND, resp).await
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

#[cfg(test)]
mod tests;
