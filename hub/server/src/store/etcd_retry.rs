//! Which failed etcd calls [`EtcdStore`](super::EtcdStore) sends again, and how often: only
//! those that surely changed nothing, and the leader's fenced writes, which are idempotent.

use std::time::Duration;

/// How long one etcd call is tried again when it failed without reaching a member's state
/// machine (see [`never_applied`]): about 3 s, enough for the client to move off a dead
/// member and for etcd to elect a new leader (one election timeout, 1 s by default). The
/// pauses start at 20 ms and double to 250 ms, each plus up to as much again at random
/// (backon), so the replicas of a hub that lost the same member do not retry in lockstep.
const RETRY_WINDOW: Duration = Duration::from_secs(3);
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// etcd's own errors for a proposal it refused before proposing it (its `rpctypes`:
/// `ErrNoLeader`, `ErrLeaderChanged`), and for one it may or may not have applied
/// (`ErrTimeout`); each is gRPC `UNAVAILABLE` with exactly this message.
const NO_LEADER: &str = "etcdserver: no leader";
const LEADER_CHANGED: &str = "etcdserver: leader changed";
const REQUEST_TIMED_OUT: &str = "etcdserver: request timed out";

/// Whether `e` (or an error it wraps) is a connection that could not be made: nothing
/// was sent.
fn connect_failed(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::HostUnreachable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::AddrNotAvailable
            )
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// etcd refused the call with `UNAVAILABLE` and one of `messages`.
fn unavailable_with(e: &etcd_client::Error, messages: &[&str]) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::Unavailable && messages.contains(&s.message()))
}

/// Whether a failed call surely changed nothing: it never left this process (the chosen
/// member's connection could not be made) or etcd refused it before proposing it (no
/// leader, or the leader changed). Only these are retried; anything that may have been
/// applied is reported. Decided by the error's kind and etcd's status code (it once
/// matched the error's text).
pub(super) fn never_applied(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(t) => connect_failed(t),
        etcd_client::Error::IoError(io) => connect_failed(io),
        etcd_client::Error::GRpcStatus(s) => {
            unavailable_with(e, &[NO_LEADER, LEADER_CHANGED]) || connect_failed(s)
        }
        _ => false,
    }
}

/// Runs `call` until it succeeds, fails in a way that may have changed something, or
/// [`RETRY_WINDOW`] has passed. etcd-client balances calls over every endpoint, a dead
/// member included, so without this a member's loss shows as failed calls.
pub(super) async fn unsent_retry<T, F, Fut>(call: F) -> Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    retry_while(never_applied, call).await
}

/// Whether a failed write of the leader may be sent again: it never applied, or etcd lost
/// its own leader while proposing it (it may or may not have been applied). The leader's
/// fenced txns are the applier's puts and deletes of whole values, written one batch at a
/// time by the only writer there is, and its resignation (a delete on the term's revision,
/// a no-op the second time), so applying one twice leaves what applying it once does.
pub(super) fn retry_fenced(e: &etcd_client::Error) -> bool {
    never_applied(e) || unavailable_with(e, &[REQUEST_TIMED_OUT])
}

pub(super) async fn retry_while<T, F, Fut>(
    retryable: fn(&etcd_client::Error) -> bool,
    call: F,
) -> Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    use backon::Retryable as _;
    let backoff = backon::ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(FIRST_PAUSE)
        .with_max_delay(MAX_PAUSE)
        .with_total_delay(Some(RETRY_WINDOW))
        .without_max_times();
    call.retry(backoff).when(retryable).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_chosen_by_kind_and_status_not_text() {
        let status = |m: &str| etcd_client::Error::GRpcStatus(tonic::Status::unavailable(m));
        assert!(never_applied(&status(NO_LEADER)));
        assert!(never_applied(&status(LEADER_CHANGED)));
        // May have been applied: only the leader's idempotent writes retry it.
        assert!(!never_applied(&status(REQUEST_TIMED_OUT)));
        assert!(retry_fenced(&status(REQUEST_TIMED_OUT)));
        // The same words under another code, or in a longer message, are not etcd's.
        let other = etcd_client::Error::GRpcStatus(tonic::Status::internal(NO_LEADER));
        assert!(!never_applied(&other));
        assert!(!never_applied(&status("Connection refused by policy")));
        // A connection that could not be made, however it is worded.
        let refused = etcd_client::Error::IoError(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        ));
        assert!(never_applied(&refused));
        let reset =
            etcd_client::Error::IoError(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(!never_applied(&reset), "it may have been sent");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_is_retried_within_its_window_then_reported() {
        let mut calls = 0u32;
        let r: Result<(), _> = unsent_retry(|| {
            calls += 1;
            async {
                Err(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
                    NO_LEADER,
                )))
            }
        })
        .await;
        assert!(r.is_err());
        assert!(
            (5..=200).contains(&calls),
            "{calls} tries in {RETRY_WINDOW:?}"
        );
    }
}
