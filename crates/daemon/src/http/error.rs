//! The one HTTP error type: each failure becomes `{"error":{"code","message"}}` with a status.
//!
//! Every code is a `belljar_api::ErrorCode` and has one status (`ErrorCode::status`). Agent
//! error codes are guest input: `ErrorCode::from_agent` keeps the ones in this closed list, with
//! these statuses, and makes any other `agent_error` (502), so a sandbox cannot pick the codes
//! or statuses the daemon's clients see.
//!
//! | agent code | status |
//! |---|---|
//! | `not_found`, `command_not_found` | 404 |
//! | `bad_request`, `invalid_path`, `is_a_directory`, `not_a_directory`, `not_a_regular_file`, `exec_failed`, `unknown_user` | 400 |
//! | `exists`, `not_empty`, `command_finished`, `busy` | 409 |
//! | `permission_denied` | 403 |
//! | `file_too_large` | 413 |
//! | `no_space` | 507 |
//! | `try_again` | 503 |
//! | `internal` and anything else | 502 `agent_error` (the agent's own failure) |
//!
//! Internal failures (store, host I/O) are logged with their cause and answered with a
//! generic message.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use belljar_agent_proto::client::ClientError;
use belljar_api::{ErrorBody, ErrorCode};

use crate::images::ImageError;
use crate::sandbox::backend::BackendError;
use crate::sandbox::{SandboxError, ThumbnailError};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A malformed request; the message names the field.
    #[error("{0}")]
    BadRequest(String),
    /// No or a wrong token.
    #[error("Missing or wrong bearer token")]
    Unauthorized,
    /// A foreign `Origin` or a non-loopback `Host`.
    #[error("{0}")]
    Forbidden(String),
    /// No such route or resource.
    #[error("{0}")]
    NotFound(String),
    /// A JSON body over the limit.
    #[error("body: larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// A sandbox operation failed.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// An image operation failed.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// Something failed that the client cannot fix.
    #[error("Internal error")]
    Internal(String),
}

impl ApiError {
    /// The status, the stable code and the message sent to the client.
    pub fn parts(&self) -> (StatusCode, ErrorCode, String) {
        let code = match self {
            ApiError::BadRequest(_) => ErrorCode::BadRequest,
            ApiError::Unauthorized => ErrorCode::Unauthorized,
            ApiError::Forbidden(_) => ErrorCode::Forbidden,
            ApiError::NotFound(_) => ErrorCode::NotFound,
            ApiError::PayloadTooLarge(_) => ErrorCode::PayloadTooLarge,
            ApiError::Image(e) => image_code(e),
            ApiError::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                ErrorCode::Internal
            }
            ApiError::Sandbox(e) => return sandbox_parts(e),
        };
        (status(code), code, self.to_string())
    }
}

/// The HTTP status of a code (each code has exactly one).
pub fn status(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

pub(crate) fn image_code(e: &ImageError) -> ErrorCode {
    match e {
        ImageError::BadName(_) => ErrorCode::BadRequest,
        ImageError::Unknown(_) | ImageError::NotBuilt { .. } => ErrorCode::ImageNotAvailable,
        ImageError::Busy(_) | ImageError::InUse(_) => ErrorCode::Conflict,
        ImageError::NeedsRoot { .. } => ErrorCode::Forbidden,
        ImageError::NoScript(_) | ImageError::NoStore(_) => ErrorCode::Internal,
        ImageError::NoStaticAgent(_) => ErrorCode::ImageNotAvailable,
        ImageError::NotPulled(_) | ImageError::Gone { .. } => ErrorCode::ImageNotAvailable,
        ImageError::Oci(e) => e.code().parse().unwrap_or(ErrorCode::Internal),
    }
}

pub(crate) fn sandbox_parts(e: &SandboxError) -> (StatusCode, ErrorCode, String) {
    let code = match e {
        SandboxError::BadRequest(_) => ErrorCode::BadRequest,
        SandboxError::NotFound(_)
        | SandboxError::CommandNotFound(_)
        | SandboxError::SnapshotNotFound(_) => ErrorCode::NotFound,
        SandboxError::NotRunning { .. } => ErrorCode::SandboxNotRunning,
        SandboxError::Conflict(_) => ErrorCode::Conflict,
        SandboxError::Admission(e) if e.is_refusal() => ErrorCode::InsufficientResources,
        SandboxError::Image(e) => image_code(e),
        SandboxError::Backend(BackendError::Unavailable { .. }) => ErrorCode::BackendUnavailable,
        SandboxError::Backend(BackendError::Unsupported { .. } | BackendError::NoFreezer(_)) => {
            ErrorCode::NotSupported
        }
        SandboxError::SnapshotNotUsable { .. } => ErrorCode::SnapshotNotUsable,
        SandboxError::InvalidPath(_) => ErrorCode::InvalidPath,
        SandboxError::NotADirectory(_) => ErrorCode::NotADirectory,
        SandboxError::PathNotFound(_) => ErrorCode::NotFound,
        SandboxError::PermissionDenied(_) => ErrorCode::PermissionDenied,
        SandboxError::SnapshotTooLarge(_) => ErrorCode::InsufficientResources,
        SandboxError::MountDenied(_) => ErrorCode::MountDenied,
        SandboxError::VolumeNotFound(_) => ErrorCode::VolumeNotFound,
        SandboxError::VolumeInUse(_) => ErrorCode::VolumeInUse,
        SandboxError::TemplateNotFound(_) => ErrorCode::TemplateNotFound,
        // The reason a sandbox could not start is the user's business; it holds no secret.
        SandboxError::Backend(b) => {
            let code = ErrorCode::Internal;
            return (status(code), code, crate::util::error_chain(b));
        }
        SandboxError::Agent(ClientError::Api { code, message, .. }) => {
            return agent_parts(code, message);
        }
        SandboxError::Agent(_) | SandboxError::AgentTimeout(_) => ErrorCode::AgentUnavailable,
        SandboxError::Thumbnail(ThumbnailError::Worker(_)) => {
            tracing::error!(error = ?e, "internal error");
            let code = ErrorCode::Internal;
            return (
                status(code),
                code,
                "Internal error; see the daemon's log".to_owned(),
            );
        }
        SandboxError::Thumbnail(_) => {
            let code = ErrorCode::NotAnImage;
            return (status(code), code, crate::util::error_chain(e));
        }
        SandboxError::Admission(_) | SandboxError::Store(_) | SandboxError::Io(_) => {
            tracing::error!(error = ?e, "internal error");
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                "Internal error; see the daemon's log".to_owned(),
            );
        }
    };
    (status(code), code, e.to_string())
}

/// The longest agent message passed on; the rest of a guest's text is not the client's concern.
const MAX_AGENT_MESSAGE: usize = 1024;

fn agent_parts(code: &str, message: &str) -> (StatusCode, ErrorCode, String) {
    let code = ErrorCode::from_agent(code);
    let mut message = message.to_owned();
    if message.len() > MAX_AGENT_MESSAGE {
        let mut end = MAX_AGENT_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    (status(code), code, message)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, message) = self.parts();
        (status, Json(ErrorBody::new(code, message))).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::admission::AdmissionError;

    #[test]
    fn each_failure_has_its_status_and_code() {
        let check = |e: ApiError, status: u16, code: &str| {
            let (s, c, _) = e.parts();
            assert_eq!((s.as_u16(), c.as_str()), (status, code));
            assert_eq!(s.as_u16(), c.status(), "{code}: one status per code");
        };
        check(
            ApiError::Sandbox(SandboxError::NotFound("sbx_x".into())),
            404,
            "not_found",
        );
        check(
            ApiError::Sandbox(SandboxError::BadRequest(
                "timeout_ms: must be positive".into(),
            )),
            400,
            "bad_request",
        );
        check(ApiError::Unauthorized, 401, "unauthorized");
        check(ApiError::Forbidden("origin".into()), 403, "forbidden");
        check(
            ApiError::Sandbox(SandboxError::Admission(AdmissionError::Insufficient {
                needed: 1,
                starting: 1,
                available: 1,
                reserve: 1,
            })),
            507,
            "insufficient_resources",
        );
        check(
            ApiError::Sandbox(SandboxError::Admission(AdmissionError::Pressure {
                stalled_pct: 30.0,
                limit_pct: 20.0,
            })),
            507,
            "insufficient_resources",
        );
        let agent_err = |code: &str| {
            ApiError::Sandbox(SandboxError::Agent(ClientError::Api {
                status: 400,
                code: code.into(),
                message: "m".into(),
            }))
        };
        check(agent_err("is_a_directory"), 400, "is_a_directory");
        check(agent_err("not_found"), 404, "not_found");
        check(agent_err("exists"), 409, "exists");
        check(agent_err("internal"), 502, "agent_error");
        check(agent_err("busy"), 409, "busy");
        check(agent_err("not_a_regular_file"), 400, "not_a_regular_file");
        check(agent_err("file_too_large"), 413, "file_too_large");
        check(agent_err("try_again"), 503, "try_again");
        // A guest cannot pick the daemon's codes or statuses.
        check(agent_err("unauthorized"), 502, "agent_error");
        check(agent_err("sandbox_not_running"), 502, "agent_error");
        let long = ApiError::Sandbox(SandboxError::Agent(ClientError::Api {
            status: 400,
            code: "not_found".into(),
            message: "é".repeat(4000),
        }));
        assert!(long.parts().2.len() <= MAX_AGENT_MESSAGE + 4);
        check(
            ApiError::Sandbox(SandboxError::NotRunning {
                id: "sbx_a".into(),
                status: "stopped",
            }),
            409,
            "sandbox_not_running",
        );
        // A backend's failure carries its cause as a source; the message names both.
        let failed = ApiError::Sandbox(SandboxError::Backend(BackendError::Namespace(
            crate::sandbox::backend::Step::Launch,
            belljar_namespace::Error::Spec("disk too small".into()),
        )));
        assert_eq!(
            failed.parts().2,
            "Launching the sandbox failed: Invalid sandbox spec: disk too small"
        );
        let capture = ApiError::Sandbox(SandboxError::Backend(BackendError::Capture(
            belljar_namespace::layer::Error::NoLayer,
        )));
        assert_eq!(
            capture.parts().2,
            "Capturing the sandbox's files failed: The sandbox has no writable layer"
        );
        check(
            ApiError::Sandbox(SandboxError::SnapshotNotFound("snap_x".into())),
            404,
            "not_found",
        );
        check(
            ApiError::Sandbox(SandboxError::SnapshotNotUsable {
                id: "snap_x".into(),
                status: "deleted",
            }),
            409,
            "snapshot_not_usable",
        );
        check(
            ApiError::Sandbox(SandboxError::Backend(BackendError::Unsupported {
                backend: "microvm",
                what: "snapshot a sandbox",
            })),
            501,
            "not_supported",
        );
        check(
            ApiError::Sandbox(SandboxError::Backend(BackendError::NoFreezer(
                belljar_namespace::cgroup::Error::NoFreezer,
            ))),
            501,
            "not_supported",
        );
        check(
            ApiError::Image(ImageError::NotBuilt {
                name: "base".into(),
                build: "belljar images build base".into(),
            }),
            400,
            "image_not_available",
        );
        check(
            ApiError::Image(ImageError::NeedsRoot {
                name: "base".into(),
                build: "sudo env BELLJAR_CACHE=/c /g/build-image.sh base".into(),
            }),
            403,
            "forbidden",
        );
    }
}
