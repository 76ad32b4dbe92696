//! What a replica serves, by role. Its HTTP and gRPC servers run for the whole process;
//! each request looks at the current [`Role`]: the leader's requests go to its hub, a
//! follower's are redirected to the leader (HTTP 307 with `Location`; gRPC `UNAVAILABLE`
//! with the leader in the `axle-leader-grpc` and `axle-leader-http` metadata), and with no
//! leader at all (an election, or etcd unreachable) they get 503 with `Retry-After`.
//! `/healthz`, `/readyz` and `/api/v1/hubs` are this replica's own on every role.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use axle_proto::api::{ApiError, HubReplicaView, HubsView};
use axle_proto::pb;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tonic::server::NamedService;
use tower::{Service, ServiceExt};

use super::election::{self, Leader, ReplicaInfo};
use crate::grpc::{SpokeSvc, UserSvc};
use crate::hub::Hub;
use crate::store::EtcdStore;

/// Seconds a client is told to wait when no replica leads: an election takes about a
/// second once the old leader's lease is gone.
const RETRY_AFTER_S: &str = "1";

/// What this replica is now.
pub enum Role {
    /// Not leading; who does, if anyone is known to.
    Follower { leader: Option<Leader> },
    /// Leading: the hub and its servers for this term.
    Leader {
        leader: Leader,
        hub: Arc<Hub>,
        http: Router,
        spoke: pb::spoke_service_server::SpokeServiceServer<SpokeSvc>,
        user: pb::user_service_server::UserServiceServer<UserSvc>,
        /// Where this term's hub state came from, and how long restoring it took.
        restored: String,
    },
}

impl Role {
    fn leader(&self) -> Option<&Leader> {
        match self {
            Role::Follower { leader } => leader.as_ref(),
            Role::Leader { leader, .. } => Some(leader),
        }
    }
}

pub type Roles = Arc<ArcSwap<Role>>;

#[derive(Clone)]
pub(super) struct Front {
    pub role: Roles,
    pub store: Arc<EtcdStore>,
    pub me: ReplicaInfo,
    /// This replica's mirror revision while it follows (0: cold).
    pub warm: Arc<AtomicU64>,
    /// How callers of `/api/v1/hubs` prove who they are (the hub's own).
    pub auth: crate::auth::AuthMode,
    pub oidc: Option<Arc<crate::oidc::Oidc>>,
}

impl Front {
    /// The caller of a request this replica answers itself: its API token
    /// is read from etcd (a follower has no hub of its own), an ID token
    /// checked against the issuer's keys.
    async fn authenticate(
        &self,
        headers: &axum::http::HeaderMap,
    ) -> Result<(), crate::hub::HubError> {
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let mut tokens = std::collections::BTreeMap::new();
        let bare = authorization.map(|a| {
            a.trim_start_matches("Bearer ")
                .trim_start_matches("bearer ")
                .trim()
        });
        if self.auth != crate::auth::AuthMode::None
            && let Some((id, _)) = bare.and_then(crate::auth::parse)
            && let Ok(Some(kv)) =
                crate::store::Store::get(self.store.as_ref(), &crate::records::token_key(id)).await
            && let Ok(t) = serde_json::from_slice::<crate::auth::TokenRecord>(&kv.value)
        {
            tokens.insert(id.to_string(), t);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        crate::auth::authenticate(self.auth, &tokens, self.oidc.as_deref(), authorization, now)
            .map(|_| ())
    }
}

pub(super) fn router(front: Front) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/api/v1/hubs", get(hubs))
        .fallback(dispatch)
        .with_state(front)
}

fn error(code: StatusCode, msg: String) -> Response {
    (
        code,
        axum::Json(ApiError {
            error: msg,
            field: None,
        }),
    )
        .into_response()
}

fn no_leader() -> Response {
    let mut r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        "no hub replica leads right now (an election is under way, or etcd cannot be \
         reached); retry shortly"
            .to_string(),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_S));
    r
}

async fn readyz(State(f): State<Front>) -> Response {
    match &**f.role.load() {
        Role::Leader { .. } => "ready".into_response(),
        Role::Follower { leader: Some(l) } => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "replica {} follows; the leader is {} at {}",
                f.me.id, l.info.id, l.info.http
            ),
        ),
        Role::Follower { leader: None } => no_leader(),
    }
}

async fn hubs(State(f): State<Front>, headers: axum::http::HeaderMap) -> Response {
    // Observed: the replicas' addresses and terms answered without a token.
    if let Err(e) = f.authenticate(&headers).await {
        return crate::http::err(e);
    }
    let role = f.role.load_full();
    let leader = role.leader().cloned();
    let state = match &*role {
        Role::Leader { restored, .. } => format!("leads; {restored}"),
        Role::Follower { .. } => match f.warm.load(Ordering::Relaxed) {
            0 => "follows; its mirror is cold (listing the store)".to_string(),
            rev => format!("follows; its mirror is at revision {rev}"),
        },
    };
    let replicas = match election::replicas(&f.store).await {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot read the hub replicas from etcd: {e}"),
            );
        }
    };
    let lead_id = leader.as_ref().map(|l| l.info.id.clone());
    let view = HubsView {
        store: "etcd".to_string(),
        answered_by: f.me.id.clone(),
        leader: lead_id.clone(),
        term: leader.as_ref().map(|l| l.term),
        state: Some(state),
        replicas: replicas
            .into_iter()
            .map(|r| HubReplicaView {
                leader: lead_id.as_deref() == Some(r.id.as_str()),
                id: r.id,
                http: r.http,
                grpc: r.grpc,
                started_at_ms: r.started_at_ms,
            })
            .collect(),
    };
    axum::Json(view).into_response()
}

/// Every other request: the leader's hub serves it, a follower redirects it.
async fn dispatch(State(f): State<Front>, req: Request) -> Response {
    let role = f.role.load_full();
    match &*role {
        Role::Leader { http, .. } => match http.clone().oneshot(req).await {
            Ok(r) => r,
            Err(e) => match e {},
        },
        Role::Follower { leader: Some(l) } => {
            let path = req
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_string();
            let location = format!("{}{path}", l.info.http.trim_end_matches('/'));
            let mut r = error(
                StatusCode::TEMPORARY_REDIRECT,
                format!(
                    "replica {} does not lead; the leader is {} at {}",
                    f.me.id, l.info.id, l.info.http
                ),
            );
            match HeaderValue::from_str(&location) {
                Ok(v) => {
                    r.headers_mut().insert(header::LOCATION, v);
                    r
                }
                Err(_) => no_leader(),
            }
        }
        Role::Follower { leader: None } => no_leader(),
    }
}

/// The gRPC answer of a replica that does not lead.
fn not_leader_status(leader: Option<&Leader>) -> tonic::Status {
    let Some(l) = leader else {
        return tonic::Status::unavailable(
            "no hub replica leads right now (an election is under way, or etcd cannot be \
             reached); retry shortly",
        );
    };
    let mut s = tonic::Status::unavailable(format!(
        "this hub replica does not lead; the leader is {} at {}",
        l.info.id, l.info.grpc
    ));
    for (key, value) in [
        ("axle-leader-grpc", &l.info.grpc),
        ("axle-leader-http", &l.info.http),
    ] {
        if let Ok(v) = value.parse() {
            s.metadata_mut().insert(key, v);
        }
    }
    s
}

/// One gRPC service of the leader, or the redirect when this replica follows.
#[derive(Clone)]
pub(super) struct GrpcSwitch<S> {
    role: Roles,
    pick: fn(&Role) -> Option<S>,
}

impl<S> GrpcSwitch<S> {
    pub fn new(role: Roles, pick: fn(&Role) -> Option<S>) -> Self {
        GrpcSwitch { role, pick }
    }
}

pub(super) fn spoke_of(r: &Role) -> Option<pb::spoke_service_server::SpokeServiceServer<SpokeSvc>> {
    match r {
        Role::Leader { spoke, .. } => Some(spoke.clone()),
        Role::Follower { .. } => None,
    }
}

pub(super) fn user_of(r: &Role) -> Option<pb::user_service_server::UserServiceServer<UserSvc>> {
    match r {
        Role::Leader { user, .. } => Some(user.clone()),
        Role::Follower { .. } => None,
    }
}

impl<S: NamedService> NamedService for GrpcSwitch<S> {
    const NAME: &'static str = S::NAME;
}

type GrpcResponse = axum::http::Response<tonic::body::Body>;

impl<S> Service<axum::http::Request<tonic::body::Body>> for GrpcSwitch<S>
where
    S: Service<axum::http::Request<tonic::body::Body>, Response = GrpcResponse, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = GrpcResponse;
    type Error = Infallible;
    type Future = crate::store::BoxFuture<'static, Result<GrpcResponse, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::http::Request<tonic::body::Body>) -> Self::Future {
        let role = self.role.load_full();
        let inner = (self.pick)(&role);
        Box::pin(async move {
            match inner {
                Some(svc) => svc.oneshot(req).await,
                None => Ok(not_leader_status(role.leader()).into_http()),
            }
        })
    }
}
