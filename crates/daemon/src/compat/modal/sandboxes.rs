//! Sandboxes through the Modal layer: create, the task id (how the client learns the sandbox
//! is scheduled, or has finished), wait, terminate, the entrypoint's streams and stdin, and
//! the address of the command router.
//!
//! A Modal sandbox is a daemon sandbox whose entrypoint command (`Sandbox.create("cmd", ...)`)
//! is a long-lived command of the daemon's, started with the sandbox, its stdin open: its
//! exit is the sandbox's `returncode`, and when it ends the layer stops the sandbox, as Modal
//! ends a sandbox whose entrypoint has exited. A sandbox with no entrypoint runs until it is
//! terminated or times out. What Modal keeps that the daemon has no field for is in the
//! sandbox's tags under `modal.` (its app, entrypoint, working directory, whether it was
//! terminated), so it survives a restart of the daemon. An ended sandbox is deleted an hour
//! after its timeout (the daemon's hard TTL), until when `from_id` still finds its result.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use belljar_api::{
    CommandStatus, CreateSandbox, NetworkMode, NetworkPolicy, RunCommand, Sandbox, SandboxStatus,
    Stream, UpdateSandbox,
    limits::{MAX_MEMORY_MIB, MAX_VCPUS, MIN_MEMORY_MIB},
};
use bytes::Bytes;
use tokio::sync::mpsc;

use super::error::{ModalError, Result};
use super::images::DEBIAN_SLIM;
use super::output::Output;
use super::wire::{
    GenericResult, SandboxCreateRequest, SandboxCreateResponse, SandboxDefinition,
    SandboxGetLogsRequest, SandboxGetTaskIdRequest, SandboxGetTaskIdResponse,
    SandboxHandleMetadata, SandboxStdinWriteRequest, SandboxTerminateRequest,
    SandboxTerminateResponse, SandboxWaitRequest, SandboxWaitResponse,
    TaskGetCommandRouterAccessRequest, TaskGetCommandRouterAccessResponse, TaskLogs, TaskLogsBatch,
    fd, network_access, status,
};
use super::{Messages, Modal, detached, ids, lock};

/// The app a sandbox belongs to.
pub const TAG_APP: &str = "modal.app";
/// The entrypoint's command id.
pub const TAG_ENTRYPOINT: &str = "modal.entrypoint";
/// The working directory of the entrypoint and of commands that name none.
pub const TAG_WORKDIR: &str = "modal.workdir";
/// The sandbox's name (`Sandbox.create(name=)`), unique among its app's running sandboxes.
pub const TAG_NAME: &str = "modal.name";
/// Set when `terminate` ended the sandbox.
const TAG_TERMINATED: &str = "modal.terminated";
/// Modal's default lifetime of a sandbox, seconds.
const DEFAULT_TIMEOUT_SECS: u32 = 300;
/// How long an ended sandbox is kept after its timeout.
const KEEP_ENDED_MS: i64 = 3_600_000;
/// The longest a wait or a log stream holds a request (the client asks again after).
const LONG_POLL: Duration = Duration::from_secs(50);
/// How often a waiting request looks at the sandbox again.
const POLL: Duration = Duration::from_millis(200);

pub async fn create(m: Modal, req: SandboxCreateRequest) -> Result<SandboxCreateResponse> {
    if !ids::is_app(&req.app_id) {
        return Err(ModalError::BadRequest(format!(
            "app_id: {:?} is not an app id",
            req.app_id
        )));
    }
    let def = req.definition.unwrap_or_default();
    let mut tags: BTreeMap<String, String> = req
        .tags
        .into_iter()
        .map(|t| (t.tag_name, t.tag_value))
        .collect();
    if tags.keys().any(|k| k.starts_with("modal.")) {
        return Err(ModalError::BadRequest(
            "tags: names under `modal.` are Belljar's own".into(),
        ));
    }
    tags.insert(TAG_APP.into(), req.app_id.clone());
    if let Some(dir) = def.workdir.clone() {
        tags.insert(TAG_WORKDIR.into(), dir);
    }
    let name = def.name.clone().filter(|n| !n.is_empty());
    if let Some(name) = &name {
        super::tags::check_name(name)?;
        tags.insert(TAG_NAME.into(), name.clone());
    }
    let create = definition(&m, &def, tags)?;
    let (entrypoint, workdir) = (def.entrypoint_args, def.workdir);
    let m2 = m.clone();
    let app_id = req.app_id.clone();
    let sandbox = detached(async move {
        // A name is one running sandbox's in its app: checked and taken under one lock.
        let _naming = match &name {
            Some(name) => {
                let held = m2.0.naming.lock().await;
                if super::tags::named(&m2, &app_id, name, false)?.is_some() {
                    return Err(ModalError::AlreadyExists(format!(
                        "Sandbox with name '{name}' already exists"
                    )));
                }
                Some(held)
            }
            None => None,
        };
        start(&m2, create, entrypoint, workdir).await
    })
    .await?;
    Ok(SandboxCreateResponse {
        sandbox_id: ids::sandbox(&sandbox.id),
        metadata: Some(SandboxHandleMetadata {
            result: None,
            app_id: req.app_id,
        }),
    })
}

/// The daemon's sandbox for a Modal definition.
fn definition(
    m: &Modal,
    def: &SandboxDefinition,
    tags: BTreeMap<String, String>,
) -> Result<CreateSandbox> {
    let image = if def.image_id.is_empty() {
        DEBIAN_SLIM.to_owned()
    } else {
        ids::image_of(&def.image_id)?
    };
    let mut env = BTreeMap::new();
    for id in &def.secret_ids {
        env.extend(m.secret(id)?);
    }
    let access = def.network_access.as_ref().map(|n| n.network_access_type);
    if access == Some(network_access::ALLOWLIST) {
        return Err(ModalError::NotImplemented(
            "Outbound allow-lists (outbound_cidr_allowlist)".into(),
        ));
    }
    let volumes = super::volumes::mounts(&def.volume_mounts)?;
    let blocked = def.block_network || access == Some(network_access::BLOCKED);
    let resources = def.resources.clone().unwrap_or_default();
    let vcpus =
        (resources.milli_cpu > 0).then(|| resources.milli_cpu.div_ceil(1000).clamp(1, MAX_VCPUS));
    let memory = (resources.memory_mb > 0)
        .then(|| u64::from(resources.memory_mb).clamp(MIN_MEMORY_MIB, MAX_MEMORY_MIB));
    let secs = if def.timeout_secs == 0 {
        DEFAULT_TIMEOUT_SECS
    } else {
        def.timeout_secs
    };
    let timeout_ms = i64::from(secs) * 1000;
    Ok(CreateSandbox {
        image: Some(image),
        vcpus,
        memory_mib: memory,
        timeout_ms: Some(timeout_ms),
        env: (!env.is_empty()).then_some(env),
        volumes: (!volumes.is_empty()).then_some(volumes),
        tags: Some(tags),
        network_policy: blocked.then_some(NetworkPolicy::Mode(NetworkMode::DenyAll)),
        hard_ttl_ms: Some(timeout_ms + KEEP_ENDED_MS),
        ..CreateSandbox::default()
    })
}

/// Creates the sandbox and starts its entrypoint; a sandbox whose entrypoint cannot start is
/// deleted, since it is not what the client asked for.
async fn start(
    m: &Modal,
    create: CreateSandbox,
    entrypoint: Vec<String>,
    workdir: Option<String>,
) -> Result<Sandbox> {
    let sandboxes = &m.st().sandboxes;
    let sandbox = sandboxes.create(create).await?;
    if entrypoint.is_empty() {
        return Ok(sandbox);
    }
    let run = RunCommand {
        argv: entrypoint,
        cwd: workdir,
        detached: true,
        stdin: true,
        ..RunCommand::default()
    };
    let started = async {
        let command = sandboxes.run_command(&sandbox.id, run, None).await?;
        let mut tags = sandbox.tags.clone();
        tags.insert(TAG_ENTRYPOINT.into(), command.id.clone());
        let update = UpdateSandbox {
            tags: Some(tags),
            ..UpdateSandbox::default()
        };
        let sandbox = sandboxes.update(&sandbox.id, update).await?;
        Ok::<_, ModalError>((sandbox, command.id))
    }
    .await;
    match started {
        Ok((sandbox, command)) => {
            watch_entrypoint(m, &sandbox.id, &command);
            Ok(sandbox)
        }
        Err(e) => {
            if let Err(e) = sandboxes.delete(&sandbox.id).await {
                tracing::warn!(sandbox = %sandbox.id, error = %e, "cannot delete a sandbox whose entrypoint did not start");
            }
            Err(e)
        }
    }
}

/// Stops the sandbox once its entrypoint has ended.
fn watch_entrypoint(m: &Modal, sid: &str, cid: &str) {
    let (sandboxes, sid, cid) = (m.st().sandboxes.clone(), sid.to_owned(), cid.to_owned());
    tokio::spawn(async move {
        if sandboxes.wait_command(&sid, &cid).await.is_err() {
            return;
        }
        if sandboxes.get(&sid).is_ok_and(|s| !s.status.is_final())
            && let Err(e) = sandboxes.stop(&sid).await
        {
            tracing::warn!(sandbox = %sid, error = %e, "cannot stop a sandbox whose entrypoint ended");
        }
    });
}

/// How the sandbox ended, `None` while it runs.
pub fn result_of(m: &Modal, s: &Sandbox) -> Result<Option<GenericResult>> {
    let ended = |status, exception: &str, exitcode| {
        Some(GenericResult {
            status,
            exception: exception.to_owned(),
            exitcode,
        })
    };
    if s.tags.contains_key(TAG_TERMINATED) {
        return Ok(ended(status::TERMINATED, "Sandbox terminated", 0));
    }
    let timed_out = s.status.is_final() && s.status_reason.as_deref() == Some("timeout");
    if timed_out {
        return Ok(ended(status::TIMEOUT, "Sandbox timed out", 0));
    }
    if let Some(cid) = s.tags.get(TAG_ENTRYPOINT) {
        let c = m.st().sandboxes.command(&s.id, cid)?;
        match (c.status, c.exit_code, c.signal) {
            (CommandStatus::Exited, Some(0), _) => return Ok(ended(status::SUCCESS, "", 0)),
            (CommandStatus::Exited, Some(code), _) => return Ok(ended(status::FAILURE, "", code)),
            (CommandStatus::Exited, None, Some(sig)) => {
                return Ok(ended(status::FAILURE, "", 128 + sig));
            }
            _ => {}
        }
    }
    Ok(match s.status {
        SandboxStatus::Failed => ended(
            status::FAILURE,
            s.status_reason.as_deref().unwrap_or("Sandbox failed"),
            0,
        ),
        st if st.is_final() => ended(status::TERMINATED, "Sandbox terminated", 0),
        _ => None,
    })
}

/// The daemon sandbox of a Modal sandbox id.
pub fn get(m: &Modal, modal_id: &str) -> Result<Sandbox> {
    sandbox(m, modal_id)
}

fn sandbox(m: &Modal, modal_id: &str) -> Result<Sandbox> {
    let id = ids::sandbox_of(modal_id)?;
    m.st()
        .sandboxes
        .get(&id)
        .map_err(|_| ModalError::NotFound(format!("Sandbox {modal_id} not found")))
}

pub fn metadata(s: &Sandbox, result: Option<GenericResult>) -> SandboxHandleMetadata {
    SandboxHandleMetadata {
        result,
        app_id: s.tags.get(TAG_APP).cloned().unwrap_or_default(),
    }
}

/// The sandbox's task (its container here): there from creation on, with how it ended once it
/// has (the client asks before each exec, and refuses one in a finished sandbox).
pub async fn task_id(m: Modal, req: SandboxGetTaskIdRequest) -> Result<SandboxGetTaskIdResponse> {
    let s = sandbox(&m, &req.sandbox_id)?;
    let task_result = result_of(&m, &s)?.map(|mut result| {
        result.exception = finished(&req.sandbox_id);
        result
    });
    Ok(SandboxGetTaskIdResponse {
        task_id: Some(ids::task(&s.id)),
        task_result,
    })
}

/// The message of a request that needs a sandbox that still runs.
pub fn finished(modal_id: &str) -> String {
    format!("Sandbox {modal_id} has already finished")
}

pub async fn wait(m: Modal, req: SandboxWaitRequest) -> Result<SandboxWaitResponse> {
    let hold = Duration::try_from_secs_f32(req.timeout.max(0.0)).unwrap_or(LONG_POLL);
    let deadline = Instant::now() + hold.min(LONG_POLL);
    loop {
        let s = sandbox(&m, &req.sandbox_id)?;
        let result = result_of(&m, &s)?;
        if result.is_some() || Instant::now() >= deadline {
            return Ok(SandboxWaitResponse {
                metadata: Some(metadata(&s, result.clone())),
                result,
            });
        }
        tokio::time::sleep(POLL.min(deadline - Instant::now())).await;
    }
}

pub async fn terminate(m: Modal, req: SandboxTerminateRequest) -> Result<SandboxTerminateResponse> {
    let s = sandbox(&m, &req.sandbox_id)?;
    if let Some(existing) = result_of(&m, &s)? {
        return Ok(SandboxTerminateResponse {
            existing_result: Some(existing),
        });
    }
    let sandboxes = m.st().sandboxes.clone();
    detached(async move {
        let mut tags = s.tags.clone();
        tags.insert(TAG_TERMINATED.into(), "true".into());
        let update = UpdateSandbox {
            tags: Some(tags),
            ..UpdateSandbox::default()
        };
        sandboxes.update(&s.id, update).await?;
        sandboxes.stop(&s.id).await?;
        Ok(())
    })
    .await?;
    Ok(SandboxTerminateResponse {
        existing_result: None,
    })
}

/// The entrypoint's stdout or stderr from the byte offset in `last_entry_id`, for up to
/// [`LONG_POLL`]; the last message says `eof` once the entrypoint (or, with none, the
/// sandbox) has ended. Each message's entry id is the offset after it.
pub async fn logs(m: Modal, req: SandboxGetLogsRequest) -> Result<Messages<TaskLogsBatch>> {
    let s = sandbox(&m, &req.sandbox_id)?;
    let which = match req.file_descriptor {
        fd::STDOUT => Stream::Stdout,
        fd::STDERR => Stream::Stderr,
        other => {
            return Err(ModalError::BadRequest(format!(
                "file_descriptor: {other} is not stdout or stderr"
            )));
        }
    };
    let from: u64 = req.last_entry_id.parse().unwrap_or(0);
    let output = match s.tags.get(TAG_ENTRYPOINT) {
        Some(cid) => Some(Output::open(&m.st().sandboxes, &s.id, cid, which, from)?),
        None => None,
    };
    let (tx, rx) = mpsc::channel(16);
    let modal_id = req.sandbox_id.clone();
    let batch = move |data: String, entry: u64, eof: bool| TaskLogsBatch {
        task_id: ids::task(&s.id),
        items: (!data.is_empty())
            .then_some(TaskLogs {
                data,
                file_descriptor: req.file_descriptor,
            })
            .into_iter()
            .collect(),
        entry_id: entry.to_string(),
        eof,
        sandbox_id: req.sandbox_id.clone(),
    };
    let deadline = tokio::time::Instant::now() + LONG_POLL;
    let m2 = m.clone();
    tokio::spawn(async move {
        let Some(mut output) = output else {
            // No entrypoint: nothing is written, and the stream ends with the sandbox.
            while tokio::time::Instant::now() < deadline {
                if sandbox(&m2, &modal_id).map_or(true, |s| s.status.is_final()) {
                    let _ = tx.send(Ok(batch(String::new(), from, true))).await;
                    return;
                }
                tokio::time::sleep(POLL).await;
            }
            return;
        };
        let mut pending: Vec<u8> = Vec::new();
        let mut sent = from;
        loop {
            let next = tokio::select! {
                n = output.next() => n,
                () = tokio::time::sleep_until(deadline) => return,
            };
            let (piece, eof) = match next {
                Ok(Some(bytes)) => (bytes, false),
                Ok(None) => (Vec::new(), true),
                Err(e) => {
                    let _ = tx.send(Err(tonic::Status::internal(e.to_string()))).await;
                    return;
                }
            };
            pending.extend_from_slice(&piece);
            let text = take_text(&mut pending, eof);
            sent += text.len() as u64;
            if (!text.is_empty() || eof) && tx.send(Ok(batch(text, sent, eof))).await.is_err() {
                return;
            }
            if eof {
                return;
            }
        }
    });
    Ok(Messages::new(rx))
}

/// The complete UTF-8 text at the front of `pending`, taken out of it; a character cut by a
/// chunk's end stays for the next, unless `all` (then invalid bytes become U+FFFD).
fn take_text(pending: &mut Vec<u8>, all: bool) -> String {
    let cut = match std::str::from_utf8(pending) {
        Ok(_) => pending.len(),
        Err(e) if e.error_len().is_none() && !all => e.valid_up_to(),
        Err(_) => pending.len(),
    };
    let rest = pending.split_off(cut);
    let text = String::from_utf8_lossy(pending).into_owned();
    *pending = rest;
    text
}

/// Writes to the entrypoint's stdin; a write whose index was seen is a retry and is skipped.
pub async fn stdin_write(m: Modal, req: SandboxStdinWriteRequest) -> Result<super::wire::Empty> {
    let s = sandbox(&m, &req.sandbox_id)?;
    let cid =
        s.tags.get(TAG_ENTRYPOINT).cloned().ok_or_else(|| {
            ModalError::Conflict("The sandbox has no entrypoint to write to".into())
        })?;
    let data = {
        let mut seen = lock(&m.0.stdin);
        let last = seen.entry(s.id.clone()).or_default();
        if req.index != 0 && req.index <= *last {
            Vec::new()
        } else {
            *last = req.index;
            req.input
        }
    };
    let body = belljar_agent_proto::client::body_from_stream(futures::stream::once(async move {
        Ok::<_, std::io::Error>(Bytes::from(data))
    }));
    let sandboxes = m.st().sandboxes.clone();
    detached(async move { Ok(sandboxes.write_stdin(&s.id, &cid, body, req.eof).await?) }).await?;
    Ok(super::wire::Empty {})
}

/// Where the sandbox's command router is: this listener, with the daemon's token.
pub async fn router(
    m: Modal,
    req: TaskGetCommandRouterAccessRequest,
) -> Result<TaskGetCommandRouterAccessResponse> {
    let id = ids::sandbox_of_task(&req.task_id)?;
    m.st().sandboxes.get(&id)?;
    Ok(TaskGetCommandRouterAccessResponse {
        jwt: m.st().auth.token().to_owned(),
        url: m.0.url.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_between_characters() {
        let mut p = "hé".as_bytes()[..2].to_vec();
        assert_eq!(take_text(&mut p, false), "h");
        assert_eq!(p, [0xc3]);
        p.push(0xa9);
        assert_eq!(take_text(&mut p, false), "é");
        assert!(p.is_empty());
        let mut p = vec![b'a', 0xc3];
        assert_eq!(take_text(&mut p, true), "a\u{fffd}");
    }
}
