//! Single sign-on: a hub with an OIDC issuer accepts its ID tokens (RS256 and ES256,
//! checked against a JWKS) as credentials besides API tokens. The user comes from the
//! configured claim and their groups give them roles in teams (`groups:` in the team
//! file); ID tokens with a wrong issuer, audience or signature, `alg: none`, or expired
//! are refused with 401 naming why, and change nothing.

mod common;

use std::sync::Arc;

use axle_hub::auth::AuthMode;
use axle_hub::oidc::{JwksSource, Oidc, OidcConfig};
use base64::Engine as _;
use common::call;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/oidc");
const ISSUER: &str = "https://sso.example.com";

const POLICY: &str = r#"
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
    - {user: erin@example.com, role: viewer}
  groups:
    - {group: ml-vision, role: member}
    - {group: ml-leads, role: admin}
"#;

async fn hub() -> common::TestHub {
    let policy = axle_policy::load_sources(&[("p.yaml".to_string(), POLICY.to_string())])
        .expect("policy")
        .policy;
    let config = OidcConfig {
        groups_claim: Some("groups".into()),
        ..OidcConfig::new(
            ISSUER,
            "axle",
            JwksSource::File(format!("{FIXTURES}/jwks.json").into()),
        )
    };
    let oidc = Arc::new(Oidc::load(config).await.expect("JWKS"));
    common::start_hub(common::Options {
        policy: Some(policy),
        auth: Some(AuthMode::Tokens),
        oidc: Some(oidc),
        ..Default::default()
    })
    .await
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(user: &str, groups: &[&str]) -> Value {
    json!({
        "iss": ISSUER,
        "aud": "axle",
        "sub": "0001",
        "email": user,
        "groups": groups,
        "iat": now_s(),
        "exp": now_s() + 3600,
    })
}

/// An ID token of `claims`, signed with the fixture key `key` (`rsa.pem` under kid
/// `rsa-1`, `ec.pem` under `ec-1`, or `rsa2.pem`, which is not in the JWKS).
fn sign(claims: &Value, key: &str) -> String {
    let pem = std::fs::read(format!("{FIXTURES}/{key}")).unwrap();
    let (alg, kid, enc) = match key {
        "ec.pem" => (Algorithm::ES256, "ec-1", EncodingKey::from_ec_pem(&pem)),
        _ => (Algorithm::RS256, "rsa-1", EncodingKey::from_rsa_pem(&pem)),
    };
    let header = Header {
        kid: Some(kid.into()),
        ..Header::new(alg)
    };
    jsonwebtoken::encode(&header, claims, &enc.unwrap()).unwrap()
}

fn submit_body(name: &str) -> Value {
    json!({"team": "vision", "name": name, "gpus": 1, "command": ["sleep", "60"]})
}

async fn count(hub: &common::TestHub, token: &str) -> usize {
    let (status, v) = call(hub, "GET", "/api/v1/workloads", Some(token), None).await;
    assert_eq!(status, 200, "{v}");
    v["items"].as_array().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_tokens_sign_users_in_and_groups_give_roles() {
    let hub = hub().await;
    let frank = sign(&claims("frank@example.com", &["ml-vision"]), "rsa.pem");
    let (status, v) = call(&hub, "GET", "/api/v1/whoami", Some(&frank), None).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["user"], "frank@example.com");
    assert_eq!(v["authenticated_by"], format!("oidc {ISSUER}"));
    assert_eq!(v["teams"]["vision"], "member", "{v}");

    // A member by group submits; the event names the actor and how they signed in.
    let (status, v) = call(
        &hub,
        "POST",
        "/api/v1/workloads",
        Some(&frank),
        Some(submit_body("f")),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let (_, events) = call(&hub, "GET", "/api/v1/events", Some(&frank), None).await;
    let submitted = events
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "submitted")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(submitted["actor"], "frank@example.com", "{events}");
    assert!(
        submitted["auth"].as_str().unwrap_or("").contains("oidc"),
        "{submitted}"
    );

    // ES256 works too; a viewer by name stays a viewer; an admin group outranks it.
    let erin = sign(&claims("erin@example.com", &[]), "ec.pem");
    let (status, v) = call(
        &hub,
        "POST",
        "/api/v1/workloads",
        Some(&erin),
        Some(submit_body("e")),
    )
    .await;
    assert_eq!(status, 403, "{v}");
    let erin_lead = sign(&claims("erin@example.com", &["ml-leads"]), "ec.pem");
    let (_, v) = call(&hub, "GET", "/api/v1/whoami", Some(&erin_lead), None).await;
    assert_eq!(v["teams"]["vision"], "admin", "{v}");

    // Someone in no team's group may read nothing of vision's.
    let stranger = sign(&claims("gil@example.com", &["sales"]), "rsa.pem");
    assert_eq!(count(&hub, &stranger).await, 0);
    let (status, _) = call(
        &hub,
        "POST",
        "/api/v1/workloads",
        Some(&stranger),
        Some(submit_body("g")),
    )
    .await;
    assert_eq!(status, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_id_tokens_are_refused_naming_why_and_change_nothing() {
    let hub = hub().await;
    let good = claims("frank@example.com", &["ml-vision"]);
    let mut wrong_iss = good.clone();
    wrong_iss["iss"] = json!("https://evil.example");
    let mut wrong_aud = good.clone();
    wrong_aud["aud"] = json!("someone-else");
    let mut expired = good.clone();
    expired["exp"] = json!(now_s() - 3600);
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let alg_none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT", "kid": "rsa-1"})),
        b64(&good)
    );
    // Signed by a key the JWKS does not hold, under the kid of one it does.
    let pem = std::fs::read(format!("{FIXTURES}/rsa2.pem")).unwrap();
    let forged = jsonwebtoken::encode(
        &Header {
            kid: Some("rsa-1".into()),
            ..Header::new(Algorithm::RS256)
        },
        &good,
        &EncodingKey::from_rsa_pem(&pem).unwrap(),
    )
    .unwrap();
    let cases = [
        (sign(&wrong_iss, "rsa.pem"), "issuer"),
        (sign(&wrong_aud, "rsa.pem"), "audience"),
        (sign(&expired, "rsa.pem"), "expired"),
        (alg_none, "algorithm none"),
        (forged, "signature"),
    ];
    for (token, why) in cases {
        let (status, v) = call(
            &hub,
            "POST",
            "/api/v1/workloads",
            Some(&token),
            Some(submit_body("x")),
        )
        .await;
        assert_eq!(status, 401, "{why}: {v}");
        let msg = v["error"].as_str().unwrap_or("");
        assert!(msg.contains(why), "{why}: {msg}");
    }
    // Nothing was submitted.
    let frank = sign(&good, "rsa.pem");
    assert_eq!(count(&hub, &frank).await, 0);
}
