//! Work that must see a running sandbox's files standing still: the sandbox is frozen (the
//! cgroup freezer, or the VMM's vCPUs paused after the guest flushed its caches), the work
//! runs, and the sandbox is thawed, with a marker in its directory while it is frozen so that
//! a daemon killed in between thaws it at its next start (`Sandboxes::recover_snapshots`).

use std::path::Path;
use std::time::Instant;

use belljar_api::Sandbox;

use super::backend::{BackendDriver, BackendError};
use super::snapshots::FROZEN_MARKER;
use super::{SandboxError, Sandboxes};

impl Sandboxes {
    /// Runs `work` on the backend with `sandbox` frozen (its lock held by the caller); returns
    /// what it gave and how long the sandbox was frozen, in milliseconds. A sandbox that
    /// cannot be thawed again keeps its marker and makes this an error.
    pub(super) async fn while_frozen<T: Send + 'static>(
        &self,
        sandbox: &Sandbox,
        work: impl FnOnce(&dyn BackendDriver, &Path) -> T + Send + 'static,
    ) -> Result<(T, u64), SandboxError> {
        let dir = self.state_dir(&sandbox.id);
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
        let frozen_ms = started.elapsed().as_millis() as u64;
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
