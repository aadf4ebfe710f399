//! Counters that the control socket's `metrics` command reports (as the contract's
//! `belljar_vmm_api::metrics` types).
//!
//! Plain atomics, shared through `Arc`, so vCPU threads and the device thread update them
//! without locks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use belljar_vmm_api::metrics::{
    DeviceMetrics as DeviceMetricsSnapshot, Metrics as MetricsSnapshot,
    VcpuMetrics as VcpuMetricsSnapshot,
};

/// Per-device counters.
#[derive(Debug, Default)]
pub struct DeviceMetrics {
    /// Bytes the guest sent to the device (written to disk, sent on vsock, printed on serial).
    pub bytes_in: AtomicU64,
    /// Bytes the device gave the guest (read from disk, entropy, received on vsock).
    pub bytes_out: AtomicU64,
    /// Requests completed.
    pub requests: AtomicU64,
    /// Malformed requests from the guest that were refused.
    pub errors: AtomicU64,
}

impl DeviceMetrics {
    pub fn add_in(&self, n: u64) {
        self.bytes_in.fetch_add(n, Ordering::Relaxed);
    }
    pub fn add_out(&self, n: u64) {
        self.bytes_out.fetch_add(n, Ordering::Relaxed);
    }
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }
    /// A point-in-time copy.
    pub fn snapshot(&self, name: &str) -> DeviceMetricsSnapshot {
        DeviceMetricsSnapshot {
            name: name.to_string(),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// Per-vCPU exit counters.
#[derive(Debug, Default)]
pub struct VcpuMetrics {
    pub exits: AtomicU64,
    pub io_exits: AtomicU64,
    pub halt_exits: AtomicU64,
    pub interrupted_exits: AtomicU64,
}

impl VcpuMetrics {
    pub fn snapshot(&self, id: u8) -> VcpuMetricsSnapshot {
        VcpuMetricsSnapshot {
            id,
            exits: self.exits.load(Ordering::Relaxed),
            io_exits: self.io_exits.load(Ordering::Relaxed),
            halt_exits: self.halt_exits.load(Ordering::Relaxed),
            interrupted_exits: self.interrupted_exits.load(Ordering::Relaxed),
        }
    }
}

/// Accesses the guest made to addresses or ports where no device lives.
#[derive(Debug, Default)]
pub struct BusMetrics {
    pub unknown_pio: AtomicU64,
    pub unknown_mmio: AtomicU64,
}

/// All of one VMM's counters.
#[derive(Debug, Default)]
pub struct VmmMetrics {
    pub vcpus: Vec<Arc<VcpuMetrics>>,
    pub bus: Arc<BusMetrics>,
    pub devices: Vec<(String, Arc<DeviceMetrics>)>,
}

impl VmmMetrics {
    pub fn snapshot(&self, guest_memory_bytes: u64) -> MetricsSnapshot {
        MetricsSnapshot {
            vcpus: self
                .vcpus
                .iter()
                .enumerate()
                // `VmConfig` caps vCPUs at MAX_VCPUS (32), so the index fits.
                .map(|(i, v)| v.snapshot(u8::try_from(i).unwrap_or(u8::MAX)))
                .collect(),
            unknown_pio: self.bus.unknown_pio.load(Ordering::Relaxed),
            unknown_mmio: self.bus.unknown_mmio.load(Ordering::Relaxed),
            devices: self.devices.iter().map(|(n, d)| d.snapshot(n)).collect(),
            rss_bytes: rss_bytes().unwrap_or(0),
            guest_memory_bytes,
        }
    }
}

/// Resident set size of this process, from `/proc/self/statm`. The file is opened once and
/// re-read with `pread`, so this keeps working under the seccomp filter (which denies
/// `open`); call it once before the filter is installed.
pub fn rss_bytes() -> Option<u64> {
    use std::os::unix::fs::FileExt;
    static STATM: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    let file = STATM
        .get_or_init(|| std::fs::File::open("/proc/self/statm").ok())
        .as_ref()?;
    let mut buf = [0u8; 128];
    let n = file.read_at(&mut buf, 0).ok()?;
    let statm = std::str::from_utf8(&buf[..n]).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_nonzero() {
        assert!(rss_bytes().unwrap() > 0);
    }

    #[test]
    fn device_snapshot_counts() {
        let d = DeviceMetrics::default();
        d.add_in(3);
        d.add_out(5);
        d.error();
        let s = d.snapshot("blk0");
        assert_eq!((s.bytes_in, s.bytes_out, s.errors), (3, 5, 1));
    }
}
