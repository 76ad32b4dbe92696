//! API errors as the real API server words them, rendered as a
//! `meta/v1 Status` body with the matching HTTP code and reason.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, Status, StatusDetails};

use crate::kinds::Kind;

/// An error answer: HTTP code, Kubernetes reason, message and details.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    /// Boxed: StatusDetails is large and errors travel in every `Result`.
    pub(crate) details: Option<Box<StatusDetails>>,
}

fn details(kind: Kind, name: &str) -> Option<Box<StatusDetails>> {
    Some(Box::new(StatusDetails {
        name: Some(name.to_string()),
        group: (!kind.group().is_empty()).then(|| kind.group().to_string()),
        kind: Some(kind.plural().to_string()),
        ..Default::default()
    }))
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// 400: a request the server cannot decode or does not understand.
    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 404 for a named object: `jobs.batch "x" not found`.
    pub(crate) fn not_found(kind: Kind, name: &str) -> ApiError {
        ApiError {
            details: details(kind, name),
            ..ApiError::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", kind.resource()),
            )
        }
    }

    /// 404 for a path the server does not serve.
    pub(crate) fn no_route() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 409 on create of an existing name.
    pub(crate) fn already_exists(kind: Kind, name: &str) -> ApiError {
        ApiError {
            details: details(kind, name),
            ..ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", kind.resource()),
            )
        }
    }

    /// 409 on a write with a stale `metadata.resourceVersion`.
    pub(crate) fn conflict(kind: Kind, name: &str) -> ApiError {
        ApiError {
            details: details(kind, name),
            ..ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                     please apply your changes to the latest version and try again",
                    kind.resource()
                ),
            )
        }
    }

    /// 422: the object fails validation. `causes` are "field: detail" strings.
    pub(crate) fn invalid(kind: Kind, name: &str, causes: &[String]) -> ApiError {
        ApiError {
            details: details(kind, name),
            ..ApiError::new(
                422,
                "Invalid",
                format!(
                    "{} \"{name}\" is invalid: {}",
                    kind.qualified_name(),
                    causes.join(", ")
                ),
            )
        }
    }

    /// 403: admission refused the object (quota, missing priority class).
    pub(crate) fn forbidden(kind: Kind, name: &str, why: &str) -> ApiError {
        ApiError {
            details: details(kind, name),
            ..ApiError::new(
                403,
                "Forbidden",
                format!("{} \"{name}\" is forbidden: {why}", kind.resource()),
            )
        }
    }

    /// 410: the requested resourceVersion is older than the kept history.
    pub(crate) fn gone(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    /// 405: a verb the resource does not support.
    pub(crate) fn method_not_allowed() -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// 413: the body is over the server's limit.
    pub(crate) fn too_large(limit_bytes: usize) -> ApiError {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body is larger than {limit_bytes} bytes"),
        )
    }

    /// 415: a patch or body content type the server does not handle.
    pub(crate) fn unsupported_media_type(content_type: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format: {content_type}"),
        )
    }

    /// The `meta/v1 Status` this error is sent as.
    pub(crate) fn status(&self) -> Status {
        Status {
            code: Some(i32::from(self.code)),
            details: self.details.as_deref().cloned(),
            message: Some(self.message.clone()),
            metadata: ListMeta::default(),
            reason: Some(self.reason.to_string()),
            status: Some("Failure".to_string()),
        }
    }
}
