//! What the core answers when it refuses a request. The edges map these to
//! HTTP statuses (`http.rs`) and gRPC codes (`grpc.rs`); the core knows
//! neither.

use axle_proto::api::ApiError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HubError {
    /// The request is malformed or impossible; `field` names the culprit.
    #[error("{message}")]
    BadRequest {
        message: String,
        field: Option<String>,
    },
    /// The named object does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The object is in a state that does not allow the request (a finished
    /// workload cancelled again).
    #[error("{0}")]
    Conflict(String),
    /// The caller did not prove who it is (a spoke's token).
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller is known and not allowed (an undeclared cluster).
    #[error("{0}")]
    PermissionDenied(String),
    /// The hub cannot take the request now (shutting down); retry.
    #[error("{0}")]
    Unavailable(String),
    /// The caller made too many calls; retry after `retry_after_s`.
    #[error("{message}")]
    RateLimited { message: String, retry_after_s: u64 },
    /// The hub serves as many calls as it takes at once; retry after `retry_after_s`.
    #[error("{message}")]
    TooBusy { message: String, retry_after_s: u64 },
    /// The hub broke one of its own invariants or could not read its store.
    #[error("{0}")]
    Internal(String),
}

impl HubError {
    pub fn bad(message: impl Into<String>, field: Option<&str>) -> HubError {
        HubError::BadRequest {
            message: message.into(),
            field: field.map(str::to_string),
        }
    }

    /// Seconds to wait before retrying, for the answers that say so.
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            HubError::RateLimited { retry_after_s, .. }
            | HubError::TooBusy { retry_after_s, .. } => Some(*retry_after_s),
            _ => None,
        }
    }

    pub fn shutting_down() -> HubError {
        HubError::Unavailable("hub is shutting down".into())
    }

    /// The JSON body the HTTP API answers with.
    pub fn to_api(&self) -> ApiError {
        ApiError {
            error: self.to_string(),
            field: match self {
                HubError::BadRequest { field, .. } => field.clone(),
                _ => None,
            },
        }
    }
}
