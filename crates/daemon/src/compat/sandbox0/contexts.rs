//! Contexts through the Sandbox0 layer: a `cmd` context is a daemon command (waited for, or
//! followed over the context's WebSocket), a `repl` context a long-lived interpreter
//! ([`super::repl`]). A context's id is its command's.
//!
//! Commands run as root, as Sandbox0's procd runs them, in `/workspace` unless the request
//! names a directory, with the sandbox's environment under the request's `env_vars`.
//! `ttl_sec` kills a command that outlives it; `idle_timeout_sec` is accepted and not
//! enforced.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use belljar_agent_proto::client::body_from_bytes;
use belljar_api::{Command, CommandStatus, KillCommand, PtySize, RunCommand};
use bytes::Bytes;
use futures::{SinkExt, Stream, StreamExt};
use tokio::sync::broadcast::error::RecvError;

use super::error::{Result, Sandbox0Error};
use super::repl::{self, Repl};
use super::wire::{
    ContextInput, ContextKind, ContextList, ContextView, CreateContextRequest, Done, ExecData,
    ResizeRequest, SignalRequest, Success, WsInput, WsOutput,
};
use super::{S0Json, S0Path, Shared, detached};
use crate::http::AppState;
use crate::sandbox::SandboxError;
use crate::time::rfc3339;

/// The most output a waited-for command answers with; the rest stays in the daemon's log.
const MAX_OUTPUT: usize = 16 << 20;
/// Where commands run when the request names no directory.
const DEFAULT_CWD: &str = "/workspace";

/// A context the layer made.
pub struct Context {
    pub sandbox_id: String,
    pub kind: ContextKind,
    pub alias: Option<String>,
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    pub pty: bool,
    pub repl: Option<Arc<Repl>>,
}

/// The contexts the layer made, by id.
#[derive(Default)]
pub struct Contexts {
    all: Mutex<HashMap<String, Arc<Context>>>,
    /// Contexts deleted through the layer (their commands stay in the daemon's records).
    deleted: Mutex<std::collections::HashSet<String>>,
}

impl Contexts {
    fn put(&self, id: &str, c: Context) -> Arc<Context> {
        let c = Arc::new(c);
        self.all
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_owned(), c.clone());
        c
    }

    fn get(&self, id: &str) -> Option<Arc<Context>> {
        self.all
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    fn remove(&self, id: &str) {
        self.all
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        self.deleted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_owned());
    }

    /// The daemon's command behind a context that was not deleted.
    fn command(&self, st: &AppState, sid: &str, cid: &str) -> Result<Command> {
        if self
            .deleted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(cid)
        {
            return Err(Sandbox0Error::NotFound(format!("Context {cid} not found")));
        }
        Ok(st.sandboxes.command(sid, cid)?)
    }

    /// Drops the sandbox's contexts: its processes are about to end.
    pub fn forget_sandbox(&self, sandbox_id: &str) {
        self.all
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, c| c.sandbox_id != sandbox_id);
    }

    fn of_sandbox(&self, sandbox_id: &str) -> Vec<(String, Arc<Context>)> {
        self.all
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, c)| c.sandbox_id == sandbox_id)
            .map(|(id, c)| (id.clone(), c.clone()))
            .collect()
    }
}

/// A command's final state, as Sandbox0 names it.
fn state_of(c: &Command) -> Option<String> {
    match c.status {
        CommandStatus::Pending | CommandStatus::Running => None,
        CommandStatus::Exited if c.signal.is_some() => Some("killed".into()),
        CommandStatus::Exited => Some("exited".into()),
        CommandStatus::Lost => Some("lost".into()),
    }
}

fn exit_code_of(c: &Command) -> Option<i32> {
    match (c.exit_code, c.signal) {
        (Some(code), _) => Some(code),
        (None, Some(sig)) => Some(128 + sig),
        (None, None) => None,
    }
}

fn running(c: &Command) -> bool {
    matches!(c.status, CommandStatus::Pending | CommandStatus::Running)
}

fn view(id: &str, ctx: Option<&Context>, c: &Command) -> ContextView {
    ContextView {
        id: id.to_owned(),
        kind: ctx.map_or(ContextKind::Cmd, |x| x.kind),
        running: running(c),
        paused: false,
        created_at: rfc3339(c.started_at),
        alias: ctx.and_then(|x| x.alias.clone()),
        cwd: ctx.map_or_else(|| c.cwd.clone(), |x| x.cwd.clone()),
        env_vars: ctx.map(|x| x.env.clone()).unwrap_or_default(),
        output_raw: None,
        stdout: None,
        stderr: None,
        exit_code: exit_code_of(c),
        state: state_of(c),
    }
}

/// The text lines of a daemon command log (NDJSON), with their stream; output that is not
/// UTF-8 is passed on lossily, since Sandbox0's output is text.
pub fn log_lines(
    stream: impl Stream<Item = io::Result<Bytes>> + Send + 'static,
) -> impl Stream<Item = (belljar_api::Stream, String)> + Send + 'static {
    let stream = Box::pin(stream);
    futures::stream::unfold(
        (stream, Vec::<u8>::new(), false),
        |(mut stream, mut buf, mut done)| async move {
            loop {
                if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    if let Some(out) = decode(&line) {
                        return Some((out, (stream, buf, done)));
                    }
                    continue;
                }
                if done {
                    let rest = std::mem::take(&mut buf);
                    return decode(&rest).map(|out| (out, (stream, buf, true)));
                }
                match stream.next().await {
                    Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                    Some(Err(_)) | None => done = true,
                }
            }
        },
    )
}

fn decode(raw: &[u8]) -> Option<(belljar_api::Stream, String)> {
    let line: belljar_api::LogLine = serde_json::from_slice(raw).ok()?;
    let text = match (line.data, line.data_base64) {
        (Some(d), _) => d,
        (None, Some(b)) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(b).ok()?;
            String::from_utf8_lossy(&bytes).into_owned()
        }
        (None, None) => return None,
    };
    Some((line.stream, text))
}

/// A finished command's output: stdout, stderr and both in order, each at most
/// [`MAX_OUTPUT`] bytes.
async fn collect(st: &AppState, sid: &str, cid: &str) -> Result<(String, String, String)> {
    let logs = st.sandboxes.command_logs(sid, cid, false)?;
    let mut lines = std::pin::pin!(log_lines(logs));
    let (mut out, mut err, mut raw) = (String::new(), String::new(), String::new());
    while let Some((stream, text)) = lines.next().await {
        if raw.len() + text.len() > MAX_OUTPUT {
            break;
        }
        raw.push_str(&text);
        match stream {
            belljar_api::Stream::Stdout => out.push_str(&text),
            belljar_api::Stream::Stderr => err.push_str(&text),
        }
    }
    Ok((out, err, raw))
}

fn created(view: ContextView) -> Response {
    (StatusCode::CREATED, Json(Success::new(view))).into_response()
}

pub async fn create(
    State(st): State<AppState>,
    Extension(layer): Shared,
    S0Path(sid): S0Path<String>,
    S0Json(req): S0Json<CreateContextRequest>,
) -> Result<Response> {
    let kind = req.kind.unwrap_or(if req.cmd.is_some() {
        ContextKind::Cmd
    } else {
        ContextKind::Repl
    });
    let pty = match req.pty_size {
        Some(p) => match (p.rows, p.cols) {
            (Some(rows), Some(cols)) if rows > 0 && cols > 0 => Some(PtySize { rows, cols }),
            (None, None) => None,
            _ => {
                return Err(Sandbox0Error::BadRequest(
                    "pty_size: rows and cols must both be positive".into(),
                ));
            }
        },
        None => None,
    };
    if req.ttl_sec.is_some_and(|t| t < 0) || req.idle_timeout_sec.is_some_and(|t| t < 0) {
        return Err(Sandbox0Error::BadRequest(
            "ttl_sec, idle_timeout_sec: must not be negative".into(),
        ));
    }
    let cwd = req.cwd.clone().unwrap_or_else(|| DEFAULT_CWD.to_owned());
    let env = req.env_vars.clone().unwrap_or_default();
    let (argv, alias) = match kind {
        ContextKind::Cmd => {
            let command = req.cmd.map(|c| c.command).unwrap_or_default();
            if command.is_empty() || command[0].is_empty() {
                return Err(Sandbox0Error::BadRequest(
                    "cmd.command: must not be empty".into(),
                ));
            }
            (command, None)
        }
        ContextKind::Repl => {
            let alias = req
                .repl
                .as_ref()
                .and_then(|r| r.alias.clone())
                .filter(|a| !a.trim().is_empty())
                .unwrap_or_else(|| "python".into());
            (repl::argv_for(alias.trim())?, Some(alias))
        }
    };
    let wait = kind == ContextKind::Cmd && req.wait_until_done.unwrap_or(false);
    let mut run_env = env.clone();
    if kind == ContextKind::Repl {
        run_env.insert("PYTHONUNBUFFERED".into(), "1".into());
    }
    let run = RunCommand {
        argv,
        cwd: Some(cwd.clone()),
        env: Some(run_env),
        sudo: true,
        detached: true,
        pty,
        stdin: !wait,
    };
    belljar_api::Validate::validate(&run).map_err(|e| Sandbox0Error::BadRequest(e.to_string()))?;
    super::sandboxes::wake(&st, &sid).await?;
    let sandboxes = st.sandboxes.clone();
    let sid2 = sid.clone();
    let command =
        detached(async move { Ok(sandboxes.run_command(&sid2, run, None).await?) }).await?;
    if let Some(secs) = req.ttl_sec.filter(|t| *t > 0) {
        crate::compat::kill_after(
            &st.sandboxes,
            &sid,
            &command.id,
            Duration::from_secs(secs.unsigned_abs()),
        );
    }
    let repl = match kind {
        ContextKind::Repl => Some(Repl::start(&st, &sid, &command.id)?),
        ContextKind::Cmd => None,
    };
    let ctx = layer.contexts.put(
        &command.id,
        Context {
            sandbox_id: sid.clone(),
            kind,
            alias,
            cwd,
            env,
            pty: pty.is_some(),
            repl: repl.clone(),
        },
    );
    if let (Some(repl), Some(input)) = (
        &repl,
        req.repl
            .and_then(|r| r.input)
            .filter(|i| !i.trim().is_empty()),
    ) {
        let output = repl.run(&st, &input).await?;
        let mut v = view(&command.id, Some(&ctx), &command);
        v.output_raw = Some(output);
        return Ok(created(v));
    }
    if !wait {
        return Ok(created(view(&command.id, Some(&ctx), &command)));
    }
    let finished = st.sandboxes.wait_command(&sid, &command.id).await?;
    let (out, err, raw) = collect(&st, &sid, &command.id).await?;
    let mut v = view(&command.id, Some(&ctx), &finished);
    v.output_raw = Some(raw);
    if !ctx.pty {
        v.stdout = Some(out);
        v.stderr = Some(err);
    }
    Ok(created(v))
}

pub async fn list(
    State(st): State<AppState>,
    Extension(layer): Shared,
    S0Path(sid): S0Path<String>,
) -> Result<Response> {
    st.sandboxes.get(&sid)?;
    let mut contexts = Vec::new();
    for (id, ctx) in layer.contexts.of_sandbox(&sid) {
        if let Ok(c) = st.sandboxes.command(&sid, &id) {
            contexts.push(view(&id, Some(&ctx), &c));
        }
    }
    contexts.sort_by(|a, b| a.created_at.cmp(&b.created_at));
    Ok(Json(Success::new(ContextList { contexts })).into_response())
}

pub async fn get_one(
    State(st): State<AppState>,
    Extension(layer): Shared,
    S0Path((sid, cid)): S0Path<(String, String)>,
) -> Result<Response> {
    let c = layer.contexts.command(&st, &sid, &cid)?;
    let ctx = layer.contexts.get(&cid);
    Ok(Json(Success::new(view(&cid, ctx.as_deref(), &c))).into_response())
}

pub async fn delete(
    State(st): State<AppState>,
    Extension(layer): Shared,
    S0Path((sid, cid)): S0Path<(String, String)>,
) -> Result<Response> {
    let c = layer.contexts.command(&st, &sid, &cid)?;
    if running(&c) {
        let kill = KillCommand {
            signal: Some("KILL".into()),
        };
        match st.sandboxes.kill_command(&sid, &cid, kill).await {
            Ok(_) | Err(SandboxError::Conflict(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    layer.contexts.remove(&cid);
    Ok(Json(Success::new(Done {
        deleted: Some(true),
        ..Done::default()
    }))
    .into_response())
}

/// The REPL of a context, or why there is none.
fn repl_of(layer: &super::Layer, st: &AppState, sid: &str, cid: &str) -> Result<Arc<Repl>> {
    layer.contexts.command(st, sid, cid)?;
    match layer.contexts.get(cid).and_then(|c| c.repl.clone()) {
        Some(r) => Ok(r),
        None => Err(Sandbox0Error::BadRequest(format!(
            "Context {cid} is not a REPL context (exec runs code in one); send a command \
             context input instead"
        ))),
    }
}

pub async fn exec(
    State(st): State<AppState>,
    Extension(layer): Shared,
    S0Path((sid, cid)): S0Path<(String, String)>,
    S0Json(req): S0Json<ContextInput>,
) -> Result<Response> {
    let repl = repl_of(&layer, &st, &sid, &cid)?;
    let st2 = st.clone();
    let output = detached(async move { repl.run(&st2, &req.data).await }).await?;
    let c = st.sandboxes.command(&sid, &cid)?;
    Ok(Json(Success::new(ExecData {
        output_raw: output,
        stdout: None,
        stderr: None,
        exit_code: exit_code_of(&c),
        state: state_of(&c),
    }))
    .into_response())
}

pub async fn input(
    State(st): State<AppState>,
    Extension(layer): Shared,
    S0Path((sid, cid)): S0Path<(String, String)>,
    S0Json(req): S0Json<ContextInput>,
) -> Result<Response> {
    super::sandboxes::wake(&st, &sid).await?;
    if let Some(repl) = layer.contexts.get(&cid).and_then(|c| c.repl.clone()) {
        // Input to a REPL is code; its output goes to the context's subscribers.
        let st2 = st.clone();
        tokio::spawn(async move {
            let _ = repl.run(&st2, &req.data).await;
        });
    } else {
        st.sandboxes
            .write_stdin(&sid, &cid, body_from_bytes(req.data), false)
            .await?;
    }
    Ok(Json(Success::new(Done {
        written: Some(true),
        ..Done::default()
    }))
    .into_response())
}

pub async fn resize(
    State(st): State<AppState>,
    S0Path((sid, cid)): S0Path<(String, String)>,
    S0Json(req): S0Json<ResizeRequest>,
) -> Result<Response> {
    let size = PtySize {
        rows: req.rows,
        cols: req.cols,
    };
    st.sandboxes.resize_command(&sid, &cid, size).await?;
    Ok(Json(Success::new(Done {
        resized: Some(true),
        ..Done::default()
    }))
    .into_response())
}

/// `SIGINT`, `INT` or a number.
fn signal_name(signal: &str) -> Result<String> {
    let s = signal.trim();
    let s = s.strip_prefix("SIG").unwrap_or(s);
    if s.is_empty() || s.len() > 16 || !s.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(Sandbox0Error::BadRequest(format!(
            "signal: {signal:?} is not a signal name or number"
        )));
    }
    Ok(s.to_owned())
}

pub async fn signal(
    State(st): State<AppState>,
    S0Path((sid, cid)): S0Path<(String, String)>,
    S0Json(req): S0Json<SignalRequest>,
) -> Result<Response> {
    let kill = KillCommand {
        signal: Some(signal_name(&req.signal)?),
    };
    st.sandboxes.kill_command(&sid, &cid, kill).await?;
    Ok(Json(Success::new(Done {
        signaled: Some(true),
        ..Done::default()
    }))
    .into_response())
}

pub async fn ws(
    State(st): State<AppState>,
    Extension(layer): Shared,
    S0Path((sid, cid)): S0Path<(String, String)>,
    upgrade: std::result::Result<
        WebSocketUpgrade,
        axum::extract::ws::rejection::WebSocketUpgradeRejection,
    >,
) -> Result<Response> {
    let upgrade = upgrade.map_err(|_| {
        Sandbox0Error::BadRequest("A context's stream needs a WebSocket upgrade request".into())
    })?;
    let c = layer.contexts.command(&st, &sid, &cid)?;
    let ctx = layer.contexts.get(&cid);
    let pty = ctx.as_ref().is_some_and(|x| x.pty) || c.pty;
    let repl = ctx.and_then(|x| x.repl.clone());
    Ok(upgrade.on_upgrade(move |socket| async move {
        match repl {
            Some(repl) => stream_repl(st, sid, cid, repl, socket).await,
            None => stream_command(st, sid, cid, pty, socket).await,
        }
    }))
}

fn text(msg: &WsOutput) -> Message {
    Message::Text(serde_json::to_string(msg).unwrap_or_default().into())
}

/// What a client asks on a context's socket; `None` at its end.
async fn next_input(
    stream: &mut futures::stream::SplitStream<WebSocket>,
) -> Option<std::result::Result<WsInput, serde_json::Error>> {
    loop {
        match stream.next().await? {
            Ok(Message::Text(t)) => {
                return Some(serde_json::from_str(&t));
            }
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

async fn control(st: &AppState, sid: &str, cid: &str, input: WsInput) -> Result<()> {
    match input {
        WsInput::Input { data, .. } => {
            st.sandboxes
                .write_stdin(sid, cid, body_from_bytes(data), false)
                .await?
        }
        WsInput::Resize { rows, cols } => {
            st.sandboxes
                .resize_command(sid, cid, PtySize { rows, cols })
                .await?
        }
        WsInput::Signal { signal } => {
            let kill = KillCommand {
                signal: Some(signal_name(&signal)?),
            };
            st.sandboxes.kill_command(sid, cid, kill).await?;
        }
    }
    Ok(())
}

/// A command's output from its start, then its end; the client's input, resizes and
/// signals go to the command meanwhile.
async fn stream_command(st: AppState, sid: String, cid: String, pty: bool, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    let logs = match st.sandboxes.command_logs(&sid, &cid, true) {
        Ok(l) => l,
        Err(e) => {
            let error = Sandbox0Error::from(e).parts().2;
            let _ = sink.send(text(&WsOutput::Error { error })).await;
            return;
        }
    };
    let mut lines = std::pin::pin!(log_lines(logs));
    let mut client_gone = false;
    loop {
        tokio::select! {
            line = lines.next() => match line {
                Some((stream_kind, data)) => {
                    let source = match (pty, stream_kind) {
                        (true, _) => "pty",
                        (false, belljar_api::Stream::Stdout) => "stdout",
                        (false, belljar_api::Stream::Stderr) => "stderr",
                    };
                    if sink.send(text(&WsOutput::Output { source, data })).await.is_err() {
                        return;
                    }
                }
                None => break,
            },
            input = next_input(&mut stream), if !client_gone => match input {
                Some(Ok(input)) => {
                    if let Err(e) = control(&st, &sid, &cid, input).await {
                        let error = e.parts().2;
                        let _ = sink.send(text(&WsOutput::Error { error })).await;
                    }
                }
                Some(Err(e)) => {
                    let _ = sink.send(text(&WsOutput::Error { error: format!("message: {e}") })).await;
                }
                None => client_gone = true,
            },
        }
    }
    let done = match st.sandboxes.wait_command(&sid, &cid).await {
        Ok(c) => WsOutput::Done {
            request_id: None,
            exit_code: exit_code_of(&c),
            state: state_of(&c),
        },
        Err(e) => WsOutput::Error {
            error: Sandbox0Error::from(e).parts().2,
        },
    };
    let _ = sink.send(text(&done)).await;
    let _ = sink.send(Message::Close(None)).await;
}

/// A REPL's output as it comes; each input is run as code, and its end is a `done` with
/// the input's `request_id`.
async fn stream_repl(st: AppState, sid: String, cid: String, repl: Arc<Repl>, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    let mut events = repl.events.subscribe();
    if repl.ended() {
        let _ = sink.send(text(&final_done(&st, &sid, &cid))).await;
        return;
    }
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(repl::Event::Output(data)) => {
                    let out = WsOutput::Output { source: "stdout", data };
                    if sink.send(text(&out)).await.is_err() {
                        return;
                    }
                }
                Ok(repl::Event::Done(id)) => {
                    let done = WsOutput::Done { request_id: Some(id), exit_code: None, state: None };
                    if sink.send(text(&done)).await.is_err() {
                        return;
                    }
                }
                Ok(repl::Event::Exited) | Err(RecvError::Closed) => break,
                Err(_) => {}
            },
            input = next_input(&mut stream) => match input {
                Some(Ok(WsInput::Input { data, .. })) => {
                    let (repl, st) = (repl.clone(), st.clone());
                    tokio::spawn(async move {
                        let _ = repl.run(&st, &data).await;
                    });
                }
                Some(Ok(other)) => {
                    if let Err(e) = control(&st, &sid, &cid, other).await {
                        let _ = sink.send(text(&WsOutput::Error { error: e.parts().2 })).await;
                    }
                }
                Some(Err(e)) => {
                    let _ = sink.send(text(&WsOutput::Error { error: format!("message: {e}") })).await;
                }
                None => return,
            },
        }
    }
    let _ = sink.send(text(&final_done(&st, &sid, &cid))).await;
    let _ = sink.send(Message::Close(None)).await;
}

fn final_done(st: &AppState, sid: &str, cid: &str) -> WsOutput {
    match st.sandboxes.command(sid, cid) {
        Ok(c) => WsOutput::Done {
            request_id: None,
            exit_code: exit_code_of(&c),
            state: state_of(&c).or(Some("exited".into())),
        },
        Err(e) => WsOutput::Error {
            error: Sandbox0Error::from(e).parts().2,
        },
    }
}
