//! Work that must see a running sandbox's files standing still: the sandbox is frozen (the
//! cgroup freezer, or the VMM's vCPUs paused after the guest flushed its caches), the work
//! runs, and the sandbox is thawed, with a marker in its directory while it is frozen so that
//! a daemon killed in between thaws it at its next start (`Sandboxes::recover_snapshots`).
//! A paused sandbox already stands still: the work runs on it as it is, and it stays paused.

use std::path::Path;
use std::time::Instant;

use belljar_api::{Sandbox, SandboxStatus};

use super::backend::{BackendDriver, BackendError};
use super::snapshots::FROZEN_MARKER;
use super::{SandboxError, Sandboxes};

impl Sandboxes {
    /// Runs `work` on the backend with `sandbox` frozen (its lock held by the caller); returns
    /// what it gave and how long the sandbox was frozen, in milliseconds. A sandbox that
    /// cannot be thawed again keeps its marker and makes this an error. A paused `sandbox`
    /// (its processes frozen, a microVM's guest flushed when it paused) is worked on as it
    /// stands and left paused; it was frozen for none of the work's sake: 0 ms.
    pub(super) async fn while_frozen<T: Send + 'static>(
        &self,
        sandbox: &Sandbox,
        work: impl FnOnce(&dyn BackendDriver, &Path) -> T + Send + 'static,
    ) -> Result<(T, u64), SandboxError> {
        let dir = self.state_dir(&sandbox.id);
        if sandbox.status == SandboxStatus::Paused {
            // No marker: a daemon killed meanwhile must leave it paused, not thaw it.
            let done = self
                .blocking_backend(sandbox, move |b| Ok(work(b, &dir)))
                .await?;
            return Ok((done, 0));
        }
        let marker = self
            .inner
            .paths
            .sandbox_dir(&sandbox.id)
            .join(FROZEN_MARKER);
        std::fs::write(&marker, b"")?;
        let started = Instant::now();
        let outcome = self
            .blocking_backend(sandbox, move |b| -> Result<_, BackendError> {
                b.freeze(&dir)?;
                let done = work(b, &dir);
                Ok((done, b.thaw(&dir)))
            })
            .await;
        let frozen_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match outcome {
            Ok((done, Ok(()))) => {
                let _ = std::fs::remove_file(&marker);
                Ok((done, frozen_ms))
            }
            // Still frozen: the marker stays, so that the next start thaws it.
            Ok((_, Err(e))) => Err(e.into()),
            Err(e) => {
                // The freeze itself failed: nothing is frozen.
                let _ = std::fs::remove_file(&marker);
                Err(e)
            }
        }
    }
}
