//! The Lambda adapter against a loopback fake of Lambda Cloud's API.
//!
//! The fake keeps instances (launched, booting then active, terminated) and
//! checks every request body the adapter sends and every answer it gives
//! against the saved spec (`tests/specs/lambda-cloud-openapi.mock-derived.yaml`);
//! each test ends by asserting the fake saw no violation.

#![cfg(feature = "lambda")]

#[path = "../common/mod.rs"]
mod common;
mod fake;

use fake::*;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axle_burst::credentials::Secret;
use axle_burst::lambda::{DEFAULT_BASE_URL, Lambda};
use axle_burst::{
    InstanceState, LaunchSpec, MANAGED_BY_VALUE, Offer, Provider, ProviderError, TAG_BURST_ID,
    TAG_HUB, TAG_MANAGED_BY,
};
use axle_policy::Usd;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use common::openapi::Spec;
use serde_json::{Value, json};

fn axle_tags(burst: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (TAG_MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
        (TAG_HUB.to_string(), "hub-eu-1".to_string()),
        (TAG_BURST_ID.to_string(), burst.to_string()),
    ])
}

fn launch_spec(burst: &str) -> LaunchSpec {
    LaunchSpec {
        idempotency_key: format!("axle-{burst}"),
        instance_type: "gpu_1x_a100_sxm4".into(),
        region: "us-east-1".into(),
        spot: false,
        tags: axle_tags(burst),
        user_data: "#cloud-config\nruncmd:\n  - [axle-spoke, --join-token-file, /run/axle/token]\n"
            .into(),
        image: Some("lambda-stack-22-04".into()),
    }
}

fn reason(e: &ProviderError) -> String {
    e.to_string()
}

// ---------------------------------------------------------------- the validator

#[test]
fn the_validator_rejects_bodies_that_break_the_spec() {
    let spec = spec();
    let launch = |body: Value| spec.validate_request("POST", "/instance-operations/launch", &body);
    let good = json!({
        "region_name": "us-east-1",
        "instance_type_name": "gpu_1x_a100_sxm4",
        "ssh_key_names": ["k"],
        "quantity": 1,
        "name": null,
        "image": { "family": "lambda-stack-22-04" },
        "tags": [{ "key": "axle-hub", "value": "h" }],
    });
    assert_eq!(launch(good.clone()), Vec::<String>::new());
    let broken = |edit: &dyn Fn(&mut Value)| {
        let mut b = good.clone();
        edit(&mut b);
        launch(b)
    };
    assert!(
        !broken(&|b| {
            b.as_object_mut().unwrap().remove("ssh_key_names");
        })
        .is_empty()
    );
    assert!(
        !broken(&|b| b["ssh_key_names"] = json!([])).is_empty(),
        "minItems"
    );
    assert!(
        !broken(&|b| b["ssh_key_names"] = json!(["a", "b"])).is_empty(),
        "maxItems"
    );
    assert!(!broken(&|b| b["quantity"] = json!(2)).is_empty(), "maximum");
    assert!(!broken(&|b| b["quantity"] = json!("1")).is_empty(), "type");
    assert!(
        !broken(&|b| b["spot"] = json!(true)).is_empty(),
        "additionalProperties"
    );
    assert!(!broken(&|b| b["image"] = json!({})).is_empty(), "anyOf");
    assert!(
        !broken(&|b| b["image"] = json!("lambda-stack")).is_empty(),
        "anyOf"
    );
    assert!(broken(&|b| b["image"] = json!({ "id": "x" })).is_empty());
    assert!(
        !broken(&|b| b["tags"] = json!([{ "key": "a" }])).is_empty(),
        "required"
    );
    assert!(
        !broken(&|b| b["tags"] = json!({ "a": "b" })).is_empty(),
        "array"
    );
    assert!(!broken(&|b| b["name"] = json!("")).is_empty(), "minLength");
    assert!(
        !broken(&|b| b["name"] = json!("n".repeat(65))).is_empty(),
        "maxLength"
    );

    // The verbatim v1.4.0 example's string prices break `type: integer`.
    let types = |price: Value| {
        spec.validate_response(
            "GET",
            "/instance-types",
            200,
            "application/json",
            &json!({ "data": { "gpu_1x_a100": {
                "instance_type": { "name": "gpu_1x_a100", "description": "1x A100 (40 GB)",
                    "price_cents_per_hour": price,
                    "specs": { "vcpus": 24, "memory_gib": 800, "storage_gib": 512 } },
                "regions_with_capacity_available": [{ "name": "us-tx-1", "description": "Austin, Texas" }],
            } } })
            .to_string(),
        )
    };
    assert_eq!(types(json!(80)), Vec::<String>::new());
    assert!(!types(json!("80")).is_empty());
    assert!(!types(json!(80.5)).is_empty());

    let instance = spec.schema("instance");
    let inst = json!({ "id": "i", "status": "active", "ssh_key_names": [], "file_system_names": [], "hostname": null });
    assert_eq!(spec.validate(instance, &inst), Vec::<String>::new());
    let mut bad = inst.clone();
    bad["status"] = json!("bogus");
    assert!(!spec.validate(instance, &bad).is_empty(), "enum");
    let mut bad = inst.clone();
    bad["ip"] = json!(7);
    assert!(!spec.validate(instance, &bad).is_empty(), "nullable string");
    let mut bad = inst;
    bad.as_object_mut().unwrap().remove("file_system_names");
    assert!(!spec.validate(instance, &bad).is_empty(), "required");

    let error = spec.schema("errorResponseBody");
    let e = |code: &str| json!({ "error": { "code": code, "message": "m" } });
    assert_eq!(
        spec.validate(error, &e("global/quota-exceeded")),
        Vec::<String>::new()
    );
    assert!(!spec.validate(error, &e("global/made-up")).is_empty());

    // OpenAPI 3.1 type lists, allOf and oneOf.
    let t31 = json!({ "type": ["string", "null"] });
    assert!(spec.validate(&t31, &json!(null)).is_empty());
    assert!(spec.validate(&t31, &json!("x")).is_empty());
    assert!(!spec.validate(&t31, &json!(5)).is_empty());
    let all = json!({ "allOf": [{ "type": "integer", "minimum": 1 }, { "maximum": 3 }] });
    assert!(spec.validate(&all, &json!(2)).is_empty());
    assert!(!spec.validate(&all, &json!(4)).is_empty());
    assert!(!spec.validate(&all, &json!(0)).is_empty());
    let one = json!({ "oneOf": [{ "type": "string" }, { "type": "boolean" }] });
    assert!(spec.validate(&one, &json!(true)).is_empty());
    assert!(!spec.validate(&one, &json!(1)).is_empty());
}

#[tokio::test]
async fn the_fake_refuses_a_request_that_breaks_the_spec() {
    let fake = Fake::start().await;
    let client = axle_burst::http_client("lambda").unwrap();
    let resp = client
        .post(format!("{}/instance-operations/launch", fake.base))
        .bearer_auth(KEY)
        .json(&json!({ "region_name": "us-east-1", "instance_type_name": "gpu_1x_a100_sxm4", "quantity": 2 }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let v = fake.take_violations();
    assert!(
        v.iter()
            .any(|e| e.contains("\"ssh_key_names\" is a required property")),
        "{v:?}"
    );
    assert!(v.iter().any(|e| e.contains("maximum")), "{v:?}");
    assert_eq!(fake.live_instances(), 2, "nothing launched");
}

// ---------------------------------------------------------------- the adapter

#[tokio::test]
async fn the_catalog_gives_one_offer_per_type_and_region_with_exact_prices() {
    let fake = Fake::start().await;
    let lambda = fake.lambda(&["us-east-1", "us-west-1"]);
    assert_eq!(lambda.kind(), "lambda");
    let offers = lambda.catalog().await.unwrap();
    let offer = |t: &str, model: &str, gpus: u32, gb: u64, region: &str, price: &str| Offer {
        provider: "lambda",
        instance_type: t.into(),
        gpu_model: model.into(),
        gpus,
        gpu_memory_mb: gb * 1024,
        region: region.into(),
        price_per_hour: Usd::parse(price).unwrap(),
        spot: false,
        available: true,
    };
    assert_eq!(
        offers,
        vec![
            offer("gpu_1x_a100_sxm4", "A100", 1, 40, "us-east-1", "1.29"),
            offer("gpu_1x_a100_sxm4", "A100", 1, 40, "us-west-1", "1.29"),
            offer("gpu_2x_a6000", "A6000", 2, 48, "us-west-1", "1.60"),
            offer("gpu_8x_h100_sxm5", "H100", 8, 80, "us-east-1", "23.92"),
        ]
    );
    assert_eq!(offers[3].price_per_hour, Usd::from_cents(2392));

    // No regions configured: every region with capacity.
    let all = fake.lambda(&[]).catalog().await.unwrap();
    assert_eq!(all.len(), 5);
    assert!(
        all.iter()
            .any(|o| o.region == "us-south-1" && o.instance_type == "gpu_8x_h100_sxm5")
    );
    assert!(
        all.iter()
            .all(|o| o.instance_type != "cpu_4x_general" && o.instance_type != "gpu_1x_gh200")
    );
    fake.assert_clean();
}

#[tokio::test]
async fn launch_list_describe_and_terminate_an_instance() {
    let fake = Fake::start().await;
    let lambda = fake.lambda(&["us-east-1", "us-west-1"]);
    let spec = launch_spec("b-42");
    let inst = lambda.launch(&spec).await.unwrap();
    assert_eq!(inst.name, "axle-b-42");
    assert_eq!(inst.instance_type, "gpu_1x_a100_sxm4");
    assert_eq!(inst.region, "us-east-1");
    assert_eq!(inst.state, InstanceState::Pending);
    assert_eq!(inst.tags, axle_tags("b-42"));
    assert!(inst.is_axles());

    let sent = fake.calls("POST /instance-operations/launch");
    assert_eq!(
        sent,
        vec![json!({
            "region_name": "us-east-1",
            "instance_type_name": "gpu_1x_a100_sxm4",
            "ssh_key_names": [SSH_KEY],
            "quantity": 1,
            "name": "axle-b-42",
            "user_data": spec.user_data,
            "image": { "family": "lambda-stack-22-04" },
            "tags": [
                { "key": TAG_BURST_ID, "value": "b-42" },
                { "key": TAG_HUB, "value": "hub-eu-1" },
                { "key": TAG_MANAGED_BY, "value": "axle" },
            ],
        })]
    );

    // By tag: Axle's instance, and not the account's others (one of them
    // named "axle", one tagged by someone else).
    let by_burst = lambda.list(TAG_BURST_ID, "b-42").await.unwrap();
    assert_eq!(by_burst.len(), 1);
    assert_eq!(by_burst[0].id, inst.id);
    assert_eq!(by_burst[0].tags, axle_tags("b-42"));
    assert_eq!(by_burst[0].state, InstanceState::Pending);
    let managed = lambda.list(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap();
    assert_eq!(
        managed.iter().map(|i| &i.id).collect::<Vec<_>>(),
        vec![&inst.id]
    );
    assert!(lambda.list(TAG_BURST_ID, "b-43").await.unwrap().is_empty());
    let theirs = lambda.list("team", "ml").await.unwrap();
    assert_eq!(theirs.len(), 1);
    assert!(!theirs[0].is_axles());

    let seen = lambda.describe(&inst.id).await.unwrap().unwrap();
    assert_eq!(seen.name, "axle-b-42");
    assert_eq!(seen.tags, axle_tags("b-42"));
    let seen = lambda.describe(&inst.id).await.unwrap().unwrap();
    assert_eq!(seen.state, InstanceState::Running);

    lambda.terminate(&inst.id).await.unwrap();
    lambda.terminate(&inst.id).await.unwrap();
    assert_eq!(lambda.describe(&inst.id).await.unwrap(), None);
    assert!(lambda.list(TAG_BURST_ID, "b-42").await.unwrap().is_empty());
    assert_eq!(
        fake.calls("POST /instance-operations/terminate"),
        vec![json!({ "instance_ids": [inst.id] }); 2]
    );
    // Never launched; and ids that cannot be Lambda's, refused unsent.
    lambda.terminate("0000ffff").await.unwrap();
    assert_eq!(lambda.describe("0000ffff").await.unwrap(), None);
    let calls = fake.state.lock().unwrap().calls.len();
    for bad in [
        "",
        "..",
        ".",
        "a/b",
        "../instance-types",
        "a?b",
        &"f".repeat(129),
    ] {
        assert!(!lambda.describe(bad).await.unwrap_err().is_retryable());
        assert!(!lambda.terminate(bad).await.unwrap_err().is_retryable());
    }
    assert_eq!(fake.state.lock().unwrap().calls.len(), calls);
    fake.assert_clean();
}

#[tokio::test]
async fn terminating_an_instance_lambda_still_lists_as_terminated_succeeds() {
    let fake = Fake::start_with(|st| st.keep_terminated = true).await;
    let lambda = fake.lambda(&[]);
    let inst = lambda.launch(&launch_spec("b-7")).await.unwrap();
    lambda.terminate(&inst.id).await.unwrap();
    // Lambda refuses the second (400); the adapter sees it terminated.
    lambda.terminate(&inst.id).await.unwrap();
    let seen = lambda.describe(&inst.id).await.unwrap().unwrap();
    assert_eq!(seen.state, InstanceState::Terminated);
    fake.assert_clean();
}

#[tokio::test]
async fn without_tags_in_answers_an_instance_is_found_by_its_name() {
    let fake = Fake::start_with(|st| st.tags_in_instances = false).await;
    let lambda = fake.lambda(&[]);
    let spec = launch_spec("b-9");
    let inst = lambda.launch(&spec).await.unwrap();
    let found = lambda
        .list(TAG_BURST_ID, &spec.idempotency_key)
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, inst.id);
    assert_eq!(found[0].name, spec.idempotency_key);
    assert!(found[0].tags.is_empty());
    assert!(!found[0].is_axles());
    // A name never stands for a tag many instances share.
    assert!(
        lambda
            .list(TAG_MANAGED_BY, MANAGED_BY_VALUE)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(lambda.list(TAG_HUB, "axle").await.unwrap().is_empty());
    fake.assert_clean();
}

#[tokio::test]
async fn a_launch_whose_answer_was_lost_is_found_by_listing() {
    let fake = Fake::start().await;
    let lambda = fake.lambda(&[]);
    fake.fault(
        "/instance-operations/launch",
        Fault::AfterTheWork { status: 500 },
    );
    let spec = launch_spec("b-77");
    let e = lambda.launch(&spec).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(!e.is_capacity());
    // The caller's retry path: list before launching again.
    let found = lambda.list(TAG_BURST_ID, "b-77").await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].name, spec.idempotency_key);
    assert!(found[0].is_axles());
    assert_eq!(fake.calls("POST /instance-operations/launch").len(), 1);
    fake.assert_clean();
}

#[tokio::test]
async fn no_capacity_is_a_capacity_error_and_a_quota_is_permanent() {
    let fake = Fake::start().await;
    let lambda = fake.lambda(&[]);
    let mut spec = launch_spec("b-1");
    spec.instance_type = "gpu_1x_gh200".into();
    let e = lambda.launch(&spec).await.unwrap_err();
    assert!(e.is_capacity(), "{e}");
    assert!(reason(&e).contains("insufficient-capacity"), "{e}");

    fake.fault(
        "/instance-operations/launch",
        Fault::Answer {
            status: 400,
            retry_after: None,
            body: error_body(
                "global/quota-exceeded",
                "Quota exceeded for this instance type.",
            ),
        },
    );
    let e = lambda.launch(&launch_spec("b-2")).await.unwrap_err();
    assert!(!e.is_retryable(), "{e}");
    assert!(reason(&e).contains("quota-exceeded"), "{e}");
    assert_eq!(fake.live_instances(), 2, "nothing launched");
    fake.assert_clean();
}

#[tokio::test]
async fn throttling_is_retryable_after_lambdas_retry_after() {
    let fake = Fake::start().await;
    let lambda = fake.lambda(&[]);
    fake.fault(
        "/instance-types",
        Fault::Answer {
            status: 429,
            retry_after: Some("7"),
            body: error_body("global/unknown", "Too many requests."),
        },
    );
    match lambda.catalog().await.unwrap_err() {
        ProviderError::Retryable {
            capacity,
            retry_after,
            ..
        } => {
            assert!(!capacity);
            assert_eq!(retry_after, Some(Duration::from_secs(7)));
        }
        e => panic!("not retryable: {e}"),
    }
    assert!(lambda.catalog().await.is_ok());
    fake.assert_clean();
}

#[tokio::test]
async fn a_refused_key_is_permanent_and_never_shown() {
    let fake = Fake::start().await;
    let wrong = "wrong-key-9f8e7d";
    let lambda = Lambda::new(fake.base.clone(), Secret::new(wrong), vec![])
        .unwrap()
        .with_ssh_key_name(SSH_KEY)
        .with_pacing(Duration::ZERO, Duration::ZERO);
    for e in [
        lambda.catalog().await.unwrap_err(),
        lambda.list(TAG_MANAGED_BY, "axle").await.unwrap_err(),
        lambda.launch(&launch_spec("b-3")).await.unwrap_err(),
        lambda.terminate("0920582c").await.unwrap_err(),
    ] {
        assert!(!e.is_retryable(), "{e}");
        assert!(!format!("{e} {e:?}").contains(wrong), "{e}");
    }
    assert!(!format!("{lambda:?}").contains(wrong));

    // A provider message echoing the key is cut before it reaches an error.
    let lambda = fake.lambda(&[]);
    fake.fault(
        "/instance-operations/launch",
        Fault::Answer {
            status: 400,
            retry_after: None,
            body: error_body(
                "global/invalid-parameters",
                &format!("bad request with key {KEY}"),
            ),
        },
    );
    let e = lambda.launch(&launch_spec("b-4")).await.unwrap_err();
    assert!(!e.is_retryable());
    assert!(!format!("{e} {e:?}").contains(KEY), "{e}");
    assert!(reason(&e).contains("bad request with key"), "{e}");
    fake.assert_clean();
}

#[tokio::test]
async fn server_errors_are_retryable() {
    let fake = Fake::start().await;
    let lambda = fake.lambda(&[]);
    for path in [
        "/instances",
        "/instances/{id}",
        "/instance-operations/terminate",
    ] {
        fake.fault(
            path,
            Fault::Answer {
                status: 500,
                retry_after: None,
                body: error_body("global/unknown", "Something unexpected occurred."),
            },
        );
    }
    assert!(
        lambda
            .list(TAG_MANAGED_BY, "axle")
            .await
            .unwrap_err()
            .is_retryable()
    );
    assert!(
        lambda
            .describe("0920582c")
            .await
            .unwrap_err()
            .is_retryable()
    );
    assert!(
        lambda
            .terminate("0920582c")
            .await
            .unwrap_err()
            .is_retryable()
    );
    fake.fault(
        "/instances",
        Fault::Raw {
            status: 502,
            body: "<html>bad gateway</html>",
        },
    );
    assert!(
        lambda
            .list(TAG_MANAGED_BY, "axle")
            .await
            .unwrap_err()
            .is_retryable()
    );
    fake.assert_clean();
}

#[tokio::test]
async fn garbage_answers_are_errors_not_panics() {
    let fake = Fake::start().await;
    let lambda = fake.lambda(&[]);
    let bodies = [
        "{not json",
        "",
        "null",
        "[]",
        r#"{"data": 5}"#,
        r#"{"data": {"gpu_1x_a100": {"instance_type": {"name": "gpu_1x_a100", "price_cents_per_hour": -1}, "regions_with_capacity_available": []}}}"#,
        r#"{"data": [{"id": 7, "status": "active"}]}"#,
        r#"{"data": {"id": "x"}}"#,
        r#"{"data": {"instance_ids": [5]}}"#,
        r#"{"data": {"instance_ids": "x"}}"#,
    ];
    for body in bodies {
        for path in [
            "/instance-types",
            "/instances",
            "/instances/{id}",
            "/instance-operations/launch",
        ] {
            fake.fault(path, Fault::Raw { status: 200, body });
        }
        assert!(lambda.catalog().await.is_err(), "catalog {body}");
        assert!(
            lambda.list(TAG_MANAGED_BY, "axle").await.is_err(),
            "list {body}"
        );
        assert!(
            lambda.describe("0920582c").await.is_err(),
            "describe {body}"
        );
        let e = lambda.launch(&launch_spec("b-5")).await.unwrap_err();
        assert!(e.is_retryable(), "launch {body}: {e}");
    }
    fake.assert_clean();
}

#[tokio::test]
async fn launches_lambda_would_refuse_are_refused_before_sending() {
    let fake = Fake::start().await;
    let no_key = Lambda::new(fake.base.clone(), Secret::new(KEY), vec![])
        .unwrap()
        .with_pacing(Duration::ZERO, Duration::ZERO);
    let e = no_key.launch(&launch_spec("b-6")).await.unwrap_err();
    assert!(!e.is_retryable());
    assert!(reason(&e).contains("LAMBDA_SSH_KEY_NAME"), "{e}");

    let lambda = fake.lambda(&["us-east-1"]);
    let refused = |edit: fn(&mut LaunchSpec)| {
        let mut s = launch_spec("b-6");
        edit(&mut s);
        s
    };
    for spec in [
        refused(|s| s.spot = true),
        refused(|s| s.idempotency_key = "k".repeat(65)),
        refused(|s| s.idempotency_key.clear()),
        refused(|s| s.region = "us-west-1".into()),
        refused(|s| {
            s.tags.insert("Team_Name".into(), "x".into());
        }),
        refused(|s| {
            s.tags.insert("team".into(), "v".repeat(129));
        }),
        refused(|s| s.user_data = "x".repeat(1_000_001)),
    ] {
        let e = lambda.launch(&spec).await.unwrap_err();
        assert!(!e.is_retryable(), "{e}");
    }
    assert!(fake.calls("POST /instance-operations/launch").is_empty());
    fake.assert_clean();
}

#[tokio::test]
async fn calls_are_paced_and_a_long_queue_is_told_to_come_back() {
    let fake = Fake::start().await;
    let paced = Lambda::new(fake.base.clone(), Secret::new(KEY), vec![])
        .unwrap()
        .with_pacing(Duration::from_millis(300), Duration::ZERO);
    let t = Instant::now();
    paced.catalog().await.unwrap();
    paced.catalog().await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );

    let slow = fake
        .lambda(&[])
        .with_pacing(Duration::ZERO, Duration::from_secs(40));
    slow.launch(&launch_spec("b-10")).await.unwrap();
    let t = Instant::now();
    match slow.launch(&launch_spec("b-11")).await.unwrap_err() {
        ProviderError::Retryable { retry_after, .. } => {
            assert!(
                retry_after.unwrap() >= Duration::from_secs(30),
                "{retry_after:?}"
            );
        }
        e => panic!("not retryable: {e}"),
    }
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(fake.calls("POST /instance-operations/launch").len(), 1);
    fake.assert_clean();
}

#[test]
fn construction_checks_the_url_and_key() {
    assert!(Lambda::new(DEFAULT_BASE_URL, Secret::new(KEY), vec![]).is_ok());
    assert!(Lambda::new("not a url", Secret::new(KEY), vec![]).is_err());
    assert!(Lambda::new("ftp://example.com", Secret::new(KEY), vec![]).is_err());
    assert!(Lambda::new(DEFAULT_BASE_URL, Secret::new(""), vec![]).is_err());
    let e = Lambda::new(DEFAULT_BASE_URL, Secret::new("bad\nkey"), vec![]).unwrap_err();
    assert!(!e.to_string().contains("bad\nkey"));
}

#[tokio::test]
async fn an_unreachable_api_is_retryable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let lambda = Lambda::new(format!("http://{addr}/api/v1"), Secret::new(KEY), vec![])
        .unwrap()
        .with_pacing(Duration::ZERO, Duration::ZERO);
    let e = lambda.catalog().await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
}
