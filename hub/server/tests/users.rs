//! Users, roles and every call checked, on a hub that requires API tokens: each role ×
//! each operation over HTTP (a table), the same checks on gRPC, tokens minted only by
//! platform admins, stored hashed, expiring, and every event of a user's call naming
//! its actor.
//!
//! Observed before: anyone who reached the API could submit as any team, list every
//! team's work and cancel anyone's; team roles were parsed and never enforced; events
//! recorded no actor.

mod common;

use std::time::Duration;

use axle_hub::auth::{AuthMode, TokenRecord};
use axle_proto::pb;
use common::{call, call_full};
use serde_json::{Value, json};

const POLICY: &str = r#"
apiVersion: axle.dev/v1
kind: Settings
metadata: {name: default}
spec:
  platformAdmins: [root]
---
apiVersion: axle.dev/v1
kind: Cluster
metadata: {name: c1}
spec:
  region: eu
  nodes: [{count: 1, gpuModel: H100, gpusPerNode: 8}]
---
apiVersion: axle.dev/v1
kind: Team
metadata: {name: vision}
spec:
  quotas: {H100: {guaranteed: 4, limit: 8}}
  members:
    - {user: alice, role: admin}
    - {user: bob, role: member}
    - {user: carol, role: viewer}
---
apiVersion: axle.dev/v1
kind: Team
metadata: {name: nlp}
spec:
  quotas: {H100: {guaranteed: 4, limit: 8}}
  members:
    - {user: dave, role: member}
"#;

/// A hub requiring tokens, with root's token from its start.
async fn hub() -> (common::TestHub, String) {
    let policy = axle_policy::load_sources(&[("p.yaml".to_string(), POLICY.to_string())])
        .expect("policy")
        .policy;
    let (id, token, sha256) = axle_hub::auth::mint().unwrap();
    let root = TokenRecord {
        v: 1,
        id,
        user: "root".into(),
        sha256,
        created_at_ms: 0,
        expires_at_ms: u64::MAX,
        created_by: "test".into(),
    };
    let hub = common::start_hub(common::Options {
        policy: Some(policy),
        auth: Some(AuthMode::Tokens),
        bootstrap_token: Some(root),
        ..Default::default()
    })
    .await;
    (hub, token)
}

/// A token for `user`, minted by root.
async fn token_for(hub: &common::TestHub, root: &str, user: &str) -> String {
    let (status, v) = call(
        hub,
        "POST",
        "/api/v1/tokens",
        Some(root),
        Some(json!({"user": user})),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    v["token"].as_str().unwrap().to_string()
}

fn submit_body(team: &str, name: &str) -> Value {
    json!({"team": team, "name": name, "gpus": 1, "command": ["sleep", "60"]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_may_do_what_the_policy_says_and_nothing_else() {
    let (hub, root) = hub().await;
    let mut t = std::collections::BTreeMap::new();
    t.insert("root", root.clone());
    for u in ["alice", "bob", "carol", "dave"] {
        t.insert(u, token_for(&hub, &root, u).await);
    }
    let tok = |u: &str| t.get(u).map(String::as_str);

    // No credentials, or a forged token: 401, and nothing happens.
    let (s, v) = call(
        &hub,
        "POST",
        "/api/v1/workloads",
        None,
        Some(submit_body("vision", "x")),
    )
    .await;
    assert_eq!(s, 401, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("no credentials"),
        "{v}"
    );
    let forged = format!("axle_{}_{}", "0".repeat(12), "0".repeat(64));
    let (s, _) = call(&hub, "GET", "/api/v1/workloads", Some(&forged), None).await;
    assert_eq!(s, 401);

    // Submit for vision: each user, and the status they get.
    let mut ids = std::collections::BTreeMap::new();
    for (user, want) in [
        ("root", 201),
        ("alice", 201),
        ("bob", 201),
        ("carol", 403),
        ("dave", 403),
    ] {
        let (s, v) = call(
            &hub,
            "POST",
            "/api/v1/workloads",
            tok(user),
            Some(submit_body("vision", user)),
        )
        .await;
        assert_eq!(s, want, "{user} submitting for vision: {v}");
        if s == 201 {
            ids.insert(user, v["id"].as_u64().unwrap());
        } else {
            assert!(v["error"].as_str().unwrap().contains(user), "{v}");
        }
    }
    let bobs = ids["bob"];
    let alices = ids["alice"];

    // Read one of vision's workloads, and its logs.
    for (user, want) in [
        ("root", 200),
        ("alice", 200),
        ("bob", 200),
        ("carol", 200),
        ("dave", 403),
    ] {
        let (s, v) = call(
            &hub,
            "GET",
            &format!("/api/v1/workloads/{bobs}"),
            tok(user),
            None,
        )
        .await;
        assert_eq!(s, want, "{user} reading workload {bobs}: {v}");
        let (s, v) = call(
            &hub,
            "GET",
            &format!("/api/v1/workloads/{bobs}/logs"),
            tok(user),
            None,
        )
        .await;
        assert_eq!(s, want, "{user} reading the logs of {bobs}: {v}");
    }

    // Lists show only what the caller may see.
    for (user, want) in [("root", 3), ("carol", 3), ("dave", 0)] {
        let (s, v) = call(&hub, "GET", "/api/v1/workloads", tok(user), None).await;
        assert_eq!(s, 200);
        assert_eq!(v["items"].as_array().unwrap().len(), want, "{user}: {v}");
    }

    // Cancel: members their own, admins any of the team's.
    for (user, id, want) in [
        ("dave", bobs, 403),
        ("carol", bobs, 403),
        ("bob", alices, 403),
        ("bob", bobs, 200),
        ("alice", ids["root"], 200),
    ] {
        let (s, v) = call(
            &hub,
            "DELETE",
            &format!("/api/v1/workloads/{id}"),
            tok(user),
            None,
        )
        .await;
        assert_eq!(s, want, "{user} cancelling {id}: {v}");
    }

    // Tokens: platform admins only.
    for (user, want) in [("alice", 403), ("bob", 403), ("root", 201)] {
        let (s, v) = call(
            &hub,
            "POST",
            "/api/v1/tokens",
            tok(user),
            Some(json!({"user": "eve"})),
        )
        .await;
        assert_eq!(s, want, "{user} minting a token: {v}");
    }

    // whoami names the user and their roles.
    let (_, me) = call(&hub, "GET", "/api/v1/whoami", tok("bob"), None).await;
    assert_eq!(me["user"], "bob");
    assert_eq!(me["teams"]["vision"], "member");
    assert_eq!(me["platform_admin"], false);

    // Every event of a user's call names the actor and how they authenticated; dave
    // sees none of vision's workload events.
    let (_, events) = call(&hub, "GET", "/api/v1/events?tail=1000", tok("root"), None).await;
    let events = events.as_array().unwrap().clone();
    let submitted: Vec<&Value> = events.iter().filter(|e| e["kind"] == "submitted").collect();
    assert_eq!(submitted.len(), 3);
    for e in &submitted {
        assert!(e["actor"].is_string(), "{e}");
        assert!(e["auth"].as_str().unwrap().starts_with("token "), "{e}");
    }
    let cancelled = events
        .iter()
        .find(|e| e["kind"] == "cancel_requested" && e["workload"] == bobs);
    assert!(
        cancelled
            .is_some_and(|e| e["actor"] == "bob"
                && e["message"] == format!("workload {bobs} cancelled by bob")),
        "{events:#?}"
    );
    let (_, seen) = call(&hub, "GET", "/api/v1/events?tail=1000", tok("dave"), None).await;
    assert!(
        seen.as_array()
            .unwrap()
            .iter()
            .all(|e| e["workload"].is_null()),
        "{seen}"
    );
    let _ = hub.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_stored_hashed_expire_and_are_checked_on_grpc_too() {
    let (hub, root) = hub().await;
    let dave = token_for(&hub, &root, "dave").await;
    // Stored: the digest, never the token.
    let (s, v) = call(
        &hub,
        "POST",
        "/api/v1/tokens",
        Some(&root),
        Some(json!({"user": "brief", "ttl_s": 1})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let brief = v["token"].as_str().unwrap().to_string();
    let (s, _) = call(&hub, "GET", "/api/v1/whoami", Some(&brief), None).await;
    assert_eq!(s, 200);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (s, v) = call(&hub, "GET", "/api/v1/whoami", Some(&brief), None).await;
    assert_eq!(s, 401);
    assert!(v["error"].as_str().unwrap().contains("expired"), "{v}");

    // Listed without secrets (platform admins only), and revoked at once.
    let (s, v) = call(&hub, "GET", "/api/v1/tokens", Some(&dave), None).await;
    assert_eq!(s, 403, "{v}");
    let (s, list) = call(&hub, "GET", "/api/v1/tokens", Some(&root), None).await;
    assert_eq!(s, 200);
    let text = list.to_string();
    assert!(
        !text.contains("sha256") && !text.contains(dave.rsplit('_').next().unwrap()),
        "{text}"
    );
    let daves = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["user"] == "dave")
        .expect("dave's token listed")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, _) = call(
        &hub,
        "DELETE",
        &format!("/api/v1/tokens/{daves}"),
        Some(&dave),
        None,
    )
    .await;
    assert_eq!(s, 403, "dave may not revoke tokens, even his own");
    let (s, v) = call(
        &hub,
        "DELETE",
        &format!("/api/v1/tokens/{daves}"),
        Some(&root),
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, _) = call(&hub, "GET", "/api/v1/whoami", Some(&dave), None).await;
    assert_eq!(s, 401, "a revoked token is refused");
    let (s, _) = call(
        &hub,
        "DELETE",
        &format!("/api/v1/tokens/{daves}"),
        Some(&root),
        None,
    )
    .await;
    assert_eq!(s, 404);
    let dave = token_for(&hub, &root, "dave").await;

    // Bad requests change nothing.
    for body in [
        json!({"user": ""}),
        json!({"user": "x", "ttl_s": 400 * 86_400}),
        json!({"nope": 1}),
    ] {
        let (s, v) = call(
            &hub,
            "POST",
            "/api/v1/tokens",
            Some(&root),
            Some(body.clone()),
        )
        .await;
        assert_eq!(s, 400, "{body}: {v}");
    }

    // gRPC: no token, another team, then allowed.
    let url = hub.grpc_url();
    let mut c = None;
    for _ in 0..100 {
        if let Ok(x) = pb::user_service_client::UserServiceClient::connect(url.clone()).await {
            c = Some(x);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut c = c.unwrap();
    let req = |team: &str, token: Option<&str>| {
        let mut r = tonic::Request::new(pb::SubmitRequest {
            team: team.into(),
            command: vec!["true".into()],
            gpus: 1.0,
            ..Default::default()
        });
        if let Some(t) = token {
            r.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        r
    };
    let e = c.submit(req("nlp", None)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = c.submit(req("vision", Some(&dave))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let w = c
        .submit(req("nlp", Some(&dave)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(w.team, "nlp");
    drop(c);
    let _ = hub.stop.send(());
    hub.run.await.unwrap().unwrap();

    // The store keeps each token's digest, never the token.
    // The hub's last tasks let go of the file a moment after it stops.
    let path = hub.data.path().join(axle_hub::server::STORE_FILE);
    let mut opened = axle_hub::store::RedbStore::open(&path);
    for _ in 0..100 {
        if opened.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        opened = axle_hub::store::RedbStore::open(&path);
    }
    let store = opened.expect("the stopped hub's store");
    let kept = axle_hub::store::Store::range(store.as_ref(), axle_hub::records::TOKENS)
        .await
        .unwrap();
    assert_eq!(
        kept.len(),
        2,
        "root's and dave's new one: the revoked one is deleted, the expired one pruned at the next mint"
    );
    let secret = dave.rsplit('_').next().unwrap();
    for kv in &kept {
        let text = String::from_utf8_lossy(&kv.value);
        assert!(!text.contains(secret) && text.contains("sha256"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_beyond_their_rate_gets_429_with_retry_after_and_others_go_on() {
    let policy = axle_policy::load_sources(&[("p.yaml".to_string(), POLICY.to_string())])
        .expect("policy")
        .policy;
    let (id, root, sha256) = axle_hub::auth::mint().unwrap();
    let hub = common::start_hub(common::Options {
        policy: Some(policy),
        auth: Some(AuthMode::Tokens),
        bootstrap_token: Some(TokenRecord {
            v: 1,
            id,
            user: "root".into(),
            sha256,
            created_at_ms: 0,
            expires_at_ms: u64::MAX,
            created_by: "test".into(),
        }),
        rate_limits: Some(axle_hub::rate::RateLimits {
            per_user_per_s: 1,
            per_user_burst: 5,
            max_in_flight: 64,
        }),
        ..Default::default()
    })
    .await;
    let bob = token_for(&hub, &root, "bob").await;
    for i in 0..5 {
        let (s, v) = call(&hub, "GET", "/api/v1/whoami", Some(&bob), None).await;
        assert_eq!(s, 200, "call {i}: {v}");
    }
    let (s, head, v) = call_full(&hub, "GET", "/api/v1/whoami", Some(&bob), None).await;
    assert_eq!(s, 429, "{v}");
    assert!(head.contains("retry-after: 1"), "{head}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("bob made more than 5 calls"),
        "{v}"
    );
    // root's bucket is root's own (two calls used: its token request, bob's token).
    let (s, _) = call(&hub, "GET", "/api/v1/whoami", Some(&root), None).await;
    assert_eq!(s, 200);
    let _ = hub.stop.send(());
}
