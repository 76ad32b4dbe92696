//! Which failed etcd calls [`EtcdStore`](super::EtcdStore) sends again, and how often: only
//! those that surely changed nothing, and the leader's fenced writes, which are idempotent.

use std::time::Duration;

/// How often one etcd call is tried again when it failed without reaching a member's state
/// machine (see [`never_applied`]), and the pause between tries: together about 3 s, enough
/// for the client to move off a dead member and for etcd to elect a new leader (one
/// election timeout, 1 s by default).
const UNSENT_RETRIES: u32 = 60;
const UNSENT_PAUSE: Duration = Duration::from_millis(50);

/// Whether a failed call surely changed nothing: it never left this process (the chosen
/// member's connection could not be made) or etcd refused it before proposing it (no
/// leader, or the leader changed). Only these are retried; anything that may have been
/// applied is reported.
pub(super) fn never_applied(e: &etcd_client::Error) -> bool {
    let text = e.to_string();
    [
        "tcp connect error",
        "Connection refused",
        "etcdserver: no leader",
        "etcdserver: leader changed",
    ]
    .iter()
    .any(|m| text.contains(m))
}

/// Runs `call` until it succeeds, fails in a way that may have changed something, or
/// [`UNSENT_RETRIES`] are used up. etcd-client balances calls over every endpoint, a dead
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
    never_applied(e) || e.to_string().contains("etcdserver: request timed out")
}

pub(super) async fn retry_while<T, F, Fut>(
    retryable: fn(&etcd_client::Error) -> bool,
    mut call: F,
) -> Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let mut left = UNSENT_RETRIES;
    loop {
        match call().await {
            Err(e) if left > 0 && retryable(&e) => {
                left -= 1;
                tokio::time::sleep(UNSENT_PAUSE).await;
            }
            r => return r,
        }
    }
}
