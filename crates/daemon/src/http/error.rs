//! The one HTTP error type: each failure becomes `{"error":{"code","message"}}` with a status.
//!
//! Agent error codes pass through unchanged, with these statuses:
//!
//! | agent code | status |
//! |---|---|
//! | `not_found`, `command_not_found` | 404 |
//! | `bad_request`, `invalid_path`, `is_a_directory`, `not_a_directory`, `exec_failed`, `unknown_user` | 400 |
//! | `exists`, `not_empty`, `command_finished` | 409 |
//! | `permission_denied` | 403 |
//! | `no_space` | 507 |
//! | anything else | 502 (the agent's own failure) |
//!
//! Internal failures (store, host I/O) are logged with their cause and answered with a
//! generic message.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use belljar_agent_proto::client::ClientError;
use belljar_agent_proto::codes as agent;
use belljar_api::{ErrorBody, codes};

use crate::images::ImageError;
use crate::sandbox::SandboxError;
use crate::sandbox::admission::AdmissionError;
use crate::sandbox::backend::BackendError;

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
    pub fn parts(&self) -> (StatusCode, String, String) {
        let msg = self.to_string();
        let simple = |status: StatusCode, code: &str| (status, code.to_owned(), msg.clone());
        match self {
            ApiError::BadRequest(_) => simple(StatusCode::BAD_REQUEST, codes::BAD_REQUEST),
            ApiError::Unauthorized => simple(StatusCode::UNAUTHORIZED, codes::UNAUTHORIZED),
            ApiError::Forbidden(_) => simple(StatusCode::FORBIDDEN, codes::FORBIDDEN),
            ApiError::NotFound(_) => simple(StatusCode::NOT_FOUND, codes::NOT_FOUND),
            ApiError::Image(e) => image_parts(e, msg.clone()),
            ApiError::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                simple(StatusCode::INTERNAL_SERVER_ERROR, codes::INTERNAL)
            }
            ApiError::Sandbox(e) => sandbox_parts(e, msg.clone()),
        }
    }
}

fn image_parts(e: &ImageError, msg: String) -> (StatusCode, String, String) {
    let (status, code) = match e {
        ImageError::BadName(_) => (StatusCode::BAD_REQUEST, codes::BAD_REQUEST),
        ImageError::Unknown(_) | ImageError::NotBuilt { .. } => {
            (StatusCode::BAD_REQUEST, codes::IMAGE_NOT_AVAILABLE)
        }
        ImageError::Busy(_) => (StatusCode::CONFLICT, codes::CONFLICT),
        ImageError::NoScript(_) => (StatusCode::INTERNAL_SERVER_ERROR, codes::INTERNAL),
    };
    (status, code.to_owned(), msg)
}

fn sandbox_parts(e: &SandboxError, msg: String) -> (StatusCode, String, String) {
    let simple = |status: StatusCode, code: &str| (status, code.to_owned(), msg.clone());
    match e {
        SandboxError::BadRequest(_) => simple(StatusCode::BAD_REQUEST, codes::BAD_REQUEST),
        SandboxError::NotFound(_) | SandboxError::CommandNotFound(_) => {
            simple(StatusCode::NOT_FOUND, codes::NOT_FOUND)
        }
        SandboxError::NotRunning { .. } => simple(StatusCode::CONFLICT, codes::SANDBOX_NOT_RUNNING),
        SandboxError::Conflict(_) => simple(StatusCode::CONFLICT, codes::CONFLICT),
        SandboxError::Admission(AdmissionError::Insufficient { .. }) => simple(
            StatusCode::INSUFFICIENT_STORAGE,
            codes::INSUFFICIENT_RESOURCES,
        ),
        SandboxError::Image(e) => image_parts(e, msg),
        SandboxError::Backend(BackendError::Unavailable { .. }) => {
            simple(StatusCode::SERVICE_UNAVAILABLE, codes::BACKEND_UNAVAILABLE)
        }
        // The reason a sandbox could not start is the user's business; it holds no secret.
        SandboxError::Backend(_) => simple(StatusCode::INTERNAL_SERVER_ERROR, codes::INTERNAL),
        SandboxError::Agent(ClientError::Api { code, message, .. }) => {
            (agent_status(code), code.clone(), message.clone())
        }
        SandboxError::Agent(_) | SandboxError::AgentTimeout(_) => {
            simple(StatusCode::BAD_GATEWAY, codes::AGENT_UNAVAILABLE)
        }
        SandboxError::Thumbnail(_) => simple(StatusCode::BAD_REQUEST, "not_an_image"),
        SandboxError::Admission(_) | SandboxError::Store(_) | SandboxError::Io(_) => {
            tracing::error!(error = ?e, "internal error");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                codes::INTERNAL.to_owned(),
                "Internal error; see the daemon's log".to_owned(),
            )
        }
    }
}

/// The status an agent error code is answered with.
pub fn agent_status(code: &str) -> StatusCode {
    match code {
        agent::NOT_FOUND | agent::COMMAND_NOT_FOUND => StatusCode::NOT_FOUND,
        agent::BAD_REQUEST
        | agent::INVALID_PATH
        | agent::IS_A_DIRECTORY
        | agent::NOT_A_DIRECTORY
        | agent::EXEC_FAILED
        | agent::UNKNOWN_USER => StatusCode::BAD_REQUEST,
        agent::EXISTS | agent::NOT_EMPTY | agent::COMMAND_FINISHED => StatusCode::CONFLICT,
        agent::PERMISSION_DENIED => StatusCode::FORBIDDEN,
        agent::NO_SPACE => StatusCode::INSUFFICIENT_STORAGE,
        _ => StatusCode::BAD_GATEWAY,
    }
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

    #[test]
    fn each_failure_has_its_status_and_code() {
        let check = |e: ApiError, status: u16, code: &str| {
            let (s, c, _) = e.parts();
            assert_eq!((s.as_u16(), c.as_str()), (status, code));
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
                requested: 1,
                committed: 1,
                available: 1,
                reserve: 1,
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
        check(agent_err("internal"), 502, "internal");
        check(
            ApiError::Sandbox(SandboxError::NotRunning {
                id: "sbx_a".into(),
                status: "stopped",
            }),
            409,
            "sandbox_not_running",
        );
        check(
            ApiError::Image(ImageError::NotBuilt {
                name: "base".into(),
            }),
            400,
            "image_not_available",
        );
    }
}
