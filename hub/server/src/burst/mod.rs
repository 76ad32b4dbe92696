//! Cloud burst in the hub: the pure parts the burst controller drives.
//!
//! - `lifecycle.rs` — one burst instance's states and its one `step` function;
//! - `ledger.rs` — budgets: reservations before a launch, settlements after,
//!   per team and UTC month, in exact money;
//! - `offers.rs` — the cheapest offer that fits a workload and its data residency;
//! - `record.rs` — the stored burst record (its state, offer and reservation);
//! - `setup.rs` — adapters from the policy and the environment, the boot script;
//! - `worker.rs` — provider calls off the applier, bounded, answers as commands.
//!
//! The reconciler that drives them is `crate::hub::burst` (it changes the
//! hub's state, so it runs on the applier).

pub mod ledger;
pub mod lifecycle;
pub mod offers;
pub mod record;
pub mod setup;
pub mod worker;
