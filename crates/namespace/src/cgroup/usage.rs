//! What a sandbox uses, from the kernel's counters in its groups: either version's files,
//! in the units the API gives, and nothing where no group measures a figure.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Groups, keyed, read_u64};

/// Resource use of a sandbox, from its cgroups; `None` when no group measures it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub memory_bytes: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    /// The memory cgroup's limit; `None` when the group has none (`max`, or v1's "unlimited").
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    /// CPU time used, microseconds.
    pub cpu_usec: Option<u64>,
    pub pids: Option<u64>,
    /// Processes killed by the OOM killer inside the sandbox's memory cgroup.
    pub oom_kills: Option<u64>,
    /// Forks refused because the sandbox was at its PID limit (`pids.events` `max`).
    #[serde(default)]
    pub pids_denied: Option<u64>,
}

/// v1's `memory.limit_in_bytes` of a group without a limit is the page counter's maximum
/// (`0x7ffffffffffff000` on 4 KiB pages), not a word; anything this large is no limit.
const V1_UNLIMITED: u64 = 1 << 62;

impl Groups {
    /// What the sandbox uses now.
    pub fn usage(&self) -> Usage {
        let v2 = self.v2.as_deref();
        let v1 = |c: &str| self.v1.get(c).map(PathBuf::as_path);
        let pick = |v2file: &str, c: &str, v1file: &str| {
            v2.and_then(|d| read_u64(&d.join(v2file)))
                .or_else(|| v1(c).and_then(|d| read_u64(&d.join(v1file))))
        };
        Usage {
            memory_bytes: pick("memory.current", "memory", "memory.usage_in_bytes"),
            memory_peak_bytes: pick("memory.peak", "memory", "memory.max_usage_in_bytes"),
            memory_limit_bytes: pick("memory.max", "memory", "memory.limit_in_bytes")
                .filter(|&bytes| bytes < V1_UNLIMITED),
            cpu_usec: v2
                .and_then(|d| keyed(&d.join("cpu.stat"), "usage_usec"))
                .or_else(|| v1("cpuacct").and_then(|d| read_u64(&d.join("cpuacct.usage"))))
                .map(|v| if v2.is_some() { v } else { v / 1000 }),
            pids: pick("pids.current", "pids", "pids.current"),
            oom_kills: v2
                .and_then(|d| keyed(&d.join("memory.events"), "oom_kill"))
                .or_else(|| {
                    v1("memory").and_then(|d| keyed(&d.join("memory.oom_control"), "oom_kill"))
                }),
            pids_denied: v2
                .and_then(|d| keyed(&d.join("pids.events"), "max"))
                .or_else(|| v1("pids").and_then(|d| keyed(&d.join("pids.events"), "max"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs;
    use std::path::Path;

    use super::*;

    /// The kernel's files as plain files: which file gives which figure, in which unit, and
    /// that "no limit" in either version's words is `None`, never a number.
    #[test]
    fn usage_is_read_from_each_versions_own_files() {
        let tmp = tempfile::tempdir().unwrap();
        let put = |dir: &Path, files: &[(&str, &str)]| {
            fs::create_dir_all(dir).unwrap();
            for (name, text) in files {
                fs::write(dir.join(name), text).unwrap();
            }
        };
        let v2 = tmp.path().join("v2");
        put(
            &v2,
            &[
                ("memory.current", "67108864\n"),
                ("memory.peak", "70000000\n"),
                ("memory.max", "max\n"),
                (
                    "cpu.stat",
                    "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
                ),
                ("pids.current", "3\n"),
                ("memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n"),
                ("pids.events", "max 2\n"),
            ],
        );
        let usage = Groups {
            v2: Some(v2.clone()),
            v1: BTreeMap::new(),
        }
        .usage();
        assert_eq!(
            usage,
            Usage {
                memory_bytes: Some(64 << 20),
                memory_peak_bytes: Some(70_000_000),
                memory_limit_bytes: None,
                cpu_usec: Some(1500),
                pids: Some(3),
                oom_kills: Some(1),
                pids_denied: Some(2),
            }
        );
        fs::write(v2.join("memory.max"), "268435456\n").unwrap();
        let limited = Groups {
            v2: Some(v2),
            v1: BTreeMap::new(),
        };
        assert_eq!(limited.usage().memory_limit_bytes, Some(256 << 20));

        let v1 = |c: &str| tmp.path().join("v1").join(c);
        put(
            &v1("memory"),
            &[
                ("memory.usage_in_bytes", "1048576\n"),
                ("memory.max_usage_in_bytes", "2097152\n"),
                ("memory.limit_in_bytes", "9223372036854771712\n"),
                (
                    "memory.oom_control",
                    "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
                ),
            ],
        );
        put(&v1("cpuacct"), &[("cpuacct.usage", "2500000\n")]);
        put(
            &v1("pids"),
            &[("pids.current", "5\n"), ("pids.events", "max 0\n")],
        );
        let groups = Groups {
            v2: None,
            v1: ["memory", "cpuacct", "pids"]
                .map(|c| (c.to_owned(), v1(c)))
                .into(),
        };
        assert_eq!(
            groups.usage(),
            Usage {
                memory_bytes: Some(1 << 20),
                memory_peak_bytes: Some(2 << 20),
                memory_limit_bytes: None,
                // cpuacct.usage counts nanoseconds.
                cpu_usec: Some(2500),
                pids: Some(5),
                oom_kills: Some(0),
                pids_denied: Some(0),
            }
        );
        // No group measures anything: nothing is made up.
        assert_eq!(Groups::default().usage(), Usage::default());
    }
}
