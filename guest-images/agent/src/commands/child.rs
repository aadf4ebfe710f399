//! What a command's child process does between `clone` and `execve`.
//!
//! The child is made with `clone(CLONE_VM | CLONE_VFORK)` (see `spawn`): it runs on its own
//! stack inside the agent's memory while the thread that made it waits, so everything here is
//! a raw async-signal-safe syscall on memory prepared before the clone. It never allocates,
//! never takes a lock, and writes nothing but its own stack, `errno`, the script slot of
//! [`Plan::sh_argv`] and [`Plan::error`].
//! glibc's `setuid` family is not used: it would try to change the credentials of the agent's
//! threads too (glibc's thread list is the agent's, shared with this child), and wait for them.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};

/// The kernel's highest signal number (`_NSIG`, 64 on every Linux architecture we build for).
const LAST_SIGNAL: libc::c_int = 64;

/// Everything the child reads, prepared before the clone. The child writes only `error`.
pub struct Plan<'a> {
    /// The descriptors that become its stdin, stdout and stderr (all above 2).
    pub stdio: [RawFd; 3],
    pub pty: bool,
    pub oom_score: Option<&'static [u8]>,
    pub switch_user: bool,
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub groups: &'a [libc::gid_t],
    pub cwd: &'a CStr,
    /// The paths to try `execve` on, in order (see `spawn::candidates`).
    pub candidates: &'a [CString],
    pub argv: *const *const libc::c_char,
    pub envp: *const *const libc::c_char,
    /// `/bin/sh`, a slot for the script, then the arguments: for a file without `#!`, which
    /// `execvp` runs with the shell.
    pub sh_argv: *mut *const libc::c_char,
    /// The errno of the step that failed; 0 when the child exec'd.
    pub error: AtomicI32,
}

/// The child's whole life until `execve`; `arg` is the [`Plan`].
pub extern "C" fn main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Plan` that `spawn` keeps alive, and does not touch, until this
    // child has exec'd or exited, which is when `clone` returns with CLONE_VFORK.
    let plan = unsafe { &*(arg as *const Plan<'_>) };
    // SAFETY: we are that child (see `Plan::run`).
    let errno = unsafe { plan.run() };
    plan.error.store(errno.max(1), Ordering::Relaxed);
    // SAFETY: `_exit` ends only this child; it runs no atexit handler of the agent's.
    unsafe { libc::_exit(127) }
}

/// The calling thread's errno.
fn errno() -> libc::c_int {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Sets every signal to its default disposition and empties the signal mask. Both survive
/// `execve` (only handlers are reset by it), and the agent may have been given ignored or
/// blocked signals by whatever started it (a daemon under `nohup` ignores SIGHUP; glibc, Rust
/// and tokio block or ignore some for themselves), which a command must not inherit:
/// `kill -INT` and a broken pipe have to act on it. The handlers the agent installed must not
/// run in the child either: they would act on the agent's memory.
///
/// # Safety
/// Only in a child before `execve`: it changes the calling process's signal state.
unsafe fn reset_signals() -> Result<(), libc::c_int> {
    // A kernel `struct sigaction` with SIG_DFL (0) as its handler, no flags and an empty mask.
    // The raw syscall, because glibc's `sigaction` refuses the two real-time signals it keeps
    // for itself (32 and 33), which an ancestor may still have set to SIG_IGN.
    let default = [0usize; 4];
    for sig in 1..=LAST_SIGNAL {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction with a valid, zeroed action of the kernel's size and no old
        // action to write back; `sigsetsize` is the kernel's (8 bytes).
        if unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                default.as_ptr(),
                std::ptr::null_mut::<libc::c_void>(),
                8usize,
            )
        } != 0
        {
            return Err(errno());
        }
    }
    let empty = [0u64; 1];
    // SAFETY: rt_sigprocmask with a valid 8-byte empty set and no old set to write back.
    if unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            empty.as_ptr(),
            std::ptr::null_mut::<libc::c_void>(),
            8usize,
        )
    } != 0
    {
        return Err(errno());
    }
    Ok(())
}

impl Plan<'_> {
    /// Sets the child up and execs; returns the errno of the failing step.
    ///
    /// # Safety
    /// Only in the child of `clone(CLONE_VM | CLONE_VFORK)` made by `spawn` for this plan.
    unsafe fn run(&self) -> libc::c_int {
        // SAFETY: raw async-signal-safe syscalls on descriptors and memory prepared before
        // the clone (see the module's documentation).
        unsafe {
            if let Err(e) = reset_signals() {
                return e;
            }
            for (target, &fd) in (0..).zip(self.stdio.iter()) {
                if libc::dup2(fd, target) < 0 {
                    return errno();
                }
            }
            if libc::setsid() < 0 {
                return errno();
            }
            if self.pty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return errno();
            }
            // Commands inherit the agent's -1000; they must be the OOM killer's choice, not
            // immune like the agent (see `system::command_oom_score`). Raising the score needs
            // no privilege, but it must happen before the user switch makes /proc/self root's.
            if let Some(score) = self.oom_score {
                let fd = libc::open(
                    c"/proc/self/oom_score_adj".as_ptr(),
                    libc::O_WRONLY | libc::O_CLOEXEC,
                );
                if fd < 0 || libc::write(fd, score.as_ptr().cast(), score.len()) < 0 {
                    return errno();
                }
                libc::close(fd);
            }
            if self.switch_user
                && (libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr()) < 0
                    || libc::syscall(libc::SYS_setgid, self.gid) < 0
                    || libc::syscall(libc::SYS_setuid, self.uid) < 0)
            {
                return errno();
            }
            if libc::chdir(self.cwd.as_ptr()) < 0 {
                return errno();
            }
            self.exec()
        }
    }

    /// As `execvp`: the first candidate that runs wins, a file that is not an executable
    /// format runs with `/bin/sh`; EACCES is reported over ENOENT when no candidate runs, and
    /// errors other than "not here" stop the search. Returns only on failure.
    ///
    /// # Safety
    /// As [`Plan::run`].
    unsafe fn exec(&self) -> libc::c_int {
        let mut result = libc::ENOENT;
        let mut denied = false;
        for path in self.candidates {
            // SAFETY: `argv` and `envp` are null-terminated arrays of C strings that `spawn`
            // keeps alive; `sh_argv` has a slot at index 1 for the script's path.
            unsafe {
                libc::execve(path.as_ptr(), self.argv, self.envp);
                let e = errno();
                if e == libc::ENOEXEC {
                    *self.sh_argv.add(1) = path.as_ptr();
                    libc::execve(c"/bin/sh".as_ptr(), self.sh_argv.cast_const(), self.envp);
                    return e;
                }
                result = e;
            }
            match result {
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                e => return e,
            }
        }
        if denied { libc::EACCES } else { result }
    }
}
