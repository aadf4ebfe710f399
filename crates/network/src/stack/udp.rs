//! UDP: datagrams from the guest are relayed without smoltcp. DNS to the gateway goes to the
//! daemon's DNS server; anything else gets a host socket per (guest port, destination) once
//! the policy allows it, kept while it is used. Answers come back through one channel and are
//! framed for the guest by the stack.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::dns::Dns;
use crate::flows::Protocol;
use crate::policy::{AddrDecision, Rule, Verdict};

use super::Ctx;

/// UDP bindings one sandbox may have.
const MAX_BINDINGS: usize = 1024;
/// DNS questions being resolved at once; more are answered SERVFAIL.
const MAX_DNS_IN_FLIGHT: usize = 64;
/// Datagrams waiting to be framed for the guest; more are dropped, as UDP allows.
pub(crate) const REPLY_QUEUE: usize = 512;

/// A datagram for the guest.
pub(crate) struct Reply {
    pub from: SocketAddr,
    pub to: SocketAddr,
    pub data: Vec<u8>,
    /// The binding it belongs to, to count its bytes.
    pub key: Option<(SocketAddr, SocketAddr)>,
}

struct Binding {
    socket: Option<Arc<UdpSocket>>,
    log_id: u64,
    bytes_out: u64,
    bytes_in: u64,
    last: Instant,
    task: Option<AbortHandle>,
    /// The host socket in the daemon's budget.
    _permit: Option<crate::budget::SocketPermit>,
}

impl Drop for Binding {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

pub(crate) struct UdpFlows {
    bindings: HashMap<(SocketAddr, SocketAddr), Binding>,
    replies: mpsc::Sender<Reply>,
    dns_slots: Arc<tokio::sync::Semaphore>,
}

fn log(
    cx: &Ctx,
    protocol: Protocol,
    src: SocketAddr,
    dst: SocketAddr,
    name: Option<String>,
    v: &Verdict,
) -> u64 {
    cx.shared.log(protocol, src, dst, name, v)
}

/// Sends without waiting. Not `UdpSocket::try_send`: Tokio refuses that until its reactor has
/// seen the new socket writable, which would lose a flow's first datagram.
fn send_now(socket: &UdpSocket, payload: &[u8]) {
    use std::os::fd::AsRawFd;
    let _ = nix::sys::socket::send(
        socket.as_raw_fd(),
        payload,
        nix::sys::socket::MsgFlags::MSG_DONTWAIT,
    );
}

fn host_socket(dst: SocketAddr) -> std::io::Result<UdpSocket> {
    let any: IpAddr = match dst {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let s = std::net::UdpSocket::bind((any, 0))?;
    s.connect(dst)?;
    s.set_nonblocking(true)?;
    UdpSocket::from_std(s)
}

impl UdpFlows {
    pub fn new(replies: mpsc::Sender<Reply>) -> Self {
        Self {
            bindings: HashMap::new(),
            replies,
            dns_slots: Arc::new(tokio::sync::Semaphore::new(MAX_DNS_IN_FLIGHT)),
        }
    }

    /// Handles one datagram from the guest. Returns an immediate answer (a refused DNS
    /// question) if there is one.
    pub fn on_datagram(
        &mut self,
        cx: &mut Ctx,
        src: SocketAddr,
        dst: SocketAddr,
        payload: &[u8],
    ) -> Option<Reply> {
        if dst.port() == crate::config::DNS_PORT && cx.cfg.is_gateway(dst.ip()) {
            return self.dns(cx, src, dst, payload);
        }
        let key = (src, dst);
        if let Some(b) = self.bindings.get_mut(&key) {
            b.last = Instant::now();
            b.bytes_out += payload.len() as u64;
            if let Some(s) = &b.socket {
                // A full socket buffer drops the datagram, as a congested link would.
                send_now(s, payload);
            }
            return None;
        }
        if self.bindings.len() >= MAX_BINDINGS {
            self.expire(cx);
        }
        let mut verdict = if self.bindings.len() >= MAX_BINDINGS {
            Verdict::Deny(Rule::TooManyFlows)
        } else {
            match cx.decide_addr(dst.ip()) {
                AddrDecision::Decided(v) => v,
                // Only TLS and HTTP carry a name: other protocols need a subnet rule.
                AddrDecision::NeedName => Verdict::Deny(Rule::NoName),
            }
        };
        let permit = if verdict.is_allow() {
            cx.share.socket()
        } else {
            None
        };
        if verdict.is_allow() && permit.is_none() {
            verdict = Verdict::Deny(Rule::FlowBudget);
        }
        let log_id = log(cx, Protocol::Udp, src, dst, None, &verdict);
        let mut binding = Binding {
            socket: None,
            log_id,
            bytes_out: payload.len() as u64,
            bytes_in: 0,
            last: Instant::now(),
            task: None,
            _permit: permit,
        };
        if verdict.is_allow() {
            match host_socket(dst) {
                Ok(socket) => {
                    let socket = Arc::new(socket);
                    send_now(&socket, payload);
                    let (rx, replies, wake) =
                        (socket.clone(), self.replies.clone(), cx.shared.wake.clone());
                    let task = tokio::spawn(async move {
                        let mut buf = vec![0; 65536];
                        while let Ok(n) = rx.recv(&mut buf).await {
                            let reply = Reply {
                                from: dst,
                                to: src,
                                data: buf[..n].to_vec(),
                                key: Some(key),
                            };
                            if replies.try_send(reply).is_ok() {
                                wake.notify_one();
                            }
                        }
                    });
                    binding.socket = Some(socket);
                    binding.task = Some(task.abort_handle());
                }
                Err(e) => tracing::debug!(%dst, error = %e, "no host UDP socket"),
            }
        }
        self.bindings.insert(key, binding);
        None
    }

    fn dns(
        &mut self,
        cx: &mut Ctx,
        src: SocketAddr,
        dst: SocketAddr,
        payload: &[u8],
    ) -> Option<Reply> {
        // Before anything else costs: a flood is refused for the price of a copy.
        if let Err(refused) = cx.shared.dns_limit.admit(&cx.shared, src, dst, payload) {
            return refused.map(|data| Reply {
                from: dst,
                to: src,
                data,
                key: None,
            });
        }
        let question = Dns::parse(payload)?;
        let verdict = cx.policy.decide_dns(&question.name);
        let id = log(
            cx,
            Protocol::Dns,
            src,
            dst,
            Some(question.name.clone()),
            &verdict,
        );
        let flows = cx.shared.flows.clone();
        let out = payload.len() as u64;
        if !verdict.is_allow() {
            let data = Dns::refuse(&question);
            flows.finish(id, out, data.len() as u64);
            return Some(Reply {
                from: dst,
                to: src,
                data,
                key: None,
            });
        }
        // The most a datagram to the guest can carry without fragments.
        let link_max = cx.cfg.mtu - if src.is_ipv4() { 28 } else { 48 };
        let Ok(slot) = self.dns_slots.clone().try_acquire_owned() else {
            let data = Dns::fail(&question);
            flows.finish(id, out, data.len() as u64);
            return Some(Reply {
                from: dst,
                to: src,
                data,
                key: None,
            });
        };
        let (dns, replies, wake) = (cx.dns.clone(), self.replies.clone(), cx.shared.wake.clone());
        tokio::spawn(async move {
            let data = Dns::fit_udp(&question, dns.resolve(&question).await, link_max);
            drop(slot);
            flows.finish(id, out, data.len() as u64);
            if replies
                .send(Reply {
                    from: dst,
                    to: src,
                    data,
                    key: None,
                })
                .await
                .is_ok()
            {
                wake.notify_one();
            }
        });
        None
    }

    /// Counts bytes of a reply that reached the guest.
    pub fn delivered(&mut self, reply: &Reply) {
        if let Some(b) = reply.key.and_then(|k| self.bindings.get_mut(&k)) {
            b.bytes_in += reply.data.len() as u64;
            b.last = Instant::now();
        }
    }

    /// Closes bindings idle for `Limits::udp_idle`.
    pub fn expire(&mut self, cx: &Ctx) {
        let now = Instant::now();
        let idle = cx.limits.udp_idle;
        self.bindings.retain(|_, b| {
            let keep = now.duration_since(b.last) < idle;
            if !keep {
                cx.shared.flows.finish(b.log_id, b.bytes_out, b.bytes_in);
            }
            keep
        });
    }

    /// Closes the bindings a new policy denies; the next datagram is decided anew.
    pub fn recheck(&mut self, cx: &mut Ctx) {
        let keys: Vec<_> = self.bindings.keys().copied().collect();
        for key in keys {
            let allowed = matches!(
                cx.decide_addr(key.1.ip()),
                AddrDecision::Decided(Verdict::Allow(_))
            );
            let was = self.bindings.get(&key).is_some_and(|b| b.socket.is_some());
            if allowed != was
                && let Some(b) = self.bindings.remove(&key)
            {
                cx.shared.flows.finish(b.log_id, b.bytes_out, b.bytes_in);
            }
        }
    }
}
