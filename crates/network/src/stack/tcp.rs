//! TCP flows: each connection from the guest is terminated in smoltcp and re-originated from a
//! host socket, and only after the policy allows it. Where the address alone decides, the host
//! connection is made before the guest's SYN is answered, so a refused or unreachable server
//! shows in the guest as a refused connection. Where only a domain rule can allow it, the
//! handshake with the guest completes first and the TLS SNI or HTTP `Host` is read before any
//! host socket exists.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::policy::{AddrDecision, Verdict};
use crate::sniff::{SNIFF_LIMIT, Sniffed, sniff};

use super::Ctx;
use super::flow::{CHUNK, Flow, Phase, connect, guest_socket, new_socket};
use super::host_read::Filled;

/// How long a connection may take to show its TLS SNI or HTTP `Host`.
const SNIFF_TIMEOUT: Duration = Duration::from_secs(10);
/// How often flows are looked over for the idle timeouts of [`crate::config::Limits`].
const SWEEP: Duration = Duration::from_secs(1);

/// All TCP flows of one sandbox, keyed by (guest address, destination).
#[derive(Default)]
pub(crate) struct TcpFlows {
    flows: HashMap<(SocketAddr, SocketAddr), Flow>,
    /// Sockets of finished flows, removed only after smoltcp has sent what they still owe
    /// (the reset of an aborted connection).
    reap: Vec<SocketHandle>,
    /// The last local port given to an inbound flow.
    next_port: u16,
    /// When flows are next looked over for idle timeouts.
    next_sweep: Option<Instant>,
}

impl TcpFlows {
    /// Whether smoltcp may see this SYN: no for a new flow (decided here), or for a flow whose
    /// host connection is still under way (the retransmitted SYN is dropped).
    pub fn on_syn(
        &mut self,
        cx: &mut Ctx,
        sockets: &mut SocketSet<'static>,
        src: SocketAddr,
        dst: SocketAddr,
        frame: &[u8],
    ) -> bool {
        if let Some(flow) = self.flows.get(&(src, dst)) {
            let handshaking = match flow.socket {
                Some(h) => matches!(
                    sockets.get::<tcp::Socket>(h).state(),
                    tcp::State::Listen | tcp::State::SynReceived
                ),
                None => true,
            };
            if handshaking {
                // A retransmitted SYN: smoltcp answers it, or it waits for the host.
                return !matches!(flow.phase, Phase::Connecting { .. });
            }
            // The same ports again on a new connection (the guest rebooted, or reused the
            // port): the old flow is stale.
            if let Some(old) = self.flows.remove(&(src, dst)) {
                if let Some(id) = old.log_id {
                    cx.shared.flows.finish(id, old.bytes_out, old.bytes_in);
                }
                if let Some(h) = old.socket {
                    sockets.remove(h);
                }
            }
        }
        let mut flow = Flow::new(dst);
        if dst.port() == crate::config::DNS_PORT && cx.cfg.is_gateway(dst.ip()) {
            // DNS over TCP (after a truncated answer): served here, each question decided
            // and logged as over UDP.
            let mut flow = Flow::new(dst);
            flow.inbound = true;
            let Some(buffers) = cx.share.buffers() else {
                return true; // no memory to spare: a reset, the guest asks again over UDP
            };
            flow.socket = new_socket(sockets, dst, &cx.limits, buffers.sizes());
            flow.buffers = Some(buffers);
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            let (rd, wr) = tokio::io::split(ours);
            flow.pump(rd, wr, &cx.shared.wake);
            let task = tokio::spawn(super::dns_tcp::serve(
                theirs,
                src,
                dst,
                cx.shared.clone(),
                cx.dns.clone(),
            ));
            flow.tasks.push(task.abort_handle());
            self.flows.insert((src, dst), flow);
            return true;
        }
        let mut decision = if self.flows.len() >= cx.limits.max_tcp_flows {
            AddrDecision::Decided(Verdict::Deny(crate::policy::Rule::TooManyFlows))
        } else {
            cx.decide_addr(dst.ip())
        };
        // What the flow will hold of the daemon, before anything is opened: the buffers,
        // and the host socket if the address alone allows it.
        let budget_refused = AddrDecision::Decided(Verdict::Deny(crate::policy::Rule::FlowBudget));
        if let AddrDecision::Decided(Verdict::Allow(_)) | AddrDecision::NeedName = decision {
            flow.buffers = cx.share.buffers();
            if flow.buffers.is_none() {
                decision = budget_refused;
            } else if matches!(decision, AddrDecision::Decided(_)) {
                flow.host_permit = cx.share.socket();
                if flow.host_permit.is_none() {
                    decision = budget_refused;
                }
            }
        }
        match decision {
            AddrDecision::Decided(v @ Verdict::Deny(_)) => {
                flow.record(cx, src, &v);
                if v.rule() == &crate::policy::Rule::FlowBudget {
                    tracing::debug!(%dst, "the daemon's flow budget refuses a flow");
                }
                if let Some(id) = flow.log_id {
                    cx.shared.flows.finish(id, 0, 0);
                }
                true // no listener: smoltcp answers with a reset
            }
            AddrDecision::Decided(v) => {
                flow.record(cx, src, &v);
                let (rx, task) = connect(dst, cx.shared.wake.clone());
                flow.tasks.extend(task);
                flow.phase = Phase::Connecting {
                    syn: frame.to_vec(),
                    rx,
                };
                self.flows.insert((src, dst), flow);
                false
            }
            AddrDecision::NeedName => {
                flow.socket = new_socket(sockets, dst, &cx.limits, flow.buffer_sizes());
                flow.phase = Phase::Sniffing {
                    until: Instant::now() + SNIFF_TIMEOUT,
                };
                self.flows.insert((src, dst), flow);
                true
            }
        }
    }

    /// Moves every flow along; returns frames to give smoltcp (held SYNs) and whether
    /// anything changed.
    pub fn service(
        &mut self,
        cx: &mut Ctx,
        sockets: &mut SocketSet<'static>,
    ) -> (Vec<Vec<u8>>, bool) {
        for h in self.reap.drain(..) {
            sockets.remove(h);
        }
        let mut inject = Vec::new();
        let mut progressed = false;
        let mut dead = Vec::new();
        for (&(src, dst), flow) in self.flows.iter_mut() {
            match service_one(cx, sockets, src, dst, flow, &mut inject) {
                Step::Idle => {}
                Step::Progress => progressed = true,
                Step::Done => {
                    progressed = true;
                    dead.push((src, dst));
                }
            }
        }
        for key in dead {
            if let Some(h) = self.flows.remove(&key).and_then(|f| f.socket) {
                self.reap.push(h);
            }
        }
        (inject, progressed)
    }

    /// Opens a connection from the gateway to the guest's `guest` address for a host
    /// connection accepted on an exposed port.
    pub fn inbound(
        &mut self,
        cx: &mut Ctx,
        iface: &mut smoltcp::iface::Interface,
        sockets: &mut SocketSet<'static>,
        stream: TcpStream,
        peer: SocketAddr,
        guest: SocketAddr,
    ) {
        let gateway = match guest {
            SocketAddr::V4(_) => IpAddr::V4(cx.cfg.gateway_v4),
            SocketAddr::V6(_) => IpAddr::V6(cx.cfg.gateway_v6),
        };
        // An ephemeral port of the gateway's not in use by another inbound flow.
        let Some(local) = (0..16384u16).find_map(|_| {
            self.next_port = if self.next_port < 49152 {
                49152
            } else {
                self.next_port.wrapping_add(1).max(49152)
            };
            let local = SocketAddr::new(gateway, self.next_port);
            (!self.flows.contains_key(&(guest, local))).then_some(local)
        }) else {
            return;
        };
        let mut flow = Flow::new(guest);
        flow.inbound = true;
        flow.buffers = cx.share.buffers();
        flow.host_permit = cx.share.socket();
        if flow.buffers.is_none() || flow.host_permit.is_none() {
            // The connection is dropped, so its descriptor is given back at once.
            let refused = Verdict::Deny(crate::policy::Rule::FlowBudget);
            flow.record(cx, peer, &refused);
            if let Some(id) = flow.log_id {
                cx.shared.flows.finish(id, 0, 0);
            }
            return;
        }
        let mut s = guest_socket(&cx.limits, flow.buffer_sizes());
        let remote = (smoltcp::wire::IpAddress::from(guest.ip()), guest.port());
        let local_ep = (smoltcp::wire::IpAddress::from(local.ip()), local.port());
        if s.connect(iface.context(), remote, local_ep).is_err() {
            return;
        }
        flow.socket = Some(sockets.add(s));
        flow.record(cx, peer, &Verdict::Allow(crate::policy::Rule::Forwarded));
        flow.open(stream, &cx.shared.wake);
        self.flows.insert((guest, local), flow);
    }

    /// Cuts the flows idle past their state's timeout (`Limits`): the ones a guest abandoned
    /// without a word, and the half-open or half-closed ones nobody finishes. Looks at most
    /// once a [`SWEEP`].
    pub fn expire(&mut self, cx: &Ctx, sockets: &mut SocketSet<'static>, now: Instant) {
        if self.next_sweep.is_some_and(|t| now < t) {
            return;
        }
        self.next_sweep = Some(now + SWEEP);
        let limits = &cx.limits;
        for flow in self.flows.values_mut() {
            let moved = flow.bytes_out + flow.bytes_in;
            if moved != flow.seen {
                flow.seen = moved;
                flow.last_active = now;
            }
            let Some(h) = flow.socket else {
                continue; // connecting to the host: bounded by the connect timeout
            };
            use tcp::State::*;
            let state = sockets.get::<tcp::Socket>(h).state();
            let limit = match state {
                Listen | SynReceived | SynSent => limits.tcp_handshake,
                Established => limits.tcp_established_idle,
                FinWait1 | FinWait2 | CloseWait | Closing | LastAck => limits.tcp_half_closed_idle,
                TimeWait | Closed => continue, // the next pass removes it
            };
            if now.saturating_duration_since(flow.last_active) >= limit {
                tracing::debug!(dst = %flow.dst, %state, "an idle flow is cut");
                flow.cut(sockets);
            }
        }
    }

    /// Re-decides every flow under a new policy and cuts the ones it denies.
    pub fn recheck(&mut self, cx: &mut Ctx, sockets: &mut SocketSet<'static>) {
        let mut forget = Vec::new();
        for (key, flow) in self.flows.iter_mut() {
            if flow.inbound {
                continue;
            }
            let verdict = match cx.decide_addr(flow.dst.ip()) {
                AddrDecision::Decided(v) => v,
                // Still waiting for its name: decided under the new policy when it comes.
                AddrDecision::NeedName if matches!(flow.phase, Phase::Sniffing { .. }) => continue,
                AddrDecision::NeedName => cx.decide_name(flow.name.as_deref(), flow.dst.ip()),
            };
            if verdict.is_allow() {
                continue;
            }
            tracing::debug!(dst = %flow.dst, rule = %verdict.rule(), "policy change cuts a flow");
            flow.cut(sockets);
            if flow.socket.is_none() {
                // The SYN was never answered: the guest's retry is decided anew.
                forget.push(*key);
            }
        }
        for key in forget {
            if let Some(flow) = self.flows.remove(&key)
                && let Some(id) = flow.log_id
            {
                cx.shared.flows.finish(id, 0, 0);
            }
        }
    }
}

/// Whether the guest has sent its FIN (or the connection is gone). Not the same as
/// `!may_recv()`, which also holds before the handshake completes.
fn guest_closed(socket: &tcp::Socket) -> bool {
    use tcp::State::*;
    matches!(
        socket.state(),
        CloseWait | LastAck | Closing | TimeWait | Closed
    )
}

enum Step {
    Idle,
    Progress,
    Done,
}

fn service_one(
    cx: &mut Ctx,
    sockets: &mut SocketSet<'static>,
    src: SocketAddr,
    dst: SocketAddr,
    flow: &mut Flow,
    inject: &mut Vec<Vec<u8>>,
) -> Step {
    let sizes = flow.buffer_sizes();
    match &mut flow.phase {
        Phase::Connecting { syn, rx } => match rx.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => return Step::Idle,
            Ok(Ok(stream)) => {
                flow.socket = new_socket(sockets, dst, &cx.limits, sizes);
                // The handshake with the guest starts now, however long the host's took.
                flow.last_active = Instant::now();
                inject.push(std::mem::take(syn));
                flow.open(stream, &cx.shared.wake);
                return Step::Progress;
            }
            Ok(Err(_)) | Err(_) => {
                // Unreachable or refused: the held SYN, given to smoltcp without a listener,
                // is answered with a reset.
                inject.push(std::mem::take(syn));
                if let Some(id) = flow.log_id {
                    cx.shared.flows.finish(id, 0, 0);
                }
                flow.log_id = None;
                return Step::Done;
            }
        },
        Phase::ConnectingNamed { rx } => match rx.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => {}
            Ok(Ok(stream)) => flow.open(stream, &cx.shared.wake),
            Ok(Err(_)) | Err(_) => {
                if let Some(h) = flow.socket {
                    sockets.get_mut::<tcp::Socket>(h).abort();
                }
                flow.phase = Phase::Open;
                flow.host_eof = true;
            }
        },
        Phase::Sniffing { .. } | Phase::Open => {}
    }
    let Some(handle) = flow.socket else {
        return Step::Done;
    };
    let socket = sockets.get_mut::<tcp::Socket>(handle);
    let mut progressed = false;

    if let Phase::Sniffing { until } = flow.phase {
        while socket.can_recv() && flow.out_pending.len() < SNIFF_LIMIT {
            let room = SNIFF_LIMIT - flow.out_pending.len();
            let mut buf = vec![0; room];
            match socket.recv_slice(&mut buf) {
                Ok(n) if n > 0 => flow.out_pending.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        let found = match sniff(&flow.out_pending) {
            Sniffed::Done(name) => Some(name),
            Sniffed::NeedMore if Instant::now() >= until || guest_closed(socket) => Some(None),
            Sniffed::NeedMore => None,
        };
        if let Some(name) = found {
            if !socket.is_open() {
                return Step::Done; // the guest gave up first
            }
            flow.name = name;
            let mut verdict = cx.decide_name(flow.name.as_deref(), dst.ip());
            if verdict.is_allow() {
                // The broker's upstream connection is a host socket as well.
                flow.host_permit = cx.share.socket();
                if flow.host_permit.is_none() {
                    verdict = Verdict::Deny(crate::policy::Rule::FlowBudget);
                }
            }
            flow.record(cx, src, &verdict);
            let brokered = flow.name.as_deref().and_then(|name| {
                let t = cx.policy.transform_for(name)?;
                Some((name.to_string(), t.headers.clone(), cx.broker.clone()?))
            });
            if let (true, Some((name, headers, broker))) = (verdict.is_allow(), brokered) {
                // Terminate the sandbox's TLS here; the broker makes its own connection.
                let (ours, theirs) = tokio::io::duplex(64 * 1024);
                let (rd, wr) = tokio::io::split(ours);
                flow.pump(rd, wr, &cx.shared.wake);
                let task = tokio::spawn(async move {
                    if let Err(e) = broker.serve(theirs, name, dst, headers).await {
                        tracing::debug!(%dst, error = %e, "brokered connection failed");
                    }
                });
                flow.tasks.push(task.abort_handle());
            } else if verdict.is_allow() {
                let (rx, task) = connect(dst, cx.shared.wake.clone());
                flow.tasks.extend(task);
                flow.phase = Phase::ConnectingNamed { rx };
            } else {
                socket.abort();
                flow.phase = Phase::Open;
                flow.host_eof = true;
            }
            progressed = true;
        }
    }

    if matches!(flow.phase, Phase::Open) && flow.to_host.is_some() {
        // Guest → host.
        while let Some(to_host) = &flow.to_host {
            if flow.out_pending.is_empty() {
                if !socket.can_recv() {
                    break;
                }
                let mut buf = vec![0; CHUNK];
                match socket.recv_slice(&mut buf) {
                    Ok(n) if n > 0 => {
                        buf.truncate(n);
                        flow.out_pending = buf;
                    }
                    _ => break,
                }
            }
            let reserved = match to_host.try_reserve() {
                Ok(permit) => {
                    flow.bytes_out += flow.out_pending.len() as u64;
                    permit.send(std::mem::take(&mut flow.out_pending));
                    Ok(())
                }
                Err(e) => Err(e),
            };
            match reserved {
                Ok(()) => progressed = true,
                Err(mpsc::error::TrySendError::Full(())) => break,
                Err(mpsc::error::TrySendError::Closed(())) => {
                    // The host reset the connection.
                    socket.abort();
                    flow.to_host = None;
                    flow.host_eof = true;
                    progressed = true;
                    break;
                }
            }
        }
        if flow.out_pending.is_empty() && guest_closed(socket) && socket.recv_queue() == 0 {
            flow.to_host = None; // the guest closed its side: half-close the host's
            progressed = true;
        }
    }

    if matches!(flow.phase, Phase::Open) {
        // Host → guest.
        loop {
            if !flow.in_pending.is_empty() {
                match socket.send_slice(&flow.in_pending) {
                    Ok(n) if n > 0 => {
                        flow.bytes_in += n as u64;
                        flow.in_pending.drain(..n);
                        progressed = true;
                        if !flow.in_pending.is_empty() {
                            break;
                        }
                    }
                    _ => break,
                }
            }
            let Some(from_host) = &mut flow.from_host else {
                break;
            };
            match from_host.try_recv() {
                Ok(data) => flow.in_pending = data,
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    flow.from_host = None;
                    flow.host_eof = true;
                    break;
                }
            }
        }
        if let Some(read) = &flow.host_read {
            let (moved, eof) = match read.fill(socket) {
                Filled::Bytes(n) => (n, false),
                Filled::Eof(n) => (n, true),
            };
            flow.bytes_in += moved as u64;
            progressed |= moved > 0;
            if eof {
                flow.host_read = None;
                flow.host_eof = true;
            }
        }
        if flow.host_eof && flow.in_pending.is_empty() && socket.may_send() {
            socket.close();
            progressed = true;
        }
    }

    let state = socket.state();
    if matches!(state, tcp::State::Closed | tcp::State::TimeWait) {
        if state == tcp::State::Closed && flow.last_state != tcp::State::LastAck {
            // A reset from the guest, or a guest that answered nothing: tell the host.
            flow.reset_host();
        }
        if let Some(id) = flow.log_id.take() {
            cx.shared.flows.finish(id, flow.bytes_out, flow.bytes_in);
        }
        return Step::Done;
    }
    flow.last_state = state;
    if progressed {
        Step::Progress
    } else {
        Step::Idle
    }
}
