//! `GET /v1/events`: sandbox and command changes as NDJSON or WebSocket text frames, from
//! `?since=seq` (replayed from the store) or from now.

use axum::Router;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use belljar_api::Event;
use futures::{Stream, StreamExt};
use serde::Deserialize;

use super::AppState;
use super::error::ApiError;
use super::extract::ApiQuery;
use super::stream::{ndjson, wants_websocket};

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/events", get(events))
}

#[derive(Deserialize)]
struct EventsQuery {
    #[serde(default)]
    since: Option<u64>,
}

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
