//! What a Dockerfile build asks of a sandbox besides running its `RUN` commands: the files the
//! step wrote, its writable layer, copied out while the sandbox is frozen (as a live
//! snapshot copies it, without recording a snapshot).

use std::path::{Path, PathBuf};

use super::{SandboxError, Sandboxes};

impl Sandboxes {
    /// Copies the running sandbox `id`'s writable layer into `dir/<digest>` (owners as the
    /// image's), freezing it meanwhile; returns the copy's directory.
    pub async fn capture_writes(&self, id: &str, dir: &Path) -> Result<PathBuf, SandboxError> {
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let sandbox = self.get(id)?;
        let into = dir.to_owned();
        let (captured, _) = self
            .while_frozen(&sandbox, move |b, state| b.capture(state, &into))
            .await?;
        Ok(dir.join(captured?.digest))
    }
}
