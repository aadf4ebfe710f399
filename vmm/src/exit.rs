//! Why the VMM stops, and the latch that carries the first reason to the main thread.
//!
//! The exit status of `belljar-vmm` is derived from it (the numbers are the contract's,
//! `belljar_vmm_api::exit`), so the daemon can tell a guest reboot from a power-off, a
//! `stop` request or a crash.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

pub use belljar_vmm_api::exit::ExitReason;

/// Holds the first exit reason reported; later ones are ignored.
#[derive(Debug, Default)]
pub struct ExitLatch {
    reason: Mutex<Option<ExitReason>>,
    cond: Condvar,
}

impl ExitLatch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `reason` unless one was recorded already.
    pub fn set(&self, reason: ExitReason) {
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        if r.is_none() {
            *r = Some(reason);
            self.cond.notify_all();
        }
    }

    /// The recorded reason, if any.
    pub fn get(&self) -> Option<ExitReason> {
        *self.reason.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits up to `timeout` for a reason.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<ExitReason> {
        let r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        let (r, _) = self
            .cond
            .wait_timeout_while(r, timeout, |r| r.is_none())
            .unwrap_or_else(|e| e.into_inner());
        *r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_reason_wins() {
        let l = ExitLatch::new();
        assert_eq!(l.wait_timeout(Duration::from_millis(1)), None);
        l.set(ExitReason::Reset);
        l.set(ExitReason::Failed);
        assert_eq!(l.get(), Some(ExitReason::Reset));
        assert_eq!(l.get().unwrap().exit_code(), 10);
    }
}
