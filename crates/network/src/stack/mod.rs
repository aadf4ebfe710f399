//! One sandbox's network: a smoltcp interface acting as the gateway, fed by a
//! [`FrameDevice`], with the TCP and UDP relays, the DNS server and the policy. It runs as one
//! Tokio task; [`Network`] is the handle the daemon keeps to replace the policy, read the flow
//! log and stop it.

mod dns_limit;
mod dns_tcp;
mod flow;
pub(crate) mod frames;
mod host_addrs;
mod host_read;
mod tcp;
mod udp;

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smoltcp::iface::{Config, Interface, PollResult, SocketSet};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr};
use tokio::sync::{Notify, mpsc};

use crate::budget::{Budget, Share};
use crate::config::{Limits, NetConfig, TAP_MTU};
use crate::device::FrameDevice;
use crate::dns::{Dns, DnsError, DnsUpstream};
use crate::flows::{DEFAULT_CAPACITY, FlowLog};
use crate::policy::{AddrDecision, Context, NetworkPolicy, Verdict};

use frames::{Incoming, Queues};

/// Why a network could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The DNS server could not start.
    #[error(transparent)]
    Dns(#[from] DnsError),
    /// The frame device failed.
    #[error("The frame device failed")]
    Device(#[source] std::io::Error),
    /// The configuration is not usable.
    #[error("Invalid network configuration: {0}")]
    Config(&'static str),
}

/// What a sandbox network starts with.
#[derive(Clone, Debug)]
pub struct Options {
    pub config: NetConfig,
    pub policy: NetworkPolicy,
    pub dns: DnsUpstream,
    /// Flow records kept.
    pub flow_capacity: usize,
    /// The sandbox's CA for credential brokering; without it, transforms are not applied
    /// (traffic to those domains passes untouched, without the secret).
    pub broker: Option<Arc<crate::broker::Broker>>,
    /// How many flows the sandbox may hold and for how long.
    pub limits: Limits,
    /// What all sandboxes' networks may hold together; [`Budget::process`] unless a test
    /// gives them another.
    pub budget: Arc<Budget>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            config: NetConfig::default(),
            policy: NetworkPolicy::default(),
            dns: DnsUpstream::default(),
            flow_capacity: DEFAULT_CAPACITY,
            broker: None,
            limits: Limits::default(),
            budget: Budget::process(),
        }
    }
}

/// What the stack task shares with its handle and helper tasks.
pub(crate) struct Shared {
    policy: Mutex<Arc<NetworkPolicy>>,
    generation: AtomicU64,
    pub flows: Arc<FlowLog>,
    pub wake: Arc<Notify>,
    pub dns_limit: dns_limit::DnsLimit,
}

impl Shared {
    /// The policy in force now.
    pub fn policy(&self) -> Arc<NetworkPolicy> {
        self.policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records the start of a flow and returns its id.
    pub fn log(
        &self,
        protocol: crate::flows::Protocol,
        src: std::net::SocketAddr,
        dst: std::net::SocketAddr,
        name: Option<String>,
        verdict: &Verdict,
    ) -> u64 {
        self.flows.begin(crate::flows::FlowRecord {
            id: 0,
            started_ms: crate::flows::now_ms(),
            ended_ms: None,
            protocol,
            src,
            dst,
            name,
            verdict: if verdict.is_allow() {
                crate::flows::FlowVerdict::Allowed
            } else {
                crate::flows::FlowVerdict::Denied
            },
            rule: verdict.rule().to_string(),
            bytes_out: 0,
            bytes_in: 0,
            coalesced: 0,
        })
    }
}

/// The handle of a running sandbox network. Dropping it stops the network.
pub struct Network {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<Result<(), NetworkError>>,
    inbound: mpsc::Sender<Inbound>,
}

/// A host connection to an exposed port, for the stack to carry to the guest.
struct Inbound {
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    guest_port: u16,
}

/// How many accepted connections may wait for the stack.
const INBOUND_QUEUE: usize = 64;

/// An exposed port: connections to its host address reach the guest's port. Dropping it stops
/// listening (open connections stay).
pub struct Forward {
    local_addr: std::net::SocketAddr,
    guest_port: u16,
    task: tokio::task::AbortHandle,
}

impl Forward {
    /// The host address that reaches the guest.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.local_addr
    }

    pub fn guest_port(&self) -> u16 {
        self.guest_port
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Network {
    /// Starts the network of one sandbox on `device`. Needs a Tokio runtime.
    pub fn spawn<D: FrameDevice>(device: D, options: Options) -> Result<Self, NetworkError> {
        let shared = Arc::new(Shared {
            policy: Mutex::new(Arc::new(options.policy.clone())),
            generation: AtomicU64::new(0),
            flows: Arc::new(FlowLog::new(options.flow_capacity)),
            wake: Arc::new(Notify::new()),
            dns_limit: dns_limit::DnsLimit::new(&options.limits),
        });
        let (inbound, inbound_rx) = mpsc::channel(INBOUND_QUEUE);
        let stack = Stack::new(&options, shared.clone(), device.offloads_checksums())?;
        let task = tokio::spawn(async move {
            let ended = run(device, stack, inbound_rx).await;
            // Nothing else would tell: the sandbox just has no network from here on.
            if let Err(e) = &ended {
                let cause = std::error::Error::source(e).map(ToString::to_string);
                tracing::warn!(error = %e, ?cause, "the sandbox network stopped");
            }
            ended
        });
        Ok(Self {
            shared,
            task,
            inbound,
        })
    }

    /// Exposes the guest's TCP `guest_port` (on its IPv4 address) on `listener`, which the
    /// caller bound (so it picks the address and port, and reports one already taken).
    /// Needs a Tokio runtime.
    pub fn forward(
        &self,
        listener: std::net::TcpListener,
        guest_port: u16,
    ) -> std::io::Result<Forward> {
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let (inbound, wake) = (self.inbound.clone(), self.shared.wake.clone());
        let task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(conn) => conn,
                    Err(e) => {
                        // Out of descriptors, most likely: let some close before retrying.
                        tracing::warn!(error = %e, "accept on an exposed port failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let conn = Inbound {
                    stream,
                    peer,
                    guest_port,
                };
                // A full queue refuses the connection (it is dropped).
                if inbound.try_send(conn).is_ok() {
                    wake.notify_one();
                }
            }
        });
        Ok(Forward {
            local_addr,
            guest_port,
            task: task.abort_handle(),
        })
    }

    /// Replaces the policy, whole and at once: new flows see only the new one, and open flows
    /// it denies are cut.
    pub fn set_policy(&self, policy: NetworkPolicy) {
        *self.shared.policy.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(policy);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        self.shared.wake.notify_one();
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<NetworkPolicy> {
        self.shared
            .policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The flow log.
    pub fn flows(&self) -> &Arc<FlowLog> {
        &self.shared.flows
    }

    /// DNS questions refused because the sandbox asked more a second than
    /// `Limits::dns_qps` allows, since the network started.
    pub fn dns_refused_for_rate(&self) -> u64 {
        self.shared.dns_limit.refused()
    }

    /// Whether the stack task has ended (its device failed).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops the network and returns how it ended.
    pub async fn shutdown(mut self) -> Result<(), NetworkError> {
        self.task.abort();
        match (&mut self.task).await {
            Ok(r) => r,
            Err(_) => Ok(()),
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What flows consult to decide: the policy as of the last change, the host's addresses.
pub(crate) struct Ctx {
    pub shared: Arc<Shared>,
    pub cfg: NetConfig,
    pub policy: Arc<NetworkPolicy>,
    pub dns: Arc<Dns>,
    pub broker: Option<Arc<crate::broker::Broker>>,
    pub limits: Limits,
    /// This sandbox's part of the daemon's budget.
    pub share: Share,
    generation: u64,
    context: Context,
    host_addrs: host_addrs::HostAddrs,
}

impl Ctx {
    pub fn decide_addr(&mut self, ip: IpAddr) -> AddrDecision {
        // As they are now, not as they were a while ago: see `host_addrs`.
        let now = self.host_addrs.current();
        if now != self.context.host_addrs.as_slice() {
            self.context.host_addrs = now.to_vec();
        }
        self.policy.decide_addr(ip, &self.context)
    }

    pub fn decide_name(&self, name: Option<&str>, ip: IpAddr) -> Verdict {
        self.policy.decide_name(name, |n| self.dns.answered(n, ip))
    }

    /// Picks up a replaced policy; true if it changed.
    fn refresh_policy(&mut self) -> bool {
        let generation = self.shared.generation.load(Ordering::SeqCst);
        if generation == self.generation {
            return false;
        }
        self.generation = generation;
        self.policy = self
            .shared
            .policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        true
    }
}

struct Stack {
    cx: Ctx,
    iface: Interface,
    sockets: SocketSet<'static>,
    queues: Queues,
    guest_mac: Option<EthernetAddress>,
    tcp: tcp::TcpFlows,
    udp: udp::UdpFlows,
    replies: Option<mpsc::Receiver<udp::Reply>>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        // The flows' buffers are freed here, before the budget's share (in `cx`) is dropped
        // and asks the allocator to return the pages they held.
        self.tcp = tcp::TcpFlows::default();
        self.sockets = SocketSet::new(Vec::new());
    }
}

fn smol_now() -> smoltcp::time::Instant {
    smoltcp::time::Instant::from_micros(
        i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_micros(),
        )
        .unwrap_or(i64::MAX),
    )
}

impl Stack {
    /// `offload`: the device checksums TCP (`FrameDevice::offloads_checksums`).
    fn new(options: &Options, shared: Arc<Shared>, offload: bool) -> Result<Self, NetworkError> {
        let cfg = options.config.clone();
        if !(1280..=TAP_MTU).contains(&cfg.mtu) {
            return Err(NetworkError::Config("the MTU must be 1280..=65520"));
        }
        let mut queues = Queues::new(cfg.mtu, offload);
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(cfg.gateway_mac)));
        config.random_seed = u64::from(std::process::id()) ^ smol_now().total_micros() as u64;
        let mut iface = Interface::new(config, &mut queues, smol_now());
        iface.update_ip_addrs(|addrs| {
            let _ = addrs.push(IpCidr::new(cfg.gateway_v4.into(), cfg.prefix_v4));
            let _ = addrs.push(IpCidr::new(cfg.gateway_v6.into(), cfg.prefix_v6));
        });
        // Any destination is "us": a default route through our own address makes smoltcp
        // accept packets for every address (AnyIP), so each flow can be terminated here.
        iface.set_any_ip(true);
        iface
            .routes_mut()
            .add_default_ipv4_route(cfg.gateway_v4)
            .map_err(|_| NetworkError::Config("route table full"))?;
        iface
            .routes_mut()
            .add_default_ipv6_route(cfg.gateway_v6)
            .map_err(|_| NetworkError::Config("route table full"))?;
        let (reply_tx, reply_rx) = mpsc::channel(udp::REPLY_QUEUE);
        let policy = shared
            .policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let cx = Ctx {
            generation: shared.generation.load(Ordering::SeqCst),
            context: Context {
                host_addrs: Vec::new(),
                sandbox_nets: cfg.sandbox_nets().to_vec(),
            },
            host_addrs: host_addrs::HostAddrs::new(),
            dns: Arc::new(Dns::new(&options.dns)?),
            broker: options.broker.clone(),
            limits: options.limits.clone(),
            share: Share::new(options.budget.clone()),
            policy,
            shared,
            cfg,
        };
        Ok(Self {
            cx,
            iface,
            sockets: SocketSet::new(Vec::new()),
            queues,
            guest_mac: None,
            tcp: tcp::TcpFlows::default(),
            udp: udp::UdpFlows::new(reply_tx),
            replies: Some(reply_rx),
        })
    }

    fn on_frame(&mut self, frame: &[u8]) {
        self.sync_policy();
        if frame.len() >= 14 {
            let src = EthernetAddress::from_bytes(&frame[6..12]);
            if src.is_unicast() {
                self.guest_mac = Some(src);
            }
        }
        match frames::classify(frame, &self.cx.cfg) {
            Incoming::Drop => {}
            Incoming::Stack => self.queues.rx.push_back(frame.to_vec()),
            Incoming::Syn { src, dst } => {
                if self
                    .tcp
                    .on_syn(&mut self.cx, &mut self.sockets, src, dst, frame)
                {
                    self.queues.rx.push_back(frame.to_vec());
                }
            }
            Incoming::Udp { src, dst, payload } => {
                let data = frame.get(payload).unwrap_or_default();
                if let Some(reply) = self.udp.on_datagram(&mut self.cx, src, dst, data) {
                    self.on_reply(reply);
                }
            }
        }
    }

    fn on_inbound(&mut self, conn: Inbound) {
        let guest = std::net::SocketAddr::new(self.cx.cfg.guest_v4.into(), conn.guest_port);
        self.tcp.inbound(
            &mut self.cx,
            &mut self.iface,
            &mut self.sockets,
            conn.stream,
            conn.peer,
            guest,
        );
    }

    fn on_reply(&mut self, reply: udp::Reply) {
        let Some(mac) = self.guest_mac else { return };
        self.udp.delivered(&reply);
        if let Some(frame) = frames::udp_frame(&self.cx.cfg, mac, reply.from, reply.to, &reply.data)
        {
            self.queues.tx.push_back(frame.into());
        }
    }

    /// Picks up a replaced policy and cuts what it denies. Called before anything is decided,
    /// so that once `set_policy` has returned no new flow sees the old policy.
    fn sync_policy(&mut self) {
        if self.cx.refresh_policy() {
            self.tcp.recheck(&mut self.cx, &mut self.sockets);
            self.udp.recheck(&mut self.cx);
        }
    }

    /// Runs smoltcp and the flows until neither has anything more to do right now.
    fn poll(&mut self) {
        self.sync_policy();
        self.tcp.expire(&self.cx, &mut self.sockets, Instant::now());
        for _ in 0..64 {
            let r = self
                .iface
                .poll(smol_now(), &mut self.queues, &mut self.sockets);
            let (inject, progressed) = self.tcp.service(&mut self.cx, &mut self.sockets);
            let injected = !inject.is_empty();
            self.queues.rx.extend(inject);
            if r == PollResult::None && !progressed && !injected && self.queues.rx.is_empty() {
                break;
            }
        }
        self.udp.expire(&self.cx);
        self.cx.shared.dns_limit.flush(&self.cx.shared.flows);
    }

    fn flush<D: FrameDevice>(&mut self, device: &D) -> Result<(), NetworkError> {
        // A frame the device refused for now may have had its checksum field prepared
        // (`vnet::prepare`); preparing it again gives the same bytes.
        while let Some(frame) = self.queues.tx.front_mut() {
            match device.try_send(frame.bytes_mut()) {
                Ok(()) => {
                    tracing::trace!(len = frame.bytes_mut().len(), "frame to the guest");
                    if let Some(frame) = self.queues.tx.pop_front() {
                        self.queues.sent(frame);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    tracing::trace!(queued = self.queues.tx.len(), "the device is not writable");
                    break;
                }
                Err(e) => return Err(NetworkError::Device(e)),
            }
        }
        Ok(())
    }

    fn delay(&mut self) -> Duration {
        let smol = self
            .iface
            .poll_delay(smol_now(), &self.sockets)
            .map(|d| Duration::from_micros(d.total_micros()));
        // Wake at least this often for timeouts smoltcp does not know (sniffing, UDP idle).
        smol.unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1))
    }
}

/// Frames taken from the device in one pass of the stack.
const BURST: usize = 64;

async fn run<D: FrameDevice>(
    device: D,
    mut stack: Stack,
    mut inbound: mpsc::Receiver<Inbound>,
) -> Result<(), NetworkError> {
    let mut buf = vec![0u8; 65536];
    let wake = stack.cx.shared.wake.clone();
    let mut replies = stack.replies.take().expect("replies taken once");
    loop {
        stack.poll();
        stack.flush(&device)?;
        stack.queues.trim();
        let delay = stack.delay();
        let want_write = !stack.queues.tx.is_empty();
        tokio::select! {
            r = device.recv(&mut buf) => {
                let n = r.map_err(NetworkError::Device)?;
                tracing::trace!(len = n, "frame from the guest");
                stack.on_frame(&buf[..n]);
                // The rest of a burst, before smoltcp runs once for all of it.
                for _ in 0..BURST {
                    match device.try_recv(&mut buf) {
                        Ok(n) => stack.on_frame(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(NetworkError::Device(e)),
                    }
                }
            }
            Some(reply) = replies.recv() => stack.on_reply(reply),
            Some(conn) = inbound.recv() => {
                tracing::debug!(port = conn.guest_port, "an inbound connection");
                stack.on_inbound(conn);
            }
            () = wake.notified() => {}
            r = device.writable(), if want_write => {
                r.map_err(NetworkError::Device)?;
                tracing::trace!("the device is writable");
            }
            () = tokio::time::sleep(delay) => {}
        }
    }
}
