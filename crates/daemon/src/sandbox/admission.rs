//! Admission control: a sandbox is refused with `insufficient_resources` when the memory of
//! all live sandboxes plus the new one would exceed what the host has available, so that
//! sandboxes never push the host into its OOM killer.

#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// `/proc/meminfo` could not be read.
    #[error("Cannot read /proc/meminfo")]
    Meminfo(#[source] std::io::Error),
    /// `/proc/meminfo` has no `MemAvailable` line.
    #[error("/proc/meminfo has no MemAvailable")]
    NoMemAvailable,
    /// The sandbox does not fit.
    #[error(
        "Not enough memory: {requested} MiB requested, {committed} MiB already given to running \
         sandboxes, {available} MiB available on the host after a {reserve} MiB reserve"
    )]
    Insufficient {
        requested: u64,
        committed: u64,
        available: u64,
        reserve: u64,
    },
}

/// `MemAvailable` from `/proc/meminfo`, in MiB.
pub fn mem_available_mib() -> Result<u64, AdmissionError> {
    let text = std::fs::read_to_string("/proc/meminfo").map_err(AdmissionError::Meminfo)?;
    parse_mem_available_mib(&text).ok_or(AdmissionError::NoMemAvailable)
}

fn parse_mem_available_mib(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// Decides whether a sandbox of `requested` MiB fits next to `committed` MiB of live ones.
pub fn admit(
    requested: u64,
    committed: u64,
    available: u64,
    reserve: u64,
) -> Result<(), AdmissionError> {
    if committed.saturating_add(requested) > available.saturating_sub(reserve) {
        return Err(AdmissionError::Insufficient {
            requested,
            committed,
            available,
            reserve,
        });
    }
    Ok(())
}

/// Host memory that new sandboxes may still claim, MiB.
pub fn free_for_sandboxes(committed: u64, available: u64, reserve: u64) -> u64 {
    available.saturating_sub(reserve).saturating_sub(committed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20480000 kB\n";
        assert_eq!(parse_mem_available_mib(text), Some(20000));
        assert_eq!(parse_mem_available_mib("MemTotal: 1 kB\n"), None);
        assert!(mem_available_mib().unwrap() > 0);
    }

    #[test]
    fn refuses_what_does_not_fit() {
        assert!(admit(1024, 0, 4096, 512).is_ok());
        assert!(admit(1024, 2560, 4096, 512).is_ok());
        let err = admit(1024, 2561, 4096, 512).unwrap_err();
        assert!(matches!(err, AdmissionError::Insufficient { .. }));
        assert!(err.to_string().contains("1024 MiB requested"));
        assert!(admit(1, 0, 100, 512).is_err());
        assert_eq!(free_for_sandboxes(1000, 4096, 512), 2584);
        assert_eq!(free_for_sandboxes(9000, 4096, 512), 0);
    }
}
