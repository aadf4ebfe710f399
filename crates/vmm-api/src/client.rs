//! A small synchronous client of the control socket, for the daemon, tests and benchmarks.
//!
//! Each call writes one request line and reads one response line with a deadline, and
//! checks that the answer is the kind the request asks for, so callers get typed values.

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::control::{
    self, ControlError, LineError, MAX_RESPONSE_LINE, Request, Response, SNAPSHOT_MEMORY_FILE,
    SNAPSHOT_STATE_FILE, SnapshotTaken, Status, VmState,
};
use crate::metrics::Metrics;

/// Errors talking to a VMM.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum ClientError {
    /// Cannot connect to the VMM's control socket {0}
    Connect(String, #[source] std::io::Error),
    /// Cannot talk to the VMM
    Io(#[from] std::io::Error),
    /// Bad response line from the VMM
    Line(#[from] LineError),
    /// The VMM closed the control connection
    Closed,
    /// The VMM's response is not valid
    Parse(#[source] serde_json::Error),
    /// The VMM refused {request}
    Refused {
        request: &'static str,
        #[source]
        error: ControlError,
    },
    /// The VMM answered {request} with something else
    Unexpected { request: &'static str },
}

/// One connection to a VMM's control socket.
pub struct ControlClient {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
}

impl ControlClient {
    /// Connects; every later read and write gives up after `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(path)
            .map_err(|e| ClientError::Connect(path.display().to_string(), e))?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Self {
            writer: stream.try_clone()?,
            reader: BufReader::new(stream),
        })
    }

    /// Sends `request` and returns the VMM's response as it is (an error answer included).
    pub fn call(&mut self, request: Request) -> Result<Response, ClientError> {
        self.writer.write_all(request.to_line().as_bytes())?;
        let line =
            control::read_line(&mut self.reader, MAX_RESPONSE_LINE)?.ok_or(ClientError::Closed)?;
        serde_json::from_str(&line).map_err(ClientError::Parse)
    }

    /// `call`, with an error answer turned into `Err`.
    fn expect(&mut self, request: Request) -> Result<Response, ClientError> {
        match self.call(request)? {
            Response::Error(error) => Err(ClientError::Refused {
                request: request.name(),
                error,
            }),
            other => Ok(other),
        }
    }

    fn state(&mut self, request: Request) -> Result<VmState, ClientError> {
        match self.expect(request)? {
            Response::State(s) => Ok(s),
            _ => Err(ClientError::Unexpected {
                request: request.name(),
            }),
        }
    }

    pub fn status(&mut self) -> Result<Status, ClientError> {
        match self.expect(Request::Status)? {
            Response::Status(s) => Ok(s),
            _ => Err(ClientError::Unexpected { request: "status" }),
        }
    }

    /// Pauses every vCPU; returns once they are paused.
    pub fn pause(&mut self) -> Result<VmState, ClientError> {
        self.state(Request::Pause)
    }

    pub fn resume(&mut self) -> Result<VmState, ClientError> {
        self.state(Request::Resume)
    }

    /// Asks the VMM to stop; it exits with status 0 soon after answering.
    pub fn stop(&mut self) -> Result<VmState, ClientError> {
        self.state(Request::Stop)
    }

    pub fn metrics(&mut self) -> Result<Metrics, ClientError> {
        match self.expect(Request::Metrics)? {
            Response::Metrics(m) => Ok(m),
            _ => Err(ClientError::Unexpected { request: "metrics" }),
        }
    }

    /// Snapshots the VM into `dir` (created if missing; its snapshot files must not exist
    /// yet). The VMM writes into files this process opens and passes along with the request,
    /// so it needs no right to open files itself. Give the call a timeout that covers
    /// writing guest memory.
    pub fn snapshot(&mut self, dir: &Path) -> Result<SnapshotTaken, ClientError> {
        use std::fs::{File, OpenOptions};
        use std::mem::MaybeUninit;
        use std::os::fd::AsFd;

        std::fs::create_dir_all(dir)?;
        let create = |name: &str| -> std::io::Result<File> {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(dir.join(name))
        };
        let state = create(SNAPSHOT_STATE_FILE)?;
        let memory = create(SNAPSHOT_MEMORY_FILE)?;
        let line = Request::Snapshot.to_line();
        let fds = [state.as_fd(), memory.as_fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
        control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds));
        let sent = rustix::net::sendmsg(
            &self.writer,
            &[std::io::IoSlice::new(line.as_bytes())],
            &mut control,
            rustix::net::SendFlags::NOSIGNAL,
        )
        .map_err(std::io::Error::from)?;
        // The fds went with the first byte; the rest of a short send is plain bytes.
        self.writer.write_all(&line.as_bytes()[sent..])?;
        let line =
            control::read_line(&mut self.reader, MAX_RESPONSE_LINE)?.ok_or(ClientError::Closed)?;
        match serde_json::from_str(&line).map_err(ClientError::Parse)? {
            Response::Snapshot(taken) => Ok(taken),
            Response::Error(error) => Err(ClientError::Refused {
                request: "snapshot",
                error,
            }),
            _ => Err(ClientError::Unexpected {
                request: "snapshot",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::ErrorCode;
    use std::io::BufRead;
    use std::os::unix::net::UnixListener;

    /// A stand-in VMM that answers each request line with the next canned line.
    fn serve(answers: Vec<&'static str>) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmm.sock");
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut w = stream.try_clone().unwrap();
            let mut r = BufReader::new(stream);
            for a in answers {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap() == 0 {
                    return;
                }
                w.write_all(a.as_bytes()).unwrap();
            }
        });
        (dir, path)
    }

    #[test]
    fn typed_calls_check_the_kind_of_answer() {
        let (_d, path) = serve(vec![
            "{\"state\":\"paused\"}\n",
            "{\"metrics\":{\"vcpus\":[],\"unknown_pio\":0,\"unknown_mmio\":0,\"devices\":[],\"rss_bytes\":1,\"guest_memory_bytes\":2}}\n",
            "{\"state\":\"running\"}\n",
            "{\"error\":{\"code\":\"pause_failed\",\"message\":\"Timed out\"}}\n",
            "{\"ok\":true}\n",
        ]);
        let mut c = ControlClient::connect(&path, Duration::from_secs(5)).unwrap();
        assert_eq!(c.pause().unwrap(), VmState::Paused);
        assert_eq!(c.metrics().unwrap().guest_memory_bytes, 2);
        assert!(matches!(
            c.status(),
            Err(ClientError::Unexpected { request: "status" })
        ));
        match c.pause() {
            Err(ClientError::Refused { request, error }) => {
                assert_eq!(request, "pause");
                assert_eq!(error.code, ErrorCode::PauseFailed);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(c.stop(), Err(ClientError::Parse(_))));
        // The stand-in hung up: the write fails (EPIPE), or the read sees the end of the
        // stream, or (when the stand-in closed with our request unread) ECONNRESET.
        let after = c.stop();
        assert!(
            matches!(
                after,
                Err(ClientError::Closed | ClientError::Io(_) | ClientError::Line(LineError::Io(_)))
            ),
            "{after:?}"
        );
    }

    #[test]
    fn a_silent_vmm_times_out_and_a_missing_one_fails_to_connect() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmm.sock");
        let err = ControlClient::connect(&path, Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(matches!(err, ClientError::Connect(..)));
        assert!(err.to_string().contains("vmm.sock"));
        let _listener = UnixListener::bind(&path).unwrap();
        let mut c = ControlClient::connect(&path, Duration::from_millis(100)).unwrap();
        let t = std::time::Instant::now();
        assert!(matches!(
            c.status(),
            Err(ClientError::Line(LineError::Io(_)))
        ));
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
