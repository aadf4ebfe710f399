//! Compatibility layers: the REST APIs of cloud sandbox products, served by the daemon so that
//! code written for them runs against local sandboxes unchanged.
//!
//! Each layer only translates: requests become calls to the daemon's own sandbox, command,
//! file and snapshot services (the ones `/v1` uses), never a second way into a sandbox.

pub mod e2b;
pub mod sandbox0;
pub mod vercel;

use axum::Router;

use crate::http::AppState;

/// Every compatibility API, under its own prefix.
pub fn router() -> Router<AppState> {
    Router::new()
        .nest(vercel::PREFIX, vercel::router())
        .nest(sandbox0::PREFIX, sandbox0::router())
        .nest(e2b::PREFIX, e2b::router())
}
