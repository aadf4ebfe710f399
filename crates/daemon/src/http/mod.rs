//! The HTTP API: one application state, one router per resource, merged here.
//!
//! The same router serves the Unix socket (the user's own, no credentials) and 127.0.0.1
//! (Host/Origin checks and credentials, see [`auth`]); [`crate::server`] adds the layer that
//! tells them apart.

pub mod auth;
mod build;
mod commands;
pub mod error;
mod events;
pub mod extract;
mod files;
mod info;
mod mounts;
mod network;
pub mod openapi;
mod pause;
mod sandboxes;
mod snapshots;
mod spool;
mod stream;
pub mod tcp;
mod templates;
mod terminal;
mod ui;
mod usage;
mod volumes;

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::events::Events;
use crate::images::Images;
use crate::sandbox::Sandboxes;

/// Everything a handler may need; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub sandboxes: Sandboxes,
    pub images: Images,
    pub events: Arc<Events>,
    pub auth: Arc<auth::Auth>,
    /// The built web UI (`index.html` and assets).
    pub ui_dir: PathBuf,
    /// The daemon's directories as clients see them (for `GET /v1/doctor`).
    pub dirs: belljar_client::Paths,
    /// The binary `GET /v1/doctor` re-runs for its probe children: `belljard` itself, whose
    /// `main` answers `belljar_doctor::PROBE_ENV`.
    pub probe_exe: PathBuf,
    /// Seconds a JWT of the Vercel layer lives ([`crate::compat::vercel::token::LIFETIME_SECS`]
    /// but in tests).
    pub vercel_token_lifetime: i64,
}

/// Every `/v1` route with its OpenAPI operation. Only routes added here (through
/// `utoipa_axum::routes!`) are served under `/v1`, so each is in the document.
pub fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(info::router())
        .merge(build::router())
        .merge(sandboxes::router())
        .merge(snapshots::router())
        .merge(pause::router())
        .merge(usage::router())
        .merge(mounts::router())
        .merge(volumes::router())
        .merge(templates::router())
        .merge(commands::router())
        .merge(files::router())
        .merge(terminal::router())
        .merge(events::router())
        .merge(network::router())
        .merge(ui::api_router())
}

/// The whole API and the UI.
pub fn router(state: AppState) -> Router {
    let (api, _document) = api_router().split_for_parts();
    api.merge(ui::router())
        .merge(crate::compat::router())
        .fallback(ui::fallback)
        .layer(axum::middleware::from_fn(extract::json_rejections))
        .with_state(state)
}
