//! Overflowing numbers, wrong JSON types, escapes and bidi controls.

use std::process::Command;

use axle_e2e::bin;
use serde_json::json;

use crate::harness::{Hub, call};

#[tokio::test(flavor = "multi_thread")]
async fn odd_numbers_types_and_characters_are_refused_naming_the_field() {
    let hub = Hub::with_tokens(&[]).await;
    let admin = hub.admin.clone().unwrap();
    let alice = hub.token_for("alice").await;
    let post = |token: String, path: &'static str, body: serde_json::Value| {
        let base = hub.http();
        async move { call(&base, Some(&token), reqwest::Method::POST, path, Some(body)).await }
    };
    let mut refused = 0;
    let cases = [
        // Observed: JSON type errors gave `field: null`.
        (
            json!({"team": "vision", "gpus": "one", "command": ["x"]}),
            "gpus",
        ),
        (
            json!({"team": "vision", "gpus": 1, "command": ["x", 7]}),
            "command[1]",
        ),
        // Observed: 2^64−1 panicked the spoke's supervisor and stranded GPUs.
        (
            json!({"team": "vision", "gpus": 1, "command": ["x"], "max_runtime_s": u64::MAX}),
            "max_runtime_s",
        ),
        // Observed: `d2\u{200B}-victim` printed like `d2-victim`.
        (
            json!({"team": "vision", "gpus": 1, "command": ["x"], "name": "d2\u{200B}-victim"}),
            "name",
        ),
        (
            json!({"team": "vision", "gpus": 1, "command": ["x"], "name": "abc\u{202E}gpj"}),
            "name",
        ),
    ];
    for (body, field) in cases {
        let (status, v) = post(alice.clone(), "/api/v1/workloads", body.clone()).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["field"], field, "{body}: {v}");
        refused += 1;
    }
    // User names: `anonymous` is reserved, hidden characters refused.
    for user in ["anonymous", "mal\u{202E}lory", "bob\u{200B}"] {
        let (status, v) = post(admin.clone(), "/api/v1/tokens", json!({"user": user})).await;
        assert_eq!(status, 400, "{user:?}: {v}");
        refused += 1;
    }
    // Observed: a logs offset of 2^64−1 was accepted.
    let script = "printf '\\033]0;pwned\\007\\033[2J'";
    let (status, w) = post(
        alice.clone(),
        "/api/v1/workloads",
        json!({"team": "vision", "gpus": 1, "command": ["sh", "-c", script, "\u{1b}]0;title\u{7}"]}),
    )
    .await;
    assert_eq!(status, 201, "{w}");
    let id = w["id"].as_u64().unwrap();
    let (status, v) = call(
        &hub.http(),
        Some(&alice),
        reqwest::Method::GET,
        &format!("/api/v1/workloads/{id}/logs?offset={}", u64::MAX),
        None,
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["field"], "offset");
    refused += 1;
    // Observed: `axle describe` printed arguments with raw terminal
    // escapes (an OSC title and a clear screen reached the terminal).
    let out = Command::new(bin("axle"))
        .args([
            "--hub",
            &hub.http(),
            "describe",
            "workload",
            &id.to_string(),
        ])
        .env("AXLE_TOKEN", &alice)
        .env_remove("AXLE_HUB")
        .env("NO_COLOR", "1")
        .output()
        .expect("axle runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    assert!(text.contains("\\u{1b}]0;title\\u{7}"), "{text}");
    // Observed: the HTTP layer's own 431 (too many headers) was not JSON.
    let mut raw = String::from("GET /api/v1/workloads HTTP/1.1\r\nHost: hub\r\n");
    for i in 0..150 {
        raw.push_str(&format!("x-h{i}: v\r\n"));
    }
    raw.push_str("\r\n");
    let answer = raw_http(&hub.addr(), &raw).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(
        answer.contains("application/json") && answer.contains("at most 100 headers"),
        "{answer}"
    );
    refused += 1;
    eprintln!(
        "adversary: {refused} malformed or overflowing inputs refused with the field named \
         (JSON, 431 included); describe shows escapes as text"
    );
}

/// Sends `request` on a fresh connection; the answer as text.
async fn raw_http(addr: &str, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}
