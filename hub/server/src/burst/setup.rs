//! What the hub needs to burst: one adapter per `BurstProvider` document,
//! built from the policy and the environment's credentials, and where burst
//! instances find the hub.

use std::collections::BTreeMap;
use std::sync::Arc;

use axle_burst::Provider;
use axle_policy::{Policy, ProviderType};

/// Burst settings of one hub.
#[derive(Clone)]
pub struct BurstConfig {
    /// Adapters by BurstProvider name; a provider the policy names and this
    /// map lacks (no credentials) never launches, and says why.
    pub providers: BTreeMap<String, Arc<dyn Provider>>,
    /// Why a provider could not be set up, by name.
    pub unavailable: BTreeMap<String, String>,
    /// The gRPC URL burst instances dial (`https://…`).
    pub hub_url: String,
    /// This hub's tag value ([`axle_burst::TAG_HUB`]): its spoke CA's hash,
    /// so two hubs in one account never reap each other's instances.
    pub hub_id: String,
    /// How often every provider is listed (adoption, interruptions, orphans).
    pub list_every_ms: u64,
    /// How long a tagged instance nobody knows may live before it is reaped:
    /// long enough for a launch's answer to be recorded.
    pub orphan_grace_ms: u64,
    /// The command burst instances start the spoke with.
    pub spoke_command: String,
}

/// The hub's burst flags.
#[derive(Debug, Clone, clap::Args)]
pub struct BurstArgs {
    /// Burst to the policy's BurstProviders when on-prem capacity runs out
    /// (credentials from AWS_*, RUNPOD_API_KEY, LAMBDA_API_KEY or their *_FILE;
    /// an endpoint per provider from AXLE_BURST_ENDPOINT_<NAME>). Off: burst
    /// wishes are only recorded as events.
    #[arg(long, env = "AXLE_BURST")]
    pub burst: bool,
    /// The gRPC URL burst instances dial to join (default: https:// and the
    /// gRPC listener's address).
    #[arg(long, env = "AXLE_BURST_HUB_URL", value_name = "URL")]
    pub burst_hub_url: Option<String>,
    /// Seconds between listings of every provider (adoption, interruptions, orphans).
    #[arg(long, default_value_t = DEFAULT_LIST_EVERY_MS / 1000,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub burst_list_every_s: u64,
    /// Seconds a tagged instance no live burst claims may run before it is terminated.
    #[arg(long, default_value_t = DEFAULT_ORPHAN_GRACE_MS / 1000,
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub burst_orphan_grace_s: u64,
    /// The command a burst instance's boot script starts the spoke with.
    #[arg(long, default_value = "axle-spoke", value_name = "COMMAND")]
    pub burst_spoke_command: String,
}

impl BurstArgs {
    /// The burst settings (`None` without `--burst`); providers without
    /// credentials are logged and skipped.
    pub async fn config(&self, policy: &Policy) -> Option<BurstConfig> {
        if !self.burst {
            return None;
        }
        let (providers, unavailable) = providers_from(policy).await;
        for (name, why) in &unavailable {
            tracing::warn!("burst provider {name} is off: {why}");
        }
        Some(BurstConfig {
            providers,
            unavailable,
            hub_url: self.burst_hub_url.clone().unwrap_or_default(),
            hub_id: String::new(),
            list_every_ms: self.burst_list_every_s * 1000,
            orphan_grace_ms: self.burst_orphan_grace_s * 1000,
            spoke_command: self.burst_spoke_command.clone(),
        })
    }
}

/// Default time between provider listings.
pub const DEFAULT_LIST_EVERY_MS: u64 = 30_000;
/// Default grace before an unknown tagged instance is terminated.
pub const DEFAULT_ORPHAN_GRACE_MS: u64 = 120_000;

impl std::fmt::Debug for BurstConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BurstConfig")
            .field("providers", &self.providers.keys().collect::<Vec<_>>())
            .field("unavailable", &self.unavailable)
            .field("hub_url", &self.hub_url)
            .field("hub_id", &self.hub_id)
            .finish()
    }
}

/// The environment variable overriding provider `name`'s API endpoint
/// (a proxy, or a test server): `AXLE_BURST_ENDPOINT_<NAME>`, the name
/// upper-cased with `-` as `_`.
pub fn endpoint_var(name: &str) -> String {
    format!(
        "AXLE_BURST_ENDPOINT_{}",
        name.to_uppercase().replace(['-', '.'], "_")
    )
}

/// Builds an adapter for every BurstProvider of `policy`. Credentials come
/// from the environment (`AWS_*`, `RUNPOD_API_KEY`, `LAMBDA_API_KEY`, or
/// their `*_FILE`); a provider without them is listed as unavailable.
pub async fn providers_from(
    policy: &Policy,
) -> (
    BTreeMap<String, Arc<dyn Provider>>,
    BTreeMap<String, String>,
) {
    let mut ok: BTreeMap<String, Arc<dyn Provider>> = BTreeMap::new();
    let mut bad = BTreeMap::new();
    for (name, p) in &policy.burst_providers {
        let endpoint = std::env::var(endpoint_var(name))
            .ok()
            .filter(|v| !v.is_empty());
        let built: Result<Arc<dyn Provider>, axle_burst::ProviderError> = match p.provider_type {
            ProviderType::Aws => {
                let config = axle_burst::aws::AwsConfig {
                    regions: p.regions.clone(),
                    prices: p
                        .prices
                        .iter()
                        .map(|(t, pr)| {
                            (
                                t.clone(),
                                axle_burst::aws::AwsPrice {
                                    on_demand: pr.on_demand,
                                    spot: pr.spot,
                                },
                            )
                        })
                        .collect(),
                    image_ids: p.images.clone(),
                    endpoint,
                    credentials: None,
                };
                axle_burst::aws::Aws::new(config)
                    .await
                    .map(|a| Arc::new(a) as Arc<dyn Provider>)
            }
            ProviderType::Runpod => {
                axle_burst::credentials::secret(axle_burst::runpod::API_KEY_VAR)
                    .map_err(|e| axle_burst::ProviderError::permanent("runpod", e.to_string()))
                    .and_then(|key| {
                        axle_burst::runpod::RunPod::new(
                            endpoint.unwrap_or_else(|| axle_burst::runpod::DEFAULT_BASE_URL.into()),
                            key,
                            p.regions.clone(),
                        )
                    })
                    .map(|r| Arc::new(r) as Arc<dyn Provider>)
            }
            ProviderType::Lambda => {
                let built = match endpoint {
                    None => axle_burst::lambda::Lambda::from_env(p.regions.clone()),
                    Some(url) => axle_burst::credentials::secret(axle_burst::lambda::API_KEY_VAR)
                        .map_err(|e| axle_burst::ProviderError::permanent("lambda", e.to_string()))
                        .and_then(|key| {
                            axle_burst::lambda::Lambda::new(url, key, p.regions.clone())
                        })
                        .map(
                            |l| match std::env::var(axle_burst::lambda::SSH_KEY_NAME_VAR) {
                                Ok(k) if !k.trim().is_empty() => l.with_ssh_key_name(k.trim()),
                                _ => l,
                            },
                        ),
                };
                built.map(|l| Arc::new(l) as Arc<dyn Provider>)
            }
        };
        match built {
            Ok(a) => {
                ok.insert(name.clone(), a);
            }
            Err(e) => {
                bad.insert(name.clone(), e.to_string());
            }
        }
    }
    (ok, bad)
}

/// The boot script of a burst instance: it starts `axle-spoke` as cluster
/// `cluster` with its one-time join token, declaring the GPUs the offer has
/// (a spoke on a real instance reads them from `nvidia-smi` when present).
/// An EC2 spot instance's spoke also watches for the interruption notice
/// (`spot_notices`).
pub fn user_data(
    spoke_command: &str,
    hub_url: &str,
    cluster: &str,
    region: &str,
    join_token: &str,
    gpus: &str,
    spot_notices: bool,
) -> String {
    let notices = if spot_notices {
        " --ec2-spot-notices"
    } else {
        ""
    };
    format!(
        "#!/bin/sh\n\
         # Axle burst instance: joins the hub as cluster {cluster}.\n\
         set -e\n\
         DATA=\"${{AXLE_DATA_DIR:-/var/lib/axle-spoke}}\"\n\
         mkdir -p \"$DATA\"\n\
         exec {spoke_command} --hub '{hub_url}' --cluster '{cluster}' --region '{region}' \\\n  \
         --gpus '{gpus}' --data-dir \"$DATA\"{notices} --join-token '{join_token}'\n"
    )
}
