//! What a sandbox leaves in its state directory so that another daemon process can find it.
//!
//! `sandbox.json` records PID 1's host pid and its start time (clock ticks since boot, from
//! `/proc/<pid>/stat`), which together name one process even after pid reuse, plus the
//! cgroups made for it. `sandbox.pid` holds the bare pid for humans and scripts.

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cgroup::{Groups, LimitsReport};

/// Errors reading or writing sandbox state.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("Cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is corrupt", path.display())]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("Cannot watch process {pid}")]
    Pidfd {
        pid: u32,
        #[source]
        source: io::Error,
    },
}

pub(crate) const STATE_FILE: &str = "sandbox.json";
pub(crate) const PID_FILE: &str = "sandbox.pid";

/// The contents of `sandbox.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct State {
    pub id: String,
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat`.
    pub start_time: u64,
    pub socket: PathBuf,
    pub groups: Groups,
    pub limits: LimitsReport,
    /// Host uid that is root inside.
    pub root_uid: u32,
    /// The id block (as root) or the invoking user (rootless).
    pub rootless: bool,
    /// The host's boot when PID 1 started (`/proc/sys/kernel/random/boot_id`): a relaunch
    /// on the same writable layer in the same boot knows that no host crash came between.
    #[serde(default)]
    pub boot_id: Option<String>,
}

/// This boot of the host, as the kernel names it.
pub(crate) fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
}

impl State {
    pub fn save(&self, dir: &Path) -> Result<(), Error> {
        let path = dir.join(STATE_FILE);
        let tmp = dir.join(".sandbox.json.tmp");
        let text = serde_json::to_vec_pretty(self).expect("state serializes");
        fs::write(&tmp, text)
            .and_then(|()| fs::rename(&tmp, &path))
            .and_then(|()| fs::write(dir.join(PID_FILE), format!("{}\n", self.pid)))
            .map_err(|source| Error::Write { path, source })
    }

    pub fn load(dir: &Path) -> Result<Option<Self>, Error> {
        let path = dir.join(STATE_FILE);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| Error::Corrupt { path, source }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Read { path, source }),
        }
    }

    /// Whether the recorded process is alive and the same one (not a reused pid).
    pub fn is_alive(&self) -> bool {
        start_time(self.pid) == Some(self.start_time)
    }
}

/// Field 22 (starttime) of `/proc/<pid>/stat`, for a live (not zombie, not dead) process.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    use procfs_core::FromRead;
    let stat = procfs_core::process::Stat::from_file(format!("/proc/{pid}/stat")).ok()?;
    (!matches!(stat.state, 'Z' | 'X')).then_some(stat.starttime)
}

/// A handle that tells when a sandbox's PID 1 has exited; works for processes that are not
/// the caller's children (a sandbox found again by `adopt`).
///
/// The fd is a pidfd: it polls readable once the process has exited, so an event loop can
/// wait on it (e.g. tokio's `AsyncFd`).
#[derive(Debug)]
pub struct ExitWatch {
    fd: OwnedFd,
    pid: u32,
}

impl ExitWatch {
    /// Opens a watch on `pid` if it is still the process that started at `start`.
    pub(crate) fn open(pid: u32, start: u64) -> Result<Option<Self>, Error> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd =
            unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0 as libc::c_long) };
        let fd = match crate::conv::fd(fd) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
            Err(source) => return Err(Error::Pidfd { pid, source }),
        };
        // SAFETY: the fd was just returned by the kernel and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // Checked after opening: if the start time still matches, the fd names our process.
        if start_time(pid) != Some(start) {
            return Ok(None);
        }
        Ok(Some(Self { fd, pid }))
    }

    /// The host pid being watched.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process has exited.
    pub fn has_exited(&self) -> bool {
        self.poll(0)
    }

    /// Waits for the exit; `None` waits forever. Returns whether it exited.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        let Some(timeout) = timeout else {
            while !self.poll(-1) {}
            return true;
        };
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
            if self.poll(ms) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }

    fn poll(&self, timeout_ms: i32) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        n > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
    }

    /// Sends `signal` through the pidfd (never to a reused pid).
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        // SAFETY: pidfd_send_signal with a valid pidfd, a signal number and no siginfo.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if ret < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ESRCH) {
                return Ok(());
            }
            return Err(e);
        }
        Ok(())
    }
}

impl AsFd for ExitWatch {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for ExitWatch {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_start_time_is_readable_and_stable() {
        let me = std::process::id();
        let a = start_time(me).unwrap();
        assert_eq!(start_time(me), Some(a));
        assert_eq!(start_time(u32::MAX - 1), None);
    }

    #[test]
    fn exit_watch_sees_a_child_exit() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let start = start_time(child.id()).unwrap();
        let watch = ExitWatch::open(child.id(), start).unwrap().unwrap();
        assert!(!watch.has_exited());
        assert!(watch.wait(Some(Duration::from_secs(5))));
        child.wait().unwrap();
        // A wrong start time is a different process.
        assert!(ExitWatch::open(std::process::id(), 1).unwrap().is_none());
    }
}
