//! Adoption after a daemon restart: sandboxes that still run are re-attached (their
//! commands' output followed again, commands recorded but not confirmed started resolved with
//! what the agent knows), and those that ended while the daemon was away are settled.

use std::time::Duration;

use belljar_agent_proto::CommandInfo;
use belljar_api::{CommandStatus, Sandbox, SandboxStatus};

use super::{SandboxError, Sandboxes};
use crate::store::{CommandRecord, EventBody};

/// How long adoption waits for an agent to list its commands.
const AGENT_LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// How often, how long without change and how long at most adoption lists an agent's
/// commands again while some pending ones are unknown to it (see `settled_agent_commands`).
const RELIST_EVERY: Duration = Duration::from_millis(200);
const RELIST_QUIET: Duration = Duration::from_secs(1);
const RELIST_FOR: Duration = Duration::from_secs(5);

impl Sandboxes {
    /// At start: re-attaches to sandboxes that still run and settles those that ended while
    /// the daemon was away.
    pub async fn adopt_all(&self) -> Result<(), SandboxError> {
        let unsettled = self.inner.store.sandboxes_with_status(&[
            SandboxStatus::Pending,
            SandboxStatus::Running,
            SandboxStatus::Paused,
            SandboxStatus::Stopping,
        ])?;
        for s in unsettled {
            let dir = self.state_dir(&s.id);
            let adopted = self.blocking_backend(&s, move |b| b.adopt(&dir)).await;
            match (s.status, adopted) {
                (SandboxStatus::Running | SandboxStatus::Paused, Ok(Some(_))) => {
                    tracing::info!(sandbox = %s.id, "adopted a running sandbox");
                    self.attach_network(&s, &self.state_dir(&s.id)).await;
                    self.reattach(&s).await?;
                    self.track(&s);
                }
                (SandboxStatus::Running | SandboxStatus::Paused, result) => {
                    if let Err(e) = result {
                        tracing::warn!(sandbox = %s.id, error = %e, "cannot adopt sandbox");
                    }
                    self.settle_dead(&s.id, "the sandbox ended while the daemon was not running")
                        .await?;
                }
                (SandboxStatus::Pending, _) => {
                    self.stop_with(
                        &s.id,
                        SandboxStatus::Failed,
                        "the daemon restarted while the sandbox was starting",
                    )
                    .await?;
                }
                _ if self.stopping_snapshot_pending(&s.id) => {
                    // Its snapshot is finished by `finish_stopping_snapshots`; a persistent
                    // sandbox's own would be a second copy of it.
                    let lock = self.lock_for(&s.id);
                    let _guard = lock.lock().await;
                    self.stop_locked(&s.id, SandboxStatus::Stopped, "snapshotted", false)
                        .await?;
                }
                _ => {
                    let reason = s.status_reason.clone().unwrap_or_else(|| "stopped".into());
                    self.stop_with(&s.id, SandboxStatus::Stopped, &reason)
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Settles the sandbox's `pending` commands with what its agent knows, then follows the
    /// output of its running commands again, from the first line not yet stored.
    async fn reattach(&self, s: &Sandbox) -> Result<(), SandboxError> {
        let unfinished = self.inner.store.unfinished_commands(&s.id)?;
        let pending: Vec<&str> = unfinished
            .iter()
            .filter(|r| r.command.status == CommandStatus::Pending)
            .map(|r| r.command.id.as_str())
            .collect();
        let known = if pending.is_empty() {
            None
        } else {
            Some(self.settled_agent_commands(s, &pending).await)
        };
        for mut rec in unfinished {
            if rec.command.status == CommandStatus::Pending {
                let known = known.as_ref().expect("listed when a command is pending");
                match self.resolve_pending(rec, known)? {
                    Some(running) => rec = running,
                    None => continue,
                }
            }
            let lines = super::logs::repair(&rec.log_path)?;
            let state = self.inner.logs.register(&rec.command.id, lines);
            self.spawn_pump(rec, state, false, None);
        }
        Ok(())
    }

    /// The commands the sandbox's agent knows, final for every `pending` one. Starts the dead
    /// daemon sent may still be queued in the agent, and run after a first listing (seen with
    /// 120 starts in flight at a `kill -9`). The listing carries this daemon's epoch, after
    /// which the agent refuses every start of another (`StartCommand::epoch`), so one
    /// listing is final. An agent too old to fence is listed again every [`RELIST_EVERY`]
    /// until it knows every pending command or its list is unchanged for [`RELIST_QUIET`], at
    /// most [`RELIST_FOR`]; that is a wait, not a fence: a start queued longer still runs
    /// unrecorded.
    async fn settled_agent_commands(
        &self,
        s: &Sandbox,
        pending: &[&str],
    ) -> Result<Vec<CommandInfo>, String> {
        let all_known = |list: &[CommandInfo]| {
            pending
                .iter()
                .all(|id| list.iter().any(|c| c.client_id.as_deref() == Some(*id)))
        };
        let deadline = tokio::time::Instant::now() + RELIST_FOR;
        let (mut list, fence) = self.agent_commands(s).await?;
        if fence == Some(self.inner.epoch) {
            return Ok(list);
        }
        let mut unchanged_since = tokio::time::Instant::now();
        while !all_known(&list)
            && unchanged_since.elapsed() < RELIST_QUIET
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(RELIST_EVERY).await;
            // A failed listing keeps the last one: it answered for every command it names.
            let Ok((again, _)) = self.agent_commands(s).await else {
                break;
            };
            if again.len() != list.len() {
                unchanged_since = tokio::time::Instant::now();
            }
            list = again;
        }
        Ok(list)
    }

    /// The commands the sandbox's agent knows, within [`AGENT_LIST_TIMEOUT`], and the fence
    /// it now holds (`None` from an agent too old to fence).
    async fn agent_commands(&self, s: &Sandbox) -> Result<(Vec<CommandInfo>, Option<u64>), String> {
        let list = async {
            let agent = self.agent(s).await?;
            agent
                .list_commands_fenced(self.inner.epoch)
                .await
                .map_err(|e| self.agent_error(&s.id, e))
        };
        match tokio::time::timeout(AGENT_LIST_TIMEOUT, list).await {
            Ok(Ok(list)) => Ok(list),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {AGENT_LIST_TIMEOUT:?}")),
        }
    }

    /// A command recorded but not confirmed started when the daemon died: adopted as running
    /// (its pump then reads its output and its end) when the agent has a command with its id,
    /// else settled as `lost` with the reason. `None` when settled.
    fn resolve_pending(
        &self,
        mut rec: CommandRecord,
        known: &Result<Vec<CommandInfo>, String>,
    ) -> Result<Option<CommandRecord>, SandboxError> {
        let (sid, cid) = (rec.command.sandbox_id.clone(), rec.command.id.clone());
        let info = match known {
            Ok(list) => list
                .iter()
                .find(|c| c.client_id.as_deref() == Some(cid.as_str())),
            Err(e) => {
                let reason =
                    format!("cannot ask the sandbox's agent whether the command started: {e}");
                self.record_end(&sid, &cid, None, &reason);
                return Ok(None);
            }
        };
        let Some(info) = info else {
            self.record_end(
                &sid,
                &cid,
                None,
                "the daemon stopped before the sandbox's agent started the command",
            );
            return Ok(None);
        };
        tracing::info!(command = %cid, agent_id = %info.id, "adopted a command started during a restart");
        rec.agent_id = Some(info.id.clone());
        rec.command.argv = info.argv.clone();
        rec.command.cwd = info.cwd.clone();
        rec.command.user = info.user.clone();
        rec.command.pty = info.pty;
        rec.command.started_at = info.started_at;
        rec.command.status = CommandStatus::Running;
        if !self.inner.store.promote_command(&rec)? {
            return Ok(None);
        }
        self.inner
            .events
            .emit(EventBody::Command(Box::new(rec.command.clone())));
        Ok(Some(rec))
    }
}
