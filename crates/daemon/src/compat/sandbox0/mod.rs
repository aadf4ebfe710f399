//! Sandbox0's Sandbox API under `/compat/sandbox0`, for the `sandbox0` SDKs (Python 0.10.x):
//! the REST routes under `/api/v1/sandboxes`, and the WebSockets of contexts and file
//! watches.
//!
//! The SDK takes a base URL for self-hosted deployments (`SANDBOX0_BASE_URL`) and a bearer
//! token (`SANDBOX0_TOKEN`); `belljar sandbox0` sets them to this prefix on the daemon's TCP
//! address and to the daemon's own token, so requests are checked like the rest of the API.
//! Then they are translated onto the daemon's services: a Sandbox0 sandbox is a persistent
//! daemon sandbox with the same id ([`sandboxes`]), whose pause is a stop (the root
//! filesystem is snapshotted, the processes end) and whose resume is a start; a context is a
//! daemon command, a REPL context a long-lived interpreter fed through its stdin
//! ([`contexts`], [`repl`]); files, network policy and services, rootfs snapshots and logs
//! go to the daemon's files, network, snapshot and command services ([`files`], [`network`],
//! [`snapshots`], [`logs`]). What the layer keeps of its own (REPL contexts, snapshot names)
//! lives in [`Layer`], in memory.

mod contexts;
pub mod error;
mod files;
mod logs;
mod network;
mod repl;
mod sandboxes;
mod snapshots;
pub mod wire;

use std::sync::Arc;

use axum::extract::{FromRequest, Request};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::de::DeserializeOwned;

use self::error::Sandbox0Error;
use crate::http::AppState;
use crate::http::error::ApiError;

/// Where the API is served.
pub const PREFIX: &str = "/compat/sandbox0";

/// What the layer keeps besides the daemon's records, shared by its handlers.
#[derive(Default)]
pub struct Layer {
    pub contexts: contexts::Contexts,
    pub snapshots: snapshots::Names,
}

/// The handlers' view of the layer.
pub type Shared = Extension<Arc<Layer>>;

/// The Sandbox0 API, and a JSON 404 for anything else under the prefix.
pub fn router() -> Router<AppState> {
    let sb = "/api/v1/sandboxes/{id}";
    Router::new()
        .route(
            "/api/v1/sandboxes",
            post(sandboxes::claim).get(sandboxes::list),
        )
        .route(
            sb,
            get(sandboxes::get_one)
                .put(sandboxes::update)
                .delete(sandboxes::delete),
        )
        .route(&format!("{sb}/status"), get(sandboxes::status))
        .route(&format!("{sb}/refresh"), post(sandboxes::refresh))
        .route(&format!("{sb}/pause"), post(sandboxes::pause))
        .route(&format!("{sb}/resume"), post(sandboxes::resume))
        .route(
            &format!("{sb}/network"),
            get(network::get_policy).put(network::put_policy),
        )
        .route(
            &format!("{sb}/services"),
            get(network::get_services).put(network::put_services),
        )
        .route(
            &format!("{sb}/contexts"),
            post(contexts::create).get(contexts::list),
        )
        .route(
            &format!("{sb}/contexts/{{ctx}}"),
            get(contexts::get_one).delete(contexts::delete),
        )
        .route(&format!("{sb}/contexts/{{ctx}}/exec"), post(contexts::exec))
        .route(
            &format!("{sb}/contexts/{{ctx}}/input"),
            post(contexts::input),
        )
        .route(
            &format!("{sb}/contexts/{{ctx}}/resize"),
            post(contexts::resize),
        )
        .route(
            &format!("{sb}/contexts/{{ctx}}/signal"),
            post(contexts::signal),
        )
        .route(&format!("{sb}/contexts/{{ctx}}/ws"), get(contexts::ws))
        .route(
            &format!("{sb}/files"),
            get(files::read).post(files::write).delete(files::remove),
        )
        .route(&format!("{sb}/files/stat"), get(files::stat))
        .route(&format!("{sb}/files/list"), get(files::list))
        .route(&format!("{sb}/files/move"), post(files::move_path))
        .route(&format!("{sb}/files/watch"), get(files::watch))
        .route(
            &format!("{sb}/snapshots"),
            post(snapshots::create).get(snapshots::list),
        )
        .route(
            "/api/v1/sandbox-rootfs-snapshots/{snapshot}",
            get(snapshots::get_one).delete(snapshots::delete),
        )
        .route(&format!("{sb}/rootfs/restore"), post(snapshots::restore))
        .route(&format!("{sb}/fork"), post(snapshots::fork))
        .route(&format!("{sb}/logs"), get(logs::logs))
        .fallback(|| async {
            Sandbox0Error::NotFound("No such route in the Sandbox0 API".into()).into_response()
        })
        .layer(Extension(Arc::new(Layer::default())))
}

/// Runs `fut` in its own task, so that a client that goes away cannot leave a change half
/// done.
pub(crate) async fn detached<T: Send + 'static>(
    fut: impl Future<Output = error::Result<T>> + Send + 'static,
) -> error::Result<T> {
    tokio::spawn(fut)
        .await
        .map_err(|e| Sandbox0Error::Api(ApiError::Internal(e.to_string())))?
}

/// A JSON body as the SDK sends it (an empty body is `{}`), at most `MAX_JSON_BODY` bytes.
pub struct S0Json<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for S0Json<T> {
    type Rejection = Sandbox0Error;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(S0Json(super::json_body(req).await?))
    }
}

/// A query string; a malformed one is a `bad_request` naming it.
pub struct S0Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S> for S0Query<T> {
    type Rejection = Sandbox0Error;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| S0Query(q.0))
            .map_err(|e| Sandbox0Error::BadRequest(format!("query: {}", e.body_text())))
    }
}

/// Path parameters; a malformed one is a `bad_request`.
pub struct S0Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> axum::extract::FromRequestParts<S> for S0Path<T> {
    type Rejection = Sandbox0Error;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| S0Path(p.0))
            .map_err(|e| Sandbox0Error::BadRequest(format!("path: {}", e.body_text())))
    }
}
