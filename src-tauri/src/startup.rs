//! The daemon the app starts itself says when it is ready, and the app's commands wait for
//! that message instead of polling the socket: the bundled `belljard` gets a `NOTIFY_SOCKET`
//! (`belljar_client::ready`, the same protocol the CLI's launcher and a systemd unit use), a
//! thread waits on it, and [`Startup`] hands the outcome to every command that needs the daemon.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::daemon::{DaemonError, DaemonPaths};

/// Where the app's own start of the daemon stands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
enum State {
    /// The app started no daemon (one already answered, or none was needed yet).
    #[default]
    NotStarted,
    /// Started; `READY=1` has not come yet.
    Starting,
    /// The daemon said `READY=1`.
    Ready,
    /// It could not start, or it exited before it was ready; why.
    Failed(String),
}

/// Why the daemon the app started will never be ready.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot make a notify socket in {}", dir.display())]
    NotifySocket {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the bundled belljard")]
    Spawn(#[source] tauri_plugin_shell::Error),
    #[error("belljard never said it was ready")]
    NeverReady(#[source] std::io::Error),
    /// How it ended, as the shell plugin reports it.
    #[error("belljard exited: {0}")]
    Exited(String),
}

/// The outcome of the app's own daemon start, shared by the commands that wait for it.
#[derive(Debug, Default)]
pub struct Startup {
    state: Mutex<State>,
    changed: Condvar,
}

impl Startup {
    /// The app is starting the daemon now.
    pub fn starting(&self) {
        self.set(State::Starting);
    }

    /// The started daemon said it is ready, or (`Err`) why it never will be. Only the first
    /// outcome counts: a daemon that exits after it was ready is found by the next request.
    /// Every waiter gets the error's text, its causes included.
    pub fn finish(&self, outcome: Result<(), StartError>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if *state == State::Starting {
            *state = match outcome {
                Ok(()) => State::Ready,
                Err(e) => State::Failed(belljar_client::error_chain(&e)),
            };
            self.changed.notify_all();
        }
    }

    fn set(&self, next: State) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = next;
        self.changed.notify_all();
    }

    /// Waits, for at most `timeout`, until a daemon answers: at once when one already does,
    /// else until the daemon this app started says it is ready.
    pub fn wait_running(&self, paths: &DaemonPaths, timeout: Duration) -> Result<(), DaemonError> {
        if paths.is_running() {
            return Ok(());
        }
        let deadline = Instant::now() + timeout;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match &*state {
                State::Starting => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(DaemonError::Timeout {
                            socket: paths.socket(),
                            seconds: timeout.as_secs(),
                        });
                    }
                    state = self
                        .changed
                        .wait_timeout(state, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                State::Ready => {
                    drop(state);
                    return if paths.is_running() {
                        Ok(())
                    } else {
                        Err(DaemonError::NotRunning {
                            socket: paths.socket(),
                        })
                    };
                }
                State::Failed(why) => return Err(DaemonError::Spawn(why.clone())),
                State::NotStarted => {
                    return Err(DaemonError::NotRunning {
                        socket: paths.socket(),
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::Arc;

    use belljar_client::Paths;
    use belljar_client::ready::ReadySocket;

    use super::*;

    fn home() -> (tempfile::TempDir, DaemonPaths, Paths) {
        let home = tempfile::tempdir().unwrap();
        let paths = Paths::under_home(home.path());
        std::fs::create_dir_all(&paths.runtime).unwrap();
        std::fs::create_dir_all(&paths.config).unwrap();
        let daemon = DaemonPaths::resolve(Some(home.path())).unwrap();
        (home, daemon, paths)
    }

    #[test]
    fn no_daemon_and_none_started_is_an_error_at_once() {
        let (_home, daemon, _paths) = home();
        let startup = Startup::default();
        let t = Instant::now();
        let err = startup
            .wait_running(&daemon, Duration::from_secs(30))
            .unwrap_err();
        assert!(matches!(err, DaemonError::NotRunning { .. }), "{err:?}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_start_that_fails_reports_why() {
        let (_home, daemon, _paths) = home();
        let startup = Arc::new(Startup::default());
        startup.starting();
        let s = startup.clone();
        let failer = std::thread::spawn(move || s.finish(Err(StartError::Exited("1".into()))));
        let err = startup
            .wait_running(&daemon, Duration::from_secs(30))
            .unwrap_err();
        failer.join().unwrap();
        assert!(
            matches!(&err, DaemonError::Spawn(why) if why == "belljard exited: 1"),
            "{err:?}"
        );
    }

    #[test]
    fn a_start_that_never_says_ready_times_out() {
        let (_home, daemon, _paths) = home();
        let startup = Startup::default();
        startup.starting();
        let err = startup
            .wait_running(&daemon, Duration::from_millis(100))
            .unwrap_err();
        assert!(matches!(err, DaemonError::Timeout { .. }), "{err:?}");
    }

    /// The whole path: a stand-in daemon listens, writes its port and sends `READY=1` over
    /// the notify protocol; the waiter wakes on the message, then finds it answering.
    #[test]
    fn ready_over_the_notify_socket_wakes_the_waiter() {
        let (_home, daemon, paths) = home();
        let startup = Arc::new(Startup::default());
        startup.starting();
        let ready = ReadySocket::bind(&paths.runtime).unwrap();
        let notify_path = ready.path().to_path_buf();
        let s = startup.clone();
        let watcher = std::thread::spawn(move || {
            let told = ready.wait_blocking(Duration::from_secs(30));
            s.finish(told.map(|_| ()).map_err(StartError::NeverReady));
        });
        let stand_in = {
            let paths = paths.clone();
            std::thread::spawn(move || {
                let listener = std::os::unix::net::UnixListener::bind(paths.socket()).unwrap();
                std::fs::write(paths.port_file(), "7423").unwrap();
                let socket = std::os::unix::net::UnixDatagram::unbound().unwrap();
                socket
                    .send_to(b"READY=1\nMAINPID=1\n", &notify_path)
                    .unwrap();
                // Answers every request `is_running` makes, before and after the wake-up.
                for conn in listener.incoming() {
                    let mut c = conn.unwrap();
                    let mut req = Vec::new();
                    let mut buf = [0u8; 512];
                    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                        let n = c.read(&mut buf).unwrap();
                        if n == 0 {
                            break;
                        }
                        req.extend_from_slice(&buf[..n]);
                    }
                    let _ = c.write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
                    );
                }
            })
        };
        startup
            .wait_running(&daemon, Duration::from_secs(30))
            .unwrap();
        watcher.join().unwrap();
        // The stand-in serves until the test process ends.
        drop(stand_in);
    }
}
