//! Finds the user's `belljard` and what the web UI needs to reach it.
//!
//! Where the daemon keeps its socket, port and token is `belljar_client::paths`, the same
//! module the daemon resolves its own directories with, so the app finds the daemon that the
//! CLI (or the app itself) started. Nothing else about the daemon is known to the Rust side —
//! the web UI talks to its API directly. The one request the app makes itself, for a one-time
//! browser token when the window loads the UI from the daemon (`ui_login_url`), goes through
//! the typed client over the private Unix socket.
//!
//! The app calls these from Tauri commands on blocking threads, so they are synchronous: each
//! request runs on a small runtime of its own.

use std::path::{Path, PathBuf};

use belljar_client::{Client, ClientError, Paths, PathsError};
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// No home directory to find the daemon's files from.
    #[error(transparent)]
    NoHome(#[from] PathsError),
    /// The bundled daemon could not be started.
    #[error("Cannot start belljard: {0}")]
    Spawn(String),
    /// No daemon answers, and the app is not starting one.
    #[error("belljard is not running (nothing answers on {socket})")]
    NotRunning { socket: PathBuf },
    /// The daemon did not come up in time.
    #[error("belljard did not answer on {socket} within {seconds} s")]
    Timeout { socket: PathBuf, seconds: u64 },
    /// The port file is missing or does not hold a port number.
    #[error("{path} does not hold belljard's port")]
    BadPort { path: PathBuf },
    /// The token file is missing or empty.
    #[error("{path} does not hold belljard's token")]
    NoToken { path: PathBuf },
    /// The daemon's socket failed mid-request.
    #[error("Cannot talk to belljard on its socket")]
    Socket(#[source] ClientError),
    /// The daemon answered with an error instead of a token.
    #[error("belljard refused a session token")]
    Refused(#[source] ClientError),
}

/// Where belljard keeps what a client needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonPaths {
    paths: Paths,
}

/// What the web UI needs to reach the daemon from inside the app.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Connection {
    pub base_url: String,
    pub token: String,
}

impl DaemonPaths {
    /// Resolves the directories the way belljard does, from an optional `BELLJAR_HOME`.
    pub fn resolve(home: Option<&Path>) -> Result<Self, DaemonError> {
        Ok(Self {
            paths: Paths::resolve(home)?,
        })
    }

    /// From the environment of this process.
    pub fn from_env() -> Result<Self, DaemonError> {
        Ok(Self {
            paths: Paths::from_env()?,
        })
    }

    pub fn socket(&self) -> PathBuf {
        self.paths.socket()
    }

    /// The directory of the daemon's socket (where a notify socket for it may go).
    pub fn runtime_dir(&self) -> PathBuf {
        self.paths.runtime.clone()
    }

    /// Whether a daemon answers on the Unix socket and has written its port.
    pub fn is_running(&self) -> bool {
        self.paths.port().is_some() && block_on(Client::local(&self.paths).answers())
    }

    /// The address and token a client of the TCP API needs.
    pub fn connection(&self) -> Result<Connection, DaemonError> {
        let port = self.port()?;
        let token = self.paths.token().ok_or_else(|| DaemonError::NoToken {
            path: self.paths.token_file(),
        })?;
        Ok(Connection {
            base_url: format!("http://127.0.0.1:{port}"),
            token,
        })
    }

    /// `http://127.0.0.1:<port>/ui?token=<one-time>`: the daemon's own UI, signed in by a
    /// one-time token (what `belljar ui` opens), asked for over the private Unix socket.
    pub fn ui_login_url(&self) -> Result<String, DaemonError> {
        let port = self.port()?;
        let client = Client::local(&self.paths);
        block_on(client.ui_login_url(port)).map_err(|e| match e {
            ClientError::Api { .. } | ClientError::Status { .. } | ClientError::Decode { .. } => {
                DaemonError::Refused(e)
            }
            e => DaemonError::Socket(e),
        })
    }

    fn port(&self) -> Result<u16, DaemonError> {
        self.paths.port().ok_or_else(|| DaemonError::BadPort {
            path: self.paths.port_file(),
        })
    }
}

/// Runs one request to completion on a runtime of its own (the callers are blocking threads,
/// never async tasks).
fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds")
        .block_on(fut)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    fn home_with_port(port: &str) -> (tempfile::TempDir, DaemonPaths, Paths) {
        let home = tempfile::tempdir().unwrap();
        let paths = Paths::under_home(home.path());
        std::fs::create_dir_all(&paths.runtime).unwrap();
        std::fs::create_dir_all(&paths.config).unwrap();
        std::fs::write(paths.port_file(), port).unwrap();
        let daemon = DaemonPaths::resolve(Some(home.path())).unwrap();
        (home, daemon, paths)
    }

    #[test]
    fn home_puts_config_and_runtime_under_one_root() {
        let paths = DaemonPaths::resolve(Some(Path::new("/tmp/bj"))).unwrap();
        assert_eq!(paths.socket(), Path::new("/tmp/bj/run/belljard.sock"));
    }

    #[test]
    fn connection_reads_port_and_token() {
        let (_home, daemon, paths) = home_with_port("41234\n");
        assert!(matches!(
            daemon.connection(),
            Err(DaemonError::NoToken { .. })
        ));
        std::fs::write(paths.token_file(), "secret\n").unwrap();
        let c = daemon.connection().unwrap();
        assert_eq!(c.base_url, "http://127.0.0.1:41234");
        assert_eq!(c.token, "secret");
    }

    #[test]
    fn a_bad_port_file_is_an_error() {
        let (_home, daemon, _paths) = home_with_port("not a port");
        assert!(matches!(
            daemon.connection(),
            Err(DaemonError::BadPort { .. })
        ));
    }

    /// Serves one request on the daemon's socket with `answer`; returns the request head.
    fn serve_once(paths: &Paths, answer: &'static [u8]) -> std::thread::JoinHandle<String> {
        let listener = std::os::unix::net::UnixListener::bind(paths.socket()).unwrap();
        std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 512];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = c.read(&mut buf).unwrap();
                req.extend_from_slice(&buf[..n]);
            }
            c.write_all(answer).unwrap();
            String::from_utf8_lossy(&req).into_owned()
        })
    }

    #[test]
    fn a_token_comes_over_a_real_unix_socket() {
        let (_home, daemon, paths) = home_with_port("7423");
        let server = serve_once(
            &paths,
            b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\n{\"token\":\"one-time\"}",
        );
        let url = daemon.ui_login_url().unwrap();
        assert_eq!(url, "http://127.0.0.1:7423/ui?token=one-time");
        assert!(
            server
                .join()
                .unwrap()
                .starts_with("POST /v1/session/token HTTP/1.1\r\n")
        );
    }

    #[test]
    fn an_error_answer_is_a_refusal_not_a_token() {
        let (_home, daemon, paths) = home_with_port("7423");
        let body = r#"{"error":{"code":"forbidden","message":"no"}}"#;
        let answer = format!(
            "HTTP/1.1 403 Forbidden\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let server = serve_once(&paths, Box::leak(answer.into_bytes().into_boxed_slice()));
        let err = daemon.ui_login_url().unwrap_err();
        assert!(
            matches!(&err, DaemonError::Refused(e) if e.code() == "forbidden"),
            "{err:?}"
        );
        server.join().unwrap();
    }

    /// The Tauri commands call these on the async runtime's blocking threads.
    #[test]
    fn works_from_a_runtimes_blocking_thread() {
        let (_home, daemon, paths) = home_with_port("7423");
        let server = serve_once(
            &paths,
            b"HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n{\"token\":\"bt\"}",
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let url = runtime
            .block_on(
                async move { tokio::task::spawn_blocking(move || daemon.ui_login_url()).await },
            )
            .unwrap()
            .unwrap();
        assert_eq!(url, "http://127.0.0.1:7423/ui?token=bt");
        server.join().unwrap();
    }

    #[test]
    fn nothing_listening_is_not_running() {
        let (_home, daemon, _paths) = home_with_port("7423");
        assert!(!daemon.is_running());
        assert!(matches!(
            daemon.ui_login_url(),
            Err(DaemonError::Socket(ClientError::Connect { .. }))
        ));
    }
}
