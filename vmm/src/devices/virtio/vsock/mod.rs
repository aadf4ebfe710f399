//! virtio-vsock in userspace, "hybrid" style: guest AF_VSOCK streams are bridged to host
//! Unix sockets, because there is no vhost-vsock on our build machines nor on macOS.
//!
//! - A guest connection to host port P is bridged to a new connection to the Unix socket
//!   `<uds_path>_P`.
//! - A host client connects to `<uds_path>` and writes `CONNECT <port>\n`; once the guest
//!   listener on `<port>` accepts, the VMM answers `OK <host port>\n` and the socket
//!   becomes the stream.

mod connection;
mod device;
mod event_handler;
mod muxer;
mod packet;
#[cfg(test)]
mod test_utils;

pub use connection::{ConnState, Connection};
pub use device::{Vsock, VsockConfig};
pub use packet::PacketHeader;

/// The host's CID.
pub const HOST_CID: u64 = 2;
/// Queue indices and size.
pub const RX_QUEUE: u16 = 0;
pub const TX_QUEUE: u16 = 1;
pub const EVENT_QUEUE: u16 = 2;
/// The one vsock event (virtio spec 5.10.6.7): every connection is gone.
pub const VIRTIO_VSOCK_EVENT_TRANSPORT_RESET: u32 = 0;
pub const QUEUE_SIZE: u16 = 256;
/// Largest payload in one packet.
pub const MAX_PKT_DATA: u32 = 64 * 1024;
/// Receive buffer each connection advertises to the guest (credit).
pub const CONN_BUF_ALLOC: u32 = 256 * 1024;
/// Host ports handed to host-initiated connections start here.
pub const FIRST_LOCAL_PORT: u32 = 1 << 30;
/// Most connections one VM may have open.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most RSTs queued for a guest that posts no rx buffers.
pub const MAX_PENDING_RST: usize = 1024;
/// Longest `CONNECT <port>\n` line accepted.
pub const MAX_CONNECT_LINE: usize = 32;

/// Packet type: stream.
pub const TYPE_STREAM: u16 = 1;
/// Operations (virtio spec 5.10.6).
pub const OP_REQUEST: u16 = 1;
pub const OP_RESPONSE: u16 = 2;
pub const OP_RST: u16 = 3;
pub const OP_SHUTDOWN: u16 = 4;
pub const OP_RW: u16 = 5;
pub const OP_CREDIT_UPDATE: u16 = 6;
pub const OP_CREDIT_REQUEST: u16 = 7;
/// SHUTDOWN flags.
pub const SHUTDOWN_RCV: u32 = 1;
pub const SHUTDOWN_SEND: u32 = 2;

/// Errors creating the vsock device.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot listen on vsock socket {0}
    Listen(String, #[source] std::io::Error),
    /// Cannot create the vsock event poller
    Epoll(#[source] std::io::Error),
    /// Guest CID {0} is reserved (must be 3 or more)
    BadCid(u64),
}
