//! Where the daemon keeps its socket, port, pid, token and log, so that the CLI finds a daemon
//! that the desktop app or another shell started.
//!
//! The layout mirrors the daemon's own paths module: with `BELLJAR_HOME` set, everything lives
//! under it (`run/`, `config/`, `data/`); otherwise the XDG directories of the user. Keep every
//! path decision in [`Paths::from_env`] so that a change in the daemon is a change here only.

use std::path::{Path, PathBuf};

/// The files the CLI needs to reach and manage the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// `BELLJAR_HOME`, or the user's data directory when it is unset.
    pub home: Option<PathBuf>,
    /// The daemon's Unix socket.
    pub socket: PathBuf,
    /// Holds the TCP port the daemon listens on, as decimal text.
    pub port_file: PathBuf,
    /// Holds the daemon's process id.
    pub pid_file: PathBuf,
    /// The bearer token for TCP clients.
    pub token_file: PathBuf,
    /// Where a daemon started by the CLI writes its output.
    pub log_file: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    /// Neither `BELLJAR_HOME` nor a home directory is known.
    #[error("Cannot find a home directory; set BELLJAR_HOME")]
    NoHome,
}

impl Paths {
    /// The paths for the current environment (`BELLJAR_HOME`, `XDG_RUNTIME_DIR`, `HOME`).
    pub fn from_env() -> Result<Self, PathsError> {
        if let Some(home) = std::env::var_os("BELLJAR_HOME").filter(|h| !h.is_empty()) {
            return Ok(Self::under_home(Path::new(&home)));
        }
        let dirs = directories::ProjectDirs::from("", "", "belljar").ok_or(PathsError::NoHome)?;
        let data = dirs.data_dir().to_path_buf();
        let config = dirs.config_dir().to_path_buf();
        let runtime = dirs
            .runtime_dir()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| data.join("run"));
        Ok(Self::from_dirs(None, &data, &config, &runtime))
    }

    /// The layout the daemon uses when `BELLJAR_HOME` (or `belljard --home`) is `home`.
    pub fn under_home(home: &Path) -> Self {
        Self::from_dirs(
            Some(home.to_path_buf()),
            &home.join("data"),
            &home.join("config"),
            &home.join("run"),
        )
    }

    fn from_dirs(home: Option<PathBuf>, data: &Path, config: &Path, runtime: &Path) -> Self {
        Self {
            home,
            socket: runtime.join("belljard.sock"),
            port_file: runtime.join("port"),
            pid_file: runtime.join("belljard.pid"),
            token_file: config.join("token"),
            log_file: data.join("belljard.log"),
        }
    }

    /// The daemon's TCP port, if it has written one.
    pub fn port(&self) -> Option<u16> {
        std::fs::read_to_string(&self.port_file)
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The bearer token for TCP clients, if the daemon has created one.
    pub fn token(&self) -> Option<String> {
        let t = std::fs::read_to_string(&self.token_file).ok()?;
        let t = t.trim();
        (!t.is_empty()).then(|| t.to_string())
    }

    /// The daemon's process id from its pid file.
    pub fn pid(&self) -> Option<i32> {
        std::fs::read_to_string(&self.pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_layout_puts_everything_under_home() {
        let p = Paths::under_home(Path::new("/tmp/bj"));
        assert_eq!(p.socket, Path::new("/tmp/bj/run/belljard.sock"));
        assert_eq!(p.port_file, Path::new("/tmp/bj/run/port"));
        assert_eq!(p.token_file, Path::new("/tmp/bj/config/token"));
        assert!(p.log_file.starts_with("/tmp/bj"));
    }

    #[test]
    fn reads_port_and_token_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = Paths::under_home(dir.path());
        assert_eq!(p.port(), None);
        std::fs::create_dir_all(p.port_file.parent().unwrap()).unwrap();
        std::fs::create_dir_all(p.token_file.parent().unwrap()).unwrap();
        std::fs::write(&p.port_file, "7423\n").unwrap();
        std::fs::write(&p.token_file, "abc\n").unwrap();
        assert_eq!(p.port(), Some(7423));
        assert_eq!(p.token().as_deref(), Some("abc"));
    }
}
