//! Accepting gRPC connections with limits, as `http_serve.rs` does for
//! HTTP: at most `max_connections` open and `max_per_source` from one
//! address; a TLS handshake must finish within
//! [`crate::tls::HANDSHAKE_TIMEOUT`] and the HTTP/2 preface arrive within
//! [`PREFACE_TIMEOUT`] of the accept, or the connection is closed. When the
//! total is reached, the oldest connection that has not sent its preface is
//! closed to make room; when a source is at its share, its new connections
//! are refused. So a flood of idle connections from one place never locks
//! a spoke out, nor takes the hub to its file-descriptor limit.
//!
//! TLS is done here (rustls), not by tonic, so the handshake has a deadline;
//! what tonic would have told the services (the peer's address and
//! certificates) comes as [`GrpcPeer`] in each request's extensions.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Sleep;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, warn};

/// Most open gRPC connections by default: a spoke holds one, a CLI or
/// script one per call; 4,096 is far above a fleet's spokes and stays well
/// inside the usual open-file limits next to HTTP and the store.
pub const DEFAULT_GRPC_MAX_CONNECTIONS: usize = 4_096;

/// Most connections one source address may hold open, on each port, by
/// default: a spoke needs one, an office behind one NAT address a few
/// hundred browsers and CLIs; one party alone cannot fill the total.
pub const DEFAULT_MAX_CONNECTIONS_PER_SOURCE: usize = 256;

/// The 24-byte HTTP/2 connection preface must arrive within this time of
/// the accept (after the TLS handshake): a real client sends it at once;
/// a connection that sends nothing only holds a file descriptor.
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of the HTTP/2 client preface (`PRI * HTTP/2.0…`).
const PREFACE_BYTES: usize = 24;

/// Accepted connections waiting for tonic to take them.
const ACCEPT_QUEUE: usize = 64;

/// After an accept error (e.g. out of file descriptors) the listener waits
/// this long before trying again, instead of spinning.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy)]
pub struct GrpcLimits {
    pub max_connections: usize,
    pub max_per_source: usize,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        GrpcLimits {
            max_connections: DEFAULT_GRPC_MAX_CONNECTIONS,
            max_per_source: DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
        }
    }
}

/// Who is on the other end of a gRPC connection: in every request's
/// extensions.
#[derive(Debug, Clone)]
pub struct GrpcPeer {
    pub addr: SocketAddr,
    /// The client's certificate chain (mTLS), if it presented one.
    pub certs: Option<Arc<Vec<CertificateDer<'static>>>>,
}

/// What the accept loop knows of one open connection.
struct Entry {
    ip: IpAddr,
    /// The HTTP/2 preface arrived: a client, not an idle socket.
    greeted: Arc<AtomicBool>,
    evict: Arc<Evict>,
}

/// Closes a connection from outside: its next read fails (or its TLS
/// handshake ends).
#[derive(Default)]
struct Evict {
    now: AtomicBool,
    waker: AtomicWaker,
    handshake: tokio::sync::Notify,
}

#[derive(Default)]
struct Table {
    conns: BTreeMap<u64, Entry>,
    per_source: HashMap<IpAddr, usize>,
}

type Shared = Arc<Mutex<Table>>;

/// Holds a connection's place in the table while it lives.
struct Slot {
    table: Shared,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = t.conns.remove(&self.id)
            && let Some(n) = t.per_source.get_mut(&e.ip)
        {
            *n -= 1;
            if *n == 0 {
                t.per_source.remove(&e.ip);
            }
        }
    }
}

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// One accepted gRPC connection (plain or TLS) with its limits.
pub struct GrpcConn {
    io: Io,
    peer: GrpcPeer,
    read: usize,
    greeted: Arc<AtomicBool>,
    preface: Option<Pin<Box<Sleep>>>,
    evict: Arc<Evict>,
    _slot: Slot,
}

impl tonic::transport::server::Connected for GrpcConn {
    type ConnectInfo = GrpcPeer;

    fn connect_info(&self) -> GrpcPeer {
        self.peer.clone()
    }
}

impl AsyncRead for GrpcConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        me.evict.waker.register(cx.waker());
        if me.evict.now.load(Ordering::SeqCst) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for other connections",
            )));
        }
        let before = buf.filled().len();
        let r = match &mut me.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        };
        match r {
            Poll::Ready(Ok(())) => {
                me.read += buf.filled().len() - before;
                if me.read >= PREFACE_BYTES && me.preface.is_some() {
                    me.preface = None;
                    me.greeted.store(true, Ordering::SeqCst);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                let late = me
                    .preface
                    .as_mut()
                    .is_some_and(|d| d.as_mut().poll(cx).is_ready());
                if late {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "no HTTP/2 preface within {} s of the connection",
                            PREFACE_TIMEOUT.as_secs()
                        ),
                    )));
                }
                Poll::Pending
            }
            other => other,
        }
    }
}

impl AsyncWrite for GrpcConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// Accepts connections on `listener` under `limits` (over TLS with `tls`)
/// for tonic's `serve_with_incoming*`: the stream ends, and the accept loop
/// with it, when tonic drops it.
pub fn incoming(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: GrpcLimits,
) -> ReceiverStream<io::Result<GrpcConn>> {
    let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
    tokio::spawn(accept_loop(listener, tls, limits, tx));
    ReceiverStream::new(rx)
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: GrpcLimits,
    tx: mpsc::Sender<io::Result<GrpcConn>>,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let table: Shared = Arc::default();
    let mut next_id = 0u64;
    let refusals = crate::rate::Refusals::default();
    loop {
        let (stream, peer) = tokio::select! {
            () = tx.closed() => return,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    warn!("gRPC accept failed: {e}; retrying in {ACCEPT_ERROR_BACKOFF:?}");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            },
        };
        let ip = peer.ip();
        let id = next_id;
        next_id += 1;
        let (greeted, evict) = (Arc::new(AtomicBool::new(false)), Arc::new(Evict::default()));
        {
            let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
            if t.per_source.get(&ip).copied().unwrap_or(0) >= limits.max_per_source {
                drop(t);
                debug!(
                    "gRPC: {ip} holds its {} connections; refusing",
                    limits.max_per_source
                );
                refusals.note(
                    "gRPC connections",
                    &ip.to_string(),
                    "at its share of connections (--max-connections-per-source)",
                );
                continue;
            }
            if t.conns.len() >= limits.max_connections {
                // Make room: close the oldest connection that never greeted.
                let idle = t.conns.values().find(|e| {
                    !e.greeted.load(Ordering::SeqCst) && !e.evict.now.load(Ordering::SeqCst)
                });
                match idle {
                    Some(e) => {
                        e.evict.now.store(true, Ordering::SeqCst);
                        e.evict.waker.wake();
                        e.evict.handshake.notify_one();
                    }
                    None => {
                        drop(t);
                        refusals.note(
                            "gRPC connections",
                            &ip.to_string(),
                            "every connection busy (--grpc-max-connections)",
                        );
                        continue;
                    }
                }
            }
            t.conns.insert(
                id,
                Entry {
                    ip,
                    greeted: greeted.clone(),
                    evict: evict.clone(),
                },
            );
            *t.per_source.entry(ip).or_insert(0) += 1;
        }
        let slot = Slot {
            table: table.clone(),
            id,
        };
        let _ = stream.set_nodelay(true);
        let tx = tx.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let (io, certs) = match acceptor {
                None => (Io::Plain(stream), None),
                Some(a) => {
                    let handshake =
                        tokio::time::timeout(crate::tls::HANDSHAKE_TIMEOUT, a.accept(stream));
                    let done = tokio::select! {
                        r = handshake => r,
                        () = evict.handshake.notified() => return,
                    };
                    match done {
                        Ok(Ok(s)) => {
                            let certs = s.get_ref().1.peer_certificates().map(|c| {
                                Arc::new(c.iter().map(|c| c.clone().into_owned()).collect())
                            });
                            (Io::Tls(Box::new(s)), certs)
                        }
                        Ok(Err(e)) => {
                            debug!("gRPC: TLS handshake with {peer} failed: {e}");
                            return;
                        }
                        Err(_) => {
                            debug!("gRPC: TLS handshake with {peer} timed out");
                            return;
                        }
                    }
                }
            };
            let conn = GrpcConn {
                io,
                peer: GrpcPeer { addr: peer, certs },
                read: 0,
                greeted,
                preface: Some(Box::pin(tokio::time::sleep(PREFACE_TIMEOUT))),
                evict,
                _slot: slot,
            };
            let _ = tx.send(Ok(conn)).await;
        });
    }
}
