//! The task command router: `Sandbox.exec` and its `ContainerProcess` (start, the stdout and
//! stderr streams from an offset, stdin by offset, poll and wait), over the daemon's command
//! service.
//!
//! The client names a command by an id of its own (a UUID), which is also the daemon
//! command's idempotency key, so a retried start starts nothing new; the layer keeps which
//! daemon command each id is while the daemon runs. A command runs with its stdin open, as
//! Modal's do, and in the sandbox's working directory unless it names one.

use std::collections::BTreeMap;
use std::time::Duration;

use belljar_api::{CommandStatus, RunCommand, Stream};
use bytes::Bytes;
use hyper::body::Incoming;
use tokio::sync::mpsc;

use super::error::{ModalError, Result};
use super::output::Output;
use super::sandboxes::{self, TAG_WORKDIR};
use super::wire::{
    Empty, TaskExecExit, TaskExecRequest, TaskExecStartRequest, TaskExecStdinWriteRequest,
    TaskExecStdioReadRequest, TaskExecStdioReadResponse, exec_fd,
};
use super::{Messages, Modal, detached, ids, lock, streaming, unary};

/// The longest `TaskExecWait` holds a request; the client asks again after
/// `DEADLINE_EXCEEDED` (it gives each attempt 60 s).
const LONG_POLL: Duration = Duration::from_secs(50);

/// A command started through the router.
#[derive(Clone)]
pub struct Exec {
    sandbox: String,
    command: String,
    /// Bytes of stdin written so far.
    stdin: u64,
}

/// The router's answer to `method`, `None` for one it does not serve.
pub async fn route(
    m: &Modal,
    method: &str,
    req: hyper::Request<Incoming>,
) -> Option<hyper::Response<tonic::body::Body>> {
    Some(match method {
        "TaskExecStart" => unary(req, |r| start(m.clone(), r)).await,
        "TaskExecStdioRead" => streaming(req, |r| read(m.clone(), r)).await,
        "TaskExecStdinWrite" => unary(req, |r| write(m.clone(), r)).await,
        "TaskExecPoll" => unary(req, |r| poll(m.clone(), r)).await,
        "TaskExecWait" => unary(req, |r| wait(m.clone(), r)).await,
        "TaskReloadVolumes" => unary(req, |r| super::volumes::reload(m.clone(), r)).await,
        _ => return None,
    })
}

async fn start(m: Modal, req: TaskExecStartRequest) -> Result<Empty> {
    let sid = ids::sandbox_of_task(&req.task_id)?;
    let s = m.st().sandboxes.get(&sid)?;
    if s.status.is_final() || sandboxes::result_of(&m, &s)?.is_some() {
        return Err(ModalError::Conflict(sandboxes::finished(&ids::sandbox(
            &sid,
        ))));
    }
    if req.command_args.is_empty() {
        return Err(ModalError::BadRequest(
            "command_args: must not be empty".into(),
        ));
    }
    if req.pty_info.is_some() {
        return Err(ModalError::NotImplemented("exec(pty=True)".into()));
    }
    let mut env = BTreeMap::new();
    for id in &req.secret_ids {
        env.extend(m.secret(id)?);
    }
    for source in &req.secret_sources {
        if let Some(id) = &source.secret_id {
            env.extend(m.secret(id)?);
        }
        if let Some(map) = &source.env {
            env.extend(map.contents.clone());
        }
    }
    env.extend(req.env);
    let run = RunCommand {
        argv: req.command_args,
        cwd: req.workdir.or_else(|| s.tags.get(TAG_WORKDIR).cloned()),
        env: (!env.is_empty()).then_some(env),
        detached: true,
        stdin: true,
        ..RunCommand::default()
    };
    let sandboxes = m.st().sandboxes.clone();
    let key = req.exec_id.clone();
    let command = detached(async move {
        let c = sandboxes.run_command(&sid, run, Some(key)).await?;
        Ok((sandboxes, sid, c))
    })
    .await;
    let (sandboxes, sid, command) = command?;
    if let Some(secs) = req.timeout_secs.filter(|s| *s > 0) {
        crate::compat::kill_after(
            &sandboxes,
            &sid,
            &command.id,
            Duration::from_secs(u64::from(secs)),
        );
    }
    lock(&m.0.execs).entry(req.exec_id).or_insert(Exec {
        sandbox: sid,
        command: command.id,
        stdin: 0,
    });
    Ok(Empty {})
}

/// The command `exec_id` names in the sandbox of `task_id`.
fn exec(m: &Modal, task_id: &str, exec_id: &str) -> Result<Exec> {
    let sid = ids::sandbox_of_task(task_id)?;
    lock(&m.0.execs)
        .get(exec_id)
        .filter(|e| e.sandbox == sid)
        .cloned()
        .ok_or_else(|| ModalError::NotFound(format!("Exec {exec_id} not found")))
}

/// The command's stdout or stderr from the request's offset to its end.
async fn read(
    m: Modal,
    req: TaskExecStdioReadRequest,
) -> Result<Messages<TaskExecStdioReadResponse>> {
    let e = exec(&m, &req.task_id, &req.exec_id)?;
    let which = if req.file_descriptor == exec_fd::STDERR {
        Stream::Stderr
    } else {
        Stream::Stdout
    };
    let mut output = Output::open(&m.st().sandboxes, &e.sandbox, &e.command, which, req.offset)?;
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let message = match output.next().await {
                Ok(Some(data)) => Ok(TaskExecStdioReadResponse { data }),
                Ok(None) => return,
                Err(e) => Err(tonic::Status::internal(e.to_string())),
            };
            let failed = message.is_err();
            if tx.send(message).await.is_err() || failed {
                return;
            }
        }
    });
    Ok(Messages::new(rx))
}

/// Writes to the command's stdin what it has not had yet: a retried write repeats bytes
/// already written, which are skipped.
async fn write(m: Modal, req: TaskExecStdinWriteRequest) -> Result<Empty> {
    let e = exec(&m, &req.task_id, &req.exec_id)?;
    let data = {
        let mut execs = lock(&m.0.execs);
        let Some(entry) = execs.get_mut(&req.exec_id) else {
            return Err(ModalError::NotFound(format!(
                "Exec {} not found",
                req.exec_id
            )));
        };
        let end = req.offset.saturating_add(req.data.len() as u64);
        let skip = entry
            .stdin
            .saturating_sub(req.offset)
            .min(req.data.len() as u64);
        entry.stdin = entry.stdin.max(end);
        // `skip` is at most the data's length.
        req.data[usize::try_from(skip).unwrap_or(req.data.len())..].to_vec()
    };
    if data.is_empty() && !req.eof {
        return Ok(Empty {});
    }
    let body = belljar_agent_proto::client::body_from_stream(futures::stream::once(async move {
        Ok::<_, std::io::Error>(Bytes::from(data))
    }));
    let sandboxes = m.st().sandboxes.clone();
    detached(async move {
        Ok(sandboxes
            .write_stdin(&e.sandbox, &e.command, body, req.eof)
            .await?)
    })
    .await?;
    Ok(Empty {})
}

/// The command's exit, if it has ended.
fn exit_of(c: &belljar_api::Command) -> TaskExecExit {
    match (c.status, c.exit_code, c.signal) {
        (CommandStatus::Exited, Some(code), _) => TaskExecExit {
            code: Some(code),
            signal: None,
        },
        (CommandStatus::Exited, None, Some(sig)) => TaskExecExit {
            code: None,
            signal: Some(sig),
        },
        // Lost with its sandbox: it ran no further, as if killed.
        (CommandStatus::Lost, ..) => TaskExecExit {
            code: None,
            signal: Some(9),
        },
        _ => TaskExecExit::default(),
    }
}

async fn poll(m: Modal, req: TaskExecRequest) -> Result<TaskExecExit> {
    let e = exec(&m, &req.task_id, &req.exec_id)?;
    Ok(exit_of(&m.st().sandboxes.command(&e.sandbox, &e.command)?))
}

async fn wait(m: Modal, req: TaskExecRequest) -> Result<TaskExecExit> {
    let e = exec(&m, &req.task_id, &req.exec_id)?;
    let sandboxes = m.st().sandboxes.clone();
    match tokio::time::timeout(LONG_POLL, sandboxes.wait_command(&e.sandbox, &e.command)).await {
        Ok(c) => Ok(exit_of(&c?)),
        Err(_) => Err(ModalError::StillRunning(req.exec_id)),
    }
}
