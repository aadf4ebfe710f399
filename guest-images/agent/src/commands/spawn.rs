//! Starting a command: its own session and process group, a controlling terminal when it runs
//! on a PTY, every signal at its default disposition and none blocked, the requested user's
//! uid, gid and groups, and a clean environment.
//!
//! The child is made with `clone(CLONE_VM | CLONE_VFORK)`, as glibc's `posix_spawn` makes
//! its own, not with `fork`: copying the agent's page tables, the copy-on-write faults the
//! agent then took on every page it touched, and the child's unmapping of the copy at `execve`
//! were ~40 % of the agents' CPU time with many commands in flight. The child borrows the
//! agent's memory until it execs while the calling thread waits (see `child` for what it may
//! do meanwhile).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

use belljar_agent_proto::PtySize;
use nix::fcntl::OFlag;
use nix::pty::{Winsize, openpty};

use super::child;
use crate::fdio::set_cloexec;
use crate::users::User;

/// The child's stack until it execs: a few syscalls, nothing deep.
const CHILD_STACK: usize = 64 * 1024;

/// Where a program without a slash is looked for when the command's environment has no PATH
/// (glibc's `execvp` default).
const FALLBACK_PATH: &str = "/bin:/usr/bin";

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

fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A null-terminated array of pointers into `strings` (which must outlive it).
fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// The paths `execve` tries for `program`, in order: itself when it has a slash, else each
/// directory of the command's own PATH (an empty entry is the working directory), as
/// `execvp` does with the environment the command gets.
fn candidates(program: &str, env: &[(String, String)]) -> io::Result<Vec<CString>> {
    if program.contains('/') {
        return Ok(vec![cstring(program)?]);
    }
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or(FALLBACK_PATH, |(_, v)| v.as_str());
    path.split(':')
        .map(|dir| {
            let dir = if dir.is_empty() { "." } else { dir };
            cstring(&format!("{}/{program}", dir.trim_end_matches('/')))
        })
        .collect()
}

/// `fd`, moved above the standard descriptors, so that putting the child's ends on 0, 1 and 2
/// cannot overwrite one another (the agent may run without a stdin), and so that none of them
/// is already where `dup2` puts it (which would leave it close-on-exec).
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own; the result is a new descriptor that we
    // take ownership of.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` was just returned by fcntl and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(OFlag::O_CLOEXEC)?)
}

/// The child's standard descriptors (`theirs`) and the agent's ends: stdin, stdout, stderr
/// and the PTY's master.
type Ends = ([OwnedFd; 3], [Option<OwnedFd>; 4]);

fn ends(spec: &Spec<'_>) -> io::Result<Ends> {
    if let Some(size) = spec.pty {
        let pty = openpty(Some(&winsize(size)), None).map_err(io::Error::from)?;
        set_cloexec(pty.master.as_raw_fd())?;
        set_cloexec(pty.slave.as_raw_fd())?;
        let slave = above_stdio(pty.slave)?;
        return Ok((
            [slave.try_clone()?, slave.try_clone()?, slave],
            [None, None, None, Some(pty.master)],
        ));
    }
    let (stdin_theirs, stdin_ours) = if spec.stdin {
        let (r, w) = pipe()?;
        (r, Some(w))
    } else {
        let null = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")?;
        (OwnedFd::from(null), None)
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    Ok((
        [
            above_stdio(stdin_theirs)?,
            above_stdio(out_w)?,
            above_stdio(err_w)?,
        ],
        [stdin_ours, Some(out_r), Some(err_r), None],
    ))
}

/// Starts `spec`. Errors from `exec` (no such program) and from the setup in the child come
/// back as the `io::Error` of the failing call, and such a child is already reaped: call it
/// with the reaper locked out (`Reaper::spawn`).
pub fn spawn(spec: &Spec<'_>) -> io::Result<Spawned> {
    let argv: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| cstring(a))
        .collect::<io::Result<_>>()?;
    let env: Vec<CString> = spec
        .env
        .iter()
        .map(|(k, v)| cstring(&format!("{k}={v}")))
        .collect::<io::Result<_>>()?;
    let candidates = candidates(&spec.argv[0], &spec.env)?;
    let cwd = cstring(spec.cwd)?;
    let argv_ptrs = pointers(&argv);
    let env_ptrs = pointers(&env);
    let mut sh_argv: Vec<*const libc::c_char> = [c"/bin/sh".as_ptr(), std::ptr::null()]
        .into_iter()
        .chain(argv_ptrs[1..].iter().copied())
        .collect();
    let (theirs, ours) = ends(spec)?;

    let plan = child::Plan {
        stdio: [
            theirs[0].as_raw_fd(),
            theirs[1].as_raw_fd(),
            theirs[2].as_raw_fd(),
        ],
        pty: spec.pty.is_some(),
        oom_score: crate::system::command_oom_score(),
        switch_user: spec.switch_user,
        uid: spec.user.uid,
        gid: spec.user.gid,
        groups: &spec.user.groups,
        cwd: &cwd,
        candidates: &candidates,
        argv: argv_ptrs.as_ptr(),
        envp: env_ptrs.as_ptr(),
        sh_argv: sh_argv.as_mut_ptr(),
        error: AtomicI32::new(0),
    };
    let mut stack: Vec<u8> = Vec::with_capacity(CHILD_STACK);
    // The stack grows down from its end, 16-byte aligned as the ABI wants.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK) & !15;

    let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: every signal is blocked in this thread across the clone, so that no handler of
    // the agent runs in the child (on the agent's memory) before the child resets them all;
    // the child starts with this mask and empties it itself. `child::main` gets a pointer to
    // `plan`, which lives, untouched by anyone else, until `clone` returns, which with
    // CLONE_VFORK is after the child exec'd or exited; `top` is the end of `stack`, which
    // outlives the child's use of it for the same reason.
    let pid = unsafe {
        libc::sigfillset(all.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr());
        let pid = libc::clone(
            child::main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &plan as *const child::Plan<'_> as *mut libc::c_void,
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut());
        if pid < 0 {
            return Err(clone_error);
        }
        pid
    };
    drop(stack);
    // The child has its copies (a PTY's slave included): the master sees EOF once the command
    // and its descendants are done with the terminal.
    drop(theirs);
    let error = plan.error.load(Ordering::Relaxed);
    if error != 0 {
        // The child failed before exec and has exited; the caller holds the reaper's lock,
        // so this status is ours to collect.
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        return Err(io::Error::from_raw_os_error(error));
    }
    let [stdin, stdout, stderr, pty_master] = ours;
    Ok(Spawned {
        pid: pid as u32,
        stdin,
        stdout,
        stderr,
        pty_master,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_looked_up_in_the_commands_own_path() {
        let env = vec![("PATH".to_owned(), "/opt/x/:/usr/bin:".to_owned())];
        let found: Vec<_> = candidates("tool", &env)
            .unwrap()
            .into_iter()
            .map(|c| c.into_string().unwrap())
            .collect();
        assert_eq!(found, ["/opt/x/tool", "/usr/bin/tool", "./tool"]);
        assert_eq!(candidates("./a/b", &env).unwrap(), [c"./a/b".to_owned()]);
        assert_eq!(
            candidates("sh", &[]).unwrap(),
            [c"/bin/sh".to_owned(), c"/usr/bin/sh".to_owned()]
        );
    }
}
