//! Forking a command: its own session and process group, a controlling terminal when it runs
//! on a PTY, every signal at its default disposition and none blocked, the requested user's
//! uid, gid and groups, and a clean environment. Everything the child does between fork and
//! exec is a raw async-signal-safe syscall on memory prepared before the fork.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::Stdio;

use belljar_agent_proto::PtySize;
use nix::pty::{Winsize, openpty};

use crate::fdio::set_cloexec;
use crate::users::User;

/// What to start.
#[derive(Debug)]
pub struct Spec<'a> {
    pub argv: &'a [String],
    pub cwd: &'a str,
    pub env: Vec<(String, String)>,
    pub user: &'a User,
    /// Switch to `user` (only possible, and only done, when the agent is root).
    pub switch_user: bool,
    pub pty: Option<PtySize>,
    pub stdin: bool,
}

/// The parent's ends of a started command.
#[derive(Debug)]
pub struct Spawned {
    pub pid: u32,
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    pub pty_master: Option<OwnedFd>,
}

/// The kernel's window size record for `size`.
pub fn winsize(size: PtySize) -> Winsize {
    Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// The kernel's highest signal number (`_NSIG`, 64 on every Linux architecture we build for).
const LAST_SIGNAL: libc::c_int = 64;

/// Sets every signal to its default disposition and empties the signal mask, in a forked
/// child before `execve`. Both survive `execve` (only handlers are reset by it), and the agent
/// may have been given ignored or blocked signals by whatever started it (a daemon under
/// `nohup` ignores SIGHUP; glibc, Rust and tokio block or ignore some for themselves), which
/// a command must not inherit: `kill -INT` and a broken pipe have to act on it.
///
/// # Safety
/// Only between fork and exec: it changes the calling process's signal state.
unsafe fn reset_signals() -> io::Result<()> {
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
            return Err(io::Error::last_os_error());
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
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Forks and execs `spec`. Errors from `exec` (no such program) and from the setup in the
/// child come back as the `io::Error` of the failing call.
pub fn spawn(spec: &Spec<'_>) -> io::Result<Spawned> {
    let mut cmd = std::process::Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(spec.env.iter().cloned());

    let mut master = None;
    if let Some(size) = spec.pty {
        let pty = openpty(Some(&winsize(size)), None).map_err(io::Error::from)?;
        set_cloexec(pty.master.as_raw_fd())?;
        set_cloexec(pty.slave.as_raw_fd())?;
        cmd.stdin(Stdio::from(pty.slave.try_clone()?))
            .stdout(Stdio::from(pty.slave.try_clone()?))
            .stderr(Stdio::from(pty.slave));
        master = Some(pty.master);
    } else {
        cmd.stdin(if spec.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    }

    let cwd = CString::new(std::ffi::OsStr::new(spec.cwd).as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let groups: Vec<libc::gid_t> = spec.user.groups.clone();
    let (uid, gid) = (spec.user.uid, spec.user.gid);
    let switch_user = spec.switch_user;
    let pty = spec.pty.is_some();
    let oom_score = crate::system::command_oom_score();
    let setup = move || -> io::Result<()> {
        // SAFETY: only async-signal-safe syscalls on memory (`groups`, `cwd`) that was
        // allocated before the fork and is not touched by anyone else in the child.
        unsafe {
            reset_signals()?;
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if pty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            // Commands inherit the agent's -1000; they must be the OOM killer's choice, not
            // immune like the agent (see `system::command_oom_score`). Raising the score needs
            // no privilege, but it must happen before the user switch makes /proc/self root's.
            if let Some(score) = oom_score {
                let fd = libc::open(
                    c"/proc/self/oom_score_adj".as_ptr(),
                    libc::O_WRONLY | libc::O_CLOEXEC,
                );
                if fd < 0 || libc::write(fd, score.as_ptr().cast::<libc::c_void>(), score.len()) < 0
                {
                    return Err(io::Error::last_os_error());
                }
                libc::close(fd);
            }
            if switch_user
                && (libc::setgroups(groups.len(), groups.as_ptr()) < 0
                    || libc::setgid(gid) < 0
                    || libc::setuid(uid) < 0)
            {
                return Err(io::Error::last_os_error());
            }
            if libc::chdir(cwd.as_ptr()) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: `setup` only makes async-signal-safe syscalls (see above), as `pre_exec`
    // requires of code that runs between fork and exec.
    unsafe {
        cmd.pre_exec(setup);
    }
    let mut child = cmd.spawn()?;
    // The child has its copies of the PTY slave; dropping `cmd` closes ours, so the master
    // sees EOF when the command and its descendants are done with the terminal.
    drop(cmd);
    Ok(Spawned {
        pid: child.id(),
        stdin: child.stdin.take().map(OwnedFd::from),
        stdout: child.stdout.take().map(OwnedFd::from),
        stderr: child.stderr.take().map(OwnedFd::from),
        pty_master: master,
    })
}
