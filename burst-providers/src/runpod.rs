//! RunPod pods through RunPod's REST API v2 (`https://api.runpod.io/v2/...`).
//!
//! How Axle maps its five calls onto the API:
//!
//! - **catalog**: `GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=SECURE&count=N`
//!   for each N in [`OFFERED_GPU_COUNTS`] (the calls run concurrently). Each
//!   GPU type the secure cloud offers (`secure: true`) becomes one [`Offer`]
//!   per GPU count up to the type's `maxCount.secure`, priced at
//!   `price.secure` (USD per GPU-hour) times the count. Axle uses only the
//!   **secure cloud** (RunPod-owned data-center hardware): a burst pod
//!   carries the spoke's join token, which Axle does not hand to
//!   community-hosted machines. A type without a positive secure price is
//!   skipped. The GPU class is [`gpu_class`] of the type's short `name`
//!   (`H100 SXM` → `H100`; the `id` when the name is empty), the memory per
//!   GPU the type's `memory` (GB) in MiB (`× 1024`).
//!   Offers are on-demand only: the v2 create-pod body has no spot or
//!   interruptible field, so `spot` is always false and a spot launch is
//!   refused ("RunPod v2 has no spot pods").
//! - **regions** are RunPod data-center ids as the catalog names them in
//!   `dataCenters[].id` (`US-KS-2`, `EU-RO-1`). With regions configured,
//!   a GPU type × count is offered in each configured data center the
//!   catalog lists for it, available unless that data center's
//!   `availability` is `NONE`; with none configured, it is offered once in
//!   the region [`ANY_REGION`] (RunPod's scheduler picks the data center),
//!   available unless the overall `availability` is `NONE`.
//! - **instance types** are `"<count>x <GPU type id>"`
//!   (`"2x NVIDIA H100 80GB HBM3"`); a bare GPU type id means one GPU.
//! - **launch**: `POST /v2/pods` with `name` = the launch's idempotency key
//!   (RunPod has no idempotency key: the unique name lets the caller find a
//!   launch whose answer was lost), `cloud: SECURE`, `gpu: {id, count}`,
//!   `dataCenterIds: [region]` (omitted for [`ANY_REGION`]), the image
//!   (the launch's own, or [`DEFAULT_IMAGE`] started with
//!   [`DEFAULT_IMAGE_ARGS`]),
//!   a container disk of [`CONTAINER_DISK_GB`], and `env` carrying
//!   [`USER_DATA_ENV`] (the boot script) and [`TAGS_ENV`] (Axle's tags,
//!   with [`TAG_MANAGED_BY`] added when the launch lacks it).
//!   RunPod pods have no tags or labels, so the tags travel as one
//!   environment variable holding a JSON object of tag → value; the API
//!   returns a pod's `env` when listing it, which is how `list` finds
//!   Axle's pods. Anyone holding the account's API key can read a pod's
//!   `env`, the boot script's join token included (it is one-time).
//! - **list**: `GET /v2/pods` (the API has no pagination: one answer holds
//!   every pod, bounded by [`MAX_RESPONSE_BYTES`](crate::MAX_RESPONSE_BYTES)),
//!   keeping Axle's pods whose tags carry `key` = `value`, in every data
//!   center.
//! - **describe**: `GET /v2/pods/{id}`; 404 means gone.
//! - **terminate**: `DELETE /v2/pods/{id}`; 404 means already gone.
//!
//! Every call sends `Authorization: Bearer <key>`. Errors are RFC 9457
//! problem documents; their `title` and `detail` go into Axle's error text.
//! A 400 to a launch whose detail speaks of capacity, availability or stock
//! (the API has no machine-readable code for it) is a capacity error.

use std::collections::BTreeMap;

use axle_policy::Usd;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::credentials::{self, Secret};
use crate::{
    Answer, Instance, InstanceState, LaunchSpec, MANAGED_BY_VALUE, Offer, Provider, ProviderError,
    TAG_MANAGED_BY, gpu_class, http_client, http_error, transport_error,
};

/// This adapter's kind.
pub const KIND: &str = "runpod";

/// RunPod's REST API v2 server.
pub const DEFAULT_BASE_URL: &str = "https://api.runpod.io";

/// The environment variable holding the API key (or `RUNPOD_API_KEY_FILE`
/// a path to a file holding it).
pub const API_KEY_VAR: &str = "RUNPOD_API_KEY";

/// The region of offers and launches that leave the data center to
/// RunPod's scheduler (the adapter was given no regions).
pub const ANY_REGION: &str = "any";

/// GPU counts per pod Axle offers, each where the GPU type's
/// `maxCount.secure` allows it: the machine shapes RunPod runs, and four
/// catalog calls at most.
pub const OFFERED_GPU_COUNTS: [u32; 4] = [1, 2, 4, 8];

/// The container image of a launch that names none: the CUDA image RunPod's
/// API documents, which has the shell and tools the boot script needs.
pub const DEFAULT_IMAGE: &str = "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404";

/// What [`DEFAULT_IMAGE`] is started with: it writes the boot script from
/// [`USER_DATA_ENV`] to a file and runs it with bash. An image the launch
/// names gets no arguments: it runs [`USER_DATA_ENV`] itself.
pub const DEFAULT_IMAGE_ARGS: &str = "bash -c 'printf %s \"$AXLE_USER_DATA\" > /tmp/axle-user-data && exec bash /tmp/axle-user-data'";

/// The environment variable carrying the launch's boot script (pods are
/// containers: they take no user-data).
pub const USER_DATA_ENV: &str = "AXLE_USER_DATA";

/// The environment variable carrying Axle's tags as a JSON object (RunPod
/// pods have no tags or labels).
pub const TAGS_ENV: &str = "AXLE_TAGS";

/// Container disk of a launched pod, in GB: room for the spoke, its logs and
/// a workload's scratch files (the size RunPod's API examples use).
pub const CONTAINER_DISK_GB: u32 = 50;

/// Longest pod id Axle sends in a path: RunPod's ids are about a dozen
/// characters; anything far longer is not one.
pub const MAX_POD_ID_LEN: usize = 128;

/// Longest data-center id accepted as a region: RunPod's are like
/// `US-KS-2`.
pub const MAX_REGION_LEN: usize = 64;

/// Longest problem detail carried into an error: enough for the API's
/// sentence, short enough for a log line.
const MAX_DETAIL_CHARS: usize = 300;

/// Words in a launch's 400 detail that mean RunPod had no machine for it.
const CAPACITY_WORDS: [&str; 6] = [
    "capacity",
    "availab",
    "stock",
    "could not be placed",
    "no longer any instances",
    "sold out",
];

/// A RunPod account, serving the data centers it was given.
#[derive(Debug, Clone)]
pub struct RunPod {
    base_url: String,
    api_key: Secret,
    regions: Vec<String>,
    http: reqwest::Client,
}

impl RunPod {
    /// An account at `base_url` (normally [`DEFAULT_BASE_URL`]) serving the
    /// data centers `regions` (none: any data center, see [`ANY_REGION`]).
    pub fn new(
        base_url: impl Into<String>,
        api_key: Secret,
        regions: Vec<String>,
    ) -> Result<RunPod, ProviderError> {
        let base_url = base_url.into().trim().trim_end_matches('/').to_string();
        if !(base_url.starts_with("https://") || base_url.starts_with("http://")) {
            return Err(ProviderError::permanent(
                KIND,
                format!("base URL {base_url:?} is not an http(s) URL"),
            ));
        }
        if api_key.expose().trim().is_empty() {
            return Err(ProviderError::permanent(KIND, "the API key is empty"));
        }
        for region in &regions {
            if !valid_region(region) {
                return Err(ProviderError::permanent(
                    KIND,
                    format!(
                        "region {region:?} is not a RunPod data-center id (like US-KS-2) or {ANY_REGION:?}"
                    ),
                ));
            }
        }
        Ok(RunPod {
            base_url,
            api_key,
            regions,
            http: http_client(KIND)?,
        })
    }

    /// An account at [`DEFAULT_BASE_URL`] with the key from
    /// `RUNPOD_API_KEY` or the file `RUNPOD_API_KEY_FILE` names.
    pub fn from_env(regions: Vec<String>) -> Result<RunPod, ProviderError> {
        let key = credentials::secret(API_KEY_VAR)
            .map_err(|e| ProviderError::permanent(KIND, e.to_string()))?;
        RunPod::new(DEFAULT_BASE_URL, key, regions)
    }

    /// The data centers this account serves (empty: any).
    pub fn regions(&self) -> &[String] {
        &self.regions
    }

    /// Sends one request and reads its answer: the status, the Retry-After
    /// header and the body.
    async fn call(
        &self,
        method: reqwest::Method,
        path_and_query: &str,
        body: Option<&CreatePod<'_>>,
        what: &str,
    ) -> Result<Answer, ProviderError> {
        let mut req = self
            .http
            .request(method, format!("{}{path_and_query}", self.base_url))
            .bearer_auth(self.api_key.expose())
            .header(
                reqwest::header::ACCEPT,
                "application/json, application/problem+json",
            );
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| transport_error(KIND, what, &e))?;
        Answer::read(KIND, resp).await
    }

    /// The GPU types the catalog lists for pods of `count` GPUs on the
    /// secure cloud, with their availability.
    async fn gpu_types(&self, count: u32) -> Result<(u32, Vec<GpuTypeWire>), ProviderError> {
        let what = format!("catalog ({count} GPUs)");
        let answer = self
            .call(
                reqwest::Method::GET,
                &format!(
                    "/v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=SECURE&count={count}"
                ),
                None,
                &what,
            )
            .await?;
        ok(&answer, &what)?;
        let list: ListGpuTypesWire = parse(&answer.body, &what)?;
        Ok((count, list.gpus))
    }

    fn offers(&self, count: u32, gpus: &[GpuTypeWire]) -> Vec<Offer> {
        let mut offers = Vec::new();
        for gpu in gpus {
            if !gpu.secure || gpu.max_count.secure.unwrap_or(0) < u64::from(count) {
                continue;
            }
            let Some(per_gpu) = gpu.price.secure else {
                continue;
            };
            let per_gpu = match Usd::from_number(per_gpu) {
                Ok(p) if !p.is_zero() => p,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(gpu = %gpu.id, error = %e, "RunPod lists a GPU type with a price that is not money; skipping it");
                    continue;
                }
            };
            let offer = |region: &str, available: bool| Offer {
                provider: KIND,
                instance_type: instance_type(&gpu.id, u64::from(count)),
                gpu_model: gpu_class(if gpu.name.is_empty() {
                    &gpu.id
                } else {
                    &gpu.name
                }),
                gpus: count,
                gpu_memory_mb: gpu.memory.saturating_mul(1024),
                region: region.to_string(),
                price_per_hour: per_gpu.times(u64::from(count)),
                spot: false,
                available,
            };
            if self.regions.is_empty() {
                let available = gpu.availability.as_deref() != Some("NONE");
                offers.push(offer(ANY_REGION, available));
                continue;
            }
            for region in &self.regions {
                if region == ANY_REGION {
                    let available = gpu.availability.as_deref() != Some("NONE");
                    offers.push(offer(ANY_REGION, available));
                } else if let Some(dc) = gpu.data_centers.iter().find(|dc| &dc.id == region) {
                    offers.push(offer(region, dc.availability.as_deref() != Some("NONE")));
                }
            }
        }
        offers
    }

    async fn catalog_inner(&self) -> Result<Vec<Offer>, ProviderError> {
        let answers =
            futures::future::try_join_all(OFFERED_GPU_COUNTS.map(|count| self.gpu_types(count)))
                .await?;
        Ok(answers
            .iter()
            .flat_map(|(count, gpus)| self.offers(*count, gpus))
            .collect())
    }

    async fn launch_inner(&self, spec: &LaunchSpec) -> Result<Instance, ProviderError> {
        if spec.spot {
            return Err(ProviderError::permanent(KIND, "RunPod v2 has no spot pods"));
        }
        if spec.idempotency_key.trim().is_empty() {
            return Err(ProviderError::permanent(
                KIND,
                "a launch needs an idempotency key (the pod's name)",
            ));
        }
        let (gpu_id, count) = parse_instance_type(&spec.instance_type)?;
        let data_centers = if spec.region.is_empty() || spec.region == ANY_REGION {
            Vec::new()
        } else if valid_region(&spec.region) {
            vec![spec.region.as_str()]
        } else {
            return Err(ProviderError::permanent(
                KIND,
                format!("region {:?} is not a RunPod data-center id", spec.region),
            ));
        };
        let mut tags = spec.tags.clone();
        tags.entry(TAG_MANAGED_BY.to_string())
            .or_insert_with(|| MANAGED_BY_VALUE.to_string());
        let tags_json = serde_json::to_string(&tags)
            .map_err(|e| ProviderError::permanent(KIND, format!("cannot encode the tags: {e}")))?;
        let mut env = BTreeMap::new();
        env.insert(USER_DATA_ENV, spec.user_data.as_str());
        env.insert(TAGS_ENV, tags_json.as_str());
        let (image, args) = match spec.image.as_deref().filter(|i| !i.trim().is_empty()) {
            Some(image) => (image, None),
            None => (DEFAULT_IMAGE, Some(DEFAULT_IMAGE_ARGS)),
        };
        let body = CreatePod {
            name: &spec.idempotency_key,
            image,
            args,
            cloud: "SECURE",
            gpu: CreateGpu { id: gpu_id, count },
            data_center_ids: data_centers,
            disk: CONTAINER_DISK_GB,
            env,
        };
        let what = format!(
            "launch {} in {}",
            spec.instance_type,
            display_region(&spec.region)
        );
        let answer = self
            .call(reqwest::Method::POST, "/v2/pods", Some(&body), &what)
            .await?;
        if answer.status == 400 {
            let detail = problem_detail(&answer.body);
            let lower = detail.to_lowercase();
            if CAPACITY_WORDS.iter().any(|w| lower.contains(w)) {
                return Err(ProviderError::capacity(
                    KIND,
                    format!("{what}: HTTP 400: {detail}"),
                ));
            }
        }
        ok(&answer, &what)?;
        let pod: PodWire = parse(&answer.body, &what)?;
        Ok(pod.into_instance())
    }

    async fn list_inner(&self, key: &str, value: &str) -> Result<Vec<Instance>, ProviderError> {
        let what = "list pods";
        let answer = self
            .call(reqwest::Method::GET, "/v2/pods", None, what)
            .await?;
        ok(&answer, what)?;
        let list: ListPodsWire = parse(&answer.body, what)?;
        Ok(list
            .pods
            .into_iter()
            .map(PodWire::into_instance)
            .filter(|i| i.is_axles() && i.tags.get(key).map(String::as_str) == Some(value))
            .collect())
    }

    async fn describe_inner(&self, id: &str) -> Result<Option<Instance>, ProviderError> {
        check_pod_id(id)?;
        let what = format!("describe pod {id}");
        let answer = self
            .call(reqwest::Method::GET, &format!("/v2/pods/{id}"), None, &what)
            .await?;
        if answer.status == 404 {
            return Ok(None);
        }
        ok(&answer, &what)?;
        let pod: PodWire = parse(&answer.body, &what)?;
        Ok(Some(pod.into_instance()))
    }

    async fn terminate_inner(&self, id: &str) -> Result<(), ProviderError> {
        check_pod_id(id)?;
        let what = format!("terminate pod {id}");
        let answer = self
            .call(
                reqwest::Method::DELETE,
                &format!("/v2/pods/{id}"),
                None,
                &what,
            )
            .await?;
        if answer.status == 404 {
            return Ok(());
        }
        ok(&answer, &what)
    }
}

impl Provider for RunPod {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn catalog(&self) -> BoxFuture<'_, Result<Vec<Offer>, ProviderError>> {
        Box::pin(self.catalog_inner())
    }

    fn launch<'a>(
        &'a self,
        spec: &'a LaunchSpec,
    ) -> BoxFuture<'a, Result<Instance, ProviderError>> {
        Box::pin(self.launch_inner(spec))
    }

    fn list<'a>(
        &'a self,
        key: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(self.list_inner(key, value))
    }

    fn describe<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>> {
        Box::pin(self.describe_inner(id))
    }

    fn terminate<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(self.terminate_inner(id))
    }
}

/// `Ok` for a 2xx answer, else the error its status and problem document say.
fn ok(answer: &Answer, what: &str) -> Result<(), ProviderError> {
    if answer.is_success() {
        return Ok(());
    }
    Err(http_error(
        KIND,
        answer.status,
        answer.retry_after.as_deref(),
        what,
        &problem_detail(&answer.body),
    ))
}

/// The instance type of `count` GPUs of type `gpu_id`.
fn instance_type(gpu_id: &str, count: u64) -> String {
    format!("{count}x {gpu_id}")
}

/// The GPU type id and count of an instance type (`"2x NVIDIA H100 80GB HBM3"`,
/// or a bare GPU type id for one GPU).
fn parse_instance_type(instance_type: &str) -> Result<(&str, u32), ProviderError> {
    let t = instance_type.trim();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let counted = t[digits..]
        .strip_prefix('x')
        .filter(|rest| digits > 0 && (rest.is_empty() || rest.starts_with(' ')))
        .map(|rest| (&t[..digits], rest));
    let (gpu_id, count) = match counted {
        Some((n, id)) => {
            let count = n.parse::<u32>().ok().filter(|c| *c >= 1).ok_or_else(|| {
                ProviderError::permanent(
                    KIND,
                    format!("instance type {instance_type:?}: {n} is not a GPU count"),
                )
            })?;
            (id.trim(), count)
        }
        _ => (t, 1),
    };
    if gpu_id.is_empty() {
        return Err(ProviderError::permanent(
            KIND,
            format!(
                "instance type {instance_type:?} names no GPU type (write e.g. \"2x NVIDIA H100 80GB HBM3\")"
            ),
        ));
    }
    Ok((gpu_id, count))
}

fn valid_region(region: &str) -> bool {
    !region.is_empty()
        && region.len() <= MAX_REGION_LEN
        && region
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn display_region(region: &str) -> &str {
    if region.is_empty() {
        ANY_REGION
    } else {
        region
    }
}

/// Refuses an id that is not a RunPod pod id before it goes into a path.
fn check_pod_id(id: &str) -> Result<(), ProviderError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_POD_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        let shown: String = id.chars().take(40).collect();
        Err(ProviderError::permanent(
            KIND,
            format!("{shown:?} is not a RunPod pod id"),
        ))
    }
}

/// A problem document's `title: detail (errors)`, or the body as it is when
/// it is not one; at most [`MAX_DETAIL_CHARS`].
fn problem_detail(body: &str) -> String {
    let text = match serde_json::from_str::<ProblemWire>(body) {
        Ok(p) if p.title.is_some() || p.detail.is_some() => {
            let mut text = match (p.title, p.detail) {
                (Some(t), Some(d)) => format!("{t}: {d}"),
                (Some(t), None) => t,
                (None, Some(d)) => d,
                (None, None) => String::new(),
            };
            if !p.errors.is_empty() {
                text.push_str(&format!(" ({})", p.errors.join("; ")));
            }
            text
        }
        _ => body.trim().to_string(),
    };
    text.chars().take(MAX_DETAIL_CHARS).collect()
}

fn parse<T: serde::de::DeserializeOwned>(body: &str, what: &str) -> Result<T, ProviderError> {
    serde_json::from_str(body).map_err(|e| {
        ProviderError::retryable(
            KIND,
            format!("{what}: the answer is not what RunPod sends: {e}"),
        )
    })
}

fn state(status: &str) -> InstanceState {
    match status {
        "PROVISIONING" | "STARTING" => InstanceState::Pending,
        "RUNNING" => InstanceState::Running,
        // Stopped: the container exited; the pod keeps its disk until terminated.
        "EXITED" => InstanceState::Stopping,
        "TERMINATED" => InstanceState::Terminated,
        other => InstanceState::Other(other.to_string()),
    }
}

/// The `POST /v2/pods` body (`CreatePodRequest`).
#[derive(Serialize)]
struct CreatePod<'a> {
    name: &'a str,
    image: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<&'a str>,
    cloud: &'a str,
    gpu: CreateGpu<'a>,
    #[serde(rename = "dataCenterIds", skip_serializing_if = "Vec::is_empty")]
    data_center_ids: Vec<&'a str>,
    disk: u32,
    env: BTreeMap<&'a str, &'a str>,
}

#[derive(Serialize)]
struct CreateGpu<'a> {
    id: &'a str,
    count: u32,
}

#[derive(Deserialize)]
struct ProblemWire {
    title: Option<String>,
    detail: Option<String>,
    #[serde(default)]
    errors: Vec<String>,
}

#[derive(Deserialize)]
struct ListGpuTypesWire {
    gpus: Vec<GpuTypeWire>,
}

#[derive(Deserialize)]
struct GpuTypeWire {
    id: String,
    /// The short model name (`H100 SXM`, `RTX 4090`, `MI300X`).
    #[serde(default)]
    name: String,
    /// VRAM in GB.
    memory: u64,
    #[serde(default)]
    secure: bool,
    price: PriceWire,
    #[serde(rename = "maxCount")]
    max_count: MaxCountWire,
    availability: Option<String>,
    #[serde(rename = "dataCenters", default)]
    data_centers: Vec<DataCenterAvailabilityWire>,
}

#[derive(Deserialize)]
struct PriceWire {
    /// USD per GPU-hour on the secure cloud.
    secure: Option<f64>,
}

#[derive(Deserialize)]
struct MaxCountWire {
    secure: Option<u64>,
}

#[derive(Deserialize)]
struct DataCenterAvailabilityWire {
    id: String,
    availability: Option<String>,
}

#[derive(Deserialize)]
struct ListPodsWire {
    pods: Vec<PodWire>,
}

#[derive(Deserialize)]
struct PodWire {
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    status: String,
    gpu: Option<PodGpuWire>,
    #[serde(rename = "dataCenterId")]
    data_center_id: Option<String>,
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
struct PodGpuWire {
    id: String,
    count: Option<u64>,
}

impl PodWire {
    fn into_instance(self) -> Instance {
        // A pod without Axle's tags variable (or with one that is not a JSON
        // object of strings) is not Axle's: it has no tags.
        let tags = self
            .env
            .as_ref()
            .and_then(|env| env.get(TAGS_ENV))
            .and_then(|json| serde_json::from_str::<BTreeMap<String, String>>(json).ok())
            .unwrap_or_default();
        Instance {
            id: self.id,
            name: self.name,
            instance_type: self
                .gpu
                .map(|g| instance_type(&g.id, g.count.unwrap_or(1)))
                .unwrap_or_else(|| "cpu".to_string()),
            region: self.data_center_id.unwrap_or_default(),
            state: state(&self.status),
            tags,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_types_name_the_gpu_and_its_count() {
        assert_eq!(
            parse_instance_type("2x NVIDIA H100 80GB HBM3").unwrap(),
            ("NVIDIA H100 80GB HBM3", 2)
        );
        assert_eq!(
            parse_instance_type("NVIDIA GeForce RTX 4090").unwrap(),
            ("NVIDIA GeForce RTX 4090", 1)
        );
        assert_eq!(instance_type("NVIDIA A40", 4), "4x NVIDIA A40");
        assert!(parse_instance_type("0x NVIDIA A40").is_err());
        assert!(parse_instance_type("99999999999x NVIDIA A40").is_err());
        assert!(parse_instance_type("  ").is_err());
        assert!(parse_instance_type("3x ").is_err());
    }

    #[test]
    fn problem_documents_become_short_details() {
        let body =
            r#"{"title":"Bad Request","status":400,"detail":"no capacity","errors":["a","b"]}"#;
        assert_eq!(problem_detail(body), "Bad Request: no capacity (a; b)");
        assert_eq!(problem_detail("  plain text "), "plain text");
        assert_eq!(problem_detail(&"x".repeat(1000)).len(), MAX_DETAIL_CHARS);
    }

    #[test]
    fn pod_ids_are_checked_before_they_reach_a_path() {
        assert!(check_pod_id("7h9k2m4n6p").is_ok());
        assert!(check_pod_id("pod_abc-123").is_ok());
        assert!(check_pod_id("../v2/pods").is_err());
        assert!(check_pod_id("a?b").is_err());
        assert!(check_pod_id("").is_err());
        assert!(check_pod_id(&"a".repeat(MAX_POD_ID_LEN + 1)).is_err());
    }

    #[test]
    fn pod_statuses_map_to_states() {
        assert_eq!(state("PROVISIONING"), InstanceState::Pending);
        assert_eq!(state("STARTING"), InstanceState::Pending);
        assert_eq!(state("RUNNING"), InstanceState::Running);
        assert_eq!(state("EXITED"), InstanceState::Stopping);
        assert_eq!(state("TERMINATED"), InstanceState::Terminated);
        assert_eq!(state("ERROR"), InstanceState::Other("ERROR".into()));
    }
}
