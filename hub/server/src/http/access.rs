//! The HTTP API of access: who the caller is, API tokens, and the join
//! tokens and revocation of clusters (platform admins).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use super::{err, json};
use crate::auth::{self, Action, Identity};
use crate::hub::{Command, Hub};

/// `GET /api/v1/whoami`: the caller, and what they may do.
pub(super) async fn whoami(
    State(hub): State<Arc<Hub>>,
    axum::Extension(who): axum::Extension<Identity>,
) -> Response {
    let view = hub.read();
    let policy = &view.policy;
    let teams: std::collections::BTreeMap<&str, &str> = policy
        .teams
        .values()
        .filter_map(|t| {
            auth::role_in(policy, &who, &t.name).map(|r| (t.name.as_str(), auth::role_name(r)))
        })
        .collect();
    json(
        StatusCode::OK,
        &serde_json::json!({
            "user": who.user,
            "authenticated_by": who.via,
            "groups": who.groups,
            "platform_admin": auth::is_platform_admin(policy, &who),
            "teams": teams,
        }),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRequest {
    user: String,
    /// Seconds the token is valid (default 90 days, at most 366).
    #[serde(default)]
    ttl_s: u64,
}

/// A token as `GET /api/v1/tokens` shows it: never its secret or digest.
fn token_json(t: &auth::TokenRecord) -> serde_json::Value {
    serde_json::json!({
        "id": t.id,
        "user": t.user,
        "created_at_ms": t.created_at_ms,
        "expires_at_ms": t.expires_at_ms,
        "created_by": t.created_by,
    })
}

/// `GET /api/v1/tokens` (platform admins): every token, without secrets.
pub(super) async fn list_tokens(
    State(hub): State<Arc<Hub>>,
    axum::Extension(who): axum::Extension<Identity>,
) -> Response {
    let read = hub.read();
    if let Err(e) = auth::may(&read.policy, &who, "", Action::ManageTokens) {
        return err(e);
    }
    let v: Vec<serde_json::Value> = read.tokens.values().map(token_json).collect();
    json(StatusCode::OK, &v)
}

/// `DELETE /api/v1/tokens/{id}` (platform admins): the token is refused from now on.
pub(super) async fn revoke_token(
    State(hub): State<Arc<Hub>>,
    axum::Extension(who): axum::Extension<Identity>,
    Path(id): Path<String>,
) -> Response {
    match hub
        .ask(|reply| Command::RevokeToken { id, by: who, reply })
        .await
    {
        Ok(t) => json(StatusCode::OK, &token_json(&t)),
        Err(e) => err(e),
    }
}

/// `POST /api/v1/tokens` (platform admins): a new API token for a user,
/// shown once.
pub(super) async fn create_token(
    State(hub): State<Arc<Hub>>,
    axum::Extension(who): axum::Extension<Identity>,
    body: Bytes,
) -> Response {
    let req: TokenRequest =
        match super::parse_body(&body, "token request", r#"{"user":"alice","ttl_s":86400}"#) {
            Ok(r) => r,
            Err(e) => return err(e),
        };
    let made = hub
        .ask(|reply| Command::CreateToken {
            user: req.user,
            ttl_ms: req.ttl_s.saturating_mul(1000),
            by: who,
            reply,
        })
        .await;
    match made {
        Ok((record, token)) => json(
            StatusCode::CREATED,
            &serde_json::json!({
                "id": record.id,
                "user": record.user,
                "token": token,
                "expires_at_ms": record.expires_at_ms,
            }),
        ),
        Err(e) => err(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinTokenRequest {
    /// Seconds the join token is valid (default an hour, at most a week).
    #[serde(default)]
    ttl_s: u64,
}

/// `POST /api/v1/clusters/{name}/join-tokens` (platform admins): a one-time
/// join token for a new spoke of the cluster, shown once.
pub(super) async fn create_join_token(
    State(hub): State<Arc<Hub>>,
    axum::Extension(who): axum::Extension<Identity>,
    Path(cluster): Path<String>,
    body: Bytes,
) -> Response {
    let req: JoinTokenRequest = if body.iter().all(u8::is_ascii_whitespace) {
        JoinTokenRequest { ttl_s: 0 }
    } else {
        match super::parse_body(&body, "join token request", r#"{"ttl_s":3600}"#) {
            Ok(r) => r,
            Err(e) => return err(e),
        }
    };
    let made = hub
        .ask(|reply| Command::CreateJoinToken {
            cluster,
            ttl_ms: req.ttl_s.saturating_mul(1000),
            by: who,
            reply,
        })
        .await;
    match made {
        Ok((record, token)) => json(
            StatusCode::CREATED,
            &serde_json::json!({
                "id": record.id,
                "cluster": record.cluster,
                "token": token,
                "expires_at_ms": record.expires_at_ms,
                "ca_sha256": hub.config.spoke_ca.as_ref().map(|ca| ca.pin()),
            }),
        ),
        Err(e) => err(e),
    }
}

/// `POST /api/v1/clusters/{name}/revoke` (platform admins): the cluster's
/// spoke is cut off at once.
pub(super) async fn revoke_cluster(
    State(hub): State<Arc<Hub>>,
    axum::Extension(who): axum::Extension<Identity>,
    Path(cluster): Path<String>,
) -> Response {
    match hub
        .ask(|reply| Command::RevokeCluster {
            cluster,
            by: who,
            reply,
        })
        .await
    {
        Ok(r) => json(StatusCode::OK, &r),
        Err(e) => err(e),
    }
}
