//! Typed HTTP client for the hub's `/api/v1` JSON API, with errors that say
//! whether the hub refused the request, failed, or could not be reached.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axle_proto::api::{
    ApiError, ClusterView, EventView, HubsView, LogsView, SubmitRequest, TeamView, WorkloadList,
    WorkloadView,
};
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;

/// Time to open a TCP connection: the hub is usually near (same host or
/// region); a few seconds separates "slow" from "not there".
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Whole-request limit: every API call is a small in-memory read or write on
/// the hub; 30 s only trips when the hub is wedged.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Retries of a submit after a transport error (the brief's "up to 3"). Safe
/// because every retry carries the same idempotency key.
const SUBMIT_RETRIES: u32 = 3;
/// First backoff before a submit retry, doubled each time (250+500+1000 ms):
/// long enough to ride out a hub restart's listen gap, short for a human.
const SUBMIT_RETRY_BACKOFF: Duration = Duration::from_millis(250);

/// Retries of one call the hub turned away as too many (429) or too busy
/// (503 with `Retry-After`): the hub did not act on it, so any call may be
/// sent again. Ten rides out a burst of throttling; a hub that refuses for
/// longer is told to the user.
const THROTTLE_RETRIES: usize = 10;
/// The jittered backoff added to the hub's `Retry-After` (from 100 ms,
/// doubling, at most 10 s): clients throttled together do not all come back
/// in the same instant.
const THROTTLE_BACKOFF_MIN: Duration = Duration::from_millis(100);
const THROTTLE_BACKOFF_MAX: Duration = Duration::from_secs(10);
/// The longest `Retry-After` honoured: a larger one (or an HTTP date) waits
/// this long, so a wrong header cannot park the CLI for hours.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Pooled connections are dropped after this long unused: below the hub's
/// shortest connection timeout (10 s to send a header, which also ends
/// keep-alive waits), so `-w` and `bench` never send a request on a
/// connection the hub is closing.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Items the CLI asks for per page: the hub's most, so a long list takes
/// few round trips.
const PAGE_ITEMS: usize = 5_000;
/// Most bytes of one answer after gzip decoding: a page of the hub's most
/// items (5,000) is ~4 MB of JSON; far past that it is not a hub answer
/// but a decompression bomb.
const MAX_BODY_BYTES: u64 = 64 << 20;
/// Most workloads one listing gathers across pages: a table or a JSON
/// answer beyond this is no use to a person and would only hold memory.
const MAX_LISTED_WORKLOADS: usize = 1_000_000;

/// Why a hub call failed; [`ClientError::exit_code`] maps it to the CLI's
/// documented exit codes.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// 4xx: the request is wrong (bad field, unknown team, no such workload).
    #[error("{}", api_error_text(body))]
    Refused { status: u16, body: ApiError },
    /// No HTTP answer at all: connection refused, reset, DNS, timeout.
    #[error("cannot reach the hub at {hub}: {reason}")]
    Unreachable { hub: String, reason: String },
    /// 5xx: the hub failed while handling a valid request.
    #[error("the hub failed (HTTP {status}): {}", api_error_text(body))]
    Server { status: u16, body: ApiError },
    /// An answer that is not what the API promises (wrong JSON shape).
    #[error("unexpected answer from the hub to {what}: {reason}")]
    Protocol { what: String, reason: String },
    /// A token would cross the network in clear text.
    #[error(
        "refusing to send your API token in clear text to {url}: use its https:// address \
         (or set {INSECURE_HTTP_ENV}=1 on a network you trust)"
    )]
    Insecure { url: String },
}

/// Set to `1`, the CLI sends tokens over plain `http://` to hosts other
/// than this machine (a lab network you trust).
pub const INSECURE_HTTP_ENV: &str = "AXLE_INSECURE_HTTP";

/// Most redirects followed for one call: a follower sends a call to the
/// leader (one hop); more means replicas disagree about who leads.
const MAX_REDIRECTS: usize = 3;

/// Whether a token may go to `url`: over TLS, or to this machine.
fn safe_for_token(url: &Url) -> bool {
    if url.scheme() == "https" {
        return true;
    }
    let Some(host) = url.host_str() else {
        return false;
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Same scheme, host and port.
fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// `error` plus `(field: x)` when the hub names the field at fault.
pub fn api_error_text(e: &ApiError) -> String {
    match &e.field {
        Some(f) => format!("{} (field: {f})", e.error),
        None => e.error.clone(),
    }
}

/// The error body of a 4xx/5xx: an [`ApiError`] when the hub sent one, else the
/// raw text (e.g. a framework rejection) so nothing is hidden.
fn error_body(status: StatusCode, text: &str) -> ApiError {
    if let Ok(e) = serde_json::from_str::<ApiError>(text) {
        return e;
    }
    let text = text.trim();
    let error = if text.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("{text} (HTTP {status})")
    };
    ApiError { error, field: None }
}

/// A transport error as its root cause ("Connection refused (os error 111)");
/// reqwest's own top line repeats the URL the message already names.
fn transport_reason(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return format!("no answer within {}s", REQUEST_TIMEOUT.as_secs());
    }
    let mut root: &dyn std::error::Error = e;
    while let Some(s) = root.source() {
        root = s;
    }
    root.to_string()
}

/// reqwest is built with `rustls-no-provider`: without a process-wide
/// provider, building a client panics. Idempotent (a second install is a no-op).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Filters of `GET /api/v1/workloads`.
#[derive(Debug, Clone, Default)]
pub struct WorkloadFilter {
    pub team: Option<String>,
    pub state: Option<String>,
    pub cluster: Option<String>,
}

/// The answer to a submit.
#[derive(Debug, Clone)]
pub struct Submitted {
    pub view: WorkloadView,
    /// False when the hub answered 200: the idempotency key matched an
    /// earlier submit and this is that workload.
    pub created: bool,
}

/// Most hub addresses one `--hub` may list: replicas are 3 or 5.
pub const MAX_HUB_ADDRESSES: usize = 16;

/// One hub, or the replicas of one hub. Cheap to clone: clones share the
/// connection pool and which replica answered last.
#[derive(Clone)]
pub struct Client {
    /// Requests are built on the first; [`Client::send`] moves them to the
    /// replica that answered last and on to the next when one is unreachable.
    bases: Arc<Vec<Url>>,
    current: Arc<AtomicUsize>,
    base: Url,
    http: reqwest::Client,
    /// The API token sent with every request (`--token`, `AXLE_TOKEN`, `axle login`).
    token: Option<String>,
    /// Calls sent again after a 429/503 with `Retry-After`, over all clones
    /// (the bench reports it).
    throttled: Arc<std::sync::atomic::AtomicU64>,
}

/// The backoff between throttled retries of one call.
fn throttle_backoff() -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder as _;
    backon::ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(THROTTLE_BACKOFF_MIN)
        .with_max_delay(THROTTLE_BACKOFF_MAX)
        .with_max_times(THROTTLE_RETRIES)
        .build()
}

/// How long the hub asks to wait: `Retry-After` in seconds (an HTTP date,
/// or a value past [`MAX_RETRY_AFTER`], waits the most).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    Some(match v.parse::<u64>() {
        Ok(s) => Duration::from_secs(s).min(MAX_RETRY_AFTER),
        Err(_) => MAX_RETRY_AFTER,
    })
}

fn insecure_allowed() -> bool {
    std::env::var(INSECURE_HTTP_ENV).is_ok_and(|v| v == "1")
}

/// Parses one hub URL, with a path that ends in '/'.
fn parse_base(base: &str) -> anyhow::Result<Url> {
    let mut url =
        Url::parse(base.trim()).map_err(|e| anyhow::anyhow!("invalid hub URL {base:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        anyhow::bail!("invalid hub URL {url}: the scheme must be http or https");
    }
    // `Url::join` replaces the last path segment unless the path ends in '/'.
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url)
}

impl Client {
    /// `base` is the hub URL, e.g. `http://127.0.0.1:7070`, or several
    /// replicas' comma-separated: requests go to the one that answered
    /// last, the next when it cannot be reached, and follow a follower's
    /// redirect to the leader. `ca_pem`: CA certificates to trust besides
    /// the system's (a hub serving TLS with the company's or its own CA).
    pub fn with_ca(base: &str, ca_pem: Option<&[u8]>) -> anyhow::Result<Client> {
        install_crypto_provider();
        let bases: Vec<Url> = base
            .split(',')
            .filter(|b| !b.trim().is_empty())
            .map(parse_base)
            .collect::<anyhow::Result<_>>()?;
        if bases.is_empty() {
            anyhow::bail!("invalid hub URL {base:?}: no address given");
        }
        if bases.len() > MAX_HUB_ADDRESSES {
            anyhow::bail!(
                "{} hub addresses given, at most {MAX_HUB_ADDRESSES}",
                bases.len()
            );
        }
        let base = bases[0].clone();
        let mut builder = reqwest::Client::builder();
        if let Some(pem) = ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| anyhow::anyhow!("the CA file is not PEM certificates: {e}"))?;
            if certs.is_empty() {
                anyhow::bail!("the CA file holds no certificate");
            }
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let http = builder
            // Redirects are followed by `execute_following`, with the token.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .user_agent(concat!("axle-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the HTTP client: {e}"))?;
        Ok(Client {
            bases: Arc::new(bases),
            current: Arc::new(AtomicUsize::new(0)),
            base,
            http,
            token: None,
            throttled: Default::default(),
        })
    }

    /// Calls sent again because the hub throttled them, so far.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// The hub URL that answered last, for messages.
    pub fn hub(&self) -> &str {
        let i = self.current.load(Ordering::Relaxed) % self.bases.len();
        self.bases[i].as_str().trim_end_matches('/')
    }

    /// `url` (built on the first base) moved onto base `i`.
    fn rebase(&self, url: &Url, i: usize) -> Url {
        let rest = url
            .path()
            .strip_prefix(self.base.path())
            .unwrap_or(url.path());
        let mut moved = self.bases[i].join(rest).unwrap_or_else(|_| url.clone());
        moved.set_query(url.query());
        moved
    }

    /// Executes `req` on the replica that answered last, then on the others in turn while
    /// they cannot be reached.
    async fn execute(&self, req: reqwest::Request) -> Result<reqwest::Response, reqwest::Error> {
        let n = self.bases.len();
        let start = self.current.load(Ordering::Relaxed) % n;
        let mut req = Some(req);
        for k in 0..n {
            let i = (start + k) % n;
            let Some(mut r) = req.take() else { break };
            let spare = if k + 1 < n { r.try_clone() } else { None };
            *r.url_mut() = self.rebase(r.url(), i);
            match self.execute_following(r).await {
                Ok(resp) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(resp);
                }
                Err(e) if e.is_connect() && spare.is_some() => req = spare,
                Err(e) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        unreachable!("the loop returns on its last address")
    }

    /// Executes `req`, following a replica's redirect (307/308) to
    /// another of the hub addresses given (or the same origin) with the
    /// same method, body and credentials — reqwest would drop
    /// `Authorization` on a redirect to another port. A redirect elsewhere
    /// is returned as the answer, never followed with the token.
    async fn execute_following(
        &self,
        mut req: reqwest::Request,
    ) -> Result<reqwest::Response, reqwest::Error> {
        let mut hops = 0;
        loop {
            let again = req.try_clone();
            let from = req.url().clone();
            let resp = self.http.execute(req).await?;
            let redirect = matches!(
                resp.status(),
                StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT
            );
            let target = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .and_then(|l| from.join(l).ok())
                .filter(|t| same_origin(t, &from) || self.bases.iter().any(|b| same_origin(b, t)))
                .filter(|t| self.token.is_none() || safe_for_token(t) || insecure_allowed());
            match (redirect, target, again) {
                (true, Some(target), Some(mut again)) if hops < MAX_REDIRECTS => {
                    hops += 1;
                    *again.url_mut() = target;
                    req = again;
                }
                _ => return Ok(resp),
            }
        }
    }

    fn url(&self, path: &str, query: &[(&str, String)]) -> Url {
        let mut url = self
            .base
            .join(path)
            .expect("API paths are relative and valid");
        if !query.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (k, v) in query {
                pairs.append_pair(k, v);
            }
        }
        url
    }

    /// Sends one request; decodes a 2xx body as `T`, anything else as an error.
    async fn call<T: DeserializeOwned, B: serde::Serialize + ?Sized>(
        &self,
        method: Method,
        url: Url,
        body: Option<&B>,
    ) -> Result<(StatusCode, T), ClientError> {
        let what = format!("{method} {}", url.path());
        let mut req = self.http.request(method, url);
        if let Some(body) = body {
            req = req.json(body);
        }
        let (status, bytes) = self.send(req, &what).await?;
        if status.is_success() {
            let value = serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol {
                what,
                reason: e.to_string(),
            })?;
            Ok((status, value))
        } else if status.is_client_error() {
            let text = String::from_utf8_lossy(&bytes);
            Err(ClientError::Refused {
                status: status.as_u16(),
                body: error_body(status, &text),
            })
        } else {
            Err(ClientError::Server {
                status: status.as_u16(),
                body: error_body(status, &String::from_utf8_lossy(&bytes)),
            })
        }
    }

    /// Sends `req` accepting gzip (the hub compresses large list pages) and
    /// returns the status and the decoded body.
    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<(StatusCode, Vec<u8>), ClientError> {
        let unreachable = |e: reqwest::Error| ClientError::Unreachable {
            hub: self.hub().to_string(),
            reason: transport_reason(&e),
        };
        let mut req = req.header(reqwest::header::ACCEPT_ENCODING, "gzip");
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let mut req = req.build().map_err(unreachable)?;
        if self.token.is_some() && !insecure_allowed() {
            // Every address the call may go to, not only the first.
            if let Some(b) = self.bases.iter().find(|b| !safe_for_token(b)) {
                return Err(ClientError::Insecure {
                    url: b.as_str().trim_end_matches('/').to_string(),
                });
            }
        }
        let mut backoff = throttle_backoff();
        let resp = loop {
            let again = req.try_clone();
            let resp = self.execute(req).await.map_err(unreachable)?;
            let status = resp.status();
            // 429 always, 503 only with Retry-After (a hub that is busy, not
            // one that failed): the hub did not act on the call.
            let wait = match status {
                StatusCode::TOO_MANY_REQUESTS => {
                    Some(retry_after(resp.headers()).unwrap_or_default())
                }
                StatusCode::SERVICE_UNAVAILABLE => retry_after(resp.headers()),
                _ => None,
            };
            match (wait, again, backoff.next()) {
                (Some(after), Some(again), Some(jitter)) => {
                    self.throttled.fetch_add(1, Ordering::Relaxed);
                    drop(resp);
                    tokio::time::sleep(after + jitter).await;
                    req = again;
                }
                _ => break resp,
            }
        };
        let status = resp.status();
        let gzip = resp
            .headers()
            .get(reqwest::header::CONTENT_ENCODING)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
        let bytes = resp.bytes().await.map_err(unreachable)?;
        if !gzip {
            return Ok((status, bytes.to_vec()));
        }
        use std::io::Read;
        let mut out = Vec::with_capacity(bytes.len() * 8);
        flate2::read::GzDecoder::new(&bytes[..])
            .take(MAX_BODY_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(|e| ClientError::Protocol {
                what: what.to_string(),
                reason: format!("bad gzip body: {e}"),
            })?;
        if out.len() as u64 > MAX_BODY_BYTES {
            return Err(ClientError::Protocol {
                what: what.to_string(),
                reason: format!("the answer decodes to more than {MAX_BODY_BYTES} bytes"),
            });
        }
        Ok((status, out))
    }

    async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T, ClientError> {
        let url = self.url(path, query);
        self.call(Method::GET, url, None::<&()>)
            .await
            .map(|(_, v)| v)
    }

    /// `POST /api/v1/workloads`. With an idempotency key, a transport error is
    /// retried (same key, so at most one workload results).
    pub async fn submit(&self, req: &SubmitRequest) -> Result<Submitted, ClientError> {
        let retries = if req.idempotency_key.is_some() {
            SUBMIT_RETRIES
        } else {
            0
        };
        let mut backoff = SUBMIT_RETRY_BACKOFF;
        let mut attempt = 0;
        loop {
            let url = self.url("api/v1/workloads", &[]);
            match self
                .call::<WorkloadView, _>(Method::POST, url, Some(req))
                .await
            {
                Ok((status, view)) => {
                    return Ok(Submitted {
                        view,
                        created: status == StatusCode::CREATED,
                    });
                }
                Err(ClientError::Unreachable { .. }) if attempt < retries => {
                    attempt += 1;
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `GET /api/v1/workloads`, sorted by id.
    pub async fn workloads(&self, f: &WorkloadFilter) -> Result<Vec<WorkloadView>, ClientError> {
        let mut query = Vec::new();
        if let Some(t) = &f.team {
            query.push(("team", t.clone()));
        }
        if let Some(s) = &f.state {
            query.push(("state", s.clone()));
        }
        if let Some(c) = &f.cluster {
            query.push(("cluster", c.clone()));
        }
        query.push(("limit", PAGE_ITEMS.to_string()));
        // Page through: the hub answers at most a page at a time.
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut q = query.clone();
            if let Some(t) = &token {
                q.push(("continue", t.clone()));
            }
            let page: WorkloadList = self.get("api/v1/workloads", &q).await?;
            all.extend(page.items);
            if all.len() > MAX_LISTED_WORKLOADS {
                return Err(ClientError::Protocol {
                    what: "GET /api/v1/workloads".into(),
                    reason: format!(
                        "more than {MAX_LISTED_WORKLOADS} workloads match; narrow the filter (--team, --state, --cluster)"
                    ),
                });
            }
            match page.continue_token {
                Some(t) if Some(&t) != token.as_ref() => token = Some(t),
                _ => return Ok(all),
            }
        }
    }

    /// One page of `GET /api/v1/workloads`, not decoded (a load generator
    /// that should cost the machine as little as possible): its size and
    /// the `continue` token, read from the end of the body.
    pub async fn workload_page_raw(
        &self,
        limit: usize,
        token: Option<&str>,
    ) -> Result<(usize, Option<String>), ClientError> {
        let mut q = vec![("limit", limit.to_string())];
        if let Some(t) = token {
            q.push(("continue", t.to_string()));
        }
        let req = self.http.get(self.url("api/v1/workloads", &q));
        let (status, body) = self.send(req, "GET /api/v1/workloads").await?;
        if !status.is_success() {
            return Err(ClientError::Server {
                status: status.as_u16(),
                body: error_body(status, &String::from_utf8_lossy(&body)),
            });
        }
        Ok((body.len(), continue_of(&body)))
    }

    /// `GET /api/v1/workloads/{id}`.
    pub async fn workload(&self, id: u64) -> Result<WorkloadView, ClientError> {
        self.get(&format!("api/v1/workloads/{id}"), &[]).await
    }

    /// `DELETE /api/v1/workloads/{id}`.
    pub async fn cancel(&self, id: u64) -> Result<WorkloadView, ClientError> {
        let url = self.url(&format!("api/v1/workloads/{id}"), &[]);
        self.call(Method::DELETE, url, None::<&()>)
            .await
            .map(|(_, v)| v)
    }

    /// `GET /api/v1/workloads/{id}/logs?offset=N`.
    /// With `since_ms`, from the first output that reached the hub at or
    /// after it; with `timestamps`, with when each part arrived.
    pub async fn logs(
        &self,
        id: u64,
        offset: u64,
        since_ms: Option<u64>,
        timestamps: bool,
    ) -> Result<LogsView, ClientError> {
        let mut q = vec![("offset", offset.to_string())];
        if let Some(ms) = since_ms {
            q.push(("since_ms", ms.to_string()));
        }
        if timestamps {
            q.push(("timestamps", "true".to_string()));
        }
        self.get(&format!("api/v1/workloads/{id}/logs"), &q).await
    }

    /// `GET /api/v1/clusters`.
    pub async fn clusters(&self) -> Result<Vec<ClusterView>, ClientError> {
        self.get("api/v1/clusters", &[]).await
    }

    /// `GET /api/v1/hubs`.
    pub async fn hubs(&self) -> Result<HubsView, ClientError> {
        self.get("api/v1/hubs", &[]).await
    }

    /// Sends `token` with every request from now on.
    pub fn with_token(mut self, token: Option<String>) -> Client {
        self.token = token;
        self
    }

    /// `GET /api/v1/whoami`: the caller as the hub sees them.
    pub async fn whoami(&self) -> Result<serde_json::Value, ClientError> {
        self.get("api/v1/whoami", &[]).await
    }

    /// `POST /api/v1/tokens`: a new API token for `user` (platform admins).
    pub async fn create_token(
        &self,
        user: &str,
        ttl_s: u64,
    ) -> Result<serde_json::Value, ClientError> {
        let url = self.url("api/v1/tokens", &[]);
        let body = serde_json::json!({"user": user, "ttl_s": ttl_s});
        self.call(Method::POST, url, Some(&body))
            .await
            .map(|(_, v)| v)
    }

    /// `GET /api/v1/tokens`: every API token, without secrets (platform admins).
    pub async fn tokens(&self) -> Result<Vec<serde_json::Value>, ClientError> {
        self.get("api/v1/tokens", &[]).await
    }

    /// `DELETE /api/v1/tokens/{id}`.
    pub async fn revoke_token(&self, id: &str) -> Result<serde_json::Value, ClientError> {
        let url = self.url(&format!("api/v1/tokens/{id}"), &[]);
        self.call(Method::DELETE, url, None::<&()>)
            .await
            .map(|(_, v)| v)
    }

    /// `POST /api/v1/clusters/{name}/join-tokens`: a one-time join token for a new spoke.
    pub async fn create_join_token(
        &self,
        cluster: &str,
        ttl_s: u64,
    ) -> Result<serde_json::Value, ClientError> {
        let url = self.url(&format!("api/v1/clusters/{cluster}/join-tokens"), &[]);
        let body = serde_json::json!({ "ttl_s": ttl_s });
        self.call(Method::POST, url, Some(&body))
            .await
            .map(|(_, v)| v)
    }

    /// `POST /api/v1/clusters/{name}/revoke`: cut the cluster's spoke off.
    pub async fn revoke_cluster(&self, cluster: &str) -> Result<serde_json::Value, ClientError> {
        let url = self.url(&format!("api/v1/clusters/{cluster}/revoke"), &[]);
        self.call(Method::POST, url, None::<&()>)
            .await
            .map(|(_, v)| v)
    }

    /// `GET /api/v1/teams`.
    pub async fn teams(&self) -> Result<Vec<TeamView>, ClientError> {
        self.get("api/v1/teams", &[]).await
    }

    /// `GET /api/v1/burst`: burst instances and spend this month.
    pub async fn burst(&self) -> Result<axle_proto::api::BurstView, ClientError> {
        self.get("api/v1/burst", &[]).await
    }

    /// `GET /api/v1/events`: the `tail` most recent events, or those after
    /// `since`; of one workload when `workload` is given.
    pub async fn events(
        &self,
        since: u64,
        tail: Option<u32>,
        workload: Option<u64>,
    ) -> Result<Vec<EventView>, ClientError> {
        let mut q = vec![("since", since.to_string()), ("limit", "10000".to_string())];
        if let Some(n) = tail {
            q.push(("tail", n.to_string()));
        }
        if let Some(w) = workload {
            q.push(("workload", w.to_string()));
        }
        self.get("api/v1/events", &q).await
    }
}

/// The `continue` token at the end of a workload list body, if any.
fn continue_of(body: &[u8]) -> Option<String> {
    let tail = String::from_utf8_lossy(&body[body.len().saturating_sub(256)..]);
    let i = tail.rfind("\"continue\":\"")?;
    let rest = &tail[i + 12..];
    rest.find('"').map(|j| rest[..j].to_string())
}

#[cfg(test)]
mod tests {
    /// A one-request-per-connection HTTP server on loopback that answers
    /// with `answer(request head)`; returns its address.
    async fn serve(answer: fn(&str, u16) -> String) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_lowercase();
                let reply = answer(&head, addr.port());
                let _ = s.write_all(reply.as_bytes()).await;
            }
        });
        addr
    }

    fn json_reply(status: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn a_followers_redirect_to_the_leader_keeps_the_token() {
        // Observed: `axle --hub https://follower,https://leader get workloads`
        // failed with "no credentials": the redirect to the leader's port
        // dropped Authorization.
        let leader = serve(|head, _| {
            if head.contains("authorization: bearer axle_t") {
                json_reply("200 OK", r#"{"user":"alice"}"#)
            } else {
                json_reply("401 Unauthorized", r#"{"error":"no credentials"}"#)
            }
        })
        .await;
        static LEADER: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
        LEADER.set(leader.port()).unwrap();
        let follower = serve(|_, _| {
            format!(
                "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:{}/api/v1/whoami\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                LEADER.get().unwrap()
            )
        })
        .await;
        let hubs = format!("http://{follower},http://{leader}");
        let c = Client::with_ca(&hubs, None)
            .unwrap()
            .with_token(Some("axle_t".into()));
        let me = c.whoami().await.expect("followed with the token");
        assert_eq!(me["user"], "alice");
        // A redirect to an address not given is not followed with the token.
        let c = Client::with_ca(&format!("http://{follower}"), None)
            .unwrap()
            .with_token(Some("axle_t".into()));
        assert!(c.whoami().await.is_err());
    }

    #[test]
    fn tokens_go_over_tls_or_to_this_machine_only() {
        // Observed: the CLI sent `Bearer axle_…` over plain http:// to a
        // listener on another host without a word.
        let ok = [
            "https://hub.example",
            "http://127.0.0.1:7070",
            "http://localhost:1",
            "http://[::1]:7070",
        ];
        for u in ok {
            assert!(safe_for_token(&Url::parse(u).unwrap()), "{u}");
        }
        for u in [
            "http://10.0.1.1:7070",
            "http://hub.example",
            "http://127.0.0.1.example",
        ] {
            assert!(!safe_for_token(&Url::parse(u).unwrap()), "{u}");
        }
    }

    #[tokio::test]
    async fn a_token_for_a_plain_http_remote_hub_is_refused_before_sending() {
        let c = Client::with_ca("http://10.255.255.1:7070", None)
            .unwrap()
            .with_token(Some("axle_secret".into()));
        match c.whoami().await {
            Err(ClientError::Insecure { url }) => assert_eq!(url, "http://10.255.255.1:7070"),
            other => panic!("{other:?}"),
        }
    }

    use super::*;

    #[test]
    fn the_continue_token_is_read_from_the_end_of_a_raw_page() {
        let page = WorkloadList {
            items: Vec::new(),
            continue_token: Some("w1.1f4".into()),
        };
        let body = serde_json::to_vec(&page).unwrap();
        assert_eq!(continue_of(&body).as_deref(), Some("w1.1f4"));
        let last = serde_json::to_vec(&WorkloadList::default()).unwrap();
        assert_eq!(continue_of(&last), None);
    }

    #[test]
    fn error_body_prefers_api_error_json() {
        let e = error_body(
            StatusCode::BAD_REQUEST,
            r#"{"error":"gpus must be positive","field":"gpus"}"#,
        );
        assert_eq!(api_error_text(&e), "gpus must be positive (field: gpus)");
    }

    #[test]
    fn error_body_keeps_non_json_text() {
        let e = error_body(StatusCode::UNPROCESSABLE_ENTITY, "missing field `team`\n");
        assert_eq!(
            e.error,
            "missing field `team` (HTTP 422 Unprocessable Entity)"
        );
        let e = error_body(StatusCode::NOT_FOUND, "");
        assert_eq!(e.error, "HTTP 404 Not Found");
    }

    #[test]
    fn urls_keep_a_base_path_and_encode_queries() {
        let c = Client::with_ca("http://hub.example:7070/prefix", None).unwrap();
        let url = c.url("api/v1/workloads", &[("team", "a b&c".into())]);
        assert_eq!(
            url.as_str(),
            "http://hub.example:7070/prefix/api/v1/workloads?team=a+b%26c"
        );
        assert!(Client::with_ca("not a url", None).is_err());
        assert!(Client::with_ca("ftp://x", None).is_err());
    }
}
