//! The control socket's server side: the daemon pauses, resumes, stops and observes the VM
//! through it. The wire format (JSON lines, requests and responses) is the contract's,
//! `belljar_vmm_api::control`; this module only answers it.

use std::io::{BufReader, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use belljar_vmm_api::control::{
    self as api, ControlError, ErrorCode, MAX_REQUEST_LINE, Request, Response, Status, VmState,
};

use crate::builder::Vmm;

/// Errors starting the control socket.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot listen on control socket {0}
    Listen(String, #[source] std::io::Error),
    /// Cannot start the control thread
    Spawn(#[source] std::io::Error),
}

/// Answers one request.
pub fn handle(vmm: &Vmm, request: Request) -> Response {
    match request {
        Request::Status => Response::Status(Status {
            state: vmm.state(),
            uptime_ms: u64::try_from(vmm.uptime().as_millis()).unwrap_or(u64::MAX),
            exit_reason: vmm.exit_reason(),
        }),
        Request::Metrics => Response::Metrics(vmm.metrics()),
        Request::Pause => match vmm.pause() {
            Ok(()) => Response::State(vmm.state()),
            Err(e) => Response::Error(ControlError::new(ErrorCode::PauseFailed, e)),
        },
        Request::Resume => {
            vmm.resume();
            Response::State(vmm.state())
        }
        Request::Stop => {
            vmm.request_stop();
            Response::State(VmState::Stopping)
        }
    }
}

/// Answers one request line.
pub fn handle_line(vmm: &Vmm, line: &str) -> Response {
    match Request::parse(line) {
        Ok(request) => handle(vmm, request),
        Err(e) => Response::Error(e),
    }
}

fn serve_client(vmm: Arc<Vmm>, stream: UnixStream) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let (response, last) = match api::read_line(&mut reader, MAX_REQUEST_LINE) {
            Ok(None) => return,
            Ok(Some(line)) => (handle_line(&vmm, &line), false),
            // The rest of an overlong line would read as garbage requests: answer and hang up.
            Err(e) => (
                Response::Error(ControlError::new(ErrorCode::BadRequest, e)),
                true,
            ),
        };
        if writer.write_all(response.to_line().as_bytes()).is_err() || last {
            return;
        }
    }
}

/// Listens on `path` and serves clients on background threads; returns the listener's fd
/// (the seccomp filter allows `accept` on it).
pub fn serve(path: &Path, vmm: Arc<Vmm>) -> Result<RawFd, Error> {
    let name = path.display().to_string();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_socket() {
            let _ = std::fs::remove_file(path);
        }
    }
    let listener = UnixListener::bind(path).map_err(|e| Error::Listen(name, e))?;
    let fd = listener.as_raw_fd();
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
        .map(|_: JoinHandle<()>| fd)
        .map_err(Error::Spawn)
}
