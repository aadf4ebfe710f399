//! Joining the sandbox's groups from the starter (see `child`): v1 groups through `tasks`;
//! the v2 group by being born in it (`clone3(CLONE_INTO_CGROUP)`, see `vfork`), or through
//! `cgroup.procs` where the kernel cannot. Moving a process by `cgroup.procs` write-locks the
//! kernel's global `cgroup_threadgroup_rwsem`, whose first writer after a quiet spell waits
//! for an RCU grace period (12-15 ms per launch on the build machine); a thread moving itself
//! through `tasks`, or a child born in its group, does not.

use std::ffi::CString;
use std::os::fd::{OwnedFd, RawFd};

use libc::c_void;

use crate::child::check;

/// A v2 group to start the sandbox in: its directory, open (for `CLONE_INTO_CGROUP`), and its
/// `cgroup.procs` (for kernels before 5.7, which lack that flag).
pub(crate) struct CgroupV2 {
    pub dir: OwnedFd,
    pub procs: CString,
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
        check(crate::conv::c_int(ret), err_fd, "join cgroup");
        libc::close(fd);
    }
}
