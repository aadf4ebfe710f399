//! envd's `process.Process` service: Start (a streamed command, pipes or a PTY), Connect (to a
//! running one), List, SendInput, CloseStdin, SendSignal and Update (a PTY's size), over the
//! daemon's command service.
//!
//! E2B names processes by a numeric pid, the daemon names commands by id, so the layer hands
//! out pids of its own ([`Pids`]); they live as long as the daemon. A stream's events are the
//! command's start, its output as it arrives (base64, as protobuf's JSON writes bytes), a
//! keepalive while it is quiet, and its end with the exit code; a client that goes away leaves
//! the command running, as envd does.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use base64::Engine;
use belljar_api::{CommandStatus, KillCommand, PtySize, RunCommand};
use bytes::Bytes;
use futures::TryStreamExt;
use tokio::io::AsyncBufReadExt;
use tokio_util::io::StreamReader;

use super::connect::{self, Sender};
use super::error::{E2bError, Result};
use super::wire::{
    DataEvent, Empty, EndEvent, ListResponse, ProcessConfig, ProcessEvent, ProcessEventBody,
    ProcessInfo, ProcessSelector, SelectRequest, SendInputRequest, SendSignalRequest, StartRequest,
    UpdateRequest,
};
use super::{EnvdUser, sandbox_of, setup};
use crate::http::AppState;
use crate::http::error::ApiError;

/// How long a stream may be quiet before a keepalive goes out.
const KEEPALIVE: Duration = Duration::from_secs(30);

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/process.Process/Start", post(start))
        .route("/process.Process/Connect", post(connect_to))
        .route("/process.Process/List", post(list))
        .route("/process.Process/SendInput", post(send_input))
        .route("/process.Process/CloseStdin", post(close_stdin))
        .route("/process.Process/SendSignal", post(send_signal))
        .route("/process.Process/Update", post(update))
        .route("/process.Process/StreamInput", post(stream_input))
}

/// A command the layer gave a pid.
#[derive(Clone)]
struct Entry {
    sandbox: String,
    command: String,
    tag: Option<String>,
    config: ProcessConfig,
    pty: bool,
}

/// The pids handed out, daemon-wide.
#[derive(Default)]
struct Pids {
    next: u32,
    entries: HashMap<u32, Entry>,
}

static PIDS: LazyLock<Mutex<Pids>> = LazyLock::new(Mutex::default);

fn pids() -> std::sync::MutexGuard<'static, Pids> {
    PIDS.lock().unwrap_or_else(|e| e.into_inner())
}

fn register(entry: Entry) -> u32 {
    let mut p = pids();
    p.next = p.next.wrapping_add(1).max(1000);
    let pid = p.next;
    p.entries.insert(pid, entry);
    pid
}

/// Drops the pids of a deleted sandbox.
pub fn forget(sandbox: &str) {
    pids().entries.retain(|_, e| e.sandbox != sandbox);
}

/// The command a selector names in `sandbox`.
fn select(sandbox: &str, sel: &ProcessSelector) -> Result<(u32, Entry)> {
    let p = pids();
    let found = match (sel.pid, sel.tag.as_deref()) {
        (Some(pid), _) => p.entries.get(&pid).map(|e| (pid, e.clone())),
        (None, Some(tag)) => p
            .entries
            .iter()
            .filter(|(_, e)| e.tag.as_deref() == Some(tag))
            .max_by_key(|(pid, _)| **pid)
            .map(|(pid, e)| (*pid, e.clone())),
        (None, None) => {
            return Err(E2bError::BadRequest("process: give a pid or a tag".into()));
        }
    };
    found
        .filter(|(_, e)| e.sandbox == sandbox)
        .ok_or_else(|| E2bError::NotFound(format!("process {sel:?} not found")))
}

fn internal(e: impl std::fmt::Display) -> E2bError {
    E2bError::Api(ApiError::Internal(e.to_string()))
}

async fn start(
    State(st): State<AppState>,
    headers: HeaderMap,
    user: Option<Extension<EnvdUser>>,
    body: Body,
) -> Response {
    match start_inner(&st, &headers, user.map(|u| u.0.0), body).await {
        Ok(r) => r,
        Err(e) => connect::stream_error(e).await,
    }
}

async fn start_inner(
    st: &AppState,
    headers: &HeaderMap,
    user: Option<String>,
    body: Body,
) -> Result<Response> {
    let sandbox = sandbox_of(headers)?;
    let req: StartRequest = connect::stream_request(body).await?;
    if req.process.cmd.is_empty() {
        return Err(E2bError::BadRequest(
            "process.cmd: must not be empty".into(),
        ));
    }
    let user = setup::user(user.as_deref());
    let cwd = match req.process.cwd.as_deref().filter(|c| !c.is_empty()) {
        Some(c) => setup::resolve(c, &setup::home(&user))?,
        None => setup::home(&user),
    };
    let pty = match req.pty.as_ref() {
        None => None,
        Some(p) => {
            let size = p.size.as_ref();
            Some(PtySize {
                rows: size.map_or(24, |s| u16::try_from(s.rows).unwrap_or(u16::MAX)),
                cols: size.map_or(80, |s| u16::try_from(s.cols).unwrap_or(u16::MAX)),
            })
        }
    };
    let mut argv = vec![req.process.cmd.clone()];
    argv.extend(req.process.args.iter().cloned());
    let run = RunCommand {
        argv,
        cwd: Some(cwd.clone()),
        env: (!req.process.envs.is_empty()).then(|| req.process.envs.clone()),
        sudo: false,
        detached: true,
        stdin: req.stdin.unwrap_or(false) || pty.is_some(),
        pty,
    };
    belljar_api::Validate::validate(&run).map_err(|e| E2bError::BadRequest(e.to_string()))?;
    let (sandboxes, sid) = (st.sandboxes.clone(), sandbox.clone());
    // In its own task: a client that goes away cannot leave the command half recorded.
    let command =
        tokio::spawn(async move { sandboxes.run_command_as(&sid, run, None, Some(user)).await })
            .await
            .map_err(internal)??;
    let entry = Entry {
        sandbox,
        command: command.id,
        tag: req.tag,
        config: ProcessConfig {
            cwd: Some(cwd),
            ..req.process
        },
        pty: req.pty.is_some(),
    };
    let pid = register(entry.clone());
    Ok(follow(st, pid, entry))
}

async fn connect_to(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let found = async {
        let sandbox = sandbox_of(&headers)?;
        let req: SelectRequest = connect::stream_request(body).await?;
        let (pid, entry) = select(&sandbox, &req.process)?;
        let c = st.sandboxes.command(&entry.sandbox, &entry.command)?;
        if c.status == CommandStatus::Exited || c.status == CommandStatus::Lost {
            return Err(E2bError::NotFound(format!("process {pid} has ended")));
        }
        Ok((pid, entry))
    }
    .await;
    match found {
        Ok((pid, entry)) => follow(&st, pid, entry),
        Err(e) => connect::stream_error(e).await,
    }
}

/// The stream of a command's events.
fn follow(st: &AppState, pid: u32, entry: Entry) -> Response {
    let (tx, response) = connect::stream();
    let st = st.clone();
    tokio::spawn(async move {
        if !tx
            .send(&ProcessEventBody {
                event: ProcessEvent::Start { pid },
            })
            .await
        {
            return;
        }
        match pump(&st, &entry, &tx).await {
            Ok(true) => tx.end(None).await,
            Ok(false) => {}
            Err(e) => tx.end(Some(&e)).await,
        }
    });
    response
}

/// Sends the output and the end; `Ok(false)` when the client went away.
async fn pump(st: &AppState, entry: &Entry, tx: &Sender) -> Result<bool> {
    let logs = st
        .sandboxes
        .command_logs(&entry.sandbox, &entry.command, true)?;
    let mut lines = StreamReader::new(Box::pin(logs.map_err(std::io::Error::other)));
    // `read_until` keeps what it read when the keepalive wins the race, so the line is
    // cleared only once it has been handled.
    let mut line = Vec::new();
    loop {
        let read = tokio::select! {
            r = lines.read_until(b'\n', &mut line) => r.map_err(internal)?,
            () = tokio::time::sleep(KEEPALIVE) => {
                if !tx.send(&ProcessEventBody { event: ProcessEvent::Keepalive(Empty {}) }).await {
                    return Ok(false);
                }
                continue;
            }
        };
        if read == 0 {
            break;
        }
        let event = data_event(&line, entry.pty);
        line.clear();
        if let Some(event) = event
            && !tx.send(&ProcessEventBody { event }).await
        {
            return Ok(false);
        }
    }
    let c = st
        .sandboxes
        .wait_command(&entry.sandbox, &entry.command)
        .await?;
    let (exit_code, status) = match (c.exit_code, c.signal) {
        (Some(code), _) => (code, format!("exit status {code}")),
        (None, Some(sig)) => (-1, format!("signal: {sig}")),
        (None, None) => (-1, "lost".to_owned()),
    };
    let end = EndEvent {
        exit_code,
        exited: c.exit_code.is_some(),
        status,
        error: c.status_reason.filter(|_| c.status == CommandStatus::Lost),
    };
    Ok(tx
        .send(&ProcessEventBody {
            event: ProcessEvent::End(end),
        })
        .await)
}

/// The daemon's log line as envd's data event.
fn data_event(raw: &[u8], pty: bool) -> Option<ProcessEvent> {
    let line: belljar_api::LogLine = serde_json::from_slice(raw).ok()?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let data = match (line.data, line.data_base64) {
        (Some(d), _) => b64.encode(d.as_bytes()),
        (None, Some(b)) => b,
        (None, None) => return None,
    };
    Some(ProcessEvent::Data(match (pty, line.stream) {
        (true, _) => DataEvent::Pty(data),
        (false, belljar_api::Stream::Stdout) => DataEvent::Stdout(data),
        (false, belljar_api::Stream::Stderr) => DataEvent::Stderr(data),
    }))
}

/// Runs a unary handler and answers in Connect's form.
async fn unary<F>(f: F) -> Response
where
    F: Future<Output = Result<Response>>,
{
    f.await.unwrap_or_else(E2bError::into_connect_response)
}

async fn list(State(st): State<AppState>, headers: HeaderMap) -> Response {
    unary(async {
        let sandbox = sandbox_of(&headers)?;
        st.sandboxes.get(&sandbox)?;
        let mine: Vec<(u32, Entry)> = pids()
            .entries
            .iter()
            .filter(|(_, e)| e.sandbox == sandbox)
            .map(|(p, e)| (*p, e.clone()))
            .collect();
        let mut processes = Vec::new();
        for (pid, e) in mine {
            let running = st
                .sandboxes
                .command(&e.sandbox, &e.command)
                .is_ok_and(|c| matches!(c.status, CommandStatus::Running | CommandStatus::Pending));
            if running {
                processes.push(ProcessInfo {
                    config: e.config,
                    pid,
                    tag: e.tag,
                });
            }
        }
        processes.sort_by_key(|p| p.pid);
        Ok(connect::ok(&ListResponse { processes }))
    })
    .await
}

async fn send_input(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    unary(async {
        let sandbox = sandbox_of(&headers)?;
        let req: SendInputRequest = connect::unary(body).await?;
        let (_, e) = select(&sandbox, &req.process)?;
        let data = req
            .input
            .stdin
            .or(req.input.pty)
            .ok_or_else(|| E2bError::BadRequest("input: give stdin or pty".into()))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| E2bError::BadRequest(format!("input: not base64 ({e})")))?;
        write_stdin(&st, &e, Bytes::from(bytes), false).await?;
        Ok(connect::ok(&Empty {}))
    })
    .await
}

async fn close_stdin(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    unary(async {
        let sandbox = sandbox_of(&headers)?;
        let req: SelectRequest = connect::unary(body).await?;
        let (_, e) = select(&sandbox, &req.process)?;
        write_stdin(&st, &e, Bytes::new(), true).await?;
        Ok(connect::ok(&Empty {}))
    })
    .await
}

async fn write_stdin(st: &AppState, e: &Entry, bytes: Bytes, close: bool) -> Result<()> {
    let body = belljar_agent_proto::client::body_from_stream(futures::stream::once(async move {
        Ok::<_, std::io::Error>(bytes)
    }));
    st.sandboxes
        .write_stdin(&e.sandbox, &e.command, body, close)
        .await?;
    Ok(())
}

/// `SIGNAL_SIGKILL` (or 9) and `SIGNAL_SIGTERM` (or 15) as the daemon's signal names.
fn signal_name(v: Option<&serde_json::Value>) -> Result<&'static str> {
    match v {
        Some(serde_json::Value::String(s)) if s == "SIGNAL_SIGKILL" => Ok("KILL"),
        Some(serde_json::Value::String(s)) if s == "SIGNAL_SIGTERM" => Ok("TERM"),
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(9) => Ok("KILL"),
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(15) => Ok("TERM"),
        other => Err(E2bError::BadRequest(format!(
            "signal: {other:?} is not SIGNAL_SIGKILL or SIGNAL_SIGTERM"
        ))),
    }
}

async fn send_signal(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    unary(async {
        let sandbox = sandbox_of(&headers)?;
        let req: SendSignalRequest = connect::unary(body).await?;
        let signal = signal_name(req.signal.as_ref())?;
        let (_, e) = select(&sandbox, &req.process)?;
        let kill = KillCommand {
            signal: Some(signal.into()),
        };
        st.sandboxes
            .kill_command(&e.sandbox, &e.command, kill)
            .await?;
        Ok(connect::ok(&Empty {}))
    })
    .await
}

async fn update(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    unary(async {
        let sandbox = sandbox_of(&headers)?;
        let req: UpdateRequest = connect::unary(body).await?;
        let (_, e) = select(&sandbox, &req.process)?;
        let size = req
            .pty
            .and_then(|p| p.size)
            .ok_or_else(|| E2bError::BadRequest("pty.size: missing".into()))?;
        let size = PtySize {
            rows: u16::try_from(size.rows).unwrap_or(u16::MAX),
            cols: u16::try_from(size.cols).unwrap_or(u16::MAX),
        };
        st.sandboxes
            .resize_command(&e.sandbox, &e.command, size)
            .await?;
        Ok(connect::ok(&Empty {}))
    })
    .await
}

/// A client stream, which the SDKs do not use (they send input with SendInput).
async fn stream_input() -> Response {
    E2bError::NotImplemented("process.Process/StreamInput".into()).into_connect_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_become_base64_data_events() {
        let e = data_event(br#"{"stream":"stderr","data":"hi","ts":1}"#, false).unwrap();
        let json = serde_json::to_string(&ProcessEventBody { event: e }).unwrap();
        assert_eq!(json, r#"{"event":{"data":{"stderr":"aGk="}}}"#);
        let e = data_event(br#"{"stream":"stdout","data_base64":"/w==","ts":1}"#, true).unwrap();
        let json = serde_json::to_string(&ProcessEventBody { event: e }).unwrap();
        assert_eq!(json, r#"{"event":{"data":{"pty":"/w=="}}}"#);
        assert!(data_event(b"junk", false).is_none());
    }

    #[test]
    fn events_are_protobuf_json() {
        let start = ProcessEventBody {
            event: ProcessEvent::Start { pid: 1000 },
        };
        assert_eq!(
            serde_json::to_string(&start).unwrap(),
            r#"{"event":{"start":{"pid":1000}}}"#
        );
        let end = ProcessEventBody {
            event: ProcessEvent::End(EndEvent {
                exit_code: 3,
                exited: true,
                status: "exit status 3".into(),
                error: None,
            }),
        };
        assert_eq!(
            serde_json::to_string(&end).unwrap(),
            r#"{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3"}}}"#
        );
    }

    #[test]
    fn signals_and_selectors() {
        assert_eq!(
            signal_name(Some(&serde_json::json!("SIGNAL_SIGKILL"))).unwrap(),
            "KILL"
        );
        assert!(signal_name(Some(&serde_json::json!("SIGHUP"))).is_err());
        let pid = register(Entry {
            sandbox: "sbx_a".into(),
            command: "cmd_a".into(),
            tag: Some("t".into()),
            config: ProcessConfig::default(),
            pty: false,
        });
        let sel = ProcessSelector {
            pid: Some(pid),
            tag: None,
        };
        assert_eq!(select("sbx_a", &sel).unwrap().1.command, "cmd_a");
        assert!(select("sbx_b", &sel).is_err());
        let by_tag = ProcessSelector {
            pid: None,
            tag: Some("t".into()),
        };
        assert_eq!(select("sbx_a", &by_tag).unwrap().0, pid);
        forget("sbx_a");
        assert!(select("sbx_a", &sel).is_err());
    }
}
