//! Starting a command: its own session and process group, a controlling terminal when it runs
//! on a PTY, the requested user's uid, gid and groups, and a clean environment.
//!
//! The child is made with `clone(CLONE_VM | CLONE_VFORK)`, as glibc's `posix_spawn` and Go's
//! `forkExec` make theirs, not with `fork`: copying the agent's page tables, and the
//! copy-on-write faults the agent then took on every page it touched, were ~40 % of the agent's
//! time with many commands in flight. The child borrows the agent's memory (on its own stack)
//! until it execs while the calling thread waits, so it only makes raw async-signal-safe calls
//! on memory prepared before the clone and writes nothing but its error number.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use belljar_agent_proto::PtySize;
use nix::fcntl::OFlag;
use nix::pty::{Winsize, openpty};

use crate::fdio::set_cloexec;
use crate::users::User;

/// The child's stack until it execs: it calls a few libc wrappers, nothing deep.
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
/// cannot overwrite one another (the agent may run without a stdin).
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

/// Everything the child reads, prepared before the clone. The child writes only `error`.
struct ChildPlan<'a> {
    /// The descriptors that become its stdin, stdout and stderr (all above 2).
    stdio: [RawFd; 3],
    pty: bool,
    oom_score: Option<&'static [u8]>,
    switch_user: bool,
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: &'a [libc::gid_t],
    cwd: &'a CStr,
    candidates: &'a [CString],
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// `/bin/sh`, a slot for the script, then the arguments: for a file without `#!`, which
    /// `execvp` runs with the shell.
    sh_argv: *mut *const libc::c_char,
    empty_mask: libc::sigset_t,
    max_signal: libc::c_int,
    /// The errno of the step that failed; 0 when the child exec'd.
    error: AtomicI32,
}

/// The child's whole life until `execve`. Runs on its own stack inside the agent's memory.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildPlan` that `spawn` keeps alive (and does not touch) until
    // this child has exec'd or exited, which is when `clone` returns with CLONE_VFORK.
    let plan = unsafe { &*(arg as *const ChildPlan<'_>) };
    // SAFETY: see `ChildPlan::run`.
    let errno = unsafe { plan.run() };
    plan.error.store(errno.max(1), Ordering::Relaxed);
    // SAFETY: `_exit` ends only this child (it has no thread group with the agent).
    unsafe { libc::_exit(127) }
}

impl ChildPlan<'_> {
    /// Sets the child up and execs; returns the errno of the failing step.
    ///
    /// # Safety
    /// Only in the child of `clone(CLONE_VM | CLONE_VFORK)`: it makes async-signal-safe calls
    /// only, never allocates, and writes only into memory that `spawn` prepared for it.
    unsafe fn run(&self) -> libc::c_int {
        let errno = || {
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        };
        // SAFETY: async-signal-safe libc calls on descriptors and memory prepared before the
        // clone; the user switch uses raw syscalls, because glibc's `setuid` family would
        // try to change the credentials of the agent's threads too.
        unsafe {
            // Handlers the agent installed must not run here (they would act on the agent's
            // memory); ignored signals stay ignored across exec, except SIGPIPE, which Rust
            // ignores for itself and std gives back to children.
            for sig in 1..=self.max_signal {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                    continue;
                }
                if sig == libc::SIGPIPE
                    || (old.sa_sigaction != libc::SIG_IGN && old.sa_sigaction != libc::SIG_DFL)
                {
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(sig, &dfl, std::ptr::null_mut());
                }
            }
            if libc::sigprocmask(libc::SIG_SETMASK, &self.empty_mask, std::ptr::null_mut()) != 0 {
                return errno();
            }
            for (target, &fd) in self.stdio.iter().enumerate() {
                if libc::dup2(fd, target as RawFd) < 0 {
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
            // As `execvp`: the first candidate that runs wins; EACCES is reported over ENOENT
            // when no candidate runs; other errors stop the search.
            let mut result = libc::ENOENT;
            let mut denied = false;
            for path in self.candidates {
                libc::execve(path.as_ptr(), self.argv, self.envp);
                let e = errno();
                if e == libc::ENOEXEC {
                    *self.sh_argv.add(1) = path.as_ptr();
                    libc::execve(c"/bin/sh".as_ptr(), self.sh_argv.cast_const(), self.envp);
                    return e;
                }
                result = e;
                match e {
                    libc::EACCES => denied = true,
                    libc::ENOENT
                    | libc::ENOTDIR
                    | libc::ESTALE
                    | libc::ENODEV
                    | libc::ETIMEDOUT => {}
                    _ => return e,
                }
            }
            if denied { libc::EACCES } else { result }
        }
    }
}

/// Starts `spec`. Errors from `exec` (no such program) and from the setup in the child come
/// back as the `io::Error` of the failing call, and such a child is already reaped.
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

    // The child's ends (`theirs`) and ours.
    let (theirs, ours): ([OwnedFd; 3], [Option<OwnedFd>; 4]) = if let Some(size) = spec.pty {
        let pty = openpty(Some(&winsize(size)), None).map_err(io::Error::from)?;
        set_cloexec(pty.master.as_raw_fd())?;
        set_cloexec(pty.slave.as_raw_fd())?;
        let slave = above_stdio(pty.slave)?;
        (
            [slave.try_clone()?, slave.try_clone()?, slave],
            [None, None, None, Some(pty.master)],
        )
    } else {
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
        (
            [
                above_stdio(stdin_theirs)?,
                above_stdio(out_w)?,
                above_stdio(err_w)?,
            ],
            [stdin_ours, Some(out_r), Some(err_r), None],
        )
    };

    let mut sigs_empty = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut sigs_all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut sigs_old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset/sigfillset initialise the sets they are given.
    let (empty_mask, all) = unsafe {
        libc::sigemptyset(sigs_empty.as_mut_ptr());
        libc::sigfillset(sigs_all.as_mut_ptr());
        (sigs_empty.assume_init(), sigs_all.assume_init())
    };
    let plan = ChildPlan {
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
        empty_mask,
        max_signal: libc::SIGRTMAX(),
        error: AtomicI32::new(0),
    };
    let mut stack: Vec<u8> = Vec::with_capacity(CHILD_STACK);
    // The stack grows down from its end, 16-byte aligned as the ABI wants.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK) & !15;

    // SAFETY: all signals are blocked in this thread across the clone so that no handler of
    // the agent runs in the child before it resets them; `child_main` gets a pointer to
    // `plan`, which lives (untouched by anyone else) until `clone` returns, which with
    // CLONE_VFORK is after the child exec'd or exited; `top` is the end of `stack`, which
    // outlives the child's use of it for the same reason.
    let pid = unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, sigs_old.as_mut_ptr());
        let pid = libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &plan as *const ChildPlan<'_> as *mut libc::c_void,
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, sigs_old.as_ptr(), std::ptr::null_mut());
        if pid < 0 {
            return Err(clone_error);
        }
        pid
    };
    drop(stack);
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
