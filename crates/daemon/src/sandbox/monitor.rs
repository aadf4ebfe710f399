//! Keeping the records true to the world without polling: the timeout that stops a sandbox
//! is a timer on the earliest deadline, and a sandbox that dies on its own is noticed from its
//! process's pidfd. An idle daemon reads nothing from the store, however many sandboxes run.
//!
//! Every change of a sandbox goes through `save`, which calls [`Sandboxes::track`]: it keeps
//! the deadlines of running sandboxes in memory, wakes the timer, and starts one exit watch
//! per running sandbox.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use belljar_api::{Sandbox, SandboxStatus};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use super::{SandboxError, Sandboxes};
use crate::util::now_ms;

/// The longest the timer sleeps at once, so that a jump of the wall clock (deadlines are
/// wall-clock times) is noticed within it.
const MAX_SLEEP: Duration = Duration::from_secs(30);

/// What the monitor knows of running sandboxes.
#[derive(Default)]
pub(super) struct MonitorState {
    /// `expires_at` of every running sandbox that has one, by id.
    deadlines: Mutex<HashMap<String, i64>>,
    /// Poked when a deadline is added, moved or removed.
    wake: Notify,
    /// Sandboxes whose process has an exit watch.
    watched: Mutex<HashSet<String>>,
}

impl Sandboxes {
    /// Follows a change of `s`: its deadline while it runs, and a watch on its process.
    pub(super) fn track(&self, s: &Sandbox) {
        let m = &self.inner.monitor;
        // A paused sandbox's processes are still there, and its timeout still runs.
        let running = matches!(s.status, SandboxStatus::Running | SandboxStatus::Paused);
        {
            let mut deadlines = m.deadlines.lock().unwrap_or_else(|e| e.into_inner());
            let changed = match s.expires_at.filter(|_| running) {
                Some(at) => deadlines.insert(s.id.clone(), at) != Some(at),
                None => deadlines.remove(&s.id).is_some(),
            };
            if changed {
                m.wake.notify_one();
            }
        }
        if running {
            self.watch_exit(s);
        }
        self.watch_lifetime(s);
    }

    /// Waits on the sandbox's process (a pidfd) in a task; when it ends without the daemon
    /// stopping it, the sandbox is recorded as failed.
    fn watch_exit(&self, s: &Sandbox) {
        let watched = &self.inner.monitor.watched;
        if !watched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(s.id.clone())
        {
            return;
        }
        let this = self.clone();
        let s = s.clone();
        tokio::spawn(async move {
            let dir = this.state_dir(&s.id);
            let ended = match this.blocking_backend(&s, move |b| b.exit_watch(&dir)).await {
                // Deprecated in favour of the `unsafe` `register_with_interest`, which this
                // crate forbids; its condition holds here: the `ExitWatch` owns its pidfd and
                // neither closes nor replaces it while registered.
                #[allow(deprecated)]
                Ok(Some(watch)) => match AsyncFd::with_interest(watch, Interest::READABLE) {
                    Ok(fd) => fd.readable().await.is_ok(),
                    Err(e) => {
                        tracing::warn!(sandbox = %s.id, error = %e, "cannot wait on the sandbox's process");
                        false
                    }
                },
                Ok(None) => true,
                Err(e) => {
                    tracing::warn!(sandbox = %s.id, error = %e, "cannot watch the sandbox's process");
                    false
                }
            };
            this.inner
                .monitor
                .watched
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&s.id);
            // The daemon's own stops end the process too; those are final by now (the stop
            // holds the sandbox's lock), and a deleted sandbox is gone.
            if ended && matches!(this.get(&s.id), Ok(now) if !now.status.is_final()) {
                match this
                    .settle_dead(&s.id, "the sandbox's processes ended unexpectedly")
                    .await
                {
                    // Deleted meanwhile: nothing is left to record.
                    Ok(()) | Err(SandboxError::NotFound(_)) => {}
                    Err(e) => {
                        tracing::error!(sandbox = %s.id, error = %e, "cannot record that a sandbox ended");
                    }
                }
            }
        });
    }

    /// Records that a running sandbox is gone without being stopped by the daemon.
    pub(super) async fn settle_dead(&self, id: &str, reason: &str) -> Result<(), SandboxError> {
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let mut s = self.get(id)?;
        if s.status.is_final() {
            return Ok(());
        }
        let dir = self.state_dir(id);
        let grace = self.inner.settings.stop_grace;
        // Clears what the backend left behind (cgroups); the sandbox itself is gone.
        if let Err(e) = self
            .blocking_backend(&s, move |b| b.stop(&dir, grace))
            .await
        {
            tracing::warn!(sandbox = %id, error = %e, "cannot clear what an ended sandbox left");
        }
        self.forget_agent(id);
        self.lose_running_commands(id, reason)?;
        s.status = SandboxStatus::Failed;
        s.status_reason = Some(reason.to_owned());
        s.stopped_at = Some(now_ms());
        s.expires_at = None;
        self.save(&s)
    }

    /// Stops the sandbox unless it was extended (or stopped) since its deadline was taken.
    async fn stop_expired(&self, id: &str) -> Result<(), SandboxError> {
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let s = self.get(id)?;
        let live = matches!(s.status, SandboxStatus::Running | SandboxStatus::Paused);
        if live && s.expires_at.is_some_and(|at| at <= now_ms()) {
            self.stop_locked(id, SandboxStatus::Stopped, "timeout", true)
                .await?;
        }
        Ok(())
    }

    /// Stops sandboxes when their timeout passes, until the daemon exits.
    pub fn spawn_monitor(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let m = &this.inner.monitor;
            loop {
                let now = now_ms();
                let (expired, next) = {
                    let mut deadlines = m.deadlines.lock().unwrap_or_else(|e| e.into_inner());
                    let expired: Vec<String> = deadlines
                        .iter()
                        .filter(|(_, at)| **at <= now)
                        .map(|(id, _)| id.clone())
                        .collect();
                    for id in &expired {
                        deadlines.remove(id);
                    }
                    (expired, deadlines.values().min().copied())
                };
                for id in expired {
                    let this = this.clone();
                    tokio::spawn(async move {
                        if let Err(e) = this.stop_expired(&id).await {
                            tracing::warn!(sandbox = %id, error = %e, "cannot stop an expired sandbox");
                        }
                    });
                }
                let sleep = next.map_or(MAX_SLEEP, |at| {
                    Duration::from_millis(u64::try_from(at - now).unwrap_or(0)).min(MAX_SLEEP)
                });
                tokio::select! {
                    () = tokio::time::sleep(sleep) => {}
                    () = m.wake.notified() => {}
                }
            }
        })
    }
}
