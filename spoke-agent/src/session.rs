//! The spoke's side of the hub connection: dial out, open `Session`, pass hub
//! messages to the agent, and redial with exponential backoff when anything
//! fails, for as long as the spoke runs.

use std::time::Duration;

use anyhow::Context as _;
use axle_proto::pb;
use axle_proto::pb::spoke_service_client::SpokeServiceClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::agent::Input;

/// First reconnect delay: short, so a hub restart or a blip costs little.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Reconnect delay ceiling. 5 s bounds how long a spoke stays away after the
/// hub is back (its finished workloads' statuses wait that long), while a
/// fleet of 1,000 spokes redials a down hub at only ~200 connects/s.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long one TCP/HTTP2 connect may take before it counts as failed.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 PING interval. A hub that vanished without closing the connection
/// (host died, network partition, a paused process) is noticed within
/// interval + timeout (10 s), after which the spoke redials the next hub
/// replica; the hub's own spoke timeout should be longer than that. One PING
/// per spoke every 5 s is nothing to a hub.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// How long a PING may go unanswered before the connection is dropped.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// gRPC metadata in which a hub replica that does not lead names the leader.
pub const LEADER_METADATA: &str = "axle-leader-grpc";
/// Most hub addresses one `--hub` may list: replicas are 3 or 5.
pub const MAX_HUB_ADDRESSES: usize = 16;
/// Messages between the agent and the gRPC stream. Small on purpose: what
/// sits here when the stream breaks is lost, so the agent's outbox (which
/// survives reconnects) is the real buffer.
pub const OUTBOUND_CHANNEL_CAPACITY: usize = 64;
/// After this many failed dials in a row, failures are logged again at warn
/// level (≈ once a minute at the maximum backoff) instead of debug.
const WARN_EVERY_FAILED_DIALS: u32 = 12;

/// An error with its causes (tonic's transport error alone says only
/// "transport error").
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Jittered exponential backoff (backon): [`INITIAL_BACKOFF`], doubling,
/// capped at [`MAX_BACKOFF`], each delay plus up to as much again at
/// random — so spokes that lost the same hub do not all redial it in the
/// same instant.
#[derive(Debug)]
pub struct Backoff {
    inner: backon::ExponentialBackoff,
}

fn jittered(min: Duration, max: Duration) -> backon::ExponentialBackoff {
    use backon::BackoffBuilder as _;
    backon::ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(min)
        .with_max_delay(max)
        .without_max_times()
        .build()
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            inner: jittered(INITIAL_BACKOFF, MAX_BACKOFF),
        }
    }
}

impl Backoff {
    pub fn next_delay(&mut self) -> Duration {
        self.inner.next().unwrap_or(MAX_BACKOFF)
    }

    pub fn reset(&mut self) {
        *self = Backoff::default();
    }
}

/// How long to wait before dialing the leader a follower named: soon, but
/// spread over [`LEADER_REDIAL_SPREAD`] so that every spoke of a fleet
/// does not reach a new leader at once (they once redialed in lockstep).
fn leader_redial_delay() -> Duration {
    jittered(LEADER_REDIAL_SPREAD / 2, LEADER_REDIAL_SPREAD)
        .next()
        .unwrap_or(LEADER_REDIAL_SPREAD)
}

/// The spread of leader redials (see [`leader_redial_delay`]): a second
/// spreads thousands of spokes thinly, and is well inside a failover.
pub const LEADER_REDIAL_SPREAD: Duration = Duration::from_secs(1);

/// TLS to the hub trusting the CA certificate(s) in `ca_pem` (`--ca-file`).
pub fn client_tls(ca_pem: Option<&[u8]>) -> Option<ClientTlsConfig> {
    ca_pem.map(|pem| ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
}

/// The hub endpoint with the spoke's timeouts and keepalive; `https://` URLs with `tls`.
pub fn endpoint(hub_url: &str, tls: Option<&ClientTlsConfig>) -> anyhow::Result<Endpoint> {
    let mut endpoint = Endpoint::from_shared(hub_url.to_string()).with_context(|| {
        format!("invalid hub URL {hub_url:?}; expected e.g. http://127.0.0.1:7071")
    })?;
    if hub_url.starts_with("https://") {
        let Some(tls) = tls else {
            anyhow::bail!(
                "hub URL {hub_url:?} is TLS: give the CA that signed the hub's certificate \
                 with --ca-file (or AXLE_CA_FILE)"
            );
        };
        endpoint = endpoint
            .tls_config(tls.clone())
            .with_context(|| format!("hub URL {hub_url:?}: TLS settings"))?;
    }
    Ok(endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tcp_nodelay(true))
}

/// The endpoints of `--hub a,b,c` (one or more hub replicas), in order.
pub fn endpoints(hub_urls: &str, tls: Option<&ClientTlsConfig>) -> anyhow::Result<Vec<Endpoint>> {
    let urls: Vec<&str> = hub_urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    if urls.is_empty() {
        anyhow::bail!("no hub address given; expected e.g. http://127.0.0.1:7071");
    }
    if urls.len() > MAX_HUB_ADDRESSES {
        anyhow::bail!(
            "{} hub addresses given, at most {MAX_HUB_ADDRESSES}",
            urls.len()
        );
    }
    urls.into_iter().map(|u| endpoint(u, tls)).collect()
}

/// The URL of the leader a replica that does not lead named, if it did.
pub(crate) fn leader_url(status: &tonic::Status) -> Option<String> {
    if status.code() != tonic::Code::Unavailable {
        return None;
    }
    let url = status.metadata().get(LEADER_METADATA)?.to_str().ok()?;
    Some(url.to_string())
}

/// The leader a replica that does not lead named, if it did.
fn leader_hint(status: &tonic::Status, tls: Option<&ClientTlsConfig>) -> Option<Endpoint> {
    endpoint(&leader_url(status)?, tls).ok()
}

/// Where each connection's TLS settings come from.
#[derive(Clone)]
pub enum TlsSource {
    /// Plaintext (`None`) or TLS trusting `--ca-file`, the same for every connection.
    Fixed(Option<ClientTlsConfig>),
    /// mTLS with the spoke's certificate, which renewals replace.
    Identity(std::sync::Arc<crate::identity::Credentials>),
}

impl TlsSource {
    pub fn current(&self) -> Option<ClientTlsConfig> {
        match self {
            TlsSource::Fixed(t) => t.clone(),
            TlsSource::Identity(c) => Some(c.tls()),
        }
    }
}

/// Dials the hub forever, going round the replicas of `hub_urls` (and
/// straight to the leader a follower names); each session is announced to
/// the agent with `Connected` (carrying the sender for the upward stream)
/// and closed with `Disconnected`. Returns only when the agent is gone.
pub async fn dial_loop(hub_urls: String, source: TlsSource, inputs: mpsc::Sender<Input>) {
    let mut backoff = Backoff::default();
    let mut failed_dials: u32 = 0;
    let mut next = 0usize;
    let mut hint: Option<Endpoint> = None;
    loop {
        // Built for each dial: a renewed certificate is used from the next connection on.
        let tls = source.current();
        let endpoints = match endpoints(&hub_urls, tls.as_ref()) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!("cannot dial the hub: {e:#}");
                tokio::time::sleep(MAX_BACKOFF).await;
                continue;
            }
        };
        let endpoint = match hint.take() {
            Some(e) => e,
            None => {
                let e = endpoints[next % endpoints.len()].clone();
                next = next.wrapping_add(1);
                e
            }
        };
        let url = endpoint.uri().to_string();
        match endpoint.connect().await {
            Ok(channel) => {
                failed_dials = 0;
                let (tx, rx) = mpsc::channel::<pb::SpokeMessage>(OUTBOUND_CHANNEL_CAPACITY);
                // The agent puts Register into `tx` first thing, before the
                // hub sees the stream.
                if inputs.send(Input::Connected(tx)).await.is_err() {
                    return;
                }
                let mut client = SpokeServiceClient::new(channel);
                match client.session(ReceiverStream::new(rx)).await {
                    Ok(response) => {
                        let mut stream = response.into_inner();
                        loop {
                            match stream.message().await {
                                Ok(Some(msg)) => {
                                    if matches!(msg.msg, Some(pb::hub_message::Msg::Registered(_)))
                                    {
                                        backoff.reset();
                                    }
                                    if inputs.send(Input::Hub(Box::new(msg))).await.is_err() {
                                        return;
                                    }
                                }
                                Ok(None) => {
                                    tracing::warn!(hub = %url, "hub ended the session");
                                    break;
                                }
                                Err(status) => {
                                    tracing::warn!(hub = %url, error = %chain(&status), "hub session failed");
                                    break;
                                }
                            }
                        }
                    }
                    Err(status) => {
                        hint = leader_hint(&status, tls.as_ref());
                        match &hint {
                            Some(leader) => {
                                tracing::info!(hub = %url, leader = %leader.uri(), "hub replica does not lead; dialing the leader")
                            }
                            None => {
                                tracing::warn!(hub = %url, error = %status, "hub refused the session")
                            }
                        }
                    }
                }
                if inputs.send(Input::Disconnected).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                failed_dials = failed_dials.saturating_add(1);
                if failed_dials == 1 || failed_dials.is_multiple_of(WARN_EVERY_FAILED_DIALS) {
                    tracing::warn!(hub = %url, error = %chain(&e), failed_dials, "cannot reach the hub; retrying");
                } else {
                    tracing::debug!(hub = %url, error = %chain(&e), failed_dials, "cannot reach the hub; retrying");
                }
            }
        }
        if hint.is_some() {
            // A follower named the leader: go there soon, not after a backoff.
            tokio::time::sleep(leader_redial_delay()).await;
        } else {
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_with_jitter_and_resets() {
        let base = [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000];
        let mut b = Backoff::default();
        let delays: Vec<u128> = (0..9).map(|_| b.next_delay().as_millis()).collect();
        for (d, lo) in delays.iter().zip(base) {
            assert!((lo..2 * lo).contains(d), "{delays:?}");
        }
        // Two spokes do not wait alike (jitter), almost surely.
        let other: Vec<u128> = {
            let mut c = Backoff::default();
            (0..9).map(|_| c.next_delay().as_millis()).collect()
        };
        assert_ne!(delays, other, "no jitter");
        b.reset();
        assert!(b.next_delay() < INITIAL_BACKOFF * 2);
        let d = leader_redial_delay();
        assert!(
            d >= LEADER_REDIAL_SPREAD / 2 && d < LEADER_REDIAL_SPREAD * 2,
            "{d:?}"
        );
    }

    #[test]
    fn endpoint_rejects_bad_urls_clearly() {
        assert!(endpoint("http://127.0.0.1:7071", None).is_ok());
        let err = endpoint("not a url", None).expect_err("bad");
        assert!(format!("{err:#}").contains("invalid hub URL"), "{err:#}");
        let err = endpoint("https://hub:7071", None).expect_err("tls without a CA");
        assert!(err.to_string().contains("--ca-file"), "{err}");
        assert!(endpoint("https://hub:7071", client_tls(Some(b"")).as_ref()).is_ok());
    }
}
