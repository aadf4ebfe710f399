//! A command's output followed into its log until it ends, and its end recorded: from the
//! rest of a followed start when the agent sent one, else (and after any break) with
//! requests of its own.

use std::sync::Arc;
use std::time::Duration;

use belljar_agent_proto::client::ClientError;
use belljar_agent_proto::{CommandInfo, Followed, codes as agent_codes};
use belljar_api::{CommandStatus, SandboxStatus};
use futures::StreamExt;
use tokio::sync::watch;

use super::logs::{LogState, LogWriter};
use super::{SandboxError, Sandboxes};
use crate::store::{CommandRecord, EventBody, Store};
use crate::util::now_ms;

/// The command as it ended (`outcome`; `None`: lost, for `lost_reason`), or `None` when it had
/// already ended.
fn settled(
    mut rec: CommandRecord,
    outcome: Option<CommandInfo>,
    lost_reason: &str,
) -> Option<CommandRecord> {
    if !matches!(
        rec.command.status,
        CommandStatus::Running | CommandStatus::Pending
    ) {
        return None;
    }
    match outcome {
        Some(info) => {
            rec.command.status = CommandStatus::Exited;
            rec.command.exit_code = info.exit_code;
            rec.command.signal = info.signal;
            rec.command.finished_at = info.finished_at.or(Some(now_ms()));
            rec.command.output_truncated_bytes = info.output_truncated_bytes;
        }
        None => {
            rec.command.status = CommandStatus::Lost;
            rec.command.status_reason = Some(lost_reason.to_owned());
            rec.command.finished_at = Some(now_ms());
        }
    }
    Some(rec)
}

/// The rest of a followed start: the command's output lines, then its end.
pub(super) type Life = belljar_agent_proto::client::JsonStream<Followed>;

/// Appends a followed start's output until its end; the command's final state, or `None`
/// when the stream broke first (the pump then follows the rest with requests of its own,
/// from the lines it has).
async fn follow_life(mut life: Life, writer: &mut LogWriter) -> Option<CommandInfo> {
    while let Some(item) = life.next().await {
        match item {
            Ok(Followed::Output(line)) => writer.append(&line).await.ok()?,
            Ok(Followed::Ended(end)) => return Some(with_dropped(end.ended, writer)),
            Ok(Followed::Started(_)) | Err(_) => return None,
        }
    }
    None
}

/// `info` with what the host dropped counted as truncated too, whatever the agent says.
fn with_dropped(mut info: CommandInfo, writer: &LogWriter) -> CommandInfo {
    info.output_truncated_bytes = info.output_truncated_bytes.saturating_add(writer.dropped());
    info
}

impl Sandboxes {
    /// Follows the command's output into its log until it ends, then records how it ended.
    /// `new_log`: the command was just recorded, so its log cannot exist yet (see
    /// [`LogWriter::new_log`]); else (re-attached after a restart) it is looked for. `life`:
    /// the rest of a followed start, read before asking the agent for anything.
    pub(super) fn spawn_pump(
        &self,
        rec: CommandRecord,
        state: Arc<watch::Sender<LogState>>,
        new_log: bool,
        life: Option<Life>,
    ) {
        let this = self.clone();
        tokio::spawn(async move { this.pump(rec, state, new_log, life).await });
    }

    async fn pump(
        &self,
        rec: CommandRecord,
        state: Arc<watch::Sender<LogState>>,
        new_log: bool,
        life: Option<Life>,
    ) {
        let sid = rec.command.sandbox_id.clone();
        let cid = rec.command.id.clone();
        let writer = if new_log {
            Ok(LogWriter::new_log(&rec.log_path, state))
        } else {
            LogWriter::open(&rec.log_path, state).await
        };
        let outcome = match (&rec.agent_id, writer) {
            (Some(agent_id), Ok(mut writer)) => {
                let ended = match life {
                    Some(life) => follow_life(life, &mut writer).await,
                    None => None,
                };
                match ended {
                    Some(info) => Some(info),
                    None => self.follow(&sid, agent_id, &mut writer).await,
                }
            }
            (_, Err(e)) => {
                tracing::warn!(command = %cid, error = %e, "cannot open the command log");
                None
            }
            (None, _) => None,
        };
        let lost_reason = "the command's output could not be followed to its end";
        let (sid2, cid2, fallback) = (sid.clone(), cid.clone(), outcome.clone());
        let recorded = self
            .inner
            .events
            .record_grouped(move |c, ts| {
                let settle = |rec| settled(rec, outcome, lost_reason);
                Ok(((), Store::settle_command_on(c, &sid2, &cid2, settle, ts)?))
            })
            .await;
        match recorded {
            Ok(()) => self.command_ended(&sid),
            Err(e) => {
                tracing::warn!(command = %cid, error = %e, "cannot record the end of a command");
                // Once more on its own, which tells followers even when it cannot be recorded.
                self.record_end(&sid, &cid, fallback, lost_reason);
            }
        }
        self.inner.logs.finish(&cid);
    }

    /// Appends output until the agent's stream ends, reconnecting while the sandbox runs;
    /// the command's final state, or `None` when it was lost.
    async fn follow(
        &self,
        sid: &str,
        agent_id: &str,
        writer: &mut LogWriter,
    ) -> Option<CommandInfo> {
        let mut failures = 0;
        loop {
            let result = async {
                let agent = self.pump_agent(sid).await?;
                let mut lines = agent
                    .output(agent_id, writer.lines(), true)
                    .await
                    .map_err(|e| self.agent_error(sid, e))?;
                while let Some(line) = lines.next().await {
                    let line = line.map_err(|e| self.agent_error(sid, e))?;
                    writer.append(&line).await?;
                }
                agent
                    .wait_command(agent_id)
                    .await
                    .map_err(|e| self.agent_error(sid, e))
            }
            .await;
            match result {
                Ok(info) => return Some(with_dropped(info, writer)),
                Err(SandboxError::Agent(ClientError::Api { code, .. }))
                    if code == agent_codes::COMMAND_NOT_FOUND =>
                {
                    return None;
                }
                Err(e) => {
                    failures += 1;
                    let running = matches!(
                        self.inner.store.sandbox(sid),
                        Ok(Some(s)) if s.status == SandboxStatus::Running
                    );
                    if !running || failures > 20 {
                        tracing::debug!(sandbox = %sid, error = %e, "command output lost");
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }

    /// Records that a command ended (`None`: lost, for `lost_reason`) unless it already has.
    pub(super) fn record_end(
        &self,
        sid: &str,
        cid: &str,
        outcome: Option<CommandInfo>,
        lost_reason: &str,
    ) {
        self.command_ended(sid);
        let Ok(Some(rec)) = self.inner.store.command(sid, cid) else {
            return;
        };
        let Some(rec) = settled(rec, outcome, lost_reason) else {
            return;
        };
        let store = &self.inner.store;
        let recorded = self
            .inner
            .events
            .record(|ts| Ok(((), store.put_command_with_event(&rec, ts)?)));
        if let Err(e) = recorded {
            tracing::warn!(command = %cid, error = %e, "cannot record the end of a command");
            // The event still tells followers how it ended, as before.
            self.inner
                .events
                .emit(EventBody::Command(Box::new(rec.command)));
        }
    }
}
