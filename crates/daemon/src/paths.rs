//! Where the daemon keeps things: data, config, runtime and the image cache.
//!
//! `BELLJAR_HOME` (or `--home`) puts data, config and runtime under one root so that tests can
//! use a temporary directory; the image cache stays shared (`BELLJAR_CACHE`, else
//! `${XDG_CACHE_HOME:-~/.cache}/belljar`) so that tests reuse images that are slow to build.
//! Which directories those are, and the names of the files clients look for in them, is
//! decided once in `belljar_client::paths`; this module adds what only the daemon needs.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    /// No home directory to derive the user directories from.
    #[error(transparent)]
    Resolve(#[from] belljar_client::PathsError),
    /// A directory could not be created.
    #[error("Cannot create {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The daemon's directories. Every one exists after [`Paths::create`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// Data, config and runtime, and the files clients look for in them (socket, port, pid,
    /// token), resolved by the client crate so that clients find this daemon.
    pub dirs: belljar_client::Paths,
    /// Built images (`<cache>/images/<name>/current/...`).
    pub cache: PathBuf,
}

impl Paths {
    /// Resolves the directories from an optional home root and an optional cache override.
    pub fn resolve(home: Option<&Path>, cache: Option<&Path>) -> Result<Self, PathsError> {
        Ok(Self {
            dirs: belljar_client::Paths::resolve(home)?,
            cache: belljar_client::paths::image_cache(cache)?,
        })
    }

    /// Creates the directories (private to the user, except the shared cache).
    pub fn create(&self) -> Result<(), PathsError> {
        let d = &self.dirs;
        for dir in [&d.data, &d.config, &d.runtime] {
            create_private_dir(dir)?;
        }
        create_private_dir(&d.data.join("sandboxes"))?;
        fs::create_dir_all(self.cache.join("images")).map_err(|source| PathsError::Create {
            path: self.cache.clone(),
            source,
        })
    }

    pub fn database(&self) -> PathBuf {
        self.dirs.data.join("belljar.db")
    }

    /// The directory that holds every sandbox's own ([`Self::sandbox_dir`]).
    pub fn sandboxes_dir(&self) -> PathBuf {
        self.dirs.data.join("sandboxes")
    }

    /// The per-sandbox directory: backend state, command logs.
    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.sandboxes_dir().join(id)
    }

    /// The NDJSON log of one command.
    pub fn command_log(&self, sandbox_id: &str, command_id: &str) -> PathBuf {
        self.sandbox_dir(sandbox_id)
            .join("commands")
            .join(format!("{command_id}.ndjson"))
    }

    /// `<cache>/images/<name>/current`.
    pub fn image_dir(&self, name: &str) -> PathBuf {
        self.cache.join("images").join(name).join("current")
    }
}

fn create_private_dir(dir: &Path) -> Result<(), PathsError> {
    let err = |source| PathsError::Create {
        path: dir.to_path_buf(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(err)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_puts_everything_but_the_cache_under_one_root() {
        let home = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let paths = Paths::resolve(Some(home.path()), Some(cache.path())).unwrap();
        assert!(paths.dirs.data.starts_with(home.path()));
        assert!(paths.dirs.config.starts_with(home.path()));
        assert_eq!(paths.dirs.socket(), home.path().join("run/belljard.sock"));
        assert_eq!(paths.cache, cache.path());
        paths.create().unwrap();
        for dir in [&paths.dirs.config, &paths.dirs.runtime, &paths.dirs.data] {
            let mode = fs::metadata(dir).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
        }
        assert_eq!(
            paths.command_log("sbx_a", "cmd_b"),
            paths
                .dirs
                .data
                .join("sandboxes/sbx_a/commands/cmd_b.ndjson")
        );
    }
}
