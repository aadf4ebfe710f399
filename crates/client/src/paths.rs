//! Where belljard keeps what its clients look for: the Unix socket, the port, pid and token
//! files, the log a started daemon writes, and the shared image cache.
//!
//! The daemon resolves its own directories through this module too, so a client (the CLI,
//! the desktop app, the tests) finds exactly the daemon that another one started. With
//! `BELLJAR_HOME` (or `belljard --home`) set, data, config and runtime live under that one
//! root (`data/`, `config/`, `run/`), which is what tests use; otherwise the user's XDG
//! directories. The image cache is shared either way: images are slow to build.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    /// Neither `BELLJAR_HOME` nor the user's home directory is known.
    #[error("Cannot find the user's home directory; set BELLJAR_HOME")]
    NoHome,
}

/// The daemon's directories and the files in them that clients need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// `BELLJAR_HOME` when one was given.
    pub home: Option<PathBuf>,
    /// Database, sandbox state, command logs, and the log of a daemon a client started.
    pub data: PathBuf,
    /// The bearer token.
    pub config: PathBuf,
    /// The Unix socket, the port file and the pid file.
    pub runtime: PathBuf,
}

impl Paths {
    /// The paths for this process's environment: `BELLJAR_HOME`, else the user directories.
    pub fn from_env() -> Result<Self, PathsError> {
        let home = std::env::var_os("BELLJAR_HOME").filter(|h| !h.is_empty());
        Self::resolve(home.as_deref().map(Path::new))
    }

    /// Everything under `home` when given, else the user's XDG directories.
    pub fn resolve(home: Option<&Path>) -> Result<Self, PathsError> {
        if let Some(home) = home {
            return Ok(Self::under_home(home));
        }
        let dirs = directories::ProjectDirs::from("", "", "belljar").ok_or(PathsError::NoHome)?;
        let data = dirs.data_dir().to_path_buf();
        // Without XDG_RUNTIME_DIR (a service account, a container) the socket goes under the
        // private data directory rather than a shared /tmp.
        let runtime = dirs
            .runtime_dir()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| data.join("run"));
        Ok(Self {
            home: None,
            config: dirs.config_dir().to_path_buf(),
            runtime,
            data,
        })
    }

    /// The layout under one root, as `BELLJAR_HOME=home` gives it.
    pub fn under_home(home: &Path) -> Self {
        Self {
            home: Some(home.to_path_buf()),
            data: home.join("data"),
            config: home.join("config"),
            runtime: home.join("run"),
        }
    }

    /// The daemon's Unix socket: no token needed, only this user can open it.
    pub fn socket(&self) -> PathBuf {
        self.runtime.join("belljard.sock")
    }

    /// Holds the TCP port the daemon listens on, as decimal text.
    pub fn port_file(&self) -> PathBuf {
        self.runtime.join("port")
    }

    /// Holds the TCP port of the daemon's Modal layer (gRPC), as decimal text.
    pub fn modal_port_file(&self) -> PathBuf {
        self.runtime.join("modal-port")
    }

    /// The Modal layer's TCP port, if the daemon has written it.
    pub fn modal_port(&self) -> Option<u16> {
        read_trimmed(&self.modal_port_file())?.parse().ok()
    }

    /// Holds the daemon's process id.
    pub fn pid_file(&self) -> PathBuf {
        self.runtime.join("belljard.pid")
    }

    /// The bearer token of TCP clients.
    pub fn token_file(&self) -> PathBuf {
        self.config.join("token")
    }

    /// Where a daemon that a client started in the background writes its output.
    pub fn log_file(&self) -> PathBuf {
        self.data.join("belljard.log")
    }

    /// The daemon's TCP port, if it has written one.
    pub fn port(&self) -> Option<u16> {
        read_trimmed(&self.port_file())?.parse().ok()
    }

    /// The bearer token, if the daemon has created one.
    pub fn token(&self) -> Option<String> {
        read_trimmed(&self.token_file()).filter(|t| !t.is_empty())
    }

    /// The daemon's process id from its pid file.
    pub fn pid(&self) -> Option<i32> {
        read_trimmed(&self.pid_file())?.parse().ok()
    }
}

/// The image cache: `over` when given (`BELLJAR_CACHE`), else
/// `${XDG_CACHE_HOME:-~/.cache}/belljar`.
pub fn image_cache(over: Option<&Path>) -> Result<PathBuf, PathsError> {
    if let Some(c) = over.filter(|c| !c.as_os_str().is_empty()) {
        return Ok(c.to_path_buf());
    }
    if let Some(xdg) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(xdg).join("belljar"));
    }
    let base = directories::BaseDirs::new().ok_or(PathsError::NoHome)?;
    Ok(base.home_dir().join(".cache").join("belljar"))
}

/// Another of Belljar's binaries installed beside the running one (`belljard` beside
/// `belljar`, `belljar-vmm` beside `belljard`). A test or benchmark run by `cargo` lives one
/// level below the binaries, in `target/<profile>/deps`, so that directory's parent counts too.
pub fn beside_exe(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let beside = dir.join(name);
    if beside.is_file() {
        return Some(beside);
    }
    let up = dir.parent()?.join(name);
    (dir.ends_with("deps") && up.is_file()).then_some(up)
}

/// The data an installed package ships beside its binaries: `<prefix>/lib/belljar/<name>` for
/// a binary in `<prefix>/bin` (the `.deb` puts the web UI and the image recipes there), so a
/// package unpacked under any prefix finds its own files and never the build tree's.
pub fn installed_data(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    installed_data_for(&exe, name)
}

fn installed_data_for(exe: &Path, name: &str) -> Option<PathBuf> {
    let bin = exe.parent()?;
    let data = bin.parent()?.join("lib/belljar").join(name);
    (bin.file_name()? == "bin" && data.exists()).then_some(data)
}

fn read_trimmed(path: &Path) -> Option<String> {
    Some(std::fs::read_to_string(path).ok()?.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_puts_data_config_and_runtime_under_one_root() {
        let p = Paths::resolve(Some(Path::new("/tmp/bj"))).unwrap();
        assert_eq!(p, Paths::under_home(Path::new("/tmp/bj")));
        assert_eq!(p.socket(), Path::new("/tmp/bj/run/belljard.sock"));
        assert_eq!(p.port_file(), Path::new("/tmp/bj/run/port"));
        assert_eq!(p.pid_file(), Path::new("/tmp/bj/run/belljard.pid"));
        assert_eq!(p.token_file(), Path::new("/tmp/bj/config/token"));
        assert_eq!(p.log_file(), Path::new("/tmp/bj/data/belljard.log"));
    }

    #[test]
    fn reads_port_token_and_pid_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = Paths::under_home(dir.path());
        assert_eq!((p.port(), p.token(), p.pid()), (None, None, None));
        std::fs::create_dir_all(&p.runtime).unwrap();
        std::fs::create_dir_all(&p.config).unwrap();
        std::fs::write(p.port_file(), "7423\n").unwrap();
        std::fs::write(p.token_file(), "abc\n").unwrap();
        std::fs::write(p.pid_file(), "42\n").unwrap();
        assert_eq!(p.port(), Some(7423));
        assert_eq!(p.token().as_deref(), Some("abc"));
        assert_eq!(p.pid(), Some(42));
        std::fs::write(p.port_file(), "not a port").unwrap();
        std::fs::write(p.token_file(), "\n").unwrap();
        assert_eq!((p.port(), p.token()), (None, None));
    }

    #[test]
    fn installed_data_lives_in_lib_belljar_beside_bin() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("usr/bin/belljard");
        std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
        assert_eq!(installed_data_for(&exe, "ui"), None);
        let ui = dir.path().join("usr/lib/belljar/ui");
        std::fs::create_dir_all(&ui).unwrap();
        assert_eq!(installed_data_for(&exe, "ui"), Some(ui));
        assert_eq!(installed_data_for(&exe, "guest-images"), None);
        // A build tree's binary (target/debug) is not an installed one.
        let built = dir.path().join("usr/target/belljard");
        assert_eq!(installed_data_for(&built, "ui"), None);
    }

    #[test]
    fn an_explicit_cache_wins() {
        let c = image_cache(Some(Path::new("/var/cache/bj"))).unwrap();
        assert_eq!(c, Path::new("/var/cache/bj"));
        assert!(image_cache(None).unwrap().ends_with("belljar"));
    }
}
