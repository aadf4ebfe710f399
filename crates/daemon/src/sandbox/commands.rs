//! Commands in a sandbox: start them through the agent, keep their output in the log file,
//! record how they ended (the pump, in `pump`), and signal, feed and resize them.

use std::sync::Arc;
use std::time::Duration;

use belljar_agent_proto::client::{AgentClient, ClientError, RequestBody};
use belljar_agent_proto::{
    CommandInfo, DEFAULT_CWD, DEFAULT_USER, PtySize as AgentPty, StartCommand, codes as agent_codes,
};
use belljar_api::{
    Command, CommandStatus, KillCommand, PtySize, RunCommand, valid_idempotency_key,
};
use bytes::Bytes;
use futures::Stream;
use tokio::sync::watch;

use super::logs::{self, LogState};
use super::pump::Life;
use super::{SandboxError, Sandboxes};
use crate::store::{CommandRecord, Store};
use crate::util::{is_id, new_id, now_ms};

/// What recording a new command found.
enum Recorded {
    /// With its log state, registered before the record was written so that a concurrent
    /// replay of the pending command waits for it.
    New(CommandRecord, Arc<watch::Sender<LogState>>),
    /// A concurrent request with the same idempotency key recorded this one first.
    Existing(CommandRecord),
}

/// Lost before the agent confirmed it: it may never have run.
fn never_started(rec: &CommandRecord) -> bool {
    rec.command.status == CommandStatus::Lost && rec.agent_id.is_none()
}

impl Sandboxes {
    /// Runs a command; returns at once when `detached`, else when it has exited. With an
    /// idempotency key that the sandbox has seen, the command started then is returned (and
    /// waited for unless `detached`) instead of starting another.
    pub async fn run_command(
        &self,
        id: &str,
        req: RunCommand,
        idempotency_key: Option<String>,
    ) -> Result<Command, SandboxError> {
        self.run_command_as(id, req, idempotency_key, None).await
    }

    /// [`Sandboxes::run_command`] as `user` (a name in the sandbox's passwd) instead of the
    /// default user when the request is not `sudo`; compatibility layers whose API promises
    /// another user (Vercel's `vercel-sandbox`) use it.
    pub async fn run_command_as(
        &self,
        id: &str,
        req: RunCommand,
        idempotency_key: Option<String>,
        user: Option<String>,
    ) -> Result<Command, SandboxError> {
        let detached = req.detached;
        let (rec, _) = self.start_command(id, req, idempotency_key, user).await?;
        if detached {
            return Ok(rec.command);
        }
        // The record was just read or written: no need to look it up before waiting.
        self.wait_logged(&rec.command.id).await;
        match self.inner.store.command(id, &rec.command.id)? {
            Some(rec) => Ok(rec.command),
            None => self.command(id, &rec.command.id),
        }
    }

    /// Records the command as `pending`, then asks the agent to start it under the record's
    /// id, so that a daemon killed in between finds the record at its next start and can ask
    /// the agent whether the command ran (see `resolve_pending`).
    pub(super) async fn start_command(
        &self,
        id: &str,
        req: RunCommand,
        idempotency_key: Option<String>,
        as_user: Option<String>,
    ) -> Result<(CommandRecord, AgentClient), SandboxError> {
        if req.argv.is_empty() || req.argv[0].is_empty() {
            return Err(SandboxError::BadRequest("argv: must not be empty".into()));
        }
        if let Some(p) = req.pty
            && (p.rows == 0 || p.cols == 0)
        {
            return Err(SandboxError::BadRequest(
                "pty: rows and cols must be positive".into(),
            ));
        }
        if let Some(key) = &idempotency_key
            && !valid_idempotency_key(key)
        {
            return Err(SandboxError::BadRequest(
                "Idempotency-Key: must be 1 to 255 visible ASCII characters".into(),
            ));
        }
        let sandbox = self.awake(id).await?;
        let agent = self.agent(&sandbox).await?;
        let key = idempotency_key.as_deref();
        let user = if req.sudo {
            Some("root".to_owned())
        } else {
            as_user
        };
        let (mut rec, state) = match self.replay(id, key, &req.argv)? {
            Some(lost) if never_started(&lost) => match self.revive(&lost).await? {
                Some(rec) => {
                    let state = self.inner.logs.register(&rec.command.id, 0);
                    (rec, state)
                }
                None => return Ok((self.command_record(id, &lost.command.id)?, agent)),
            },
            Some(existing) => return Ok((existing, agent)),
            None => match self.record_new(id, &req, user.clone(), key).await? {
                Recorded::New(rec, state) => (rec, state),
                Recorded::Existing(rec) => return Ok((rec, agent)),
            },
        };
        let cid = rec.command.id.clone();
        // A user's image: its Env under the sandbox's, its WorkingDir and User by default.
        let image = self
            .inner
            .images
            .run_defaults(&sandbox.image, sandbox.image_id.as_deref());
        let mut env: std::collections::BTreeMap<String, String> = image
            .as_ref()
            .map(|d| d.env.iter().cloned().collect())
            .unwrap_or_default();
        env.extend(sandbox.env.clone());
        env.extend(req.env.unwrap_or_default());
        let (cwd, user) = match &image {
            Some(d) => (
                req.cwd.or_else(|| Some(d.cwd.clone())),
                user.or_else(|| Some(d.user.clone())),
            ),
            None => (req.cwd, user),
        };
        let start = StartCommand {
            argv: req.argv,
            cwd,
            env,
            user,
            pty: req.pty.map(|p| AgentPty {
                rows: p.rows,
                cols: p.cols,
            }),
            stdin: req.stdin,
            client_id: Some(cid.clone()),
            epoch: Some(self.inner.epoch),
        };
        // On the pumps' connection: a followed start's answer lasts as long as the command.
        let (info, life) = match self.ask_start(id, &start).await {
            Ok(started) => started,
            Err(e) => {
                self.unstarted(&rec, &e).await;
                return Err(e);
            }
        };
        rec.agent_id = Some(info.id.clone());
        rec.command.argv = info.argv;
        rec.command.cwd = info.cwd;
        rec.command.user = info.user;
        rec.command.pty = info.pty;
        rec.command.status = CommandStatus::Running;
        rec.command.started_at = info.started_at;
        let running = rec.clone();
        let promoted = self
            .inner
            .events
            .record_grouped(move |c, ts| Store::promote_command_with_event_on(c, &running, ts))
            .await?;
        if !promoted {
            // The sandbox ended (and the command was settled as lost) while the agent answered.
            self.inner.logs.finish(&cid);
            let settled = self.command_record(id, &cid)?;
            return Ok((settled, agent));
        }
        self.spawn_pump(rec.clone(), state, true, life);
        Ok((rec, agent))
    }

    /// Records a new `pending` command, or finds the one a concurrent request with the same
    /// idempotency key recorded first.
    async fn record_new(
        &self,
        id: &str,
        req: &RunCommand,
        user: Option<String>,
        key: Option<&str>,
    ) -> Result<Recorded, SandboxError> {
        let cid = new_id("cmd");
        // The log file itself comes with the command's first line of output (see `logs`).
        let log_path = self.inner.paths.command_log(id, &cid);
        let rec = CommandRecord {
            command: Command {
                id: cid,
                sandbox_id: id.to_owned(),
                argv: req.argv.clone(),
                cwd: req.cwd.clone().unwrap_or_else(|| DEFAULT_CWD.to_owned()),
                user: user.unwrap_or_else(|| DEFAULT_USER.to_owned()),
                pty: req.pty.is_some(),
                status: CommandStatus::Pending,
                exit_code: None,
                signal: None,
                started_at: now_ms(),
                finished_at: None,
                status_reason: None,
                output_truncated_bytes: 0,
            },
            agent_id: None,
            log_path,
            idempotency_key: key.map(str::to_owned),
        };
        let state = self.inner.logs.register(&rec.command.id, 0);
        let pending = rec.clone();
        let inserted = self
            .inner
            .events
            .record_grouped(move |c, _| Ok((Store::insert_command_on(c, &pending)?, None)))
            .await;
        if matches!(inserted, Ok(true)) {
            return Ok(Recorded::New(rec, state));
        }
        self.inner.logs.finish(&rec.command.id);
        inserted?;
        let _ = tokio::fs::remove_file(&rec.log_path).await;
        match self.replay(id, key, &req.argv)? {
            Some(existing) => Ok(Recorded::Existing(existing)),
            None => Err(SandboxError::Conflict(
                "A command with this Idempotency-Key was just removed".into(),
            )),
        }
    }

    /// Makes a keyed command that was lost before the agent confirmed it `pending` again, so
    /// that a client's retry starts it. Safe even if it did start: it is asked for under the
    /// same client id, which the agent answers with the command it already has. `None` when a
    /// concurrent retry revived it first.
    async fn revive(&self, lost: &CommandRecord) -> Result<Option<CommandRecord>, SandboxError> {
        let c = &lost.command;
        let started_at = now_ms();
        if !self
            .inner
            .store
            .revive_command(&c.sandbox_id, &c.id, started_at)?
        {
            return Ok(None);
        }
        // The retry's output starts a new log (made with its first line).
        match tokio::fs::remove_file(&lost.log_path).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        let mut rec = lost.clone();
        rec.command.status = CommandStatus::Pending;
        rec.command.status_reason = None;
        rec.command.finished_at = None;
        rec.command.started_at = started_at;
        Ok(Some(rec))
    }

    /// The command an earlier request with this idempotency key started, if any.
    fn replay(
        &self,
        id: &str,
        key: Option<&str>,
        argv: &[String],
    ) -> Result<Option<CommandRecord>, SandboxError> {
        let Some(key) = key else { return Ok(None) };
        let Some(existing) = self.inner.store.command_by_key(id, key)? else {
            return Ok(None);
        };
        if existing.command.argv != argv {
            return Err(SandboxError::Conflict(format!(
                "Idempotency-Key {key:?} was used for command {} with other arguments",
                existing.command.id
            )));
        }
        Ok(Some(existing))
    }

    /// Asks the agent to start the command, with the rest of its life on the same request
    /// when the agent can (see [`AgentClient::start_following`]); when the answer is lost in
    /// transport, asks once more on a new connection. The agent knows the command by its
    /// client id, so asking again never starts it twice.
    async fn ask_start(
        &self,
        id: &str,
        start: &StartCommand,
    ) -> Result<(CommandInfo, Option<Life>), SandboxError> {
        let agent = self.pump_agent(id).await?;
        match agent.start_following(start).await {
            Ok(started) => Ok(started),
            Err(ClientError::Api { code, .. }) if code == agent_codes::STALE_START => {
                // Fenced by another daemon's epoch: an agent restored from a snapshot keeps
                // the fence of its past. Only this daemon talks to it now: fence it with ours.
                let again = async {
                    agent.list_commands_fenced(self.inner.epoch).await?;
                    agent.start_following(start).await
                };
                again.await.map_err(|e| self.agent_error(id, e))
            }
            Err(e @ ClientError::Api { .. }) => Err(SandboxError::Agent(e)),
            Err(e) => {
                tracing::debug!(sandbox = %id, error = %e, "asking the agent again");
                let _ = self.agent_error(id, e);
                let agent = self.pump_agent(id).await?;
                agent
                    .start_following(start)
                    .await
                    .map_err(|e| self.agent_error(id, e))
            }
        }
    }

    /// Settles the record of a command the agent did not confirm: removed when the agent
    /// refused it (nothing ran), else `lost`, since it may have started.
    async fn unstarted(&self, rec: &CommandRecord, e: &SandboxError) {
        let (sid, cid) = (&rec.command.sandbox_id, &rec.command.id);
        if matches!(e, SandboxError::Agent(ClientError::Api { .. })) {
            if let Err(e) = self.inner.store.delete_command(sid, cid) {
                tracing::warn!(command = %cid, error = %e, "cannot remove a refused command");
            }
            let _ = tokio::fs::remove_file(&rec.log_path).await;
        } else {
            self.record_end(
                sid,
                cid,
                None,
                &format!("the sandbox's agent did not confirm the start: {e}"),
            );
        }
        self.inner.logs.finish(cid);
    }

    fn command_record(&self, id: &str, cid: &str) -> Result<CommandRecord, SandboxError> {
        self.record(id)?;
        if !is_id("cmd", cid) {
            return Err(SandboxError::CommandNotFound(cid.to_owned()));
        }
        self.inner
            .store
            .command(id, cid)?
            .ok_or_else(|| SandboxError::CommandNotFound(cid.to_owned()))
    }

    pub fn command(&self, id: &str, cid: &str) -> Result<Command, SandboxError> {
        Ok(self.command_record(id, cid)?.command)
    }

    /// The sandbox's commands, newest first.
    pub fn commands(&self, id: &str) -> Result<Vec<Command>, SandboxError> {
        self.get(id)?;
        Ok(self
            .inner
            .store
            .commands(id)?
            .into_iter()
            .map(|r| r.command)
            .collect())
    }

    /// Waits until the command has ended and its output is all in the log.
    pub async fn wait_command(&self, id: &str, cid: &str) -> Result<Command, SandboxError> {
        self.command_record(id, cid)?;
        self.wait_logged(cid).await;
        self.command(id, cid)
    }

    /// Waits until nothing appends to the command's log any more (its end is recorded).
    async fn wait_logged(&self, cid: &str) {
        if let Some(mut rx) = self.inner.logs.subscribe(cid) {
            while !rx.borrow_and_update().done {
                if rx.changed().await.is_err() {
                    break;
                }
            }
        }
    }

    /// Sends a signal (default `TERM`); answers once the command ended, or after 2 s.
    pub async fn kill_command(
        &self,
        id: &str,
        cid: &str,
        req: KillCommand,
    ) -> Result<Command, SandboxError> {
        let (rec, agent) = self.live_command(id, cid).await?;
        let signal = req.signal.unwrap_or_else(|| "TERM".into());
        if signal.is_empty() {
            return Err(SandboxError::BadRequest("signal: must not be empty".into()));
        }
        let agent_id = rec.agent_id.as_deref().unwrap_or_default();
        match agent.signal(agent_id, &signal).await {
            Err(ClientError::Api { code, .. }) if code == agent_codes::COMMAND_FINISHED => {}
            Err(e) => return Err(self.agent_error(id, e)),
            Ok(()) => {}
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), self.wait_command(id, cid)).await;
        self.command(id, cid)
    }

    /// Streams `body` to the command's stdin, closing it at the end when `close`.
    pub async fn write_stdin(
        &self,
        id: &str,
        cid: &str,
        body: RequestBody,
        close: bool,
    ) -> Result<(), SandboxError> {
        let (rec, agent) = self.live_command(id, cid).await?;
        agent
            .write_stdin(rec.agent_id.as_deref().unwrap_or_default(), body, close)
            .await
            .map_err(|e| self.agent_error(id, e))
    }

    pub async fn resize_command(
        &self,
        id: &str,
        cid: &str,
        size: PtySize,
    ) -> Result<(), SandboxError> {
        if size.rows == 0 || size.cols == 0 {
            return Err(SandboxError::BadRequest(
                "rows, cols: must be positive".into(),
            ));
        }
        let (rec, agent) = self.live_command(id, cid).await?;
        let pty = AgentPty {
            rows: size.rows,
            cols: size.cols,
        };
        agent
            .resize(rec.agent_id.as_deref().unwrap_or_default(), pty)
            .await
            .map_err(|e| self.agent_error(id, e))
    }

    async fn live_command(
        &self,
        id: &str,
        cid: &str,
    ) -> Result<(CommandRecord, AgentClient), SandboxError> {
        let rec = self.command_record(id, cid)?;
        if rec.command.status != CommandStatus::Running {
            return Err(SandboxError::Conflict(format!(
                "Command {cid} has already ended"
            )));
        }
        let agent = self.agent_of(id).await?;
        Ok((rec, agent))
    }

    /// The command's output as NDJSON bytes, from the start; with `follow`, until it ends.
    pub fn command_logs(
        &self,
        id: &str,
        cid: &str,
        follow: bool,
    ) -> Result<impl Stream<Item = std::io::Result<Bytes>> + use<>, SandboxError> {
        let rec = self.command_record(id, cid)?;
        let state = if follow {
            self.inner.logs.subscribe(cid)
        } else {
            None
        };
        Ok(logs::tail(rec.log_path, follow, state))
    }
}
