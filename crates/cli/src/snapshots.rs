//! `belljar snapshot`, `belljar snapshots ls|rm|diff` and `create --from`: what the CLI sends
//! for snapshots and how it prints them for people.

use belljar_api::{CreateSnapshot, ListSnapshotsQuery, Snapshot, SnapshotStatus};
use belljar_client::{Client, ClientError};

use crate::duration::{DurationError, format_ms, parse_ms};
use crate::output::{ago, table};

/// `--expiration`: a duration (`14d`, `12h`, a bare number is seconds), or `none` / `0` for
/// never.
pub fn expiration_ms(text: &str) -> Result<i64, DurationError> {
    match text.trim() {
        "none" | "never" | "0" => Ok(0),
        t => parse_ms(t),
    }
}

/// The body of `belljar snapshot`.
pub fn request(
    keep_running: bool,
    expiration: Option<&str>,
) -> Result<CreateSnapshot, DurationError> {
    Ok(CreateSnapshot {
        keep_running: keep_running.then_some(true),
        expiration_ms: expiration.map(expiration_ms).transpose()?,
        path: None,
    })
}

/// Every snapshot (of one sandbox, or all), newest first, page by page.
pub async fn all(client: &Client, sandbox: Option<String>) -> Result<Vec<Snapshot>, ClientError> {
    let mut q = ListSnapshotsQuery {
        sandbox_id: sandbox,
        limit: Some(200),
        ..Default::default()
    };
    let mut all = Vec::new();
    loop {
        let page = client.list_snapshots(&q).await?;
        all.extend(page.snapshots);
        match page.next_cursor {
            Some(c) => q.cursor = Some(c),
            None => return Ok(all),
        }
    }
}

/// Bytes the way people read them: `512 B`, `1.5 KiB`, `20.0 MiB`.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// The table of `belljar snapshots`.
pub fn list(snapshots: &[Snapshot], now: i64) -> String {
    let rows: Vec<Vec<String>> = snapshots
        .iter()
        .map(|s| {
            let status: &'static str = s.status.into();
            vec![
                s.id.clone(),
                status.to_string(),
                s.source_sandbox_id.clone(),
                s.parent.clone().unwrap_or_else(|| "-".into()),
                size(s.size_bytes),
                ago(s.created_at, now),
                expires(s, now),
            ]
        })
        .collect();
    table(
        &[
            "ID", "STATUS", "SANDBOX", "PARENT", "SIZE", "CREATED", "EXPIRES",
        ],
        &rows,
    )
}

fn expires(s: &Snapshot, now: i64) -> String {
    match (s.status, s.expires_at) {
        (SnapshotStatus::Created, Some(at)) => format!("in {}", format_ms((at - now).max(0))),
        (SnapshotStatus::Created, None) => "never".into(),
        _ => "-".into(),
    }
}

/// What `belljar snapshot` prints without `--json`.
pub fn taken(s: &Snapshot) -> String {
    match s.frozen_ms {
        Some(ms) => format!("{} (the sandbox was frozen for {ms} ms)", s.id),
        None => s.id.clone(),
    }
}

/// A diff for people: one line per path (`A`dded, `M`odified, `D`eleted, with kind, mode and
/// size), then the unified diffs of the text files that have one.
pub fn diff(d: &belljar_api::SnapshotDiff) -> String {
    use belljar_api::{ChangeKind, DiffEntry, EntryKind};
    use std::fmt::Write;
    let side = |e: &DiffEntry| {
        let kind = match e.kind {
            EntryKind::File => "file",
            EntryKind::Dir => "dir",
            EntryKind::Symlink => "symlink",
            EntryKind::Other => "other",
        };
        let mut s = format!("{kind} {:o} {}:{}", e.mode, e.uid, e.gid);
        if e.kind == EntryKind::File {
            let _ = write!(s, " {} B", e.size_bytes);
        }
        if let Some(t) = &e.target {
            let _ = write!(s, " -> {t}");
        }
        s
    };
    let mut out = format!("{} -> {}\n", d.from, d.to);
    for c in &d.changes {
        let (mark, what) = match (c.change, &c.old, &c.new) {
            (ChangeKind::Added, _, Some(n)) => ("A", side(n)),
            (ChangeKind::Deleted, Some(o), _) => ("D", side(o)),
            (_, Some(o), Some(n)) if side(o) == side(n) => ("M", side(n)),
            (_, Some(o), Some(n)) => ("M", format!("{} => {}", side(o), side(n))),
            _ => ("?", String::new()),
        };
        let _ = writeln!(out, "{mark} {}  ({what})", c.path);
    }
    if d.truncated {
        out.push_str("(more changes not listed)\n");
    }
    for c in d.changes.iter().filter(|c| c.unified_diff.is_some()) {
        out.push('\n');
        out.push_str(c.unified_diff.as_deref().unwrap_or_default());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expirations_read_like_the_apis_durations_and_none_is_never() {
        assert_eq!(expiration_ms("14d"), Ok(14 * 86_400_000));
        assert_eq!(expiration_ms("none"), Ok(0));
        assert_eq!(expiration_ms("0"), Ok(0));
        assert!(expiration_ms("soon").is_err());
        let req = request(true, Some("1h")).unwrap();
        assert_eq!(req.keep_running, Some(true));
        assert_eq!(req.expiration_ms, Some(3_600_000));
        assert_eq!(request(false, None).unwrap(), CreateSnapshot::default());
    }

    #[test]
    fn tables_show_sizes_and_expiry() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(20 << 20), "20.0 MiB");
        let s = Snapshot {
            id: "snap_a".into(),
            status: SnapshotStatus::Created,
            status_reason: None,
            source_sandbox_id: "sbx_a".into(),
            parent: None,
            image: "base".into(),
            image_id: None,
            size_bytes: 2048,
            depth: 1,
            created_at: 0,
            expires_at: Some(3_600_000),
            frozen_ms: Some(12),
            path: None,
        };
        let out = list(std::slice::from_ref(&s), 0);
        assert!(out.starts_with("ID "), "{out}");
        assert!(out.contains("snap_a  created  sbx_a"), "{out}");
        assert!(out.contains("2.0 KiB"), "{out}");
        assert!(out.contains("in 1h00m"), "{out}");
        assert_eq!(taken(&s), "snap_a (the sandbox was frozen for 12 ms)");
    }
}
