//! A started daemon says when it is ready, and whoever started it waits for that message
//! instead of polling for files: systemd's notify protocol. `NOTIFY_SOCKET` names a datagram
//! socket; the daemon sends `READY=1` (and its `MAINPID`) once it listens. `belljar`'s
//! launcher and the tests use it, and the same `belljard` runs unchanged under a systemd unit
//! of `Type=notify`. Both ends live here, so there is one copy of the protocol.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The environment variable that carries the socket's path (`@name`: an abstract socket).
pub const ENV: &str = "NOTIFY_SOCKET";

/// The daemon's side: tells whoever started it that it is ready. `Ok(false)` when nobody
/// asked (`NOTIFY_SOCKET` unset).
pub fn notify_ready() -> io::Result<bool> {
    let Some(target) = std::env::var_os(ENV).filter(|t| !t.is_empty()) else {
        return Ok(false);
    };
    let message = format!("READY=1\nMAINPID={}\n", std::process::id());
    let socket = UnixDatagram::unbound()?;
    match target.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(message.as_bytes(), &addr)?;
        }
        None => {
            socket.send_to(message.as_bytes(), Path::new(&target))?;
        }
    }
    Ok(true)
}

/// The starter's side: a socket, private to this process, to receive the message on.
#[derive(Debug)]
pub struct ReadySocket {
    socket: UnixDatagram,
    path: PathBuf,
}

impl ReadySocket {
    /// Binds a fresh socket in `dir` (which must exist).
    pub fn bind(dir: &Path) -> io::Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("ready-{}-{n}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let socket = UnixDatagram::bind(&path)?;
        Ok(Self { socket, path })
    }

    /// The value for the daemon's `NOTIFY_SOCKET`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits up to `timeout` for `READY=1`; returns the daemon's `MAINPID` when it sent one.
    pub fn wait_blocking(&self, timeout: Duration) -> io::Result<Option<u32>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut buf = [0u8; 512];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.socket.set_read_timeout(Some(left))?;
            let n = match self.socket.recv(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                other => other?,
            };
            if let Some(pid) = parse(&buf[..n]) {
                return Ok(pid);
            }
        }
    }

    /// Waits for `READY=1`; returns the daemon's `MAINPID` when it sent one. (Use this or
    /// [`Self::wait_blocking`], not both.)
    pub async fn wait(&self) -> io::Result<Option<u32>> {
        // The clone shares the open file: after this, the socket stays non-blocking.
        let clone = self.socket.try_clone()?;
        clone.set_nonblocking(true)?;
        let socket = tokio::net::UnixDatagram::from_std(clone)?;
        let mut buf = [0u8; 512];
        loop {
            let n = socket.recv(&mut buf).await?;
            if let Some(pid) = parse(&buf[..n]) {
                return Ok(pid);
            }
        }
    }
}

impl Drop for ReadySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `Some(MAINPID)` for a message that says `READY=1`; other messages (`STATUS=…`) are `None`.
fn parse(message: &[u8]) -> Option<Option<u32>> {
    let text = String::from_utf8_lossy(message);
    let mut lines = text.lines();
    if !lines.clone().any(|l| l == "READY=1") {
        return None;
    }
    Some(lines.find_map(|l| l.strip_prefix("MAINPID=")?.parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ready_and_the_pid() {
        assert_eq!(parse(b"READY=1\nMAINPID=42\n"), Some(Some(42)));
        assert_eq!(parse(b"MAINPID=42\nREADY=1"), Some(Some(42)));
        assert_eq!(parse(b"READY=1"), Some(None));
        assert_eq!(parse(b"STATUS=starting\n"), None);
        assert_eq!(parse(b"READY=10\n"), None);
    }

    #[test]
    fn a_message_sent_to_the_socket_is_received() {
        let dir = tempfile::tempdir().unwrap();
        let ready = ReadySocket::bind(dir.path()).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        sender.send_to(b"STATUS=busy\n", ready.path()).unwrap();
        sender
            .send_to(b"READY=1\nMAINPID=7\n", ready.path())
            .unwrap();
        assert_eq!(
            ready.wait_blocking(Duration::from_secs(5)).unwrap(),
            Some(7)
        );
        let path = ready.path().to_owned();
        drop(ready);
        assert!(!path.exists());
    }

    #[test]
    fn silence_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let ready = ReadySocket::bind(dir.path()).unwrap();
        let err = ready.wait_blocking(Duration::from_millis(50)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
