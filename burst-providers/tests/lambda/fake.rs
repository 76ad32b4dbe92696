//! The loopback fake of Lambda Cloud's API: instances (launched, booting
//! then active, terminated), faults to arm, every body checked against the spec.

use super::*;

pub(crate) const SPEC: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/specs/lambda-cloud-openapi.mock-derived.yaml"
);
pub(crate) const KEY: &str = "secret-lambda-key-5f0c9a";
pub(crate) const SSH_KEY: &str = "axle-ops";

pub(crate) fn spec() -> Spec {
    Spec::load(SPEC)
}

// ---------------------------------------------------------------- the fake

/// A canned answer the fake gives instead of its own, once.
pub(crate) enum Fault {
    /// This status and (spec-shaped) error body.
    Answer {
        status: u16,
        retry_after: Option<&'static str>,
        body: Value,
    },
    /// This status and a body that is not what the spec says (not checked).
    Raw { status: u16, body: &'static str },
    /// Do the work (a launch happens), then answer this status: the caller
    /// never learns what was done.
    AfterTheWork { status: u16 },
}

pub(crate) struct FakeState {
    pub(crate) spec: Spec,
    /// `instance-types` data: name → {instance_type, regions_with_capacity_available}.
    pub(crate) types: serde_json::Map<String, Value>,
    /// Instances as the fake keeps them (always with `tags`).
    pub(crate) instances: BTreeMap<String, Value>,
    pub(crate) next_id: u64,
    /// Whether answers carry the instances' tags (the current API) or not
    /// (the API the saved spec's instance schema describes).
    pub(crate) tags_in_instances: bool,
    /// Whether terminated instances stay listed (status `terminated`).
    pub(crate) keep_terminated: bool,
    pub(crate) faults: BTreeMap<&'static str, VecDeque<Fault>>,
    /// Every call: "METHOD /path" and its body.
    pub(crate) calls: Vec<(String, Value)>,
    pub(crate) violations: Vec<String>,
}

pub(crate) type Shared = Arc<Mutex<FakeState>>;

pub(crate) struct Fake {
    pub(crate) state: Shared,
    pub(crate) base: String,
}

pub(crate) fn error_body(code: &str, message: &str) -> Value {
    json!({ "error": { "code": code, "message": message, "suggestion": null } })
}

pub(crate) fn region(name: &str) -> Value {
    let description = match name {
        "us-east-1" => "Virginia, USA",
        "us-west-1" => "California, USA",
        "us-south-1" => "Texas, USA",
        _ => "Somewhere",
    };
    json!({ "name": name, "description": description })
}

pub(crate) fn instance_type(
    name: &str,
    description: &str,
    cents: u64,
    gpus: Option<u64>,
    gpu_description: Option<&str>,
) -> Value {
    let mut specs = json!({ "vcpus": 30, "memory_gib": 200, "storage_gib": 512 });
    if let Some(g) = gpus {
        specs["gpus"] = json!(g);
    }
    let mut t = json!({
        "name": name,
        "description": description,
        "price_cents_per_hour": cents,
        "specs": specs,
    });
    if let Some(d) = gpu_description {
        t["gpu_description"] = json!(d);
    }
    t
}

/// The catalog the fake offers.
pub(crate) fn catalog() -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    let mut add = |t: Value, regions: &[&str]| {
        let name = t["name"].as_str().unwrap().to_string();
        m.insert(
            name,
            json!({
                "instance_type": t,
                "regions_with_capacity_available": regions.iter().map(|r| region(r)).collect::<Vec<_>>(),
            }),
        );
    };
    add(
        instance_type(
            "gpu_1x_a100_sxm4",
            "1x A100 (40 GB SXM4)",
            129,
            Some(1),
            Some("A100 (40 GB SXM4)"),
        ),
        &["us-east-1", "us-west-1"],
    );
    add(
        instance_type(
            "gpu_8x_h100_sxm5",
            "8x H100 (80 GB SXM5)",
            2392,
            Some(8),
            Some("H100 (80 GB SXM5)"),
        ),
        &["us-east-1", "us-south-1"],
    );
    // As the v1.4.0 API answered: no GPU count, no GPU description.
    add(
        instance_type("gpu_2x_a6000", "2x A6000 (48 GB)", 160, None, None),
        &["us-west-1"],
    );
    add(
        instance_type("cpu_4x_general", "4x Intel Xeon", 20, Some(0), None),
        &["us-east-1"],
    );
    // No capacity anywhere.
    add(
        instance_type(
            "gpu_1x_gh200",
            "1x GH200 (96 GB)",
            149,
            Some(1),
            Some("GH200 (96 GB)"),
        ),
        &[],
    );
    m
}

impl FakeState {
    pub(crate) fn answer(
        &mut self,
        method: &str,
        path: &str,
        status: u16,
        body: &Value,
    ) -> Response {
        let text = body.to_string();
        let errors = match self.spec.response(method, path, status) {
            Ok(_) => self
                .spec
                .validate_response(method, path, status, "application/json", &text),
            // A status the spec does not list (429, a 500 on a read): Lambda
            // answers those with its error body too.
            Err(_) => self
                .spec
                .validate(self.spec.schema("errorResponseBody"), body)
                .into_iter()
                .map(|e| format!("{method} {path} {status}: {e}"))
                .collect(),
        };
        self.violations
            .extend(errors.into_iter().map(|e| format!("fake answer: {e}")));
        (
            StatusCode::from_u16(status).unwrap(),
            [(header::CONTENT_TYPE, "application/json")],
            text,
        )
            .into_response()
    }

    /// An instance as Lambda would show it.
    pub(crate) fn render(&self, inst: &Value) -> Value {
        let mut v = inst.clone();
        if !self.tags_in_instances
            && let Some(o) = v.as_object_mut()
        {
            o.remove("tags");
        }
        v
    }

    pub(crate) fn add_instance(
        &mut self,
        name: Option<&str>,
        tags: Value,
        type_name: &str,
        region_name: &str,
    ) -> String {
        self.next_id += 1;
        let id = format!(
            "{:032x}",
            0x0920_582c_7ff0_4139_9e34_8230_0000_0000_u128 + u128::from(self.next_id)
        );
        let it = self.types[type_name]["instance_type"].clone();
        self.instances.insert(
            id.clone(),
            json!({
                "id": id,
                "name": name,
                "ip": null,
                "private_ip": null,
                "status": "booting",
                "ssh_key_names": [SSH_KEY],
                "file_system_names": [],
                "region": region(region_name),
                "instance_type": it,
                "hostname": null,
                "jupyter_token": null,
                "jupyter_url": null,
                "tags": tags,
            }),
        );
        id
    }

    pub(crate) fn launch(&mut self, body: &Value) -> (u16, Value) {
        // The spec's `pattern`s, checked by hand.
        for tag in body["tags"].as_array().into_iter().flatten() {
            let key = tag["key"].as_str().unwrap_or_default();
            let mut chars = key.chars();
            let ok = chars.next().is_some_and(|c| c.is_ascii_lowercase())
                && key.len() >= 2
                && chars
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == ':');
            if !ok {
                self.violations
                    .push(format!("launch: tag key {key:?} breaks the pattern"));
                return (
                    400,
                    error_body("global/invalid-parameters", "Invalid tag key."),
                );
            }
        }
        let type_name = body["instance_type_name"].as_str().unwrap_or_default();
        let region_name = body["region_name"].as_str().unwrap_or_default();
        let Some(entry) = self.types.get(type_name) else {
            return (
                400,
                error_body("global/invalid-parameters", "Unknown instance type."),
            );
        };
        let has_capacity = entry["regions_with_capacity_available"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == region_name);
        if !has_capacity {
            return (
                400,
                error_body(
                    "instance-operations/launch/insufficient-capacity",
                    "Not enough capacity to fulfill launch request.",
                ),
            );
        }
        let id = self.add_instance(
            body["name"].as_str(),
            body.get("tags").cloned().unwrap_or(json!([])),
            type_name,
            region_name,
        );
        (200, json!({ "data": { "instance_ids": [id] } }))
    }

    pub(crate) fn terminate(&mut self, body: &Value) -> (u16, Value) {
        let mut done = Vec::new();
        for id in body["instance_ids"].as_array().into_iter().flatten() {
            let id = id.as_str().unwrap_or_default();
            let Some(inst) = self.instances.get_mut(id) else {
                return (
                    404,
                    error_body(
                        "global/object-does-not-exist",
                        "Specified instance does not exist.",
                    ),
                );
            };
            if inst["status"] == "terminated" {
                return (
                    400,
                    error_body(
                        "global/invalid-parameters",
                        "Instance is already terminated.",
                    ),
                );
            }
            inst["status"] = json!("terminated");
            let inst = inst.clone();
            if !self.keep_terminated {
                self.instances.remove(id);
            }
            done.push(self.render(&inst));
        }
        (200, json!({ "data": { "terminated_instances": done } }))
    }
}

/// One call to the fake: auth, the request body against the spec, an
/// injected fault if one is due, then `work`, and the answer against the spec.
pub(crate) fn serve(
    shared: &Shared,
    method: &'static str,
    path: &'static str,
    headers: &HeaderMap,
    body: Option<&[u8]>,
    work: impl FnOnce(&mut FakeState, &Value) -> (u16, Value),
) -> Response {
    let mut st = shared.lock().unwrap();
    let parsed = body.map(serde_json::from_slice::<Value>);
    let recorded = match &parsed {
        Some(Ok(v)) => v.clone(),
        _ => Value::Null,
    };
    st.calls.push((format!("{method} {path}"), recorded));
    let expected = format!("Bearer {KEY}");
    if headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        != Some(expected.as_str())
    {
        return st.answer(
            method,
            path,
            401,
            &error_body(
                "global/invalid-api-key",
                "API key is invalid, expired, or deleted.",
            ),
        );
    }
    let request = match parsed {
        None => Value::Null,
        Some(Err(e)) => {
            st.violations
                .push(format!("{method} {path}: the body is not JSON: {e}"));
            return st.answer(
                method,
                path,
                400,
                &error_body("global/invalid-parameters", "Invalid JSON."),
            );
        }
        Some(Ok(v)) => {
            let errors = st.spec.validate_request(method, path, &v);
            if !errors.is_empty() {
                st.violations.extend(errors);
                return st.answer(
                    method,
                    path,
                    400,
                    &error_body("global/invalid-parameters", "Invalid request."),
                );
            }
            v
        }
    };
    let fault = st.faults.get_mut(path).and_then(VecDeque::pop_front);
    match fault {
        Some(Fault::Answer {
            status,
            retry_after,
            body,
        }) => {
            let mut resp = st.answer(method, path, status, &body);
            if let Some(r) = retry_after {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static(r));
            }
            resp
        }
        Some(Fault::Raw { status, body }) => (
            StatusCode::from_u16(status).unwrap(),
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Some(Fault::AfterTheWork { status }) => {
            let _ = work(&mut st, &request);
            st.answer(
                method,
                path,
                status,
                &error_body("global/unknown", "Something unexpected occurred."),
            )
        }
        None => {
            let (status, out) = work(&mut st, &request);
            st.answer(method, path, status, &out)
        }
    }
}

pub(crate) async fn instance_types(State(s): State<Shared>, headers: HeaderMap) -> Response {
    serve(&s, "GET", "/instance-types", &headers, None, |st, _| {
        (200, json!({ "data": st.types }))
    })
}

pub(crate) async fn list_instances(State(s): State<Shared>, headers: HeaderMap) -> Response {
    serve(&s, "GET", "/instances", &headers, None, |st, _| {
        let data: Vec<Value> = st.instances.values().map(|i| st.render(i)).collect();
        (200, json!({ "data": data }))
    })
}

pub(crate) async fn get_instance(
    State(s): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    serve(&s, "GET", "/instances/{id}", &headers, None, |st, _| {
        match st.instances.get_mut(&id) {
            Some(inst) => {
                // Booting until someone looks again.
                let shown = inst.clone();
                if inst["status"] == "booting" {
                    inst["status"] = json!("active");
                }
                (200, json!({ "data": st.render(&shown) }))
            }
            None => (
                404,
                error_body(
                    "global/object-does-not-exist",
                    "Specified instance does not exist.",
                ),
            ),
        }
    })
}

pub(crate) async fn launch(State(s): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    serve(
        &s,
        "POST",
        "/instance-operations/launch",
        &headers,
        Some(&body),
        |st, b| st.launch(b),
    )
}

pub(crate) async fn terminate(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    serve(
        &s,
        "POST",
        "/instance-operations/terminate",
        &headers,
        Some(&body),
        |st, b| st.terminate(b),
    )
}

pub(crate) async fn unexpected(State(s): State<Shared>, uri: axum::http::Uri) -> Response {
    s.lock()
        .unwrap()
        .violations
        .push(format!("a call the adapter should not make: {uri}"));
    (StatusCode::NOT_FOUND, "not here").into_response()
}

impl Fake {
    pub(crate) async fn start() -> Fake {
        Fake::start_with(|_| {}).await
    }

    pub(crate) async fn start_with(setup: impl FnOnce(&mut FakeState)) -> Fake {
        let mut st = FakeState {
            spec: spec(),
            types: catalog(),
            instances: BTreeMap::new(),
            next_id: 0,
            tags_in_instances: true,
            keep_terminated: false,
            faults: BTreeMap::new(),
            calls: Vec::new(),
            violations: Vec::new(),
        };
        // Someone else's instances in the same account.
        st.add_instance(
            Some("training-node-1"),
            json!([{ "key": "team", "value": "ml" }]),
            "gpu_1x_a100_sxm4",
            "us-east-1",
        );
        st.add_instance(Some("axle"), json!([]), "gpu_1x_a100_sxm4", "us-west-1");
        setup(&mut st);
        let state = Arc::new(Mutex::new(st));
        let app = Router::new()
            .route("/api/v1/instance-types", get(instance_types))
            .route("/api/v1/instances", get(list_instances))
            .route("/api/v1/instances/{id}", get(get_instance))
            .route("/api/v1/instance-operations/launch", post(launch))
            .route("/api/v1/instance-operations/terminate", post(terminate))
            .fallback(unexpected)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Fake {
            state,
            base: format!("http://{addr}/api/v1"),
        }
    }

    /// The adapter, pointed at the fake, unpaced.
    pub(crate) fn lambda(&self, regions: &[&str]) -> Lambda {
        Lambda::new(
            self.base.clone(),
            Secret::new(KEY),
            regions.iter().map(|r| r.to_string()).collect(),
        )
        .unwrap()
        .with_ssh_key_name(SSH_KEY)
        .with_pacing(Duration::ZERO, Duration::ZERO)
    }

    pub(crate) fn fault(&self, path: &'static str, fault: Fault) {
        self.state
            .lock()
            .unwrap()
            .faults
            .entry(path)
            .or_default()
            .push_back(fault);
    }

    pub(crate) fn calls(&self, what: &str) -> Vec<Value> {
        self.state
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|(c, _)| c == what)
            .map(|(_, b)| b.clone())
            .collect()
    }

    pub(crate) fn live_instances(&self) -> usize {
        self.state.lock().unwrap().instances.len()
    }

    pub(crate) fn take_violations(&self) -> Vec<String> {
        std::mem::take(&mut self.state.lock().unwrap().violations)
    }

    pub(crate) fn assert_clean(&self) {
        let v = self.take_violations();
        assert!(
            v.is_empty(),
            "the fake saw the spec broken:\n{}",
            v.join("\n")
        );
    }
}
