//! The example policy repository (`deploy/examples/policy/`), embedded so
//! that the dev stack and tests work from any directory.

use crate::load::{LoadFailure, Loaded, load_sources};

/// The example policy repository, embedded so `--dev` works from any directory.
/// (`embedded_policy_matches_the_repository` keeps this list in step with
/// `deploy/examples/policy/`.)
pub const EXAMPLE_POLICY: &[(&str, &str)] = &[
    (
        "burst-providers.yaml",
        include_str!("../../deploy/examples/policy/burst-providers.yaml"),
    ),
    (
        "clusters/eu-1.yaml",
        include_str!("../../deploy/examples/policy/clusters/eu-1.yaml"),
    ),
    (
        "clusters/us-1.yaml",
        include_str!("../../deploy/examples/policy/clusters/us-1.yaml"),
    ),
    (
        "priority-classes.yaml",
        include_str!("../../deploy/examples/policy/priority-classes.yaml"),
    ),
    (
        "settings.yaml",
        include_str!("../../deploy/examples/policy/settings.yaml"),
    ),
    (
        "teams/nlp.yaml",
        include_str!("../../deploy/examples/policy/teams/nlp.yaml"),
    ),
    (
        "teams/recsys.yaml",
        include_str!("../../deploy/examples/policy/teams/recsys.yaml"),
    ),
    (
        "teams/research.yaml",
        include_str!("../../deploy/examples/policy/teams/research.yaml"),
    ),
    (
        "teams/vision.yaml",
        include_str!("../../deploy/examples/policy/teams/vision.yaml"),
    ),
];

/// The example policy, loaded.
pub fn example_policy() -> Result<Loaded, LoadFailure> {
    let sources: Vec<(String, String)> = EXAMPLE_POLICY
        .iter()
        .map(|(p, c)| (p.to_string(), c.to_string()))
        .collect();
    load_sources(&sources)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_policy_matches_the_repository() {
        let root =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/policy");
        let mut on_disk = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("example policy dir") {
                let p = e.expect("entry").path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "yaml") {
                    on_disk.push(
                        p.strip_prefix(&root)
                            .expect("under root")
                            .display()
                            .to_string(),
                    );
                }
            }
        }
        on_disk.sort();
        let embedded: Vec<String> = EXAMPLE_POLICY.iter().map(|(p, _)| p.to_string()).collect();
        assert_eq!(embedded, on_disk);
        for (p, c) in EXAMPLE_POLICY {
            assert_eq!(
                &std::fs::read_to_string(root.join(p)).expect("read"),
                c,
                "{p}"
            );
        }
        example_policy().expect("the example policy loads");
    }
}
