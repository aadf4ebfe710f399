//! Stopping and deleting sandboxes. A delete answers as soon as the sandbox is unreachable
//! and finishes the teardown in the background, because the teardown (reaping a PID
//! namespace, removing cgroups, unmounting the disk, deleting the tree) is most of a
//! sandbox's life on a busy machine; the [`DELETING`] marker makes that crash-safe.

use std::time::Instant;

use belljar_api::{Backend as BackendKind, Sandbox, SandboxStatus};

use super::backend::BackendError;
use super::{SandboxError, Sandboxes};
use crate::store::EventBody;
use crate::util::{is_id, now_ms};

/// Written into a sandbox's directory when its delete begins; removed with the directory.
pub const DELETING: &str = "deleting";

/// The CPU priority (nice value) of a teardown's thread.
const TEARDOWN_NICE: i32 = 10;

/// Runs `f` on a thread of its own at nice [`TEARDOWN_NICE`]: a teardown (unmounting the disk,
/// deleting its blocks, removing cgroups, forking a remover in a user namespace when
/// rootless) is done for no one waiting, and must not slow the requests that someone is. The
/// thread ends with `f`, so its priority never reaches other work (and an unprivileged
/// daemon, which may not raise a priority again, needs no way back).
async fn at_low_priority<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("belljar-teardown".into())
        .spawn(move || {
            // Linux's priorities are per thread: this one only; never raised.
            let me = rustix::thread::gettid();
            let nice = rustix::process::getpriority_process(Some(me)).unwrap_or(0);
            if let Err(e) = rustix::process::setpriority_process(Some(me), nice.max(TEARDOWN_NICE))
            {
                tracing::debug!(error = %e, "cannot lower a teardown's priority");
            }
            let _ = tx.send(f());
        })?;
    rx.await
        .map_err(|_| std::io::Error::other("a teardown's thread ended without its result"))
}

/// When set, a delete leaves its teardown to the next start (`e2e_delete` uses it to prove
/// that a teardown interrupted by a crash is finished and leaves nothing behind).
const HOLD_TEARDOWN: &str = "BELLJAR_TEST_HOLD_TEARDOWN";

impl Sandboxes {
    /// Stops a sandbox (a no-op on one that has already ended).
    pub async fn stop(&self, id: &str) -> Result<Sandbox, SandboxError> {
        self.stop_with(id, SandboxStatus::Stopped, "stopped by user")
            .await
    }

    /// Stops a sandbox and records `status` with `reason`.
    pub(super) async fn stop_with(
        &self,
        id: &str,
        status: SandboxStatus,
        reason: &str,
    ) -> Result<Sandbox, SandboxError> {
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        self.stop_locked(id, status, reason, true).await
    }

    /// Stops a sandbox; with `persist`, a persistent one is snapshotted once its processes
    /// are gone (a `stopping` sandbox left by a crash is snapshotted when the daemon settles
    /// it at its next start).
    pub(super) async fn stop_locked(
        &self,
        id: &str,
        status: SandboxStatus,
        reason: &str,
        persist: bool,
    ) -> Result<Sandbox, SandboxError> {
        let mut s = self.get(id)?;
        if s.status.is_final() {
            return Ok(s);
        }
        s.status = SandboxStatus::Stopping;
        self.save(&s)?;
        let dir = self.state_dir(id);
        let grace = self.inner.settings.stop_grace;
        let stopped = self
            .blocking_backend(&s, move |b| b.stop(&dir, grace))
            .await;
        self.forget_agent(id);
        self.detach_network(id);
        self.lose_running_commands(id, &format!("the sandbox stopped ({reason})"))?;
        if persist && s.lifecycle.persistent && stopped.is_ok() {
            self.persist_stopped(&s).await;
        }
        match stopped {
            Ok(()) => {
                s.status = status;
                s.status_reason = Some(reason.to_owned());
            }
            Err(e) => {
                s.status = SandboxStatus::Failed;
                s.status_reason = Some(format!("{reason}; then: {e}"));
            }
        }
        s.stopped_at = Some(now_ms());
        s.expires_at = None;
        self.save(&s)?;
        Ok(s)
    }

    /// Marks the commands still running (or not yet started) in a sandbox that ended as lost.
    pub(super) fn lose_running_commands(&self, id: &str, reason: &str) -> Result<(), SandboxError> {
        for rec in self.inner.store.unfinished_commands(id)? {
            self.record_end(id, &rec.command.id, None, reason);
            self.inner.logs.finish(&rec.command.id);
        }
        Ok(())
    }

    /// Deletes a sandbox: once it can no longer be reached (its processes killed, its agent
    /// and network forgotten, its record gone) the call returns, and the teardown (waiting
    /// for the processes, cgroups, unmounting the disk, the loop device, removing the files,
    /// releasing snapshot layers) finishes in the background.
    ///
    /// Crash-safe: the sandbox's directory is marked [`DELETING`] before anything else, so a
    /// daemon that dies before the teardown ends has [`Sandboxes::finish_deletions`] redo it
    /// at its next start.
    pub async fn delete(&self, id: &str) -> Result<(), SandboxError> {
        if !is_id("sbx", id) {
            return Err(SandboxError::NotFound(id.to_owned()));
        }
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let s = self.get(id)?;
        let t = Instant::now();
        let all = self.inner.paths.sandbox_dir(id);
        match std::fs::write(all.join(DELETING), b"") {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        if !s.status.is_final() {
            // SIGKILL through a pidfd, no waiting: a deleted sandbox has nothing to save, and
            // a killed process can do nothing more (the rest of a PID namespace dies with
            // its PID 1; a VMM takes its guest along).
            let dir = self.state_dir(id);
            let killed = self
                .blocking_backend(&s, move |b| {
                    if let Some(watch) = b.exit_watch(&dir)? {
                        watch
                            .signal(nix::sys::signal::Signal::SIGKILL as i32)
                            .map_err(BackendError::Kill)?;
                    }
                    Ok(())
                })
                .await;
            if let Err(e) = killed {
                // The teardown's stop tries again, with its own escalation.
                tracing::warn!(
                    sandbox = %id,
                    error = %crate::util::error_chain(&e),
                    "cannot kill a deleted sandbox"
                );
            }
        }
        self.forget_agent(id);
        self.detach_network(id);
        self.lose_running_commands(id, "the sandbox stopped (deleted)")?;
        // A sandbox holding snapshot layers is torn down before the call answers, so that its
        // layers are released by then: deleting the snapshot next frees them at once, as a
        // client may check (the layers are still mounted until the teardown ends).
        let holds_layers = self.inner.store.holds_layers(id)?;
        self.inner.store.delete_sandbox(id)?;
        self.forget_network(id);
        self.inner
            .events
            .emit(EventBody::SandboxDeleted(id.to_owned()));
        self.inner
            .locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        tracing::debug!(sandbox = %id, unreachable = ?t.elapsed(), "deleting");
        if holds_layers && std::env::var_os(HOLD_TEARDOWN).is_none() {
            self.tear_down(id, s.backend).await;
            return Ok(());
        }
        let this = self.clone();
        let id = id.to_owned();
        self.inner.teardowns.spawn(async move {
            if std::env::var_os(HOLD_TEARDOWN).is_some() {
                // Tests only: the teardown a crash interrupts, held open for certain.
                return;
            }
            this.tear_down(&id, s.backend).await;
        });
        Ok(())
    }

    /// The teardown of a deleted sandbox (see [`Sandboxes::delete`]); on failure the marked
    /// directory stays, and the next start tries again.
    async fn tear_down(&self, id: &str, kind: BackendKind) {
        let t = Instant::now();
        let dir = self.state_dir(id);
        let this = self.clone();
        let destroyed = at_low_priority(move || {
            let b = this.inner.backends.get(kind).filter(|_| dir.is_dir());
            b.map(|b| b.destroy(&dir)).transpose()
        })
        .await;
        let destroyed = match destroyed {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(SandboxError::from(e)),
            Err(e) => Err(SandboxError::Io(e)),
        };
        let removed = async {
            destroyed?;
            let all = self.inner.paths.sandbox_dir(id);
            match tokio::fs::remove_dir_all(&all).await {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
            self.release_layers(id).await
        }
        .await;
        match removed {
            Ok(()) => tracing::debug!(sandbox = %id, teardown = ?t.elapsed(), "deleted"),
            Err(e) => tracing::warn!(sandbox = %id, error = %e, "cannot finish deleting a sandbox"),
        }
    }

    /// The sandboxes whose directory holds `marker` (a half-done deletion, a pooled sandbox),
    /// with their directories: the start-up scans' one walk. A data directory without
    /// sandboxes has none; one that cannot be read is an error, not an empty scan.
    pub(super) fn marked_sandboxes(
        &self,
        marker: &str,
    ) -> Result<Vec<(String, std::path::PathBuf)>, SandboxError> {
        let root = self.inner.paths.sandboxes_dir();
        let entries = match std::fs::read_dir(&root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut marked = Vec::new();
        for entry in entries {
            let entry = entry?;
            let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if entry.path().join(marker).exists() {
                marked.push((id, entry.path()));
            }
        }
        Ok(marked)
    }

    /// At start, before anything else reads the sandbox directories: finishes the deletions
    /// a daemon that ended left half done. A marked directory the store still knows is a
    /// delete that never answered: the sandbox stays, only the marker goes.
    pub async fn finish_deletions(&self) -> Result<(), SandboxError> {
        for (id, path) in self.marked_sandboxes(DELETING)? {
            if self.inner.store.sandbox(&id)?.is_some() {
                remove_marker(&path.join(DELETING));
                continue;
            }
            let dir = self.state_dir(&id);
            let Some(kind) = super::pool::backend_of_dir(&dir) else {
                // No backend state (never launched, or already destroyed): only files.
                if let Err(e) = tokio::fs::remove_dir_all(&path).await {
                    tracing::warn!(sandbox = %id, error = %e, "cannot delete a deleted sandbox's files");
                }
                if let Err(e) = self.release_layers(&id).await {
                    tracing::warn!(sandbox = %id, error = %e, "cannot release a deleted sandbox's layers");
                }
                continue;
            };
            tracing::info!(sandbox = %id, "finishing the deletion of a sandbox");
            self.tear_down(&id, kind).await;
        }
        Ok(())
    }

    /// At a clean stop: waits (up to `limit`) for the teardowns still running, so that a
    /// stopped daemon leaves no half-deleted sandbox when it can help it.
    pub async fn finish_teardowns(&self, limit: std::time::Duration) {
        self.inner.teardowns.close();
        if tokio::time::timeout(limit, self.inner.teardowns.wait())
            .await
            .is_err()
        {
            tracing::warn!("teardowns still running at exit; the next start finishes them");
        }
    }
}

/// Deletes a start-up scan's marker whose sandbox the store still holds; a marker that stays
/// is only scanned again at the next start, so a failure is logged, not fatal.
pub(super) fn remove_marker(marker: &std::path::Path) {
    if let Err(e) = std::fs::remove_file(marker) {
        tracing::warn!(marker = %marker.display(), error = %e, "cannot remove a marker");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn my_nice() -> i32 {
        rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
    }

    #[tokio::test]
    async fn a_teardown_runs_at_low_priority_on_a_thread_of_its_own() {
        let before = my_nice();
        let (nice, thread) = at_low_priority(|| (my_nice(), std::thread::current().id()))
            .await
            .unwrap();
        assert_eq!(nice, before.max(TEARDOWN_NICE));
        assert_ne!(thread, std::thread::current().id());
        // The caller's priority is untouched.
        assert_eq!(my_nice(), before);
    }
}
