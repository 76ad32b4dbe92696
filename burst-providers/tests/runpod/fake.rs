//! The loopback fake of RunPod's REST v2: pods, a GPU catalog, faults to
//! arm, every body checked against the spec.

use super::*;

/// The saved spec, found from this file so that the hub's scenarios, which
/// include this fake from another crate, read the same one.
const SPEC_TEXT: &str = include_str!("../specs/runpod-rest-v2-openapi.json");
pub(crate) const KEY: &str = "rp-test-key-SECRET-0123";
pub(crate) const H100: &str = "NVIDIA H100 80GB HBM3";
pub(crate) const RTX4090: &str = "NVIDIA GeForce RTX 4090";

pub(crate) fn spec() -> &'static Spec {
    static SPEC: OnceLock<Spec> = OnceLock::new();
    SPEC.get_or_init(|| {
        Spec::parse(SPEC_TEXT).unwrap_or_else(|e| panic!("runpod-rest-v2-openapi.json: {e}"))
    })
}

// ---------------------------------------------------------------- the fake

/// One GPU type the fake sells.
pub(crate) struct FakeGpu {
    pub(crate) id: &'static str,
    pub(crate) name: &'static str,
    pub(crate) manufacturer: &'static str,
    pub(crate) memory_gb: u64,
    pub(crate) secure: bool,
    pub(crate) community: bool,
    pub(crate) price_secure: f64,
    pub(crate) price_community: f64,
    pub(crate) max_secure: u64,
    pub(crate) max_community: u64,
    /// Free GPUs of this type on one machine, per data center.
    pub(crate) free: BTreeMap<&'static str, u64>,
}

/// An operation of the API: its method and path template.
pub(crate) type Op = (&'static str, &'static str);
pub(crate) const CATALOG: Op = ("get", "/v2/catalog/gpus");
pub(crate) const LIST: Op = ("get", "/v2/pods");
pub(crate) const CREATE: Op = ("post", "/v2/pods");
pub(crate) const GET: Op = ("get", "/v2/pods/{id}");
pub(crate) const DELETE: Op = ("delete", "/v2/pods/{id}");

/// What the fake does with a request instead of (or after) serving it.
#[derive(Clone)]
pub(crate) enum Fault {
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
pub(crate) struct Armed {
    pub(crate) op: Op,
    pub(crate) fault: Fault,
    pub(crate) sticky: bool,
}

/// Called with each pod's id and body right after the pod is made.
pub(crate) type CreateHook = Arc<dyn Fn(&str, &Value) + Send + Sync>;

#[derive(Default)]
pub(crate) struct FakeState {
    pub(crate) gpus: Vec<FakeGpu>,
    pub(crate) pods: BTreeMap<String, Value>,
    pub(crate) next_id: u64,
    pub(crate) faults: Vec<Armed>,
    pub(crate) violations: Vec<String>,
    /// Every request: method, path, and its JSON body.
    pub(crate) requests: Vec<(String, String, Option<Value>)>,
    /// Called with each pod made (its id and JSON): the hub's scenarios
    /// "boot" it by running its boot script.
    pub(crate) on_create: Option<CreateHook>,
}

pub(crate) type Shared = Arc<Mutex<FakeState>>;

pub(crate) struct Fake {
    pub(crate) state: Shared,
    pub(crate) url: String,
}

pub(crate) fn stock() -> Vec<FakeGpu> {
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
    pub(crate) async fn start() -> Fake {
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

    pub(crate) fn adapter(&self, regions: &[&str]) -> RunPod {
        self.adapter_with_key(KEY, regions)
    }

    pub(crate) fn adapter_with_key(&self, key: &str, regions: &[&str]) -> RunPod {
        RunPod::new(
            &self.url,
            Secret::new(key),
            regions.iter().map(|r| r.to_string()).collect(),
        )
        .unwrap()
    }

    /// `fault` answers the next request to `op`.
    pub(crate) fn fault(&self, op: Op, fault: Fault) {
        self.state.lock().unwrap().faults.push(Armed {
            op,
            fault,
            sticky: false,
        });
    }

    /// `fault` answers every request to `op` until [`Fake::clear_faults`].
    pub(crate) fn fault_always(&self, op: Op, fault: Fault) {
        self.state.lock().unwrap().faults.push(Armed {
            op,
            fault,
            sticky: true,
        });
    }

    /// `hook` is called with every pod made from then on.
    // Used by the hub's RunPod scenario (tests/e2e/burst/runpod.rs).
    #[allow(dead_code)]
    pub(crate) fn on_create(&self, hook: impl Fn(&str, &Value) + Send + Sync + 'static) {
        self.state.lock().unwrap().on_create = Some(Arc::new(hook));
    }

    /// The ids of the pods there are.
    #[allow(dead_code)]
    pub(crate) fn pod_ids(&self) -> Vec<String> {
        self.state.lock().unwrap().pods.keys().cloned().collect()
    }

    pub(crate) fn clear_faults(&self) {
        self.state.lock().unwrap().faults.clear();
    }

    pub(crate) fn requests(&self) -> usize {
        self.state.lock().unwrap().requests.len()
    }

    pub(crate) fn last_body(&self) -> Value {
        let st = self.state.lock().unwrap();
        st.requests
            .iter()
            .rev()
            .find_map(|(_, _, b)| b.clone())
            .expect("a request with a body")
    }

    pub(crate) fn pods_named(&self, name: &str) -> usize {
        let st = self.state.lock().unwrap();
        st.pods.values().filter(|p| p["name"] == name).count()
    }

    pub(crate) fn set_status(&self, id: &str, status: &str) {
        let mut st = self.state.lock().unwrap();
        st.pods.get_mut(id).expect("the pod")["status"] = json!(status);
    }

    /// A pod someone else (or another hub) made, with this `env`.
    pub(crate) fn seed_pod(&self, name: &str, env: Value) -> String {
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
    pub(crate) fn assert_clean(&self) {
        let st = self.state.lock().unwrap();
        assert!(
            st.violations.is_empty(),
            "spec violations:\n{}",
            st.violations.join("\n")
        );
    }
}

pub(crate) fn reply(
    status: u16,
    content_type: &str,
    body: String,
    headers: &[(&str, String)],
) -> Response {
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
pub(crate) fn answer(
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

pub(crate) fn problem(st: &mut FakeState, op: (&str, &str), status: u16, detail: &str) -> Response {
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
pub(crate) fn admit(
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
pub(crate) fn take_fault(
    st: &mut FakeState,
    op: (&str, &str),
    after_create: bool,
) -> Option<Fault> {
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

pub(crate) fn level(free: u64, count: u64) -> &'static str {
    if free >= count { "HIGH" } else { "NONE" }
}

pub(crate) async fn catalog(
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
pub(crate) fn pod_json(
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

pub(crate) async fn create_pod(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
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
    st.pods.insert(id.clone(), pod.clone());
    if let Some(hook) = st.on_create.clone() {
        hook(&id, &pod);
    }
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

pub(crate) async fn list_pods(
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

pub(crate) async fn get_pod(
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

pub(crate) async fn delete_pod(
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

pub(crate) async fn unknown_route(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
) -> Response {
    let mut st = state.lock().unwrap();
    st.violations.push(format!(
        "{method} {uri}: not a route this adapter should call"
    ));
    reply(404, "text/plain", "no such route".into(), &[])
}

// ---------------------------------------------------------------- helpers
