//! The tap a sandbox's PID 1 creates, handed to the daemon at launch: PID 1 already holds the
//! device open when it makes it persistent, so it sends that descriptor over a socket pair
//! before it execs the agent, and the daemon's network attaches to it at once. Attaching
//! afresh meant a thread that joins the sandbox's network namespace (a process, rootless),
//! and waiting, 5 ms at a time, while PID 1's own descriptor was still closing.
//!
//! A restarted daemon (or a sandbox whose PID 1 could not open `/dev/net/tun`) has nothing
//! handed over and attaches as before.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::sys::socket::{AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType};

/// Taps handed over by launches whose network is not attached yet, by state directory.
static HANDED: Mutex<BTreeMap<PathBuf, OwnedFd>> = Mutex::new(BTreeMap::new());

/// The daemon's end and PID 1's end of a launch's hand-over socket (both close-on-exec).
pub(crate) fn channel() -> nix::Result<(OwnedFd, OwnedFd)> {
    nix::sys::socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
}

/// Keeps the tap PID 1 sent on `ours`, if it sent one, for [`take`]. Called once PID 1 has
/// exec'd the agent, so whatever it sent is there; nothing waits.
pub(crate) fn receive(ours: &OwnedFd, state_dir: &Path) {
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(RawFd);
    let Ok(msg) = nix::sys::socket::recvmsg::<()>(
        ours.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    ) else {
        return;
    };
    let mut fds = Vec::new();
    if let Ok(cmsgs) = msg.cmsgs() {
        for cmsg in cmsgs {
            if let ControlMessageOwned::ScmRights(received) = cmsg {
                fds.extend(received);
            }
        }
    }
    // SAFETY: SCM_RIGHTS just installed these descriptors in this process; nothing else owns
    // them.
    let mut fds = fds
        .into_iter()
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
    let Some(tap) = fds.next() else { return };
    let nonblocking = nix::fcntl::fcntl(
        tap.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_NONBLOCK),
    );
    if nonblocking.is_ok() {
        lock().insert(state_dir.to_owned(), tap);
    }
}

/// The tap handed over by the launch of `state_dir`'s sandbox, once; `None` when there is
/// none (the daemon restarted since, or PID 1 had no `/dev/net/tun`).
pub fn take(state_dir: &Path) -> Option<OwnedFd> {
    lock().remove(state_dir)
}

fn lock() -> std::sync::MutexGuard<'static, BTreeMap<PathBuf, OwnedFd>> {
    HANDED.lock().unwrap_or_else(|e| e.into_inner())
}

/// PID 1's side: sends `tap` on `sock`. Best effort, as the tap itself is: without it the
/// daemon attaches the other way.
///
/// # Safety
/// Plain system calls on two open descriptors with buffers on this stack; it does not
/// allocate, so it may run in the sandbox's first process (see `child`).
pub(crate) unsafe fn send(sock: RawFd, tap: RawFd) {
    let mut byte = [0u8; 1];
    /// The size of the one descriptor sent.
    const FD_BYTES: u32 = RawFd::BITS / 8;
    // Room for one descriptor: CMSG_SPACE(4) is 24 bytes on 64-bit Linux.
    let mut control = [0u64; 4];
    // SAFETY: see the function's contract; `msghdr` is plain data for which zeroes are valid,
    // and the header written through `CMSG_FIRSTHDR` lies inside `control`.
    unsafe {
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(FD_BYTES) as usize;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return;
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(FD_BYTES) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), tap);
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT);
    }
}
