//! Finds the user's `belljard` and starts the bundled one when none is running.
//!
//! The daemon's directories follow the same rules as belljard's own (`crates/daemon/src/paths.rs`):
//! `BELLJAR_HOME` puts config and runtime under one root, otherwise the platform's user
//! directories. The app reads the port and the bearer token from there; nothing else about the
//! daemon is known to the Rust side — the web UI talks to its API directly. The one request the
//! app makes itself is for a one-time browser token over the Unix socket, for when the window
//! loads the UI from the daemon (see `ui_login_url`).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// No home directory to find the daemon's files from.
    #[error("Cannot find the user's home directory; set BELLJAR_HOME")]
    NoHome,
    /// The bundled daemon could not be started.
    #[error("Cannot start belljard: {0}")]
    Spawn(String),
    /// The daemon did not come up in time.
    #[error("belljard did not answer on {socket} within {seconds} s")]
    Timeout { socket: PathBuf, seconds: u64 },
    /// A file the daemon writes could not be read.
    #[error("Cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The port file did not hold a port number.
    #[error("{path} does not hold a port number")]
    BadPort { path: PathBuf },
    /// The daemon's socket failed mid-request.
    #[error("Cannot talk to belljard on its socket")]
    Socket(#[source] std::io::Error),
    /// The daemon answered something other than a token.
    #[error("belljard refused a session token: {0}")]
    Refused(String),
}

/// Where belljard keeps what a client needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonPaths {
    pub config: PathBuf,
    pub runtime: PathBuf,
}

impl DaemonPaths {
    /// Resolves the directories the way belljard does, from an optional `BELLJAR_HOME`.
    pub fn resolve(home: Option<&Path>) -> Result<Self, DaemonError> {
        if let Some(home) = home {
            return Ok(Self {
                config: home.join("config"),
                runtime: home.join("run"),
            });
        }
        let dirs = directories::ProjectDirs::from("", "", "belljar").ok_or(DaemonError::NoHome)?;
        let runtime = dirs
            .runtime_dir()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| dirs.data_dir().join("run"));
        Ok(Self {
            config: dirs.config_dir().to_path_buf(),
            runtime,
        })
    }

    /// From the environment of this process.
    pub fn from_env() -> Result<Self, DaemonError> {
        let home = std::env::var_os("BELLJAR_HOME").filter(|h| !h.is_empty());
        Self::resolve(home.as_deref().map(Path::new))
    }

    pub fn socket(&self) -> PathBuf {
        self.runtime.join("belljard.sock")
    }

    pub fn port_file(&self) -> PathBuf {
        self.runtime.join("port")
    }

    pub fn token_file(&self) -> PathBuf {
        self.config.join("token")
    }

    /// Whether a daemon answers on the Unix socket and has written its port.
    pub fn is_running(&self) -> bool {
        UnixStream::connect(self.socket()).is_ok() && self.port_file().is_file()
    }

    /// Waits until the daemon answers, for at most `timeout`.
    pub fn wait_running(&self, timeout: Duration) -> Result<(), DaemonError> {
        let start = Instant::now();
        while !self.is_running() {
            if start.elapsed() > timeout {
                return Err(DaemonError::Timeout {
                    socket: self.socket(),
                    seconds: timeout.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The address and token a client of the TCP API needs.
    pub fn connection(&self) -> Result<Connection, DaemonError> {
        let port_file = self.port_file();
        let port = read_trimmed(&port_file)?
            .parse::<u16>()
            .map_err(|_| DaemonError::BadPort { path: port_file })?;
        let token = read_trimmed(&self.token_file())?;
        Ok(Connection {
            base_url: format!("http://127.0.0.1:{port}"),
            token,
        })
    }
}

/// What the web UI needs to reach the daemon from inside the app.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Connection {
    pub base_url: String,
    pub token: String,
}

impl DaemonPaths {
    /// `http://127.0.0.1:<port>/ui?token=<one-time>`: the daemon's own UI, signed in by a
    /// one-time token (what `belljar ui` opens), asked for over the private Unix socket.
    pub fn ui_login_url(&self) -> Result<String, DaemonError> {
        let base = self.connection()?.base_url;
        let answer = unix_post(&self.socket(), "/v1/session/token")?;
        let token = parse_token(&answer)?;
        Ok(format!("{base}/ui?token={token}"))
    }
}

/// One bodiless POST over the Unix socket; HTTP/1.0 so the answer is not chunked.
fn unix_post(socket: &Path, path: &str) -> Result<Vec<u8>, DaemonError> {
    let mut s = UnixStream::connect(socket).map_err(DaemonError::Socket)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(DaemonError::Socket)?;
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n"
    )
    .map_err(DaemonError::Socket)?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).map_err(DaemonError::Socket)?;
    Ok(answer)
}

/// The token of a `200 {"token": "..."}` answer.
fn parse_token(answer: &[u8]) -> Result<String, DaemonError> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| DaemonError::Refused("not an HTTP answer".into()))?;
    let status = head.split_whitespace().nth(1).unwrap_or_default();
    if status != "200" && status != "201" {
        return Err(DaemonError::Refused(format!(
            "HTTP {status}: {}",
            body.trim()
        )));
    }
    #[derive(serde::Deserialize)]
    struct Token {
        token: String,
    }
    serde_json::from_str::<Token>(body.trim())
        .map(|t| t.token)
        .map_err(|e| DaemonError::Refused(e.to_string()))
}

fn read_trimmed(path: &Path) -> Result<String, DaemonError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|source| DaemonError::Read {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_puts_config_and_runtime_under_one_root() {
        let paths = DaemonPaths::resolve(Some(Path::new("/tmp/bj"))).unwrap();
        assert_eq!(paths.socket(), Path::new("/tmp/bj/run/belljard.sock"));
        assert_eq!(paths.token_file(), Path::new("/tmp/bj/config/token"));
        assert_eq!(paths.port_file(), Path::new("/tmp/bj/run/port"));
    }

    #[test]
    fn connection_reads_port_and_token() {
        let home = tempfile::tempdir().unwrap();
        let paths = DaemonPaths::resolve(Some(home.path())).unwrap();
        std::fs::create_dir_all(&paths.runtime).unwrap();
        std::fs::create_dir_all(&paths.config).unwrap();
        std::fs::write(paths.port_file(), "41234\n").unwrap();
        std::fs::write(paths.token_file(), "secret\n").unwrap();
        let c = paths.connection().unwrap();
        assert_eq!(c.base_url, "http://127.0.0.1:41234");
        assert_eq!(c.token, "secret");
    }

    #[test]
    fn a_bad_port_file_is_an_error() {
        let home = tempfile::tempdir().unwrap();
        let paths = DaemonPaths::resolve(Some(home.path())).unwrap();
        std::fs::create_dir_all(&paths.runtime).unwrap();
        std::fs::write(paths.port_file(), "not a port").unwrap();
        assert!(matches!(
            paths.connection(),
            Err(DaemonError::BadPort { .. })
        ));
    }

    #[test]
    fn a_token_answer_is_parsed_and_an_error_is_not_a_token() {
        let ok = b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{\"token\":\"abc\"}";
        assert_eq!(parse_token(ok).unwrap(), "abc");
        let err = b"HTTP/1.0 403 Forbidden\r\n\r\n{\"error\":{}}";
        assert!(matches!(parse_token(err), Err(DaemonError::Refused(_))));
        assert!(parse_token(b"garbage").is_err());
    }

    #[test]
    fn a_token_comes_over_a_real_unix_socket() {
        let home = tempfile::tempdir().unwrap();
        let paths = DaemonPaths::resolve(Some(home.path())).unwrap();
        std::fs::create_dir_all(&paths.runtime).unwrap();
        std::fs::create_dir_all(&paths.config).unwrap();
        std::fs::write(paths.port_file(), "7423").unwrap();
        let listener = std::os::unix::net::UnixListener::bind(paths.socket()).unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let mut req = [0u8; 512];
            let n = c.read(&mut req).unwrap();
            let req = String::from_utf8_lossy(&req[..n]).into_owned();
            c.write_all(b"HTTP/1.0 200 OK\r\n\r\n{\"token\":\"one-time\"}")
                .unwrap();
            req
        });
        let url = paths.ui_login_url().unwrap();
        assert_eq!(url, "http://127.0.0.1:7423/ui?token=one-time");
        assert!(
            server
                .join()
                .unwrap()
                .starts_with("POST /v1/session/token HTTP/1.0\r\n")
        );
    }

    #[test]
    fn nothing_listening_is_not_running() {
        let home = tempfile::tempdir().unwrap();
        let paths = DaemonPaths::resolve(Some(home.path())).unwrap();
        assert!(!paths.is_running());
        let err = paths.wait_running(Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, DaemonError::Timeout { .. }));
    }
}
