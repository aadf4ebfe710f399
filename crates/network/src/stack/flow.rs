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

use crate::flows::{FlowRecord, FlowVerdict, Protocol, now_ms};
use crate::policy::Verdict;

use super::Ctx;

/// smoltcp's buffers per connection, each way: a window that fills a fast local link. They
/// are zeroed allocations, so an idle connection's pages are never touched.
pub(super) const SOCKET_BUFFER: usize = 128 * 1024;
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
    pub(super) from_host: Option<mpsc::Receiver<Vec<u8>>>,
    pub(super) host_eof: bool,
    pub(super) tasks: Vec<AbortHandle>,
}

impl Drop for Flow {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

pub(super) fn new_socket(
    sockets: &mut SocketSet<'static>,
    dst: SocketAddr,
) -> Option<SocketHandle> {
    let mut s = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; SOCKET_BUFFER]),
        tcp::SocketBuffer::new(vec![0; SOCKET_BUFFER]),
    );
    s.set_nagle_enabled(false);
    // Acknowledge at once: on a local link a delayed ACK only stalls the sender.
    s.set_ack_delay(None);
    s.set_timeout(Some(smoltcp::time::Duration::from_secs(120)));
    s.listen((smoltcp::wire::IpAddress::from(dst.ip()), dst.port()))
        .ok()?;
    Some(sockets.add(s))
}

pub(super) fn connect(dst: SocketAddr, wake: Arc<Notify>) -> (Connecting, AbortHandle) {
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        let r = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(dst)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
        };
        let _ = tx.send(r);
        wake.notify_one();
    });
    (rx, task.abort_handle())
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
            host_eof: false,
            tasks: Vec::new(),
        }
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
        });
        self.log_id = Some(id);
    }

    /// Starts moving bytes between the host socket and the stack.
    pub(super) fn open(&mut self, stream: TcpStream, wake: &Arc<Notify>) {
        let _ = stream.set_nodelay(true);
        let (rd, wr) = stream.into_split();
        self.pump(rd, wr, wake);
    }

    /// Starts the two tasks that move bytes between a host-side stream and the stack.
    pub(super) fn pump<R, W>(&mut self, mut rd: R, mut wr: W, wake: &Arc<Notify>)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (in_tx, in_rx) = mpsc::channel::<Vec<u8>>(CHANNEL_CHUNKS);
        let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(CHANNEL_CHUNKS);
        let w = wake.clone();
        let reader = tokio::spawn(async move {
            loop {
                let mut buf = vec![0; CHUNK];
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        buf.truncate(n);
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
        self.tasks.push(reader.abort_handle());
        self.tasks.push(writer.abort_handle());
        self.to_host = Some(out_tx);
        self.from_host = Some(in_rx);
        self.phase = Phase::Open;
    }
}
