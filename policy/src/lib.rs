//! Axle governance policy: YAML documents (`Team`, `PriorityClass`, `Cluster`,
//! `BurstProvider`, `Settings`) loaded from a directory tree with precise
//! `file:line:column` diagnostics, validated into the [`Policy`] model.
//!
//! Entry points: [`load_dir`], [`load_sources`], [`json_schema`], and
//! [`example::example_policy`].

pub mod diag;
mod document;
pub mod example;
pub mod file;
mod load;
pub mod model;
pub mod money;
mod report;
mod revision;
mod schema;
pub mod text;
mod validate;
mod walk;

pub use diag::{Diagnostic, Severity, count_summary};
pub use load::{LoadFailure, Loaded, load_dir, load_sources};
pub use model::*;
pub use money::Usd;
pub use schema::json_schema;
