//! Helpers for streamed answers and bodies: NDJSON responses, and request bodies handed on to
//! the agent as they arrive.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use belljar_agent_proto::client::{RequestBody, body_from_stream};
use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use serde::Serialize;

/// An `application/x-ndjson` response, one JSON value per line.
pub fn ndjson<T, S>(items: S) -> Response
where
    T: Serialize,
    S: Stream<Item = T> + Send + 'static,
{
    let lines = items.map(|item| {
        let mut line = serde_json::to_vec(&item).unwrap_or_else(|_| b"{}".to_vec());
        line.push(b'\n');
        Ok::<_, Infallible>(Bytes::from(line))
    });
    (
        [(header::CONTENT_TYPE, belljar_api::routes::NDJSON)],
        Body::from_stream(lines),
    )
        .into_response()
}

/// A request body streamed on to the agent.
pub fn forward_body(body: Body) -> RequestBody {
    body_from_stream(body.into_data_stream().map_err(std::io::Error::other))
}

/// Whether the request asks for a WebSocket.
pub fn wants_websocket(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}
