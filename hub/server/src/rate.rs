//! How much one user, and everyone together, may ask of the hub: a token
//! bucket per user (a call beyond it gets 429 with `Retry-After`), and a
//! bound on user calls in flight at once (beyond it, 503 with `Retry-After`),
//! so one script in a loop cannot starve everyone else, and a crowd cannot
//! make the hub hold unbounded work.

use std::collections::HashMap;
use std::sync::Mutex;

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
/// a new one would be).
pub const MAX_TRACKED_USERS: usize = 100_000;

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

/// The buckets and the in-flight bound of one hub.
pub struct Limiter {
    limits: RateLimits,
    buckets: Mutex<HashMap<String, Bucket>>,
    in_flight: tokio::sync::Semaphore,
}

/// A user call in flight; dropping it ends the call.
pub struct Admitted<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Limiter {
    pub fn new(limits: RateLimits) -> Limiter {
        Limiter {
            limits,
            buckets: Mutex::default(),
            in_flight: tokio::sync::Semaphore::new(limits.max_in_flight.max(1)),
        }
    }

    /// Admits one call of `who` at `now_ms`, or says when to come back.
    /// Without authentication every caller is the same anonymous user, so
    /// only the bound on calls in flight applies then (a user merely named
    /// `anonymous` has a bucket like everyone else).
    pub fn admit(
        &self,
        who: &crate::auth::Identity,
        now_ms: u64,
    ) -> Result<Admitted<'_>, HubError> {
        if !who.no_auth {
            self.take(&who.user, now_ms)?;
        }
        let permit = self
            .in_flight
            .try_acquire()
            .map_err(|_| HubError::TooBusy {
                message: format!(
                    "the hub is serving {} calls at once, its limit; retry shortly",
                    self.limits.max_in_flight
                ),
                retry_after_s: 1,
            })?;
        Ok(Admitted { _permit: permit })
    }

    /// Takes one token from `user`'s bucket.
    fn take(&self, user: &str, now_ms: u64) -> Result<(), HubError> {
        let rate = u64::from(self.limits.per_user_per_s.max(1));
        let size = u64::from(self.limits.per_user_burst.max(1)) * 1000;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_TRACKED_USERS && !buckets.contains_key(user) {
            // Forget the buckets that would be full by now anyway.
            buckets.retain(|_, b| {
                b.milli + now_ms.saturating_sub(b.at_ms).saturating_mul(rate) < size
            });
            if buckets.len() >= MAX_TRACKED_USERS {
                buckets.clear();
            }
        }
        let b = buckets.entry(user.to_string()).or_insert(Bucket {
            milli: size,
            at_ms: now_ms,
        });
        // `rate` tokens a second is `rate` thousandths a millisecond.
        let refill = now_ms.saturating_sub(b.at_ms).saturating_mul(rate);
        b.milli = (b.milli + refill).min(size);
        b.at_ms = b.at_ms.max(now_ms);
        if b.milli >= 1000 {
            b.milli -= 1000;
            return Ok(());
        }
        let wait_ms = (1000 - b.milli).div_ceil(rate);
        Err(HubError::RateLimited {
            message: format!(
                "{user} made more than {} calls in a burst (at most {rate} a second on average); \
                 retry in {} s",
                self.limits.per_user_burst,
                wait_ms.div_ceil(1000)
            ),
            retry_after_s: wait_ms.div_ceil(1000).max(1),
        })
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
