//! `GET /v1/events`: sandbox and command changes as NDJSON or WebSocket text frames, from
//! `?since=seq` (replayed from the store) or from now.

use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::HeaderMap;
use axum::response::Response;
use belljar_api::{Event, Validate};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::ApiQuery;
use super::openapi::Errors;
use super::stream::{ndjson, wants_websocket};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(events))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Replay from after this sequence number; without it, only changes from now on.
    #[serde(default)]
    since: Option<u64>,
}

impl Validate for EventsQuery {}

/// Sandbox and command changes as NDJSON, or text frames on a WebSocket; the answer stays open.
#[utoipa::path(get, path = "/v1/events", operation_id = "events", tag = "daemon", params(EventsQuery),
    responses((status = 200, description = "NDJSON of `Event`", body = Event,
        content_type = "application/x-ndjson"), Errors))]
async fn events(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<EventsQuery>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let stream = st
        .events
        .stream(q.since)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    match ws {
        Ok(ws) if wants_websocket(&headers) => Ok(ws.on_upgrade(move |s| socket(s, stream))),
        _ => Ok(ndjson(stream)),
    }
}

async fn socket(mut socket: WebSocket, events: impl Stream<Item = Event> + Send + 'static) {
    let mut events = Box::pin(events);
    loop {
        tokio::select! {
            e = events.next() => {
                let Some(e) = e else { break };
                let text = serde_json::to_string(&e).unwrap_or_default();
                if socket.send(Message::Text(text.into())).await.is_err() {
                    return;
                }
            }
            msg = socket.recv() => match msg {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
}
