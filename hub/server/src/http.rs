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

use crate::auth::{self, Action, Identity};
use crate::hub::{Command, Hub, HubError, ListParams, ReadView};
use crate::page_cache::{Body, Encoding, PageCache, Served};
use crate::{logs, views};

mod access;

/// Largest accepted request body: a submit is a few KB; 1 MiB leaves room
/// for long commands and environments while bounding memory per request.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// A workload's JSON in a list page is ~600 bytes; pages are allocated
/// for this much per item.
const PAGE_BYTES_PER_ITEM: usize = 768;

/// Most events one `GET /api/v1/events` returns.
pub const MAX_EVENTS_PER_PAGE: usize = 10_000;

pub fn router(hub: Arc<Hub>) -> Router {
    Router::new()
        .route("/api/v1/workloads", get(list_workloads).post(submit))
        .route("/api/v1/workloads/{id}", get(get_workload).delete(cancel))
        .route("/api/v1/workloads/{id}/logs", get(get_logs))
        .route("/api/v1/clusters", get(clusters))
        .route("/api/v1/teams", get(teams))
        .route("/api/v1/burst", get(burst))
        .route("/api/v1/events", get(events))
        .route("/api/v1/policy", get(policy))
        .route("/api/v1/hubs", get(hubs))
        .route(
            "/api/v1/tokens",
            get(access::list_tokens).post(access::create_token),
        )
        .route(
            "/api/v1/tokens/{id}",
            axum::routing::delete(access::revoke_token),
        )
        .route(
            "/api/v1/clusters/{name}/join-tokens",
            axum::routing::post(access::create_join_token),
        )
        .route(
            "/api/v1/clusters/{name}/revoke",
            axum::routing::post(access::revoke_cluster),
        )
        .route("/api/v1/whoami", get(access::whoami))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ready" }))
        .fallback(|| async {
            http_err(
                StatusCode::NOT_FOUND,
                "no such endpoint; the API lives under /api/v1 (workloads, clusters, teams, events, policy, hubs)",
            )
        })
        .layer(axum::Extension(Arc::new(PageCache::new())))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(hub.clone(), authenticated))
        .layer(axum::middleware::from_fn(json_errors))
        .layer(axum::middleware::from_fn(bounded_uri))
        .with_state(hub)
}

/// Longest request target (path and query) served: Axle's URLs are short;
/// 8 KiB is what common proxies accept, and it bounds what a request can
/// make the hub parse.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Most request headers: what common servers accept (100); a client never
/// needs more than a dozen.
pub const MAX_HEADERS: usize = 100;
/// Most bytes of request headers (names and values): a token and a few
/// cookies fit many times; more only costs the hub memory.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

async fn bounded_uri(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if len > MAX_URI_BYTES {
        return http_err(
            StatusCode::URI_TOO_LONG,
            format!("the request URI is {len} bytes long; at most {MAX_URI_BYTES} are served"),
        );
    }
    let headers = req.headers();
    let bytes: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    if headers.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        // Observed: the parser's own 431 was not JSON.
        let mut r = http_err(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "the request has {} headers of {bytes} bytes; at most {MAX_HEADERS} headers \
                 of {MAX_HEADER_BYTES} bytes are served",
                headers.len()
            ),
        );
        close(&mut r);
        return r;
    }
    next.run(req).await
}

/// The methods each endpoint answers, for 405 messages.
fn allowed_methods(path: &str) -> &'static str {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match parts.as_slice() {
        ["", "api", "v1", "workloads"] => "GET, POST",
        ["", "api", "v1", "workloads", _] => "GET, DELETE",
        ["", "api", "v1", "tokens"] => "GET, POST",
        ["", "api", "v1", "tokens", _] => "DELETE",
        ["", "api", "v1", "clusters", _, "join-tokens" | "revoke"] => "POST",
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
            let msg = if text.is_empty() {
                reason.to_string()
            } else {
                format!("{reason}: {text}")
            };
            return http_err(other, msg);
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
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        // The rest of the body is never read, so the connection cannot
        // carry another request: say so, or a client reuses it and its
        // next request fails with a closed connection.
        parts.headers.insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    Response::from_parts(parts, axum::body::Body::from(body))
}

/// The HTTP status of each core error: the only place they meet.
pub fn status_of(e: &HubError) -> StatusCode {
    match e {
        HubError::BadRequest { .. } => StatusCode::BAD_REQUEST,
        HubError::NotFound(_) => StatusCode::NOT_FOUND,
        HubError::Conflict(_) => StatusCode::CONFLICT,
        HubError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        HubError::PermissionDenied(_) => StatusCode::FORBIDDEN,
        HubError::Unavailable(_) | HubError::TooBusy { .. } => StatusCode::SERVICE_UNAVAILABLE,
        HubError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
        HubError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

pub(crate) fn err(e: HubError) -> Response {
    let challenge = matches!(e, HubError::Unauthenticated(_));
    let retry = e.retry_after_s();
    let mut r = (status_of(&e), axum::Json(e.to_api())).into_response();
    if let Some(s) = retry
        && let Ok(v) = axum::http::HeaderValue::from_str(&s.to_string())
    {
        r.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
    }
    if challenge {
        r.headers_mut().insert(
            axum::http::header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Bearer realm=\"axle\""),
        );
    }
    r
}

/// Every `/api/` call names its caller (see `crate::auth`): the handlers get
/// an [`Identity`], and a call without valid credentials gets 401 here.
async fn authenticated(
    State(hub): State<Arc<Hub>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !req.uri().path().starts_with("/api/") {
        return next.run(req).await;
    }
    let source = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let now = hub.now_ms();
    if let Err(e) = hub.limiter.check_source(source, now) {
        return early(req, err(e)).await;
    }
    let header = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let view = hub.read();
    let who = match auth::authenticate(
        hub.config.auth,
        &view.tokens,
        hub.config.oidc.as_deref(),
        header,
        now,
    ) {
        Ok(who) => who,
        Err(e) => {
            drop(view);
            hub.limiter.failed(source, now);
            return early(req, err(e)).await;
        }
    };
    drop(view);
    // The user's own share first: while their body arrives, a slow sender
    // holds only their slots, never the hub's.
    let _user = match hub.limiter.admit_user(&who, now) {
        Ok(a) => a,
        Err(e) => return early(req, err(e)).await,
    };
    let mut req = match read_body(req).await {
        Ok(req) => req,
        Err(res) => return res,
    };
    let _call = match hub.limiter.admit_call() {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    req.extensions_mut().insert(who);
    next.run(req).await
}

/// A request body must arrive whole within this time: a submit is a few KB
/// and arrives in one packet; a body that trickles holds a call's slot.
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// At most this much of an unread body is read (within
/// [`DRAIN_TIMEOUT`]) before an early answer (401, 413, 429), so an HTTP/2
/// client gets the answer rather than a stream reset mid-upload.
const DRAIN_BYTES: usize = 4 * MAX_BODY_BYTES;
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Answers `res` to `req` without serving it, after reading what is left
/// of its body (bounded): over HTTP/2 an answer sent while the client
/// still uploads is reset with the stream by some clients.
async fn early(req: axum::extract::Request, res: Response) -> Response {
    if req.version() == axum::http::Version::HTTP_2 {
        let drain = axum::body::to_bytes(req.into_body(), DRAIN_BYTES);
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
    }
    res
}

/// Reads `req`'s body whole (at most [`MAX_BODY_BYTES`], within
/// [`BODY_READ_TIMEOUT`]) so no handler waits on a client while it holds a
/// slot; the answer when it is too large or too slow.
async fn read_body(req: axum::extract::Request) -> Result<axum::extract::Request, Response> {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        let mut r = http_err(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {MAX_BODY_BYTES} bytes"),
        );
        close(&mut r);
        r
    };
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(early(req, too_large()).await);
    }
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(
        BODY_READ_TIMEOUT,
        axum::body::to_bytes(body, MAX_BODY_BYTES),
    )
    .await
    {
        Ok(Ok(bytes)) => Ok(axum::extract::Request::from_parts(
            parts,
            axum::body::Body::from(bytes),
        )),
        Ok(Err(e)) if format!("{e:?}").contains("LengthLimit") => Err(too_large()),
        Ok(Err(e)) => {
            let mut r = http_err(
                StatusCode::BAD_REQUEST,
                format!("the request body could not be read: {e}"),
            );
            close(&mut r);
            Err(r)
        }
        Err(_) => {
            let mut r = http_err(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s; send it whole",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            );
            close(&mut r);
            Err(r)
        }
    }
}

/// Says the connection ends after this answer: what is left of the body is
/// never read, so the connection cannot carry another request.
fn close(r: &mut Response) {
    r.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
}

/// One hub on the embedded store: no replicas, it always leads. (Replicas on etcd
/// answer this route themselves, see `ha/front.rs`.)
async fn hubs() -> Response {
    axum::Json(api::HubsView {
        store: "redb".to_string(),
        answered_by: "hub".to_string(),
        leader: Some("hub".to_string()),
        term: None,
        state: None,
        replicas: Vec::new(),
    })
    .into_response()
}

/// An error of the HTTP layer itself (routing, limits), with its status.
fn http_err(code: StatusCode, msg: impl Into<String>) -> Response {
    (
        code,
        axum::Json(ApiError {
            error: msg.into(),
            field: None,
        }),
    )
        .into_response()
}

pub(crate) fn json<T: serde::Serialize>(code: StatusCode, v: &T) -> Response {
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

/// Decodes a JSON request body; a refusal names the field at fault
/// (`gpus`, `command[2]`) and shows `example`.
pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
    what: &str,
    example: &str,
) -> Result<T, HubError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let field = (path != ".").then_some(path);
        let inner = e.into_inner();
        let at = field
            .as_deref()
            .map(|f| format!("{f}: "))
            .unwrap_or_default();
        HubError::bad(
            format!("malformed {what}: {at}{inner}; expected JSON like {example}"),
            field.as_deref(),
        )
    })
}

async fn submit(
    State(hub): State<Arc<Hub>>,
    axum::Extension(who): axum::Extension<Identity>,
    body: Bytes,
) -> Response {
    let req: SubmitRequest = match parse_body(
        &body,
        "submit request",
        r#"{"team":"vision","gpus":1,"command":["python","train.py"]}"#,
    ) {
        Ok(r) => r,
        Err(e) => return err(e),
    };
    let (reply, rx) = oneshot::channel();
    if let Err(e) = hub.send(Command::Submit(req, who, reply)).await {
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
        Err(_) => err(hub.stopped()),
    }
}

async fn list_workloads(
    State(hub): State<Arc<Hub>>,
    axum::Extension(who): axum::Extension<Identity>,
    axum::Extension(pages): axum::Extension<Arc<PageCache>>,
    headers: axum::http::HeaderMap,
    q: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let mut q = match q {
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
    let read = hub.read();
    q.visible_teams = auth::readable_teams(&read.policy, &who);
    let encoding = accepted_encoding(&headers);
    let page = hub
        .with_list_permit(move || page_body(&read, &q, &pages, std::time::Instant::now(), encoding))
        .await;
    use axum::http::{HeaderValue, header};
    match page {
        Ok(Ok((body, _))) => {
            let mut resp = (
                StatusCode::OK,
                [
                    (
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    ),
                    (header::VARY, HeaderValue::from_static("accept-encoding")),
                ],
                body.bytes,
            )
                .into_response();
            if body.gzip {
                resp.headers_mut()
                    .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            }
            resp
        }
        Ok(Err(e)) | Err(e) => err(e),
    }
}

/// gzip when the client's `Accept-Encoding` names it (and not with `q=0`).
fn accepted_encoding(headers: &axum::http::HeaderMap) -> Encoding {
    let gzip = headers
        .get_all(axum::http::header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            parts.next().is_some_and(|c| c.eq_ignore_ascii_case("gzip"))
                && !parts.any(|p| {
                    p.strip_prefix("q=")
                        .and_then(|q| q.parse::<f32>().ok())
                        .is_some_and(|q| q <= 0.0)
                })
        });
    if gzip {
        Encoding::Gzip
    } else {
        Encoding::Identity
    }
}

/// The JSON body of one page of the workload list: the kept one while the
/// page is unchanged ([`PageCache`]).
pub fn page_body(
    read: &ReadView,
    q: &ListParams,
    pages: &PageCache,
    now: std::time::Instant,
    encoding: Encoding,
) -> Result<(Body, Served), HubError> {
    let page = read.page(q)?;
    pages.body(q, &page, now, encoding, |page| {
        let items = page.views();
        // Sized for the page up front: growing a 300 KB body by doubling
        // copies it over and over.
        let mut body = Vec::with_capacity(items.len() * PAGE_BYTES_PER_ITEM + 64);
        serde_json::to_writer(
            &mut body,
            &api::WorkloadList {
                items,
                continue_token: page.next.clone(),
            },
        )
        .map_err(|e| HubError::Internal(format!("cannot encode a page: {e}")))?;
        Ok(body)
    })
}

/// Whether `who` may read workload `id`: NotFound when it does not exist,
/// PermissionDenied when it is another team's.
pub fn may_read(read: &ReadView, who: &Identity, id: u64) -> Result<(), HubError> {
    match read.workload(id) {
        Some(w) => auth::may(&read.policy, who, &w.team, Action::Read),
        None => Err(HubError::NotFound(format!("workload {id} not found"))),
    }
}

async fn get_workload(
    State(hub): State<Arc<Hub>>,
    axum::Extension(who): axum::Extension<Identity>,
    Path(id): Path<String>,
) -> Response {
    let id = match parse_id(&id) {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    let read = hub.read();
    if let Err(e) = may_read(&read, &who, id) {
        return err(e);
    }
    match read.view(id) {
        Some(v) => json(StatusCode::OK, &v),
        None => err(HubError::NotFound(format!("workload {id} not found"))),
    }
}

async fn cancel(
    State(hub): State<Arc<Hub>>,
    axum::Extension(who): axum::Extension<Identity>,
    Path(id): Path<String>,
) -> Response {
    let id = match parse_id(&id) {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    let (reply, rx) = oneshot::channel();
    if let Err(e) = hub.send(Command::Cancel(id, who, reply)).await {
        return err(e);
    }
    match rx.await {
        Ok(Ok(v)) => json(StatusCode::OK, &v),
        Ok(Err(e)) => err(e),
        Err(_) => err(hub.stopped()),
    }
}

#[derive(Deserialize)]
struct LogQuery {
    #[serde(default)]
    offset: u64,
    /// Start at the first output that reached the hub at or after this
    /// time (ms since the epoch) instead of at `offset`.
    since_ms: Option<u64>,
    /// Also return when each part of the range arrived.
    #[serde(default)]
    timestamps: bool,
}

async fn get_logs(
    State(hub): State<Arc<Hub>>,
    axum::Extension(who): axum::Extension<Identity>,
    Path(id): Path<String>,
    q: Result<Query<LogQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let id = match parse_id(&id) {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    if let Err(e) = may_read(&hub.read(), &who, id) {
        return err(e);
    }
    let Ok(Query(q)) = q else {
        return err(HubError::bad(
            "offset and since_ms must be non-negative numbers, timestamps true or false",
            Some("offset"),
        ));
    };
    let (epoch, done) = match hub.read().workload(id) {
        Some(w) => (w.epoch, w.state.is_terminal()),
        None => return err(HubError::NotFound(format!("workload {id} not found"))),
    };
    if q.offset > logs::MAX_LOG_OFFSET {
        // Observed: 2^64−1 was accepted (and answered with an empty page).
        return err(HubError::bad(
            format!(
                "offset {} is beyond the largest log Axle keeps ({} bytes); use the \
                 next_offset of the last page",
                q.offset,
                logs::MAX_LOG_OFFSET
            ),
            Some("offset"),
        ));
    }
    let start = match q.since_ms {
        Some(ms) => logs::Start::Since(ms),
        None => logs::Start::Offset(q.offset),
    };
    match logs::read_from(
        &logs::dir(&hub.config.data_dir),
        hub.config.log_limits,
        id,
        epoch,
        start,
    )
    .await
    {
        Ok(r) => {
            let complete = done && r.next == r.offset;
            let (data, stderr) = logs::lossy_text(&r.data, &r.stderr);
            json(
                StatusCode::OK,
                &api::LogsView {
                    workload: id,
                    offset: r.offset,
                    data,
                    stderr,
                    next_offset: r.next,
                    complete,
                    times: if q.timestamps {
                        r.times
                            .iter()
                            .map(|t| api::LogTimeView {
                                offset: t.offset,
                                at_ms: t.at_ms,
                            })
                            .collect()
                    } else {
                        Vec::new()
                    },
                },
            )
        }
        Err(e) => err(HubError::Internal(format!("cannot read logs: {e}"))),
    }
}

async fn clusters(State(hub): State<Arc<Hub>>) -> Response {
    let v = hub.read().cluster_views();
    json(StatusCode::OK, &v)
}

async fn burst(
    State(hub): State<Arc<Hub>>,
    axum::Extension(who): axum::Extension<Identity>,
) -> Response {
    let v = hub.read().burst_view(&who, hub.now_ms());
    json(StatusCode::OK, &v)
}

async fn teams(State(hub): State<Arc<Hub>>) -> Response {
    let v = hub.read().team_views();
    json(StatusCode::OK, &v)
}

#[derive(Deserialize)]
struct EventQuery {
    #[serde(default)]
    since: u64,
    limit: Option<usize>,
    workload: Option<u64>,
    /// Only the most recent N (instead of those after `since`).
    tail: Option<usize>,
}

async fn events(
    State(hub): State<Arc<Hub>>,
    axum::Extension(who): axum::Extension<Identity>,
    q: Result<Query<EventQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return err(HubError::bad(
            "bad query: since, limit and tail must be numbers, workload an id",
            None,
        ));
    };
    let limit = q.limit.unwrap_or(1000).min(MAX_EVENTS_PER_PAGE);
    let events = match q.tail {
        Some(n) => Ok(hub.events_tail(n.min(MAX_EVENTS_PER_PAGE), q.workload)),
        None => hub.events_since(q.since, limit, q.workload).await,
    };
    match events {
        Ok(events) => {
            // A workload's events are its team's to read; the rest (spokes,
            // tokens) every user's.
            let read = hub.read();
            let teams = auth::readable_teams(&read.policy, &who);
            let visible = |e: &crate::records::EventRecord| match (&teams, e.workload) {
                (None, _) | (_, None) => true,
                (Some(t), Some(id)) => read.workload(id).is_some_and(|w| t.contains(&w.team)),
            };
            let v: Vec<api::EventView> = events
                .iter()
                .filter(|e| visible(e))
                .map(|e| views::event(e))
                .collect();
            json(StatusCode::OK, &v)
        }
        Err(e) => err(e),
    }
}

async fn policy(State(hub): State<Arc<Hub>>) -> Response {
    let inner = hub.read();
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
