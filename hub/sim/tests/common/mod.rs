//! What the trace tests share: paths in the repository, the gzipped full
//! traces, and the policies they replay under.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use axle_policy::Policy;

/// A path relative to the repository root.
pub fn repo(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}

/// A file of `hub/sim/testdata/traces/full/`, gunzipped.
pub fn gunzip(name: &str) -> String {
    let path = repo(&format!("hub/sim/testdata/traces/full/{name}"));
    let file = std::fs::File::open(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut text = String::new();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text
}

/// The policy repository at `dir` (relative to the repository root).
pub fn policy(dir: &str) -> Policy {
    match axle_policy::load_dir(&repo(dir)) {
        Ok(l) => l.policy,
        Err(e) => panic!("{dir}: {e}"),
    }
}
