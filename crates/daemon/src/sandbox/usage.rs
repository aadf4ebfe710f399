//! A sandbox's resource use (`GET /v1/sandboxes/{id}/usage`), as its backend measures it
//! from the host. A paused sandbox is measured as it stands: reading counters wakes nothing,
//! so it stays paused and its idle timer is not touched.

use belljar_api::{SandboxStatus, SandboxUsage};

use super::{SandboxError, Sandboxes};

impl Sandboxes {
    /// What the running or paused sandbox `id` uses now.
    pub async fn usage(&self, id: &str) -> Result<SandboxUsage, SandboxError> {
        let s = self.record(id)?;
        if !matches!(s.status, SandboxStatus::Running | SandboxStatus::Paused) {
            return Err(not_running(s));
        }
        let dir = self.state_dir(id);
        match self.blocking_backend(&s, move |b| b.usage(&dir)).await? {
            Some(usage) => Ok(usage),
            // It ended meanwhile: its record says how, or will once the monitor sees it.
            None => Err(not_running(self.record(id)?)),
        }
    }
}

/// The error for a sandbox that does not run; one whose record has not caught up with its
/// end yet is `stopping`.
fn not_running(s: belljar_api::Sandbox) -> SandboxError {
    SandboxError::NotRunning {
        id: s.id,
        status: match s.status {
            SandboxStatus::Running | SandboxStatus::Paused => SandboxStatus::Stopping.as_str(),
            other => other.as_str(),
        },
    }
}
