//! Axle's trace simulator: parses GPU job traces (Philly, Alibaba openb,
//! plain CSV) and replays them through the same scheduling core the hub runs,
//! on a simulated clock, beside today's alternatives as baselines.
//!
//! The crate is pure like the core: callers hand in file contents and get
//! reports back; nothing here reads files, clocks or randomness.

mod baseline;
pub mod fill;
mod guarantee;
pub mod matrix;
mod replay;
mod report;
pub mod setup;
mod textbook;
pub mod trace;

pub use baseline::{Mode, complete_policy, static_policy};
pub use replay::{Progress, SimJob, simulate};
pub use report::{ClassReport, DelayStats, EstimateReport, SimReport, TeamReport};
