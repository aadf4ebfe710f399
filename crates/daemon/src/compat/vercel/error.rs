//! Errors of the Vercel layer, answered as Vercel's API answers them:
//! `{ "error": { "code", "message" } }` with a status the SDK understands.
//!
//! The daemon's own errors keep their code and status ([`ApiError::parts`]), except the few
//! that Vercel's SDK reacts to by status: a stopped sandbox is 410 (3.x then resumes it). What
//! the daemon cannot do yet is `not_implemented`, never a silent success; it is answered with
//! 422, because the SDK retries every 5xx for about fifteen seconds before it gives up.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::http::error::ApiError;
use crate::sandbox::SandboxError;

#[derive(Debug, thiserror::Error)]
pub enum VercelError {
    /// A request the layer cannot translate; the message names the field.
    #[error("{0}")]
    BadRequest(String),
    /// No such sandbox, session, command or snapshot.
    #[error("{0}")]
    NotFound(String),
    /// A Vercel feature that has no counterpart in the daemon yet.
    #[error("{0} is not implemented by Belljar's Vercel compatibility layer yet")]
    NotImplemented(String),
    /// A name already taken by a live sandbox.
    #[error("A sandbox named {0:?} already exists")]
    NameTaken(String),
    /// A credential of the daemon's that is out of its validity.
    #[error(transparent)]
    Token(#[from] super::token::TokenError),
    /// A failure of the daemon's own services.
    #[error(transparent)]
    Api(#[from] ApiError),
}

impl From<SandboxError> for VercelError {
    fn from(e: SandboxError) -> Self {
        Self::Api(ApiError::Sandbox(e))
    }
}

#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    code: &'a str,
    message: String,
}

impl VercelError {
    /// Status, stable code and message.
    pub fn parts(&self) -> (StatusCode, &'static str, String) {
        match self {
            Self::BadRequest(m) => (StatusCode::BAD_REQUEST, "bad_request", m.clone()),
            Self::NotFound(m) => (StatusCode::NOT_FOUND, "not_found", m.clone()),
            Self::NotImplemented(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "not_implemented",
                self.to_string(),
            ),
            Self::NameTaken(_) => (StatusCode::CONFLICT, "sandbox_exists", self.to_string()),
            Self::Token(e) => (StatusCode::UNAUTHORIZED, e.code(), self.to_string()),
            Self::Api(e) => {
                let (status, code, message) = e.parts();
                if code == belljar_api::ErrorCode::SandboxNotRunning {
                    return (StatusCode::GONE, "sandbox_stopped", message);
                }
                (status, code.into(), message)
            }
        }
    }
}

impl IntoResponse for VercelError {
    fn into_response(self) -> Response {
        let (status, code, message) = self.parts();
        (
            status,
            Json(Body {
                error: Detail { code, message },
            }),
        )
            .into_response()
    }
}

pub type Result<T, E = VercelError> = std::result::Result<T, E>;
