//! Joining the sandbox's groups from the starter (see `child`): v1 groups through `tasks`,
//! the v2 group by `clone3(CLONE_INTO_CGROUP)`. Both avoid a migration that write-locks the
//! kernel's global `cgroup_threadgroup_rwsem`, whose first writer after a quiet spell waits
//! for an RCU grace period (12-15 ms per launch on the build machine).

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use libc::c_void;

use crate::child::{check, fail};

/// A v2 group to start the sandbox in: its directory, open (for `CLONE_INTO_CGROUP`), and its
/// `cgroup.procs` (for kernels before 5.7, which lack that flag).
pub(crate) struct CgroupV2 {
    pub dir: OwnedFd,
    pub procs: CString,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` of `clone3(2)`, up to `cgroup` (`CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Writes `0` into a cgroup's `tasks` or `cgroup.procs`: the writer joins that group.
///
/// # Safety
/// Plain system calls on a valid C string.
pub(crate) unsafe fn join_group(file: &CString, err_fd: RawFd) {
    // SAFETY: see the function's contract.
    unsafe {
        let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        check(fd, err_fd, "open the cgroup's tasks or cgroup.procs");
        let ret = libc::write(fd, b"0".as_ptr().cast::<c_void>(), 1);
        check(ret as libc::c_int, err_fd, "join cgroup");
        libc::close(fd);
    }
}

/// Continues the start in the sandbox's v2 group. Moving a process there (`cgroup.procs`)
/// write-locks the global `cgroup_threadgroup_rwsem` and so waits for an RCU grace period
/// (12 ms measured here); a child born there by `clone3(CLONE_INTO_CGROUP)` takes only its
/// read side. The child, still the host's root (the kernel checks that its creator may write
/// the group's `cgroup.procs`), returns and goes on with the start; this process waits for it
/// and exits with its status. Without that flag (kernels before 5.7, or a seccomp policy that
/// refuses `clone3`), this process joins the group by `cgroup.procs` and goes on itself.
///
/// # Safety
/// Called by the single-threaded starter only: the child of the raw `clone3` is a copy of it,
/// so no lock of another thread can be held in it.
pub(crate) unsafe fn enter_v2_group(v2: &CgroupV2, pid_fd: RawFd, err_fd: RawFd) {
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: v2.dir.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM is a fork: the child runs on a copy of this stack and
    // returns 0 here; `args` is a valid, fully initialised `clone_args` of the size passed.
    unsafe {
        let child = libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        );
        if child == 0 {
            return;
        }
        if child < 0 {
            let errno = std::io::Error::last_os_error().raw_os_error();
            if matches!(
                errno,
                Some(libc::ENOSYS | libc::EINVAL | libc::E2BIG | libc::EPERM)
            ) {
                join_group(&v2.procs, err_fd);
                return;
            }
            fail(err_fd, "clone3 into the sandbox's cgroup");
        }
        // The child reports PID 1 and any failure through the same pipes.
        libc::close(pid_fd);
        libc::close(err_fd);
        let mut status = 0;
        let pid = child as libc::pid_t;
        while libc::waitpid(pid, &mut status, 0) < 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            127
        };
        libc::_exit(code)
    }
}
