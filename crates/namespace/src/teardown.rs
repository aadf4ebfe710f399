//! The end of a namespace sandbox's life: stopping its processes and deleting its state,
//! apart from the launch in `lifecycle` (a rootless deletion needs a child in a user
//! namespace, which launch does not).

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use nix::unistd::Uid;

use crate::disk;
use crate::idmap::IdMap;
use crate::lifecycle::Error;
use crate::state::{ExitWatch, State};

/// SIGTERM to PID 1, SIGKILL after `grace`; then the cgroups are removed. Stopping a sandbox
/// that is not running only cleans up.
pub fn stop(state_dir: &Path, grace: Duration) -> Result<(), Error> {
    // A tap handed over at launch and never attached would keep the device alive.
    drop(crate::tap_handoff::take(state_dir));
    let result = stop_processes(state_dir, grace);
    // The host's mount of the disk; the sandbox's own copy went with its mount namespace.
    if result.is_ok() {
        disk::unmount(&state_dir.join("fs"));
    }
    result
}

fn stop_processes(state_dir: &Path, grace: Duration) -> Result<(), Error> {
    let Some(st) = State::load(state_dir)? else {
        return Ok(());
    };
    if let Some(watch) = ExitWatch::open(st.pid, st.start_time)? {
        // The kernel drops signals from outside to a PID namespace's init unless it handles
        // them, so waiting for a SIGTERM it does not catch would only waste the grace period.
        let grace = if catches_sigterm(st.pid) {
            grace
        } else {
            Duration::ZERO
        };
        // A frozen sandbox could not react to SIGTERM.
        let _ = st.groups.set_frozen(false);
        watch.signal(libc::SIGTERM).map_err(Error::Signal)?;
        if !watch.wait(Some(grace)) {
            // Killing a PID namespace's init kills every process in it.
            watch.signal(libc::SIGKILL).map_err(Error::Signal)?;
            if !watch.wait(Some(Duration::from_secs(10))) {
                return Err(Error::Unkillable);
            }
        }
    }
    // The rest of the namespace dies with PID 1, asynchronously; frozen tasks must thaw to die.
    let _ = st.groups.set_frozen(false);
    st.groups.remove(Duration::from_secs(10))?;
    Ok(())
}

/// Whether `pid` has a handler for SIGTERM (`SigCgt` in `/proc/<pid>/status`).
fn catches_sigterm(pid: u32) -> bool {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGTERM - 1)) != 0)
}

/// Stops the sandbox if needed, then deletes its writable layer and all its state.
pub fn destroy(state_dir: &Path) -> Result<(), Error> {
    if !state_dir.exists() {
        return Ok(());
    }
    stop(state_dir, Duration::from_millis(200))?;
    crate::layer::forget_captures(state_dir);
    let mut result = fs::remove_dir_all(state_dir);
    if matches!(&result, Err(e) if e.kind() == io::ErrorKind::PermissionDenied) {
        // The overlay leaves `work/work` with mode 000; without CAP_DAC_OVERRIDE (rootless)
        // the owner must open such directories up before deleting them.
        open_up(state_dir);
        result = fs::remove_dir_all(state_dir);
    }
    let rootless = !Uid::effective().is_root();
    if rootless && matches!(&result, Err(e) if e.kind() == io::ErrorKind::PermissionDenied) {
        // Rootless with subordinate ids: files made by other users inside belong to
        // subordinate host ids; only root of a namespace with the same mapping may delete them.
        remove_in_namespace(state_dir)?;
        result = fs::remove_dir_all(state_dir);
    }
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Remove {
            path: state_dir.to_owned(),
            source,
        }),
    }
}

/// Deletes `dir` from a child that is root of a user namespace with the rootless mapping.
pub(crate) fn remove_in_namespace(dir: &Path) -> Result<(), Error> {
    let map = IdMap::rootless()?;
    let userns = map.create_namespace()?;
    let remove_err = |source| Error::Remove {
        path: dir.to_owned(),
        source,
    };
    // SAFETY: the child joins the namespace, deletes the tree and exits without returning;
    // glibc's malloc is usable after fork.
    match unsafe { nix::unistd::fork() }.map_err(|e| remove_err(e.into()))? {
        nix::unistd::ForkResult::Child => {
            // SAFETY: plain system calls; `_exit` never returns.
            unsafe {
                let ok = libc::setns(userns.as_raw_fd(), libc::CLONE_NEWUSER) == 0
                    && libc::setresgid(0, 0, 0) == 0
                    && libc::setresuid(0, 0, 0) == 0
                    && fs::remove_dir_all(dir).is_ok();
                libc::_exit(if ok { 0 } else { 1 })
            }
        }
        nix::unistd::ForkResult::Parent { child } => {
            let status = nix::sys::wait::waitpid(child, None).map_err(|e| remove_err(e.into()))?;
            match status {
                nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
                _ => Err(remove_err(io::Error::from_raw_os_error(libc::EPERM))),
            }
        }
    }
}

/// Adds `u+rwx` to every directory under `dir` (not following symlinks), best effort.
fn open_up(dir: &Path) {
    let Ok(meta) = fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let mode = meta.permissions().mode() | 0o700;
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(mode));
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        open_up(&entry.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn sigterm_handlers_are_seen() {
        // The test harness does not catch SIGTERM; `sleep` neither.
        assert!(!catches_sigterm(std::process::id()));
        let mut child = std::process::Command::new("sh")
            .args(["-c", "trap 'exit 0' TERM; while :; do sleep 0.05; done"])
            .spawn()
            .unwrap();
        // The shell installs its trap soon after it starts: wait for it, with a deadline.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !catches_sigterm(child.id()) {
            assert!(Instant::now() < deadline, "the trap was never seen");
            std::thread::sleep(Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
