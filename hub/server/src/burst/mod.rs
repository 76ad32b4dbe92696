//! Cloud burst in the hub: the pure parts the burst controller drives.
//!
//! - `lifecycle.rs` — one burst instance's states and its one `step` function;
//! - `ledger.rs` — budgets: reservations before a launch, settlements after,
//!   per team and UTC month, in exact money;
//! - `offers.rs` — the cheapest offer that fits a workload and its data residency.

pub mod ledger;
pub mod lifecycle;
pub mod offers;
