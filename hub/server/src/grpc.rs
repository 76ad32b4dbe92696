//! The hub's gRPC services: the spoke session stream and the user API.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axle_proto::pb;
use axle_proto::pb::spoke_message::Msg;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

use crate::hub::{Command, Hub, HubError, SPOKE_QUEUE};
use crate::logs;
use crate::views;

pub struct SpokeSvc {
    hub: Arc<Hub>,
    next_conn: AtomicU64,
}

impl SpokeSvc {
    pub fn new(hub: Arc<Hub>) -> SpokeSvc {
        SpokeSvc {
            hub,
            next_conn: AtomicU64::new(1),
        }
    }
}

/// The gRPC code of each core error: the only place they meet.
pub fn status_of(e: HubError) -> Status {
    let msg = e.to_string();
    match e {
        HubError::BadRequest { .. } => Status::invalid_argument(msg),
        HubError::NotFound(_) => Status::not_found(msg),
        HubError::Conflict(_) => Status::failed_precondition(msg),
        HubError::Unauthenticated(_) => Status::unauthenticated(msg),
        HubError::PermissionDenied(_) => Status::permission_denied(msg),
        HubError::Unavailable(_) | HubError::TooBusy { .. } => Status::unavailable(msg),
        HubError::RateLimited { .. } => Status::resource_exhausted(msg),
        HubError::Internal(_) => Status::internal(msg),
    }
}

/// What a spoke's session stream carries: the core's messages, never an error.
type Outbound = tokio_stream::adapters::Map<
    ReceiverStream<pb::HubMessage>,
    fn(pb::HubMessage) -> Result<pb::HubMessage, Status>,
>;

#[tonic::async_trait]
impl pb::spoke_service_server::SpokeService for SpokeSvc {
    type SessionStream = Outbound;

    async fn session(
        &self,
        req: Request<Streaming<pb::SpokeMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let peer = peer_fingerprint(&req);
        let mut inbound = req.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream closed before Register"))?;
        let Some(Msg::Register(register)) = first.msg else {
            return Err(Status::failed_precondition(
                "the first message of a session must be Register",
            ));
        };
        let cluster = register.cluster.clone();
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(SPOKE_QUEUE);
        let (reply, registered) = oneshot::channel();
        self.hub
            .send(Command::Register {
                register,
                peer,
                conn,
                tx,
                reply,
            })
            .await
            .map_err(status_of)?;
        registered
            .await
            .map_err(|_| status_of(self.hub.stopped()))?
            .map_err(status_of)?;
        let hub = self.hub.clone();
        let log_dir = logs::dir(&hub.config.data_dir);
        tokio::spawn(async move {
            read_session(hub, inbound, cluster, conn, log_dir).await;
        });
        let ok: fn(pb::HubMessage) -> Result<pb::HubMessage, Status> = Ok;
        Ok(Response::new(ReceiverStream::new(rx).map(ok)))
    }

    async fn join(
        &self,
        req: Request<pb::JoinRequest>,
    ) -> Result<Response<pb::SpokeCertificate>, Status> {
        let r = req.into_inner();
        // Anyone may call Join: what is not a join token the hub holds is
        // refused here, from the read view, without the applier.
        let known = crate::spoke_ca::parse_join_token(&r.token)
            .is_some_and(|(id, _, _)| self.hub.read().join_tokens.contains_key(id));
        if !known {
            return Err(status_of(crate::hub::invalid_join_token()));
        }
        let issued = self
            .hub
            .ask(|reply| Command::Join {
                token: r.token,
                cluster: r.cluster,
                csr_pem: r.csr_pem,
                reply,
            })
            .await
            .map_err(status_of)?;
        info!("spoke for cluster {} joined", issued.cluster);
        Ok(Response::new(certificate_pb(issued)))
    }

    async fn renew(
        &self,
        req: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::SpokeCertificate>, Status> {
        let peer = peer_fingerprint(&req);
        let issued = self
            .hub
            .ask(|reply| Command::Renew {
                peer,
                csr_pem: req.into_inner().csr_pem,
                reply,
            })
            .await
            .map_err(status_of)?;
        Ok(Response::new(certificate_pb(issued)))
    }
}

/// The SHA-256 fingerprint of the certificate the peer connected with (mTLS).
fn peer_fingerprint<T>(req: &Request<T>) -> Option<String> {
    peer(req)
        .and_then(|p| p.certs.as_ref())
        .and_then(|certs| certs.first().map(|c| crate::spoke_ca::sha256_hex(c)))
}

/// The connection a request came on (`grpc_serve.rs` puts it there).
fn peer<T>(req: &Request<T>) -> Option<&crate::grpc_serve::GrpcPeer> {
    req.extensions().get::<crate::grpc_serve::GrpcPeer>()
}

fn certificate_pb(c: crate::hub::IssuedCert) -> pb::SpokeCertificate {
    pb::SpokeCertificate {
        cluster: c.cluster,
        certificate_pem: c.certificate_pem,
        ca_pem: c.ca_pem,
        issued_at_ms: c.issued_at_ms,
        not_after_ms: c.not_after_ms,
    }
}

/// Messages per second one spoke's session may send on average: a
/// heartbeat a second, and the statuses and log chunks of a busy cluster.
pub const SPOKE_MESSAGES_PER_S: f64 = 2_000.0;
/// Messages one session may send at once above that average: the statuses
/// of a whole cluster of work starting together.
pub const SPOKE_MESSAGES_BURST: f64 = 20_000.0;

/// A token bucket that paces one session's reads: beyond its rate the
/// hub reads that spoke more slowly (HTTP/2 flow control slows the spoke),
/// so one spoke cannot fill the applier's queue that every spoke and user
/// shares.
#[derive(Debug)]
pub(crate) struct Pace {
    tokens: f64,
    at: tokio::time::Instant,
    rate: f64,
    burst: f64,
}

impl Pace {
    pub(crate) fn new(rate: f64, burst: f64) -> Pace {
        Pace {
            tokens: burst,
            at: tokio::time::Instant::now(),
            rate,
            burst,
        }
    }

    /// How long to wait before the next message may be read (zero: now).
    pub(crate) fn take(&mut self) -> std::time::Duration {
        let now = tokio::time::Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.burst);
        self.at = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            std::time::Duration::ZERO
        } else {
            std::time::Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

async fn read_session(
    hub: Arc<Hub>,
    mut inbound: Streaming<pb::SpokeMessage>,
    cluster: String,
    conn: u64,
    log_dir: PathBuf,
) {
    // Log chunks refused on this session (the first is logged, the rest counted).
    let mut refused = 0u64;
    let mut pace = Pace::new(SPOKE_MESSAGES_PER_S, SPOKE_MESSAGES_BURST);
    let mut paced_since: Option<tokio::time::Instant> = None;
    loop {
        let wait = pace.take();
        if !wait.is_zero() {
            if paced_since.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(10)) {
                warn!(
                    "spoke {cluster} sends more than {SPOKE_MESSAGES_PER_S} messages a second \
                     (bursts of {SPOKE_MESSAGES_BURST}); reading it more slowly"
                );
                paced_since = Some(tokio::time::Instant::now());
            }
            tokio::time::sleep(wait).await;
        }
        match inbound.message().await {
            Ok(Some(m)) => {
                let cmd = match m.msg {
                    Some(Msg::Heartbeat(heartbeat)) => Command::Heartbeat {
                        cluster: cluster.clone(),
                        conn,
                        heartbeat,
                    },
                    Some(Msg::Status(status)) => Command::Status {
                        cluster: cluster.clone(),
                        conn,
                        status,
                    },
                    Some(Msg::Log(chunk)) => {
                        let owned = hub.read().may_log(&cluster, chunk.workload_id, chunk.epoch);
                        if let Err(why) = owned {
                            refused += 1;
                            if refused == 1 {
                                warn!("spoke {cluster}: log chunk refused: {why}");
                            }
                            continue;
                        }
                        if let Err(e) =
                            logs::write_chunk(&log_dir, hub.config.log_limits, &chunk, hub.now_ms())
                                .await
                        {
                            warn!("cannot store log of workload {}: {e}", chunk.workload_id);
                        }
                        continue;
                    }
                    Some(Msg::Register(_)) => {
                        warn!("spoke {cluster} sent Register twice; ignoring");
                        continue;
                    }
                    None => continue,
                };
                if hub.send(cmd).await.is_err() {
                    return;
                }
            }
            Ok(None) => break,
            Err(e) => {
                info!("spoke {cluster} stream ended: {e}");
                break;
            }
        }
    }
    if refused > 0 {
        warn!("spoke {cluster}: {refused} log chunks refused on this session");
    }
    let _ = hub.send(Command::Disconnected { cluster, conn }).await;
}

pub struct UserSvc {
    hub: Arc<Hub>,
}

impl UserSvc {
    pub fn new(hub: Arc<Hub>) -> UserSvc {
        UserSvc { hub }
    }

    /// The caller, from the `authorization` metadata (`Bearer axle_…`).
    fn caller<T>(
        &self,
        req: &Request<T>,
    ) -> Result<(crate::auth::Identity, crate::rate::Call<'_>), Status> {
        let header = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let source = peer(req).map(|p| p.addr.ip());
        let now = self.hub.now_ms();
        self.hub
            .limiter
            .check_source(source, now)
            .map_err(status_of)?;
        let view = self.hub.read();
        let who = crate::auth::authenticate(
            self.hub.config.auth,
            &view.tokens,
            self.hub.config.oidc.as_deref(),
            header,
            now,
        )
        .map_err(|e| {
            self.hub.limiter.failed(source, now);
            status_of(e)
        })?;
        drop(view);
        let admitted = self.hub.limiter.admit(&who, now).map_err(status_of)?;
        Ok((who, admitted))
    }
}

#[tonic::async_trait]
impl pb::user_service_server::UserService for UserSvc {
    async fn submit(
        &self,
        req: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::Workload>, Status> {
        let (who, _admitted) = self.caller(&req)?;
        let (reply, rx) = oneshot::channel();
        self.hub
            .send(Command::Submit(
                views::submit_from_pb(req.into_inner()),
                who,
                reply,
            ))
            .await
            .map_err(status_of)?;
        let (view, _) = rx
            .await
            .map_err(|_| status_of(self.hub.stopped()))?
            .map_err(status_of)?;
        Ok(Response::new(views::workload_pb(&view)))
    }

    async fn get_workload(
        &self,
        req: Request<pb::GetWorkloadRequest>,
    ) -> Result<Response<pb::Workload>, Status> {
        let (who, _admitted) = self.caller(&req)?;
        let id = req.into_inner().id;
        let read = self.hub.read();
        crate::http::may_read(&read, &who, id).map_err(status_of)?;
        let view = read
            .view(id)
            .ok_or_else(|| Status::not_found(format!("workload {id} not found")))?;
        Ok(Response::new(views::workload_pb(&view)))
    }

    async fn list_workloads(
        &self,
        req: Request<pb::ListWorkloadsRequest>,
    ) -> Result<Response<pb::ListWorkloadsResponse>, Status> {
        let (who, _admitted) = self.caller(&req)?;
        let r = req.into_inner();
        let opt = |s: String| if s.is_empty() { None } else { Some(s) };
        let params = crate::hub::ListParams {
            team: opt(r.team),
            state: opt(r.state),
            cluster: opt(r.cluster),
            priority: opt(r.priority),
            name_prefix: opt(r.name_prefix),
            limit: (r.limit > 0).then_some(r.limit as usize),
            continue_token: opt(r.continue_token),
            visible_teams: None,
        };
        let read = self.hub.read();
        let params = crate::hub::ListParams {
            visible_teams: crate::auth::readable_teams(&read.policy, &who),
            ..params
        };
        let page = self
            .hub
            .with_list_permit(move || {
                read.list(&params)
                    .map(|(list, next)| pb::ListWorkloadsResponse {
                        workloads: list.iter().map(views::workload_pb).collect(),
                        continue_token: next.unwrap_or_default(),
                    })
            })
            .await
            .map_err(status_of)?
            .map_err(status_of)?;
        Ok(Response::new(page))
    }

    async fn cancel_workload(
        &self,
        req: Request<pb::GetWorkloadRequest>,
    ) -> Result<Response<pb::Workload>, Status> {
        let (who, _admitted) = self.caller(&req)?;
        let (reply, rx) = oneshot::channel();
        self.hub
            .send(Command::Cancel(req.into_inner().id, who, reply))
            .await
            .map_err(status_of)?;
        let view = rx
            .await
            .map_err(|_| status_of(self.hub.stopped()))?
            .map_err(status_of)?;
        Ok(Response::new(views::workload_pb(&view)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_sessions_reads_are_paced_beyond_its_rate() {
        let mut p = Pace::new(10.0, 5.0);
        for _ in 0..5 {
            assert!(p.take().is_zero(), "the burst");
        }
        let wait = p.take();
        assert_eq!(wait, std::time::Duration::from_millis(100));
        tokio::time::advance(std::time::Duration::from_secs(10)).await;
        for _ in 0..5 {
            assert!(p.take().is_zero(), "refilled, at most the burst");
        }
        assert!(!p.take().is_zero());
    }
}
