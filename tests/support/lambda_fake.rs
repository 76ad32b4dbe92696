//! A loopback fake of Lambda Cloud's API for the hub's burst scenarios: it
//! keeps instances, checks every request body and every answer against the
//! saved OpenAPI spec (`burst-providers/tests/specs/`, with the validator the
//! adapter's own tests use), and "boots" each launched instance by handing
//! its user-data to a hook (the scenarios run it: a local `axle-spoke`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

#[path = "../../burst-providers/tests/common/openapi.rs"]
#[allow(dead_code)]
mod openapi;

const SPEC: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../burst-providers/tests/specs/lambda-cloud-openapi.mock-derived.yaml"
);

/// The API key the fake accepts.
pub const KEY: &str = "fake-lambda-key-e2e";

/// One instance type the fake offers.
#[derive(Debug, Clone)]
pub struct FakeType {
    /// e.g. `gpu_1x_h100_pcie`.
    pub name: String,
    /// e.g. `H100 (80 GB PCIe)`: what the adapter reads the model and memory from.
    pub gpu_description: String,
    pub gpus: u64,
    pub cents_per_hour: u64,
    /// Regions with capacity now.
    pub regions: Vec<String>,
}

/// An instance the fake created, as the boot hook sees it.
#[derive(Debug, Clone)]
pub struct Launched {
    pub id: String,
    pub name: String,
    pub instance_type: String,
    pub region: String,
    pub tags: BTreeMap<String, String>,
    pub user_data: String,
}

type Hook = Arc<dyn Fn(&Launched) + Send + Sync>;

/// An instance as [`FakeLambda::instances`] shows it: (id, status, instance
/// type, region, tags).
pub type FakeInstance = (String, String, String, String, BTreeMap<String, String>);

struct St {
    spec: openapi::Spec,
    types: serde_json::Map<String, Value>,
    instances: BTreeMap<String, Value>,
    next_id: u64,
    on_launch: Option<Hook>,
    /// Launch answers given as 500 (the instance is made first when `after_work`).
    fail_launches: u32,
    after_work: bool,
    violations: Vec<String>,
    launches: u32,
    /// Types whose launches find no capacity though the catalog lists some
    /// (a catalog is always a little stale).
    no_capacity: std::collections::BTreeSet<String>,
    capacity_errors: u32,
    /// Launches make their instance, then never answer.
    hang: bool,
}

pub struct FakeLambda {
    state: Arc<Mutex<St>>,
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeLambda {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn region(name: &str) -> Value {
    json!({ "name": name, "description": format!("Region {name}") })
}

fn error_body(code: &str, message: &str) -> Value {
    json!({ "error": { "code": code, "message": message, "suggestion": null } })
}

impl FakeLambda {
    /// Serves `types` on 127.0.0.1 (a free port).
    pub async fn start(types: Vec<FakeType>) -> FakeLambda {
        let mut m = serde_json::Map::new();
        for t in types {
            m.insert(
                t.name.clone(),
                json!({
                    "instance_type": {
                        "name": t.name,
                        "description": format!("{}x {}", t.gpus, t.gpu_description),
                        "gpu_description": t.gpu_description,
                        "price_cents_per_hour": t.cents_per_hour,
                        "specs": { "vcpus": 26, "memory_gib": 200, "storage_gib": 512, "gpus": t.gpus },
                    },
                    "regions_with_capacity_available": t.regions.iter().map(|r| region(r)).collect::<Vec<_>>(),
                }),
            );
        }
        let state = Arc::new(Mutex::new(St {
            spec: openapi::Spec::load(SPEC),
            types: m,
            instances: BTreeMap::new(),
            next_id: 0,
            on_launch: None,
            fail_launches: 0,
            after_work: false,
            violations: Vec::new(),
            launches: 0,
            no_capacity: Default::default(),
            capacity_errors: 0,
            hang: false,
        }));
        let app = Router::new()
            .route("/api/v1/instance-types", get(instance_types))
            .route("/api/v1/instances", get(list_instances))
            .route("/api/v1/instance-operations/launch", post(launch))
            .route("/api/v1/instance-operations/terminate", post(terminate))
            .fallback(unexpected)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeLambda {
            state,
            url: format!("http://{addr}/api/v1"),
            task,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Called for every instance created (from the server's task: spawn, do not block).
    pub fn on_launch(&self, hook: impl Fn(&Launched) + Send + Sync + 'static) {
        self.state.lock().unwrap().on_launch = Some(Arc::new(hook));
    }

    /// Whether `instance_type` has capacity in `region`.
    pub fn set_capacity(&self, instance_type: &str, region_name: &str, available: bool) {
        let mut st = self.state.lock().unwrap();
        let t = st
            .types
            .get_mut(instance_type)
            .expect("a type the fake offers");
        let list = t["regions_with_capacity_available"].as_array_mut().unwrap();
        list.retain(|r| r["name"] != region_name);
        if available {
            list.push(region(region_name));
        }
    }

    /// Launches of `instance_type` find no capacity (the catalog still lists it).
    pub fn refuse_launches_of(&self, instance_type: &str) {
        self.state
            .lock()
            .unwrap()
            .no_capacity
            .insert(instance_type.to_string());
    }

    /// Launches make their instance and then hold the answer forever (a
    /// caller killed meanwhile never learns of it); false answers again.
    pub fn hang_launches(&self, hang: bool) {
        self.state.lock().unwrap().hang = hang;
    }

    /// Launches refused for capacity so far.
    pub fn capacity_errors(&self) -> u32 {
        self.state.lock().unwrap().capacity_errors
    }

    /// The next `n` launches answer 500; with `after_work`, the instance is
    /// made first (the caller never learns it was).
    pub fn fail_launches(&self, n: u32, after_work: bool) {
        let mut st = self.state.lock().unwrap();
        st.fail_launches = n;
        st.after_work = after_work;
    }

    /// The provider ends an instance on its own (a host failure, a reclaim).
    pub fn take_back(&self, id: &str) {
        self.state.lock().unwrap().instances.remove(id);
    }

    /// Every instance: (id, status, instance type, region, tags).
    pub fn instances(&self) -> Vec<FakeInstance> {
        let st = self.state.lock().unwrap();
        st.instances
            .values()
            .map(|i| {
                (
                    i["id"].as_str().unwrap_or_default().to_string(),
                    i["status"].as_str().unwrap_or_default().to_string(),
                    i["instance_type"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    i["region"]["name"].as_str().unwrap_or_default().to_string(),
                    tags_of(&i["tags"]),
                )
            })
            .collect()
    }

    /// Launch calls that made an instance.
    pub fn launches(&self) -> u32 {
        self.state.lock().unwrap().launches
    }

    /// Adds an instance as if launched by someone (a hub that crashed): Axle's tags given.
    pub fn seed(&self, instance_type: &str, region_name: &str, tags: &[(&str, &str)]) -> String {
        let mut st = self.state.lock().unwrap();
        let tags = Value::Array(
            tags.iter()
                .map(|(k, v)| json!({"key": k, "value": v}))
                .collect(),
        );
        st.add(None, tags, instance_type, region_name)
    }

    /// Panics listing every spec violation seen.
    pub fn assert_clean(&self) {
        let v = std::mem::take(&mut self.state.lock().unwrap().violations);
        assert!(
            v.is_empty(),
            "the Lambda fake saw the spec broken:\n{}",
            v.join("\n")
        );
    }
}

fn tags_of(v: &Value) -> BTreeMap<String, String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            Some((
                t["key"].as_str()?.to_string(),
                t["value"].as_str()?.to_string(),
            ))
        })
        .collect()
}

impl St {
    fn add(
        &mut self,
        name: Option<&str>,
        tags: Value,
        type_name: &str,
        region_name: &str,
    ) -> String {
        self.next_id += 1;
        let id = format!("{:032x}", 0xe2e0_0000_u128 + u128::from(self.next_id));
        let it = self.types[type_name]["instance_type"].clone();
        self.instances.insert(
            id.clone(),
            json!({
                "id": id, "name": name, "ip": null, "private_ip": null, "status": "active",
                "ssh_key_names": ["axle-ops"], "file_system_names": [],
                "region": region(region_name), "instance_type": it, "hostname": null,
                "jupyter_token": null, "jupyter_url": null, "tags": tags,
            }),
        );
        id
    }

    fn answer(&mut self, method: &str, path: &str, status: u16, body: &Value) -> Response {
        let text = body.to_string();
        let errors = match self.spec.response(method, path, status) {
            Ok(_) => self
                .spec
                .validate_response(method, path, status, "application/json", &text),
            Err(_) => self
                .spec
                .validate(self.spec.schema("errorResponseBody"), body),
        };
        self.violations.extend(
            errors
                .into_iter()
                .map(|e| format!("fake answer {method} {path}: {e}")),
        );
        (
            StatusCode::from_u16(status).unwrap(),
            [(header::CONTENT_TYPE, "application/json")],
            text,
        )
            .into_response()
    }

    fn launch(&mut self, body: &Value) -> (u16, Value, Option<(Hook, Launched)>) {
        let type_name = body["instance_type_name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let region_name = body["region_name"].as_str().unwrap_or_default().to_string();
        let Some(entry) = self.types.get(&type_name) else {
            return (
                400,
                error_body("global/invalid-parameters", "Unknown instance type."),
                None,
            );
        };
        let has = entry["regions_with_capacity_available"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == region_name.as_str());
        if !has || self.no_capacity.contains(&type_name) {
            self.capacity_errors += 1;
            return (
                400,
                error_body(
                    "instance-operations/launch/insufficient-capacity",
                    "Not enough capacity to fulfill launch request.",
                ),
                None,
            );
        }
        let tags = body.get("tags").cloned().unwrap_or(json!([]));
        let id = self.add(
            body["name"].as_str(),
            tags.clone(),
            &type_name,
            &region_name,
        );
        self.launches += 1;
        let boot = self.on_launch.clone().map(|h| {
            (
                h,
                Launched {
                    id: id.clone(),
                    name: body["name"].as_str().unwrap_or_default().to_string(),
                    instance_type: type_name,
                    region: region_name,
                    tags: tags_of(&tags),
                    user_data: body["user_data"].as_str().unwrap_or_default().to_string(),
                },
            )
        });
        (200, json!({ "data": { "instance_ids": [id] } }), boot)
    }
}

type Shared = Arc<Mutex<St>>;

/// Checks auth and the body, then runs `work`; the answer is checked too.
fn serve(
    s: &Shared,
    method: &'static str,
    path: &'static str,
    headers: &HeaderMap,
    body: Option<&[u8]>,
    work: impl FnOnce(&mut St, &Value) -> (u16, Value),
) -> Response {
    let mut st = s.lock().unwrap();
    if headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        != Some(format!("Bearer {KEY}").as_str())
    {
        return st.answer(
            method,
            path,
            401,
            &error_body("global/invalid-api-key", "API key is invalid."),
        );
    }
    let request = match body.map(serde_json::from_slice::<Value>) {
        None => Value::Null,
        Some(Err(e)) => {
            st.violations
                .push(format!("{method} {path}: not JSON: {e}"));
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
    let (status, out) = work(&mut st, &request);
    st.answer(method, path, status, &out)
}

async fn instance_types(State(s): State<Shared>, headers: HeaderMap) -> Response {
    serve(&s, "GET", "/instance-types", &headers, None, |st, _| {
        (200, json!({ "data": st.types }))
    })
}

async fn list_instances(State(s): State<Shared>, headers: HeaderMap) -> Response {
    serve(&s, "GET", "/instances", &headers, None, |st, _| {
        let data: Vec<Value> = st.instances.values().cloned().collect();
        (200, json!({ "data": data }))
    })
}

async fn launch(State(s): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let mut boot = None;
    let resp = serve(
        &s,
        "POST",
        "/instance-operations/launch",
        &headers,
        Some(&body),
        |st, b| {
            if st.fail_launches > 0 {
                st.fail_launches -= 1;
                if st.after_work {
                    boot = st.launch(b).2;
                }
                return (
                    500,
                    error_body("global/unknown", "Something unexpected occurred."),
                );
            }
            let (status, out, b) = st.launch(b);
            boot = b;
            (status, out)
        },
    );
    if let Some((hook, l)) = boot {
        hook(&l);
    }
    if s.lock().unwrap().hang {
        std::future::pending::<()>().await;
    }
    resp
}

async fn terminate(State(s): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    serve(
        &s,
        "POST",
        "/instance-operations/terminate",
        &headers,
        Some(&body),
        |st, b| {
            let mut done = Vec::new();
            for id in b["instance_ids"].as_array().into_iter().flatten() {
                let id = id.as_str().unwrap_or_default();
                match st.instances.remove(id) {
                    Some(mut inst) => {
                        inst["status"] = json!("terminated");
                        done.push(inst);
                    }
                    None => {
                        return (
                            404,
                            error_body(
                                "global/object-does-not-exist",
                                "Specified instance does not exist.",
                            ),
                        );
                    }
                }
            }
            (200, json!({ "data": { "terminated_instances": done } }))
        },
    )
}

async fn unexpected(State(s): State<Shared>, uri: axum::http::Uri) -> Response {
    s.lock()
        .unwrap()
        .violations
        .push(format!("a call the adapter should not make: {uri}"));
    (StatusCode::NOT_FOUND, "not here").into_response()
}
