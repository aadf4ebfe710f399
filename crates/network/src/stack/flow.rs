//! One TCP flow: the smoltcp socket facing the guest, the phase it is in, and the two tasks
//! that move its bytes to and from the host side (a host socket, the broker or the gateway's
//! DNS), with bounded channels so that neither side can make the daemon buffer without limit.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::AbortHandle;

use crate::budget::{BufferPermit, BufferSizes, SocketPermit};
use crate::config::Limits;
use crate::flows::{FlowRecord, FlowVerdict, Protocol, now_ms};
use crate::policy::Verdict;

use super::Ctx;
use super::host_read::HostRead;

/// Chunks in flight between a connection's host tasks and the stack.
const CHANNEL_CHUNKS: usize = 16;
pub(super) const CHUNK: usize = 32 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) type Connecting = oneshot::Receiver<std::io::Result<TcpStream>>;

pub(super) enum Phase {
    /// The address is allowed; the host connection is under way and the SYN is held back.
    Connecting {
        syn: Vec<u8>,
        rx: Connecting,
    },
    /// Handshake done with the guest; waiting for the name.
    Sniffing {
        until: Instant,
    },
    /// The name is allowed; the host connection is under way.
    ConnectingNamed {
        rx: Connecting,
    },
    Open,
}

pub(super) struct Flow {
    pub(super) dst: SocketAddr,
    /// A connection from the host to an exposed port: the policy does not apply.
    pub(super) inbound: bool,
    pub(super) phase: Phase,
    pub(super) socket: Option<SocketHandle>,
    pub(super) log_id: Option<u64>,
    pub(super) name: Option<String>,
    pub(super) bytes_out: u64,
    pub(super) bytes_in: u64,
    /// Guest bytes not yet handed to the host (the sniffed prefix).
    pub(super) out_pending: Vec<u8>,
    /// Host bytes smoltcp has not taken yet.
    pub(super) in_pending: Vec<u8>,
    pub(super) to_host: Option<mpsc::Sender<Vec<u8>>>,
    /// Host bytes from a stream other than a host socket (the broker, the gateway's DNS).
    pub(super) from_host: Option<mpsc::Receiver<Vec<u8>>>,
    /// A host socket's bytes, read by the stack itself.
    pub(super) host_read: Option<HostRead>,
    pub(super) host_eof: bool,
    pub(super) tasks: Vec<AbortHandle>,
    /// When the flow last carried a byte either way (or began), as of the last sweep.
    pub(super) last_active: Instant,
    /// `bytes_out + bytes_in` at the last sweep: a change is activity.
    pub(super) seen: u64,
    /// The guest socket's state at the end of the last pass: whether it reached `Closed`
    /// through an orderly close (from `LastAck`) or a reset, a timeout or an abort.
    pub(super) last_state: tcp::State,
    /// The flow's host socket in the daemon's budget, held while the flow lives.
    pub(super) host_permit: Option<SocketPermit>,
    /// Its smoltcp buffers in the daemon's budget.
    pub(super) buffers: Option<BufferPermit>,
}

impl Drop for Flow {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A guest-facing socket with buffers of `sizes` (as the budget granted), not yet listening
/// or connecting. The buffers are zeroed allocations, so an idle connection's pages may stay
/// untouched (when the allocator maps them fresh).
pub(super) fn guest_socket(limits: &Limits, sizes: BufferSizes) -> tcp::Socket<'static> {
    let mut s = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; sizes.recv]),
        tcp::SocketBuffer::new(vec![0; sizes.send]),
    );
    s.set_nagle_enabled(false);
    // Acknowledge at once: on a local link a delayed ACK only stalls the sender.
    s.set_ack_delay(None);
    // Probe a quiet guest, and cut the connection of one that answers nothing: without the
    // probes, a guest that had gone (its RST lost, or its kernel's FIN followed by silence)
    // left the connection to the idle timeouts, and without the timeout smoltcp would wait
    // for it for ever.
    let micros = |d: Duration| {
        smoltcp::time::Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    };
    s.set_keep_alive(Some(micros(limits.tcp_keepalive)));
    s.set_timeout(Some(micros(limits.tcp_unanswered)));
    s
}

pub(super) fn new_socket(
    sockets: &mut SocketSet<'static>,
    dst: SocketAddr,
    limits: &Limits,
    sizes: BufferSizes,
) -> Option<SocketHandle> {
    let mut s = guest_socket(limits, sizes);
    s.listen((smoltcp::wire::IpAddress::from(dst.ip()), dst.port()))
        .ok()?;
    Some(sockets.add(s))
}

/// Starts the host connection of a flow; its outcome arrives on the receiver.
///
/// The connection is started here, not in a task: to a server on a veth or loopback the
/// kernel completes the handshake inside `connect(2)`, and then the flow can open in this
/// same pass of the stack, the guest's SYN answered with no task to schedule and no wake-up
/// in between. Those two hand-offs between threads were the tail of connection set-up under
/// load (p95 0.9-2.9 ms against pasta's 0.3 ms, which connects in its one event loop). Only
/// a connection still under way gets a task, which waits for it.
pub(super) fn connect(dst: SocketAddr, wake: Arc<Notify>) -> (Connecting, Option<AbortHandle>) {
    let (tx, rx) = oneshot::channel();
    let stream = match start_connect(dst) {
        Ok(Started::Connected(stream)) => {
            let _ = tx.send(Ok(stream));
            return (rx, None);
        }
        Ok(Started::Pending(stream)) => stream,
        Err(e) => {
            let _ = tx.send(Err(e));
            return (rx, None);
        }
    };
    let task = tokio::spawn(async move {
        let wait = async {
            stream.writable().await?;
            match stream.take_error()? {
                Some(e) => Err(e),
                None => Ok(stream),
            }
        };
        let r = match tokio::time::timeout(CONNECT_TIMEOUT, wait).await {
            Ok(r) => r,
            Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
        };
        let _ = tx.send(r);
        wake.notify_one();
    });
    (rx, Some(task.abort_handle()))
}

enum Started {
    Connected(TcpStream),
    Pending(TcpStream),
}

/// A non-blocking `connect(2)` to `dst`, and whether it has already completed. Needs a Tokio
/// runtime (the socket is registered with it).
fn start_connect(dst: SocketAddr) -> std::io::Result<Started> {
    use nix::errno::Errno;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrStorage, socket};
    use std::os::fd::AsRawFd;

    let family = match dst {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let pending = match nix::sys::socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(dst)) {
        Ok(()) => false,
        Err(Errno::EINPROGRESS) => true,
        Err(e) => return Err(e.into()),
    };
    let stream = std::net::TcpStream::from(fd);
    // Connected once it has a peer; a refusal that came back at once shows as no peer and
    // is read from the socket's error by the waiting task.
    let connected = !pending || stream.peer_addr().is_ok();
    let stream = TcpStream::from_std(stream)?;
    Ok(if connected {
        Started::Connected(stream)
    } else {
        Started::Pending(stream)
    })
}

/// `SO_LINGER` with a zero timeout: `close(2)` sends a reset and frees the socket at once.
fn linger_zero(stream: &TcpStream) -> nix::Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    nix::sys::socket::setsockopt(stream, nix::sys::socket::sockopt::Linger, &linger)
}

impl Flow {
    pub(super) fn new(dst: SocketAddr) -> Self {
        Self {
            dst,
            inbound: false,
            phase: Phase::Open,
            socket: None,
            log_id: None,
            name: None,
            bytes_out: 0,
            bytes_in: 0,
            out_pending: Vec::new(),
            in_pending: Vec::new(),
            to_host: None,
            from_host: None,
            host_read: None,
            host_eof: false,
            tasks: Vec::new(),
            last_active: Instant::now(),
            seen: 0,
            last_state: tcp::State::Listen,
            host_permit: None,
            buffers: None,
        }
    }

    /// Makes the host connection end with a reset rather than a FIN when it closes, as a NAT
    /// passes on the guest's: the server learns at once that nobody is there, and no socket
    /// lingers in the host's kernel.
    pub(super) fn reset_host(&self) {
        let Some(read) = &self.host_read else {
            return; // the host has closed (or reset) its side already
        };
        let stream: &TcpStream = read.stream();
        let _ = linger_zero(stream);
    }

    /// Cuts the flow: a reset to the guest and to the host, its tasks stopped. The next pass
    /// finds the socket closed and removes the flow.
    pub(super) fn cut(&mut self, sockets: &mut SocketSet<'static>) {
        self.reset_host();
        for t in self.tasks.drain(..) {
            t.abort();
        }
        self.to_host = None;
        self.from_host = None;
        self.host_read = None;
        self.in_pending.clear();
        self.host_eof = true;
        self.phase = Phase::Open;
        if let Some(h) = self.socket {
            sockets.get_mut::<tcp::Socket>(h).abort();
        }
    }

    /// The size of the buffers the budget granted (full ones for a flow that has none: the
    /// gateway's own).
    pub(super) fn buffer_sizes(&self) -> BufferSizes {
        self.buffers
            .as_ref()
            .map_or(BufferSizes::FULL, BufferPermit::sizes)
    }

    pub(super) fn record(&mut self, cx: &Ctx, src: SocketAddr, verdict: &Verdict) {
        let id = cx.shared.flows.begin(FlowRecord {
            id: 0,
            started_ms: now_ms(),
            ended_ms: None,
            protocol: Protocol::Tcp,
            src,
            dst: self.dst,
            name: self.name.clone(),
            verdict: if verdict.is_allow() {
                FlowVerdict::Allowed
            } else {
                FlowVerdict::Denied
            },
            rule: verdict.rule().to_string(),
            bytes_out: 0,
            bytes_in: 0,
            coalesced: 0,
        });
        self.log_id = Some(id);
    }

    /// Starts moving bytes between the host socket and the stack: the stack reads the
    /// socket itself (`HostRead`), a task writes what the guest sent.
    pub(super) fn open(&mut self, stream: TcpStream, wake: &Arc<Notify>) {
        let _ = stream.set_nodelay(true);
        let (rd, wr) = stream.into_split();
        let (read, task) = HostRead::start(rd, wake);
        self.tasks.push(task);
        self.host_read = Some(read);
        self.pump_out(wr, wake);
        self.phase = Phase::Open;
    }

    /// Starts the two tasks that move bytes between a host-side stream and the stack.
    pub(super) fn pump<R, W>(&mut self, mut rd: R, wr: W, wake: &Arc<Notify>)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (in_tx, in_rx) = mpsc::channel::<Vec<u8>>(CHANNEL_CHUNKS);
        let w = wake.clone();
        let reader = tokio::spawn(async move {
            loop {
                // Into spare capacity: no zeroed buffer per read.
                let mut buf = Vec::with_capacity(CHUNK);
                match rd.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if in_tx.send(buf).await.is_err() {
                            break;
                        }
                        w.notify_one();
                    }
                }
            }
            drop(in_tx);
            w.notify_one();
        });
        self.tasks.push(reader.abort_handle());
        self.from_host = Some(in_rx);
        self.pump_out(wr, wake);
        self.phase = Phase::Open;
    }

    /// Starts the task that writes what the guest sends to the host side.
    fn pump_out<W>(&mut self, mut wr: W, wake: &Arc<Notify>)
    where
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(CHANNEL_CHUNKS);
        let w = wake.clone();
        let writer = tokio::spawn(async move {
            while let Some(data) = out_rx.recv().await {
                w.notify_one(); // room in the channel again
                if wr.write_all(&data).await.is_err() {
                    return; // dropping out_rx tells the stack the host is gone
                }
            }
            let _ = wr.shutdown().await;
        });
        self.tasks.push(writer.abort_handle());
        self.to_host = Some(out_tx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn a_connection_the_kernel_completes_at_once_needs_no_task() {
        // Before, every connection waited in a task, and the guest's SYN-ACK for two
        // hand-offs between threads.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dst = listener.local_addr().unwrap();
        let rt = runtime();
        let _in = rt.enter();
        let (mut rx, task) = connect(dst, Arc::new(Notify::new()));
        assert!(
            task.is_none(),
            "a loopback handshake is done inside connect(2)"
        );
        let stream = rx.try_recv().expect("decided at once").expect("connected");
        assert_eq!(stream.peer_addr().unwrap(), dst);
    }

    #[test]
    fn a_refused_connection_is_reported() {
        let dst = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap(); // closed again: nothing listens there
        let rt = runtime();
        let r = rt.block_on(async {
            let (rx, _task) = connect(dst, Arc::new(Notify::new()));
            tokio::time::timeout(Duration::from_secs(10), rx).await
        });
        let err = r.expect("within the deadline").unwrap().unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
