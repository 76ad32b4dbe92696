//! The stored record of one burst instance: its lifecycle state, the offer
//! it was launched on and the money reserved for it. The ledger is the set
//! of these records' reservations, so a reservation and the instance it pays
//! for are written in one commit, before any provider call.

use axle_policy::Usd;
use serde::{Deserialize, Serialize};

use super::ledger::{Month, Reservation};
use super::lifecycle::BurstState;

/// Burst instances, by burst id.
pub const BURSTS: &str = "bursts/";

pub fn burst_key(id: &str) -> String {
    format!("{BURSTS}{id}")
}

/// The cluster a burst instance joins as: `burst-<provider>-<id>`.
pub fn cluster_name(provider: &str, id: &str) -> String {
    format!("burst-{provider}-{id}")
}

/// What the instance was launched on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferRecord {
    pub instance_type: String,
    pub region: String,
    pub gpu_model: String,
    pub gpus: u32,
    pub gpu_memory_mb: u64,
    pub price_per_hour: Usd,
    pub spot: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BurstRecord {
    pub v: u32,
    pub id: String,
    pub team: String,
    /// The BurstProvider document's name.
    pub provider: String,
    /// The adapter kind (`aws`, `runpod`, `lambda`).
    pub kind: String,
    /// The workload it was launched for (any of the team's work may run there).
    pub workload: u64,
    pub cluster: String,
    pub state: BurstState,
    pub offer: OfferRecord,
    pub month: Month,
    /// Money held for it; grows when a long run extends it.
    pub reserved: Usd,
    /// What it cost, once terminated.
    pub settled: Option<Usd>,
    pub created_at_ms: u64,
    /// When the launch was first sent: billing is counted from here.
    pub launched_at_ms: Option<u64>,
    pub joined_at_ms: Option<u64>,
    /// When the hub learnt the instance's id: a listing asked for before
    /// then may not show it yet.
    #[serde(default)]
    pub instance_seen_ms: Option<u64>,
    /// Since when nothing runs there.
    pub idle_since_ms: Option<u64>,
    /// When the provider takes the instance back, by its notice (EC2's
    /// two-minute spot interruption notice); `None`: no notice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interruption_at_ms: Option<u64>,
    pub ended_at_ms: Option<u64>,
    /// Launch attempts made (retries of the same launch, same key).
    pub attempts: u32,
    /// Not before this time is the launch tried again.
    pub retry_at_ms: u64,
    /// Why it is terminating or failed, for people.
    pub note: String,
}

impl BurstRecord {
    pub fn reservation(&self) -> Reservation {
        Reservation {
            id: self.id.clone(),
            team: self.team.clone(),
            provider: self.provider.clone(),
            month: self.month,
            reserved: self.reserved,
            settled: self.settled,
        }
    }

    /// What it has cost up to `now` (from its launch, rounded up to the second).
    pub fn cost_until(&self, now: u64) -> Usd {
        match self.launched_at_ms {
            Some(at) => {
                let end = self.ended_at_ms.unwrap_or(now).max(at);
                let seconds = (end - at).div_ceil(1000);
                self.offer.price_per_hour.per_hour_for_seconds(seconds)
            }
            None => Usd::ZERO,
        }
    }

    /// Whether it is live (not terminated and not failed).
    pub fn is_live(&self) -> bool {
        !self.state.is_final()
    }
}
