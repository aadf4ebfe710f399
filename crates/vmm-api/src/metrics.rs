//! The counters the control socket's `metrics` request returns: a point-in-time copy of the
//! VMM's atomics, plain data on both sides.

use serde::{Deserialize, Serialize};

/// One device's counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceMetrics {
    /// `serial`, `block0`, `vsock`, `rng`, ...
    pub name: String,
    /// Bytes the guest sent to the device (written to disk, sent on vsock, printed on serial).
    pub bytes_in: u64,
    /// Bytes the device gave the guest (read from disk, entropy, received on vsock).
    pub bytes_out: u64,
    /// Requests completed.
    pub requests: u64,
    /// Malformed requests from the guest that were refused.
    pub errors: u64,
}

/// One vCPU's exit counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VcpuMetrics {
    pub id: u8,
    pub exits: u64,
    pub io_exits: u64,
    pub halt_exits: u64,
    pub interrupted_exits: u64,
}

/// All of one VMM's counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    pub vcpus: Vec<VcpuMetrics>,
    /// Guest accesses to I/O ports where no device lives.
    pub unknown_pio: u64,
    /// Guest accesses to MMIO addresses where no device lives.
    pub unknown_mmio: u64,
    pub devices: Vec<DeviceMetrics>,
    /// Resident set size of the whole VMM process, guest memory included.
    pub rss_bytes: u64,
    /// Guest RAM size.
    pub guest_memory_bytes: u64,
}
