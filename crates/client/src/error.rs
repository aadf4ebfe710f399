//! What can go wrong talking to the daemon, each with a stable code a caller can print or
//! match: the daemon's own `{"error":{"code","message"}}` code for an API error, a local
//! one (`daemon_unavailable`, `connection_lost`, ...) for everything that happened here.

use std::io;

use belljar_api::ErrorCode;
use http::StatusCode;

use crate::ndjson::NdjsonError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon is not reachable.
    #[error("Cannot connect to the daemon at {at}: {source}")]
    Connect { at: String, source: io::Error },
    /// The HTTP exchange failed mid-way.
    #[error("HTTP exchange with the daemon failed: {0}")]
    Http(#[from] hyper::Error),
    /// The WebSocket handshake or a frame failed.
    #[error("WebSocket to the daemon failed: {0}")]
    WebSocket(Box<tokio_tungstenite::tungstenite::Error>),
    /// The daemon answered with an API error (`{"error":{"code","message"}}`).
    #[error("{message}")]
    Api {
        status: u16,
        code: ErrorCode,
        message: String,
    },
    /// An error status without the API's error body (something else answered, or a code
    /// newer than this client).
    #[error("{message}")]
    Status {
        status: u16,
        /// `http_<status>`.
        code: String,
        message: String,
    },
    /// The daemon's answer is not what the API promises.
    #[error("Unexpected answer from the daemon ({what}): {source}")]
    Decode {
        what: String,
        source: serde_json::Error,
    },
    /// A streamed answer (NDJSON) broke off or held a line that is not the promised JSON.
    #[error(transparent)]
    Stream(#[from] NdjsonError),
    /// Building the request failed (a bad path or header).
    #[error("Invalid request: {0}")]
    Request(#[from] http::Error),
}

impl From<tokio_tungstenite::tungstenite::Error> for ClientError {
    fn from(e: tokio_tungstenite::tungstenite::Error) -> Self {
        Self::WebSocket(Box::new(e))
    }
}

impl ClientError {
    /// The stable code printed after the message: the daemon's code, or a local one.
    pub fn code(&self) -> &str {
        match self {
            Self::Api { code, .. } => code.as_str(),
            Self::Status { code, .. } => code,
            Self::Connect { .. } => "daemon_unavailable",
            Self::Http(_) | Self::WebSocket(_) | Self::Stream(_) => "connection_lost",
            Self::Decode { .. } => "bad_response",
            Self::Request(_) => "bad_request",
        }
    }

    /// The HTTP status of an error answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } | Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the daemon answered 404: no such sandbox, command, image or file.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(StatusCode::NOT_FOUND.as_u16())
    }
}

/// The error the daemon sent, or one naming the status when the body is not the API's.
pub fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<belljar_api::ErrorBody>(body) {
        Ok(e) => ClientError::Api {
            status: status.as_u16(),
            code: e.error.code,
            message: e.error.message,
        },
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            ClientError::Status {
                status: status.as_u16(),
                code: format!("http_{}", status.as_u16()),
                message: if text.is_empty() {
                    status.canonical_reason().unwrap_or("error").to_string()
                } else {
                    text.chars().take(300).collect()
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_errors_keep_code_and_message() {
        let e = api_error(
            StatusCode::NOT_FOUND,
            br#"{"error":{"code":"not_found","message":"No sandbox sbx_1"}}"#,
        );
        assert!(matches!(
            e,
            ClientError::Api {
                code: ErrorCode::NotFound,
                ..
            }
        ));
        assert_eq!(e.code(), "not_found");
        assert_eq!(e.status(), Some(404));
        assert!(e.is_not_found());
        assert_eq!(e.to_string(), "No sandbox sbx_1");
    }

    #[test]
    fn non_json_errors_name_the_status() {
        let e = api_error(StatusCode::BAD_GATEWAY, b"");
        assert_eq!(e.code(), "http_502");
        assert_eq!(e.to_string(), "Bad Gateway");
        let e = api_error(StatusCode::NOT_FOUND, b"<html>nope</html>");
        assert!(matches!(e, ClientError::Status { status: 404, .. }));
        assert_eq!(e.to_string(), "<html>nope</html>");
        // A code this client does not know yet is still an error with the status.
        let e = api_error(
            StatusCode::CONFLICT,
            br#"{"error":{"code":"from_the_future","message":"later"}}"#,
        );
        assert_eq!((e.status(), e.code()), (Some(409), "http_409"));
    }
}
