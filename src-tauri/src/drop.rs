//! Files dropped onto a window from the desktop.
//!
//! A webview does not hand the page the contents of natively dropped files, so the app walks
//! what was dropped, remembers those paths, and lets the page read exactly those files (and
//! nothing else) to upload them through the daemon's API like any browser upload.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum DropError {
    /// The page asked for a file that was not dropped.
    #[error("{0} was not dropped onto Belljar")]
    NotDropped(PathBuf),
    /// A dropped file or folder could not be read.
    #[error("Cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One regular file to upload, with its path relative to the folder it will land in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DroppedFile {
    /// Absolute path on the host, for [`DropRegistry::read`].
    pub path: PathBuf,
    /// `name` for a dropped file, `folder/sub/name` for a file inside a dropped folder.
    pub relative: String,
    pub size: u64,
}

/// What one drop carried, as sent to the page.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Drop {
    /// Where the pointer was, in CSS pixels of the window.
    pub x: f64,
    pub y: f64,
    pub files: Vec<DroppedFile>,
    /// Empty folders, relative like the files, so that they are created too.
    pub folders: Vec<String>,
    /// Entries that could not be read (for the page to report).
    pub errors: Vec<String>,
}

/// The files the page may read: those of past drops.
#[derive(Debug, Default)]
pub struct DropRegistry {
    allowed: Mutex<HashSet<PathBuf>>,
}

impl DropRegistry {
    /// Walks dropped paths into files and folders and allows reading the files.
    pub fn accept(&self, paths: &[PathBuf], x: f64, y: f64) -> Drop {
        let mut drop = Drop {
            x,
            y,
            files: Vec::new(),
            folders: Vec::new(),
            errors: Vec::new(),
        };
        for path in paths {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "dropped".to_owned());
            walk(path, &name, &mut drop);
        }
        let mut allowed = self.allowed.lock().unwrap_or_else(|e| e.into_inner());
        allowed.extend(drop.files.iter().map(|f| f.path.clone()));
        drop
    }

    /// Reads one dropped file.
    pub fn read(&self, path: &Path) -> Result<Vec<u8>, DropError> {
        let allowed = self.allowed.lock().unwrap_or_else(|e| e.into_inner());
        if !allowed.contains(path) {
            return Err(DropError::NotDropped(path.to_path_buf()));
        }
        drop(allowed);
        std::fs::read(path).map_err(|source| DropError::Read {
            path: path.to_path_buf(),
            source,
        })
    }
}

fn walk(path: &Path, relative: &str, out: &mut Drop) {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            out.errors.push(format!("{}: {e}", path.display()));
            return;
        }
    };
    if meta.is_file() {
        out.files.push(DroppedFile {
            path: path.to_path_buf(),
            relative: relative.to_owned(),
            size: meta.len(),
        });
        return;
    }
    if !meta.is_dir() {
        out.errors
            .push(format!("{}: not a regular file or folder", path.display()));
        return;
    }
    let entries = match std::fs::read_dir(path) {
        Ok(e) => e,
        Err(e) => {
            out.errors.push(format!("{}: {e}", path.display()));
            return;
        }
    };
    let mut children: Vec<_> = entries.filter_map(Result::ok).collect();
    children.sort_by_key(|e| e.file_name());
    if children.is_empty() {
        out.folders.push(relative.to_owned());
    }
    for child in children {
        let name = child.file_name().to_string_lossy().into_owned();
        walk(&child.path(), &format!("{relative}/{name}"), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_drop_lists_files_relative_to_it_and_allows_only_them() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("proj");
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(root.join("empty")).unwrap();
        std::fs::write(root.join("README"), "hi").unwrap();
        std::fs::write(root.join("src/main.rs"), "fn main() {}").unwrap();
        std::fs::write(dir.path().join("secret"), "no").unwrap();

        let reg = DropRegistry::default();
        let drop = reg.accept(std::slice::from_ref(&root), 10.0, 20.0);
        let rel: Vec<_> = drop.files.iter().map(|f| f.relative.as_str()).collect();
        assert_eq!(rel, ["proj/README", "proj/src/main.rs"]);
        assert_eq!(drop.folders, ["proj/empty"]);
        assert_eq!(drop.files[1].size, 12);
        assert_eq!(reg.read(&root.join("README")).unwrap(), b"hi");
        assert!(matches!(
            reg.read(&dir.path().join("secret")),
            Err(DropError::NotDropped(_))
        ));
    }

    #[test]
    fn a_missing_path_is_reported_not_fatal() {
        let reg = DropRegistry::default();
        let drop = reg.accept(&[PathBuf::from("/nonexistent/belljar-drop")], 0.0, 0.0);
        assert!(drop.files.is_empty());
        assert_eq!(drop.errors.len(), 1);
    }
}
