//! Compatibility layers: the REST APIs of cloud sandbox products, served by the daemon so that
//! code written for them runs against local sandboxes unchanged.
//!
//! Each layer only translates: requests become calls to the daemon's own sandbox, command,
//! file and snapshot services (the ones `/v1` uses), never a second way into a sandbox.

pub mod e2b;
pub mod sandbox0;
pub mod vercel;

use axum::Router;
use axum::extract::Request;
use belljar_api::limits::MAX_JSON_BODY;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;

use crate::http::AppState;
use crate::http::error::ApiError;

/// Every compatibility API, under its own prefix.
pub fn router() -> Router<AppState> {
    Router::new()
        .nest(vercel::PREFIX, vercel::router())
        .nest(sandbox0::PREFIX, sandbox0::router())
        .nest(e2b::PREFIX, e2b::router())
}

/// How much of an oversized JSON body is read and dropped before the 413. A connection closed
/// with unread data is reset, and the client (Node's fetch: "other side closed") loses the
/// answer with it; past this much, the answer may be lost rather than read on for ever.
const DRAIN_LIMIT: usize = 16 << 20;

/// A JSON body as the products' SDKs send it (an empty body is `{}`), at most
/// [`MAX_JSON_BODY`] bytes; fields a newer SDK adds are ignored, as the products ignore them.
pub(crate) async fn json_body<T: DeserializeOwned>(req: Request) -> Result<T, ApiError> {
    let mut body = req.into_body();
    let mut bytes = Vec::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::BadRequest(format!("body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen = seen.saturating_add(data.len());
        if seen > DRAIN_LIMIT {
            break;
        }
        if seen <= MAX_JSON_BODY {
            bytes.extend_from_slice(&data);
        }
    }
    if seen > MAX_JSON_BODY {
        return Err(ApiError::PayloadTooLarge(MAX_JSON_BODY));
    }
    crate::http::extract::parse_json(&bytes)
}
