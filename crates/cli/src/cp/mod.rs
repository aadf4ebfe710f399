//! `belljar cp`: copies files and directory trees between the host and a sandbox (or between
//! two sandboxes), streamed in constant memory with a progress bar for files.
//!
//! Semantics follow `cp -r`: copying onto an existing directory puts the source inside it
//! under its own name; otherwise the destination is the new name. Directories travel as tar
//! streams through the daemon's tar endpoints. One module per direction: [`upload`] (host to
//! sandbox), [`download`] (sandbox to host), [`between`] (sandbox to sandbox).

mod between;
mod download;
mod upload;
pub use upload::{Selection, tar_stream};

use std::path::{Path, PathBuf};

use belljar_api::{FileEntry, FileKind};
use belljar_client::{Client, ClientError};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The chunk size of streamed transfers.
pub(crate) const CHUNK: usize = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A local file could not be read or written.
    #[error("{path}: {source}")]
    Local {
        path: String,
        source: std::io::Error,
    },
    /// Both sides are local paths.
    #[error("One side of cp must be in a sandbox, written ID:/path")]
    BothLocal,
    /// The source is neither a file nor a directory.
    #[error("{0}: not a regular file or directory")]
    Unsupported(String),
    /// The source of a copy does not exist.
    #[error("{0} does not exist")]
    Missing(String),
    /// The download ended early or a tar stream was malformed.
    #[error("Transfer failed: {0}")]
    Transfer(String),
}

impl CopyError {
    pub fn code(&self) -> &str {
        match self {
            Self::Client(e) => e.code(),
            Self::Local { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                "not_found"
            }
            Self::Local { .. } => "io",
            Self::Missing(_) => "not_found",
            Self::BothLocal | Self::Unsupported(_) => "bad_request",
            Self::Transfer(_) => "connection_lost",
        }
    }
}

pub(crate) fn local_err(path: &Path) -> impl FnOnce(std::io::Error) -> CopyError + '_ {
    move |source| CopyError::Local {
        path: path.display().to_string(),
        source,
    }
}

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    Sandbox { id: String, path: String },
}

impl Location {
    /// `ID:/path` is in a sandbox (a relative path is under `/workspace`); anything else is
    /// local. Write `./a:b` for a local file whose name has a colon.
    pub fn parse(s: &str) -> Self {
        if let Some((id, path)) = s.split_once(':')
            && !id.is_empty()
            && !id.contains('/')
        {
            let path = if path.is_empty() {
                "/workspace".to_string()
            } else if path.starts_with('/') {
                path.to_string()
            } else {
                format!("/workspace/{path}")
            };
            return Self::Sandbox {
                id: id.to_string(),
                path,
            };
        }
        Self::Local(PathBuf::from(s))
    }
}

/// What a copy moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyReport {
    /// Where the copy ended up (a host path, or `ID:/path`).
    pub destination: String,
    /// Payload bytes (file contents or tar stream).
    pub bytes: u64,
    pub directory: bool,
}

/// Copies `src` to `dst`; `progress` shows a bar on stderr.
pub async fn copy(
    client: &Client,
    src: &Location,
    dst: &Location,
    progress: bool,
) -> Result<CopyReport, CopyError> {
    match (src, dst) {
        (Location::Local(from), Location::Sandbox { id, path }) => {
            upload::upload(client, from, id, path, progress).await
        }
        (Location::Sandbox { id, path }, Location::Local(to)) => {
            download::download(client, id, path, to, progress).await
        }
        (Location::Sandbox { id: a, path: pa }, Location::Sandbox { id: b, path: pb }) => {
            between::between(client, a, pa, b, pb, progress).await
        }
        (Location::Local(_), Location::Local(_)) => Err(CopyError::BothLocal),
    }
}

/// The last path component of a sandbox path.
pub(crate) fn remote_name(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("root")
}

fn remote_join(dir: &str, name: &str) -> String {
    format!("{}/{}", dir.trim_end_matches('/'), name)
}

/// The entry of a copy's source in a sandbox, which must exist.
async fn source_entry(client: &Client, id: &str, path: &str) -> Result<FileEntry, CopyError> {
    client
        .try_stat(id, path)
        .await?
        .ok_or_else(|| CopyError::Missing(format!("{id}:{path}")))
}

/// Where a source named `name` lands when copied to sandbox path `dst`.
pub(crate) async fn remote_target(
    client: &Client,
    id: &str,
    dst: &str,
    name: &str,
) -> Result<String, CopyError> {
    if dst.ends_with('/') {
        return Ok(remote_join(dst, name));
    }
    match client.try_stat(id, dst).await? {
        Some(e) if e.kind == FileKind::Directory => Ok(remote_join(dst, name)),
        _ => Ok(dst.to_string()),
    }
}

/// Where a source named `name` lands when copied to host path `dst`.
pub(crate) fn local_target(dst: &Path, name: &str) -> PathBuf {
    if dst.is_dir() || dst.as_os_str().to_string_lossy().ends_with('/') {
        dst.join(name)
    } else {
        dst.to_path_buf()
    }
}

pub(crate) fn bar(progress: bool, len: Option<u64>, label: &str) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let pb = match len {
        Some(len) => ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr()),
        None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
    };
    let style = match len {
        Some(_) => ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        ),
        None => ProgressStyle::with_template("{msg} {spinner} {bytes} {bytes_per_sec}"),
    };
    if let Ok(style) = style {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(label.to_string());
    pb
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_locations() {
        assert_eq!(
            Location::parse("sbx_ab12:/tmp/x y"),
            Location::Sandbox {
                id: "sbx_ab12".into(),
                path: "/tmp/x y".into()
            }
        );
        assert_eq!(
            Location::parse("sbx_1:rel/f"),
            Location::Sandbox {
                id: "sbx_1".into(),
                path: "/workspace/rel/f".into()
            }
        );
        assert_eq!(
            Location::parse("sbx_1:"),
            Location::Sandbox {
                id: "sbx_1".into(),
                path: "/workspace".into()
            }
        );
        assert_eq!(
            Location::parse("./a:b"),
            Location::Local(PathBuf::from("./a:b"))
        );
        assert_eq!(
            Location::parse("/abs/file"),
            Location::Local(PathBuf::from("/abs/file"))
        );
    }

    #[test]
    fn remote_names_and_joins() {
        assert_eq!(remote_name("/a/b/c.txt"), "c.txt");
        assert_eq!(remote_name("/a/dir/"), "dir");
        assert_eq!(remote_name("/"), "root");
        assert_eq!(remote_join("/a/", "b"), "/a/b");
    }

    #[test]
    fn local_target_follows_cp_semantics() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(local_target(dir.path(), "f"), dir.path().join("f"));
        let new = dir.path().join("new");
        assert_eq!(local_target(&new, "f"), new);
    }
}
