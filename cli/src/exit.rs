//! The exit codes scripts can rely on, and the mapping from errors to them.
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success |
//! | 1 | the hub refused the request (4xx), or a workload / bench failed |
//! | 2 | usage error (bad flags or values; clap uses 2 as well) |
//! | 3 | cannot reach the hub, or the hub failed (5xx, malformed answer) |

use crate::client::ClientError;

pub const REFUSED_OR_FAILED: u8 = 1;
pub const USAGE: u8 = 2;
pub const HUB_UNAVAILABLE: u8 = 3;

impl ClientError {
    /// 1 when the hub refused the request; 3 when it cannot be reached or failed.
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Refused { .. } | ClientError::Insecure { .. } => REFUSED_OR_FAILED,
            ClientError::Unreachable { .. }
            | ClientError::Server { .. }
            | ClientError::Protocol { .. } => HUB_UNAVAILABLE,
        }
    }
}

/// Shown under `axle --help`.
pub const HELP: &str = "\
Exit codes:
  0  success
  1  the hub refused the request (4xx), or a workload or bench failed
  2  usage error (bad flags or values)
  3  cannot reach the hub, or the hub failed (5xx)

The hub URL comes from --hub or $AXLE_HUB (default http://127.0.0.1:7070).";

/// Printed after an unreachable-hub error.
pub const UNREACHABLE_HINT: &str =
    "is the hub running? start the dev stack with: cargo run --release --bin axle-dev";

/// The hint, naming the built `axle-dev` beside this binary when there is
/// one.
pub fn unreachable_hint() -> String {
    match std::env::current_exe()
        .ok()
        .map(|p| p.with_file_name("axle-dev"))
        .filter(|p| p.is_file())
    {
        Some(dev) => format!(
            "is the hub running? start the dev stack with: {}",
            dev.display()
        ),
        None => UNREACHABLE_HINT.to_string(),
    }
}

/// A value the user gave is wrong in a way clap could not see (exit 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The request went through but the outcome is a failure: a workload ended
/// Failed or Cancelled, or a bench had failed jobs (exit 1).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Failed(pub String);

/// The exit code for an error from a hub command, and the lines to print.
pub fn classify(err: &anyhow::Error) -> (u8, Vec<String>) {
    if let Some(ce) = err.downcast_ref::<ClientError>() {
        let mut lines = vec![format!("error: {ce}")];
        if let ClientError::Unreachable { reason, .. } = ce {
            lines.push(if reason.contains("certificate") {
                "hint: the hub's TLS certificate is not trusted here: pass --ca-file (or \
                 AXLE_CA_FILE) with the CA that signed it"
                    .to_string()
            } else if reason.contains("invalid HTTP version") {
                "hint: the hub answers with TLS: use its https:// URL (and --ca-file with the \
                 CA of its certificate, e.g. the hub's DATA_DIR/spoke-ca.pem)"
                    .to_string()
            } else {
                format!("hint: {}", unreachable_hint())
            });
        }
        return (ce.exit_code(), lines);
    }
    let code = if err.downcast_ref::<UsageError>().is_some() {
        USAGE
    } else {
        // Failed, and anything unexpected (e.g. stdout closed).
        REFUSED_OR_FAILED
    };
    (code, vec![format!("error: {err:#}")])
}

#[cfg(test)]
mod tests {
    use super::*;
    use axle_proto::api::ApiError;

    #[test]
    fn exit_codes_follow_the_contract() {
        let api = ApiError {
            error: "x".into(),
            field: None,
        };
        let refused = ClientError::Refused {
            status: 404,
            body: api.clone(),
        };
        let server = ClientError::Server {
            status: 500,
            body: api,
        };
        let unreachable = ClientError::Unreachable {
            hub: "h".into(),
            reason: "r".into(),
        };
        assert_eq!(refused.exit_code(), 1);
        assert_eq!(server.exit_code(), 3);
        assert_eq!(unreachable.exit_code(), 3);
    }

    #[test]
    fn errors_map_to_documented_codes() {
        let refused = anyhow::Error::new(ClientError::Refused {
            status: 400,
            body: ApiError {
                error: "gpus must be positive".into(),
                field: Some("gpus".into()),
            },
        });
        assert_eq!(
            classify(&refused),
            (
                REFUSED_OR_FAILED,
                vec!["error: gpus must be positive (field: gpus)".to_string()]
            )
        );
        let down = anyhow::Error::new(ClientError::Unreachable {
            hub: "http://127.0.0.1:7070".into(),
            reason: "connection refused".into(),
        });
        let (code, lines) = classify(&down);
        assert_eq!(code, HUB_UNAVAILABLE);
        assert_eq!(lines[1], format!("hint: {}", unreachable_hint()));
        assert!(lines[1].starts_with("hint: is the hub running? start the dev stack with: "));
        let untrusted = anyhow::Error::new(ClientError::Unreachable {
            hub: "https://hub:7070".into(),
            reason: "invalid peer certificate: UnknownIssuer".into(),
        });
        let (_, lines) = classify(&untrusted);
        assert!(lines[1].contains("--ca-file"), "{lines:?}");
        let server = anyhow::Error::new(ClientError::Server {
            status: 500,
            body: ApiError {
                error: "store unavailable".into(),
                field: None,
            },
        });
        assert_eq!(classify(&server).0, HUB_UNAVAILABLE);
        let usage = anyhow::Error::new(UsageError("--env A is given more than once".into()));
        assert_eq!(classify(&usage).0, USAGE);
        let failed = anyhow::Error::new(Failed("workload 3 Failed".into()));
        assert_eq!(classify(&failed).0, REFUSED_OR_FAILED);
    }
}
