//! The RunPod adapter against a loopback fake of RunPod's REST API v2.
//!
//! The fake keeps pods and GPU stock, answers as the API documents, and
//! checks every request the adapter sends (query parameters and bodies) and
//! every answer it gives against the saved OpenAPI spec
//! (`tests/specs/runpod-rest-v2-openapi.json`). Violations are recorded and
//! each test asserts there were none; a request body that breaks the spec
//! also gets the API's 422.

#![cfg(feature = "runpod")]

#[path = "../common/mod.rs"]
mod common;
mod fake;

use fake::*;

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
