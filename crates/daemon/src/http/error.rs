//! The one HTTP error type: each failure becomes `{"error":{"code","message"}}` with a status.
//!
//! Agent error codes are guest input: the ones in this closed list pass through, with these
//! statuses, and any other becomes `agent_error` (502), so a sandbox cannot pick the codes or
//! statuses the daemon's clients see.
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
    pub fn parts(&self) -> (StatusCode, String, String) {
        let msg = self.to_string();
        let simple = |status: StatusCode, code: &str| (status, code.to_owned(), msg.clone());
        match self {
            ApiError::BadRequest(_) => simple(StatusCode::BAD_REQUEST, codes::BAD_REQUEST),
            ApiError::Unauthorized => simple(StatusCode::UNAUTHORIZED, codes::UNAUTHORIZED),
            ApiError::Forbidden(_) => simple(StatusCode::FORBIDDEN, codes::FORBIDDEN),
            ApiError::NotFound(_) => simple(StatusCode::NOT_FOUND, codes::NOT_FOUND),
            ApiError::PayloadTooLarge(_) => {
                simple(StatusCode::PAYLOAD_TOO_LARGE, codes::PAYLOAD_TOO_LARGE)
            }
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
        SandboxError::Agent(ClientError::Api { code, message, .. }) => agent_parts(code, message),
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

/// The longest agent message passed on; the rest of a guest's text is not the client's concern.
const MAX_AGENT_MESSAGE: usize = 1024;

/// The status and the daemon's own code for an agent error code: known codes keep their name,
/// anything else (including the agent's `internal`) is `agent_error`.
pub fn agent_status(code: &str) -> (StatusCode, &'static str) {
    let known = [
        (agent::NOT_FOUND, StatusCode::NOT_FOUND),
        (agent::COMMAND_NOT_FOUND, StatusCode::NOT_FOUND),
        (agent::BAD_REQUEST, StatusCode::BAD_REQUEST),
        (agent::INVALID_PATH, StatusCode::BAD_REQUEST),
        (agent::IS_A_DIRECTORY, StatusCode::BAD_REQUEST),
        (agent::NOT_A_DIRECTORY, StatusCode::BAD_REQUEST),
        (agent::NOT_A_REGULAR_FILE, StatusCode::BAD_REQUEST),
        (agent::EXEC_FAILED, StatusCode::BAD_REQUEST),
        (agent::UNKNOWN_USER, StatusCode::BAD_REQUEST),
        (agent::EXISTS, StatusCode::CONFLICT),
        (agent::NOT_EMPTY, StatusCode::CONFLICT),
        (agent::COMMAND_FINISHED, StatusCode::CONFLICT),
        (agent::BUSY, StatusCode::CONFLICT),
        (agent::PERMISSION_DENIED, StatusCode::FORBIDDEN),
        (agent::FILE_TOO_LARGE, StatusCode::PAYLOAD_TOO_LARGE),
        (agent::NO_SPACE, StatusCode::INSUFFICIENT_STORAGE),
        (agent::TRY_AGAIN, StatusCode::SERVICE_UNAVAILABLE),
    ];
    known
        .into_iter()
        .find(|(known, _)| *known == code)
        .map(|(code, status)| (status, code))
        .unwrap_or((StatusCode::BAD_GATEWAY, codes::AGENT_ERROR))
}

fn agent_parts(code: &str, message: &str) -> (StatusCode, String, String) {
    let (status, code) = agent_status(code);
    let mut message = message.to_owned();
    if message.len() > MAX_AGENT_MESSAGE {
        let mut end = MAX_AGENT_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    (status, code.to_owned(), message)
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
        check(
            ApiError::Image(ImageError::NotBuilt {
                name: "base".into(),
            }),
            400,
            "image_not_available",
        );
    }
}
