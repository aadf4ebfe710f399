//! Errors of the E2B layer, answered as E2B answers them: the control plane with
//! `{ "code": <HTTP status>, "message" }`, envd's Connect RPCs with a Connect error
//! (`{ "code": "not_found", "message" }`) whose code the SDK turns into its exception
//! (`NotFoundException`, `InvalidArgumentException`, `TimeoutException`, ...).
//!
//! The daemon's own errors keep their meaning: each [`ErrorCode`] maps to one Connect code and
//! to the HTTP status the daemon gives it. What the daemon cannot do yet is
//! `not_implemented` (Connect `unimplemented`, HTTP 501), never a silent success.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use belljar_api::ErrorCode;

use super::wire::{ApiErrorBody, ConnectError};
use crate::http::error::ApiError;
use crate::sandbox::SandboxError;

#[derive(Debug, thiserror::Error)]
pub enum E2bError {
    /// A request the layer cannot translate; the message names the field.
    #[error("{0}")]
    BadRequest(String),
    /// No such sandbox, process or file.
    #[error("{0}")]
    NotFound(String),
    /// A path that is already there.
    #[error("{0} already exists")]
    Exists(String),
    /// An E2B feature that has no counterpart in the daemon yet.
    #[error("{0} is not implemented by Belljar's E2B compatibility layer yet")]
    NotImplemented(String),
    /// A failure of the daemon's own services.
    #[error(transparent)]
    Api(#[from] ApiError),
}

impl From<SandboxError> for E2bError {
    fn from(e: SandboxError) -> Self {
        Self::Api(ApiError::Sandbox(e))
    }
}

impl E2bError {
    /// The HTTP status, the Connect code and the message.
    pub fn parts(&self) -> (StatusCode, &'static str, String) {
        match self {
            Self::BadRequest(m) => (StatusCode::BAD_REQUEST, "invalid_argument", m.clone()),
            Self::NotFound(m) => (StatusCode::NOT_FOUND, "not_found", m.clone()),
            Self::Exists(_) => (StatusCode::CONFLICT, "already_exists", self.to_string()),
            Self::NotImplemented(_) => (
                StatusCode::NOT_IMPLEMENTED,
                "unimplemented",
                self.to_string(),
            ),
            Self::Api(e) => {
                let (status, code, message) = e.parts();
                (status, connect_code(code), message)
            }
        }
    }

    /// The Connect error of an envd RPC.
    pub fn connect(&self) -> ConnectError {
        let (_, code, message) = self.parts();
        ConnectError { code, message }
    }

    /// The answer of a unary envd RPC: a Connect error with the status Connect gives its code.
    pub fn into_connect_response(self) -> Response {
        let err = self.connect();
        (connect_status(err.code), Json(err)).into_response()
    }
}

/// The control plane's (and envd's `/files`) answer.
impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let (status, _, message) = self.parts();
        let body = ApiErrorBody {
            code: status.as_u16(),
            message,
        };
        (status, Json(body)).into_response()
    }
}

/// The Connect code of a daemon error code.
pub fn connect_code(code: ErrorCode) -> &'static str {
    use ErrorCode as C;
    match code {
        C::BadRequest
        | C::InvalidPath
        | C::UnknownUser
        | C::IsADirectory
        | C::NotADirectory
        | C::NotARegularFile
        | C::NotAnImage
        | C::ImageInvalid => "invalid_argument",
        C::NotFound | C::CommandNotFound | C::ImageNotFound | C::CommandFinished => "not_found",
        C::Exists | C::Conflict => "already_exists",
        C::NotEmpty | C::SnapshotNotUsable => "failed_precondition",
        C::Unauthorized => "unauthenticated",
        C::Forbidden | C::PermissionDenied | C::RegistryDenied => "permission_denied",
        C::PayloadTooLarge
        | C::FileTooLarge
        | C::NoSpace
        | C::InsufficientResources
        | C::ImageTooLarge => "resource_exhausted",
        C::NotSupported => "unimplemented",
        C::SandboxNotRunning
        | C::AgentUnavailable
        | C::Busy
        | C::TryAgain
        | C::BackendUnavailable
        | C::RegistryUnavailable
        | C::ImageNotAvailable => "unavailable",
        _ => "internal",
    }
}

/// The HTTP status the Connect protocol gives a unary error with `code`.
pub fn connect_status(code: &str) -> StatusCode {
    match code {
        "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
        "unauthenticated" => StatusCode::UNAUTHORIZED,
        "permission_denied" => StatusCode::FORBIDDEN,
        "not_found" => StatusCode::NOT_FOUND,
        "already_exists" | "aborted" => StatusCode::CONFLICT,
        "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
        "unimplemented" => StatusCode::NOT_IMPLEMENTED,
        "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
        "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
        "canceled" => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

pub type Result<T, E = E2bError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_codes_become_the_connect_codes_the_sdk_maps() {
        assert_eq!(connect_code(ErrorCode::NotFound), "not_found");
        assert_eq!(connect_code(ErrorCode::InvalidPath), "invalid_argument");
        assert_eq!(connect_code(ErrorCode::Exists), "already_exists");
        assert_eq!(connect_code(ErrorCode::Internal), "internal");
        assert_eq!(connect_status("not_found"), StatusCode::NOT_FOUND);
        let (status, code, _) = E2bError::NotImplemented("x".into()).parts();
        assert_eq!(
            (status, code),
            (StatusCode::NOT_IMPLEMENTED, "unimplemented")
        );
    }
}
