//! The filter, installed for real in a forked child: what the kernel decides is what counts.

use super::*;

/// How a probe run under the filter ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The probe's result: the `errno` the call failed with, or 0 when it succeeded.
    Errno(i32),
    /// Killed by this signal.
    Signal(i32),
}

fn errno() -> i32 {
    // SAFETY: reading the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Forks, installs the filter in the child (with `no_new_privs`, so no privilege is needed)
/// and runs `probe` there; the child exits with what the probe returns.
fn under_filter(probe: fn() -> i32) -> Ended {
    let prog = program().unwrap();
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).unwrap(),
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: the child only makes system calls and exits; `fprog` outlives both processes'
    // use of it.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: plain system calls in the forked child, which then exits without unwinding.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::syscall(libc::SYS_seccomp, 1, 0, &fprog as *const libc::sock_fprog) != 0
            {
                libc::_exit(200);
            }
            libc::_exit(probe());
        }
    }
    let mut status = 0;
    // SAFETY: waiting for the child just forked.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    if libc::WIFSIGNALED(status) {
        Ended::Signal(libc::WTERMSIG(status))
    } else {
        let code = libc::WEXITSTATUS(status);
        assert_ne!(code, 200, "the child could not install the filter");
        Ended::Errno(code)
    }
}

/// The errno of a call that must fail; 0 if it succeeded.
fn failed_with(ret: libc::c_long) -> i32 {
    if ret < 0 { errno() } else { 0 }
}

#[test]
fn the_list_is_refused_with_eperm() {
    fn probe() -> i32 {
        for (_, nr) in DENIED {
            // Arguments that would fail with EFAULT or EINVAL if the call got through.
            // SAFETY: every argument is null or zero; a call that got through fails cleanly.
            let ret = unsafe { libc::syscall(*nr, 0, 0, 0, 0, 0, 0) };
            if failed_with(ret) != libc::EPERM {
                return 100;
            }
        }
        libc::EPERM
    }
    assert_eq!(under_filter(probe), Ended::Errno(libc::EPERM));
}

#[test]
fn ordinary_calls_pass() {
    fn probe() -> i32 {
        // SAFETY: harmless calls.
        let pid = unsafe { libc::syscall(libc::SYS_getpid) };
        let mut buf = [0u8; 1];
        // SAFETY: a read from descriptor -1, which fails with EBADF (not EPERM).
        let read = unsafe { libc::syscall(libc::SYS_read, -1, buf.as_mut_ptr(), 1) };
        if pid > 0 && failed_with(read) == libc::EBADF {
            0
        } else {
            1
        }
    }
    assert_eq!(under_filter(probe), Ended::Errno(0));
}

#[test]
fn clone3_answers_enosys_so_libc_falls_back() {
    fn probe() -> i32 {
        // SAFETY: a null argument structure; clone3 would fail with EFAULT if it got through.
        failed_with(unsafe { libc::syscall(libc::SYS_clone3, 0, 0) })
    }
    assert_eq!(under_filter(probe), Ended::Errno(libc::ENOSYS));
}

#[test]
fn clone_makes_processes_but_no_namespaces() {
    fn probe() -> i32 {
        let plain = libc::SIGCHLD as libc::c_long;
        for flag in CLONE_NAMESPACE_FLAGS {
            // SAFETY: a fork-like clone; a child that got through exits at once.
            let ret =
                unsafe { libc::syscall(libc::SYS_clone, plain | flag as libc::c_long, 0, 0, 0, 0) };
            if ret == 0 {
                // SAFETY: leaving the unexpected child.
                unsafe { libc::_exit(0) };
            }
            if failed_with(ret) != libc::EPERM {
                return 101;
            }
        }
        // SAFETY: as above, without namespace flags: a plain child that exits at once.
        let child = unsafe { libc::syscall(libc::SYS_clone, plain, 0, 0, 0, 0) };
        if child == 0 {
            // SAFETY: leaving the child.
            unsafe { libc::_exit(7) };
        }
        if child < 0 {
            return 102;
        }
        let Ok(child) = libc::pid_t::try_from(child) else {
            return 104;
        };
        let mut status = 0;
        // SAFETY: waiting for that child.
        unsafe { libc::waitpid(child, &mut status, 0) };
        if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7 {
            0
        } else {
            103
        }
    }
    assert_eq!(under_filter(probe), Ended::Errno(0));
}

#[test]
fn an_x32_call_kills_the_process() {
    fn probe() -> i32 {
        // getpid through the x32 ABI: bit 30 set on the same number.
        // SAFETY: getpid takes no arguments.
        unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) };
        0
    }
    assert_eq!(under_filter(probe), Ended::Signal(libc::SIGSYS));
}
