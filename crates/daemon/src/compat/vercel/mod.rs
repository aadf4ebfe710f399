//! Vercel Sandbox's REST API under `/compat/vercel`, for the `@vercel/sandbox` npm SDK:
//! the 1.x line's `/v1/sandboxes` routes ([`v1`]) and the 3.x line's `/v2` (and `/v3`
//! create) routes of named sandboxes and their sessions ([`v2`]).
//!
//! The SDK talks to `https://vercel.com/api`; `belljar vercel` points it here (a Node preload
//! rewrites those URLs) and hands it a credential the daemon signed ([`token`]). Requests are
//! checked like the rest of the API (the bearer token over TCP), then translated: a Vercel
//! sandbox (1.x) or session (3.x) is a daemon sandbox with the same id, a command is a daemon
//! command, a snapshot a daemon snapshot ([`lifecycle`], [`exec`], [`files`]); a 3.x named
//! sandbox is the newest daemon sandbox of that name. [`runtime`] makes the environment
//! Vercel documents (runtimes, user, working directory) real in the daemon's images.

pub mod error;
mod exec;
mod files;
mod lifecycle;
pub mod policy;
pub mod runtime;
pub mod token;
mod v1;
mod v2;
pub mod wire;

use axum::Router;
use axum::extract::{FromRequest, Request};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use self::error::VercelError;
use crate::http::AppState;

/// Where the API is served.
pub const PREFIX: &str = "/compat/vercel";

/// The Vercel API: both SDK lines, and a JSON 404 for anything else under the prefix.
pub fn router() -> Router<AppState> {
    v1::router()
        .merge(v2::router())
        .route(CREDENTIALS, axum::routing::get(credentials))
        .fallback(|| async {
            VercelError::NotFound("No such route in the Vercel API".into()).into_response()
        })
}

/// Where `belljar vercel` gets the credential it hands the SDK. Like every route here it
/// needs the daemon's token over TCP (the Unix socket is the user's own).
pub const CREDENTIALS: &str = "/belljar/credentials";

/// A JWT for the SDK (`VERCEL_OIDC_TOKEN`), signed under the daemon's token.
async fn credentials(axum::extract::State(st): axum::extract::State<AppState>) -> Response {
    axum::Json(serde_json::json!({
        "token": token::mint(st.auth.token(), token::now(), st.vercel_token_lifetime),
        "teamId": token::TEAM,
        "projectId": token::PROJECT,
    }))
    .into_response()
}

/// A JSON body as the SDK sends it (an empty body is `{}`), at most `MAX_JSON_BODY` bytes;
/// fields a newer SDK adds are ignored, as Vercel's API ignores them.
pub struct VJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for VJson<T> {
    type Rejection = VercelError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(VJson(super::json_body(req).await?))
    }
}

/// A query string; a malformed one is a `bad_request` naming it.
pub struct VQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S> for VQuery<T> {
    type Rejection = VercelError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| VQuery(q.0))
            .map_err(|e| VercelError::BadRequest(format!("query: {}", e.body_text())))
    }
}

/// Path parameters; a malformed one is a `bad_request`.
pub struct VPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> axum::extract::FromRequestParts<S> for VPath<T> {
    type Rejection = VercelError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| VPath(p.0))
            .map_err(|e| VercelError::BadRequest(format!("path: {}", e.body_text())))
    }
}
