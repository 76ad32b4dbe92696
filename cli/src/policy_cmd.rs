//! `axle policy check|schema`: validate a policy repository like a compiler
//! would, or print the JSON Schema of a policy document for editors.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Validate every policy file under DIR; exit 1 on errors.
    Check {
        /// Root of the policy repository (all *.yaml / *.yml below it).
        dir: PathBuf,
    },
    /// Print the JSON Schema of a policy document (for yaml-language-server).
    Schema,
}

pub fn run(cmd: PolicyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCommand::Check { dir } => check(&dir),
        PolicyCommand::Schema => {
            let schema = axle_policy::json_schema();
            let text = serde_json::to_string_pretty(&schema).context("rendering the schema")?;
            println!("{text}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn check(dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    if !dir.is_dir() {
        bail!(
            "policy directory {} does not exist or is not a directory",
            dir.display()
        );
    }
    match axle_policy::load_dir(dir) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                eprintln!("{w}");
            }
            let p = &loaded.policy;
            let n = loaded.warnings.len();
            let warnings = match n {
                0 => String::new(),
                1 => "; 1 warning".to_string(),
                n => format!("; {n} warnings"),
            };
            println!(
                "policy OK: {} teams, {} priority classes, {} clusters, {} burst providers, revision {}{warnings}",
                p.teams.len(),
                p.priority_classes.len(),
                p.clusters.len(),
                p.burst_providers.len(),
                p.revision,
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(failure) => {
            for d in failure.errors.iter().chain(&failure.warnings) {
                eprintln!("{d}");
            }
            eprintln!(
                "policy invalid: {}",
                axle_policy::count_summary(failure.errors.len(), failure.warnings.len())
            );
            Ok(ExitCode::from(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/policy")
    }

    #[test]
    fn example_policy_checks_ok() {
        let code = run(PolicyCommand::Check { dir: example_dir() }).unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
    }

    #[test]
    fn broken_policy_exits_1_and_missing_dir_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bad.yaml"), "kind: Team\n").unwrap();
        let code = run(PolicyCommand::Check {
            dir: dir.path().to_path_buf(),
        })
        .unwrap();
        assert_eq!(code, ExitCode::from(1));
        let missing = run(PolicyCommand::Check {
            dir: dir.path().join("nope"),
        });
        assert!(missing.unwrap_err().to_string().contains("does not exist"));
    }
}
