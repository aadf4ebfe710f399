//! The seccomp filter `belljar-vmm` runs under once the guest is booted.
//!
//! After boot the VMM only needs to move bytes between guest memory, already-open files and
//! Unix sockets, run vCPUs and start threads for control clients. Everything else (opening
//! files, exec, network sockets, ptrace, mount, ...) fails with EPERM, so a guest that
//! escapes into the VMM process gains little. Unix sockets stay allowed because a guest
//! connection to vsock port P opens a new connection to `<uds_path>_P`. `accept` works only
//! on the listeners the VMM bound before the filter (control socket, vsock, the net frame
//! socket): a new listening socket made after boot could not take a connection.

use std::collections::BTreeMap;
use std::os::fd::RawFd;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// Errors installing the filter.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot build the seccomp filter: {0}
    Build(String),
    /// Cannot install the seccomp filter: {0}
    Install(String),
}

const ALLOWED: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_lseek,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_fallocate,
    // Emptying a snapshot file the control client passed in (an fd, never a path).
    libc::SYS_ftruncate,
    libc::SYS_close,
    libc::SYS_ioctl,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_gettimeofday,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_restart_syscall,
    libc::SYS_getrandom,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_eventfd2,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_connect,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_fcntl,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_prctl,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_tgkill,
    libc::SYS_tkill,
];

/// Builds the filter program; `accept_fds` are the listeners `accept` may be called on.
pub fn build(accept_fds: &[RawFd]) -> Result<BpfProgram, Error> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|&nr| (nr, Vec::new())).collect();
    let on_listener = accept_fds
        .iter()
        .map(|&fd| {
            let fd = u64::try_from(fd).map_err(|_| Error::Build(format!("bad fd {fd}")))?;
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, fd)
                .and_then(|c| SeccompRule::new(vec![c]))
                .map_err(|e| Error::Build(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // An empty rule list would allow the call on any fd: with no listener, no accept.
    if !on_listener.is_empty() {
        rules.insert(libc::SYS_accept, on_listener.clone());
        rules.insert(libc::SYS_accept4, on_listener);
    }
    let unix_only = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        libc::AF_UNIX as u64,
    )
    .and_then(|c| SeccompRule::new(vec![c]))
    .map_err(|e| Error::Build(e.to_string()))?;
    rules.insert(libc::SYS_socket, vec![unix_only]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        std::env::consts::ARCH
            .try_into()
            .map_err(|e: seccompiler::BackendError| Error::Build(e.to_string()))?,
    )
    .map_err(|e| Error::Build(e.to_string()))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| Error::Build(e.to_string()))
}

/// Installs the filter on every thread of the process (and threads started later).
pub fn install_all_threads(accept_fds: &[RawFd]) -> Result<(), Error> {
    let prog = build(accept_fds)?;
    seccompiler::apply_filter_all_threads(&prog).map_err(|e| Error::Install(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_works_only_on_the_listeners_named() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let named = std::os::unix::net::UnixListener::bind(dir.path().join("a")).unwrap();
        let other = std::os::unix::net::UnixListener::bind(dir.path().join("b")).unwrap();
        let _c1 = std::os::unix::net::UnixStream::connect(dir.path().join("a")).unwrap();
        let _c2 = std::os::unix::net::UnixStream::connect(dir.path().join("b")).unwrap();
        let prog = build(&[named.as_raw_fd()]).unwrap();
        let none = build(&[]).unwrap();
        // Each filter on a thread of its own (the filter itself forbids installing another).
        let (ok, refused, refused_all) = std::thread::scope(|scope| {
            let first = scope.spawn(|| {
                seccompiler::apply_filter(&prog).unwrap();
                (named.accept().map(drop), other.accept().map(drop))
            });
            let (ok, refused) = first.join().unwrap();
            // With no listener named, accept is refused everywhere (an empty rule list would
            // have allowed it on any fd).
            let _c3 = std::os::unix::net::UnixStream::connect(dir.path().join("a")).unwrap();
            let second = scope.spawn(|| {
                seccompiler::apply_filter(&none).unwrap();
                named.accept().map(drop)
            });
            (ok, refused, second.join().unwrap())
        });
        ok.unwrap();
        assert_eq!(refused.unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(refused_all.unwrap_err().raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn filter_denies_open_and_inet_but_allows_io() {
        use std::os::fd::AsRawFd;
        // Only this thread gets the filter.
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("port_52");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let prog = build(&[listener.as_raw_fd()]).unwrap();
        let r = std::thread::spawn(move || {
            seccompiler::apply_filter(&prog).unwrap();
            let open = std::fs::File::open("/etc/hostname");
            let inet = std::net::TcpListener::bind("127.0.0.1:0");
            use std::io::{Read, Write};
            (&a).write_all(b"x").unwrap();
            let mut buf = [0u8; 1];
            (&b).read_exact(&mut buf).unwrap();
            // What vsock does after boot: connect to <uds>_P, accept, poll, spawn a thread.
            let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
            let (mut s, _) = listener.accept().unwrap();
            c.write_all(b"y").unwrap();
            s.read_exact(&mut buf).unwrap();
            let epoll = vmm_sys_util::epoll::Epoll::new().unwrap();
            std::thread::spawn(|| ()).join().unwrap();
            drop(epoll);
            (open.map(|_| ()), inet.map(|_| ()), buf[0])
        })
        .join()
        .unwrap();
        assert_eq!(r.0.unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(r.1.unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(r.2, b'y');
    }
}
