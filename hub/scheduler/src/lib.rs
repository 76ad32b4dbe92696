//! Axle's pure scheduling core: quotas, fair share, placement, preemption,
//! burst wishes and pending reasons. The trace simulator (`axle-sim`) drives
//! the same code offline.
//!
//! Architecture invariant: this crate does no I/O and reads no clock. A cycle
//! is a deterministic function of (`State`, `now_ms`, `CycleOptions`); the hub,
//! the simulator and the benchmarks all call [`cycle`].

mod catalog;
pub mod cycle;
pub mod error;
pub mod inventory;
pub mod runtime;
pub mod state;
#[cfg(test)]
mod testkit;
pub mod types;
pub mod validate;

pub use cycle::{CycleOptions, cycle, estimate_start};
pub use error::RequestError;
pub use runtime::{RuntimeEstimate, RuntimeStats, name_prefix};
pub use state::{ClassUsage, RunningWorkload, State, TeamUsage};
pub use types::*;
