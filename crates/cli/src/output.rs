//! How read commands print for people: aligned tables and `key: value` blocks. `--json`
//! bypasses all of this and prints the API's own JSON.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use belljar_api::{Command, Image, Info, LimitsReport, Sandbox, SandboxUsage};

use crate::duration::format_ms;
use crate::snapshots::size;

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `3m ago`-style age of a Unix-ms time.
pub fn ago(ms: i64, now: i64) -> String {
    let secs = (now - ms).max(0) / 1000;
    if secs == 0 {
        return "just now".to_string();
    }
    format!("{} ago", format_ms(secs * 1000))
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let n = cells.len();
        let mut l = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i + 1 == n {
                l.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                l.push_str(cell);
                l.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// The `belljar ls` table.
pub fn sandboxes(list: &[Sandbox], now: i64) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.name.clone().unwrap_or_default(),
                s.status.as_str().to_string(),
                s.image.clone(),
                backend(s),
                ago(s.created_at, now),
                expires(s, now),
                tags(s),
            ]
        })
        .collect();
    table(
        &[
            "ID", "NAME", "STATUS", "IMAGE", "BACKEND", "CREATED", "EXPIRES", "TAGS",
        ],
        &rows,
    )
}

fn backend(s: &Sandbox) -> String {
    s.backend.to_string()
}

fn expires(s: &Sandbox, now: i64) -> String {
    match s.expires_at {
        Some(at) if !s.status.is_final() => format!("in {}", format_ms((at - now).max(0))),
        _ => "-".to_string(),
    }
}

fn tags(s: &Sandbox) -> String {
    s.tags
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The `belljar info` block.
pub fn sandbox(s: &Sandbox, now: i64) -> String {
    let mut out = String::new();
    let mut kv = |k: &str, v: String| {
        let _ = writeln!(out, "{:<11} {v}", format!("{k}:"));
    };
    kv("id", s.id.clone());
    if let Some(name) = &s.name {
        kv("name", name.clone());
    }
    let mut status = s.status.as_str().to_string();
    if let Some(reason) = &s.status_reason {
        status.push_str(&format!(" ({reason})"));
    }
    kv("status", status);
    kv("image", s.image.clone());
    if let Some(t) = &s.template {
        kv("template", t.clone());
    }
    kv("backend", format!("{} ({})", backend(s), s.backend_reason));
    kv(
        "resources",
        format!(
            "{} vCPUs, {} MiB memory, {} MiB disk",
            s.vcpus, s.memory_mib, s.disk_mib
        ),
    );
    kv("limits", limits(&s.limits));
    kv("created", ago(s.created_at, now));
    kv("timeout", format_ms(s.timeout_ms));
    kv("expires", expires(s, now));
    if !s.tags.is_empty() {
        kv("tags", tags(s));
    }
    if !s.env.is_empty() {
        kv("env", s.env.keys().cloned().collect::<Vec<_>>().join(", "));
    }
    for v in s.volumes.as_deref().unwrap_or_default() {
        let ro = if v.read_only() { " (read-only)" } else { "" };
        kv("volume", format!("{} -> {}{ro}", v.source, v.path));
    }
    out
}

/// Each limit of `info`'s `limits:` line, enforced or not and why; the disk too, which a
/// rootless sandbox never has (the API said so and the line left it out).
/// The `belljar usage` block; a figure the host cannot measure on the sandbox's backend is
/// `unknown`, not 0.
pub fn usage(u: &SandboxUsage) -> String {
    let mut out = String::new();
    let mut kv = |k: &str, v: String| {
        let _ = writeln!(out, "{:<13} {v}", format!("{k}:"));
    };
    let known = |v: Option<u64>| v.map_or_else(|| "unknown".to_owned(), |n| n.to_string());
    let mut memory = u.memory_bytes.map_or_else(|| "unknown".to_owned(), size);
    match u.memory_limit_bytes {
        Some(limit) => memory.push_str(&format!(" of {}", size(limit))),
        None => memory.push_str(" (no limit)"),
    }
    if let Some(peak) = u.memory_peak_bytes {
        memory.push_str(&format!(", peak {}", size(peak)));
    }
    kv("memory", memory);
    kv(
        "cpu time",
        u.cpu_usec.map_or_else(
            || "unknown".to_owned(),
            |us| format!("{:.2}s", us as f64 / 1e6),
        ),
    );
    kv("processes", known(u.pids));
    kv("oom kills", known(u.oom_kills));
    kv("forks denied", known(u.pids_denied));
    out
}

fn limits(l: &LimitsReport) -> String {
    [
        ("memory", &l.memory),
        ("cpu", &l.cpu),
        ("pids", &l.pids),
        ("disk", &l.disk),
    ]
    .iter()
    .map(|(n, l)| {
        format!(
            "{n} {}{}",
            if l.enforced {
                "enforced"
            } else {
                "not enforced"
            },
            if l.detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", l.detail)
            }
        )
    })
    .collect::<Vec<_>>()
    .join("; ")
}

/// The `belljar images` table: SHARED is what of its size other images hold too, USED BY
/// the sandboxes, snapshots and templates that stand on it.
pub fn images(list: &[Image], now: i64) -> String {
    let mib = |b: Option<u64>| {
        b.map_or_else(
            || "-".into(),
            |b| format!("{:.0} MiB", b as f64 / 1048576.0),
        )
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|i| {
            let users = i.used_by.as_ref().map_or(0, |u| {
                u.sandboxes.len() + u.snapshots.len() + u.templates.len()
            });
            vec![
                i.name.clone(),
                serde_json::to_value(i.status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                mib(i.size_bytes),
                mib(i.shared_bytes),
                i.last_used_at.map_or_else(|| "-".into(), |t| ago(t, now)),
                match &i.used_by {
                    Some(u) if users > 0 => u
                        .sandboxes
                        .iter()
                        .chain(&u.snapshots)
                        .chain(&u.templates)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(","),
                    _ => "-".into(),
                },
                i.digest
                    .as_deref()
                    .map(|d| d.chars().take(19).collect())
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "STATUS",
            "SIZE",
            "SHARED",
            "LAST USED",
            "USED BY",
            "DIGEST",
        ],
        &rows,
    )
}

/// The `belljar volumes ls` table.
pub fn volumes(list: &[belljar_api::Volume], now: i64) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|v| {
            vec![
                v.name.clone(),
                v.size_mib
                    .map(|m| format!("{m} MiB"))
                    .unwrap_or_else(|| "-".into()),
                ago(v.created_at, now),
                if v.used_by.is_empty() {
                    "-".into()
                } else {
                    v.used_by.join(",")
                },
            ]
        })
        .collect();
    table(&["NAME", "SIZE", "CREATED", "USED BY"], &rows)
}

/// The `belljar volumes inspect` block.
pub fn volume(v: &belljar_api::Volume, now: i64) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "name:      {}", v.name);
    let size = v
        .size_mib
        .map_or_else(|| "no cap".into(), |m| format!("{m} MiB"));
    let _ = writeln!(out, "size:      {size}");
    let _ = writeln!(out, "created:   {}", ago(v.created_at, now));
    let used = if v.used_by.is_empty() {
        "no sandbox".into()
    } else {
        v.used_by.join(", ")
    };
    let _ = writeln!(out, "used by:   {used}");
    out
}

/// The `belljar daemon status` block.
pub fn daemon(info: &Info, pid: Option<i32>, socket: &str, port: Option<u16>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "running:   yes");
    if let Some(pid) = pid {
        let _ = writeln!(out, "pid:       {pid}");
    }
    let _ = writeln!(out, "version:   {}", info.version);
    let _ = writeln!(out, "socket:    {socket}");
    if let Some(port) = port {
        let _ = writeln!(out, "http:      http://127.0.0.1:{port}");
    }
    let _ = writeln!(
        out,
        "backend:   {} ({})",
        serde_json::to_value(info.default_backend)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        info.default_backend_reason
    );
    let _ = writeln!(
        out,
        "memory:    {} MiB free for sandboxes",
        info.free_memory_mib
    );
    if info.pool.is_empty() {
        let _ = writeln!(out, "pool:      off");
    }
    for p in &info.pool {
        let _ = writeln!(
            out,
            "pool:      {}: {} of {} ready, {} starting",
            p.image, p.ready, p.configured, p.starting
        );
    }
    out
}

/// One line per command of a sandbox.
pub fn commands(list: &[Command], now: i64) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|c| {
            vec![
                c.id.clone(),
                serde_json::to_value(c.status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                c.exit_code.map(|e| e.to_string()).unwrap_or_default(),
                ago(c.started_at, now),
                c.argv.join(" "),
            ]
        })
        .collect();
    table(&["ID", "STATUS", "EXIT", "STARTED", "COMMAND"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use belljar_api::LimitState;

    #[test]
    fn table_aligns_columns() {
        let t = table(
            &["ID", "STATUS"],
            &[
                vec!["sbx_1".into(), "running".into()],
                vec!["sbx_long".into(), "stopped".into()],
            ],
        );
        assert_eq!(
            t,
            "ID        STATUS\nsbx_1     running\nsbx_long  stopped\n"
        );
    }

    #[test]
    fn limits_line_names_every_limit_with_its_reason() {
        let state = |enforced: bool, detail: &str| LimitState {
            enforced,
            detail: detail.into(),
        };
        let line = limits(&LimitsReport {
            memory: state(true, "cgroup v2"),
            cpu: state(false, "cgroup v1 groups are root's"),
            pids: state(true, ""),
            disk: state(false, "rootless"),
        });
        assert_eq!(
            line,
            "memory enforced (cgroup v2); cpu not enforced (cgroup v1 groups are root's); \
             pids enforced; disk not enforced (rootless)"
        );
    }

    #[test]
    fn usage_says_unknown_rather_than_zero() {
        let namespace = SandboxUsage {
            memory_bytes: Some(64 << 20),
            memory_peak_bytes: Some(70 << 20),
            memory_limit_bytes: Some(1 << 30),
            cpu_usec: Some(1_520_000),
            pids: Some(3),
            oom_kills: Some(0),
            pids_denied: Some(0),
            measured_at: 0,
        };
        assert_eq!(
            usage(&namespace),
            "memory:       64.0 MiB of 1.0 GiB, peak 70.0 MiB\n\
             cpu time:     1.52s\n\
             processes:    3\n\
             oom kills:    0\n\
             forks denied: 0\n"
        );
        let microvm = SandboxUsage {
            memory_limit_bytes: None,
            memory_peak_bytes: None,
            pids: None,
            oom_kills: None,
            pids_denied: None,
            ..namespace
        };
        let text = usage(&microvm);
        assert!(
            text.starts_with("memory:       64.0 MiB (no limit)\n"),
            "{text}"
        );
        assert!(text.contains("processes:    unknown\n"), "{text}");
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(ago(1_000, 61_500), "1m00s ago");
        assert_eq!(ago(5_000, 1_000), "just now");
    }
}
