//! Where the daemon keeps things: data, config, runtime and the image cache.
//!
//! `BELLJAR_HOME` (or `--home`) puts data, config and runtime under one root so that tests can
//! use a temporary directory; the image cache stays shared (`BELLJAR_CACHE`, else
//! `${XDG_CACHE_HOME:-~/.cache}/belljar`) so that tests reuse images that are slow to build.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    /// No home directory to derive the user directories from.
    #[error("Cannot find the user's home directory; set BELLJAR_HOME")]
    NoHome,
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
    /// Database, sandbox state and command logs.
    pub data: PathBuf,
    /// The bearer token.
    pub config: PathBuf,
    /// The Unix socket, the port file and the pid file.
    pub runtime: PathBuf,
    /// Built images (`<cache>/images/<name>/current/...`).
    pub cache: PathBuf,
}

impl Paths {
    /// Resolves the directories from an optional home root and an optional cache override.
    pub fn resolve(home: Option<&Path>, cache: Option<&Path>) -> Result<Self, PathsError> {
        let cache = match cache {
            Some(c) => c.to_path_buf(),
            None => default_cache()?,
        };
        if let Some(home) = home {
            return Ok(Self {
                data: home.join("data"),
                config: home.join("config"),
                runtime: home.join("run"),
                cache,
            });
        }
        let dirs = directories::ProjectDirs::from("", "", "belljar").ok_or(PathsError::NoHome)?;
        let data = dirs.data_dir().to_path_buf();
        let runtime = dirs
            .runtime_dir()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| data.join("run"));
        Ok(Self {
            config: dirs.config_dir().to_path_buf(),
            runtime,
            data,
            cache,
        })
    }

    /// Creates the directories (private to the user, except the shared cache).
    pub fn create(&self) -> Result<(), PathsError> {
        for dir in [&self.data, &self.config, &self.runtime] {
            create_private_dir(dir)?;
        }
        create_private_dir(&self.data.join("sandboxes"))?;
        fs::create_dir_all(self.cache.join("images")).map_err(|source| PathsError::Create {
            path: self.cache.clone(),
            source,
        })
    }

    pub fn database(&self) -> PathBuf {
        self.data.join("belljar.db")
    }

    pub fn socket(&self) -> PathBuf {
        self.runtime.join("belljard.sock")
    }

    pub fn port_file(&self) -> PathBuf {
        self.runtime.join("port")
    }

    pub fn pid_file(&self) -> PathBuf {
        self.runtime.join("belljard.pid")
    }

    pub fn token_file(&self) -> PathBuf {
        self.config.join("token")
    }

    /// The per-sandbox directory: backend state, command logs.
    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.data.join("sandboxes").join(id)
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

fn default_cache() -> Result<PathBuf, PathsError> {
    if let Some(xdg) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(xdg).join("belljar"));
    }
    let home = directories::BaseDirs::new().ok_or(PathsError::NoHome)?;
    Ok(home.home_dir().join(".cache").join("belljar"))
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
        assert!(paths.data.starts_with(home.path()));
        assert!(paths.config.starts_with(home.path()));
        assert_eq!(paths.socket(), home.path().join("run/belljard.sock"));
        assert_eq!(paths.cache, cache.path());
        paths.create().unwrap();
        let mode = fs::metadata(&paths.config).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(
            paths.command_log("sbx_a", "cmd_b"),
            paths.data.join("sandboxes/sbx_a/commands/cmd_b.ndjson")
        );
    }
}
