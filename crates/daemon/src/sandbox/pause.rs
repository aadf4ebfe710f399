//! Pause and resume: a paused sandbox keeps its identity, its files and its processes, which
//! stay in memory where they were (the cgroup freezer on the namespace backend) until it is
//! resumed. Its timeout keeps running: a paused sandbox past it is stopped like a running one.

use belljar_api::{Sandbox, SandboxStatus};

use super::{SandboxError, Sandboxes};

impl Sandboxes {
    /// Freezes a running sandbox (a no-op on a paused one).
    pub async fn pause(&self, id: &str) -> Result<Sandbox, SandboxError> {
        self.pause_with(id, "paused by user").await
    }

    /// Freezes a running sandbox, recording why (`paused by user`, `idle`).
    pub(super) async fn pause_with(&self, id: &str, reason: &str) -> Result<Sandbox, SandboxError> {
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let mut s = self.get(id)?;
        match s.status {
            SandboxStatus::Paused => return Ok(s),
            SandboxStatus::Running => {}
            other => {
                return Err(SandboxError::NotRunning {
                    id: s.id,
                    status: other.as_str(),
                });
            }
        }
        let dir = self.state_dir(id);
        self.blocking_backend(&s, move |b| b.freeze(&dir)).await?;
        s.status = SandboxStatus::Paused;
        s.status_reason = Some(reason.into());
        self.save(&s)?;
        Ok(s)
    }

    /// Lets a paused sandbox run on (a no-op on a running one).
    pub async fn resume(&self, id: &str) -> Result<Sandbox, SandboxError> {
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let s = self.get(id)?;
        self.resume_locked(s).await
    }

    /// [`Self::resume`] with the sandbox's lock held by the caller, which read `s` under it.
    pub(super) async fn resume_locked(&self, mut s: Sandbox) -> Result<Sandbox, SandboxError> {
        match s.status {
            SandboxStatus::Running => return Ok(s),
            SandboxStatus::Paused => {}
            other => {
                return Err(SandboxError::NotRunning {
                    id: s.id,
                    status: other.as_str(),
                });
            }
        }
        let dir = self.state_dir(&s.id);
        self.blocking_backend(&s, move |b| b.thaw(&dir)).await?;
        s.status = SandboxStatus::Running;
        s.status_reason = None;
        self.touch(&s.id);
        self.save(&s)?;
        Ok(s)
    }
}
