//! The verifier against the keys in `tests/fixtures/oidc` (test-only keys).

use super::*;
use jsonwebtoken::{EncodingKey, Header};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/oidc");
const NOW: u64 = 1_790_000_000;
const ISSUER: &str = "https://sso.example";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(FIXTURES).join(name)
}

fn config(jwks: JwksSource) -> OidcConfig {
    OidcConfig {
        groups_claim: Some("groups".to_string()),
        ..OidcConfig::new(ISSUER, "axle", jwks)
    }
}

async fn oidc() -> Oidc {
    Oidc::load(config(JwksSource::File(fixture("jwks.json"))))
        .await
        .unwrap()
}

/// The claims of a good token, with `patch` merged in (null removes).
fn claims(patch: Value) -> Value {
    let mut claims = json!({
        "iss": ISSUER,
        "aud": "axle",
        "sub": "u-1",
        "email": "ada@example.com",
        "email_verified": true,
        "groups": ["ml", "admins"],
        "iat": NOW - 10,
        "exp": NOW + 3600,
    });
    let (Value::Object(map), Value::Object(patch)) = (&mut claims, patch) else {
        panic!("claims are objects");
    };
    for (k, v) in patch {
        if v.is_null() {
            map.remove(&k);
        } else {
            map.insert(k, v);
        }
    }
    claims
}

fn sign(alg: Algorithm, kid: Option<&str>, key: &str, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_string);
    let key = match alg {
        Algorithm::HS256 => EncodingKey::from_secret(key.as_bytes()),
        Algorithm::ES256 => {
            EncodingKey::from_ec_pem(&std::fs::read(fixture(key)).unwrap()).unwrap()
        }
        _ => EncodingKey::from_rsa_pem(&std::fs::read(fixture(key)).unwrap()).unwrap(),
    };
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

fn rs(claims: &Value) -> String {
    sign(Algorithm::RS256, Some("rsa-1"), "rsa.pem", claims)
}

fn es(claims: &Value) -> String {
    sign(Algorithm::ES256, Some("ec-1"), "ec.pem", claims)
}

fn b64json(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
}

fn refused(oidc: &Oidc, token: &str) -> String {
    match oidc.verify(token, NOW) {
        Ok(user) => panic!("accepted {user:?}"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn valid_rs256_and_es256_tokens_are_accepted() {
    let oidc = oidc().await;
    let want = OidcUser {
        user: "ada@example.com".to_string(),
        groups: vec!["ml".to_string(), "admins".to_string()],
        issuer: ISSUER.to_string(),
    };
    assert_eq!(oidc.verify(&rs(&claims(json!({}))), NOW).unwrap(), want);
    assert_eq!(oidc.verify(&es(&claims(json!({}))), NOW).unwrap(), want);
    // An audience list, a fractional exp, a single group, repeated groups.
    let token = rs(&claims(
        json!({"aud": ["other", "axle"], "exp": NOW as f64 + 0.5}),
    ));
    assert_eq!(oidc.verify(&token, NOW).unwrap().user, "ada@example.com");
    let token = es(&claims(json!({"groups": "ml"})));
    assert_eq!(oidc.verify(&token, NOW).unwrap().groups, ["ml"]);
    let token = es(&claims(json!({"groups": ["ml", "ml", "ops"]})));
    assert_eq!(oidc.verify(&token, NOW).unwrap().groups, ["ml", "ops"]);
    let token = es(&claims(json!({"groups": null})));
    assert!(oidc.verify(&token, NOW).unwrap().groups.is_empty());
}

#[tokio::test]
async fn the_configured_claims_name_the_user_and_groups() {
    let mut config = config(JwksSource::File(fixture("jwks.json")));
    config.user_claim = "preferred_username".to_string();
    config.groups_claim = Some("roles".to_string());
    let oidc = Oidc::load(config).await.unwrap();
    let token = rs(&claims(
        json!({"preferred_username": "ada", "roles": ["r"]}),
    ));
    let user = oidc.verify(&token, NOW).unwrap();
    assert_eq!(
        (user.user.as_str(), user.groups),
        ("ada", vec!["r".to_string()])
    );
    // email_verified only matters when the user is the e-mail address.
    let token = rs(&claims(
        json!({"preferred_username": "ada", "email_verified": false}),
    ));
    assert!(oidc.verify(&token, NOW).is_ok());

    // No groups claim configured: no groups, whatever the token says.
    let config = OidcConfig::new(ISSUER, "axle", JwksSource::File(fixture("jwks.json")));
    let oidc = Oidc::load(config).await.unwrap();
    assert!(
        oidc.verify(&rs(&claims(json!({}))), NOW)
            .unwrap()
            .groups
            .is_empty()
    );
}

#[tokio::test]
async fn a_wrong_issuer_or_audience_is_refused() {
    let oidc = oidc().await;
    let token = rs(&claims(json!({"iss": "https://evil.example"})));
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's issuer is https://evil.example, this hub accepts https://sso.example"
    );
    // Exactly: no trailing slash, no case folding.
    let token = rs(&claims(json!({"iss": "https://sso.example/"})));
    assert!(matches!(
        oidc.verify(&token, NOW),
        Err(OidcError::Issuer { .. })
    ));
    let token = rs(&claims(json!({"iss": null})));
    assert_eq!(refused(&oidc, &token), "the ID token has no iss claim");

    let token = rs(&claims(json!({"aud": "x"})));
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's audience [x] does not include axle"
    );
    let token = es(&claims(json!({"aud": ["x", "y"]})));
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's audience [x, y] does not include axle"
    );
    let many: Vec<String> = (0..20).map(|i| format!("a{i}")).collect();
    let token = rs(&claims(json!({"aud": many})));
    assert!(refused(&oidc, &token).contains("[a0, a1, a2, a3, a4, a5, a6, a7, …]"));
    let token = rs(&claims(json!({"aud": null})));
    assert_eq!(refused(&oidc, &token), "the ID token has no aud claim");
    let token = rs(&claims(json!({"aud": ["axle", 5]})));
    assert!(matches!(
        oidc.verify(&token, NOW),
        Err(OidcError::ClaimType { .. })
    ));
}

#[tokio::test]
async fn a_bad_signature_is_refused() {
    let oidc = oidc().await;
    // Signed by rsa2.pem, claiming to be rsa-1.
    let token = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        "rsa2.pem",
        &claims(json!({})),
    );
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's signature does not verify against key rsa-1 of the JWKS"
    );
    // A good token's payload swapped for another user's.
    let good = rs(&claims(json!({})));
    let parts: Vec<&str> = good.split('.').collect();
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        b64json(&claims(json!({"email": "eve@example.com"}))),
        parts[2]
    );
    assert!(matches!(
        oidc.verify(&forged, NOW),
        Err(OidcError::Signature { .. })
    ));
    // An RS256 signature presented as ES256 (and the other way round).
    let token = sign(
        Algorithm::RS256,
        Some("ec-1"),
        "rsa.pem",
        &claims(json!({})),
    );
    assert_eq!(
        refused(&oidc, &token),
        "key ec-1 of the JWKS is for ES256, the ID token is signed with RS256"
    );
}

#[tokio::test]
async fn alg_none_and_hs256_are_refused() {
    let oidc = oidc().await;
    let header = json!({"alg": "none", "typ": "JWT", "kid": "rsa-1"});
    let token = format!("{}.{}.", b64json(&header), b64json(&claims(json!({}))));
    assert!(looks_like_jwt(&token));
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's algorithm none is not accepted (RS256 or ES256)"
    );
    let token = sign(
        Algorithm::HS256,
        Some("rsa-1"),
        "secret",
        &claims(json!({})),
    );
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's algorithm HS256 is not accepted (RS256 or ES256)"
    );
    // HMAC keyed with the public JWKS text: the classic confusion.
    let jwks = std::fs::read_to_string(fixture("jwks.json")).unwrap();
    let token = sign(Algorithm::HS256, Some("rsa-1"), &jwks, &claims(json!({})));
    assert!(matches!(
        oidc.verify(&token, NOW),
        Err(OidcError::Algorithm { .. })
    ));
    for alg in [Algorithm::RS384, Algorithm::PS256, Algorithm::ES384] {
        let key = if alg == Algorithm::ES384 {
            "ec.pem"
        } else {
            "rsa.pem"
        };
        let header = json!({"alg": format!("{alg:?}"), "kid": "rsa-1"});
        let body = b64json(&claims(json!({})));
        let token = format!("{}.{body}.c2ln", b64json(&header));
        assert!(
            matches!(oidc.verify(&token, NOW), Err(OidcError::Algorithm { .. })),
            "{alg:?} with {key}"
        );
    }
    let token = format!(
        "{}.{}.",
        b64json(&json!({"typ": "JWT"})),
        b64json(&claims(json!({})))
    );
    assert_eq!(
        refused(&oidc, &token),
        "the ID token is not a well-formed JWT: its header has no alg"
    );
    let header = json!({"alg": "RS256", "kid": "rsa-1", "crit": ["exp"]});
    let token = format!("{}.{}.c2ln", b64json(&header), b64json(&claims(json!({}))));
    assert!(refused(&oidc, &token).contains("crit"));
}

#[tokio::test]
async fn expiry_uses_the_clock_passed_in_with_leeway() {
    let oidc = oidc().await;
    let token = rs(&claims(json!({"exp": NOW - 30})));
    assert!(oidc.verify(&token, NOW).is_ok(), "within the leeway");
    let token = rs(&claims(json!({"exp": NOW - 61})));
    assert_eq!(
        refused(&oidc, &token),
        "the ID token expired at 2026-09-21T14:12:19Z (exp 1789999939); sign in again"
    );
    // The same token, earlier and later on the hub's clock.
    let token = rs(&claims(json!({"exp": NOW + 100})));
    assert!(oidc.verify(&token, NOW).is_ok());
    assert!(oidc.verify(&token, NOW + 159).is_ok());
    assert!(matches!(
        oidc.verify(&token, NOW + 160),
        Err(OidcError::Expired { exp }) if exp == NOW + 100
    ));
    let token = rs(&claims(json!({"exp": null})));
    assert_eq!(refused(&oidc, &token), "the ID token has no exp claim");
    let token = rs(&claims(json!({"exp": "tomorrow"})));
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's exp claim is not a number of seconds since 1970"
    );
    let token = rs(&claims(json!({"exp": -5})));
    assert!(matches!(
        oidc.verify(&token, NOW),
        Err(OidcError::Expired { exp: 0 })
    ));
    // Early in the clock's range nothing underflows.
    assert!(
        oidc.verify(&rs(&claims(json!({"iat": 0, "exp": 10}))), 0)
            .is_ok()
    );
}

#[tokio::test]
async fn nbf_and_iat_in_the_future_are_refused() {
    let oidc = oidc().await;
    assert!(
        oidc.verify(&rs(&claims(json!({"nbf": NOW + 60}))), NOW)
            .is_ok()
    );
    let token = rs(&claims(json!({"nbf": NOW + 61})));
    assert!(
        refused(&oidc, &token)
            .starts_with("the ID token is not valid before 2026-09-21T14:14:21Z (nbf 1790000061)")
    );
    assert!(oidc.verify(&token, NOW + 1).is_ok(), "once the clock moves");
    let token = es(&claims(json!({"iat": NOW + 3000})));
    assert!(matches!(
        oidc.verify(&token, NOW),
        Err(OidcError::IssuedInFuture { .. })
    ));
    let token = es(&claims(json!({"nbf": [1]})));
    let e = oidc.verify(&token, NOW);
    assert!(matches!(e, Err(OidcError::ClaimType { .. })), "{e:?}");
}

#[tokio::test]
async fn the_user_claim_is_required_and_bounded() {
    let oidc = oidc().await;
    let token = rs(&claims(json!({"email": null})));
    assert_eq!(refused(&oidc, &token), "the ID token has no email claim");
    let token = rs(&claims(json!({"email": 42})));
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's email claim is not a string"
    );
    let token = rs(&claims(json!({"email": ""})));
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's email claim is empty"
    );
    let long = format!("{}@example.com", "a".repeat(250));
    let token = rs(&claims(json!({"email": long})));
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's email claim is 262 bytes, more than 254"
    );
    let token = rs(&claims(json!({"email": "ada@example.com\n"})));
    assert!(matches!(
        oidc.verify(&token, NOW),
        Err(OidcError::InvalidClaim { .. })
    ));
    let token = rs(&claims(json!({"email_verified": false})));
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's email is not verified (email_verified is false)"
    );
    let token = rs(&claims(json!({"email_verified": "false"})));
    assert!(matches!(
        oidc.verify(&token, NOW),
        Err(OidcError::EmailNotVerified)
    ));
    // Providers that leave email_verified out are trusted for it.
    assert!(
        oidc.verify(&rs(&claims(json!({"email_verified": null}))), NOW)
            .is_ok()
    );
}

#[tokio::test]
async fn groups_are_bounded() {
    let oidc = oidc().await;
    let groups: Vec<String> = (0..MAX_GROUPS).map(|i| format!("g{i}")).collect();
    let token = rs(&claims(json!({"groups": groups})));
    assert_eq!(oidc.verify(&token, NOW).unwrap().groups.len(), MAX_GROUPS);
    let groups: Vec<String> = (0..=MAX_GROUPS).map(|i| format!("g{i}")).collect();
    let token = rs(&claims(json!({"groups": groups})));
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's groups claim has 257 groups, more than the 256 allowed"
    );
    let token = rs(&claims(json!({"groups": ["ml", 7]})));
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's groups claim is not a string or an array of strings"
    );
    let token = rs(&claims(json!({"groups": {"ml": true}})));
    assert!(matches!(
        oidc.verify(&token, NOW),
        Err(OidcError::ClaimType { .. })
    ));
    let token = rs(&claims(json!({"groups": ["x".repeat(255)]})));
    assert!(matches!(
        oidc.verify(&token, NOW),
        Err(OidcError::InvalidClaim { .. })
    ));
}

#[tokio::test]
async fn the_kid_selects_the_key() {
    let oidc = oidc().await;
    let token = sign(
        Algorithm::RS256,
        Some("nope"),
        "rsa.pem",
        &claims(json!({})),
    );
    let jwks = fixture("jwks.json");
    assert_eq!(
        refused(&oidc, &token),
        format!("no key nope in the JWKS from file {}", jwks.display())
    );
    // Without a kid: the only key of the token's algorithm.
    let token = sign(Algorithm::RS256, None, "rsa.pem", &claims(json!({})));
    assert!(oidc.verify(&token, NOW).is_ok());
    let token = sign(Algorithm::ES256, None, "ec.pem", &claims(json!({})));
    assert!(oidc.verify(&token, NOW).is_ok());
    let token = sign(Algorithm::RS256, None, "rsa2.pem", &claims(json!({})));
    assert_eq!(
        refused(&oidc, &token),
        "the ID token's signature does not verify against the only RS256 key of the JWKS"
    );

    // Two RSA keys: a token without kid is ambiguous.
    let dir = tempfile::tempdir().unwrap();
    let both = dir.path().join("both.json");
    let mut keys = jwks_keys("jwks.json");
    keys.extend(jwks_keys("jwks2.json"));
    std::fs::write(&both, json!({"keys": keys}).to_string()).unwrap();
    let oidc = Oidc::load(config(JwksSource::File(both))).await.unwrap();
    let token = sign(Algorithm::RS256, None, "rsa.pem", &claims(json!({})));
    assert!(matches!(
        oidc.verify(&token, NOW),
        Err(OidcError::NoKid { count: 2, .. })
    ));
    let token = sign(
        Algorithm::RS256,
        Some("rsa-2"),
        "rsa2.pem",
        &claims(json!({})),
    );
    assert!(oidc.verify(&token, NOW).is_ok());
}

fn jwks_keys(name: &str) -> Vec<Value> {
    let jwks: Value = serde_json::from_slice(&std::fs::read(fixture(name)).unwrap()).unwrap();
    jwks["keys"].as_array().unwrap().clone()
}

#[tokio::test]
async fn garbage_is_refused_without_panicking() {
    let oidc = oidc().await;
    let huge = format!("eyJ{}.e.e", "a".repeat(MAX_JWT_BYTES));
    for token in [
        "",
        ".",
        "..",
        "...",
        "a.b.c",
        "a.b",
        "a.b.c.d",
        "eyJ.eyJ.",
        "eyJhbGciOiJSUzI1NiJ9.%%%.sig",
        "eyJhbGciOiJSUzI1NiJ9..",
        "é.é.é",
        "axle_0123456789ab_0123",
        &huge,
    ] {
        assert!(oidc.verify(token, NOW).is_err(), "{token:.40}");
    }
    assert!(matches!(
        oidc.verify(&huge, NOW),
        Err(OidcError::TooLarge { .. })
    ));
    // Headers that are not JSON objects, payloads that are not JSON.
    let good = rs(&claims(json!({})));
    let parts: Vec<&str> = good.split('.').collect();
    for header in [
        b64json(&json!([1])),
        URL_SAFE_NO_PAD.encode("{"),
        "eyJ".to_string(),
    ] {
        let token = format!("{header}.{}.{}", parts[1], parts[2]);
        assert!(matches!(
            oidc.verify(&token, NOW),
            Err(OidcError::Malformed { .. })
        ));
    }
    for payload in [URL_SAFE_NO_PAD.encode("not json"), "!!".to_string()] {
        let token = format!("{}.{payload}.{}", parts[0], parts[2]);
        assert!(oidc.verify(&token, NOW).is_err());
    }
    // A signed payload that is JSON but not an object.
    let token = sign(Algorithm::RS256, Some("rsa-1"), "rsa.pem", &json!([1, 2]));
    assert!(oidc.verify(&token, NOW).is_err());
    // Any one changed character of a good token is refused.
    for (i, c) in good.char_indices() {
        let swap = if c == 'A' { 'B' } else { 'A' };
        let mut bad = good.clone();
        bad.replace_range(i..i + 1, &swap.to_string());
        assert!(oidc.verify(&bad, NOW).is_err(), "changed at {i}");
    }
}

#[test]
fn jwts_are_told_from_api_tokens() {
    assert!(looks_like_jwt("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"));
    assert!(looks_like_jwt("eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0."));
    for token in [
        "",
        "a.b.c",
        "eyJ.x",
        "eyJ..sig",
        "eyJa.b.c.d",
        "eyJa b.c.d",
        "eyJa.b+c.d",
        "axle_0123456789ab_0123456789abcdef",
    ] {
        assert!(!looks_like_jwt(token), "{token}");
    }
}

#[tokio::test]
async fn unusable_keys_are_skipped_and_bad_sets_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    let load = |body: String| {
        std::fs::write(&path, body).unwrap();
        Oidc::load(config(JwksSource::File(path.clone())))
    };
    let rsa = jwks_keys("jwks.json")[0].clone();
    let mut short = rsa.clone();
    short["n"] = json!(URL_SAFE_NO_PAD.encode([0xffu8; 128]));
    short["kid"] = json!("short");
    let mut enc = rsa.clone();
    enc["use"] = json!("enc");
    let mut rs384 = rsa.clone();
    rs384["alg"] = json!("RS384");
    let mut p384 = jwks_keys("jwks.json")[1].clone();
    p384["crv"] = json!("P-384");
    let junk = [
        json!({"kty": "oct", "kid": "h", "k": "c2VjcmV0"}),
        json!({"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": "AAAA"}),
        json!({"kty": "RSA", "kid": "num", "n": 5, "e": "AQAB"}),
        json!({"kty": "RSA", "kid": "b64", "n": "%%%", "e": "AQAB"}),
        json!({"kid": "nokty"}),
        json!("not an object"),
        short,
        enc,
        rs384,
        p384,
    ];
    // The usable key is kept, the rest skipped.
    let mut keys = junk.to_vec();
    keys.push(rsa.clone());
    let oidc = load(json!({"keys": keys}).to_string()).await.unwrap();
    assert!(oidc.verify(&rs(&claims(json!({}))), NOW).is_ok());
    // A leading zero byte in n (as some providers write it) is fine.
    let mut padded = rsa.clone();
    let n = URL_SAFE_NO_PAD.decode(rsa["n"].as_str().unwrap()).unwrap();
    padded["n"] = json!(URL_SAFE_NO_PAD.encode([&[0u8][..], &n].concat()));
    let oidc = load(json!({"keys": [padded]}).to_string()).await.unwrap();
    assert!(oidc.verify(&rs(&claims(json!({}))), NOW).is_ok());

    let e = load(json!({"keys": junk}).to_string())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.starts_with(&format!(
        "cannot read the JWKS from file {}: ",
        path.display()
    )));
    assert!(e.contains("no usable RS256 or ES256 signing key"), "{e}");
    assert!(e.contains("key h: its kty oct is not supported"), "{e}");
    assert!(e.contains("key short: its modulus has 1024 bits"), "{e}");
    for body in [
        json!({"keys": []}).to_string(),
        json!({"keys": vec![rsa.clone(); MAX_JWKS_KEYS + 1]}).to_string(),
        json!({"nokeys": []}).to_string(),
        "{not json".to_string(),
        " ".repeat(MAX_JWKS_BYTES + 1),
    ] {
        let e = load(body).await.unwrap_err();
        assert!(matches!(e, OidcError::Jwks { .. }), "{e}");
    }
    let missing = dir.path().join("missing.json");
    let e = Oidc::load(config(JwksSource::File(missing.clone())))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(&format!(
            "cannot read the JWKS from file {}: ",
            missing.display()
        )),
        "{e}"
    );
    let e = Oidc::load(OidcConfig::new("", "axle", JwksSource::File(path.clone())))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the OIDC configuration is invalid: the issuer is empty"
    );
}

#[tokio::test]
async fn refresh_swaps_the_keys_and_keeps_them_on_failure() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    std::fs::copy(fixture("jwks.json"), &path).unwrap();
    let oidc = Oidc::load(config(JwksSource::File(path.clone())))
        .await
        .unwrap();
    let old = rs(&claims(json!({})));
    let new = sign(
        Algorithm::RS256,
        Some("rsa-2"),
        "rsa2.pem",
        &claims(json!({})),
    );
    assert!(oidc.verify(&old, NOW).is_ok());
    assert!(matches!(
        oidc.verify(&new, NOW),
        Err(OidcError::UnknownKey { .. })
    ));

    std::fs::copy(fixture("jwks2.json"), &path).unwrap();
    assert_eq!(oidc.refresh().await.unwrap(), 1);
    assert!(oidc.verify(&new, NOW).is_ok());
    assert!(matches!(
        oidc.verify(&old, NOW),
        Err(OidcError::UnknownKey { .. })
    ));

    std::fs::write(&path, "{not json").unwrap();
    let e = oidc.refresh().await.unwrap_err();
    assert!(matches!(e, OidcError::Jwks { .. }), "{e}");
    assert!(oidc.verify(&new, NOW).is_ok(), "the old keys stay");
    std::fs::remove_file(&path).unwrap();
    assert!(oidc.refresh().await.is_err());
    assert!(oidc.verify(&new, NOW).is_ok(), "the old keys stay");
}

#[tokio::test]
async fn spawn_refresh_picks_up_new_keys_and_stops_with_the_verifier() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    std::fs::copy(fixture("jwks.json"), &path).unwrap();
    let oidc = Arc::new(
        Oidc::load(config(JwksSource::File(path.clone())))
            .await
            .unwrap(),
    );
    // Zero is raised to a second rather than spinning.
    let task = oidc.spawn_refresh(Duration::ZERO);
    std::fs::write(&path, "{broken").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(oidc.verify(&rs(&claims(json!({}))), NOW).is_ok(), "kept");
    std::fs::copy(fixture("jwks2.json"), &path).unwrap();
    let new = sign(
        Algorithm::RS256,
        Some("rsa-2"),
        "rsa2.pem",
        &claims(json!({})),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while oidc.verify(&new, NOW).is_err() {
        assert!(tokio::time::Instant::now() < deadline, "no refresh");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(oidc);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the task ends with the verifier")
        .unwrap();
}

/// A loopback HTTP/1.1 server: `/jwks` answers `body`, `/big` and
/// `/big-unsized` more than MAX_JWKS_BYTES (with and without a length),
/// anything else 404.
async fn serve(body: Arc<std::sync::Mutex<Vec<u8>>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16384 {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let request = String::from_utf8_lossy(&request).into_owned();
                let path = request.split_whitespace().nth(1).unwrap_or("");
                let big = vec![b' '; MAX_JWKS_BYTES + 1];
                let (status, sized, payload) = match path {
                    "/jwks" => ("200 OK", true, body.lock().unwrap().clone()),
                    "/big" => ("200 OK", true, big),
                    "/big-unsized" => ("200 OK", false, big),
                    _ => ("404 Not Found", true, b"not found".to_vec()),
                };
                let mut head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nConnection: close\r\n"
                );
                if sized {
                    head.push_str(&format!("Content-Length: {}\r\n", payload.len()));
                }
                head.push_str("\r\n");
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&payload).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn the_jwks_loads_from_a_url() {
    let body = Arc::new(std::sync::Mutex::new(
        std::fs::read(fixture("jwks.json")).unwrap(),
    ));
    let base = serve(body.clone()).await;
    let url = format!("{base}/jwks");
    let oidc = Oidc::load(config(JwksSource::Url(url.clone())))
        .await
        .unwrap();
    assert!(oidc.verify(&rs(&claims(json!({}))), NOW).is_ok());
    assert!(oidc.verify(&es(&claims(json!({}))), NOW).is_ok());
    let token = sign(
        Algorithm::RS256,
        Some("rsa-9"),
        "rsa.pem",
        &claims(json!({})),
    );
    assert_eq!(
        refused(&oidc, &token),
        format!("no key rsa-9 in the JWKS from {url}")
    );

    *body.lock().unwrap() = std::fs::read(fixture("jwks2.json")).unwrap();
    assert_eq!(oidc.refresh().await.unwrap(), 1);
    let new = sign(
        Algorithm::RS256,
        Some("rsa-2"),
        "rsa2.pem",
        &claims(json!({})),
    );
    assert!(oidc.verify(&new, NOW).is_ok());
    *body.lock().unwrap() = b"<html>".to_vec();
    assert!(oidc.refresh().await.is_err());
    assert!(oidc.verify(&new, NOW).is_ok(), "the old keys stay");

    let e = Oidc::load(config(JwksSource::Url(format!("{base}/missing"))))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!("cannot read the JWKS from {base}/missing: the server answered HTTP 404 Not Found")
    );
    for path in ["/big", "/big-unsized"] {
        let e = Oidc::load(config(JwksSource::Url(format!("{base}{path}"))))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("{MAX_JWKS_BYTES}")), "{e}");
    }
    // Nothing listens on port 1.
    let e = Oidc::load(config(JwksSource::Url(
        "http://127.0.0.1:1/jwks".to_string(),
    )))
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("cannot read the JWKS from http://127.0.0.1:1/jwks: "),
        "{e}"
    );
}

#[test]
fn times_print_as_utc() {
    assert_eq!(utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(utc(NOW), "2026-09-21T14:13:20Z");
    assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(utc(4_102_444_800), "2100-01-01T00:00:00Z");
    assert_eq!(utc(253_402_300_799), "9999-12-31T23:59:59Z");
    assert!(!utc(u64::MAX).is_empty());
}

#[test]
fn untrusted_text_in_messages_is_bounded() {
    let e = OidcError::Algorithm {
        alg: shown(&format!("x\n{}", "y".repeat(1000))),
    };
    let text = e.to_string();
    assert!(text.contains("x\\ny") && text.len() < 300, "{text}");
}
