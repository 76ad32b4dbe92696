//! `axle-hub --dev`: the hub on one machine with nothing to set up — the
//! embedded example policy (unless `--policy`) and a temporary data dir
//! (unless `--data-dir`). The whole dev stack, with two local spokes, is
//! `axle-dev` (the `dev/` crate); the hub itself never runs a spoke.

use std::path::PathBuf;

use anyhow::Context;
use axle_policy::Policy;

/// The example policy, for `--dev` without `--policy`.
pub fn example_policy() -> anyhow::Result<Policy> {
    axle_policy::example::example_policy()
        .map(|l| l.policy)
        .map_err(|f| anyhow::anyhow!("{f}"))
}

pub fn temp_data_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("axle-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}
