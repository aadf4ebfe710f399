//! The broker's CA, installed by the agent itself before it serves when the daemon passes the
//! certificate in its environment (`BELLJAR_CA_PEM`, namespace sandboxes): two local file
//! writes instead of three round trips from the daemon after the agent first answers, which
//! were a fifth of a sandbox's start.

use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use belljar_agent_proto::net::{MAX_CA_BUNDLE, SANDBOX_CA_PATH, SYSTEM_CA_BUNDLE, bundle_with_ca};

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// The system bundle exists but could not be read.
    #[error("Cannot read {SYSTEM_CA_BUNDLE}")]
    Read(#[source] io::Error),
    /// A file could not be written in place.
    #[error("Cannot write {0}")]
    Write(&'static str, #[source] io::Error),
}

/// Adds `pem` to the system bundle (unless it holds it already) and writes it alone to
/// [`SANDBOX_CA_PATH`], both as root, mode 0644. An image without the system bundle, or with
/// one past [`MAX_CA_BUNDLE`], gets only the latter, as the daemon's own install does.
pub fn install(pem: &str) -> Result<(), CaError> {
    match read_bounded(Path::new(SYSTEM_CA_BUNDLE)) {
        Ok(Some(bundle)) => {
            if let Some(with_ca) = bundle_with_ca(&bundle, pem) {
                replace(SYSTEM_CA_BUNDLE, &with_ca)?;
            }
        }
        Ok(None) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(CaError::Read(e)),
    }
    let mut alone = pem.trim_end().as_bytes().to_vec();
    alone.push(b'\n');
    let same = std::fs::read(SANDBOX_CA_PATH).is_ok_and(|now| now == alone);
    if !same {
        replace(SANDBOX_CA_PATH, &alone)?;
    }
    Ok(())
}

/// The file's bytes, or `None` when it is larger than [`MAX_CA_BUNDLE`].
fn read_bounded(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    let limit = u64::try_from(MAX_CA_BUNDLE).unwrap_or(u64::MAX);
    std::fs::File::open(path)?
        .take(limit + 1)
        .read_to_end(&mut bytes)?;
    Ok((bytes.len() <= MAX_CA_BUNDLE).then_some(bytes))
}

/// Writes `bytes` to a new file beside `path` and renames it over `path`, so a reader never
/// sees half a bundle.
fn replace(path: &'static str, bytes: &[u8]) -> Result<(), CaError> {
    let fail = |e| CaError::Write(path, e);
    let target = Path::new(path);
    let parent = target.parent().unwrap_or(Path::new("/"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(parent)
        .map_err(fail)?;
    let tmp = parent.join(format!(
        ".{}.belljar-{}.tmp",
        target
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.set_permissions(std::fs::Permissions::from_mode(0o644))
        })
        .and_then(|()| std::os::unix::fs::lchown(&tmp, Some(0), Some(0)))
        .and_then(|()| std::fs::rename(&tmp, target));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    Ok(())
}
