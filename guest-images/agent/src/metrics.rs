//! Resource use of the sandbox as seen from inside: the cgroup's counters when the agent is in
//! a limited cgroup (namespace sandboxes), else /proc (a microVM is the whole machine), and
//! statvfs for the disk. The few /proc fields are parsed here rather than with `procfs`: the
//! agent is in every sandbox, so it stays small and takes on no dependency it can do without.

use std::path::Path;

use belljar_agent_proto::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// /proc could not be read.
    #[error("Cannot read {0}")]
    Proc(String),
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "float to int saturates, which is what is wanted"
)]
fn secs_to_ms(secs: f64) -> u64 {
    (secs * 1000.0) as u64
}

/// Collects the metrics; `started` is when the agent started (for the uptime of a sandbox
/// whose /proc/uptime is the host's).
pub fn collect(started: std::time::Instant, own_uptime: bool) -> Result<Metrics, MetricsError> {
    let cpu_count = std::thread::available_parallelism()
        .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
        .unwrap_or(1);
    let (mut memory_total, mut memory_used) = meminfo()?;
    let mut cpu_usage_usec = proc_cpu_usec()?;
    if let Some(cg) = cgroup() {
        if let Some(cpu) = cg.cpu_usec {
            cpu_usage_usec = cpu;
        }
        if let Some(used) = cg.memory_used {
            memory_used = used;
        }
        if let Some(limit) = cg.memory_limit {
            memory_total = memory_total.min(limit);
        }
    }
    let (disk_total, disk_used) = disk();
    let process_count = std::fs::read_dir("/proc")
        .map(|d| {
            let n = d
                .filter_map(Result::ok)
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                })
                .count();
            u32::try_from(n).unwrap_or(u32::MAX)
        })
        .unwrap_or(0);
    let own_ms = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let uptime_ms = if own_uptime {
        own_ms()
    } else {
        std::fs::read_to_string("/proc/uptime")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
            .map(secs_to_ms)
            .unwrap_or_else(own_ms)
    };
    Ok(Metrics {
        cpu_usage_usec,
        cpu_count,
        memory_used_bytes: memory_used,
        memory_total_bytes: memory_total,
        disk_used_bytes: disk_used,
        disk_total_bytes: disk_total,
        process_count,
        uptime_ms,
    })
}

fn meminfo() -> Result<(u64, u64), MetricsError> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|_| MetricsError::Proc("/proc/meminfo".into()))?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kb| kb * 1024)
    };
    let total = field("MemTotal:").unwrap_or(0);
    let available = field("MemAvailable:").unwrap_or(total);
    Ok((total, total.saturating_sub(available)))
}

/// Busy CPU time of the whole machine from the first line of /proc/stat.
fn proc_cpu_usec() -> Result<u64, MetricsError> {
    let text = std::fs::read_to_string("/proc/stat")
        .map_err(|_| MetricsError::Proc("/proc/stat".into()))?;
    let line = text.lines().next().unwrap_or_default();
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: all but idle and iowait are busy.
    let busy: u64 = ticks
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4 && *i < 8)
        .map(|(_, v)| v)
        .sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&hz| hz > 0)
        .unwrap_or(100) as u64;
    Ok(busy * 1_000_000 / hz)
}

#[derive(Debug, Default)]
struct Cgroup {
    cpu_usec: Option<u64>,
    memory_used: Option<u64>,
    memory_limit: Option<u64>,
}

fn read_u64(path: impl AsRef<Path>) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The counters of the cgroup the agent is in, v2 or v1, when they are visible.
fn cgroup() -> Option<Cgroup> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let root = Path::new("/sys/fs/cgroup");
    let mut cg = Cgroup::default();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if controllers.is_empty() {
            let dir = root.join(rel);
            if let Ok(stat) = std::fs::read_to_string(dir.join("cpu.stat")) {
                cg.cpu_usec = stat
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec ")?.parse().ok());
            }
            cg.memory_used = cg.memory_used.or(read_u64(dir.join("memory.current")));
            cg.memory_limit = cg.memory_limit.or(read_u64(dir.join("memory.max")));
        } else {
            for c in controllers.split(',') {
                match c {
                    "cpuacct" => {
                        let dir = root.join("cpuacct").join(rel);
                        let dir = if dir.exists() {
                            dir
                        } else {
                            root.join("cpu,cpuacct").join(rel)
                        };
                        if let Some(ns) = read_u64(dir.join("cpuacct.usage")) {
                            cg.cpu_usec = Some(ns / 1000);
                        }
                    }
                    "memory" => {
                        let dir = root.join("memory").join(rel);
                        cg.memory_used = read_u64(dir.join("memory.usage_in_bytes"));
                        // v1 reports "no limit" as a huge number; min() with MemTotal handles it.
                        cg.memory_limit = read_u64(dir.join("memory.limit_in_bytes"));
                    }
                    _ => {}
                }
            }
        }
    }
    // The root cgroup's counters are the machine's; /proc is as good and always there.
    if own.lines().all(|l| l.ends_with(":/")) {
        return None;
    }
    Some(cg)
}

/// Total and used bytes of the filesystem holding /workspace (or / when there is none).
fn disk() -> (u64, u64) {
    let path = if Path::new(belljar_agent_proto::DEFAULT_CWD).is_dir() {
        belljar_agent_proto::DEFAULT_CWD
    } else {
        "/"
    };
    match nix::sys::statvfs::statvfs(path) {
        Ok(s) => {
            let frag = s.fragment_size();
            let total = s.blocks() * frag;
            let free = s.blocks_free() * frag;
            (total, total.saturating_sub(free))
        }
        Err(_) => (0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_plausible_numbers() {
        let m = collect(std::time::Instant::now(), true).unwrap();
        assert!(m.cpu_count >= 1);
        assert!(m.memory_total_bytes > 0 && m.memory_used_bytes <= m.memory_total_bytes);
        assert!(m.disk_total_bytes > 0 && m.disk_used_bytes <= m.disk_total_bytes);
        assert!(m.process_count >= 1);
        assert!(m.cpu_usage_usec > 0);
    }
}
