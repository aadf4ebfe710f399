//! virtio-rng: gives the guest entropy from the host's `/dev/urandom`, so the guest
//! kernel's RNG is seeded at boot without waiting for jitter entropy.

mod device;

pub use device::Rng;

/// Most bytes handed out per request, so a guest asking for a huge buffer cannot make the
/// VMM spend unbounded time in one exit.
pub const MAX_BYTES_PER_REQUEST: usize = 64 * 1024;
/// Queue size.
pub const QUEUE_SIZE: u16 = 256;

/// Errors creating the rng device.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot open /dev/urandom
    OpenUrandom(#[source] std::io::Error),
}
