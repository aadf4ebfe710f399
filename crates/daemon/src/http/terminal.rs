//! `GET /v1/sandboxes/{id}/terminal`: an interactive `bash -l` on a PTY over a WebSocket.
//!
//! Binary frames carry terminal bytes both ways; text frames carry [`TerminalMessage`]s
//! (`resize` from the client; `started`, `exit` and `error` from the daemon). The shell is an
//! ordinary PTY command of the sandbox, so its output is also in its command log.

use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use belljar_agent_proto::client::body_from_stream;
use belljar_api::{Invalid, PtySize, TerminalMessage, Validate};
use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::mpsc;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery};
use super::openapi::{Errors, SandboxPath};
use crate::sandbox::Terminal;

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

fn text(msg: &TerminalMessage) -> Message {
    Message::Text(serde_json::to_string(msg).unwrap_or_default().into())
}

async fn run(st: AppState, id: String, term: Terminal, mut socket: WebSocket) {
    let cid = term.command.id.clone();
    let started = TerminalMessage::Started {
        command_id: cid.clone(),
    };
    if socket.send(text(&started)).await.is_err() {
        let _ = term.agent.signal(&term.agent_id, "HUP").await;
        return;
    }
    let mut output = match term.agent.output(&term.agent_id, 0, true).await {
        Ok(o) => o,
        Err(e) => {
            let msg = TerminalMessage::Error {
                code: belljar_api::ErrorCode::AgentUnavailable,
                message: e.to_string(),
            };
            let _ = socket.send(text(&msg)).await;
            return;
        }
    };
    // One long stdin request per terminal; each client frame becomes a chunk of it.
    let (stdin_tx, mut stdin_rx) = mpsc::channel::<Bytes>(64);
    let stdin_body = body_from_stream(futures::stream::poll_fn(move |cx| {
        stdin_rx.poll_recv(cx).map(|o| o.map(Ok))
    }));
    let agent = term.agent.clone();
    let agent_id = term.agent_id.clone();
    tokio::spawn(async move {
        if let Err(e) = agent.write_stdin(&agent_id, stdin_body, true).await {
            tracing::debug!(error = %e, "terminal stdin ended");
        }
    });
    let mut client_gone = false;
    loop {
        tokio::select! {
            line = output.next() => match line {
                Some(Ok(line)) => {
                    if socket.send(Message::Binary(line.bytes().into())).await.is_err() {
                        client_gone = true;
                        break;
                    }
                }
                _ => break,
            },
            msg = socket.recv() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    let _ = stdin_tx.send(b).await;
                }
                Some(Ok(Message::Text(t))) => {
                    match serde_json::from_str::<TerminalMessage>(&t) {
                        Ok(TerminalMessage::Resize { rows, cols }) => {
                            if let Err(e) = st.sandboxes.resize_command(&id, &cid, PtySize { rows, cols }).await {
                                tracing::debug!(error = %e, "terminal resize failed");
                            }
                        }
                        // Typed text is input too, for clients that only send text frames.
                        _ => {
                            let _ = stdin_tx.send(Bytes::from(t.as_str().to_owned())).await;
                        }
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    client_gone = true;
                    break;
                }
            },
        }
    }
    drop(stdin_tx);
    if client_gone {
        let _ = term.agent.signal(&term.agent_id, "HUP").await;
        return;
    }
    let exit = match st.sandboxes.wait_command(&id, &cid).await {
        Ok(c) => TerminalMessage::Exit {
            exit_code: c.exit_code,
            signal: c.signal,
        },
        Err(e) => TerminalMessage::Error {
            code: belljar_api::ErrorCode::Internal,
            message: e.to_string(),
        },
    };
    let _ = socket.send(text(&exit)).await;
    let _ = socket.send(Message::Close(None)).await;
}
