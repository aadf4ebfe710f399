//! The control socket's server side: the daemon pauses, resumes, stops and observes the VM
//! through it. The wire format (JSON lines, requests and responses) is the contract's,
//! `belljar_vmm_api::control`; this module only answers it.

use std::io::{BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use belljar_vmm_api::control::{
    self as api, ControlError, ErrorCode, MAX_REQUEST_LINE, Request, Response, SnapshotTaken,
    Status, VmState,
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

/// Answers one request; `fds` are the files that came with it (only `snapshot` takes any).
pub fn handle(vmm: &Vmm, request: Request, fds: Vec<OwnedFd>) -> Response {
    if request != Request::Snapshot && !fds.is_empty() {
        return Response::Error(ControlError::new(
            ErrorCode::BadRequest,
            format!("{} takes no files", request.name()),
        ));
    }
    match request {
        Request::Snapshot => snapshot(vmm, fds),
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

/// `snapshot`: the state file and the memory file, in that order.
fn snapshot(vmm: &Vmm, fds: Vec<OwnedFd>) -> Response {
    let Ok([state, memory]) = <[OwnedFd; 2]>::try_from(fds) else {
        return Response::Error(ControlError::new(
            ErrorCode::SnapshotFailed,
            "Snapshot needs two files (state, memory) sent with the request",
        ));
    };
    match vmm.snapshot_to(&state.into(), &memory.into()) {
        Ok(info) => Response::Snapshot(SnapshotTaken {
            state_bytes: info.state_bytes,
            memory_bytes: info.memory_bytes,
            elapsed_ms: u64::try_from(info.elapsed.as_millis()).unwrap_or(u64::MAX),
        }),
        Err(e) => Response::Error(ControlError::new(
            ErrorCode::SnapshotFailed,
            format!("{} ({})", error_chain(&e), e.code()),
        )),
    }
}

/// An error and its sources, for a message that crosses the process boundary.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Answers one request line.
pub fn handle_line(vmm: &Vmm, line: &str, fds: Vec<OwnedFd>) -> Response {
    match Request::parse(line) {
        Ok(request) => handle(vmm, request, fds),
        Err(e) => Response::Error(e),
    }
}

/// The client's bytes, with the files passed along with them (`SCM_RIGHTS`) kept aside.
struct FdReader {
    stream: UnixStream,
    fds: Vec<OwnedFd>,
}

/// Most files one request may carry; more are closed and the request refused.
const MAX_FDS: usize = 4;

impl Read for FdReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = recvmsg(
            &self.stream,
            &mut [std::io::IoSliceMut::new(buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = msg {
                self.fds.extend(fds);
            }
        }
        Ok(got.bytes)
    }
}

fn serve_client(vmm: Arc<Vmm>, stream: UnixStream) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(FdReader {
        stream,
        fds: Vec::new(),
    });
    loop {
        let (response, last) = match api::read_line(&mut reader, MAX_REQUEST_LINE) {
            Ok(None) => return,
            Ok(Some(line)) => {
                // Files arrive with the first byte of their request; a line is one request.
                let fds = std::mem::take(&mut reader.get_mut().fds);
                (handle_line(&vmm, &line, fds), false)
            }
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
