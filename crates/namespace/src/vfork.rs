//! Starting the sandbox's first processes without copying the daemon: the starter and PID 1
//! are `clone(CLONE_VM | CLONE_VFORK)` children, as `posix_spawn` makes its children. Each
//! runs on a stack of its own in the daemon's memory while its parent waits, until it execs
//! or exits, so no page of the daemon is copied or write-protected. (A `fork` copies the page
//! tables of everything the daemon touched and leaves its threads copy-on-write faults; one
//! of a process with 30 MB touched took 1.4-1.8 ms on the build machine, this 0.06-0.17 ms.)
//!
//! The starter is born in the sandbox's v2 group by `clone3(CLONE_INTO_CGROUP)`, which takes
//! the child's stack as an argument, so on x86_64 a few instructions make that call and run
//! the child's entry on its stack; elsewhere, or where the kernel refuses the flag, the
//! starter joins the group through `cgroup.procs` instead.
//!
//! Code in such a child may use the waiting thread's memory, locks and thread-locals, but not
//! glibc's calls that act on every thread of the process (`setresuid` and its kind signal the
//! daemon's other threads): those are made as raw system calls.

use std::io;
use std::os::fd::RawFd;

use libc::{c_int, c_void};

/// Each child's stack; what runs there is the plan's walk (see `child`).
const STACK_SIZE: usize = 512 << 10;
const GUARD: usize = 4096;

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

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Stacks for children that share this process's memory, each above a guard page.
pub(crate) struct Stacks {
    base: *mut c_void,
    count: usize,
}

impl Stacks {
    pub(crate) fn new(count: usize) -> io::Result<Self> {
        let len = count * (STACK_SIZE + GUARD);
        // SAFETY: a new private anonymous mapping; the result is checked before use.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stacks = Stacks { base, count };
        for i in 0..count {
            // SAFETY: the guard page lies inside the mapping just made.
            let ret = unsafe {
                libc::mprotect(stacks.bottom(i).sub(GUARD).cast(), GUARD, libc::PROT_NONE)
            };
            if ret < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(stacks)
    }

    /// The lowest address of stack `i`, above its guard page.
    fn bottom(&self, i: usize) -> *mut u8 {
        assert!(i < self.count);
        // SAFETY: within the mapping: `i` is one of its `count` slots.
        unsafe { self.base.cast::<u8>().add(i * (STACK_SIZE + GUARD) + GUARD) }
    }

    /// The top of stack `i` (16-byte aligned, as the ABI wants at a call).
    fn top(&self, i: usize) -> *mut c_void {
        // SAFETY: one past the end of slot `i`, which the mapping contains or ends at.
        unsafe { self.bottom(i).add(STACK_SIZE).cast() }
    }
}

impl Drop for Stacks {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no child runs on it any more (each `spawn`
        // returned only after its child exec'd or exited).
        unsafe {
            libc::munmap(self.base, self.count * (STACK_SIZE + GUARD));
        }
    }
}

/// A child's entry: it must never return (it ends in `execve` or `_exit`).
pub(crate) type Entry = extern "C" fn(*mut c_void) -> c_int;

/// Runs `entry(arg)` in a child that shares this process's memory, on stack `i`, and returns
/// its pid once the child has exec'd or exited. Signals are blocked around the call, so that
/// no handler of the daemon's runs in the child; the child inherits the blocked mask.
///
/// # Safety
/// `entry` must only touch memory that stays valid while this call waits (`arg` included)
/// and must never return; see the module's note on what it may call.
pub(crate) unsafe fn spawn(
    stacks: &Stacks,
    i: usize,
    entry: Entry,
    arg: *mut c_void,
) -> io::Result<libc::pid_t> {
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    // SAFETY: the stack is ours and unused; `entry` and `arg` are as the contract says.
    let pid = blocked(|| unsafe { libc::clone(entry, stacks.top(i), flags, arg) });
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(pid)
}

/// [`spawn`], with the child born in the v2 group whose directory `cgroup` is open; `None`
/// when the kernel (or a seccomp policy above the daemon) refuses the call or the flag, so
/// that the caller spawns without it.
///
/// # Safety
/// As [`spawn`].
pub(crate) unsafe fn spawn_into(
    stacks: &Stacks,
    i: usize,
    entry: Entry,
    arg: *mut c_void,
    cgroup: RawFd,
) -> Option<io::Result<libc::pid_t>> {
    // SAFETY: as this function's contract.
    blocked(|| unsafe { clone3_into(stacks, i, entry, arg, cgroup) })
}

/// Runs `f` with every signal blocked in this thread.
fn blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigsets initialised by `sigfillset` and `pthread_sigmask` itself; the old mask
    // is restored before returning.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let result = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        result
    }
}

/// `clone3(CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP)` with the child on stack `i`; `None`
/// when it is refused.
///
/// # Safety
/// As [`spawn`].
#[cfg(target_arch = "x86_64")]
unsafe fn clone3_into(
    stacks: &Stacks,
    i: usize,
    entry: Entry,
    arg: *mut c_void,
    cgroup: RawFd,
) -> Option<io::Result<libc::pid_t>> {
    let args = CloneArgs {
        flags: (libc::CLONE_VM | libc::CLONE_VFORK) as u64 | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        stack: stacks.bottom(i) as u64,
        stack_size: STACK_SIZE as u64,
        cgroup: cgroup as u64,
        ..CloneArgs::default()
    };
    let ret: i64;
    // SAFETY: `clone3` with a valid, fully initialised `clone_args` of the size passed. The
    // parent only gets its result in rax (the kernel clobbers rcx and r11). The child starts
    // after `syscall` with rax 0 and rsp at the top of its own stack (16-byte aligned), calls
    // `entry(arg)` from registers that the kernel preserved, and never comes back (the `ud2`
    // would trap if it did); it never touches the parent's stack.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r12",
            "call r13",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") &args as *const CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") arg,
            in("r13") entry,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    if ret >= 0 {
        return Some(Ok(libc::pid_t::try_from(ret).unwrap_or(-1)));
    }
    let errno = c_int::try_from(-ret).unwrap_or(libc::EINVAL);
    match errno {
        libc::ENOSYS | libc::EINVAL | libc::E2BIG | libc::EPERM => None,
        _ => Some(Err(io::Error::from_raw_os_error(errno))),
    }
}

/// Without the assembly for this architecture, the starter joins its v2 group itself.
///
/// # Safety
/// Does nothing unsafe.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone3_into(
    _stacks: &Stacks,
    _i: usize,
    _entry: Entry,
    _arg: *mut c_void,
    _cgroup: RawFd,
) -> Option<io::Result<libc::pid_t>> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI32, Ordering};

    extern "C" fn write_pid_and_exit(arg: *mut c_void) -> c_int {
        // SAFETY: the test passes a pointer to its AtomicI32, which outlives `spawn`.
        let seen = unsafe { &*arg.cast::<AtomicI32>() };
        // SAFETY: getpid and _exit are plain system calls.
        unsafe {
            seen.store(libc::getpid(), Ordering::SeqCst);
            libc::_exit(7)
        }
    }

    #[test]
    fn a_child_runs_in_this_memory_and_is_done_when_spawn_returns() {
        let stacks = Stacks::new(2).unwrap();
        for i in 0..2 {
            let seen = AtomicI32::new(0);
            // SAFETY: the entry only stores to `seen` and exits.
            let pid = unsafe {
                spawn(
                    &stacks,
                    i,
                    write_pid_and_exit,
                    std::ptr::from_ref(&seen).cast_mut().cast(),
                )
            }
            .unwrap();
            // The child wrote into this process's memory, and had done so by the time
            // `spawn` returned: its parent waited for it.
            assert_eq!(seen.load(Ordering::SeqCst), pid);
            assert_ne!(pid, std::process::id() as libc::pid_t);
            let mut status = 0;
            // SAFETY: waiting for our own child.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7);
        }
    }

    #[test]
    fn a_child_that_cannot_be_born_in_a_group_says_why() {
        let stacks = Stacks::new(1).unwrap();
        let seen = AtomicI32::new(0);
        let not_a_group = std::fs::File::open("/").unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: as above; `/` is a directory but no cgroup, so no child is made.
        let result = unsafe {
            spawn_into(
                &stacks,
                0,
                write_pid_and_exit,
                std::ptr::from_ref(&seen).cast_mut().cast(),
                not_a_group.as_raw_fd(),
            )
        };
        // Refused (None) or an error, never a child.
        assert!(!matches!(result, Some(Ok(_))), "{result:?}");
        assert_eq!(seen.load(Ordering::SeqCst), 0);
    }
}
