//! The lease that keeps a workload's processes running only while the hub
//! confirms this spoke. The agent confirms it at every `Registered` and
//! `HeartbeatAck`; each running replica's shim must hear a renewal (a byte
//! on its stdin) within its [`Lease::ttl`], and the supervisor renews only
//! while the last confirmation is recent enough that the shim's deadline
//! falls at most [`LEASE_AFTER_FENCE`] after the agent's own self-fence
//! (`fence_after` after the last confirmation). So a live agent cut off
//! from the hub stops its workloads itself (they are re-queued), and when
//! the agent hangs (SIGSTOP, a stuck runtime) the shims stop them a moment
//! later — before the hub, which re-queues a lost spoke's work only
//! `spokeLostAfterSeconds` + grace + a margin of two heartbeats after its
//! last heartbeat, runs them elsewhere.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// How long a shim waits for a renewal at most: short next to any
/// `spokeLostAfterSeconds` (a few heartbeats), long enough that a busy
/// machine's scheduling hiccup does not stop a workload.
pub const LEASE_TTL: Duration = Duration::from_secs(2);

/// How often the supervisor renews: a quarter of the TTL, so three renewals
/// can go missing before a shim acts.
pub const LEASE_RENEW_EVERY: Duration = Duration::from_millis(500);

/// A shim's deadline falls this long after the agent's own self-fence, so a
/// live agent always stops its workloads first (reported `Stopped`, and
/// re-queued), and the shims act only for an agent that cannot. Below the
/// hub's margin (`FENCE_MARGIN_MS`, two heartbeats) before it re-queues.
pub const LEASE_AFTER_FENCE: Duration = Duration::from_secs(1);

/// Shared between the agent (which confirms) and the supervisors (which renew).
#[derive(Debug)]
pub struct Lease {
    origin: Instant,
    /// Milliseconds after `origin` of the last confirmation.
    confirmed_ms: AtomicU64,
    /// The hub's `fence_after_ms` (0: no fencing, so no lease).
    fence_after_ms: AtomicU64,
}

impl Default for Lease {
    fn default() -> Self {
        Lease {
            origin: Instant::now(),
            confirmed_ms: AtomicU64::new(0),
            fence_after_ms: AtomicU64::new(0),
        }
    }
}

impl Lease {
    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// The hub heard us (`Registered`, `HeartbeatAck`).
    pub fn confirm(&self) {
        self.confirmed_ms.store(self.now_ms(), Ordering::SeqCst);
    }

    /// The hub's self-fencing time (`Registered.fence_after_ms`).
    pub fn set_fence_after(&self, d: Duration) {
        self.fence_after_ms
            .store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// How long a shim started now may go without a renewal; `None` when
    /// the hub does not fence (no lease).
    pub fn ttl(&self) -> Option<Duration> {
        match self.fence_after_ms.load(Ordering::SeqCst) {
            0 => None,
            fence => Some(
                LEASE_TTL.min(Duration::from_millis(fence / 2).max(Duration::from_millis(100))),
            ),
        }
    }

    /// Whether a renewal may go out now: the last confirmation is recent
    /// enough that a shim's deadline (now + TTL) falls at most
    /// [`LEASE_AFTER_FENCE`] after the self-fence (`fence_after` after it).
    pub fn renewable(&self) -> bool {
        let fence = self.fence_after_ms.load(Ordering::SeqCst);
        let Some(ttl) = self.ttl() else { return true };
        let since = self
            .now_ms()
            .saturating_sub(self.confirmed_ms.load(Ordering::SeqCst));
        since + (ttl.as_millis() as u64) < fence + LEASE_AFTER_FENCE.as_millis() as u64
    }
}

impl Lease {
    /// How long from now a run may last without another confirmation: the
    /// self-fence plus [`LEASE_AFTER_FENCE`], less the time since the last
    /// one (`None` when the hub does not fence). A Kubernetes Job's
    /// `activeDeadlineSeconds` is kept within it.
    pub fn expires_in(&self) -> Option<Duration> {
        let fence = self.fence_after_ms.load(Ordering::SeqCst);
        if fence == 0 {
            return None;
        }
        let since = self
            .now_ms()
            .saturating_sub(self.confirmed_ms.load(Ordering::SeqCst));
        Some(Duration::from_millis(
            (fence + LEASE_AFTER_FENCE.as_millis() as u64).saturating_sub(since),
        ))
    }

    /// The hub's self-fencing time (zero: none).
    pub fn fence_after(&self) -> Duration {
        Duration::from_millis(self.fence_after_ms.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn renewals_stop_so_that_the_shims_deadline_is_the_self_fence() {
        let l = Lease::default();
        assert!(l.ttl().is_none() && l.renewable(), "no fencing, no lease");
        l.set_fence_after(Duration::from_secs(3));
        l.confirm();
        assert_eq!(l.ttl(), Some(Duration::from_millis(1500)));
        assert!(l.renewable());
        tokio::time::advance(Duration::from_millis(2400)).await;
        assert!(l.renewable(), "2.4 s + 1.5 s < 3 s + 1 s");
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(
            !l.renewable(),
            "a renewal now would outlive the fence by more than 1 s"
        );
        l.confirm();
        assert!(l.renewable());
        assert_eq!(l.expires_in(), Some(Duration::from_secs(4)));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(l.expires_in(), Some(Duration::ZERO));
        l.set_fence_after(Duration::from_secs(30));
        assert_eq!(l.ttl(), Some(LEASE_TTL));
    }
}
