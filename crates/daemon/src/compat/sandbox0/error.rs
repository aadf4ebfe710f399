//! Errors of the Sandbox0 layer, answered as Sandbox0's API answers them:
//! `{ "success": false, "error": { "code", "message" } }`.
//!
//! The daemon's own errors keep their stable code and status ([`ApiError::parts`]), except a
//! sandbox that is not running, which is a `409 sandbox_paused` here (Sandbox0's sandboxes
//! are paused, not stopped). The SDK raises `APIError` with the status and, where its API
//! description lists that status for the route, the code. What the daemon cannot do yet is
//! `501 not_implemented`, never a silent success.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::http::error::ApiError;
use crate::sandbox::SandboxError;

#[derive(Debug, thiserror::Error)]
pub enum Sandbox0Error {
    /// A request the layer cannot translate; the message names the field.
    #[error("{0}")]
    BadRequest(String),
    /// No such sandbox, context, snapshot or route.
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the sandbox's state.
    #[error("{0}")]
    Conflict(String),
    /// A Sandbox0 feature that has no counterpart in the daemon yet.
    #[error("{0} is not implemented by Belljar's Sandbox0 compatibility layer yet")]
    NotImplemented(String),
    /// No or a wrong token.
    #[error("Missing or wrong bearer token")]
    Unauthorized,
    /// A failure of the daemon's own services.
    #[error(transparent)]
    Api(#[from] ApiError),
}

impl From<SandboxError> for Sandbox0Error {
    fn from(e: SandboxError) -> Self {
        Self::Api(ApiError::Sandbox(e))
    }
}

#[derive(Serialize)]
struct Envelope<'a> {
    success: bool,
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    code: &'a str,
    message: String,
}

impl Sandbox0Error {
    /// Status, stable code and message.
    pub fn parts(&self) -> (StatusCode, &'static str, String) {
        match self {
            Self::BadRequest(m) => (StatusCode::BAD_REQUEST, "bad_request", m.clone()),
            Self::NotFound(m) => (StatusCode::NOT_FOUND, "not_found", m.clone()),
            Self::Conflict(m) => (StatusCode::CONFLICT, "conflict", m.clone()),
            Self::NotImplemented(_) => (
                StatusCode::NOT_IMPLEMENTED,
                "not_implemented",
                self.to_string(),
            ),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized", self.to_string()),
            Self::Api(e) => {
                let (status, code, message) = e.parts();
                if code == belljar_api::ErrorCode::SandboxNotRunning {
                    return (StatusCode::CONFLICT, "sandbox_paused", message);
                }
                (status, code.into(), message)
            }
        }
    }
}

impl IntoResponse for Sandbox0Error {
    fn into_response(self) -> Response {
        let (status, code, message) = self.parts();
        (
            status,
            Json(Envelope {
                success: false,
                error: Detail { code, message },
            }),
        )
            .into_response()
    }
}

pub type Result<T, E = Sandbox0Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_codes_keep_their_status_and_a_stopped_sandbox_is_paused() {
        let e = Sandbox0Error::from(SandboxError::NotFound("sbx_x".into()));
        assert_eq!(e.parts().0, StatusCode::NOT_FOUND);
        assert_eq!(e.parts().1, "not_found");
        let e = Sandbox0Error::from(SandboxError::NotRunning {
            id: "sbx_x".into(),
            status: "stopped",
        });
        assert_eq!(e.parts().0, StatusCode::CONFLICT);
        assert_eq!(e.parts().1, "sandbox_paused");
        let e = Sandbox0Error::NotImplemented("trafficRules".into());
        assert_eq!(e.parts().0, StatusCode::NOT_IMPLEMENTED);
    }
}
