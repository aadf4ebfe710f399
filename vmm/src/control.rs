//! The control socket: JSON lines over a Unix socket, one request per line, one response
//! line per request. The daemon uses it to pause, resume, stop and observe the VM.
//!
//! Requests: `{"cmd":"pause"|"resume"|"stop"|"status"|"metrics"}`.
//! Responses: `{"ok":true,...}` or `{"ok":false,"error":{"code":"...","message":"..."}}`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::builder::Vmm;

/// Errors starting the control socket.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot listen on control socket {0}
    Listen(String, #[source] std::io::Error),
    /// Cannot start the control thread
    Spawn(#[source] std::io::Error),
}

/// Longest request line accepted.
const MAX_LINE: usize = 4096;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    cmd: String,
}

fn error(code: &str, message: impl std::fmt::Display) -> Value {
    json!({"ok": false, "error": {"code": code, "message": message.to_string()}})
}

/// Answers one request line.
pub fn handle_line(vmm: &Vmm, line: &str) -> Value {
    let req: Request = match serde_json::from_str(line.trim()) {
        Ok(r) => r,
        Err(e) => return error("bad_request", e),
    };
    match req.cmd.as_str() {
        "status" => json!({
            "ok": true,
            "state": vmm.state(),
            "uptime_ms": u64::try_from(vmm.uptime().as_millis()).unwrap_or(u64::MAX),
            "exit_reason": vmm.exit_reason().map(|r| format!("{r:?}").to_lowercase()),
        }),
        "metrics" => json!({"ok": true, "metrics": vmm.metrics()}),
        "pause" => match vmm.pause() {
            Ok(()) => json!({"ok": true, "state": vmm.state()}),
            Err(e) => error("pause_failed", e),
        },
        "resume" => {
            vmm.resume();
            json!({"ok": true, "state": vmm.state()})
        }
        "stop" => {
            vmm.request_stop();
            json!({"ok": true, "state": "stopping"})
        }
        other => error("unknown_command", format!("Unknown command {other:?}")),
    }
}

fn serve_client(vmm: Arc<Vmm>, stream: UnixStream) {
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let mut writer = write_half;
    let mut reader = BufReader::new(stream).take_lines();
    while let Some(line) = reader.next_line() {
        let response = match line {
            Ok(l) => handle_line(&vmm, &l),
            Err(msg) => error("bad_request", msg),
        };
        let mut out = response.to_string();
        out.push('\n');
        if writer.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}

/// Line reader with a length limit.
struct Lines<R> {
    inner: R,
}

trait TakeLines: Sized {
    fn take_lines(self) -> Lines<Self>;
}

impl<R: BufRead> TakeLines for R {
    fn take_lines(self) -> Lines<Self> {
        Lines { inner: self }
    }
}

impl<R: BufRead> Lines<R> {
    fn next_line(&mut self) -> Option<Result<String, &'static str>> {
        let mut buf = Vec::new();
        let n = std::io::Read::take(&mut self.inner, MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut buf)
            .ok()?;
        if n == 0 {
            return None;
        }
        if buf.last() != Some(&b'\n') && buf.len() > MAX_LINE {
            return Some(Err("Request line too long"));
        }
        Some(String::from_utf8(buf).map_err(|_| "Request is not UTF-8"))
    }
}

/// Listens on `path` and serves clients on background threads.
pub fn serve(path: &Path, vmm: Arc<Vmm>) -> Result<JoinHandle<()>, Error> {
    let name = path.display().to_string();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_socket() {
            let _ = std::fs::remove_file(path);
        }
    }
    let listener = UnixListener::bind(path).map_err(|e| Error::Listen(name, e))?;
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let vmm = vmm.clone();
                let _ = std::thread::Builder::new()
                    .name("control-client".into())
                    .spawn(move || serve_client(vmm, stream));
            }
        })
        .map_err(Error::Spawn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_refused() {
        let data = vec![b'x'; MAX_LINE + 10];
        let mut lines = std::io::Cursor::new(data).take_lines();
        assert!(matches!(lines.next_line(), Some(Err(_))));
    }

    #[test]
    fn lines_are_split() {
        let mut lines = std::io::Cursor::new(b"{\"cmd\":\"a\"}\n{}\n".to_vec()).take_lines();
        assert_eq!(lines.next_line().unwrap().unwrap(), "{\"cmd\":\"a\"}\n");
        assert_eq!(lines.next_line().unwrap().unwrap(), "{}\n");
        assert!(lines.next_line().is_none());
    }
}
