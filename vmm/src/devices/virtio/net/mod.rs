//! virtio-net whose wire is a Unix socket to the daemon: the guest's Ethernet frames go to
//! the daemon's userspace network stack over the frame socket that
//! `belljar_vmm_api::net` defines (`SOCK_SEQPACKET`, one packet per frame, one peer at a
//! time). The VMM itself opens no network socket.
//!
//! As for vsock, the device (`device.rs`: the two virtqueues, virtio-net headers, malformed
//! chains) is kept apart from the host side (`frames.rs`: the listener, the peer, its
//! readiness); `event_handler.rs` wakes the device when the host side has something.

mod device;
mod event_handler;
mod frames;
#[cfg(test)]
mod test_utils;

pub use device::Net;

use virtio_bindings::virtio_net;

/// Queue indices and size (one queue pair, no control queue).
pub const RX_QUEUE: u16 = 0;
pub const TX_QUEUE: u16 = 1;
pub const QUEUE_SIZE: u16 = 256;

/// The virtio-net header in front of every frame on the queues. With VIRTIO_F_VERSION_1 it
/// is always `struct virtio_net_hdr_v1`, 12 bytes, even without mergeable rx buffers.
pub const NET_HDR_LEN: usize = std::mem::size_of::<virtio_net::virtio_net_hdr_v1>();
const _: () = assert!(NET_HDR_LEN == 12);

/// Feature bits: the guest's MAC and MTU come from the device's config space. No offloads:
/// every frame is a plain Ethernet frame of at most `mtu + 14` bytes, so the header the
/// guest sends carries nothing the device needs.
pub const VIRTIO_NET_F_MAC: u64 = 1 << virtio_net::VIRTIO_NET_F_MAC;
pub const VIRTIO_NET_F_MTU: u64 = 1 << virtio_net::VIRTIO_NET_F_MTU;

/// Errors creating the net device.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot listen on the frame socket {0}
    Listen(String, #[source] std::io::Error),
    /// Cannot create the frame socket's event poller
    Epoll(#[source] std::io::Error),
    /// Invalid network settings
    Config(#[from] belljar_vmm_api::net::Error),
}
