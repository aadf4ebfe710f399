//! An async client for the agent's routes, so that the daemon and the agent's own tests drive
//! the agent through the same code: one HTTP/2 connection (Unix socket or the VMM's hybrid
//! vsock socket), typed calls for the JSON routes and streams for the byte and NDJSON routes.
//! The file routes are in [`files`].

mod commands;
mod files;

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, BodyStream, Empty, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http2::SendRequest;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::{
    AgentInfo, CommandInfo, ErrorBody, FileEntry, FileListPage, Followed, Metrics, MkdirRequest,
    MoveRequest, OutputLine, PtySize, RemoveRequest, ShutdownAction, ShutdownRequest,
    SignalRequest, StartCommand, WatchEvent, query,
};

/// The body type of every request the client sends.
pub type RequestBody = UnsyncBoxBody<Bytes, io::Error>;

/// A streamed response body.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, ClientError>> + Send>>;

/// A stream of parsed NDJSON values.
pub type JsonStream<T> = Pin<Box<dyn Stream<Item = Result<T, ClientError>> + Send>>;

/// Longest NDJSON line the client accepts; the agent's lines are far shorter.
const MAX_LINE: usize = 16 << 20;

/// Largest JSON answer the client buffers. The agent is inside the sandbox and may be hostile:
/// nothing it sends is read into memory without a bound.
pub const MAX_JSON_BODY: usize = 8 << 20;

/// Largest error body read; an error message is cut to [`MAX_ERROR_MESSAGE`] bytes.
const MAX_ERROR_BODY: usize = 64 << 10;

/// Longest error message passed on from the agent.
pub const MAX_ERROR_MESSAGE: usize = 1024;

/// How long the agent may take to answer a call (headers, and the whole body of a JSON
/// answer). Long polls (`wait_command`) and streams are exempt: their bodies are bounded in
/// size or consumed as streams by callers that hold their own deadlines.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The agent answered with an error body.
    #[error("Agent error {code} ({status}): {message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// The HTTP/2 connection failed.
    #[error("Agent connection failed")]
    Http(#[from] hyper::Error),
    /// A request could not be built.
    #[error("Bad request")]
    Request(#[from] hyper::http::Error),
    /// Reading or writing the transport failed.
    #[error("Agent transport I/O failed")]
    Io(#[from] io::Error),
    /// The agent sent JSON the client does not understand.
    #[error("Bad JSON from the agent")]
    Json(#[from] serde_json::Error),
    /// The hybrid vsock socket refused the connection.
    #[error("Hybrid vsock handshake failed: {0}")]
    Handshake(String),
    /// The agent's answer is not what the route promises.
    #[error("Unexpected answer from the agent: {0}")]
    Protocol(&'static str),
    /// An NDJSON line exceeded the client's bound.
    #[error("NDJSON line too long")]
    LineTooLong,
    /// An answer's body exceeded the client's bound.
    #[error("The agent's answer exceeds {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// The agent did not answer in time.
    #[error("The agent did not answer within {0:?}")]
    Timeout(Duration),
    /// The socket at the agent's address is not a socket (it was replaced by something else).
    #[error("{0} is not a socket")]
    NotASocket(String),
}

impl ClientError {
    /// The agent's stable error code, when the agent answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// A body from bytes in memory.
pub fn body_from_bytes(bytes: impl Into<Bytes>) -> RequestBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A streamed body from a stream of chunks.
pub fn body_from_stream<S>(stream: S) -> RequestBody
where
    S: Stream<Item = Result<Bytes, io::Error>> + Send + 'static,
{
    StreamBody::new(stream.map_ok(Frame::data)).boxed_unsync()
}

/// A streamed body read from `reader` in 64 KiB chunks.
pub fn body_from_reader<R>(reader: R) -> RequestBody
where
    R: AsyncRead + Send + Unpin + 'static,
{
    body_from_stream(tokio_util::io::ReaderStream::with_capacity(
        reader,
        64 * 1024,
    ))
}

fn empty_body() -> RequestBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// One connection to an agent. Cheap to clone; clones share the connection.
#[derive(Clone, Debug)]
pub struct AgentClient {
    sender: SendRequest<RequestBody>,
    /// The deadline of one call; [`CALL_TIMEOUT`] unless changed.
    timeout: Duration,
}

impl AgentClient {
    /// Connects to an agent listening on a Unix socket (the namespace backend, tests).
    /// The socket is opened without following a symbolic link (see [`connect_socket`]).
    pub async fn connect_unix(path: impl AsRef<Path>) -> Result<Self, ClientError> {
        let stream = connect_socket(path.as_ref()).await?;
        Self::handshake(stream).await
    }

    /// Connects through a VMM's hybrid vsock socket: `CONNECT <port>\n`, `OK <n>\n`, then HTTP/2.
    pub async fn connect_hybrid_vsock(
        path: impl AsRef<Path>,
        port: u32,
    ) -> Result<Self, ClientError> {
        let mut stream = connect_socket(path.as_ref()).await?;
        stream
            .write_all(format!("CONNECT {port}\n").as_bytes())
            .await?;
        // Byte by byte, so that no HTTP/2 byte after the reply line is consumed here.
        let mut line = Vec::new();
        loop {
            let mut byte = [0u8; 1];
            if stream.read(&mut byte).await? == 0 {
                return Err(ClientError::Handshake("connection closed".into()));
            }
            if byte[0] == b'\n' {
                break;
            }
            line.push(byte[0]);
            if line.len() > 256 {
                return Err(ClientError::Handshake("reply line too long".into()));
            }
        }
        let line = String::from_utf8_lossy(&line).into_owned();
        if !line.starts_with("OK ") {
            return Err(ClientError::Handshake(line));
        }
        Self::handshake(stream).await
    }

    /// Speaks HTTP/2 over an already connected byte stream.
    pub async fn handshake<IO>(io: IO) -> Result<Self, ClientError>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(1 << 20)
            .initial_connection_window_size(16 << 20)
            .max_frame_size(crate::MAX_FRAME)
            .max_send_buf_size(crate::MAX_FRAME as usize)
            .max_concurrent_reset_streams(1024)
            .handshake(TokioIo::new(io))
            .await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self {
            sender,
            timeout: CALL_TIMEOUT,
        })
    }

    /// The same connection with another deadline for each call.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sends a request and waits up to the call timeout for the answer's headers.
    async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: RequestBody,
    ) -> Result<Response<Incoming>, ClientError> {
        within(
            self.timeout,
            self.send_untimed(method, path, content_type, body),
        )
        .await
    }

    async fn send_untimed(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: RequestBody,
    ) -> Result<Response<Incoming>, ClientError> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://agent{path}"));
        if let Some(ct) = content_type {
            req = req.header(hyper::header::CONTENT_TYPE, ct);
        }
        let req = req.body(body)?;
        let mut sender = self.sender.clone();
        sender.ready().await?;
        let resp = sender.send_request(req).await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(error_from(resp).await)
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        within(self.timeout, async {
            let resp = self.send_json(method, path, body).await?;
            json_body(resp).await
        })
        .await
    }

    async fn send_json(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<Response<Incoming>, ClientError> {
        match body {
            Some(body) => {
                let bytes = serde_json::to_vec(body)?;
                self.send(
                    method,
                    path,
                    Some("application/json"),
                    body_from_bytes(bytes),
                )
                .await
            }
            None => self.send(method, path, None, empty_body()).await,
        }
    }

    async fn no_content(
        &self,
        method: Method,
        path: &str,
        body: &impl Serialize,
    ) -> Result<(), ClientError> {
        let resp = self.send_json(method, path, Some(body)).await?;
        drain(resp).await
    }

    /// `GET /v1/health`.
    pub async fn health(&self) -> Result<AgentInfo, ClientError> {
        self.json(Method::GET, "/v1/health", None::<&()>).await
    }

    /// `GET /v1/metrics`.
    pub async fn metrics(&self) -> Result<Metrics, ClientError> {
        self.json(Method::GET, "/v1/metrics", None::<&()>).await
    }

    /// `POST /v1/shutdown`.
    pub async fn shutdown(&self, action: ShutdownAction) -> Result<(), ClientError> {
        self.no_content(Method::POST, "/v1/shutdown", &ShutdownRequest { action })
            .await
    }
}

/// Runs `call` with a deadline.
async fn within<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or(Err(ClientError::Timeout(limit)))
}

/// The whole body, or an error once it passes `limit` bytes.
async fn bounded(resp: Response<Incoming>, limit: usize) -> Result<Bytes, ClientError> {
    match Limited::new(resp.into_body(), limit).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(e) => match e.downcast::<hyper::Error>() {
            Ok(e) => Err(ClientError::Http(*e)),
            Err(_) => Err(ClientError::BodyTooLarge { limit }),
        },
    }
}

async fn json_body<T: DeserializeOwned>(resp: Response<Incoming>) -> Result<T, ClientError> {
    let bytes = bounded(resp, MAX_JSON_BODY).await?;
    Ok(serde_json::from_slice(&bytes)?)
}

/// Reads and drops an answer the caller has no use for (bounded all the same).
async fn drain(resp: Response<Incoming>) -> Result<(), ClientError> {
    bounded(resp, MAX_JSON_BODY).await.map(drop)
}

async fn error_from(resp: Response<Incoming>) -> ClientError {
    let status = resp.status();
    let bytes = match bounded(resp, MAX_ERROR_BODY).await {
        Ok(bytes) => bytes,
        Err(e) => return e,
    };
    match serde_json::from_slice::<ErrorBody>(&bytes) {
        Ok(body) => ClientError::Api {
            status: status.as_u16(),
            code: body.error.code,
            message: cut(&body.error.message),
        },
        Err(_) => ClientError::Api {
            status: status.as_u16(),
            code: fallback_code(status).to_owned(),
            message: cut(&String::from_utf8_lossy(&bytes)),
        },
    }
}

/// `text` cut to at most [`MAX_ERROR_MESSAGE`] bytes, on a character boundary.
fn cut(text: &str) -> String {
    let mut end = text.len().min(MAX_ERROR_MESSAGE);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// Connects to the Unix socket at `path` without following a symbolic link in its last
/// component, and only if what is there is a socket. The directory holding an agent's socket
/// may be reachable by a sandbox (an older layout, a bug): a link planted there must never make
/// the daemon talk to another sandbox or a host service.
pub async fn connect_socket(path: &Path) -> Result<UnixStream, ClientError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let target = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    if !target.metadata()?.file_type().is_socket() {
        return Err(ClientError::NotASocket(path.display().to_string()));
    }
    // Connecting through the descriptor's magic link reaches the very inode checked above.
    let through = format!("/proc/self/fd/{}", target.as_raw_fd());
    let stream = UnixStream::connect(&through).await?;
    drop(target);
    Ok(stream)
}

fn fallback_code(status: StatusCode) -> &'static str {
    match status {
        StatusCode::NOT_FOUND => crate::codes::NOT_FOUND,
        StatusCode::BAD_REQUEST => crate::codes::BAD_REQUEST,
        _ => crate::codes::INTERNAL,
    }
}

fn body_stream(resp: Response<Incoming>) -> ByteStream {
    Box::pin(
        BodyStream::new(resp.into_body())
            .try_filter_map(|frame| async move { Ok(frame.into_data().ok()) })
            .map_err(ClientError::from),
    )
}

/// Splits a byte stream into NDJSON lines and parses each one.
pub fn ndjson<T: DeserializeOwned + Send + 'static>(bytes: ByteStream) -> JsonStream<T> {
    struct State {
        bytes: ByteStream,
        buf: Vec<u8>,
        /// How much of `buf` is known to hold no newline, so a long line is scanned once.
        scanned: usize,
        done: bool,
    }
    let state = State {
        bytes,
        buf: Vec::new(),
        scanned: 0,
        done: false,
    };
    Box::pin(futures::stream::try_unfold(state, |mut st| async move {
        loop {
            let start = st.scanned.min(st.buf.len());
            let newline = st.buf[start..].iter().position(|&b| b == b'\n');
            st.scanned = st.buf.len();
            if let Some(nl) = newline.map(|i| start + i) {
                // What follows the line has not been scanned yet.
                st.scanned = 0;
                let line: Vec<u8> = st.buf.drain(..=nl).collect();
                let line = &line[..line.len() - 1];
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let value = serde_json::from_slice(line)?;
                return Ok(Some((value, st)));
            }
            if st.done {
                if st.buf.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                let value = serde_json::from_slice(&std::mem::take(&mut st.buf))?;
                return Ok(Some((value, st)));
            }
            match st.bytes.next().await {
                Some(chunk) => {
                    st.buf.extend_from_slice(&chunk?);
                    if st.buf.len() > MAX_LINE {
                        return Err(ClientError::LineTooLong);
                    }
                }
                None => st.done = true,
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Stream as OutStream;

    #[tokio::test]
    async fn ndjson_splits_lines_across_chunks() {
        let chunks: Vec<Result<Bytes, ClientError>> = vec![
            Ok(Bytes::from_static(
                b"{\"stream\":\"stdout\",\"data\":\"a\",",
            )),
            Ok(Bytes::from_static(b"\"ts\":1}\n\n{\"stream\":\"stderr\",")),
            Ok(Bytes::from_static(b"\"data\":\"b\",\"ts\":2}")),
        ];
        let lines: Vec<OutputLine> = ndjson(Box::pin(futures::stream::iter(chunks)))
            .try_collect()
            .await
            .unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].data.as_deref(), Some("a"));
        assert_eq!(lines[1].stream, OutStream::Stderr);
    }

    #[tokio::test]
    async fn hybrid_vsock_handshake_rejects_refusal() {
        let dir = std::env::temp_dir().join(format!("belljar-proto-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("v.sock");
        let _ = std::fs::remove_file(&sock);
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 13];
            s.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"CONNECT 1024\n");
            s.write_all(b"NO\n").await.unwrap();
        });
        let err = AgentClient::connect_hybrid_vsock(&sock, 1024)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ClientError::Handshake(ref l) if l == "NO"),
            "{err:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
