//! `GET /v1/sandboxes/{id}/terminal`: an interactive `bash -l` on a PTY over a WebSocket.
//!
//! Binary frames carry terminal bytes both ways; text frames carry [`TerminalMessage`]s
//! (`resize` from the client; `started`, `exit` and `error` from the daemon). This handler only
//! translates frames; the pump is the sandbox layer's (`Sandboxes::run_terminal`).

use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use belljar_api::{Invalid, PtySize, TerminalMessage, Validate};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery};
use super::openapi::{Errors, SandboxPath};
use crate::sandbox::{Terminal, TerminalFrame};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(terminal))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct TerminalQuery {
    /// Default 24.
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    rows: Option<u16>,
    /// Default 80.
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    cols: Option<u16>,
    /// Default `/workspace`.
    #[serde(default)]
    #[param(min_length = 1, max_length = 4096)]
    cwd: Option<String>,
    /// A root shell.
    #[serde(default)]
    sudo: bool,
}

impl Validate for TerminalQuery {
    fn validate(&self) -> Result<(), Invalid> {
        let cells = belljar_api::limits::MAX_PTY_CELLS;
        belljar_api::limits::range("rows", self.rows, 1, cells)?;
        belljar_api::limits::range("cols", self.cols, 1, cells)?;
        self.cwd
            .as_deref()
            .map_or(Ok(()), |c| belljar_api::limits::path("cwd", c))
    }
}

/// An interactive `bash -l` on a pseudo-terminal, over a WebSocket only (binary frames are
/// terminal bytes, text frames `TerminalMessage`s).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/terminal", operation_id = "terminal", tag = "commands",
    params(SandboxPath, TerminalQuery),
    responses((status = 101, description = "Switching to the WebSocket protocol"), Errors))]
async fn terminal(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiQuery(q): ApiQuery<TerminalQuery>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let ws = ws.map_err(|_| {
        ApiError::BadRequest("The terminal needs a WebSocket upgrade request".into())
    })?;
    let size = PtySize {
        rows: q.rows.unwrap_or(24),
        cols: q.cols.unwrap_or(80),
    };
    let term = st
        .sandboxes
        .start_terminal(&id, size, q.cwd, q.sudo)
        .await?;
    Ok(ws.on_upgrade(move |socket| run(st, id, term, socket)))
}

/// Frames in: binary frames are typed bytes; a text frame is a `TerminalMessage` (`resize`),
/// or typed text for clients that only send text. Pings, pongs and close frames are none.
fn frame_in(msg: Message) -> Option<TerminalFrame> {
    match msg {
        Message::Binary(b) => Some(TerminalFrame::Bytes(b)),
        Message::Text(t) => Some(match serde_json::from_str(&t) {
            Ok(m @ TerminalMessage::Resize { .. }) => TerminalFrame::Message(m),
            _ => TerminalFrame::Bytes(Bytes::from(t.as_str().to_owned())),
        }),
        _ => None,
    }
}

/// Frames out: bytes as binary frames, messages as JSON text frames.
fn frame_out(frame: TerminalFrame) -> Message {
    match frame {
        TerminalFrame::Bytes(b) => Message::Binary(b),
        TerminalFrame::Message(m) => {
            Message::Text(serde_json::to_string(&m).unwrap_or_default().into())
        }
    }
}

async fn run(st: AppState, id: String, term: Terminal, socket: WebSocket) {
    let (sink, stream) = socket.split();
    // The input ends at the socket's end or its first error: the client is gone.
    let input = stream
        .take_while(|m| std::future::ready(m.is_ok()))
        .filter_map(|m| std::future::ready(m.ok().and_then(frame_in)));
    let mut output = sink.with(|f| std::future::ready(Ok::<_, axum::Error>(frame_out(f))));
    st.sandboxes
        .run_terminal(&id, term, Box::pin(input), &mut output)
        .await;
    let _ = output.into_inner().send(Message::Close(None)).await;
}
