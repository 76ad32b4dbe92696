//! AWS EC2: GPU instances through aws-sdk-ec2 (rustls with ring, no OpenSSL).
//!
//! - **Catalog:** the instance types the policy prices (EC2 has no price API
//!   of its own), with their GPU facts from `DescribeInstanceTypes`, in each
//!   configured region; on-demand, and spot where the policy gives a spot
//!   price.
//! - **Launch:** `RunInstances` with `ClientToken` (EC2's idempotency key),
//!   Axle's tags in `TagSpecifications`, the boot script as user-data, and
//!   spot through `InstanceMarketOptions` (one-time, terminated on
//!   interruption).
//! - **List / describe:** `DescribeInstances` by tag or id; the lifecycle
//!   (spot) and a spot interruption are read from each instance, not filtered
//!   on. A running spot instance whose spot request EC2 has marked
//!   (`marked-for-termination`, `-stop`, `-hibernation`:
//!   `DescribeSpotInstanceRequests`) is listed as `Interrupting`, reclaimed
//!   two minutes after the mark.
//! - **Terminate:** `TerminateInstances`; an instance already gone is fine.
//!
//! Credentials: `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (or their
//! `_FILE` forms), else the SDK's default chain (profile, instance role).

use std::collections::BTreeMap;

use aws_sdk_ec2::types::{
    Filter, InstanceInterruptionBehavior, InstanceMarketOptionsRequest, InstanceStateName,
    InstanceType, MarketType, ResourceType, SpotInstanceRequest, SpotInstanceType,
    SpotMarketOptions, Tag, TagSpecification,
};
use axle_policy::Usd;
use base64::Engine as _;
use futures::future::BoxFuture;

use crate::credentials::{Secret, secret};
use crate::{CALL_TIMEOUT, Instance, InstanceState, LaunchSpec, Offer, Provider, ProviderError};

const KIND: &str = "aws";

/// Most pages of `DescribeInstances` read for one listing (1,000 instances
/// each): far more instances than a burst budget pays for.
pub const MAX_LIST_PAGES: usize = 20;

/// Largest user-data EC2 takes (16 KiB before base64).
pub const MAX_USER_DATA_BYTES: usize = 16 * 1024;

/// Spot request status codes by which EC2 gives notice that it reclaims
/// the instance.
pub const NOTICE_CODES: [&str; 3] = [
    "marked-for-termination",
    "marked-for-stop",
    "marked-for-hibernation",
];
/// EC2 reclaims a marked spot instance this long after the mark.
pub const SPOT_NOTICE_MS: u64 = 120_000;
/// Spot requests asked about per `DescribeSpotInstanceRequests` call (a
/// listing's instances are asked in chunks of this many).
pub const MAX_SPOT_REQUESTS_PER_CALL: usize = 100;

/// The policy's price for one instance type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsPrice {
    pub on_demand: Usd,
    /// Spot price to assume; `None`: never launched as spot.
    pub spot: Option<Usd>,
}

/// How to reach EC2 and what to launch.
#[derive(Debug, Clone)]
pub struct AwsConfig {
    /// Regions to offer and list in.
    pub regions: Vec<String>,
    /// Instance types with their prices (the policy's catalog).
    pub prices: BTreeMap<String, AwsPrice>,
    /// The machine image instances boot (with `axle-spoke` installed), per region.
    pub image_ids: BTreeMap<String, String>,
    /// Another EC2 endpoint (a test server); `None`: AWS's own.
    pub endpoint: Option<String>,
    /// Explicit credentials; `None`: the environment, then the SDK's chain.
    pub credentials: Option<(Secret, Secret)>,
}

/// EC2 in one or more regions.
pub struct Aws {
    clients: BTreeMap<String, aws_sdk_ec2::Client>,
    config: AwsConfig,
}

impl std::fmt::Debug for Aws {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aws")
            .field("regions", &self.config.regions)
            .field("endpoint", &self.config.endpoint)
            .finish_non_exhaustive()
    }
}

/// `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (or `_FILE`), when both are set.
pub fn env_credentials() -> Option<(Secret, Secret)> {
    match (secret("AWS_ACCESS_KEY_ID"), secret("AWS_SECRET_ACCESS_KEY")) {
        (Ok(id), Ok(key)) => Some((id, key)),
        _ => None,
    }
}

impl Aws {
    pub async fn new(mut config: AwsConfig) -> Result<Aws, ProviderError> {
        if config.regions.is_empty() {
            return Err(ProviderError::permanent(KIND, "no regions configured"));
        }
        if config.credentials.is_none() {
            config.credentials = env_credentials();
        }
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let timeouts = aws_config::timeout::TimeoutConfig::builder()
            .operation_timeout(CALL_TIMEOUT)
            .connect_timeout(std::time::Duration::from_secs(10))
            .build();
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(http)
            .timeout_config(timeouts)
            .region(aws_config::Region::new(config.regions[0].clone()));
        if let Some(ep) = &config.endpoint {
            loader = loader.endpoint_url(ep);
        }
        if let Some((id, key)) = &config.credentials {
            loader = loader.credentials_provider(aws_sdk_ec2::config::Credentials::new(
                id.expose(),
                key.expose(),
                None,
                None,
                "axle",
            ));
        }
        let shared = loader.load().await;
        let clients = config
            .regions
            .iter()
            .map(|r| {
                let conf = aws_sdk_ec2::config::Builder::from(&shared)
                    .region(aws_config::Region::new(r.clone()))
                    .build();
                (r.clone(), aws_sdk_ec2::Client::from_conf(conf))
            })
            .collect();
        Ok(Aws { clients, config })
    }

    fn client(&self, region: &str) -> Result<&aws_sdk_ec2::Client, ProviderError> {
        self.clients.get(region).ok_or_else(|| {
            ProviderError::permanent(
                KIND,
                format!(
                    "region {region} is not one of this provider's ({})",
                    self.config.regions.join(", ")
                ),
            )
        })
    }

    async fn catalog_in(&self, region: &str) -> Result<Vec<Offer>, ProviderError> {
        let client = self.client(region)?;
        let types: Vec<InstanceType> = self
            .config
            .prices
            .keys()
            .map(|t| InstanceType::from(t.as_str()))
            .collect();
        if types.is_empty() {
            return Ok(Vec::new());
        }
        let out = client
            .describe_instance_types()
            .set_instance_types(Some(types))
            .send()
            .await
            .map_err(|e| sdk_error("DescribeInstanceTypes", e))?;
        let mut offers = Vec::new();
        for info in out.instance_types() {
            let Some(name) = info.instance_type().map(|t| t.as_str().to_string()) else {
                continue;
            };
            let Some(price) = self.config.prices.get(&name) else {
                continue;
            };
            let Some(gpu) = info.gpu_info().and_then(|g| g.gpus().first()) else {
                continue;
            };
            let gpus = gpu.count().unwrap_or(0).max(0) as u32;
            if gpus == 0 {
                continue;
            }
            let offer = |spot: bool, price_per_hour: Usd| Offer {
                provider: KIND,
                instance_type: name.clone(),
                gpu_model: crate::gpu_class(gpu.name().unwrap_or("")),
                gpus,
                gpu_memory_mb: gpu
                    .memory_info()
                    .and_then(|m| m.size_in_mib())
                    .unwrap_or(0)
                    .max(0) as u64,
                region: region.to_string(),
                price_per_hour,
                spot,
                available: true,
            };
            offers.push(offer(false, price.on_demand));
            if let Some(spot) = price.spot {
                offers.push(offer(true, spot));
            }
        }
        Ok(offers)
    }

    async fn list_in(
        &self,
        region: &str,
        filters: Vec<Filter>,
        ids: Vec<String>,
    ) -> Result<Vec<Instance>, ProviderError> {
        let client = self.client(region)?;
        let mut out = Vec::new();
        let mut spot_requests = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut req = client.describe_instances();
            if !filters.is_empty() {
                req = req.set_filters(Some(filters.clone()));
            }
            if !ids.is_empty() {
                req = req.set_instance_ids(Some(ids.clone()));
            } else {
                req = req.max_results(1000);
            }
            if let Some(t) = &token {
                req = req.next_token(t);
            }
            let page = match req.send().await {
                Ok(p) => p,
                Err(e) => {
                    let err = sdk_error("DescribeInstances", e);
                    if matches!(&err, ProviderError::Permanent { reason, .. } if reason.contains("InvalidInstanceID.NotFound"))
                    {
                        return Ok(Vec::new());
                    }
                    return Err(err);
                }
            };
            for r in page.reservations() {
                for i in r.instances() {
                    let listed = instance_of(i, region);
                    if listed.state == InstanceState::Running
                        && let Some(rid) = i.spot_instance_request_id()
                    {
                        spot_requests.push(rid.to_string());
                    }
                    out.push(listed);
                }
            }
            token = page
                .next_token()
                .map(str::to_string)
                .filter(|t| !t.is_empty());
            if token.is_none() {
                break;
            }
        }
        let notices = self.notices(client, spot_requests).await;
        for i in &mut out {
            if let Some(&at_ms) = notices.get(&i.id) {
                i.state = InstanceState::Interrupting { at_ms };
            }
        }
        Ok(out)
    }

    /// Running spot instances EC2 has given notice on, with when it
    /// reclaims each. A failed call is logged and skipped: the listing (the
    /// reaper, adoption) must not depend on it, and the instance's own spoke
    /// reads the same notice from the instance metadata service.
    async fn notices(
        &self,
        client: &aws_sdk_ec2::Client,
        requests: Vec<String>,
    ) -> BTreeMap<String, u64> {
        let mut found = BTreeMap::new();
        for chunk in requests.chunks(MAX_SPOT_REQUESTS_PER_CALL) {
            match client
                .describe_spot_instance_requests()
                .set_spot_instance_request_ids(Some(chunk.to_vec()))
                .send()
                .await
            {
                Ok(out) => found.extend(out.spot_instance_requests().iter().filter_map(notice_of)),
                Err(e) => {
                    let err = sdk_error("DescribeSpotInstanceRequests", e);
                    tracing::warn!(error = %err, "cannot read spot interruption notices; the instances' spokes still report theirs");
                }
            }
        }
        found
    }
}

/// An SDK error as retryable (throttling, capacity, server errors, timeouts)
/// or permanent (credentials, invalid requests), by EC2's error code.
fn sdk_error<E, R>(what: &str, e: aws_sdk_ec2::error::SdkError<E, R>) -> ProviderError
where
    E: aws_sdk_ec2::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    use aws_sdk_ec2::error::SdkError;
    match &e {
        SdkError::ServiceError(se) => {
            let err = se.err();
            let code = err.code().unwrap_or("Unknown").to_string();
            let msg: String = err.message().unwrap_or("").chars().take(300).collect();
            let reason = format!("{what}: {code}: {msg}");
            match code.as_str() {
                "InsufficientInstanceCapacity"
                | "InsufficientCapacity"
                | "InstanceLimitExceeded"
                | "InsufficientHostCapacity"
                | "MaxSpotInstanceCountExceeded"
                | "SpotMaxPriceTooLow"
                | "Unsupported" => ProviderError::capacity(KIND, reason),
                "RequestLimitExceeded"
                | "Throttling"
                | "ThrottlingException"
                | "InternalError"
                | "InternalFailure"
                | "ServiceUnavailable"
                | "Unavailable" => ProviderError::retryable(KIND, reason),
                c if c.starts_with("Server.") => ProviderError::retryable(KIND, reason),
                "AuthFailure" | "UnauthorizedOperation" | "OptInRequired" => {
                    ProviderError::permanent(
                        KIND,
                        format!("{what}: {code}: the credentials were refused or lack permission"),
                    )
                }
                _ => ProviderError::permanent(KIND, reason),
            }
        }
        SdkError::TimeoutError(_) => ProviderError::retryable(KIND, format!("{what}: timed out")),
        SdkError::DispatchFailure(_) => {
            ProviderError::retryable(KIND, format!("{what}: cannot reach EC2"))
        }
        SdkError::ResponseError(_) => {
            ProviderError::retryable(KIND, format!("{what}: an answer EC2 could not parse"))
        }
        _ => ProviderError::permanent(KIND, format!("{what}: the request could not be built")),
    }
}

fn instance_of(i: &aws_sdk_ec2::types::Instance, region: &str) -> Instance {
    let tags: BTreeMap<String, String> = i
        .tags()
        .iter()
        .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or("").to_string())))
        .collect();
    let interrupted = i
        .state_reason()
        .and_then(|r| r.code())
        .is_some_and(|c| c.starts_with("Server.SpotInstance"));
    let state = if interrupted {
        InstanceState::Interrupted
    } else {
        match i.state().and_then(|s| s.name()) {
            Some(InstanceStateName::Pending) => InstanceState::Pending,
            Some(InstanceStateName::Running) => InstanceState::Running,
            Some(
                InstanceStateName::ShuttingDown
                | InstanceStateName::Stopping
                | InstanceStateName::Stopped,
            ) => InstanceState::Stopping,
            Some(InstanceStateName::Terminated) => InstanceState::Terminated,
            Some(other) => InstanceState::Other(other.as_str().to_string()),
            None => InstanceState::Other("unknown".to_string()),
        }
    };
    Instance {
        id: i.instance_id().unwrap_or("").to_string(),
        name: tags.get("Name").cloned().unwrap_or_default(),
        instance_type: i
            .instance_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_default(),
        region: region.to_string(),
        state,
        tags,
    }
}

/// A spot request EC2 has marked for reclaim: its instance and when EC2
/// takes it (two minutes after the mark).
fn notice_of(r: &SpotInstanceRequest) -> Option<(String, u64)> {
    let status = r.status()?;
    if !NOTICE_CODES.contains(&status.code()?) {
        return None;
    }
    let marked = u64::try_from(status.update_time()?.to_millis().ok()?).ok()?;
    Some((r.instance_id()?.to_string(), marked + SPOT_NOTICE_MS))
}

/// Whether an instance is spot capacity (EC2's `InstanceLifecycle`, read from
/// the instance: filtering on it server-side is not reliable everywhere).
pub fn is_spot(i: &aws_sdk_ec2::types::Instance) -> bool {
    i.instance_lifecycle().is_some_and(|l| l.as_str() == "spot")
}

impl Provider for Aws {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn catalog(&self) -> BoxFuture<'_, Result<Vec<Offer>, ProviderError>> {
        Box::pin(async move {
            let mut offers = Vec::new();
            for region in &self.config.regions {
                offers.extend(self.catalog_in(region).await?);
            }
            Ok(offers)
        })
    }

    fn launch<'a>(
        &'a self,
        spec: &'a LaunchSpec,
    ) -> BoxFuture<'a, Result<Instance, ProviderError>> {
        Box::pin(async move {
            let client = self.client(&spec.region)?;
            let image = spec
                .image
                .clone()
                .or_else(|| self.config.image_ids.get(&spec.region).cloned())
                .ok_or_else(|| {
                    ProviderError::permanent(
                        KIND,
                        format!("no machine image for region {}", spec.region),
                    )
                })?;
            if spec.user_data.len() > MAX_USER_DATA_BYTES {
                return Err(ProviderError::permanent(
                    KIND,
                    format!(
                        "user-data of {} bytes, more than EC2's {MAX_USER_DATA_BYTES}",
                        spec.user_data.len()
                    ),
                ));
            }
            let mut tags: Vec<Tag> = spec
                .tags
                .iter()
                .map(|(k, v)| Tag::builder().key(k).value(v).build())
                .collect();
            tags.push(
                Tag::builder()
                    .key("Name")
                    .value(&spec.idempotency_key)
                    .build(),
            );
            let mut req = client
                .run_instances()
                .image_id(image)
                .instance_type(InstanceType::from(spec.instance_type.as_str()))
                .min_count(1)
                .max_count(1)
                .client_token(&spec.idempotency_key)
                .user_data(base64::engine::general_purpose::STANDARD.encode(&spec.user_data))
                .tag_specifications(
                    TagSpecification::builder()
                        .resource_type(ResourceType::Instance)
                        .set_tags(Some(tags))
                        .build(),
                );
            if spec.spot {
                req = req.instance_market_options(
                    InstanceMarketOptionsRequest::builder()
                        .market_type(MarketType::Spot)
                        .spot_options(
                            SpotMarketOptions::builder()
                                .spot_instance_type(SpotInstanceType::OneTime)
                                .instance_interruption_behavior(
                                    InstanceInterruptionBehavior::Terminate,
                                )
                                .build(),
                        )
                        .build(),
                );
            }
            let out = req.send().await.map_err(|e| sdk_error("RunInstances", e))?;
            let i = out.instances().first().ok_or_else(|| {
                ProviderError::retryable(KIND, "RunInstances answered without an instance")
            })?;
            Ok(instance_of(i, &spec.region))
        })
    }

    fn list<'a>(
        &'a self,
        key: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            let filter = Filter::builder()
                .name(format!("tag:{key}"))
                .values(value)
                .build();
            let mut out = Vec::new();
            for region in &self.config.regions {
                out.extend(
                    self.list_in(region, vec![filter.clone()], Vec::new())
                        .await?,
                );
            }
            Ok(out)
        })
    }

    fn describe<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>> {
        Box::pin(async move {
            for region in &self.config.regions {
                if let Some(i) = self
                    .list_in(region, Vec::new(), vec![id.to_string()])
                    .await?
                    .into_iter()
                    .next()
                {
                    return Ok(Some(i));
                }
            }
            Ok(None)
        })
    }

    fn terminate<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let Some(found) = self.describe(id).await? else {
                return Ok(());
            };
            if found.state == InstanceState::Terminated {
                return Ok(());
            }
            let client = self.client(&found.region)?;
            match client.terminate_instances().instance_ids(id).send().await {
                Ok(_) => Ok(()),
                Err(e) => {
                    let err = sdk_error("TerminateInstances", e);
                    match &err {
                        ProviderError::Permanent { reason, .. }
                            if reason.contains("InvalidInstanceID.NotFound") =>
                        {
                            Ok(())
                        }
                        _ => Err(err),
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_ec2::types::{
        Instance as Ec2Instance, InstanceState as Ec2State, InstanceStateName, StateReason,
    };

    use super::*;

    fn ec2_instance(state: InstanceStateName, reason: Option<&str>) -> Ec2Instance {
        let mut b = Ec2Instance::builder()
            .instance_id("i-0123456789abcdef0")
            .state(Ec2State::builder().name(state).build());
        if let Some(code) = reason {
            b = b.state_reason(StateReason::builder().code(code).build());
        }
        b.build()
    }

    #[test]
    fn a_spot_termination_is_an_interruption_and_a_user_one_is_not() {
        // What EC2 sets when it takes spot capacity back (moto cannot
        // produce it: its terminations are all user-initiated).
        for code in [
            "Server.SpotInstanceTermination",
            "Server.SpotInstanceShutdown",
        ] {
            let i = instance_of(
                &ec2_instance(InstanceStateName::ShuttingDown, Some(code)),
                "us-east-1",
            );
            assert_eq!(i.state, InstanceState::Interrupted, "{code}");
        }
        let i = instance_of(
            &ec2_instance(
                InstanceStateName::Terminated,
                Some("Client.UserInitiatedShutdown"),
            ),
            "us-east-1",
        );
        assert_eq!(i.state, InstanceState::Terminated);
        let i = instance_of(&ec2_instance(InstanceStateName::Running, None), "us-east-1");
        assert_eq!(i.state, InstanceState::Running);
        assert_eq!(i.region, "us-east-1");
    }

    fn spot_request(code: &str, marked_s: i64) -> SpotInstanceRequest {
        SpotInstanceRequest::builder()
            .spot_instance_request_id("sir-1")
            .instance_id("i-0123456789abcdef0")
            .status(
                aws_sdk_ec2::types::SpotInstanceStatus::builder()
                    .code(code)
                    .update_time(aws_sdk_ec2::primitives::DateTime::from_secs(marked_s))
                    .build(),
            )
            .build()
    }

    #[test]
    fn a_marked_spot_request_is_a_notice_two_minutes_ahead_and_others_are_not() {
        // What DescribeSpotInstanceRequests answers once EC2 has decided to
        // reclaim (moto never marks a request, so this is where it is read).
        for code in NOTICE_CODES {
            assert_eq!(
                notice_of(&spot_request(code, 1_700_000_000)),
                Some(("i-0123456789abcdef0".to_string(), 1_700_000_120_000)),
                "{code}"
            );
        }
        for code in [
            "fulfilled",
            "pending-fulfillment",
            "instance-terminated-by-price",
        ] {
            assert_eq!(
                notice_of(&spot_request(code, 1_700_000_000)),
                None,
                "{code}"
            );
        }
        let no_instance = SpotInstanceRequest::builder()
            .status(
                aws_sdk_ec2::types::SpotInstanceStatus::builder()
                    .code("marked-for-termination")
                    .build(),
            )
            .build();
        assert_eq!(notice_of(&no_instance), None);
    }
}
