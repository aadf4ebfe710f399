//! Belljar's userspace network: one smoltcp TCP/IP stack per sandbox, fed Ethernet frames by
//! a [`FrameDevice`] (a tap descriptor for namespace sandboxes, `belljar-vmm`'s frame socket
//! for microVMs). The stack is the sandbox's gateway: it answers ARP/NDP and DNS, and
//! terminates each TCP and UDP flow, re-originating it from a host socket only once the
//! [`NetworkPolicy`] allows it. Every flow lands in the [`FlowLog`].
//!
//! The crate knows nothing of the HTTP API or the store: the daemon maps its wire types onto
//! [`NetworkPolicy`] and persists [`FlowRecord`]s.

#![deny(unsafe_code)]

pub mod broker;
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

pub use broker::{Broker, BrokerError, Transform};
pub use config::NetConfig;
pub use device::{FrameDevice, SeqpacketDevice, TapDevice};
pub use dns::DnsUpstream;
pub use domain::{DomainError, DomainPattern};
pub use flows::{FlowLog, FlowRecord, FlowVerdict, Protocol, Totals};
pub use policy::{NetworkPolicy, Rule, Rules, Verdict};
pub use stack::{Forward, Network, NetworkError, Options};
