//! Errors of the Modal layer, answered as gRPC statuses, the form in which Modal's server
//! answers: the client turns each code into its own exception (`NOT_FOUND` into
//! `NotFoundError`, `FAILED_PRECONDITION` into `ConflictError`, `INVALID_ARGUMENT` into
//! `InvalidError`, `ALREADY_EXISTS` into `AlreadyExistsError`, `UNIMPLEMENTED` into `UnimplementedError`, ...).
//!
//! The daemon's own errors keep their meaning: each maps by the HTTP status the daemon gives
//! it to the gRPC code of the same meaning. What the layer cannot do yet is `UNIMPLEMENTED`,
//! never a silent success.

use axum::http::StatusCode;
use tonic::{Code, Status};

use crate::http::error::ApiError;
use crate::sandbox::SandboxError;

pub type Result<T, E = ModalError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum ModalError {
    /// A request the layer cannot translate; the message names the field.
    #[error("{0}")]
    BadRequest(String),
    /// No such sandbox, app, image or command.
    #[error("{0}")]
    NotFound(String),
    /// An object of that name exists (`CREATE_FAIL_IF_EXISTS`).
    #[error("{0}")]
    AlreadyExists(String),
    /// The request conflicts with the object's state (a sandbox that has finished).
    #[error("{0}")]
    Conflict(String),
    /// Missing or wrong credentials.
    #[error("{0}")]
    Unauthenticated(String),
    /// A client version the layer does not speak: Modal's answer to an outdated client.
    #[error("{0}")]
    UnsupportedClient(String),
    /// A command still runs at the end of a long poll: the client asks again.
    #[error("Exec {0} is still running")]
    StillRunning(String),
    /// A Modal feature that has no counterpart in Belljar yet.
    #[error("{0} is not implemented by Belljar's Modal compatibility layer yet")]
    NotImplemented(String),
    /// A failure of the daemon's own services.
    #[error(transparent)]
    Api(#[from] ApiError),
}

impl From<SandboxError> for ModalError {
    fn from(e: SandboxError) -> Self {
        Self::Api(ApiError::Sandbox(e))
    }
}

impl ModalError {
    /// The gRPC code and the message.
    pub fn parts(&self) -> (Code, String) {
        match self {
            Self::BadRequest(m) => (Code::InvalidArgument, m.clone()),
            Self::NotFound(m) => (Code::NotFound, m.clone()),
            Self::AlreadyExists(m) => (Code::AlreadyExists, m.clone()),
            Self::Conflict(m) => (Code::FailedPrecondition, m.clone()),
            Self::Unauthenticated(m) => (Code::Unauthenticated, m.clone()),
            Self::UnsupportedClient(m) => (Code::FailedPrecondition, m.clone()),
            Self::StillRunning(_) => (Code::DeadlineExceeded, self.to_string()),
            Self::NotImplemented(_) => (Code::Unimplemented, self.to_string()),
            Self::Api(e) => {
                let (status, _, message) = e.parts();
                (code_of(status), message)
            }
        }
    }
}

impl From<ModalError> for Status {
    fn from(e: ModalError) -> Self {
        let (code, message) = e.parts();
        Status::new(code, message)
    }
}

/// The gRPC code of the daemon's HTTP status.
fn code_of(status: StatusCode) -> Code {
    match status.as_u16() {
        400 | 413 | 422 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::FailedPrecondition,
        501 => Code::Unimplemented,
        503 => Code::Unavailable,
        507 | 429 => Code::ResourceExhausted,
        _ => Code::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemons_errors_keep_their_meaning() {
        let e = ModalError::from(SandboxError::NotFound("sbx_a".into()));
        assert_eq!(e.parts().0, Code::NotFound);
        let e = ModalError::from(SandboxError::Conflict("ended".into()));
        assert_eq!(Status::from(e).code(), Code::FailedPrecondition);
        assert_eq!(
            ModalError::NotImplemented("Volumes".into()).parts().0,
            Code::Unimplemented
        );
    }
}
