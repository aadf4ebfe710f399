//! The one place that calls `waitpid`: as PID 1 the agent must reap every orphan, but a
//! `waitpid(-1)` loop would steal the exit status of the commands it is waiting on. So every
//! child is spawned through [`Reaper::spawn`], which registers its pid under the same lock the
//! reaper holds while it reaps, and each exit is dispatched to whoever registered that pid.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    /// Installing the SIGCHLD handler failed.
    #[error("Cannot watch SIGCHLD")]
    Signal(#[source] io::Error),
}

/// Reaps children and hands each exit status to the task that spawned the child.
#[derive(Debug, Default)]
pub struct Reaper {
    waiters: Mutex<HashMap<i32, oneshot::Sender<Exit>>>,
}

impl Reaper {
    /// Starts reaping on SIGCHLD (and once a second, in case a signal was coalesced away).
    /// Must be called inside a tokio runtime, before any child is spawned.
    pub fn start() -> Result<Arc<Self>, ReaperError> {
        let reaper = Arc::new(Self::default());
        let mut sigchld = signal(SignalKind::child()).map_err(ReaperError::Signal)?;
        let weak = Arc::downgrade(&reaper);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = sigchld.recv() => {}
                    _ = tick.tick() => {}
                }
                match weak.upgrade() {
                    Some(reaper) => reaper.reap(),
                    None => break,
                }
            }
        });
        Ok(reaper)
    }

    /// Runs `spawn` (which forks a child and returns its pid) with the reaper locked out, then
    /// registers the pid, so the child's exit cannot be reaped before someone waits for it.
    /// std's `Command::spawn` itself waits for a child whose `exec` failed; holding the lock
    /// also keeps the reaper from racing it.
    pub fn spawn<T>(
        &self,
        spawn: impl FnOnce() -> io::Result<(u32, T)>,
    ) -> io::Result<(u32, T, oneshot::Receiver<Exit>)> {
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        let (pid, extra) = spawn()?;
        let (tx, rx) = oneshot::channel();
        waiters.insert(pid as i32, tx);
        Ok((pid, extra, rx))
    }

    /// Reaps every child that has exited.
    pub fn reap(&self) {
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let (pid, exit) = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, Exit::Code(code)),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, Exit::Signal(sig as i32)),
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!("waitpid failed: {e}");
                    break;
                }
            };
            match waiters.remove(&pid.as_raw()) {
                Some(tx) => {
                    let _ = tx.send(exit);
                }
                None => tracing::debug!(pid = pid.as_raw(), ?exit, "reaped an orphan"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dispatches_exit_status_by_pid() {
        let reaper = Reaper::start().unwrap();
        let spawn = |code: &str| {
            let code = code.to_owned();
            reaper
                .spawn(|| {
                    let child = std::process::Command::new("/bin/sh")
                        .arg("-c")
                        .arg(format!("exit {code}"))
                        .spawn()?;
                    Ok((child.id(), ()))
                })
                .unwrap()
        };
        let (_, _, a) = spawn("3");
        let (_, _, b) = spawn("5");
        let killed = reaper
            .spawn(|| {
                let child = std::process::Command::new("/bin/sh")
                    .arg("-c")
                    .arg("kill -9 $$")
                    .spawn()?;
                Ok((child.id(), ()))
            })
            .unwrap()
            .2;
        assert_eq!(a.await.unwrap(), Exit::Code(3));
        assert_eq!(b.await.unwrap(), Exit::Code(5));
        assert_eq!(killed.await.unwrap(), Exit::Signal(9));
    }
}
