//! The hub's HTTP/JSON API (axum). Every error is JSON (`ApiError`) with a
//! message that says what to fix; bodies are parsed by hand so a malformed
//! request names the field and position at fault.

use std::sync::Arc;

use axle_proto::api::{self, ApiError, SubmitRequest};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use tokio::sync::oneshot;

use crate::hub::{Command, Hub, HubError};
use crate::lifecycle::WState;
use crate::{logs, views};

/// Largest accepted request body: a submit is a few KB; 1 MiB leaves room
/// for long commands and environments while bounding memory per request.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Most events one `GET /api/v1/events` returns.
pub const MAX_EVENTS_PER_PAGE: usize = 10_000;

pub fn router(hub: Arc<Hub>) -> Router {
    Router::new()
        .route("/api/v1/workloads", get(list_workloads).post(submit))
        .route("/api/v1/workloads/{id}", get(get_workload).delete(cancel))
        .route("/api/v1/workloads/{id}/logs", get(get_logs))
        .route("/api/v1/clusters", get(clusters))
        .route("/api/v1/teams", get(teams))
        .route("/api/v1/events", get(events))
        .route("/api/v1/policy", get(policy))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ready" }))
        .fallback(|| async {
            err(HubError::status(
                404,
                "no such endpoint; the API lives under /api/v1 (workloads, clusters, teams, events, policy)",
            ))
        })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(json_errors))
        .layer(axum::middleware::from_fn(bounded_uri))
        .with_state(hub)
}

/// Longest request target (path and query) served: Axle's URLs are short;
/// 8 KiB is what common proxies accept, and it bounds what a request can
/// make the hub parse.
pub const MAX_URI_BYTES: usize = 8 * 1024;

async fn bounded_uri(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if len > MAX_URI_BYTES {
        return err(HubError::status(
            414,
            format!("the request URI is {len} bytes long; at most {MAX_URI_BYTES} are served"),
        ));
    }
    next.run(req).await
}

/// The methods each endpoint answers, for 405 messages.
fn allowed_methods(path: &str) -> &'static str {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match parts.as_slice() {
        ["", "api", "v1", "workloads"] => "GET, POST",
        ["", "api", "v1", "workloads", _] => "GET, DELETE",
        _ => "GET",
    }
}

/// Every error answer is an `ApiError`: axum's own answers (405, 413, a
/// body that cannot be read) come as plain text, and are rewritten here
/// with a message that says what to do.
async fn json_errors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let res = next.run(req).await;
    let status = res.status();
    let is_json = res
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return res;
    }
    let message = match status {
        StatusCode::METHOD_NOT_ALLOWED => format!(
            "method {method} not allowed on {path}; it accepts {}",
            allowed_methods(&path)
        ),
        StatusCode::PAYLOAD_TOO_LARGE => {
            format!("the request body is larger than {MAX_BODY_BYTES} bytes")
        }
        other => {
            let body = axum::body::to_bytes(res.into_body(), 4096)
                .await
                .unwrap_or_default();
            let text = String::from_utf8_lossy(&body).trim().to_string();
            let reason = other.canonical_reason().unwrap_or("error");
            let code = other.as_u16();
            let msg = if text.is_empty() {
                reason.to_string()
            } else {
                format!("{reason}: {text}")
            };
            return err(HubError::status(code, msg));
        }
    };
    let (mut parts, _) = res.into_parts();
    let body = serde_json::to_vec(&ApiError {
        error: message,
        field: None,
    })
    .unwrap_or_default();
    parts.headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body))
}

fn err(e: HubError) -> Response {
    let code = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, axum::Json(e.error)).into_response()
}

fn json<T: serde::Serialize>(code: StatusCode, v: &T) -> Response {
    (code, axum::Json(v)).into_response()
}

fn parse_id(s: &str) -> Result<u64, HubError> {
    let t = s.trim_start_matches("w-");
    t.parse().map_err(|_| {
        HubError::bad(
            format!("workload id must be a number, got {s:?}"),
            Some("id"),
        )
    })
}

async fn submit(State(hub): State<Arc<Hub>>, body: Bytes) -> Response {
    let req: SubmitRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return err(HubError {
                status: 400,
                error: ApiError {
                    error: format!(
                        "malformed submit request: {e}; expected JSON like {{\"team\":\"vision\",\"gpus\":1,\"command\":[\"python\",\"train.py\"]}}"
                    ),
                    field: None,
                },
            });
        }
    };
    let (reply, rx) = oneshot::channel();
    if let Err(e) = hub.send(Command::Submit(req, reply)).await {
        return err(e);
    }
    match rx.await {
        Ok(Ok((view, created))) => json(
            if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            },
            &view,
        ),
        Ok(Err(e)) => err(e),
        Err(_) => err(HubError::status(503, "hub is shutting down")),
    }
}

/// Items per page of `GET /api/v1/workloads` when the client names no
/// `limit`: a screenful many times over, a few hundred KB of JSON.
pub const DEFAULT_PAGE_ITEMS: usize = 500;
/// Most items per page: bounds the time a page holds the hub's read lock
/// and the memory of one answer, whatever the client asks.
pub const MAX_PAGE_ITEMS: usize = 5_000;

/// Filters and paging of a workload list.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    pub team: Option<String>,
    pub state: Option<String>,
    pub cluster: Option<String>,
    pub priority: Option<String>,
    /// Names that start with this.
    pub name_prefix: Option<String>,
    /// Items per page (default `DEFAULT_PAGE_ITEMS`, at most
    /// `MAX_PAGE_ITEMS`).
    pub limit: Option<usize>,
    /// The `continue` token of the previous page.
    #[serde(rename = "continue")]
    pub continue_token: Option<String>,
}

/// The opaque token for the page after workload `last_id`.
fn continue_token(last_id: u64) -> String {
    format!("w1.{last_id:x}")
}

fn parse_continue(token: &str) -> Result<u64, HubError> {
    token
        .strip_prefix("w1.")
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or_else(|| {
            HubError::bad(
                format!(
                    "continue token {token:?} is not one this hub gave out; pass the `continue` of the previous page unchanged"
                ),
                Some("continue"),
            )
        })
}

/// One page of the workloads matching `p`, in id order, and the token of
/// the next page when there are more.
pub fn list(
    hub: &Hub,
    p: ListParams,
) -> Result<(Vec<api::WorkloadView>, Option<String>), HubError> {
    let state = match &p.state {
        Some(s) => Some(WState::parse(s).ok_or_else(|| {
            HubError::bad(
                format!("unknown state {s:?}; use one of {}", api::STATES.join(", ")),
                Some("state"),
            )
        })?),
        None => None,
    };
    let limit = match p.limit {
        None => DEFAULT_PAGE_ITEMS,
        Some(0) => {
            return Err(HubError::bad(
                format!("limit must be between 1 and {MAX_PAGE_ITEMS}"),
                Some("limit"),
            ));
        }
        Some(n) => n.min(MAX_PAGE_ITEMS),
    };
    let after = match &p.continue_token {
        Some(t) if !t.is_empty() => Some(parse_continue(t)?),
        _ => None,
    };
    let inner = hub.lock();
    if let Some(t) = &p.team
        && !inner.policy.teams.contains_key(t)
    {
        return Err(HubError::bad(
            format!(
                "unknown team {t:?}; known teams: {}",
                inner
                    .policy
                    .teams
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Some("team"),
        ));
    }
    let range = match after {
        Some(id) => inner.workloads.range(id.saturating_add(1)..),
        None => inner.workloads.range(..),
    };
    let mut items = Vec::new();
    let mut next = None;
    for w in range.map(|(_, w)| w).filter(|w| {
        p.team.as_ref().is_none_or(|t| &w.team == t)
            && state.is_none_or(|s| w.state == s)
            && p.priority.as_ref().is_none_or(|c| &w.priority == c)
            && p.name_prefix
                .as_ref()
                .is_none_or(|n| w.name.starts_with(n.as_str()))
            && p.cluster
                .as_ref()
                .is_none_or(|c| w.placement.as_ref().is_some_and(|p| &p.cluster == c))
    }) {
        if items.len() == limit {
            next = items
                .last()
                .map(|v: &api::WorkloadView| continue_token(v.id));
            break;
        }
        items.push(views::workload(w, inner.reasons.get(&w.id)));
    }
    Ok((items, next))
}

async fn list_workloads(
    State(hub): State<Arc<Hub>>,
    q: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => {
            return err(HubError::bad(
                format!(
                    "bad query: {e}; filters are team, state, cluster, priority, name_prefix; paging: limit, continue"
                ),
                None,
            ));
        }
    };
    match list(&hub, q) {
        Ok((items, continue_token)) => json(
            StatusCode::OK,
            &api::WorkloadList {
                items,
                continue_token,
            },
        ),
        Err(e) => err(e),
    }
}

async fn get_workload(State(hub): State<Arc<Hub>>, Path(id): Path<String>) -> Response {
    let id = match parse_id(&id) {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    match hub.lock().view(id) {
        Some(v) => json(StatusCode::OK, &v),
        None => err(HubError::status(404, format!("workload {id} not found"))),
    }
}

async fn cancel(State(hub): State<Arc<Hub>>, Path(id): Path<String>) -> Response {
    let id = match parse_id(&id) {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    let (reply, rx) = oneshot::channel();
    if let Err(e) = hub.send(Command::Cancel(id, reply)).await {
        return err(e);
    }
    match rx.await {
        Ok(Ok(v)) => json(StatusCode::OK, &v),
        Ok(Err(e)) => err(e),
        Err(_) => err(HubError::status(503, "hub is shutting down")),
    }
}

#[derive(Deserialize)]
struct LogQuery {
    #[serde(default)]
    offset: u64,
}

async fn get_logs(
    State(hub): State<Arc<Hub>>,
    Path(id): Path<String>,
    q: Result<Query<LogQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let id = match parse_id(&id) {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    let Ok(Query(q)) = q else {
        return err(HubError::bad(
            "offset must be a non-negative number",
            Some("offset"),
        ));
    };
    let (epoch, done) = match hub.lock().workloads.get(&id) {
        Some(w) => (w.epoch, w.state.is_terminal()),
        None => return err(HubError::status(404, format!("workload {id} not found"))),
    };
    match logs::read(
        &logs::dir(&hub.config.data_dir),
        hub.config.log_limits,
        id,
        epoch,
        q.offset,
    )
    .await
    {
        Ok((data, next)) => {
            let complete = done && next == q.offset;
            json(
                StatusCode::OK,
                &api::LogsView {
                    workload: id,
                    offset: q.offset,
                    data: String::from_utf8_lossy(&data).into_owned(),
                    next_offset: next,
                    complete,
                },
            )
        }
        Err(e) => err(HubError::status(500, format!("cannot read logs: {e}"))),
    }
}

async fn clusters(State(hub): State<Arc<Hub>>) -> Response {
    let v = hub.lock().cluster_views();
    json(StatusCode::OK, &v)
}

async fn teams(State(hub): State<Arc<Hub>>) -> Response {
    let v = hub.lock().team_views();
    json(StatusCode::OK, &v)
}

#[derive(Deserialize)]
struct EventQuery {
    #[serde(default)]
    since: u64,
    limit: Option<usize>,
    workload: Option<u64>,
}

async fn events(
    State(hub): State<Arc<Hub>>,
    q: Result<Query<EventQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return err(HubError::bad(
            "bad query: since and limit must be numbers, workload an id",
            None,
        ));
    };
    let limit = q.limit.unwrap_or(1000).min(MAX_EVENTS_PER_PAGE);
    match hub.events_since(q.since, limit, q.workload) {
        Ok(events) => {
            let v: Vec<api::EventView> = events.iter().map(views::event).collect();
            json(StatusCode::OK, &v)
        }
        Err(e) => err(e),
    }
}

async fn policy(State(hub): State<Arc<Hub>>) -> Response {
    let inner = hub.lock();
    json(
        StatusCode::OK,
        &serde_json::json!({
            "revision": inner.policy.revision,
            "teams": inner.policy.teams.keys().collect::<Vec<_>>(),
            "priority_classes": inner.policy.priority_classes.keys().collect::<Vec<_>>(),
            "clusters": inner.policy.clusters.keys().collect::<Vec<_>>(),
        }),
    )
}
