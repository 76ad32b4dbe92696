//! Serving the HTTP API with limits on connections: at most
//! `max_connections` open and `max_per_source` from one address, each
//! closed after `idle_timeout` without a request in flight (a client that
//! sends half a header, or nothing, counts as idle) and after
//! `header_read_timeout` without a whole header. When a limit is reached
//! the oldest idle connection (of that source, for its limit) is closed to
//! make room, so a flood of idle connections never locks out `/healthz` or
//! a user.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, warn};

/// Most open HTTP connections by default: each holds a file descriptor and
/// a task; 4,096 serves every poller of a large company and stays well
/// inside the usual open-file limits next to the store and gRPC.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4_096;
/// A connection without a request in flight for this long is closed; a
/// CLI or a browser reconnects at once, so this only reaps the idle.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// A request header must arrive whole within this time: real clients send
/// it in one packet; slow-header clients hold connections hostage.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Headers hyper's parser takes at most (the API allows `http::MAX_HEADERS`).
const PARSER_MAX_HEADERS: usize = 1_000;
/// Bytes of a request head hyper's parser buffers at most (the API allows
/// `http::MAX_HEADER_BYTES`).
const PARSER_MAX_BUF_BYTES: usize = 256 * 1024;
/// After an accept error (e.g. out of file descriptors) the listener waits
/// this long before trying again, instead of spinning.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);
/// On shutdown, open connections get this long to finish their requests.
const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub idle_timeout: Duration,
    pub header_read_timeout: Duration,
    pub max_per_source: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_per_source: crate::grpc_serve::DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
        }
    }
}

/// One open connection as the accept loop sees it.
struct Conn {
    ip: std::net::IpAddr,
    in_flight: Arc<AtomicUsize>,
    close: watch::Sender<bool>,
}

type Conns = Arc<Mutex<BTreeMap<u64, Conn>>>;

/// Counts a request in flight on its connection while it lives.
struct InFlight {
    count: Arc<AtomicUsize>,
    last: Arc<AtomicU64>,
    epoch: Instant,
}

impl InFlight {
    fn new(count: Arc<AtomicUsize>, last: Arc<AtomicU64>, epoch: Instant) -> InFlight {
        count.fetch_add(1, Ordering::SeqCst);
        InFlight { count, last, epoch }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.last
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::SeqCst);
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Closes the oldest connection with no request in flight (from `ip`
/// when given); false if every such connection is busy.
fn evict_oldest_idle(conns: &Conns, ip: Option<std::net::IpAddr>) -> bool {
    let conns = conns.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = conns.values().find(|c| {
        ip.is_none_or(|ip| c.ip == ip)
            && c.in_flight.load(Ordering::SeqCst) == 0
            && !*c.close.borrow()
    }) {
        c.close.send_replace(true);
        true
    } else {
        false
    }
}

/// Serves `app` on `listener` under `limits` (over TLS with `tls`) until
/// `shutdown` resolves, then drains open connections for at most
/// `DRAIN_DEADLINE`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    tls: Option<&crate::tls::ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let tls = tls.map(crate::tls::ServerTls::acceptor);
    let conns: Conns = Arc::default();
    let mut next_id = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    warn!("HTTP accept failed: {e}; retrying in {ACCEPT_ERROR_BACKOFF:?}");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            },
        };
        while tasks.try_join_next().is_some() {}
        let (open, from_source) = {
            let c = conns.lock().unwrap_or_else(|p| p.into_inner());
            (c.len(), c.values().filter(|c| c.ip == peer.ip()).count())
        };
        if from_source >= limits.max_per_source && !evict_oldest_idle(&conns, Some(peer.ip())) {
            debug!(
                "HTTP: {} holds {from_source} connections, all busy; refusing it (limit {})",
                peer.ip(),
                limits.max_per_source
            );
            drop(stream);
            continue;
        }
        if open >= limits.max_connections && !evict_oldest_idle(&conns, None) {
            debug!(
                "HTTP: {open} connections, all busy; refusing {peer} (limit {})",
                limits.max_connections
            );
            drop(stream);
            continue;
        }
        let id = next_id;
        next_id += 1;
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (close, closed) = watch::channel(false);
        conns.lock().unwrap_or_else(|p| p.into_inner()).insert(
            id,
            Conn {
                ip: peer.ip(),
                in_flight: in_flight.clone(),
                close,
            },
        );
        let app = app.clone();
        let conns2 = conns.clone();
        let tls = tls.clone();
        tasks.spawn(async move {
            match tls {
                None => connection(stream, peer, app, limits, in_flight, closed).await,
                Some(acceptor) => {
                    let hello = crate::tls::HANDSHAKE_TIMEOUT.min(limits.header_read_timeout);
                    match tokio::time::timeout(hello, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            connection(stream, peer, app, limits, in_flight, closed).await;
                        }
                        Ok(Err(e)) => debug!("HTTP: TLS handshake with {peer} failed: {e}"),
                        Err(_) => debug!("HTTP: TLS handshake with {peer} timed out"),
                    }
                }
            }
            conns2.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        });
    }
    drop(listener);
    for c in conns.lock().unwrap_or_else(|p| p.into_inner()).values() {
        c.close.send_replace(true);
    }
    let _ = tokio::time::timeout(DRAIN_DEADLINE, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

/// Serves one connection (plain or TLS) until it ends, is idle for
/// `limits.idle_timeout`, or `closed` says so (gracefully when a request is
/// in flight).
async fn connection<IO>(
    stream: IO,
    peer: std::net::SocketAddr,
    app: Router,
    limits: HttpLimits,
    in_flight: Arc<AtomicUsize>,
    mut closed: watch::Receiver<bool>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let epoch = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let (count, last2) = (in_flight.clone(), last.clone());
    let svc = tower::service_fn(
        move |mut req: axum::extract::Request<hyper::body::Incoming>| {
            let guard = InFlight::new(count.clone(), last2.clone(), epoch);
            let app = app.clone();
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            async move {
                let res = tower::ServiceExt::oneshot(app, req.map(axum::body::Body::new)).await;
                drop(guard);
                res
            }
        },
    );
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // Above the API's own bounds (`http::MAX_HEADERS`,
        // `http::MAX_HEADER_BYTES`), so the API answers them in JSON; only a
        // request past these gets the parser's bare 431.
        .max_headers(PARSER_MAX_HEADERS)
        .max_buf_size(PARSER_MAX_BUF_BYTES);
    builder
        .http2()
        .max_header_list_size(PARSER_MAX_BUF_BYTES as u32);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc));
    tokio::pin!(conn);
    let mut tick = tokio::time::interval(limits.idle_timeout.min(Duration::from_secs(1)));
    let mut graceful = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    debug!("HTTP connection from {peer}: {e}");
                }
                break;
            }
            _ = closed.changed(), if !graceful => {
                if in_flight.load(Ordering::SeqCst) == 0 {
                    break; // idle: drop it now
                }
                conn.as_mut().graceful_shutdown();
                graceful = true;
            }
            _ = tick.tick() => {
                let idle_ms = epoch.elapsed().as_millis() as u64
                    - last.load(Ordering::SeqCst);
                if in_flight.load(Ordering::SeqCst) == 0
                    && idle_ms >= limits.idle_timeout.as_millis() as u64
                {
                    break;
                }
            }
        }
    }
}
