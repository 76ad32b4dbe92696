//! How much one user, one source and everyone together may ask of the hub:
//! a token bucket per user (a call beyond it gets 429 with `Retry-After`),
//! a bound on one user's calls in flight (their share of the global bound,
//! taken before the body is read, so a user sending bodies slowly holds
//! only their own slots), a bound on user calls in flight at once over all
//! users (beyond it, 503 with `Retry-After`), and a bucket of failed
//! authentications per source address (beyond it, 429 before the token is
//! even looked at). One script in a loop cannot starve everyone else, and a
//! crowd cannot make the hub hold unbounded work.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::hub::HubError;

/// Calls per second one user may make on average by default: a person
/// clicking, a CLI watching or a CI job polling stay far below it.
pub const DEFAULT_PER_USER_PER_S: u32 = 50;

/// Calls one user may make at once above the average (the bucket's size).
pub const DEFAULT_PER_USER_BURST: u32 = 200;

/// User calls in flight at once, over all users, by default: what two
/// cores serve without queueing for long.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// Users whose buckets are kept; the fullest (idle longest) go first when
/// there are more, which forgets nothing that matters (a full bucket is what
/// a new one would be). Also the most sources whose failures are counted.
pub const MAX_TRACKED_USERS: usize = 100_000;

/// One user may hold this fraction of the calls in flight (1/16: 64 of the
/// default 1,024), so one user cannot take every slot, and sixteen busy
/// users still leave nothing idle.
pub const USER_SHARE_OF_IN_FLIGHT: usize = 16;

/// Failed authentications per second one source address may make on
/// average: a person mistyping a token fails a few times; a script trying
/// tokens gets 429 instead of an answer per guess.
pub const FAILED_AUTH_PER_SOURCE_PER_S: u32 = 10;

/// Failed authentications one source may make at once above the average.
pub const FAILED_AUTH_PER_SOURCE_BURST: u32 = 100;

/// The limits, from the hub's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimits {
    pub per_user_per_s: u32,
    pub per_user_burst: u32,
    pub max_in_flight: usize,
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits {
            per_user_per_s: DEFAULT_PER_USER_PER_S,
            per_user_burst: DEFAULT_PER_USER_BURST,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

/// One user's bucket: tokens in thousandths, and when it was last filled.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    milli: u64,
    at_ms: u64,
}

/// Token buckets by key (users, or source addresses), bounded in number.
#[derive(Default)]
struct Buckets(Mutex<HashMap<String, Bucket>>);

impl Buckets {
    /// Refills `key`'s bucket (`rate` a second, at most `burst`) to `now_ms`
    /// and takes one token if `take`; `Err(ms)` is how long until one is there.
    fn take(&self, key: &str, rate: u32, burst: u32, now_ms: u64, take: bool) -> Result<(), u64> {
        let rate = u64::from(rate.max(1));
        let size = u64::from(burst.max(1)) * 1000;
        let mut buckets = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_TRACKED_USERS && !buckets.contains_key(key) {
            // Forget the buckets that would be full by now anyway.
            buckets.retain(|_, b| {
                b.milli + now_ms.saturating_sub(b.at_ms).saturating_mul(rate) < size
            });
            if buckets.len() >= MAX_TRACKED_USERS {
                buckets.clear();
            }
        }
        let b = buckets.entry(key.to_string()).or_insert(Bucket {
            milli: size,
            at_ms: now_ms,
        });
        // `rate` tokens a second is `rate` thousandths a millisecond.
        let refill = now_ms.saturating_sub(b.at_ms).saturating_mul(rate);
        b.milli = (b.milli + refill).min(size);
        b.at_ms = b.at_ms.max(now_ms);
        if b.milli >= 1000 {
            if take {
                b.milli -= 1000;
            }
            return Ok(());
        }
        if take {
            b.milli = 0;
        }
        Err((1000 - b.milli).div_ceil(rate))
    }
}

/// Refusals of one kind are logged at most this often, with their count.
const REFUSAL_LOG_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// Counts refusals by kind and logs who was refused and why, at most once
/// per [`REFUSAL_LOG_PERIOD`] per kind (a flood of refusals must not become
/// a flood of log lines). Also the gRPC listener's (`grpc_serve.rs`).
#[derive(Default)]
pub(crate) struct Refusals(Mutex<HashMap<&'static str, (std::time::Instant, u64)>>);

impl Refusals {
    pub(crate) fn note(&self, kind: &'static str, who: &str, why: &str) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        let e = m.entry(kind).or_insert((now - REFUSAL_LOG_PERIOD, 0));
        e.1 += 1;
        if now.duration_since(e.0) >= REFUSAL_LOG_PERIOD {
            tracing::warn!(
                "refused {} ({kind}) in the last {} s; latest {who}: {why}",
                e.1,
                REFUSAL_LOG_PERIOD.as_secs()
            );
            *e = (now, 0);
        }
    }
}

/// The buckets and the in-flight bounds of one hub.
pub struct Limiter {
    refusals: Refusals,
    limits: RateLimits,
    users: Buckets,
    failures: Buckets,
    in_flight: tokio::sync::Semaphore,
    /// Calls in flight per user (only users with one are kept).
    per_user: Arc<Mutex<HashMap<String, usize>>>,
}

/// A user's call in flight, counted against their share; dropping it ends
/// the call.
pub struct UserSlot {
    user: Option<String>,
    per_user: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for UserSlot {
    fn drop(&mut self) {
        let Some(user) = self.user.take() else {
            return;
        };
        let mut m = self.per_user.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&user) {
            *n -= 1;
            if *n == 0 {
                m.remove(&user);
            }
        }
    }
}

/// A call in flight, counted against the global bound; dropping it ends it.
pub struct Admitted<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
}

/// A user call admitted whole: the user's slot and a global one.
pub struct Call<'a> {
    _user: UserSlot,
    _call: Admitted<'a>,
}

fn retry_s(wait_ms: u64) -> u64 {
    wait_ms.div_ceil(1000).max(1)
}

impl Limiter {
    pub fn new(limits: RateLimits) -> Limiter {
        Limiter {
            refusals: Refusals::default(),
            limits,
            users: Buckets::default(),
            failures: Buckets::default(),
            in_flight: tokio::sync::Semaphore::new(limits.max_in_flight.max(1)),
            per_user: Arc::default(),
        }
    }

    /// Calls in flight one user may hold: their share of the global bound.
    pub fn per_user_in_flight(&self) -> usize {
        (self.limits.max_in_flight / USER_SHARE_OF_IN_FLIGHT).max(1)
    }

    /// Admits one call of `who` at `now_ms` whole (its user's bucket and
    /// share, and a global slot), or says when to come back.
    pub fn admit(&self, who: &crate::auth::Identity, now_ms: u64) -> Result<Call<'_>, HubError> {
        let user = self.admit_user(who, now_ms)?;
        let call = self.admit_call()?;
        Ok(Call {
            _user: user,
            _call: call,
        })
    }

    /// Takes a token from `who`'s bucket and a slot of their share of the
    /// calls in flight. Without authentication every caller is the same
    /// anonymous user, so only the global bound applies then (a user
    /// merely named `anonymous` is limited like everyone else).
    pub fn admit_user(
        &self,
        who: &crate::auth::Identity,
        now_ms: u64,
    ) -> Result<UserSlot, HubError> {
        let slot = |user| UserSlot {
            user,
            per_user: self.per_user.clone(),
        };
        if who.no_auth {
            return Ok(slot(None));
        }
        let (rate, burst) = (self.limits.per_user_per_s, self.limits.per_user_burst);
        if let Err(wait_ms) = self.users.take(&who.user, rate, burst, now_ms, true) {
            self.refusals.note(
                "calls: user rate",
                &who.user,
                "more calls than its bucket holds",
            );
            return Err(HubError::RateLimited {
                message: format!(
                    "{} made more than {burst} calls in a burst (at most {} a second on \
                     average); retry in {} s",
                    who.user,
                    rate.max(1),
                    retry_s(wait_ms)
                ),
                retry_after_s: retry_s(wait_ms),
            });
        }
        let most = self.per_user_in_flight();
        let mut m = self.per_user.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(who.user.clone()).or_insert(0);
        if *n >= most {
            self.refusals.note(
                "calls: user share in flight",
                &who.user,
                "holds its share of calls in flight",
            );
            return Err(HubError::TooBusy {
                message: format!(
                    "{} has {most} calls in flight, their share of the hub's {} (1/{USER_SHARE_OF_IN_FLIGHT}); \
                     retry once one ends",
                    who.user, self.limits.max_in_flight
                ),
                retry_after_s: 1,
            });
        }
        *n += 1;
        drop(m);
        Ok(slot(Some(who.user.clone())))
    }

    /// A slot of the global bound on calls in flight.
    pub fn admit_call(&self) -> Result<Admitted<'_>, HubError> {
        let permit = self.in_flight.try_acquire().map_err(|_| {
            self.refusals.note(
                "calls: in flight",
                "a caller",
                "the hub is at --max-calls-in-flight",
            );
            HubError::TooBusy {
                message: format!(
                    "the hub is serving {} calls at once, its limit; retry shortly",
                    self.limits.max_in_flight
                ),
                retry_after_s: 1,
            }
        })?;
        Ok(Admitted { _permit: permit })
    }

    /// Refuses a source whose failed authentications used up its bucket,
    /// before its credentials are looked at.
    pub fn check_source(&self, source: Option<IpAddr>, now_ms: u64) -> Result<(), HubError> {
        let Some(ip) = source else { return Ok(()) };
        self.failures
            .take(
                &ip.to_string(),
                FAILED_AUTH_PER_SOURCE_PER_S,
                FAILED_AUTH_PER_SOURCE_BURST,
                now_ms,
                false,
            )
            .map_err(|wait_ms| {
                self.refusals
                    .note("calls: failed authentication", &ip.to_string(), "too many failed tokens");
                HubError::RateLimited {
                message: format!(
                    "{ip} failed to authenticate more than {FAILED_AUTH_PER_SOURCE_BURST} times \
                     (at most {FAILED_AUTH_PER_SOURCE_PER_S} a second on average); retry in {} s \
                     with a valid token",
                    retry_s(wait_ms)
                ),
                retry_after_s: retry_s(wait_ms),
            }
            })
    }

    /// Counts one failed authentication of `source`.
    pub fn failed(&self, source: Option<IpAddr>, now_ms: u64) {
        if let Some(ip) = source {
            let _ = self.failures.take(
                &ip.to_string(),
                FAILED_AUTH_PER_SOURCE_PER_S,
                FAILED_AUTH_PER_SOURCE_BURST,
                now_ms,
                true,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(per_s: u32, burst: u32, in_flight: usize) -> Limiter {
        Limiter::new(RateLimits {
            per_user_per_s: per_s,
            per_user_burst: burst,
            max_in_flight: in_flight,
        })
    }

    #[test]
    fn a_user_gets_the_burst_then_the_rate_and_others_are_unaffected() {
        let l = limiter(2, 3, 100);
        for _ in 0..3 {
            assert!(l.admit(&user("bob"), 0).is_ok());
        }
        match l.admit(&user("bob"), 0) {
            Err(HubError::RateLimited { retry_after_s, .. }) => assert_eq!(retry_after_s, 1),
            other => panic!("{:?}", other.err()),
        }
        assert!(
            l.admit(&user("alice"), 0).is_ok(),
            "another user has a bucket of their own"
        );
        // Two a second: half a second later, one more.
        assert!(l.admit(&user("bob"), 500).is_ok());
        assert!(l.admit(&user("bob"), 500).is_err());
        assert!(l.admit(&user("bob"), 10_000).is_ok());
    }

    #[test]
    fn calls_in_flight_are_bounded_and_given_back() {
        let l = limiter(1000, 1000, 2);
        let a = l.admit(&user("a"), 0).unwrap();
        let _b = l.admit(&user("b"), 0).unwrap();
        assert!(matches!(
            l.admit(&user("c"), 0),
            Err(HubError::TooBusy { .. })
        ));
        drop(a);
        assert!(l.admit(&user("c"), 0).is_ok());
    }

    #[test]
    fn one_user_holds_at_most_their_share_of_the_calls_in_flight() {
        // Observed: 1,024 slow bodies of one user (in no team) gave every
        // other user "503 the hub is serving 1024 calls at once".
        let l = limiter(100_000, 100_000, 1024);
        let held: Vec<UserSlot> = (0..64)
            .map(|_| l.admit_user(&user("mallory"), 0).unwrap())
            .collect();
        match l.admit_user(&user("mallory"), 0) {
            Err(HubError::TooBusy { message, .. }) => {
                assert!(message.contains("64 calls in flight"), "{message}")
            }
            other => panic!("{:?}", other.err()),
        }
        assert!(l.admit(&user("alice"), 0).is_ok(), "others are served");
        drop(held);
        assert!(l.admit_user(&user("mallory"), 0).is_ok());
        assert!(l.per_user.lock().unwrap().is_empty() || l.per_user.lock().unwrap().len() <= 1);
    }

    #[test]
    fn a_source_that_keeps_failing_to_authenticate_gets_429() {
        // Observed: 13,268 wrong-token requests in 10 s got 401 each.
        let l = limiter(50, 200, 1024);
        let mallory: Option<IpAddr> = Some("10.0.0.9".parse().unwrap());
        let alice: Option<IpAddr> = Some("10.0.0.1".parse().unwrap());
        for _ in 0..FAILED_AUTH_PER_SOURCE_BURST {
            assert!(l.check_source(mallory, 0).is_ok());
            l.failed(mallory, 0);
        }
        assert!(matches!(
            l.check_source(mallory, 0),
            Err(HubError::RateLimited { .. })
        ));
        assert!(l.check_source(alice, 0).is_ok(), "other sources are served");
        assert!(l.check_source(mallory, 1_000).is_ok(), "it refills");
    }

    #[test]
    fn a_user_named_anonymous_is_limited_like_any_other() {
        // Observed: `anonymous` was exempt in token mode too.
        let l = limiter(1, 1, 100);
        assert!(l.admit(&user("anonymous"), 0).is_ok());
        assert!(matches!(
            l.admit(&user("anonymous"), 0),
            Err(HubError::RateLimited { .. })
        ));
        let open = crate::auth::Identity::anonymous();
        for _ in 0..10 {
            assert!(l.admit(&open, 0).is_ok(), "--auth none has no buckets");
        }
    }

    fn user(name: &str) -> crate::auth::Identity {
        crate::auth::Identity {
            user: name.to_string(),
            via: "token t".to_string(),
            groups: Vec::new(),
            no_auth: false,
        }
    }
}
