//! Keeping the records true to the world: adoption of sandboxes after a daemon restart, the
//! timeout that stops a sandbox, and noticing a sandbox that died on its own.

use std::time::Duration;

use belljar_api::{Sandbox, SandboxStatus};

use super::{SandboxError, Sandboxes};
use crate::util::now_ms;

/// How often expiry is checked.
const TICK: Duration = Duration::from_millis(200);
/// Liveness is checked every this many ticks.
const ALIVE_EVERY: u32 = 10;

impl Sandboxes {
    /// At start: re-attaches to sandboxes that still run and settles those that ended while
    /// the daemon was away.
    pub async fn adopt_all(&self) -> Result<(), SandboxError> {
        let unsettled = self.inner.store.sandboxes_with_status(&[
            SandboxStatus::Pending,
            SandboxStatus::Running,
            SandboxStatus::Paused,
            SandboxStatus::Stopping,
        ])?;
        for s in unsettled {
            let dir = self.state_dir(&s.id);
            let adopted = self.blocking_backend(&s, move |b| b.adopt(&dir)).await;
            match (s.status, adopted) {
                (SandboxStatus::Running | SandboxStatus::Paused, Ok(Some(_))) => {
                    tracing::info!(sandbox = %s.id, "adopted a running sandbox");
                    self.reattach(&s)?;
                }
                (SandboxStatus::Running | SandboxStatus::Paused, result) => {
                    if let Err(e) = result {
                        tracing::warn!(sandbox = %s.id, error = %e, "cannot adopt sandbox");
                    }
                    self.settle_dead(&s.id, "the sandbox ended while the daemon was not running")
                        .await?;
                }
                (SandboxStatus::Pending, _) => {
                    self.stop_with(
                        &s.id,
                        SandboxStatus::Failed,
                        "the daemon restarted while the sandbox was starting",
                    )
                    .await?;
                }
                _ => {
                    let reason = s.status_reason.clone().unwrap_or_else(|| "stopped".into());
                    self.stop_with(&s.id, SandboxStatus::Stopped, &reason)
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Follows the output of the sandbox's commands again, from the first line not yet stored.
    fn reattach(&self, s: &Sandbox) -> Result<(), SandboxError> {
        for rec in self.inner.store.running_commands(&s.id)? {
            let lines = super::logs::repair(&rec.log_path)?;
            let state = self.inner.logs.register(&rec.command.id, lines);
            self.spawn_pump(rec, state);
        }
        Ok(())
    }

    /// Records that a running sandbox is gone without being stopped by the daemon.
    async fn settle_dead(&self, id: &str, reason: &str) -> Result<(), SandboxError> {
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let mut s = self.get(id)?;
        if s.status.is_final() {
            return Ok(());
        }
        let dir = self.state_dir(id);
        let grace = self.inner.settings.stop_grace;
        // Clears what the backend left behind (cgroups); the sandbox itself is gone.
        let _ = self
            .blocking_backend(&s, move |b| b.stop(&dir, grace))
            .await;
        self.forget_agent(id);
        self.lose_running_commands(id)?;
        s.status = SandboxStatus::Failed;
        s.status_reason = Some(reason.to_owned());
        s.stopped_at = Some(now_ms());
        s.expires_at = None;
        self.save(&s)
    }

    /// Stops expired sandboxes and notices dead ones, until the daemon exits.
    pub fn spawn_monitor(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick: u32 = 0;
            loop {
                tokio::time::sleep(TICK).await;
                tick = tick.wrapping_add(1);
                let running = match this
                    .inner
                    .store
                    .sandboxes_with_status(&[SandboxStatus::Running])
                {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(error = %e, "monitor cannot read sandboxes");
                        continue;
                    }
                };
                let now = now_ms();
                for s in running {
                    if s.expires_at.is_some_and(|e| e <= now) {
                        let this = this.clone();
                        tokio::spawn(async move {
                            if let Err(e) = this
                                .stop_with(&s.id, SandboxStatus::Stopped, "timeout")
                                .await
                            {
                                tracing::warn!(sandbox = %s.id, error = %e, "cannot stop an expired sandbox");
                            }
                        });
                    } else if tick.is_multiple_of(ALIVE_EVERY) {
                        let dir = this.state_dir(&s.id);
                        let alive = this.blocking_backend(&s, move |b| Ok(b.alive(&dir))).await;
                        if matches!(alive, Ok(false)) {
                            let this = this.clone();
                            tokio::spawn(async move {
                                let _ = this
                                    .settle_dead(
                                        &s.id,
                                        "the sandbox's processes ended unexpectedly",
                                    )
                                    .await;
                            });
                        }
                    }
                }
            }
        })
    }
}
