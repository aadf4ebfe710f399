//! One bridged vsock stream: the per-connection state machine and credit accounting.
//!
//! Kept free of virtqueue code so it can be tested on its own with a real Unix socket pair.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::num::Wrapping;
use std::os::unix::net::UnixStream;

use super::packet::PacketHeader;
use super::*;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Host-initiated: REQUEST sent to the guest, waiting for RESPONSE or RST.
    AwaitingGuest,
    /// Data flows both ways.
    Established,
    /// The host side hung up; SHUTDOWN sent, waiting for the guest's RST.
    HostClosed,
}

/// What the device must do after a guest packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    /// Drop the connection, telling the guest with an RST if `rst`.
    Close {
        rst: bool,
    },
}

/// A packet the connection wants to send to the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outgoing {
    pub op: u16,
    pub flags: u32,
    /// Payload length for RW (the bytes are in the caller's buffer).
    pub len: u32,
}

/// One guest <-> host-socket stream.
pub struct Connection {
    /// The host-side vsock port (what the guest addresses).
    pub local_port: u32,
    /// The guest-side vsock port.
    pub peer_port: u32,
    pub state: ConnState,
    stream: UnixStream,
    /// Guest data not yet accepted by the host socket (after `handshake_left` bytes of the
    /// VMM's own `OK <port>` line).
    to_host: VecDeque<u8>,
    /// Bytes at the front of `to_host` that the VMM wrote itself, not the guest: they must not
    /// count into `fwd_cnt`, or the guest believes the host consumed data it never sent and its
    /// credit arithmetic stalls the stream.
    handshake_left: usize,
    /// Bytes forwarded to the host socket (our `fwd_cnt`).
    fwd_cnt: Wrapping<u32>,
    /// `fwd_cnt` last told to the guest.
    fwd_cnt_sent: Wrapping<u32>,
    /// Bytes sent to the guest.
    rx_cnt: Wrapping<u32>,
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    /// The host socket may have data (edge-triggered readiness seen, not yet drained).
    pub host_readable: bool,
    /// Control packets waiting for an rx buffer.
    control: VecDeque<Outgoing>,
    /// The guest said it will send no more.
    guest_shut_send: bool,
    /// The host socket's write side is shut. Once is enough: every `shutdown(2)` is a new
    /// edge on the edge-triggered poller, and repeating it on each readiness never settles.
    host_write_shut: bool,
}

impl Connection {
    /// The guest connected to a host port and the host socket accepted.
    pub fn guest_initiated(local_port: u32, peer_port: u32, stream: UnixStream) -> Self {
        let mut c = Self::new(local_port, peer_port, stream, ConnState::Established);
        c.push_control(OP_RESPONSE, 0);
        c
    }

    /// A host client asked (`CONNECT <peer_port>`) to reach a guest listener.
    pub fn host_initiated(local_port: u32, peer_port: u32, stream: UnixStream) -> Self {
        let mut c = Self::new(local_port, peer_port, stream, ConnState::AwaitingGuest);
        c.push_control(OP_REQUEST, 0);
        c
    }

    fn new(local_port: u32, peer_port: u32, stream: UnixStream, state: ConnState) -> Self {
        Connection {
            local_port,
            peer_port,
            state,
            stream,
            to_host: VecDeque::new(),
            handshake_left: 0,
            fwd_cnt: Wrapping(0),
            fwd_cnt_sent: Wrapping(0),
            rx_cnt: Wrapping(0),
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            host_readable: true,
            control: VecDeque::new(),
            guest_shut_send: false,
            host_write_shut: false,
        }
    }

    /// The host socket.
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    fn push_control(&mut self, op: u16, flags: u32) {
        self.control.push_back(Outgoing { op, flags, len: 0 });
    }

    /// Bytes we may still send to the guest.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = (self.rx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Our `fwd_cnt`, for packet headers.
    pub fn fwd_cnt(&self) -> u32 {
        self.fwd_cnt.0
    }

    /// Whether `next_outgoing` may produce a packet.
    pub fn has_outgoing(&self) -> bool {
        !self.control.is_empty()
            || (self.state == ConnState::Established
                && self.host_readable
                && self.peer_credit() > 0)
    }

    /// Handles a packet from the guest addressed to this connection.
    pub fn on_guest_packet(&mut self, hdr: &PacketHeader, data: &[u8]) -> Verdict {
        self.peer_buf_alloc = hdr.buf_alloc();
        self.peer_fwd_cnt = Wrapping(hdr.fwd_cnt());
        match (hdr.op(), self.state) {
            (OP_RESPONSE, ConnState::AwaitingGuest) => {
                self.state = ConnState::Established;
                let line = format!("OK {}\n", self.local_port);
                self.handshake_left = line.len();
                self.to_host.extend(line.as_bytes());
                self.flush_to_host()
            }
            (OP_RW, ConnState::Established | ConnState::HostClosed) => {
                if self.guest_shut_send {
                    return Verdict::Close { rst: true };
                }
                let queued = self.to_host.len() + data.len();
                if queued > CONN_BUF_ALLOC as usize {
                    // The guest ignored our credit.
                    return Verdict::Close { rst: true };
                }
                self.to_host.extend(data);
                self.flush_to_host()
            }
            (OP_CREDIT_UPDATE, _) => Verdict::Keep,
            (OP_CREDIT_REQUEST, _) => {
                // One pending update answers any number of requests.
                if !self.control.iter().any(|o| o.op == OP_CREDIT_UPDATE) {
                    self.push_control(OP_CREDIT_UPDATE, 0);
                }
                Verdict::Keep
            }
            (OP_SHUTDOWN, _) => {
                let flags = hdr.flags();
                if flags & SHUTDOWN_SEND != 0 {
                    self.guest_shut_send = true;
                }
                if flags & (SHUTDOWN_SEND | SHUTDOWN_RCV) == SHUTDOWN_SEND | SHUTDOWN_RCV {
                    let _ = self.flush_to_host();
                    return Verdict::Close { rst: true };
                }
                self.shut_host_write_when_drained();
                Verdict::Keep
            }
            (OP_RST, _) => Verdict::Close { rst: false },
            _ => Verdict::Close { rst: true },
        }
    }

    /// Passes the guest's SHUTDOWN(SEND) on to the host socket once its data is all written.
    fn shut_host_write_when_drained(&mut self) {
        if self.guest_shut_send && self.to_host.is_empty() && !self.host_write_shut {
            self.host_write_shut = true;
            let _ = self.stream.shutdown(Shutdown::Write);
        }
    }

    /// Writes queued guest data to the host socket without blocking.
    pub fn flush_to_host(&mut self) -> Verdict {
        while !self.to_host.is_empty() {
            let (front, _) = self.to_host.as_slices();
            match self.stream.write(front) {
                Ok(0) => return Verdict::Close { rst: true },
                Ok(n) => {
                    self.to_host.drain(..n);
                    let own = n.min(self.handshake_left);
                    self.handshake_left -= own;
                    // `to_host` never holds more than CONN_BUF_ALLOC guest bytes plus the OK
                    // line (the guest overrunning its credit is reset), so this fits.
                    let guest_bytes = u32::try_from(n - own).expect("within CONN_BUF_ALLOC");
                    self.fwd_cnt += Wrapping(guest_bytes);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return Verdict::Close { rst: true },
            }
        }
        self.shut_host_write_when_drained();
        // Tell the guest about freed buffer space before it runs out of credit.
        if (self.fwd_cnt - self.fwd_cnt_sent).0 >= CONN_BUF_ALLOC / 4
            && !self.control.iter().any(|o| o.op == OP_CREDIT_UPDATE)
        {
            self.push_control(OP_CREDIT_UPDATE, 0);
        }
        Verdict::Keep
    }

    /// The next packet for the guest; RW payload is read from the host socket into `buf`
    /// (at most `buf.len()` bytes). `None` when there is nothing to send now.
    pub fn next_outgoing(&mut self, buf: &mut [u8]) -> Option<Outgoing> {
        if let Some(out) = self.control.pop_front() {
            self.fwd_cnt_sent = self.fwd_cnt;
            return Some(out);
        }
        if self.state != ConnState::Established || !self.host_readable {
            return None;
        }
        let max = buf.len().min(self.peer_credit() as usize);
        if max == 0 {
            return None;
        }
        loop {
            match self.stream.read(&mut buf[..max]) {
                Ok(0) => {
                    self.host_readable = false;
                    self.state = ConnState::HostClosed;
                    return Some(Outgoing {
                        op: OP_SHUTDOWN,
                        flags: SHUTDOWN_RCV | SHUTDOWN_SEND,
                        len: 0,
                    });
                }
                Ok(n) => {
                    // n <= max <= peer_credit(), a u32.
                    let len = u32::try_from(n).expect("read at most peer_credit() bytes");
                    self.rx_cnt += Wrapping(len);
                    self.fwd_cnt_sent = self.fwd_cnt;
                    return Some(Outgoing {
                        op: OP_RW,
                        flags: 0,
                        len,
                    });
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.host_readable = false;
                    return None;
                }
                Err(_) => {
                    self.host_readable = false;
                    self.state = ConnState::HostClosed;
                    return Some(Outgoing {
                        op: OP_RST,
                        flags: 0,
                        len: 0,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Le16, Le32};

    fn hdr(op: u16, flags: u32, len: u32, buf_alloc: u32, fwd_cnt: u32) -> PacketHeader {
        PacketHeader {
            op: Le16::from(op),
            flags: Le32::from(flags),
            len: Le32::from(len),
            buf_alloc: Le32::from(buf_alloc),
            fwd_cnt: Le32::from(fwd_cnt),
            type_: Le16::from(TYPE_STREAM),
            ..Default::default()
        }
    }

    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        (a, b)
    }

    /// Found by the `vsock_chain` fuzz target: after a guest SHUTDOWN(SEND), every flush shut
    /// the host socket down again, each shutdown woke the edge-triggered poller again, and
    /// the device thread spun in `handle_host_events` forever.
    #[test]
    fn guest_shutdown_shuts_the_host_socket_once() {
        use std::os::fd::AsRawFd;
        use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
        let (vmm_side, mut host) = pair();
        let fd = vmm_side.as_raw_fd();
        let mut c = Connection::guest_initiated(52, 1234, vmm_side);
        let epoll = Epoll::new().unwrap();
        let ev = EpollEvent::new(
            EventSet::IN | EventSet::OUT | EventSet::READ_HANG_UP | EventSet::EDGE_TRIGGERED,
            fd as u64,
        );
        epoll.ctl(ControlOperation::Add, fd, ev).unwrap();
        let mut events = [EpollEvent::default(); 4];
        assert_eq!(
            c.on_guest_packet(&hdr(OP_SHUTDOWN, SHUTDOWN_SEND, 0, 4096, 0), &[]),
            Verdict::Keep
        );
        let mut got = Vec::new();
        host.read_to_end(&mut got).unwrap();
        assert!(got.is_empty(), "the host sees end of stream");
        while epoll.wait(0, &mut events).unwrap() > 0 {}
        // The poller says writable again (as it does for any edge): the flush must not make
        // a new edge of its own.
        assert_eq!(c.flush_to_host(), Verdict::Keep);
        assert_eq!(
            epoll.wait(0, &mut events).unwrap(),
            0,
            "flush woke the poller"
        );
    }

    #[test]
    fn guest_initiated_responds_then_moves_data_both_ways() {
        let (vmm_side, mut host) = pair();
        let mut c = Connection::guest_initiated(52, 1234, vmm_side);
        let mut buf = [0u8; 64];
        assert_eq!(c.next_outgoing(&mut buf).unwrap().op, OP_RESPONSE);
        // Guest -> host.
        let v = c.on_guest_packet(&hdr(OP_RW, 0, 5, 4096, 0), b"hello");
        assert_eq!(v, Verdict::Keep);
        let mut got = [0u8; 5];
        host.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        assert_eq!(c.fwd_cnt(), 5);
        // Host -> guest, bounded by the guest's credit (4096).
        host.write_all(b"world").unwrap();
        let out = c.next_outgoing(&mut buf).unwrap();
        assert_eq!((out.op, out.len), (OP_RW, 5));
        assert_eq!(&buf[..5], b"world");
        assert_eq!(c.peer_credit(), 4091);
        // Nothing more to read: readiness is cleared.
        assert_eq!(c.next_outgoing(&mut buf), None);
        assert!(!c.host_readable);
    }

    #[test]
    fn host_initiated_waits_for_response_and_answers_ok() {
        let (vmm_side, mut host) = pair();
        let mut c = Connection::host_initiated(1 << 30, 1024, vmm_side);
        let mut buf = [0u8; 64];
        assert_eq!(c.next_outgoing(&mut buf).unwrap().op, OP_REQUEST);
        host.write_all(b"early").unwrap();
        // No data before the guest accepts.
        assert_eq!(c.next_outgoing(&mut buf), None);
        assert_eq!(
            c.on_guest_packet(&hdr(OP_RESPONSE, 0, 0, 4096, 0), &[]),
            Verdict::Keep
        );
        assert_eq!(c.state, ConnState::Established);
        let mut line = [0u8; 14];
        host.read_exact(&mut line).unwrap();
        assert_eq!(&line, b"OK 1073741824\n");
        // The line is the VMM's, not the guest's: the guest must not see it as consumed.
        assert_eq!(c.fwd_cnt(), 0);
        let v = c.on_guest_packet(&hdr(OP_RW, 0, 3, 4096, 0), b"abc");
        assert_eq!(v, Verdict::Keep);
        assert_eq!(c.fwd_cnt(), 3, "only the guest's bytes count");
        let mut got = [0u8; 3];
        host.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"abc");
    }

    #[test]
    fn after_the_handshake_fwd_cnt_counts_exactly_the_guest_bytes() {
        let (vmm_side, mut host) = pair();
        let mut c = Connection::host_initiated(7, 1024, vmm_side);
        let mut buf = [0u8; 64];
        c.next_outgoing(&mut buf);
        c.on_guest_packet(&hdr(OP_RESPONSE, 0, 0, 4096, 0), &[]);
        let payload = vec![b'x'; 300_000];
        let mut sent = 0;
        let mut received = Vec::new();
        let mut chunk = vec![0u8; 65536];
        while received.len() < 5 + payload.len() {
            if sent < payload.len() {
                let n = (payload.len() - sent).min(MAX_PKT_DATA as usize);
                let room = CONN_BUF_ALLOC as usize - c.to_host.len();
                let n = n.min(room);
                if n > 0 {
                    let len = u32::try_from(n).unwrap();
                    c.on_guest_packet(&hdr(OP_RW, 0, len, 4096, 0), &payload[sent..sent + n]);
                    sent += n;
                }
            }
            let n = host.read(&mut chunk).unwrap();
            received.extend_from_slice(&chunk[..n]);
            c.flush_to_host();
        }
        assert_eq!(&received[..5], b"OK 7\n");
        assert_eq!(c.fwd_cnt() as usize, payload.len());
    }

    #[test]
    fn no_credit_no_data() {
        let (vmm_side, mut host) = pair();
        let mut c = Connection::guest_initiated(52, 1, vmm_side);
        let mut buf = [0u8; 64];
        c.next_outgoing(&mut buf);
        host.write_all(b"data").unwrap();
        // buf_alloc 0: the guest has no room.
        c.on_guest_packet(&hdr(OP_CREDIT_UPDATE, 0, 0, 0, 0), &[]);
        assert!(!c.has_outgoing());
        assert_eq!(c.next_outgoing(&mut buf), None);
        c.on_guest_packet(&hdr(OP_CREDIT_UPDATE, 0, 0, 2, 0), &[]);
        let out = c.next_outgoing(&mut buf).unwrap();
        assert_eq!(out.len, 2);
    }

    #[test]
    fn guest_overrunning_credit_is_reset() {
        let (vmm_side, _host) = pair();
        let mut c = Connection::guest_initiated(52, 1, vmm_side);
        // The host never reads: fill our buffer past what we advertised.
        let chunk = vec![0u8; MAX_PKT_DATA as usize];
        let mut verdict = Verdict::Keep;
        for _ in 0..64 {
            verdict = c.on_guest_packet(&hdr(OP_RW, 0, MAX_PKT_DATA, 4096, 0), &chunk);
            if verdict != Verdict::Keep {
                break;
            }
        }
        assert_eq!(verdict, Verdict::Close { rst: true });
    }

    #[test]
    fn host_hangup_sends_shutdown_and_rst_closes() {
        let (vmm_side, host) = pair();
        let mut c = Connection::guest_initiated(52, 1, vmm_side);
        let mut buf = [0u8; 64];
        c.next_outgoing(&mut buf);
        c.on_guest_packet(&hdr(OP_CREDIT_UPDATE, 0, 0, 4096, 0), &[]);
        drop(host);
        let out = c.next_outgoing(&mut buf).unwrap();
        assert_eq!(out.op, OP_SHUTDOWN);
        assert_eq!(c.state, ConnState::HostClosed);
        assert_eq!(
            c.on_guest_packet(&hdr(OP_RST, 0, 0, 0, 0), &[]),
            Verdict::Close { rst: false }
        );
    }

    #[test]
    fn unexpected_ops_reset() {
        let (vmm_side, _host) = pair();
        let mut c = Connection::host_initiated(1 << 30, 5, vmm_side);
        // RW before the guest accepted.
        assert_eq!(
            c.on_guest_packet(&hdr(OP_RW, 0, 1, 0, 0), b"x"),
            Verdict::Close { rst: true }
        );
        let (vmm_side, _host) = pair();
        let mut c = Connection::guest_initiated(52, 1, vmm_side);
        assert_eq!(
            c.on_guest_packet(&hdr(99, 0, 0, 0, 0), &[]),
            Verdict::Close { rst: true }
        );
    }

    #[test]
    fn credit_request_gets_credit_update() {
        let (vmm_side, _host) = pair();
        let mut c = Connection::guest_initiated(52, 1, vmm_side);
        let mut buf = [0u8; 8];
        c.next_outgoing(&mut buf);
        for _ in 0..1000 {
            c.on_guest_packet(&hdr(OP_CREDIT_REQUEST, 0, 0, 0, 0), &[]);
        }
        assert_eq!(c.next_outgoing(&mut buf).unwrap().op, OP_CREDIT_UPDATE);
        assert_eq!(c.next_outgoing(&mut buf), None, "a flood queues one update");
    }
}
