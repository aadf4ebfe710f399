//! E2B's APIs under `/compat/e2b`, for the `e2b` SDKs: the control plane's REST routes
//! ([`control`]) and, under `/compat/e2b/envd`, envd — the API E2B serves inside each sandbox:
//! the Connect RPCs of `process.Process` ([`process`]) and `filesystem.Filesystem`, and the
//! plain `/files` upload and download ([`filesystem`]).
//!
//! `belljar e2b` points the SDK here (`E2B_API_URL`, `E2B_SANDBOX_URL`) with the daemon's token
//! as its API key. With a sandbox URL set, the SDK names the sandbox of each envd request in the
//! `E2b-Sandbox-Id` header, so one endpoint serves every sandbox. Requests are checked like the
//! rest of the API ([`accept`] turns E2B's credential headers into the daemon's bearer token),
//! then translated onto the daemon's sandbox, command and file services.

mod connect;
mod control;
pub mod error;
mod filesystem;
mod process;
mod setup;
mod snapshots;
mod watch;
pub mod wire;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::IntoResponse;
use base64::Engine;

use self::error::{E2bError, Result};

/// Where the API is served.
pub const PREFIX: &str = "/compat/e2b";

/// Where envd is served, under [`PREFIX`]; `E2B_SANDBOX_URL` points here.
pub const ENVD: &str = "/envd";

/// The header that names the sandbox of an envd request.
const SANDBOX_HEADER: &str = "e2b-sandbox-id";

/// The envd version the layer answers for: new enough that the SDK uses the template's default
/// user, closes stdin and watches recursively, old enough that it sends plain multipart
/// uploads (no octet-stream or metadata headers).
pub const ENVD_VERSION: &str = "0.5.4";

/// Both APIs, and a 404 in E2B's form for anything else under the prefix.
pub fn router() -> Router<crate::http::AppState> {
    control::router()
        .merge(snapshots::router())
        .nest(ENVD, process::router().merge(filesystem::router()))
        .fallback(|| async {
            E2bError::NotFound("No such route in the E2B API".into()).into_response()
        })
}

/// The user an envd request runs as, from its `Authorization: Basic` header (`user:`).
#[derive(Clone, Debug)]
pub struct EnvdUser(pub String);

/// Makes E2B's credentials the daemon's: the SDK sends its API key as `X-API-Key` to the
/// control plane and the `envdAccessToken` the control plane gave it as `X-Access-Token` to
/// envd; both are the daemon's token under `belljar e2b`. envd's `Authorization: Basic`
/// names a user, not a credential, so it is moved into an [`EnvdUser`] extension.
pub fn accept(req: &mut Request) {
    let user = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .map(|b| decode_user(b.trim()));
    if let Some(user) = user {
        req.headers_mut().remove(header::AUTHORIZATION);
        if let Some(user) = user {
            req.extensions_mut().insert(EnvdUser(user));
        }
    }
    let headers = req.headers_mut();
    if headers.contains_key(header::AUTHORIZATION) {
        return;
    }
    let key = ["x-api-key", "x-access-token"]
        .iter()
        .find_map(|h| headers.get(*h).and_then(|v| v.to_str().ok()))
        .map(str::trim)
        .map(str::to_owned);
    if let Some(key) = key
        && let Ok(value) = HeaderValue::from_str(&format!("Bearer {key}"))
    {
        headers.insert(header::AUTHORIZATION, value);
    }
}

fn decode_user(b64: &str) -> Option<String> {
    let raw = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let text = String::from_utf8(raw).ok()?;
    let user = text.split(':').next().unwrap_or_default();
    (!user.is_empty()).then(|| user.to_owned())
}

/// The sandbox an envd request is for.
pub fn sandbox_of(headers: &HeaderMap) -> Result<String> {
    headers
        .get(SANDBOX_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| {
            E2bError::BadRequest(
                "E2b-Sandbox-Id: missing (set E2B_SANDBOX_URL, as `belljar e2b` does)".into(),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_become_the_bearer_and_basic_names_the_user() {
        let mut req = Request::new(axum::body::Body::empty());
        req.headers_mut()
            .insert("x-access-token", HeaderValue::from_static("tok"));
        // base64("root:")
        req.headers_mut().insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic cm9vdDo="),
        );
        accept(&mut req);
        assert_eq!(req.headers()[header::AUTHORIZATION], "Bearer tok");
        assert_eq!(req.extensions().get::<EnvdUser>().unwrap().0, "root");
        assert!(sandbox_of(req.headers()).is_err());
    }
}
