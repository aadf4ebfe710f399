//! Where Ethernet frames come from and go to. The stack speaks to a [`FrameDevice`]; two real
//! ones exist:
//! - [`TapDevice`]: a tap file descriptor (`eth0` in a namespace sandbox's network namespace,
//!   created there and handed to the daemon);
//! - [`SeqpacketDevice`]: a Unix `SOCK_SEQPACKET` connection to `belljar-vmm`'s virtio-net,
//!   one packet per Ethernet frame with no header. The VMM listens and accepts one peer at a
//!   time; the daemon connects, and reconnects whenever the connection drops (a daemon or VMM
//!   restart), so frames flow again without anyone re-creating the sandbox.

use std::future::Future;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A source and sink of Ethernet frames. Methods take `&self` so that one task can wait to
/// receive and to send at once.
pub trait FrameDevice: Send + Sync + 'static {
    /// Waits for one frame and copies it into `buf`, returning its length. An error ends the
    /// stack. Must be cancel-safe: a frame is consumed only when the future completes.
    fn recv(&self, buf: &mut [u8]) -> impl Future<Output = io::Result<usize>> + Send;
    /// Takes one frame if one is waiting (`WouldBlock` if not), so that a burst is handled in
    /// one pass of the stack.
    fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Waits until [`try_send`](Self::try_send) may succeed.
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send;
    /// Sends one frame without waiting: `WouldBlock` when the device is full. A frame the
    /// device cannot take for good (no peer, too long) is dropped with `Ok`, as a wire does.
    /// The device may rewrite a TCP segment's checksum field (see `offloads_checksums`).
    fn try_send(&self, frame: &mut [u8]) -> io::Result<()>;
    /// Whether the device leaves TCP/UDP checksums to the kernels at both ends (a tap with a
    /// virtio-net header, [`crate::vnet`]): then the stack neither computes nor verifies them.
    fn offloads_checksums(&self) -> bool {
        false
    }
}

/// Registers `fd` with the Tokio reactor.
#[allow(unsafe_code)]
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is an open descriptor that it alone closes, on drop, and its
    // `as_raw_fd` always returns that same descriptor; the `AsyncFd` owns it from here on.
    unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)
}

fn errno(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// A tap file descriptor opened with `IFF_TAP | IFF_NO_PI` and set non-blocking: each read or
/// write is one Ethernet frame, after a virtio-net header when the tap has one
/// ([`crate::tap::create`] asks for it).
pub struct TapDevice {
    fd: AsyncFd<OwnedFd>,
    vnet: bool,
}

impl TapDevice {
    /// Wraps an open tap descriptor (for instance one received over SCM_RIGHTS). Needs a
    /// Tokio runtime.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        set_nonblocking(&fd)?;
        let vnet = crate::tap::has_vnet_header(&fd)?;
        if vnet {
            crate::tap::offload_checksums(&fd)?;
        }
        Ok(Self {
            fd: register(fd)?,
            vnet,
        })
    }

    /// Reads one frame into `buf`, its virtio-net header (if any) apart.
    fn read_frame(&self, fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
        if !self.vnet {
            return nix::unistd::read(fd.as_raw_fd(), buf).map_err(errno);
        }
        // The header says at most that the checksum is partial, which the stack does not
        // verify on this device; there is no segmentation offload to undo.
        let mut hdr = [0u8; crate::vnet::LEN];
        let mut iov = [IoSliceMut::new(&mut hdr), IoSliceMut::new(buf)];
        let n = nix::sys::uio::readv(fd, &mut iov).map_err(errno)?;
        Ok(n.saturating_sub(crate::vnet::LEN))
    }
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL).map_err(errno)?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags)).map_err(errno)?;
    Ok(())
}

impl FrameDevice for TapDevice {
    async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.fd
            .async_io(Interest::READABLE, |fd| self.read_frame(fd, buf))
            .await
    }

    fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.fd
            .try_io(Interest::READABLE, |fd| self.read_frame(fd, buf))
    }

    async fn writable(&self) -> io::Result<()> {
        self.fd.writable().await.map(|mut g| g.retain_ready())
    }

    fn try_send(&self, frame: &mut [u8]) -> io::Result<()> {
        let hdr = if self.vnet {
            Some(crate::vnet::prepare(frame))
        } else {
            None
        };
        match self.fd.try_io(Interest::WRITABLE, |fd| match &hdr {
            Some(hdr) => {
                nix::sys::uio::writev(fd, &[IoSlice::new(hdr), IoSlice::new(frame)]).map_err(errno)
            }
            None => nix::unistd::write(fd.as_fd(), frame).map_err(errno),
        }) {
            Ok(_) => Ok(()),
            // A link that is down drops frames; the guest retransmits once it is up.
            Err(e) if e.raw_os_error() == Some(libc::EIO) => {
                tracing::trace!("the tap is down: a frame dropped");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn offloads_checksums(&self) -> bool {
        self.vnet
    }
}

/// The daemon's end of `belljar-vmm`'s frame socket.
pub struct SeqpacketDevice {
    path: PathBuf,
    conn: Mutex<Option<Arc<AsyncFd<OwnedFd>>>>,
}

/// How long to wait between attempts to reach a VMM that is not listening (yet, or again).
const RECONNECT_MIN: Duration = Duration::from_millis(20);
const RECONNECT_MAX: Duration = Duration::from_secs(1);

impl SeqpacketDevice {
    /// A device that connects to the VMM listening at `path` when first used, and again
    /// whenever the connection drops.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            conn: Mutex::new(None),
        }
    }

    fn current(&self) -> Option<Arc<AsyncFd<OwnedFd>>> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn drop_conn(&self, dead: &Arc<AsyncFd<OwnedFd>>) {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, dead)) {
            *conn = None;
        }
    }

    fn connect_once(&self) -> io::Result<Arc<AsyncFd<OwnedFd>>> {
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(errno)?;
        let addr = UnixAddr::new(&self.path).map_err(errno)?;
        socket::connect(fd.as_raw_fd(), &addr).map_err(errno)?;
        let conn = Arc::new(register(fd)?);
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        Ok(conn)
    }

    async fn connected(&self) -> Arc<AsyncFd<OwnedFd>> {
        let mut backoff = RECONNECT_MIN;
        loop {
            if let Some(conn) = self.current() {
                return conn;
            }
            match self.connect_once() {
                Ok(conn) => {
                    tracing::debug!(path = %self.path.display(), "frame socket connected");
                    return conn;
                }
                Err(e) => {
                    tracing::trace!(path = %self.path.display(), error = %e, "frame socket not reachable");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                }
            }
        }
    }
}

fn peer_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNRESET | libc::EPIPE | libc::ENOTCONN | libc::ECONNREFUSED)
    )
}

impl FrameDevice for SeqpacketDevice {
    async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let conn = self.connected().await;
            let got = conn
                .async_io(Interest::READABLE, |fd| {
                    socket::recv(fd.as_raw_fd(), buf, MsgFlags::MSG_TRUNC).map_err(errno)
                })
                .await;
            match got {
                // End of stream: the VMM went away. Wait for the next one.
                Ok(0) => self.drop_conn(&conn),
                // Longer than any frame we accept: dropped, as a NIC drops a giant.
                Ok(n) if n > buf.len() => continue,
                Ok(n) => return Ok(n),
                Err(e) if peer_gone(&e) => self.drop_conn(&conn),
                Err(e) => return Err(e),
            }
        }
    }

    fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(conn) = self.current() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        let got = conn.try_io(Interest::READABLE, |fd| {
            socket::recv(fd.as_raw_fd(), buf, MsgFlags::MSG_TRUNC).map_err(errno)
        });
        match got {
            // A hang-up or a giant: leave it to `recv`, which reconnects or drops it.
            Ok(0) => Err(io::ErrorKind::WouldBlock.into()),
            Ok(n) if n > buf.len() => Err(io::ErrorKind::WouldBlock.into()),
            other => other,
        }
    }

    async fn writable(&self) -> io::Result<()> {
        match self.current() {
            Some(conn) => conn.writable().await.map(|mut g| g.retain_ready()),
            None => Ok(()),
        }
    }

    fn try_send(&self, frame: &mut [u8]) -> io::Result<()> {
        let Some(conn) = self.current() else {
            return Ok(()); // no VMM: the frame is lost, as on an unplugged cable
        };
        let sent = conn.try_io(Interest::WRITABLE, |fd| {
            socket::send(fd.as_raw_fd(), frame, MsgFlags::MSG_NOSIGNAL).map_err(errno)
        });
        match sent {
            Ok(_) => Ok(()),
            Err(e) if peer_gone(&e) => {
                self.drop_conn(&conn);
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
