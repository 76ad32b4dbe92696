//! HTTP API input handling: bad requests get a 4xx JSON `ApiError` naming the
//! problem and store nothing; a repeated submit with the same idempotency key
//! returns the first workload.

use std::time::Duration;

use axle_e2e::{Api, Env, request, sh};
use axle_proto::api::ApiError;

const FIXTURE: &[&str] = &["common", "api"];

async fn start() -> Env {
    Env::start(FIXTURE, &[("lab", "eu-west", &["8xH100:80GB"])]).await
}

async fn count(api: &Api) -> usize {
    api.workloads().await.len()
}

async fn submitted_events(api: &Api) -> usize {
    api.events()
        .await
        .iter()
        .filter(|e| e.kind == "submitted")
        .count()
}

/// Asserts `reply` is `status` with an `ApiError` body whose message holds
/// every one of `needles`, and returns the error.
fn expect_error(
    what: &str,
    reply: (u16, serde_json::Value),
    status: u16,
    needles: &[&str],
) -> ApiError {
    let (got, body) = reply;
    assert_eq!(got, status, "{what}: expected {status}, got {got}: {body}");
    let e: ApiError = serde_json::from_value(body.clone())
        .unwrap_or_else(|err| panic!("{what}: body is not an ApiError ({err}): {body}"));
    for n in needles {
        assert!(
            e.error.contains(n),
            "{what}: message {:?} does not mention {n:?}",
            e.error
        );
    }
    e
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_refused_with_a_clear_error_and_stores_nothing() {
    let env = start().await;
    let api = env.api();

    // A workload that finishes, for the DELETE-after-finish case.
    let done = api
        .submit_ok(&request("vision", 1.0, vec!["true".into()]))
        .await;
    let done_view = axle_e2e::wait_until(Duration::from_secs(30), "workload to succeed", || {
        let api = api.clone();
        async move {
            let w = api.workload(done.id).await;
            if w.state == "Succeeded" {
                Ok(w)
            } else {
                Err(w.state)
            }
        }
    })
    .await;

    let before = count(&api).await;
    let events_before = submitted_events(&api).await;

    let valid = r#""team":"vision","command":["sleep","60"]"#;
    let cases: Vec<(&str, String, &[&str], Option<&str>)> = vec![
        (
            "malformed JSON",
            r#"{"team":"vision","gpus":1,"command":["true"]"#.to_string(),
            &["malformed"],
            None,
        ),
        (
            "unknown team",
            r#"{"team":"nobody","gpus":1,"command":["true"]}"#.to_string(),
            &["unknown team", "nobody"],
            Some("team"),
        ),
        (
            "unknown priority",
            format!(r#"{{{valid},"gpus":1,"priority":"urgent"}}"#),
            &["unknown priority", "urgent"],
            Some("priority"),
        ),
        (
            "zero GPUs",
            format!(r#"{{{valid},"gpus":0}}"#),
            &["gpus", "0"],
            Some("gpus"),
        ),
        (
            "negative GPUs",
            format!(r#"{{{valid},"gpus":-1}}"#),
            &["gpus", "-1"],
            Some("gpus"),
        ),
        (
            "9 GPUs on 8-GPU nodes",
            format!(r#"{{{valid},"gpus":9}}"#),
            &["9", "8"],
            Some("gpus"),
        ),
        (
            "fraction off the 0.25 granularity",
            format!(r#"{{{valid},"gpus":0.3}}"#),
            &["0.3", "0.25"],
            Some("gpus"),
        ),
        (
            "unknown field",
            format!(r#"{{{valid},"gpus":1,"colour":"red"}}"#),
            &["unknown field", "colour"],
            None,
        ),
        (
            "missing command",
            r#"{"team":"vision","gpus":1}"#.to_string(),
            &["command"],
            None,
        ),
        (
            "gang of zero",
            format!(r#"{{{valid},"gpus":1,"gang":0}}"#),
            &["gang"],
            Some("gang"),
        ),
        (
            "a checkpoint signal that cannot be caught",
            format!(r#"{{{valid},"gpus":1,"checkpointable":true,"checkpoint_signal":"SIGKILL"}}"#),
            &["SIGKILL", "SIGTERM"],
            Some("checkpoint_signal"),
        ),
        (
            "a region no cluster is in",
            format!(r#"{{{valid},"gpus":1,"regions":["mars"]}}"#),
            &["mars", "known regions: eu-west"],
            Some("regions"),
        ),
        (
            "a name of a million characters",
            format!(r#"{{{valid},"gpus":1,"name":"{}"}}"#, "n".repeat(1_000_000)),
            &["1000000 characters", "at most 253"],
            Some("name"),
        ),
        (
            "a name with control characters",
            format!(r#"{{{valid},"gpus":1,"name":"red\u001b[31m"}}"#),
            &["control character"],
            Some("name"),
        ),
        (
            "a NUL in an argument",
            r#"{"team":"vision","gpus":1,"command":["sleep","6\u00000"]}"#.to_string(),
            &["NUL"],
            Some("command[1]"),
        ),
        (
            "a NUL in an env value",
            format!(r#"{{{valid},"gpus":1,"env":{{"TOKEN":"a\u0000b"}}}}"#),
            &["NUL"],
            Some("env.TOKEN"),
        ),
        (
            "an env name that is no variable name",
            format!(r#"{{{valid},"gpus":1,"env":{{"A=B":"c"}}}}"#),
            &["not a variable name"],
            Some("env.A=B"),
        ),
        (
            "production above its team's guarantee",
            format!(r#"{{{valid},"gpus":5,"priority":"production"}}"#),
            &["guarantee of 4", "never preempted", "at most 4"],
            Some("gpus"),
        ),
    ];
    for (what, body, needles, field) in cases {
        let e = expect_error(
            what,
            api.post_raw("/api/v1/workloads", &body).await,
            400,
            needles,
        );
        if let Some(f) = field {
            assert_eq!(e.field.as_deref(), Some(f), "{what}: field of {e:?}");
        }
    }

    expect_error(
        "unknown state filter",
        api.list("state=Bogus").await,
        400,
        &["unknown state", "Bogus", "Running"],
    );
    expect_error(
        "unknown filter",
        api.list("colour=red").await,
        400,
        &["colour"],
    );
    expect_error(
        "unknown team filter",
        api.list("team=nobody").await,
        400,
        &["unknown team", "nobody"],
    );
    expect_error(
        "non-numeric id",
        api.get_workload("abc").await,
        400,
        &["must be a number", "abc"],
    );
    expect_error(
        "non-numeric id to DELETE",
        api.delete("/api/v1/workloads/abc").await,
        400,
        &["must be a number"],
    );
    expect_error(
        "unknown id",
        api.get_workload("999999").await,
        404,
        &["999999", "not found"],
    );
    expect_error(
        "non-numeric log offset",
        api.get(&format!("/api/v1/workloads/{}/logs?offset=x", done.id))
            .await,
        400,
        &["offset"],
    );
    expect_error(
        "DELETE of a finished workload",
        api.cancel(done.id).await,
        409,
        &["already finished", "Succeeded"],
    );

    // Answers from the HTTP layer itself are JSON too. Observed: 405, 413
    // and 414 came back empty or as plain text.
    expect_error(
        "PUT on the workloads list",
        api.send_raw(reqwest::Method::PUT, "/api/v1/workloads", Vec::new())
            .await,
        405,
        &["PUT not allowed", "GET, POST"],
    );
    expect_error(
        "a body above the limit",
        api.send_raw(
            reqwest::Method::POST,
            "/api/v1/workloads",
            vec![b' '; 2 << 20],
        )
        .await,
        413,
        &["larger than 1048576 bytes"],
    );
    expect_error(
        "a URI above the limit",
        api.get(&format!("/api/v1/workloads?team={}", "t".repeat(20_000)))
            .await,
        414,
        &["at most 8192"],
    );
    expect_error(
        "an unknown endpoint",
        api.get("/nope").await,
        404,
        &["/api/v1"],
    );

    assert_eq!(
        count(&api).await,
        before,
        "a refused request stored a workload"
    );
    assert_eq!(
        submitted_events(&api).await,
        events_before,
        "a refused request logged a submit"
    );
    let after = api.workload(done.id).await;
    assert_eq!(after.state, "Succeeded");
    assert_eq!(
        after.history, done_view.history,
        "the refused DELETE changed the finished workload's history"
    );
    // The hub still works.
    let ok = api.submit_ok(&request("vision", 0.25, sh("exit 0"))).await;
    assert_eq!(count(&api).await, before + 1);
    assert!(ok.id > done.id);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_repeated_submit_with_the_same_idempotency_key_returns_the_first_workload() {
    let env = start().await;
    let api = env.api();
    let mut req = request("vision", 0.5, vec!["sleep".into(), "30".into()]);
    req.idempotency_key = Some("nightly-eval-2024-06-01".into());

    let (s1, b1) = api.submit(&req).await;
    assert_eq!(s1, 201, "first submit: {b1}");
    let (s2, b2) = api.submit(&req).await;
    assert_eq!(s2, 200, "repeated submit: {b2}");
    assert_eq!(b1["id"], b2["id"], "the repeat returned another workload");
    assert_eq!(count(&api).await, 1, "the repeat created a second workload");

    // A different key is a different workload.
    req.idempotency_key = Some("nightly-eval-2024-06-02".into());
    let (s3, b3) = api.submit(&req).await;
    assert_eq!(s3, 201, "submit with a new key: {b3}");
    assert_ne!(b3["id"], b1["id"]);
    assert_eq!(count(&api).await, 2);

    // The first key still maps to the first workload.
    req.idempotency_key = Some("nightly-eval-2024-06-01".into());
    let (s4, b4) = api.submit(&req).await;
    assert_eq!(s4, 200, "{b4}");
    assert_eq!(b4["id"], b1["id"]);
    assert_eq!(count(&api).await, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn lists_are_paged_in_id_order_with_filters() {
    // Observed: GET /api/v1/workloads returned everything at once (13 MB at
    // 20,000 workloads).
    let env = start().await;
    let api = env.api();
    let mut ids = Vec::new();
    for i in 0..7 {
        let mut r = request("vision", 0.25, sh("exit 0"));
        r.name = Some(format!("page-{i}"));
        if i % 2 == 0 {
            r.priority = Some("batch".into());
        }
        ids.push(api.submit_ok(&r).await.id);
    }
    let mut other = request("vision", 0.25, sh("exit 0"));
    other.name = Some("elsewhere".into());
    api.submit_ok(&other).await;

    let page = |q: String| {
        let api = api.clone();
        async move {
            let (status, body) = api.list(&q).await;
            assert_eq!(status, 200, "{q}: {body}");
            serde_json::from_value::<axle_proto::api::WorkloadList>(body).expect("a WorkloadList")
        }
    };
    let mut seen = Vec::new();
    let mut q = "name_prefix=page-&limit=3".to_string();
    let mut sizes = Vec::new();
    loop {
        let p = page(q.clone()).await;
        sizes.push(p.items.len());
        seen.extend(p.items.iter().map(|w| w.id));
        match p.continue_token {
            Some(t) => q = format!("name_prefix=page-&limit=3&continue={t}"),
            None => break,
        }
    }
    assert_eq!(sizes, [3, 3, 1]);
    assert_eq!(
        seen, ids,
        "every page in id order, nothing twice or missing"
    );

    let batch = page("name_prefix=page-&priority=batch".into()).await;
    assert_eq!(batch.items.len(), 4);
    assert!(batch.continue_token.is_none());
    assert!(batch.items.iter().all(|w| w.priority == "batch"));

    // Without a limit the hub's default page; an absurd limit is capped.
    let all = page("limit=1000000".into()).await;
    assert_eq!(all.items.len(), 8);

    expect_error("limit 0", api.list("limit=0").await, 400, &["limit"]);
    let e = expect_error(
        "a forged continue token",
        api.list("continue=hello").await,
        400,
        &["not one this hub gave out"],
    );
    assert_eq!(e.field.as_deref(), Some("continue"));

    // A page the hub keeps (its page cache) is never served stale: asked
    // again after a workload on it changed, the page shows the change.
    let mut late = request("vision", 0.25, sh("sleep 60"));
    late.name = Some("page-late".into());
    let late = api.submit_ok(&late).await.id;
    let state_in_page = |id: u64| async move {
        let p = page("name_prefix=page-&limit=10".into()).await;
        p.items
            .iter()
            .find(|w| w.id == id)
            .map(|w| w.state.clone())
            .expect("listed")
    };
    assert_ne!(state_in_page(late).await, "Cancelled");
    assert_ne!(state_in_page(late).await, "Cancelled");
    let (status, body) = api.cancel(late).await;
    assert_eq!(status, 200, "{body}");
    api.wait_state(late, "Cancelled", Duration::from_secs(30))
        .await;
    assert_eq!(state_in_page(late).await, "Cancelled");
}
