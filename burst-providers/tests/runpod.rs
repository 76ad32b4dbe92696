//! The RunPod adapter against a loopback fake of RunPod's REST API v2.
//!
//! The fake keeps pods and GPU stock, answers as the API documents, and
//! checks every request the adapter sends (query parameters and bodies) and
//! every answer it gives against the saved OpenAPI spec
//! (`tests/specs/runpod-rest-v2-openapi.json`). Violations are recorded and
//! each test asserts there were none; a request body that breaks the spec
//! also gets the API's 422.

#![cfg(feature = "runpod")]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axle_burst::credentials::Secret;
use axle_burst::runpod::{self, RunPod};
use axle_burst::{
    InstanceState, LaunchSpec, Offer, Provider, ProviderError, TAG_BURST_ID, TAG_HUB,
    TAG_MANAGED_BY,
};
use axle_policy::Usd;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use axum::routing::get;
use common::openapi::Spec;
use serde_json::{Value, json};

const SPEC_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/specs/runpod-rest-v2-openapi.json"
);
const KEY: &str = "rp-test-key-SECRET-0123";
const H100: &str = "NVIDIA H100 80GB HBM3";
const RTX4090: &str = "NVIDIA GeForce RTX 4090";

fn spec() -> &'static Spec {
    static SPEC: OnceLock<Spec> = OnceLock::new();
    SPEC.get_or_init(|| Spec::load(SPEC_PATH))
}

// ---------------------------------------------------------------- the fake

/// One GPU type the fake sells.
struct FakeGpu {
    id: &'static str,
    name: &'static str,
    manufacturer: &'static str,
    memory_gb: u64,
    secure: bool,
    community: bool,
    price_secure: f64,
    price_community: f64,
    max_secure: u64,
    max_community: u64,
    /// Free GPUs of this type on one machine, per data center.
    free: BTreeMap<&'static str, u64>,
}

/// An operation of the API: its method and path template.
type Op = (&'static str, &'static str);
const CATALOG: Op = ("get", "/v2/catalog/gpus");
const LIST: Op = ("get", "/v2/pods");
const CREATE: Op = ("post", "/v2/pods");
const GET: Op = ("get", "/v2/pods/{id}");
const DELETE: Op = ("delete", "/v2/pods/{id}");

/// What the fake does with a request instead of (or after) serving it.
#[derive(Clone)]
enum Fault {
    /// A problem document with this status (and Retry-After seconds).
    Status {
        status: u16,
        retry_after: Option<u64>,
        detail: &'static str,
    },
    /// This status and body as they are (garbage, or JSON of the wrong shape).
    Raw { status: u16, body: &'static str },
    /// A create that launches the pod, then answers this status and body:
    /// the answer is lost.
    CreateThen { status: u16, body: &'static str },
    /// A create that launches the pod, then drops the connection halfway
    /// through its answer.
    CreateThenDrop,
}

/// A fault waiting for a request to `op`; a sticky one answers every such
/// request until cleared.
struct Armed {
    op: Op,
    fault: Fault,
    sticky: bool,
}

#[derive(Default)]
struct FakeState {
    gpus: Vec<FakeGpu>,
    pods: BTreeMap<String, Value>,
    next_id: u64,
    faults: Vec<Armed>,
    violations: Vec<String>,
    /// Every request: method, path, and its JSON body.
    requests: Vec<(String, String, Option<Value>)>,
}

type Shared = Arc<Mutex<FakeState>>;

struct Fake {
    state: Shared,
    url: String,
}

fn stock() -> Vec<FakeGpu> {
    vec![
        FakeGpu {
            id: H100,
            name: "H100 SXM",
            manufacturer: "NVIDIA",
            memory_gb: 80,
            secure: true,
            community: false,
            price_secure: 2.69,
            price_community: 0.0,
            max_secure: 8,
            max_community: 0,
            free: BTreeMap::from([("US-KS-2", 8), ("EU-RO-1", 0)]),
        },
        FakeGpu {
            id: RTX4090,
            name: "RTX 4090",
            manufacturer: "NVIDIA",
            memory_gb: 24,
            secure: true,
            community: true,
            price_secure: 0.44,
            price_community: 0.31,
            max_secure: 2,
            max_community: 4,
            free: BTreeMap::from([("US-KS-2", 1), ("EU-RO-1", 2)]),
        },
        // Community cloud only: Axle offers none of it.
        FakeGpu {
            id: "NVIDIA RTX A6000",
            name: "RTX A6000",
            manufacturer: "NVIDIA",
            memory_gb: 48,
            secure: false,
            community: true,
            price_secure: 0.0,
            price_community: 0.33,
            max_secure: 0,
            max_community: 8,
            free: BTreeMap::from([("US-KS-2", 8)]),
        },
        // Only in a data center the regional adapter does not serve.
        FakeGpu {
            id: "AMD Instinct MI300X OAM",
            name: "MI300X",
            manufacturer: "AMD",
            memory_gb: 192,
            secure: true,
            community: false,
            price_secure: 2.49,
            price_community: 0.0,
            max_secure: 8,
            max_community: 0,
            free: BTreeMap::from([("CA-MTL-1", 8)]),
        },
    ]
}

impl Fake {
    async fn start() -> Fake {
        let state: Shared = Arc::new(Mutex::new(FakeState {
            gpus: stock(),
            ..FakeState::default()
        }));
        let app = Router::new()
            .route("/v2/catalog/gpus", get(catalog))
            .route("/v2/pods", get(list_pods).post(create_pod))
            .route("/v2/pods/{id}", get(get_pod).delete(delete_pod))
            .fallback(unknown_route)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Fake { state, url }
    }

    fn adapter(&self, regions: &[&str]) -> RunPod {
        self.adapter_with_key(KEY, regions)
    }

    fn adapter_with_key(&self, key: &str, regions: &[&str]) -> RunPod {
        RunPod::new(
            &self.url,
            Secret::new(key),
            regions.iter().map(|r| r.to_string()).collect(),
        )
        .unwrap()
    }

    /// `fault` answers the next request to `op`.
    fn fault(&self, op: Op, fault: Fault) {
        self.state.lock().unwrap().faults.push(Armed {
            op,
            fault,
            sticky: false,
        });
    }

    /// `fault` answers every request to `op` until [`Fake::clear_faults`].
    fn fault_always(&self, op: Op, fault: Fault) {
        self.state.lock().unwrap().faults.push(Armed {
            op,
            fault,
            sticky: true,
        });
    }

    fn clear_faults(&self) {
        self.state.lock().unwrap().faults.clear();
    }

    fn requests(&self) -> usize {
        self.state.lock().unwrap().requests.len()
    }

    fn last_body(&self) -> Value {
        let st = self.state.lock().unwrap();
        st.requests
            .iter()
            .rev()
            .find_map(|(_, _, b)| b.clone())
            .expect("a request with a body")
    }

    fn pods_named(&self, name: &str) -> usize {
        let st = self.state.lock().unwrap();
        st.pods.values().filter(|p| p["name"] == name).count()
    }

    fn set_status(&self, id: &str, status: &str) {
        let mut st = self.state.lock().unwrap();
        st.pods.get_mut(id).expect("the pod")["status"] = json!(status);
    }

    /// A pod someone else (or another hub) made, with this `env`.
    fn seed_pod(&self, name: &str, env: Value) -> String {
        let mut st = self.state.lock().unwrap();
        st.next_id += 1;
        let id = format!("seed{:04}", st.next_id);
        let pod = pod_json(
            &id,
            name,
            "python:3.11-slim",
            "",
            env,
            RTX4090,
            1,
            "US-KS-2",
            0.44,
        );
        st.pods.insert(id.clone(), pod);
        id
    }

    /// Asserts the adapter and the fake kept to the spec throughout.
    fn assert_clean(&self) {
        let st = self.state.lock().unwrap();
        assert!(
            st.violations.is_empty(),
            "spec violations:\n{}",
            st.violations.join("\n")
        );
    }
}

fn reply(status: u16, content_type: &str, body: String, headers: &[(&str, String)]) -> Response {
    let mut b = Response::builder().status(status);
    if !body.is_empty() {
        b = b.header("content-type", content_type);
    }
    for (k, v) in headers {
        b = b.header(*k, v.as_str());
    }
    b.body(Body::from(body)).unwrap()
}

/// Answers `status` with `body` after checking it against what the spec
/// says operation `op` answers.
fn answer(
    st: &mut FakeState,
    op: (&str, &str),
    status: u16,
    body: Option<&Value>,
    headers: &[(&str, String)],
) -> Response {
    let ct = if (200..300).contains(&status) {
        "application/json"
    } else {
        "application/problem+json"
    };
    let text = body.map(Value::to_string).unwrap_or_default();
    let errors = spec().validate_response(op.0, op.1, status, ct, &text);
    st.violations
        .extend(errors.into_iter().map(|e| format!("fake answer: {e}")));
    reply(status, ct, text, headers)
}

fn problem(st: &mut FakeState, op: (&str, &str), status: u16, detail: &str) -> Response {
    let title = match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        _ => "Internal Server Error",
    };
    let body = json!({"title": title, "status": status, "detail": detail});
    answer(st, op, status, Some(&body), &[])
}

/// Records the request, checks its key, and plays a pending fault (other
/// than a create's); `Some` is the answer to give instead of serving it.
fn admit(
    st: &mut FakeState,
    op: (&str, &str),
    path: String,
    headers: &HeaderMap,
    body: Option<Value>,
) -> Option<Response> {
    st.requests.push((op.0.to_string(), path, body));
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if auth != format!("Bearer {KEY}") {
        // Echo what was sent, so a test can tell the adapter kept it out of
        // its error.
        let detail = format!("invalid bearer token {auth}");
        return Some(problem(st, op, 401, &detail));
    }
    match take_fault(st, op, false)? {
        Fault::Status {
            status,
            retry_after,
            detail,
        } => {
            let body = json!({"title": "Fault", "status": status, "detail": detail});
            let headers: Vec<(&str, String)> = retry_after
                .map(|s| vec![("retry-after", s.to_string())])
                .unwrap_or_default();
            Some(answer(st, op, status, Some(&body), &headers))
        }
        Fault::Raw { status, body } => {
            Some(reply(status, "application/json", body.to_string(), &[]))
        }
        Fault::CreateThen { .. } | Fault::CreateThenDrop => None,
    }
}

/// The fault armed for `op` (a create's after-launch fault when
/// `after_create`).
fn take_fault(st: &mut FakeState, op: (&str, &str), after_create: bool) -> Option<Fault> {
    let i = st.faults.iter().position(|a| {
        a.op == op
            && matches!(a.fault, Fault::CreateThen { .. } | Fault::CreateThenDrop) == after_create
    })?;
    if st.faults[i].sticky {
        Some(st.faults[i].fault.clone())
    } else {
        Some(st.faults.remove(i).fault)
    }
}

fn level(free: u64, count: u64) -> &'static str {
    if free >= count { "HIGH" } else { "NONE" }
}

async fn catalog(
    State(state): State<Shared>,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let op = CATALOG;
    let mut st = state.lock().unwrap();
    let errors = spec().validate_query(op.0, op.1, &query);
    st.violations.extend(errors);
    if query.contains_key("include") != query.contains_key("product") {
        st.violations
            .push("catalog: include=AVAILABILITY and product go together".into());
    }
    if let Some(r) = admit(&mut st, op, "/v2/catalog/gpus".into(), &headers, None) {
        return r;
    }
    let count: u64 = query.get("count").and_then(|c| c.parse().ok()).unwrap_or(1);
    let secure = query.get("cloud").is_none_or(|c| c == "SECURE");
    let with_availability = query.get("include").is_some_and(|i| i == "AVAILABILITY");
    let gpus: Vec<Value> = st
        .gpus
        .iter()
        .map(|g| {
            let mut v = json!({
                "id": g.id,
                "name": g.name,
                "pool": null,
                "manufacturer": g.manufacturer,
                "memory": g.memory_gb,
                "secure": g.secure,
                "community": g.community,
                "price": {"secure": g.price_secure, "community": g.price_community},
                "maxCount": {"secure": g.max_secure, "community": g.max_community},
            });
            if with_availability {
                let (offered, max) = if secure {
                    (g.secure, g.max_secure)
                } else {
                    (g.community, g.max_community)
                };
                let dcs: Vec<Value> = if offered && count <= max {
                    g.free
                        .iter()
                        .map(|(dc, free)| {
                            json!({"id": dc, "name": format!("Data center {dc}"), "availability": level(*free, count)})
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                let any = dcs.iter().any(|d| d["availability"] != "NONE");
                v["availability"] = json!(if any { "HIGH" } else { "NONE" });
                if any {
                    v["dataCenters"] = Value::Array(dcs);
                }
            }
            v
        })
        .collect();
    answer(&mut st, op, 200, Some(&json!({ "gpus": gpus })), &[])
}

#[allow(clippy::too_many_arguments)]
fn pod_json(
    id: &str,
    name: &str,
    image: &str,
    args: &str,
    env: Value,
    gpu: &str,
    count: u64,
    dc: &str,
    cost: f64,
) -> Value {
    json!({
        "id": id,
        "name": name,
        "image": image,
        "args": args,
        "disk": 50,
        "ports": [],
        "env": env,
        "registry": null,
        "status": "PROVISIONING",
        "actions": ["stop", "terminate"],
        "mounts": {},
        "gpu": {"id": gpu, "count": count},
        "cloud": "SECURE",
        "dataCenterId": dc,
        "cudaVersion": null,
        "ssh": {"proxy": null, "direct": null},
        "template": null,
        "cost": cost,
        "locked": false,
        "globalNetworking": {"enabled": false},
        "runtime": null,
        "createdAt": "2026-12-01T12:00:00Z",
        "startedAt": null
    })
}

async fn create_pod(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let op = CREATE;
    let mut st = state.lock().unwrap();
    if headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_none_or(|ct| !ct.starts_with("application/json"))
    {
        st.violations
            .push("create: the body is not sent as application/json".into());
    }
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    if let Some(r) = admit(&mut st, op, "/v2/pods".into(), &headers, parsed.clone()) {
        return r;
    }
    let Some(req) = parsed else {
        st.violations.push("create: the body is not JSON".into());
        return problem(&mut st, op, 400, "request body is not valid JSON");
    };
    let errors = spec().validate_request(op.0, op.1, &req);
    if !errors.is_empty() {
        st.violations
            .extend(errors.iter().map(|e| format!("create request: {e}")));
        let body = json!({
            "title": "Unprocessable Entity",
            "status": 422,
            "detail": "Request validation failed.",
            "errors": errors,
        });
        return answer(&mut st, op, 422, Some(&body), &[]);
    }
    if req.get("gpu").is_none() == req.get("cpu").is_none() {
        return problem(&mut st, op, 400, "exactly one of gpu or cpu must be set");
    }
    let gpu_id = req["gpu"]["id"].as_str().unwrap_or("").to_string();
    let count = req["gpu"]["count"].as_u64().unwrap_or(1);
    let wanted: Vec<String> = req["dataCenterIds"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| d.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let Some(gpu) = st.gpus.iter_mut().find(|g| g.id == gpu_id) else {
        return problem(
            &mut st,
            op,
            400,
            &format!("GPU type {gpu_id} does not exist"),
        );
    };
    if count > gpu.max_secure {
        let detail = format!(
            "gpu count {count} exceeds the maximum of {} for {gpu_id}",
            gpu.max_secure
        );
        return problem(&mut st, op, 400, &detail);
    }
    let price = gpu.price_secure;
    let placed = gpu.free.iter_mut().find(|(dc, free)| {
        **free >= count && (wanted.is_empty() || wanted.iter().any(|w| w == *dc))
    });
    let Some((dc, free)) = placed else {
        return problem(
            &mut st,
            op,
            400,
            "There are no longer any instances available with the requested specifications. Please refresh and try again.",
        );
    };
    *free -= count;
    let dc = dc.to_string();
    st.next_id += 1;
    let id = format!("fake{:06}", st.next_id);
    let pod = pod_json(
        &id,
        req["name"].as_str().unwrap_or(""),
        req["image"].as_str().unwrap_or(""),
        req["args"].as_str().unwrap_or(""),
        req.get("env").cloned().unwrap_or_else(|| json!({})),
        &gpu_id,
        count,
        &dc,
        price * count as f64,
    );
    st.pods.insert(id, pod.clone());
    match take_fault(&mut st, op, true) {
        Some(Fault::CreateThen { status, body }) => {
            return reply(status, "application/json", body.to_string(), &[]);
        }
        Some(_) => {
            let text = pod.to_string();
            let half = Bytes::from(text.as_bytes()[..text.len() / 2].to_vec());
            let chunks: Vec<Result<Bytes, std::io::Error>> =
                vec![Ok(half), Err(std::io::Error::other("connection dropped"))];
            return Response::builder()
                .status(201)
                .header("content-type", "application/json")
                .header("content-length", text.len().to_string())
                .body(Body::from_stream(futures::stream::iter(chunks)))
                .unwrap();
        }
        None => {}
    }
    answer(&mut st, op, 201, Some(&pod), &[])
}

async fn list_pods(
    State(state): State<Shared>,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let op = LIST;
    let mut st = state.lock().unwrap();
    let errors = spec().validate_query(op.0, op.1, &query);
    st.violations.extend(errors);
    if let Some(r) = admit(&mut st, op, "/v2/pods".into(), &headers, None) {
        return r;
    }
    let pods: Vec<Value> = st.pods.values().cloned().collect();
    answer(&mut st, op, 200, Some(&json!({ "pods": pods })), &[])
}

async fn get_pod(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let op = GET;
    let mut st = state.lock().unwrap();
    if let Some(r) = admit(&mut st, op, format!("/v2/pods/{id}"), &headers, None) {
        return r;
    }
    match st.pods.get(&id).cloned() {
        Some(pod) => answer(&mut st, op, 200, Some(&pod), &[]),
        None => problem(&mut st, op, 404, "pod not found"),
    }
}

async fn delete_pod(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let op = DELETE;
    let mut st = state.lock().unwrap();
    if let Some(r) = admit(&mut st, op, format!("/v2/pods/{id}"), &headers, None) {
        return r;
    }
    let Some(pod) = st.pods.remove(&id) else {
        return problem(&mut st, op, 404, "pod not found");
    };
    let gpu = pod["gpu"]["id"].as_str().unwrap_or("");
    let count = pod["gpu"]["count"].as_u64().unwrap_or(1);
    let dc = pod["dataCenterId"].as_str().unwrap_or("");
    if let Some(free) = st
        .gpus
        .iter_mut()
        .find(|g| g.id == gpu)
        .and_then(|g| g.free.iter_mut().find(|(d, _)| **d == dc).map(|(_, f)| f))
    {
        *free += count;
    }
    answer(&mut st, op, 204, None, &[])
}

async fn unknown_route(State(state): State<Shared>, method: Method, uri: Uri) -> Response {
    let mut st = state.lock().unwrap();
    st.violations.push(format!(
        "{method} {uri}: not a route this adapter should call"
    ));
    reply(404, "text/plain", "no such route".into(), &[])
}

// ---------------------------------------------------------------- helpers

fn tags(hub: &str, burst: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (TAG_MANAGED_BY.to_string(), "axle".to_string()),
        (TAG_HUB.to_string(), hub.to_string()),
        (TAG_BURST_ID.to_string(), burst.to_string()),
    ])
}

fn launch_spec(key: &str, instance_type: &str, region: &str, burst: &str) -> LaunchSpec {
    LaunchSpec {
        idempotency_key: key.to_string(),
        instance_type: instance_type.to_string(),
        region: region.to_string(),
        spot: false,
        tags: tags("hub-a", burst),
        user_data: "#!/bin/sh\nexec axle-spoke --hub https://hub.example --join-token t0k3n\n"
            .to_string(),
        image: None,
    }
}

fn offer(
    gpu: &str,
    model: &str,
    n: u32,
    mem_mb: u64,
    region: &str,
    micros: u64,
    available: bool,
) -> Offer {
    Offer {
        provider: "runpod",
        instance_type: format!("{n}x {gpu}"),
        gpu_model: model.to_string(),
        gpus: n,
        gpu_memory_mb: mem_mb,
        region: region.to_string(),
        price_per_hour: Usd::from_micros(micros).times(u64::from(n)),
        spot: false,
        available,
    }
}

fn sorted(mut offers: Vec<Offer>) -> Vec<Offer> {
    offers.sort_by_key(|o| (o.instance_type.clone(), o.region.clone()));
    offers
}

fn retry_after(e: &ProviderError) -> Option<Duration> {
    match e {
        ProviderError::Retryable { retry_after, .. } => *retry_after,
        ProviderError::Permanent { .. } => None,
    }
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn catalog_offers_secure_cloud_gpus_per_count_and_data_center_at_exact_prices() {
    let fake = Fake::start().await;
    let rp = fake.adapter(&["US-KS-2", "EU-RO-1"]);
    assert_eq!(rp.kind(), "runpod");
    let offers = rp.catalog().await.unwrap();

    let mut want = Vec::new();
    for n in [1, 2, 4, 8] {
        want.push(offer(H100, "H100", n, 81_920, "US-KS-2", 2_690_000, true));
        want.push(offer(H100, "H100", n, 81_920, "EU-RO-1", 2_690_000, false));
    }
    want.push(offer(
        RTX4090, "RTX4090", 1, 24_576, "US-KS-2", 440_000, true,
    ));
    want.push(offer(
        RTX4090, "RTX4090", 1, 24_576, "EU-RO-1", 440_000, true,
    ));
    want.push(offer(
        RTX4090, "RTX4090", 2, 24_576, "US-KS-2", 440_000, false,
    ));
    want.push(offer(
        RTX4090, "RTX4090", 2, 24_576, "EU-RO-1", 440_000, true,
    ));
    assert_eq!(sorted(offers.clone()), sorted(want));

    // Exact money: $2.69 × 8 is $21.52 to the micro-dollar.
    let h100x8 = offers
        .iter()
        .find(|o| o.instance_type == format!("8x {H100}") && o.region == "US-KS-2")
        .unwrap();
    assert_eq!(h100x8.price_per_hour, Usd::from_cents(2152));
    assert!(offers.iter().all(|o| !o.spot));
    fake.assert_clean();
}

#[tokio::test]
async fn catalog_without_regions_offers_any_data_center() {
    let fake = Fake::start().await;
    let rp = fake.adapter(&[]);
    let offers = rp.catalog().await.unwrap();
    let mut want = Vec::new();
    for n in [1, 2, 4, 8] {
        want.push(offer(
            H100,
            "H100",
            n,
            81_920,
            runpod::ANY_REGION,
            2_690_000,
            true,
        ));
        want.push(offer(
            "AMD Instinct MI300X OAM",
            "MI300X",
            n,
            196_608,
            runpod::ANY_REGION,
            2_490_000,
            true,
        ));
    }
    want.push(offer(RTX4090, "RTX4090", 1, 24_576, "any", 440_000, true));
    want.push(offer(RTX4090, "RTX4090", 2, 24_576, "any", 440_000, true));
    assert_eq!(sorted(offers), sorted(want));
    fake.assert_clean();
}

#[tokio::test]
async fn launch_carries_name_tags_and_boot_script_and_list_describe_terminate_follow() {
    let fake = Fake::start().await;
    let rp = fake.adapter(&["US-KS-2", "EU-RO-1"]);
    // Pods that are not this launch's: someone else's, another hub's, one
    // claiming a burst id without Axle's managed-by tag, and one with a
    // tags variable that is not JSON.
    fake.seed_pod("jupyter", json!({"JUPYTER_PASSWORD": "x"}));
    fake.seed_pod(
        "axle-other-hub",
        json!({"AXLE_TAGS": serde_json::to_string(&tags("hub-b", "b-7")).unwrap()}),
    );
    fake.seed_pod(
        "impostor",
        json!({"AXLE_TAGS": r#"{"axle-burst-id":"b-42"}"#}),
    );
    fake.seed_pod("broken", json!({"AXLE_TAGS": "{not json"}));

    let spec = launch_spec("axle-b-42-7f3a", &format!("2x {H100}"), "US-KS-2", "b-42");
    let inst = rp.launch(&spec).await.unwrap();
    assert_eq!(inst.name, "axle-b-42-7f3a");
    assert_eq!(inst.instance_type, format!("2x {H100}"));
    assert_eq!(inst.region, "US-KS-2");
    assert_eq!(inst.state, InstanceState::Pending);
    assert_eq!(inst.tags, spec.tags);
    assert!(inst.is_axles());

    let sent = fake.last_body();
    assert_eq!(sent["name"], "axle-b-42-7f3a");
    assert_eq!(sent["gpu"], json!({"id": H100, "count": 2}));
    assert_eq!(sent["dataCenterIds"], json!(["US-KS-2"]));
    assert_eq!(sent["cloud"], "SECURE");
    assert_eq!(sent["image"], runpod::DEFAULT_IMAGE);
    assert_eq!(sent["args"], runpod::DEFAULT_IMAGE_ARGS);
    assert_eq!(sent["disk"], runpod::CONTAINER_DISK_GB);
    assert_eq!(sent["env"][runpod::USER_DATA_ENV], spec.user_data.as_str());
    let sent_tags: BTreeMap<String, String> =
        serde_json::from_str(sent["env"][runpod::TAGS_ENV].as_str().unwrap()).unwrap();
    assert_eq!(sent_tags, spec.tags);

    let axles = rp.list(TAG_MANAGED_BY, "axle").await.unwrap();
    let mut names: Vec<&str> = axles.iter().map(|i| i.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["axle-b-42-7f3a", "axle-other-hub"]);
    assert_eq!(
        rp.list(TAG_BURST_ID, "b-42").await.unwrap(),
        vec![inst.clone()]
    );
    assert_eq!(rp.list(TAG_HUB, "hub-a").await.unwrap(), vec![inst.clone()]);
    assert!(rp.list(TAG_BURST_ID, "b-404").await.unwrap().is_empty());

    assert_eq!(rp.describe(&inst.id).await.unwrap(), Some(inst.clone()));
    fake.set_status(&inst.id, "RUNNING");
    let running = rp.describe(&inst.id).await.unwrap().unwrap();
    assert_eq!(running.state, InstanceState::Running);

    rp.terminate(&inst.id).await.unwrap();
    rp.terminate(&inst.id).await.unwrap();
    assert_eq!(rp.describe(&inst.id).await.unwrap(), None);
    assert!(rp.list(TAG_BURST_ID, "b-42").await.unwrap().is_empty());
    fake.assert_clean();
}

#[tokio::test]
async fn launch_with_its_own_image_and_any_data_center() {
    let fake = Fake::start().await;
    let rp = fake.adapter(&[]);
    let mut spec = launch_spec("axle-b-5-aa", RTX4090, runpod::ANY_REGION, "b-5");
    spec.image = Some("ghcr.io/example/axle-spoke:1.4".into());
    let inst = rp.launch(&spec).await.unwrap();
    assert_eq!(inst.instance_type, format!("1x {RTX4090}"));
    assert!(!inst.region.is_empty());
    let sent = fake.last_body();
    assert_eq!(sent["image"], "ghcr.io/example/axle-spoke:1.4");
    assert!(sent.get("args").is_none());
    assert!(sent.get("dataCenterIds").is_none());
    assert_eq!(sent["gpu"], json!({"id": RTX4090, "count": 1}));
    fake.assert_clean();
}

#[tokio::test]
async fn spot_launches_are_refused_without_a_call() {
    let fake = Fake::start().await;
    let rp = fake.adapter(&["US-KS-2"]);
    let mut spec = launch_spec("axle-b-1-s", &format!("1x {H100}"), "US-KS-2", "b-1");
    spec.spot = true;
    let e = rp.launch(&spec).await.unwrap_err();
    assert!(!e.is_retryable());
    assert!(e.to_string().contains("RunPod v2 has no spot pods"), "{e}");
    assert_eq!(fake.requests(), 0);
}

#[tokio::test]
async fn no_capacity_is_a_capacity_error_and_a_rule_violation_is_permanent() {
    let fake = Fake::start().await;
    let rp = fake.adapter(&["US-KS-2", "EU-RO-1"]);
    let e = rp
        .launch(&launch_spec(
            "axle-b-2-c",
            &format!("1x {H100}"),
            "EU-RO-1",
            "b-2",
        ))
        .await
        .unwrap_err();
    assert!(e.is_capacity(), "{e}");
    assert!(e.is_retryable());

    let e = rp
        .launch(&launch_spec(
            "axle-b-3-c",
            &format!("16x {H100}"),
            "US-KS-2",
            "b-3",
        ))
        .await
        .unwrap_err();
    assert!(!e.is_retryable(), "{e}");
    assert!(e.to_string().contains("exceeds the maximum"), "{e}");
    fake.assert_clean();
}

#[tokio::test]
async fn rate_limits_are_retryable_after_the_given_time() {
    let fake = Fake::start().await;
    let rp = fake.adapter(&["US-KS-2"]);
    fake.fault(
        LIST,
        Fault::Status {
            status: 429,
            retry_after: Some(12),
            detail: "rate limit exceeded for the minute window",
        },
    );
    let e = rp.list(TAG_MANAGED_BY, "axle").await.unwrap_err();
    assert!(e.is_retryable() && !e.is_capacity(), "{e}");
    assert_eq!(retry_after(&e), Some(Duration::from_secs(12)));

    fake.fault_always(
        CATALOG,
        Fault::Status {
            status: 429,
            retry_after: Some(3),
            detail: "rate limit exceeded for the minute window",
        },
    );
    let e = rp.catalog().await.unwrap_err();
    assert_eq!(retry_after(&e), Some(Duration::from_secs(3)));
    fake.clear_faults();
    assert!(!rp.catalog().await.unwrap().is_empty());
    fake.assert_clean();
}

#[tokio::test]
async fn refused_credentials_are_permanent_and_never_in_the_error() {
    let fake = Fake::start().await;
    let wrong = "rp-wrong-key-SECRET-999";
    let rp = fake.adapter_with_key(wrong, &["US-KS-2"]);
    assert!(!format!("{rp:?}").contains(wrong));
    let errors = [
        rp.catalog().await.unwrap_err(),
        rp.list(TAG_MANAGED_BY, "axle").await.unwrap_err(),
        rp.launch(&launch_spec("axle-b-4-k", RTX4090, "US-KS-2", "b-4"))
            .await
            .unwrap_err(),
        rp.describe("fake000001").await.unwrap_err(),
        rp.terminate("fake000001").await.unwrap_err(),
    ];
    for e in errors {
        assert!(!e.is_retryable(), "{e}");
        assert!(!e.to_string().contains(wrong), "{e}");
        assert!(!format!("{e:?}").contains(wrong), "{e:?}");
    }
    fake.assert_clean();
}

#[tokio::test]
async fn server_errors_are_retryable() {
    let fake = Fake::start().await;
    let rp = fake.adapter(&["US-KS-2"]);
    fake.fault(
        GET,
        Fault::Status {
            status: 500,
            retry_after: None,
            detail: "upstream failure",
        },
    );
    let e = rp.describe("fake000001").await.unwrap_err();
    assert!(e.is_retryable() && !e.is_capacity(), "{e}");
    fake.fault(
        DELETE,
        Fault::Status {
            status: 503,
            retry_after: None,
            detail: "upstream failure",
        },
    );
    assert!(rp.terminate("fake000001").await.unwrap_err().is_retryable());
    fake.assert_clean();
}

#[tokio::test]
async fn a_launch_whose_answer_is_lost_is_found_by_listing() {
    let fake = Fake::start().await;
    let rp = fake.adapter(&["US-KS-2"]);
    let cases = [
        (
            "b-9",
            Fault::CreateThen {
                status: 500,
                body: r#"{"title":"Internal Server Error","status":500,"detail":"timeout"}"#,
            },
        ),
        (
            "b-10",
            Fault::CreateThen {
                status: 201,
                body: "{\"id\": \"fake0",
            },
        ),
        ("b-11", Fault::CreateThenDrop),
    ];
    for (burst, fault) in cases {
        let key = format!("axle-{burst}-lost");
        fake.fault(CREATE, fault);
        let spec = launch_spec(&key, &format!("1x {H100}"), "US-KS-2", burst);
        let e = rp.launch(&spec).await.unwrap_err();
        assert!(e.is_retryable() && !e.is_capacity(), "{e}");
        // The caller's retry path: list by the burst id before launching again.
        let found = rp.list(TAG_BURST_ID, burst).await.unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].name, key);
        assert_eq!(found[0].tags, spec.tags);
        assert_eq!(fake.pods_named(&key), 1);
    }
    fake.assert_clean();
}

#[tokio::test]
async fn garbage_answers_are_errors_not_panics() {
    let fake = Fake::start().await;
    let rp = fake.adapter(&["US-KS-2"]);
    let garbage = [
        "{not json",
        "",
        "null",
        "[]",
        r#"{"gpus": "many"}"#,
        r#"{"pods": [{"id": 5}]}"#,
        r#"{"gpus": [{"id": "x", "memory": -1, "price": {}, "maxCount": {}}]}"#,
        r#"{"id": "p", "env": {"AXLE_TAGS": 7}}"#,
    ];
    for body in garbage {
        for op in [CATALOG, LIST, GET] {
            fake.fault_always(op, Fault::Raw { status: 200, body });
        }
        fake.fault_always(CREATE, Fault::Raw { status: 201, body });
        assert!(rp.catalog().await.is_err(), "catalog {body}");
        assert!(
            rp.list(TAG_MANAGED_BY, "axle").await.is_err(),
            "list {body}"
        );
        assert!(rp.describe("fake000001").await.is_err(), "describe {body}");
        let spec = launch_spec("axle-b-11-g", RTX4090, "US-KS-2", "b-11");
        assert!(rp.launch(&spec).await.is_err(), "launch {body}");
        fake.clear_faults();
    }
    // An error status with a body that is not a problem document.
    fake.fault(
        GET,
        Fault::Raw {
            status: 502,
            body: "<html>bad gateway</html>",
        },
    );
    assert!(rp.describe("fake000001").await.unwrap_err().is_retryable());
    fake.assert_clean();
}

#[tokio::test]
async fn ids_and_instance_types_that_are_not_runpods_are_refused_without_a_call() {
    let fake = Fake::start().await;
    let rp = fake.adapter(&["US-KS-2"]);
    for id in ["", "../catalog/gpus", "a/b", "p?x=1", "p#f"] {
        assert!(!rp.describe(id).await.unwrap_err().is_retryable());
        assert!(!rp.terminate(id).await.unwrap_err().is_retryable());
    }
    for t in ["0x NVIDIA A40", "3x ", ""] {
        let spec = launch_spec("axle-b-12-t", t, "US-KS-2", "b-12");
        assert!(!rp.launch(&spec).await.unwrap_err().is_retryable(), "{t:?}");
    }
    let spec = launch_spec("axle-b-12-r", RTX4090, "US KS/2", "b-12");
    assert!(!rp.launch(&spec).await.unwrap_err().is_retryable());
    assert_eq!(fake.requests(), 0);
}

#[test]
fn construction_checks_its_arguments() {
    assert_eq!(runpod::DEFAULT_BASE_URL, "https://api.runpod.io");
    assert!(RunPod::new("ftp://api.runpod.io", Secret::new(KEY), vec![]).is_err());
    assert!(RunPod::new(runpod::DEFAULT_BASE_URL, Secret::new(" "), vec![]).is_err());
    assert!(
        RunPod::new(
            runpod::DEFAULT_BASE_URL,
            Secret::new(KEY),
            vec!["US KS".into()]
        )
        .is_err()
    );
    let rp = RunPod::new(
        "https://api.runpod.io/",
        Secret::new(KEY),
        vec!["US-KS-2".into()],
    )
    .unwrap();
    assert_eq!(rp.regions(), ["US-KS-2"]);
    assert!(!format!("{rp:?}").contains(KEY));
    if std::env::var_os("RUNPOD_API_KEY").is_none()
        && std::env::var_os("RUNPOD_API_KEY_FILE").is_none()
    {
        let e = RunPod::from_env(vec![]).unwrap_err();
        assert!(!e.is_retryable());
        assert!(e.to_string().contains("RUNPOD_API_KEY"), "{e}");
    }
}

// ---------------------------------------------------------------- the validator

/// Every example the spec gives for the operations the adapter uses holds
/// against its own schema: the validator is not stricter than the spec.
#[test]
fn the_specs_own_examples_validate() {
    let spec = spec();
    let ops = [
        ("get", "/v2/pods"),
        ("post", "/v2/pods"),
        ("get", "/v2/pods/{id}"),
        ("delete", "/v2/pods/{id}"),
        ("post", "/v2/pods/{id}/action"),
        ("get", "/v2/catalog/gpus"),
    ];
    let mut checked = 0;
    for (method, path) in ops {
        let op = spec.operation(method, path).unwrap();
        if let Some(examples) = op
            .pointer("/requestBody/content/application~1json/examples")
            .and_then(Value::as_object)
        {
            let schema = spec.request_schema(method, path).unwrap();
            for (name, ex) in examples {
                let errors = spec.validate(schema, &ex["value"]);
                assert!(
                    errors.is_empty(),
                    "{method} {path} request {name}: {errors:?}"
                );
                checked += 1;
            }
        }
        for (status, _) in op["responses"].as_object().unwrap() {
            let Ok(code) = status.parse::<u16>() else {
                continue;
            };
            let response = spec.response(method, path, code).unwrap();
            for (ct, content) in response
                .get("content")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                for (name, ex) in content
                    .get("examples")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                {
                    let errors =
                        spec.validate_response(method, path, code, ct, &ex["value"].to_string());
                    assert!(
                        errors.is_empty(),
                        "{method} {path} {code} {name}: {errors:?}"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 10, "only {checked} examples checked");
}

/// Bodies that drift from the spec are caught.
#[test]
fn the_validator_rejects_what_the_spec_forbids() {
    let spec = spec();
    let create = spec.request_schema("post", "/v2/pods").unwrap();
    let good = json!({
        "name": "axle-b-1",
        "image": "img",
        "cloud": "SECURE",
        "gpu": {"id": H100, "count": 1},
        "env": {"A": "b"},
    });
    assert_eq!(spec.validate(create, &good), Vec::<String>::new());
    let bad = |patch: Value| {
        let mut v = good.clone();
        for (k, val) in patch.as_object().unwrap() {
            if val.is_null() {
                v.as_object_mut().unwrap().remove(k);
            } else {
                v[k] = val.clone();
            }
        }
        spec.validate(create, &v)
    };
    // A field the v2 create body does not have (unevaluatedProperties).
    assert!(!bad(json!({"interruptible": true})).is_empty());
    assert!(!bad(json!({"gpu": {"id": H100, "count": 1, "bidPerGpu": 0.2}})).is_empty());
    assert!(!bad(json!({"gpu": {"id": H100, "count": 0}})).is_empty());
    assert!(!bad(json!({"cloud": "ALL"})).is_empty());
    assert!(!bad(json!({"env": {"A": 1}})).is_empty());
    assert!(!bad(json!({"name": ""})).is_empty());
    assert!(!bad(json!({"name": null})).is_empty());
    // `image` is required unless `templateId` is set (if/then).
    assert!(!bad(json!({"image": null})).is_empty());
    assert!(bad(json!({"image": null, "templateId": "t1"})).is_empty());

    let pod_schema = spec.schema("Pod");
    let pod = pod_json("p1", "n", "img", "", json!({}), H100, 1, "US-KS-2", 2.69);
    assert_eq!(spec.validate(pod_schema, &pod), Vec::<String>::new());
    let mut missing = pod.clone();
    missing.as_object_mut().unwrap().remove("cost");
    assert!(!spec.validate(pod_schema, &missing).is_empty());
    let mut status = pod.clone();
    status["status"] = json!("PAUSED");
    assert!(!spec.validate(pod_schema, &status).is_empty());
    let mut null_name = pod.clone();
    null_name["name"] = Value::Null;
    assert!(!spec.validate(pod_schema, &null_name).is_empty());
    let mut mounts = pod.clone();
    mounts["mounts"] = json!({"persistent": {"size": 5, "path": "/w"}});
    assert!(!spec.validate(pod_schema, &mounts).is_empty());
    let mut extra_mount = pod.clone();
    extra_mount["mounts"] = json!({"tmp": {}});
    assert!(!spec.validate(pod_schema, &extra_mount).is_empty());

    let gpus = spec.schema("ListGpuTypesResponse");
    assert!(
        !spec
            .validate(gpus, &json!({"gpus": [{"id": "x"}]}))
            .is_empty()
    );
    assert!(!spec.validate(gpus, &json!({"gpus": "x"})).is_empty());
    assert!(
        !spec
            .validate_response("get", "/v2/pods", 200, "application/json", "{not json")
            .is_empty()
    );
    assert!(
        !spec
            .validate_response("delete", "/v2/pods/{id}", 204, "application/json", "{}")
            .is_empty()
    );
    assert!(
        !spec
            .validate_response(
                "post",
                "/v2/pods",
                429,
                "application/problem+json",
                r#"{"title":"x","status":429}"#
            )
            .is_empty()
    );

    let q = |pairs: &[(&str, &str)]| {
        let query: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        spec.validate_query("get", "/v2/catalog/gpus", &query)
    };
    assert!(
        q(&[
            ("include", "AVAILABILITY"),
            ("product", "POD"),
            ("count", "2")
        ])
        .is_empty()
    );
    assert!(!q(&[("bogus", "1")]).is_empty());
    assert!(!q(&[("include", "EVERYTHING")]).is_empty());
    assert!(!q(&[("include", "AVAILABILITY,AVAILABILITY")]).is_empty());
    assert!(!q(&[("count", "0")]).is_empty());
    assert!(!q(&[("cloud", "ALL")]).is_empty());
}
