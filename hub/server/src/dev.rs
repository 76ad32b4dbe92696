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

pub fn temp_data_dir() -> anyhow::Result<TempDataDir> {
    let dir = std::env::temp_dir().join(format!("axle-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(TempDataDir(dir))
}

/// A temporary data dir, removed with everything in it when dropped (the
/// dev stack stopped by Ctrl-C or SIGTERM): `/tmp/axle-dev-*` once piled up
/// one per run.
#[derive(Debug)]
pub struct TempDataDir(PathBuf);

impl TempDataDir {
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDataDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("warning: cannot remove {}: {e}", self.0.display());
        }
    }
}

/// The dev stack's rate limits: one person on one machine, whose README
/// tour includes `axle bench submit … --rate 300` (submits plus the
/// bench's polling) — far above the shared hub's per-user defaults, still
/// bounded so a runaway loop cannot wedge the laptop.
pub const DEV_RATE_LIMITS: crate::rate::RateLimits = crate::rate::RateLimits {
    per_user_per_s: 5_000,
    per_user_burst: 10_000,
    max_in_flight: crate::rate::DEFAULT_MAX_IN_FLIGHT,
};
