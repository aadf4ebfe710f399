//! Admission control: whether the host can take one more sandbox, decided by what sandboxes
//! use rather than by what their limits would allow, so that idle sandboxes do not hold memory
//! they never touch. A sandbox's `memory_mib` stays a cap (its cgroup's limit, or the microVM's
//! guest RAM), as in Docker, podman and the cloud sandboxes; admission asks three things:
//!
//! - **Pressure.** When the kernel reports memory stalls (PSI, `/proc/pressure/memory`, "some
//!   avg10") at or above [`PRESSURE_LIMIT_PCT`], the host is already reclaiming hard; a new
//!   sandbox would push it towards the OOM killer, so it is refused with a message naming the
//!   stall. Kernels without PSI (`psi=0`, or built without it) skip this test and rely on the
//!   next one alone.
//! - **Room.** `MemAvailable` already has the memory of running sandboxes taken out of it (the
//!   kernel measures what they use), so their use is not counted a second time. What it cannot
//!   show yet is the start of sandboxes still booting: each of those is counted at its start
//!   footprint, `min(limit, START_FOOTPRINT_MIB)`, and so is the new one. All of it must fit in
//!   `MemAvailable` minus the reserve. This needs no read per sandbox: two small `/proc` files
//!   and the store's list, whatever the number of sandboxes.
//! - **Overcommit.** The limits of all live sandboxes, the new one's included, stay within
//!   `overcommit × MemTotal`: a bound on how far the worst case (every sandbox growing to its
//!   cap at once) may go past the host, which the two live tests cannot see coming.
//!
//! Every refusal is `insufficient_resources` with a message that says which test failed and
//! by how much.
//!
//! Idle sandboxes are not paused to make room under pressure: on the namespace backend the
//! cgroup freezer keeps a frozen sandbox's pages where they are, and a paused microVM keeps
//! its guest memory mapped, so pausing frees nothing on either backend today.

use belljar_api::SandboxStatus;

use super::SandboxError;

/// Memory, MiB, that a sandbox is expected to claim while it starts (its agent, its first
/// processes; on the microVM backend the guest kernel too), counted for a sandbox whose use
/// `MemAvailable` does not show yet. A sandbox with a smaller limit is counted at its limit.
pub const START_FOOTPRINT_MIB: u64 = 128;

/// The share of the last 10 s in which some task stalled on memory (PSI "some avg10",
/// percent) from which new sandboxes are refused. Below it the kernel is reclaiming page cache
/// as usual; at a fifth of the time stalled, work on the host is visibly slowed.
pub const PRESSURE_LIMIT_PCT: f64 = 20.0;

/// The default ratio of the sum of sandboxes' memory limits to the host's RAM: ten times,
/// so that two hundred idle default sandboxes (1 GiB limits, tens of MiB used each) fit on a
/// 24 GiB host, while the pressure and room tests keep the host out of the OOM killer.
pub const DEFAULT_OVERCOMMIT: f64 = 10.0;

#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// `/proc/meminfo` could not be read.
    #[error("Cannot read /proc/meminfo")]
    Meminfo(#[source] std::io::Error),
    /// `/proc/meminfo` lacks a line admission needs.
    #[error("/proc/meminfo has no {0}")]
    NoMeminfoField(&'static str),
    /// The host is stalling on memory.
    #[error(
        "The host is under memory pressure: {stalled_pct:.1}% of the last 10 s stalled on \
         memory (PSI some avg10; new sandboxes are refused from {limit_pct}%). Free memory \
         (delete or stop sandboxes, end other programs) and try again"
    )]
    Pressure { stalled_pct: f64, limit_pct: f64 },
    /// The limits of all live sandboxes would pass the overcommit bound.
    #[error(
        "Too much memory promised: {requested} MiB requested, {limits} MiB already given as \
         limits to live sandboxes, at most {bound} MiB in all ({overcommit} × {total} MiB of \
         host RAM; BELLJAR_MEMORY_OVERCOMMIT sets the ratio)"
    )]
    Overcommitted {
        requested: u64,
        limits: u64,
        bound: u64,
        overcommit: f64,
        total: u64,
    },
    /// The new sandbox cannot start in the memory the host has free.
    #[error(
        "Not enough memory: a new sandbox needs {needed} MiB to start, sandboxes still \
         starting {starting} MiB more, and the host has {available} MiB available after a \
         {reserve} MiB reserve"
    )]
    Insufficient {
        needed: u64,
        starting: u64,
        available: u64,
        reserve: u64,
    },
}

impl AdmissionError {
    /// Whether this is a refusal (`insufficient_resources`) rather than a failure to read
    /// the host's state.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::Pressure { .. } | Self::Overcommitted { .. } | Self::Insufficient { .. }
        )
    }
}

/// The host's memory, read at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Host {
    /// `MemTotal`, MiB.
    pub total_mib: u64,
    /// `MemAvailable`, MiB: free memory plus what the kernel can reclaim without swapping.
    pub available_mib: u64,
    /// PSI memory "some avg10", percent; `None` when the kernel does not report it.
    pub stalled_pct: Option<f64>,
}

impl Host {
    /// `/proc/meminfo` and `/proc/pressure/memory` now.
    pub fn read() -> Result<Self, AdmissionError> {
        let meminfo = std::fs::read_to_string("/proc/meminfo").map_err(AdmissionError::Meminfo)?;
        let field = |name| meminfo_mib(&meminfo, name).ok_or(AdmissionError::NoMeminfoField(name));
        Ok(Self {
            total_mib: field("MemTotal")?,
            available_mib: field("MemAvailable")?,
            // Without PSI the file is missing, or reading it fails (EOPNOTSUPP with `psi=0`).
            stalled_pct: std::fs::read_to_string("/proc/pressure/memory")
                .ok()
                .and_then(|text| some_avg10(&text)),
        })
    }
}

/// What the sandboxes the daemon already has hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Live {
    /// The sum of their memory limits, MiB.
    pub limits_mib: u64,
    /// The start footprints ([`start_footprint`]) of those still starting, MiB.
    pub starting_mib: u64,
}

/// The daemon's settings for admission.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Host memory never given to sandboxes, MiB.
    pub reserve_mib: u64,
    /// The sum of limits may reach this many times the host's RAM.
    pub overcommit: f64,
}

/// What a sandbox with a memory limit of `limit_mib` is counted at while it starts.
pub fn start_footprint(limit_mib: u64) -> u64 {
    limit_mib.min(START_FOOTPRINT_MIB)
}

fn meminfo_mib(meminfo: &str, name: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| {
        l.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(':'))
    })?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// "some avg10" of a PSI file (`some avg10=1.23 avg60=… total=…`).
fn some_avg10(psi: &str) -> Option<f64> {
    let line = psi.lines().find(|l| l.starts_with("some "))?;
    let value = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix("avg10="))?;
    value.parse().ok().filter(|v: &f64| v.is_finite())
}

/// The overcommit bound, MiB: `overcommit × total`, rounded down.
#[expect(
    clippy::cast_possible_truncation,
    reason = "float to int saturates, which is what is wanted"
)]
fn bound_mib(total_mib: u64, overcommit: f64) -> u64 {
    // A float to u64 cast saturates; both inputs are finite and positive (the flag's parser).
    (total_mib as f64 * overcommit) as u64
}

/// Decides whether a sandbox with a memory limit of `requested` MiB may start now.
pub fn admit(requested: u64, live: Live, host: Host, policy: Policy) -> Result<(), AdmissionError> {
    if let Some(stalled_pct) = host.stalled_pct
        && stalled_pct >= PRESSURE_LIMIT_PCT
    {
        return Err(AdmissionError::Pressure {
            stalled_pct,
            limit_pct: PRESSURE_LIMIT_PCT,
        });
    }
    let bound = bound_mib(host.total_mib, policy.overcommit);
    if live.limits_mib.saturating_add(requested) > bound {
        return Err(AdmissionError::Overcommitted {
            requested,
            limits: live.limits_mib,
            bound,
            overcommit: policy.overcommit,
            total: host.total_mib,
        });
    }
    let needed = start_footprint(requested);
    let available = host.available_mib.saturating_sub(policy.reserve_mib);
    if live.starting_mib.saturating_add(needed) > available {
        return Err(AdmissionError::Insufficient {
            needed,
            starting: live.starting_mib,
            available,
            reserve: policy.reserve_mib,
        });
    }
    Ok(())
}

/// Host memory that new sandboxes may still claim, MiB: what is available after the reserve
/// and the starts under way; none under memory pressure.
pub fn free_for_sandboxes(live: Live, host: Host, policy: Policy) -> u64 {
    if host.stalled_pct.is_some_and(|p| p >= PRESSURE_LIMIT_PCT) {
        return 0;
    }
    host.available_mib
        .saturating_sub(policy.reserve_mib)
        .saturating_sub(live.starting_mib)
}

impl super::Sandboxes {
    /// Admits a sandbox with a memory limit of `requested` MiB next to the live ones and
    /// `pooled_mib` of limits held by warm-pool sandboxes, which are not in the store. The
    /// caller holds the admission lock until the new sandbox is recorded as starting.
    pub(super) fn admit(&self, requested: u64, pooled_mib: u64) -> Result<(), SandboxError> {
        let mut live = self.live_memory()?;
        live.limits_mib = live.limits_mib.saturating_add(pooled_mib);
        Ok(admit(
            requested,
            live,
            Host::read()?,
            self.admission_policy(),
        )?)
    }

    /// Host memory still free for sandboxes, MiB (`/v1/info`).
    pub fn free_memory_mib(&self) -> u64 {
        match (self.live_memory(), Host::read()) {
            (Ok(live), Ok(host)) => free_for_sandboxes(live, host, self.admission_policy()),
            _ => 0,
        }
    }

    fn admission_policy(&self) -> Policy {
        Policy {
            reserve_mib: self.inner.settings.memory_reserve_mib,
            overcommit: self.inner.settings.memory_overcommit,
        }
    }

    /// The limits of every sandbox that holds or may soon hold memory, and the start
    /// footprints of those still starting (`pending`: recorded, not yet answering).
    fn live_memory(&self) -> Result<Live, SandboxError> {
        let live = self.inner.store.sandboxes_with_status(&[
            SandboxStatus::Pending,
            SandboxStatus::Running,
            SandboxStatus::Paused,
            SandboxStatus::Stopping,
        ])?;
        Ok(live.iter().fold(Live::default(), |sum, s| Live {
            limits_mib: sum.limits_mib.saturating_add(s.memory_mib),
            starting_mib: match s.status {
                SandboxStatus::Pending => sum.starting_mib + start_footprint(s.memory_mib),
                _ => sum.starting_mib,
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1024;
    /// The build machine: 24 GiB, 22 GiB available, no stalls.
    const HOST: Host = Host {
        total_mib: 24 * GIB,
        available_mib: 22 * GIB,
        stalled_pct: Some(0.0),
    };
    const POLICY: Policy = Policy {
        reserve_mib: 512,
        overcommit: DEFAULT_OVERCOMMIT,
    };

    #[test]
    fn parses_meminfo_and_psi() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   20480000 kB\n\
                    MemTotalExtra: 5 kB\n";
        assert_eq!(meminfo_mib(text, "MemTotal"), Some(24000));
        assert_eq!(meminfo_mib(text, "MemAvailable"), Some(20000));
        assert_eq!(meminfo_mib("MemTotal: 1 kB\n", "MemAvailable"), None);
        let psi = "some avg10=23.45 avg60=1.00 avg300=0.00 total=12345\n\
                   full avg10=50.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(some_avg10(psi), Some(23.45));
        assert_eq!(some_avg10("full avg10=1.00\n"), None);
        assert_eq!(some_avg10("some avg10=nan avg60=0\n"), None);
        // This host's own files.
        let host = Host::read().unwrap();
        assert!(host.available_mib > 0 && host.total_mib >= host.available_mib);
    }

    /// The case: 22 idle default sandboxes (1 GiB limits) on a 24 GiB host, which the
    /// old rule (limits against `MemAvailable`) refused at the 23rd. Their use is already out
    /// of `MemAvailable`, so the 23rd, and the 200th, start.
    #[test]
    fn idle_sandboxes_are_admitted_by_use_not_by_limit() {
        for live in [22, 199] {
            let live = Live {
                limits_mib: live * GIB,
                starting_mib: 0,
            };
            let host = Host {
                available_mib: 22 * GIB - live.limits_mib / 40,
                ..HOST
            };
            assert!(admit(GIB, live, host, POLICY).is_ok(), "{live:?}");
        }
    }

    #[test]
    fn the_sum_of_limits_is_bounded_by_the_overcommit() {
        let policy = Policy {
            overcommit: 1.5,
            ..POLICY
        };
        // 36 GiB in all: four sandboxes of 9 GiB fit, a fifth does not.
        let live = Live {
            limits_mib: 27 * GIB,
            starting_mib: 0,
        };
        assert!(admit(9 * GIB, live, HOST, policy).is_ok());
        let live = Live {
            limits_mib: 36 * GIB,
            ..live
        };
        let err = admit(64, live, HOST, policy).unwrap_err();
        assert!(
            matches!(err, AdmissionError::Overcommitted { bound, .. } if bound == 36 * GIB),
            "{err:?}"
        );
        assert!(err.is_refusal());
        let message = err.to_string();
        assert!(
            message.contains("64 MiB requested, 36864 MiB already given"),
            "{message}"
        );
        assert!(
            message.contains("1.5 × 24576 MiB") && message.contains("BELLJAR_MEMORY_OVERCOMMIT"),
            "{message}"
        );
    }

    #[test]
    fn a_start_needs_its_footprint_after_the_reserve_and_other_starts() {
        let small = Host {
            available_mib: 512 + 1000,
            ..HOST
        };
        // A big limit needs only the start footprint; a small one its limit.
        assert!(admit(8 * GIB, Live::default(), small, POLICY).is_ok());
        assert_eq!(start_footprint(8 * GIB), START_FOOTPRINT_MIB);
        assert_eq!(start_footprint(64), 64);
        let starting = Live {
            limits_mib: 7 * GIB,
            starting_mib: 1000 - START_FOOTPRINT_MIB,
        };
        assert!(admit(GIB, starting, small, POLICY).is_ok());
        let starting = Live {
            starting_mib: starting.starting_mib + 1,
            ..starting
        };
        let err = admit(GIB, starting, small, POLICY).unwrap_err();
        assert!(
            matches!(err, AdmissionError::Insufficient { needed: 128, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains(
            "needs 128 MiB to start, sandboxes still starting 873 MiB more, and the host has \
             1000 MiB available after a 512 MiB reserve"
        ));
        // A host with less than the reserve available takes nothing.
        let full = Host {
            available_mib: 100,
            ..HOST
        };
        assert!(admit(64, Live::default(), full, POLICY).is_err());
        assert_eq!(free_for_sandboxes(Live::default(), full, POLICY), 0);
        assert_eq!(free_for_sandboxes(starting, small, POLICY), 1000 - 873);
    }

    #[test]
    fn memory_pressure_refuses_and_says_so() {
        let stalled = |pct| Host {
            stalled_pct: Some(pct),
            ..HOST
        };
        assert!(admit(GIB, Live::default(), stalled(19.9), POLICY).is_ok());
        let err = admit(GIB, Live::default(), stalled(23.0), POLICY).unwrap_err();
        assert!(err.is_refusal());
        assert_eq!(
            err.to_string(),
            "The host is under memory pressure: 23.0% of the last 10 s stalled on memory (PSI \
             some avg10; new sandboxes are refused from 20%). Free memory (delete or stop \
             sandboxes, end other programs) and try again"
        );
        assert_eq!(
            free_for_sandboxes(Live::default(), stalled(23.0), POLICY),
            0
        );
        // A kernel without PSI is judged by `MemAvailable` alone.
        let no_psi = Host {
            stalled_pct: None,
            ..HOST
        };
        assert!(admit(GIB, Live::default(), no_psi, POLICY).is_ok());
        assert!(!AdmissionError::NoMeminfoField("MemTotal").is_refusal());
    }
}
