//! Changing a sandbox's lifetime and size after its creation: its timeout (and the deadline
//! of the running session), its hard TTL, auto-resume, and its memory and vCPUs. Sandbox0's
//! update and refresh are these: a refresh moves the deadlines to now, an update replaces the
//! limits. The size of a sandbox changes only while it is stopped (a persistent sandbox's
//! next start boots with it); the caller stops and starts it around the change.

use belljar_api::{Sandbox, SandboxStatus, limits};

use super::{SandboxError, Sandboxes};
use crate::util::now_ms;

/// What to change; `None` keeps a setting as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconfigure {
    /// The total run time of each session from its start, ms (the next start's too).
    pub timeout_ms: Option<i64>,
    /// The running session's deadline, ms from now.
    pub expires_in_ms: Option<i64>,
    /// The hard TTL, counted from now; `Some(None)` removes it.
    pub hard_ttl_ms: Option<Option<i64>>,
    pub auto_resume: Option<bool>,
    /// The memory limit, MiB: only while the sandbox is stopped.
    pub memory_mib: Option<u64>,
    /// vCPUs: only while the sandbox is stopped.
    pub vcpus: Option<u32>,
}

impl Sandboxes {
    /// Applies `change` to the sandbox under its lock; the monitor and the lifetime task
    /// follow the new deadlines at once.
    pub async fn reconfigure(
        &self,
        id: &str,
        change: Reconfigure,
    ) -> Result<Sandbox, SandboxError> {
        let max = self.inner.settings.max_timeout_ms;
        let bad = |field: &str, what: String| SandboxError::BadRequest(format!("{field}: {what}"));
        for (field, value) in [
            ("timeout_ms", change.timeout_ms),
            ("expires_in_ms", change.expires_in_ms),
        ] {
            if value.is_some_and(|v| !(1..=max).contains(&v)) {
                return Err(bad(field, format!("must be 1..={max}")));
            }
        }
        if let Some(Some(ttl)) = change.hard_ttl_ms
            && !(1..=belljar_api::MAX_EXPIRATION_MS).contains(&ttl)
        {
            return Err(bad(
                "hard_ttl_ms",
                format!("must be 1..={}", belljar_api::MAX_EXPIRATION_MS),
            ));
        }
        if let Some(m) = change.memory_mib
            && !(limits::MIN_MEMORY_MIB..=limits::MAX_MEMORY_MIB).contains(&m)
        {
            return Err(bad(
                "memory_mib",
                format!(
                    "must be {}..={}",
                    limits::MIN_MEMORY_MIB,
                    limits::MAX_MEMORY_MIB
                ),
            ));
        }
        if let Some(v) = change.vcpus
            && !(1..=limits::MAX_VCPUS).contains(&v)
        {
            return Err(bad("vcpus", format!("must be 1..={}", limits::MAX_VCPUS)));
        }
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let mut s = self.record(id)?;
        let resized = change.memory_mib.is_some_and(|m| m != s.memory_mib)
            || change.vcpus.is_some_and(|v| v != s.vcpus);
        if resized && !s.status.is_final() {
            return Err(SandboxError::Conflict(format!(
                "Sandbox {id} is {}: its memory and vCPUs change only while it is stopped",
                s.status
            )));
        }
        let now = now_ms();
        let live = matches!(s.status, SandboxStatus::Running | SandboxStatus::Paused);
        if let Some(t) = change.timeout_ms {
            s.timeout_ms = t;
        }
        if let Some(ms) = change.expires_in_ms
            && live
        {
            s.expires_at = Some(now.saturating_add(ms));
        }
        if let Some(ttl) = change.hard_ttl_ms {
            s.lifecycle.hard_ttl_ms = ttl;
            s.lifecycle.deletes_at = ttl.map(|t| now.saturating_add(t));
        }
        if let Some(a) = change.auto_resume {
            s.lifecycle.auto_resume = a;
        }
        if let Some(m) = change.memory_mib {
            s.memory_mib = m;
        }
        if let Some(v) = change.vcpus {
            s.vcpus = v;
        }
        self.save(&s)?;
        self.get(id)
    }
}
