//! The hub's clock, injected: wall-clock milliseconds counted on tokio's
//! clock from a wall-clock reading taken once. In tests with a paused tokio
//! clock (`start_paused`, `tokio::time::advance`), hub time moves only when
//! the test moves it, so spoke-loss and grace-period behaviour is tested
//! without waiting real seconds.

use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Wall-clock milliseconds at `origin`.
    wall_ms_at_origin: u64,
    origin: Instant,
}

impl Clock {
    /// Reads the system's wall clock once; later readings add tokio's
    /// monotonic time (so a wall-clock step never moves hub time backwards).
    pub fn system() -> Clock {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Clock::starting_at(wall)
    }

    /// A clock that reads `wall_ms` now (tests pick round numbers).
    pub fn starting_at(wall_ms: u64) -> Clock {
        Clock {
            wall_ms_at_origin: wall_ms,
            origin: Instant::now(),
        }
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.wall_ms_at_origin
            .saturating_add(self.origin.elapsed().as_millis() as u64)
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::system()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn hub_time_moves_with_tokio_time() {
        let c = Clock::starting_at(1_000_000);
        assert_eq!(c.now_ms(), 1_000_000);
        tokio::time::advance(std::time::Duration::from_secs(90)).await;
        assert_eq!(c.now_ms(), 1_090_000);
    }
}
