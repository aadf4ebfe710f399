//! What a sandbox uses now: memory, CPU time, processes (E2B's `getMetrics`).
//!
//! Every figure is measured by the host, never reported by the sandbox: on the namespace
//! backend by the sandbox's cgroups, on the microVM backend from the VMM process as the host
//! kernel sees it. A figure the host cannot know is `null`, never a guess: how many processes
//! run inside a microVM, or whether its guest's OOM killer struck, only the guest knows, and
//! the guest's word is not a measurement.

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::ToSchema;

/// `GET /v1/sandboxes/{id}/usage`: a running or paused sandbox's resource use, measured now.
/// Counters (`cpu_usec`, `oom_kills`, `pids_denied`) grow from the sandbox's start; two
/// readings and their `measured_at` give a rate, such as CPU use in percent.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
pub struct SandboxUsage {
    /// Memory in use, bytes: the sandbox's memory cgroup (its processes, their page cache and
    /// its tmpfs files such as `/dev/shm`), or a microVM's resident memory on the host (the
    /// guest RAM it has touched, and the VMM's own).
    pub memory_bytes: Option<u64>,
    /// The most memory in use at any time since the sandbox started, bytes (same measure).
    pub memory_peak_bytes: Option<u64>,
    /// The most memory the sandbox may use, bytes: its memory cgroup's limit, or a microVM's
    /// guest RAM (the VMM's own few MiB come on top); `null` when nothing limits it.
    pub memory_limit_bytes: Option<u64>,
    /// CPU time used since the sandbox started, all CPUs together, microseconds.
    pub cpu_usec: Option<u64>,
    /// Processes (threads included) in the sandbox now; `null` on a microVM.
    pub pids: Option<u64>,
    /// Processes the kernel's OOM killer ended for want of the sandbox's memory; `null` on a
    /// microVM, whose guest kernel kills on its own.
    pub oom_kills: Option<u64>,
    /// Forks refused because the sandbox was at its process limit; `null` on a microVM.
    pub pids_denied: Option<u64>,
    /// When these figures were read, Unix milliseconds.
    pub measured_at: i64,
}
