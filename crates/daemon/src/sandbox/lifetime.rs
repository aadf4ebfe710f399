//! How long a sandbox lives besides its timeout: the idle timeout pauses a running sandbox
//! that nothing has used for a while (Modal's `idle_timeout`, Sandbox0's soft `ttl`), the hard
//! TTL deletes it whatever its state (Sandbox0's `hard_ttl`), and auto-resume lets any use of
//! a paused sandbox's processes (commands, files, terminals) resume it first.
//!
//! One task per sandbox that has either setting sleeps until its next deadline (never polls)
//! and is poked when the sandbox changes. The hard deadline (`deletes_at`) is in the store, so
//! it holds across daemon restarts. The idle clock is kept in memory and written to
//! `<sandbox>/last-used` at most once a second, so a restarted daemon (`kill -9` included)
//! goes on counting from the last use instead of starting the clock again. Reading a sandbox's record (`GET /v1/sandboxes/{id}`, the app's list) is not a use:
//! it neither resumes it nor keeps it awake.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belljar_api::{Sandbox, SandboxStatus};
use tokio::sync::Notify;

use super::{SandboxError, Sandboxes};
use crate::util::now_ms;

/// The longest a lifetime task sleeps at once, so that a jump of the wall clock is noticed.
const MAX_SLEEP: Duration = Duration::from_secs(30);
/// Where a sandbox's last use is kept across daemon restarts, in its directory.
const LAST_USED_FILE: &str = "last-used";
/// How stale the kept last use may be: it is written at most this often.
const LAST_USED_WRITE_MS: i64 = 1_000;

#[derive(Default)]
pub(super) struct LifetimeState {
    /// The wake-up of each sandbox's lifetime task, while it runs.
    tasks: Mutex<HashMap<String, Arc<Notify>>>,
    /// When each sandbox was last used, Unix ms.
    last_used: Mutex<HashMap<String, i64>>,
    /// The last use written to each sandbox's `last-used` file.
    written: Mutex<HashMap<String, i64>>,
}

impl Sandboxes {
    /// Records a use of the sandbox now (its idle clock starts again).
    pub(super) fn touch(&self, id: &str) {
        let now = now_ms();
        self.inner
            .lifetime
            .last_used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_owned(), now);
        let mut written = self
            .inner
            .lifetime
            .written
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if written
            .get(id)
            .is_none_or(|w| now.saturating_sub(*w) >= LAST_USED_WRITE_MS)
        {
            let file = self.inner.paths.sandbox_dir(id).join(LAST_USED_FILE);
            match std::fs::write(&file, now.to_string()) {
                Ok(()) => {
                    written.insert(id.to_owned(), now);
                }
                Err(e) => tracing::debug!(sandbox = %id, error = %e, "cannot keep the last use"),
            }
        }
    }

    /// The last use a previous daemon kept for the sandbox (never later than now).
    fn kept_last_use(&self, id: &str) -> Option<i64> {
        let file = self.inner.paths.sandbox_dir(id).join(LAST_USED_FILE);
        let kept: i64 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
        Some(kept.min(now_ms()))
    }

    /// A sandbox whose processes are about to be used: a paused one is resumed first when it
    /// has `auto_resume`, and its idle clock starts again. Errors as for a sandbox that is
    /// not running otherwise.
    pub(super) async fn awake(&self, id: &str) -> Result<Sandbox, SandboxError> {
        let s = self.record(id)?;
        if s.status == SandboxStatus::Paused && s.lifecycle.auto_resume {
            tracing::info!(sandbox = %id, "resuming a paused sandbox on use");
            self.resume(id).await?;
            self.touch(id);
            return self.running_record(id);
        }
        self.touch(id);
        super::must_run(s)
    }

    /// Follows a sandbox's idle timeout and hard TTL (called on every change of it).
    pub(super) fn watch_lifetime(&self, s: &Sandbox) {
        let l = &s.lifecycle;
        if l.deletes_at.is_none() && l.idle_timeout_ms.is_none() {
            return;
        }
        let mut tasks = self
            .inner
            .lifetime
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(wake) = tasks.get(&s.id) {
            wake.notify_one();
            return;
        }
        let wake = Arc::new(Notify::new());
        tasks.insert(s.id.clone(), wake.clone());
        if s.status == SandboxStatus::Running && self.last_used(&s.id).is_none() {
            match self.kept_last_use(&s.id) {
                Some(at) => {
                    self.inner
                        .lifetime
                        .last_used
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(s.id.clone(), at);
                }
                None => self.touch(&s.id),
            }
        }
        let this = self.clone();
        let id = s.id.clone();
        tokio::spawn(async move {
            loop {
                match this.lifetime_step(&id).await {
                    Ok(Some(wait)) => {
                        tokio::select! {
                            () = tokio::time::sleep(wait.min(MAX_SLEEP)) => {}
                            () = wake.notified() => {}
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(sandbox = %id, error = %e, "lifetime check failed");
                        tokio::time::sleep(MAX_SLEEP).await;
                    }
                }
            }
        });
    }

    /// Applies what is due now; returns how long until the next deadline, or `None` when
    /// there is nothing left to wait for (the task ends; a later change starts another).
    async fn lifetime_step(&self, id: &str) -> Result<Option<Duration>, SandboxError> {
        let done = || {
            self.inner
                .lifetime
                .tasks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(id);
            Ok(None)
        };
        let s = match self.get(id) {
            Ok(s) => s,
            Err(SandboxError::NotFound(_)) => return done(),
            Err(e) => return Err(e),
        };
        let now = now_ms();
        if let Some(at) = s.lifecycle.deletes_at
            && at <= now
        {
            tracing::info!(sandbox = %id, "hard TTL reached: deleting");
            self.delete(id).await?;
            return done();
        }
        let mut idle_at = None;
        if let (SandboxStatus::Running, Some(idle)) = (s.status, s.lifecycle.idle_timeout_ms) {
            let used = self.last_used(id).unwrap_or(now);
            let at = used.saturating_add(idle);
            if at <= now {
                if self.inner.store.unfinished_commands(id)?.is_empty() {
                    tracing::info!(sandbox = %id, "idle: pausing");
                    self.pause_with(id, "idle").await?;
                    return Ok(Some(Duration::ZERO));
                }
                // A running command is a use.
                self.touch(id);
                idle_at = Some(now.saturating_add(idle));
            } else {
                idle_at = Some(at);
            }
        }
        let next = [idle_at, s.lifecycle.deletes_at]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(at) => Ok(Some(Duration::from_millis(
                u64::try_from(at.saturating_sub(now)).unwrap_or(0),
            ))),
            None => done(),
        }
    }

    fn last_used(&self, id: &str) -> Option<i64> {
        self.inner
            .lifetime
            .last_used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .copied()
    }

    /// At start: follows the hard TTL of every sandbox that has one, whatever its state (a
    /// stopped persistent sandbox is deleted at its deadline too); running ones are followed
    /// when they are adopted.
    pub fn watch_lifetimes(&self) -> Result<(), SandboxError> {
        let all = self.inner.store.sandboxes_with_status(&[
            SandboxStatus::Stopped,
            SandboxStatus::Failed,
            SandboxStatus::Running,
            SandboxStatus::Paused,
        ])?;
        for s in all {
            self.watch_lifetime(&s);
        }
        Ok(())
    }
}
