//! Belljar's userspace network: one smoltcp TCP/IP stack per sandbox, fed Ethernet frames by
//! a [`FrameDevice`] (a tap descriptor for namespace sandboxes, `belljar-vmm`'s frame socket
//! for microVMs). The stack is the sandbox's gateway: it answers ARP/NDP and DNS, and
//! terminates each TCP and UDP flow, re-originating it from a host socket only once the
//! [`NetworkPolicy`] allows it. Every flow lands in the [`FlowLog`].
//!
//! The crate knows nothing of the HTTP API or the store: the daemon maps its wire types onto
//! [`NetworkPolicy`] and persists [`FlowRecord`]s.
//!
//! # Wiring a sandbox
//! - Namespace backend: in the sandbox's network namespace, [`tap::create`]`("eth0")` and
//!   [`tap::set_persistent`] (so a daemon restart, even `kill -9`, leaves the device and its
//!   configuration in place); configure it from [`config`] (`GUEST_V4/PREFIX_V4`,
//!   `GUEST_V6/PREFIX_V6`, default routes via `GATEWAY_V4`/`GATEWAY_V6`,
//!   `TAP_MTU`, `GUEST_MAC`) and write `nameserver 10.0.2.2` to `/etc/resolv.conf`; then
//!   [`Network::spawn`] on a [`TapDevice`] with `NetConfig::mtu` = `TAP_MTU`. After a restart, [`tap::attach`] the same name.
//! - microVM backend: give the VMM a frame socket (`belljar_vmm_api::net::NetConfig` with
//!   `mac: GUEST_MAC`, `mtu: MTU`) and [`Network::spawn`] on a [`SeqpacketDevice`] for that
//!   path; it connects, and reconnects whenever the VMM side hangs up. The agent configures
//!   `eth0` as above, with `MTU`.
//! - Brokering: one [`Broker`] per sandbox; keep [`Broker::ca_key_pem`] with the sandbox
//!   (and rebuild with [`Broker::from_key_pem`] after a restart); the sandbox trusts
//!   [`Broker::ca_pem`].
//! - Exposed ports: bind a `TcpListener` on 127.0.0.1 and [`Network::forward`] it.
//! - Budget: every network of the process shares [`Budget::process`] (`Options::budget`'s
//!   default), so that all sandboxes together leave the daemon descriptors of its own.

#![deny(unsafe_code)]

pub mod broker;
pub mod budget;
pub mod config;
pub mod device;
pub mod dns;
pub mod domain;
pub mod flows;
#[doc(hidden)]
pub mod fuzz;
pub mod policy;
pub mod sniff;
mod stack;
pub mod tap;
pub mod tap_attach;
pub mod testing;
pub mod vnet;

pub use broker::{Broker, BrokerError, Refusal, Transform};
pub use budget::Budget;
pub use config::NetConfig;
pub use device::{FrameDevice, SeqpacketDevice, TapDevice};
pub use dns::DnsUpstream;
pub use domain::{DomainError, DomainPattern};
pub use flows::{FlowLog, FlowRecord, FlowVerdict, Protocol, Totals};
pub use policy::{NetworkPolicy, Rule, Rules, Verdict};
pub use stack::{Forward, Network, NetworkError, Options};
