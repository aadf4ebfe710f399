//! Commands through the Vercel layer: run (detached, or `wait` with an NDJSON answer), get
//! (and wait), kill, and the NDJSON output stream, over the daemon's command service.
//!
//! Commands run as [`runtime::USER`] in [`runtime::CWD`] unless they ask for sudo (root) or
//! another directory. The daemon keeps output as NDJSON lines of its own; they are re-framed
//! as Vercel's `{ "stream", "data" }` lines as they arrive.

use std::convert::Infallible;
use std::io;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use belljar_api::{KillCommand, RunCommand};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::error::{Result, VercelError};
use super::runtime;
use super::wire::{ErrorData, KillRequest, Line, LogError, LogLine, RunRequest, WireCommand};
use crate::http::AppState;
use crate::sandbox::SandboxError;

/// `{ "command": ... }`, the shape of every command answer.
#[derive(Serialize)]
pub struct CommandBody {
    pub command: WireCommand,
}

/// The longest command timeout a 3.x request may ask for (a day).
const MAX_COMMAND_TIMEOUT_MS: u64 = 24 * 3600 * 1000;

/// Runs `req` in sandbox `id`.
pub async fn run(st: &AppState, id: &str, req: RunRequest, line: Line) -> Result<Response> {
    if req.command.is_empty() {
        return Err(VercelError::BadRequest("command: must not be empty".into()));
    }
    let cwd = runtime::resolve(".", req.cwd.as_deref())?;
    let mut argv = vec![req.command];
    argv.extend(req.args);
    let run = RunCommand {
        argv,
        cwd: Some(cwd),
        env: req.env,
        sudo: req.sudo,
        detached: true,
        pty: None,
        stdin: false,
    };
    belljar_api::Validate::validate(&run).map_err(|e| VercelError::BadRequest(e.to_string()))?;
    let sandboxes = st.sandboxes.clone();
    let sid = id.to_owned();
    // In its own task: a client that goes away cannot leave the command half recorded.
    let command = tokio::spawn(async move {
        sandboxes
            .run_command_as(&sid, run, None, Some(runtime::USER.to_owned()))
            .await
    })
    .await
    .map_err(|e| VercelError::Api(crate::http::error::ApiError::Internal(e.to_string())))??;
    if let Some(ms) = req.timeout {
        crate::compat::kill_after(
            &st.sandboxes,
            &command.sandbox_id,
            &command.id,
            Duration::from_millis(ms.min(MAX_COMMAND_TIMEOUT_MS)),
        );
    }
    let first = CommandBody {
        command: WireCommand::new(&command, line),
    };
    if !req.wait {
        return Ok(Json(first).into_response());
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    let st = st.clone();
    let with_logs = req.logs && line == Line::V2;
    tokio::spawn(async move {
        if tx.send(Ok(json_line(&first))).await.is_err() {
            return;
        }
        let (sid, cid) = (command.sandbox_id.clone(), command.id.clone());
        if with_logs && forward_logs(&st, &sid, &cid, &tx).await.is_err() {
            return;
        }
        let last = match st.sandboxes.wait_command(&sid, &cid).await {
            Ok(c) => json_line(&CommandBody {
                command: WireCommand::new(&c, line),
            }),
            Err(e) => json_line(&stream_error(&e.into())),
        };
        let _ = tx.send(Ok(last)).await;
    });
    Ok(ndjson(rx))
}

/// A command, once it has ended when `wait`.
pub async fn get(st: &AppState, id: &str, cid: &str, wait: bool, line: Line) -> Result<Response> {
    let command = if wait {
        st.sandboxes.wait_command(id, cid).await?
    } else {
        st.sandboxes.command(id, cid)?
    };
    Ok(Json(CommandBody {
        command: WireCommand::new(&command, line),
    })
    .into_response())
}

/// Sends a signal (a number, as the SDK sends it, or a name; default TERM).
pub async fn kill(
    st: &AppState,
    id: &str,
    cid: &str,
    req: KillRequest,
    line: Line,
) -> Result<Response> {
    let signal = match req.signal {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        Some(serde_json::Value::String(s)) => Some(s),
        Some(_) => {
            return Err(VercelError::BadRequest(
                "signal: must be a number or a name".into(),
            ));
        }
    };
    let command = st
        .sandboxes
        .kill_command(id, cid, KillCommand { signal })
        .await?;
    Ok(Json(CommandBody {
        command: WireCommand::new(&command, line),
    })
    .into_response())
}

/// The command's output from its start, until it ends.
pub fn logs(st: &AppState, id: &str, cid: &str) -> Result<Response> {
    // Checked before the answer starts, so that a wrong id is a 404 and not a stream error.
    st.sandboxes.command(id, cid)?;
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    let (st, id, cid) = (st.clone(), id.to_owned(), cid.to_owned());
    tokio::spawn(async move {
        let _ = forward_logs(&st, &id, &cid, &tx).await;
    });
    Ok(ndjson(rx))
}

/// Sends the command's output as Vercel log lines; an error line when it cannot be read.
/// `Err` when the client went away.
async fn forward_logs(
    st: &AppState,
    id: &str,
    cid: &str,
    tx: &mpsc::Sender<Result<Bytes, Infallible>>,
) -> Result<(), ()> {
    let stream = match st.sandboxes.command_logs(id, cid, true) {
        Ok(s) => s,
        Err(e) => {
            let _ = tx.send(Ok(json_line(&stream_error(&e.into())))).await;
            return Ok(());
        }
    };
    let mut lines = std::pin::pin!(split_lines(stream));
    while let Some(line) = lines.next().await {
        let out = match line {
            Ok(raw) => match vercel_line(&raw) {
                Some(l) => json_line(&l),
                None => continue,
            },
            Err(e) => {
                let e = VercelError::from(SandboxError::Io(e));
                let _ = tx.send(Ok(json_line(&stream_error(&e)))).await;
                return Ok(());
            }
        };
        tx.send(Ok(out)).await.map_err(|_| ())?;
    }
    Ok(())
}

/// The daemon's log line as Vercel's; output that is not UTF-8 is passed on lossily, since
/// Vercel's lines carry text.
fn vercel_line(raw: &[u8]) -> Option<LogLine<'static>> {
    let line: belljar_api::LogLine = serde_json::from_slice(raw).ok()?;
    let data = match (line.data, line.data_base64) {
        (Some(d), _) => d,
        (None, Some(b)) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(b).ok()?;
            String::from_utf8_lossy(&bytes).into_owned()
        }
        (None, None) => return None,
    };
    let stream = match line.stream {
        belljar_api::Stream::Stdout => "stdout",
        belljar_api::Stream::Stderr => "stderr",
    };
    Some(LogLine { stream, data })
}

fn stream_error(e: &VercelError) -> LogError {
    let (_, code, message) = e.parts();
    LogError {
        stream: "error",
        data: ErrorData {
            code: code.to_owned(),
            message,
        },
    }
}

/// Whole lines (without their `\n`) of a byte stream whose chunks may split them.
fn split_lines(
    stream: impl Stream<Item = io::Result<Bytes>> + Send + 'static,
) -> impl Stream<Item = io::Result<Vec<u8>>> + Send + 'static {
    let stream = Box::pin(stream);
    futures::stream::unfold(
        (stream, Vec::<u8>::new(), false),
        |(mut stream, mut buf, mut done)| async move {
            loop {
                if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let mut line: Vec<u8> = buf.drain(..=pos).collect();
                    line.pop();
                    return Some((Ok(line), (stream, buf, done)));
                }
                if done {
                    if buf.is_empty() {
                        return None;
                    }
                    let rest = std::mem::take(&mut buf);
                    return Some((Ok(rest), (stream, buf, true)));
                }
                match stream.next().await {
                    Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                    Some(Err(e)) => {
                        buf.clear();
                        return Some((Err(e), (stream, buf, true)));
                    }
                    None => done = true,
                }
            }
        },
    )
}

fn json_line<T: Serialize>(value: &T) -> Bytes {
    let mut line = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    line.push(b'\n');
    Bytes::from(line)
}

/// An `application/x-ndjson` answer of the lines sent to `rx`.
fn ndjson(rx: mpsc::Receiver<Result<Bytes, Infallible>>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(ReceiverStream::new(rx)),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_split_across_chunks_are_joined() {
        let chunks = ["{\"a\":", "1}\n{\"b\"", ":2}\n", "tail"]
            .map(|c| Ok(Bytes::from_static(c.as_bytes())));
        let lines: Vec<_> = split_lines(futures::stream::iter(chunks))
            .map(|l| String::from_utf8(l.unwrap()).unwrap())
            .collect()
            .await;
        assert_eq!(lines, ["{\"a\":1}", "{\"b\":2}", "tail"]);
    }

    #[test]
    fn daemon_lines_become_vercel_lines() {
        let l = vercel_line(br#"{"stream":"stderr","data":"oops\n","ts":1}"#).unwrap();
        assert_eq!((l.stream, l.data.as_str()), ("stderr", "oops\n"));
        let l = vercel_line(br#"{"stream":"stdout","data_base64":"/2hp","ts":1}"#).unwrap();
        assert_eq!(l.data, "\u{fffd}hi");
        assert!(vercel_line(b"not json").is_none());
    }
}
