//! The one error shape every client sees: `{"error":{"code":"...","message":"..."}}`.

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::ToSchema;

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// A stable machine-readable `code` and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            error: ErrorDetail {
                code: code.into(),
                message: message.into(),
            },
        }
    }
}

/// Stable error codes of the daemon. The agent's file codes (`not_found`, `is_a_directory`,
/// `not_a_directory`, `not_a_regular_file`, `permission_denied`, `exists`, `not_empty`, `busy`,
/// `no_space`, `file_too_large`, `invalid_path`, ...) are passed on when they are in the
/// daemon's list (`crates/daemon/src/http/error.rs`); any other code from a sandbox becomes
/// [`codes::AGENT_ERROR`], so a guest cannot choose the codes clients see.
pub mod codes {
    /// 400: the request is malformed; the message names the field.
    pub const BAD_REQUEST: &str = "bad_request";
    /// 401: no or wrong bearer token.
    pub const UNAUTHORIZED: &str = "unauthorized";
    /// 403: a foreign `Origin` or a non-loopback `Host`.
    pub const FORBIDDEN: &str = "forbidden";
    /// 404: no such sandbox, command, image or file.
    pub const NOT_FOUND: &str = "not_found";
    /// 409: the sandbox is not in a state that allows this (e.g. exec on a stopped one).
    pub const SANDBOX_NOT_RUNNING: &str = "sandbox_not_running";
    /// 409: the operation conflicts with the current state.
    pub const CONFLICT: &str = "conflict";
    /// 413: a JSON request body larger than `limits::MAX_JSON_BODY`.
    pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
    /// 507: not enough free host memory (or disk) for the sandbox.
    pub const INSUFFICIENT_RESOURCES: &str = "insufficient_resources";
    /// 400: the image is unknown or not built yet.
    pub const IMAGE_NOT_AVAILABLE: &str = "image_not_available";
    /// 503: the requested backend cannot run on this host.
    pub const BACKEND_UNAVAILABLE: &str = "backend_unavailable";
    /// 502: the sandbox's agent did not answer.
    pub const AGENT_UNAVAILABLE: &str = "agent_unavailable";
    /// 502: the sandbox's agent failed in a way it has no code for (or sent one we do not know).
    pub const AGENT_ERROR: &str = "agent_error";
    /// 500: a bug or an unexpected host failure; details are in the daemon's log.
    pub const INTERNAL: &str = "internal";
}
