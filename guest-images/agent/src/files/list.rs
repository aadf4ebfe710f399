//! Directory listings in pages. A directory may hold hundreds of thousands of entries, and the
//! agent is PID 1: if it built the whole listing in memory, a few concurrent listings could
//! make it the OOM killer's choice. So a page is found in one pass over the directory that
//! keeps only the `limit` smallest names after the cursor (memory bounded by the page, not
//! the directory), and only that page is stat'ed and serialised. The cursor is the page's
//! last name, so pages stay in name order and a file created or removed between two pages
//! neither repeats nor hides another one.

use std::collections::BinaryHeap;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use belljar_agent_proto::{FileListPage, LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT, LIST_PAGE_BYTES};

use super::{blocking, check_path, entry_from, err};
use crate::error::AgentError;

/// The cursor text of a name: its bytes in hex, so any name (not only UTF-8) survives a URL.
fn encode_cursor(name: &[u8]) -> String {
    name.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_cursor(cursor: &str) -> Result<Vec<u8>, AgentError> {
    let bad = || AgentError::BadRequest(format!("bad cursor {cursor:?}"));
    if !cursor.len().is_multiple_of(2) || cursor.is_empty() || cursor.len() > 2 * 4096 {
        return Err(bad());
    }
    (0..cursor.len())
        .step_by(2)
        .map(|i| {
            cursor
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

/// Parses the `limit` query parameter: [`LIST_DEFAULT_LIMIT`] when absent, 1..=[`LIST_MAX_LIMIT`].
pub fn parse_limit(limit: Option<&str>) -> Result<usize, AgentError> {
    let Some(text) = limit else {
        return Ok(LIST_DEFAULT_LIMIT);
    };
    text.parse::<usize>()
        .ok()
        .filter(|l| (1..=LIST_MAX_LIMIT).contains(l))
        .ok_or_else(|| {
            AgentError::BadRequest(format!("limit must be 1..={LIST_MAX_LIMIT}, not {text:?}"))
        })
}

/// The page of at most `limit` entries of `path` whose names sort after `cursor`.
pub async fn list(
    path: &str,
    limit: usize,
    cursor: Option<&str>,
) -> Result<FileListPage, AgentError> {
    let p = check_path(path)?;
    let after = cursor.map(decode_cursor).transpose()?;
    blocking(move || page(p, limit, after)).await
}

fn page(p: PathBuf, limit: usize, after: Option<Vec<u8>>) -> Result<FileListPage, AgentError> {
    let meta = std::fs::metadata(&p).map_err(err(&p))?;
    if !meta.is_dir() {
        return Err(AgentError::NotADirectory(p.display().to_string()));
    }
    // A max-heap of the smallest names seen so far, never more than `limit` of them: once it
    // is full, a smaller name replaces the largest.
    let mut smallest: BinaryHeap<Vec<u8>> = BinaryHeap::with_capacity(limit);
    let mut more = false;
    for dirent in std::fs::read_dir(&p).map_err(err(&p))? {
        let name = dirent.map_err(err(&p))?.file_name().into_vec();
        if after.as_ref().is_some_and(|a| name <= *a) {
            continue;
        }
        if smallest.len() == limit {
            more = true;
            // Most names of a big directory fall behind a full page: one comparison each.
            if smallest.peek().is_some_and(|largest| name >= *largest) {
                continue;
            }
            smallest.pop();
        }
        smallest.push(name);
    }
    let names = smallest.into_sorted_vec();
    let mut entries = Vec::with_capacity(names.len());
    let mut bytes = 0;
    let mut last = None;
    for name in &names {
        let child = p.join(std::ffi::OsStr::from_bytes(name));
        // A file removed while listing is simply not listed.
        if let Ok(meta) = std::fs::symlink_metadata(&child) {
            let entry = entry_from(&child, &meta);
            // Escaping can make a name up to six times longer in JSON.
            bytes += 128
                + 6 * (entry.name.len() + entry.path.len())
                + entry.link_target.as_ref().map_or(0, |t| 6 * t.len());
            if bytes > LIST_PAGE_BYTES && !entries.is_empty() {
                more = true;
                break;
            }
            entries.push(entry);
        }
        last = Some(name);
    }
    Ok(FileListPage {
        entries,
        next_cursor: more.then(|| last.map(|n| encode_cursor(n))).flatten(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_any_name_and_refuse_garbage() {
        let name = b"\xff a&b/\x00".to_vec();
        assert_eq!(decode_cursor(&encode_cursor(&name)).unwrap(), name);
        for bad in ["", "a", "zz", "0g"] {
            assert!(decode_cursor(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_default_and_are_bounded() {
        assert_eq!(parse_limit(None).unwrap(), LIST_DEFAULT_LIMIT);
        assert_eq!(parse_limit(Some("7")).unwrap(), 7);
        for bad in ["0", "-1", "x", "5001"] {
            assert!(parse_limit(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn pages_walk_a_directory_in_name_order_without_repeats() {
        let dir = tempfile::tempdir().unwrap();
        for i in (0..25).rev() {
            std::fs::write(dir.path().join(format!("f{i:02}")), b"").unwrap();
        }
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = page(dir.path().to_owned(), 10, after).unwrap();
            assert!(page.entries.len() <= 10);
            seen.extend(page.entries.into_iter().map(|e| e.name));
            match page.next_cursor {
                Some(c) => after = Some(decode_cursor(&c).unwrap()),
                None => break,
            }
        }
        let want: Vec<String> = (0..25).map(|i| format!("f{i:02}")).collect();
        assert_eq!(seen, want);
    }
}
