//! The host side of virtio-net: the frame socket's listener and its one peer (the daemon).
//!
//! Everything here is non-blocking. The listener and the peer sit in the device's own epoll
//! set, whose fd the device thread's event loop waits on. The peer is edge-triggered for
//! readable and writable: the device reads until the socket is empty or the guest has no
//! receive buffer (a guest rx notification resumes it), and retries a held-back frame when
//! the socket becomes writable again.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketFlags, SocketType};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::Error;

/// Epoll tokens.
const LISTENER: u64 = 1;
const PEER: u64 = 2;

/// How many connections may wait to be accepted.
const BACKLOG: i32 = 4;

/// What became of a frame handed to [`FrameSocket::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendOutcome {
    /// It is on its way to the daemon.
    Sent,
    /// Nobody to send it to (no peer, or it just hung up): the frame is dropped.
    Dropped,
    /// The socket is full: keep the frame and try again once it is writable.
    Full,
}

/// What [`FrameSocket::recv`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Received {
    /// A packet of this many bytes (possibly more than the buffer held: check).
    Frame(usize),
    /// Nothing to read now (or no peer).
    Nothing,
}

/// What the poller saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Readiness {
    pub readable: bool,
    pub writable: bool,
}

/// The listener, the current peer and their poller.
pub(super) struct FrameSocket {
    listener: OwnedFd,
    peer: Option<OwnedFd>,
    pub(super) epoll: Epoll,
}

impl FrameSocket {
    /// Binds a `SOCK_SEQPACKET` listener at `path` (a stale socket file there is replaced).
    pub(super) fn bind(path: &Path) -> Result<Self, Error> {
        let name = path.display().to_string();
        let listen_err = |e: io::Error| Error::Listen(name.clone(), e);
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if meta.file_type().is_socket() {
                let _ = std::fs::remove_file(path);
            }
        }
        let listener = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| listen_err(e.into()))?;
        let addr = SocketAddrUnix::new(path).map_err(|e| listen_err(e.into()))?;
        rustix::net::bind(&listener, &addr).map_err(|e| listen_err(e.into()))?;
        rustix::net::listen(&listener, BACKLOG).map_err(|e| listen_err(e.into()))?;
        let epoll = Epoll::new().map_err(Error::Epoll)?;
        epoll
            .ctl(
                ControlOperation::Add,
                listener.as_raw_fd(),
                EpollEvent::new(EventSet::IN, LISTENER),
            )
            .map_err(Error::Epoll)?;
        Ok(Self {
            listener,
            peer: None,
            epoll,
        })
    }

    /// The listener's fd: the only one the seccomp filter lets the VMM accept on for net.
    pub(super) fn listener_fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    pub(super) fn has_peer(&self) -> bool {
        self.peer.is_some()
    }

    /// Takes every pending connection; the last one becomes the peer, replacing (and
    /// closing) the one before, so a restarted daemon takes over at once.
    fn accept(&mut self) {
        loop {
            match rustix::net::accept_with(
                &self.listener,
                SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            ) {
                Ok(fd) => {
                    self.drop_peer();
                    let ev = EpollEvent::new(
                        EventSet::IN
                            | EventSet::OUT
                            | EventSet::READ_HANG_UP
                            | EventSet::EDGE_TRIGGERED,
                        PEER,
                    );
                    if let Err(e) = self.epoll.ctl(ControlOperation::Add, fd.as_raw_fd(), ev) {
                        tracing::warn!(error = %e, "net: cannot watch the new frame peer");
                        continue;
                    }
                    tracing::debug!("net: frame peer connected");
                    self.peer = Some(fd);
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "net: accept on the frame socket failed");
                    return;
                }
            }
        }
    }

    /// Forgets the peer (it hung up or broke the contract).
    pub(super) fn drop_peer(&mut self) {
        if let Some(old) = self.peer.take() {
            let _ = self.epoll.ctl(
                ControlOperation::Delete,
                old.as_raw_fd(),
                EpollEvent::default(),
            );
            tracing::debug!("net: frame peer gone");
        }
    }

    /// Sends one frame as one packet, never blocking.
    pub(super) fn send(&mut self, frame: &[u8]) -> SendOutcome {
        let Some(peer) = &self.peer else {
            return SendOutcome::Dropped;
        };
        match rustix::net::send(peer, frame, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
            Ok(_) => SendOutcome::Sent,
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::NOBUFS) => SendOutcome::Full,
            Err(e) => {
                tracing::debug!(error = %e, "net: frame peer refused a frame");
                if matches!(
                    e,
                    rustix::io::Errno::PIPE
                        | rustix::io::Errno::CONNRESET
                        | rustix::io::Errno::NOTCONN
                ) {
                    self.drop_peer();
                }
                SendOutcome::Dropped
            }
        }
    }

    /// Reads one packet into `buf`, never blocking. The length returned is the packet's,
    /// which is larger than `buf` when the packet did not fit (its tail is discarded).
    pub(super) fn recv(&mut self, buf: &mut [u8]) -> Received {
        loop {
            let Some(peer) = &self.peer else {
                return Received::Nothing;
            };
            match rustix::net::recv(peer, &mut *buf, RecvFlags::DONTWAIT | RecvFlags::TRUNC) {
                // A zero-length read is the peer hanging up (the contract has no empty frames).
                Ok((_, 0)) => {
                    self.drop_peer();
                    return Received::Nothing;
                }
                Ok((_, n)) => return Received::Frame(n),
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return Received::Nothing,
                Err(e) => {
                    tracing::debug!(error = %e, "net: reading the frame peer failed");
                    self.drop_peer();
                    return Received::Nothing;
                }
            }
        }
    }

    /// Drains the poller without waiting: accepts new peers, drops one that hung up, and
    /// says whether the peer became readable or writable.
    pub(super) fn poll(&mut self) -> Readiness {
        let mut ready = Readiness::default();
        let mut events = [EpollEvent::default(); 8];
        let n = match self.epoll.wait(0, &mut events) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "net: epoll_wait failed");
                return ready;
            }
        };
        for ev in &events[..n] {
            match ev.data() {
                LISTENER => self.accept(),
                PEER => {
                    let set = ev.event_set();
                    // Read what is left before noticing a hang-up: `recv` sees the end.
                    ready.readable |= set.intersects(
                        EventSet::IN | EventSet::READ_HANG_UP | EventSet::HANG_UP | EventSet::ERROR,
                    );
                    ready.writable |= set.contains(EventSet::OUT);
                }
                _ => {}
            }
        }
        if self.peer.is_none() {
            ready = Readiness::default();
        }
        ready
    }
}

#[cfg(test)]
impl FrameSocket {
    /// Shrinks the peer's send buffer, so tests can fill it with a few frames.
    pub(super) fn shrink_send_buffer(&self) {
        let peer = self.peer.as_ref().expect("a peer");
        rustix::net::sockopt::set_socket_send_buffer_size(peer, 4096).unwrap();
    }
}
