//! What all sandboxes' networks together may hold of the daemon: host sockets (descriptors)
//! and the smoltcp buffers of their TCP connections. One [`Budget`] per daemon, shared by
//! every [`crate::Network`] through [`crate::Options::budget`].
//!
//! Each sandbox has its own flow limit (`Limits::max_tcp_flows`), but the daemon has one
//! descriptor limit: eighteen sandboxes at their limit took all of it, and the daemon's own
//! API, store and logs then failed with `EMFILE`. So the networks draw host sockets from a
//! budget that leaves a reserve for the rest of the daemon; a flow the budget has no room for
//! is refused as a flow (a reset to the guest, a flow record with the rule
//! `daemon flow budget`), never as a descriptor the API does not get.
//!
//! Sharing: while at most half of the budget is in use, a sandbox takes what it needs (up to
//! its own limit); past half, a sandbox may hold only its fair share, the budget divided by
//! the networks running (at least [`MIN_SHARE`]), so that one or two busy sandboxes cannot
//! leave the others nothing, while a lone busy sandbox is not held to a small share.
//!
//! Memory: each TCP connection's smoltcp buffers are reserved here too, full-sized while the
//! buffers in use stay under half of [`Budget::buffer_bytes`], small past that (a slower
//! connection rather than none), refused when even those do not fit. When many buffers have
//! been freed, the C allocator is asked to give the freed pages back to the system
//! ([`trim`]): glibc keeps them otherwise, and the daemon stayed at 1.6 GB after the sandboxes
//! that made it grow were gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The share a sandbox keeps when the budget is more than half used, however many networks
/// run: enough for a build's parallel downloads.
pub const MIN_SHARE: usize = 64;
/// Descriptors the daemon keeps out of the networks' reach, at least: the API's connections,
/// the store, the agents' and the VMMs' sockets, logs, image layers.
pub const MIN_RESERVE: usize = 1024;
/// The buffers all TCP connections may hold by default: 819 connections with full buffers
/// (half of it), then 8192 more with small ones.
pub const DEFAULT_BUFFER_BYTES: usize = 1 << 30;
/// Freed buffer bytes after which the allocator is asked to return free pages.
const TRIM_AFTER: usize = 64 << 20;

/// The buffer sizes of a TCP connection (towards the host, towards the guest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferSizes {
    pub recv: usize,
    pub send: usize,
}

impl BufferSizes {
    /// A window that fills a fast local link. Towards the guest it holds what is in flight,
    /// unacknowledged: at 128 KiB that was two 64 KiB segments at MTU 65520, and the host's
    /// data waited for each acknowledgement.
    pub const FULL: Self = Self {
        recv: 128 * 1024,
        send: 512 * 1024,
    };
    /// When many connections are open: a window for a WAN-speed connection.
    pub const SMALL: Self = Self {
        recv: 16 * 1024,
        send: 48 * 1024,
    };

    pub const fn total(self) -> usize {
        self.recv + self.send
    }
}

/// The daemon-wide budget of the networks. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Budget {
    sockets: usize,
    buffer_bytes: usize,
    sockets_used: AtomicUsize,
    buffers_used: AtomicUsize,
    members: AtomicUsize,
    freed_since_trim: AtomicUsize,
}

impl Budget {
    /// A budget of `sockets` host sockets and `buffer_bytes` of TCP buffers.
    pub fn new(sockets: usize, buffer_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            sockets,
            buffer_bytes,
            sockets_used: AtomicUsize::new(0),
            buffers_used: AtomicUsize::new(0),
            members: AtomicUsize::new(0),
            freed_since_trim: AtomicUsize::new(0),
        })
    }

    /// The budget every network of this process shares unless its `Options` name another:
    /// [`Budget::for_process`], made on first use.
    pub fn process() -> Arc<Self> {
        static PROCESS: std::sync::OnceLock<Arc<Budget>> = std::sync::OnceLock::new();
        PROCESS
            .get_or_init(|| {
                let budget = Self::for_process();
                tracing::info!(
                    sockets = budget.sockets,
                    buffer_bytes = budget.buffer_bytes,
                    "the sandboxes' networks share a flow budget"
                );
                budget
            })
            .clone()
    }

    /// A budget for this process: its descriptor limit (`RLIMIT_NOFILE`, soft) less a
    /// reserve of a quarter of it, at least [`MIN_RESERVE`], and [`DEFAULT_BUFFER_BYTES`].
    pub fn for_process() -> Arc<Self> {
        let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| usize::try_from(soft).unwrap_or(usize::MAX))
            .unwrap_or(MIN_RESERVE);
        Self::new(sockets_for_limit(limit), DEFAULT_BUFFER_BYTES)
    }

    /// Host sockets the networks may hold together.
    pub fn sockets(&self) -> usize {
        self.sockets
    }

    /// Host sockets held now.
    pub fn sockets_used(&self) -> usize {
        self.sockets_used.load(Ordering::Relaxed)
    }

    /// TCP buffer bytes the networks may hold together.
    pub fn buffer_bytes(&self) -> usize {
        self.buffer_bytes
    }

    /// TCP buffer bytes held now.
    pub fn buffers_used(&self) -> usize {
        self.buffers_used.load(Ordering::Relaxed)
    }

    /// Networks drawing on the budget now.
    pub fn networks(&self) -> usize {
        self.members.load(Ordering::Relaxed)
    }

    /// What one sandbox may hold while the budget is more than half used: an equal part,
    /// or [`MIN_SHARE`] when that part is smaller (a quarter of a small budget at most).
    fn fair_share(&self) -> usize {
        (self.sockets / self.networks().max(1)).max(MIN_SHARE.min(self.sockets / 4))
    }

    /// Counts `n` freed buffer bytes; past [`TRIM_AFTER`] of them, returns free pages.
    fn freed(&self, n: usize) {
        let before = self.freed_since_trim.fetch_add(n, Ordering::Relaxed);
        if before + n >= TRIM_AFTER && before < TRIM_AFTER {
            self.freed_since_trim.store(0, Ordering::Relaxed);
            trim();
        }
    }
}

/// Host sockets for a process whose descriptor limit is `limit`: all but a quarter of it, or
/// all but [`MIN_RESERVE`], whichever leaves fewer, but never less than half. A daemon
/// started with the common default soft limit of 1024 (a login shell's, a plain init's) gets
/// 512 instead of none: with none, every flow of every sandbox was refused.
pub fn sockets_for_limit(limit: usize) -> usize {
    let reserve = (limit / 4).max(MIN_RESERVE.min(limit / 2));
    limit.saturating_sub(reserve)
}

/// Takes one unit of `counter` if that keeps it at most `cap`.
fn take(counter: &AtomicUsize, n: usize, cap: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            used.checked_add(n).filter(|&u| u <= cap)
        })
        .is_ok()
}

/// One network's part of the budget: counts what it holds, and counts it among the networks
/// that share the budget while it lives.
#[derive(Debug)]
pub(crate) struct Share {
    budget: Arc<Budget>,
    held: Arc<AtomicUsize>,
}

impl Share {
    pub fn new(budget: Arc<Budget>) -> Self {
        budget.members.fetch_add(1, Ordering::Relaxed);
        Self {
            budget,
            held: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A host socket for a new flow, or `None`: the daemon has none to spare, or this
    /// sandbox holds its fair share of a budget more than half used.
    pub fn socket(&self) -> Option<SocketPermit> {
        let b = &self.budget;
        if b.sockets_used() >= b.sockets / 2 && self.held.load(Ordering::Relaxed) >= b.fair_share()
        {
            return None;
        }
        if !take(&b.sockets_used, 1, b.sockets) {
            return None;
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        Some(SocketPermit {
            budget: b.clone(),
            held: self.held.clone(),
        })
    }

    /// Buffers for a new TCP connection: full-sized while the buffers in use stay under half
    /// the budget, small past that, `None` when not even those fit.
    pub fn buffers(&self) -> Option<BufferPermit> {
        let b = &self.budget;
        let sizes = if take(
            &b.buffers_used,
            BufferSizes::FULL.total(),
            b.buffer_bytes / 2,
        ) {
            BufferSizes::FULL
        } else if take(&b.buffers_used, BufferSizes::SMALL.total(), b.buffer_bytes) {
            BufferSizes::SMALL
        } else {
            return None;
        };
        Some(BufferPermit {
            budget: b.clone(),
            sizes,
        })
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.budget.members.fetch_sub(1, Ordering::Relaxed);
        // The network's flows are gone: give their memory back now rather than at the
        // next threshold.
        self.budget.freed_since_trim.store(0, Ordering::Relaxed);
        trim();
    }
}

/// One host socket of the budget, given back when dropped.
#[derive(Debug)]
pub(crate) struct SocketPermit {
    budget: Arc<Budget>,
    held: Arc<AtomicUsize>,
}

impl Drop for SocketPermit {
    fn drop(&mut self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
        self.budget.sockets_used.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The buffers of one TCP connection, given back to the budget when dropped.
#[derive(Debug)]
pub(crate) struct BufferPermit {
    budget: Arc<Budget>,
    sizes: BufferSizes,
}

impl BufferPermit {
    pub fn sizes(&self) -> BufferSizes {
        self.sizes
    }
}

impl Drop for BufferPermit {
    fn drop(&mut self) {
        let n = self.sizes.total();
        self.budget.buffers_used.fetch_sub(n, Ordering::AcqRel);
        self.budget.freed(n);
    }
}

/// Asks the C allocator to return the free pages of its heaps to the system. glibc returns
/// only the top of a heap by itself; a heap whose top is still in use keeps every page freed
/// below it for ever.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn trim() {
    // SAFETY: malloc_trim only walks and releases the allocator's own free lists; it takes
    // the allocator's locks and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other allocators return memory their own way.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_a_quarter_of_the_limit_and_at_least_1024_or_half() {
        assert_eq!(sockets_for_limit(20_000), 15_000);
        assert_eq!(sockets_for_limit(1_048_576), 786_432);
        assert_eq!(sockets_for_limit(4096), 3072);
        assert_eq!(sockets_for_limit(2048), 1024);
        // The default soft limit of most shells and inits: half, not nothing.
        assert_eq!(sockets_for_limit(1024), 512);
        assert_eq!(sockets_for_limit(256), 128);
    }

    #[test]
    fn past_half_a_sandbox_keeps_only_its_fair_share() {
        let budget = Budget::new(256, DEFAULT_BUFFER_BYTES);
        let (busy, other) = (Share::new(budget.clone()), Share::new(budget.clone()));
        let held: Vec<_> = std::iter::from_fn(|| busy.socket()).collect();
        // Past half (128) it may hold its share of two networks: 128.
        assert_eq!(held.len(), 128);
        let others: Vec<_> = std::iter::from_fn(|| other.socket()).collect();
        assert_eq!(others.len(), 128, "the other sandbox still gets its share");
        assert_eq!(budget.sockets_used(), 256);
        drop(held);
        assert_eq!(budget.sockets_used(), 128, "given back with the flows");
        drop(others);
        assert_eq!(budget.sockets_used(), 0);
    }

    #[test]
    fn a_lone_sandbox_may_use_the_whole_budget_but_not_more() {
        let budget = Budget::new(100, DEFAULT_BUFFER_BYTES);
        let lone = Share::new(budget.clone());
        let held: Vec<_> = std::iter::from_fn(|| lone.socket()).collect();
        assert_eq!(held.len(), 100);
        let late = Share::new(budget.clone());
        assert!(late.socket().is_none(), "nothing left");
        drop(held);
        assert!(late.socket().is_some());
    }

    #[test]
    fn buffers_shrink_past_half_then_are_refused_and_are_given_back() {
        let full = BufferSizes::FULL.total();
        let small = BufferSizes::SMALL.total();
        let budget = Budget::new(1000, 4 * full);
        let share = Share::new(budget.clone());
        let a = share.buffers().unwrap();
        let b = share.buffers().unwrap();
        assert_eq!(
            (a.sizes(), b.sizes()),
            (BufferSizes::FULL, BufferSizes::FULL)
        );
        let smalls: Vec<_> = std::iter::from_fn(|| share.buffers()).collect();
        assert!(smalls.iter().all(|p| p.sizes() == BufferSizes::SMALL));
        assert_eq!(smalls.len(), 2 * full / small);
        assert!(budget.buffers_used() <= budget.buffer_bytes());
        drop((a, b, smalls));
        assert_eq!(budget.buffers_used(), 0);
    }
}
