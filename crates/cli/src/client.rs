//! HTTP/1.1 and WebSocket client for the daemon's API, over its Unix socket (no token needed)
//! or over 127.0.0.1 with the bearer token.
//!
//! One connection per request keeps the client simple and has no pool to go stale across a
//! daemon restart; on a Unix socket a connection costs microseconds.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use belljar_api::ErrorBody;
use bytes::Bytes;
use futures::{Stream, TryStreamExt};
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The error of a streamed request body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Any request body: empty, in memory, or streamed from a file or a tar builder.
pub type Body = BoxBody<Bytes, BoxError>;

/// A WebSocket to the daemon (terminal, watch, events).
pub type WebSocket = WebSocketStream<Conn>;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon is not reachable.
    #[error("Cannot connect to the daemon at {at}: {source}")]
    Connect { at: String, source: io::Error },
    /// The HTTP exchange failed mid-way.
    #[error("HTTP exchange with the daemon failed: {0}")]
    Http(#[from] hyper::Error),
    /// The WebSocket handshake or a frame failed.
    #[error("WebSocket to the daemon failed: {0}")]
    WebSocket(Box<tokio_tungstenite::tungstenite::Error>),
    /// The daemon answered with an error.
    #[error("{message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// The daemon's answer is not what the API promises.
    #[error("Unexpected answer from the daemon ({what}): {source}")]
    Decode {
        what: String,
        source: serde_json::Error,
    },
    /// Building the request failed (a bad path or header).
    #[error("Invalid request: {0}")]
    Request(#[from] http::Error),
}

impl From<tokio_tungstenite::tungstenite::Error> for ClientError {
    fn from(e: tokio_tungstenite::tungstenite::Error) -> Self {
        Self::WebSocket(Box::new(e))
    }
}

impl ClientError {
    /// The stable code printed after the message: the daemon's code, or a local one.
    pub fn code(&self) -> &str {
        match self {
            Self::Api { code, .. } => code,
            Self::Connect { .. } => "daemon_unavailable",
            Self::Http(_) | Self::WebSocket(_) => "connection_lost",
            Self::Decode { .. } => "bad_response",
            Self::Request(_) => "bad_request",
        }
    }

    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// How the client reaches the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Unix(PathBuf),
    Tcp {
        addr: SocketAddr,
        token: Option<String>,
    },
}

/// A client of one daemon.
#[derive(Debug, Clone)]
pub struct Client {
    transport: Transport,
}

/// A connected stream to the daemon, Unix or TCP.
pub enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_flush(cx),
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// An empty request body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// A request body held in memory.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A request body streamed chunk by chunk.
pub fn streamed<S>(stream: S) -> Body
where
    S: Stream<Item = io::Result<Bytes>> + Send + Sync + 'static,
{
    let frames = stream
        .map_ok(Frame::data)
        .map_err(|e| Box::new(e) as BoxError);
    BodyExt::boxed(StreamBody::new(frames))
}

/// A JSON request body.
pub fn json<T: Serialize>(value: &T) -> Body {
    full(serde_json::to_vec(value).expect("API types always serialize"))
}

impl Client {
    pub fn unix(socket: impl Into<PathBuf>) -> Self {
        Self {
            transport: Transport::Unix(socket.into()),
        }
    }

    pub fn tcp(addr: SocketAddr, token: Option<String>) -> Self {
        Self {
            transport: Transport::Tcp { addr, token },
        }
    }

    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// The socket path, when talking over a Unix socket.
    pub fn socket(&self) -> Option<&Path> {
        match &self.transport {
            Transport::Unix(p) => Some(p),
            Transport::Tcp { .. } => None,
        }
    }

    async fn connect(&self) -> Result<Conn, ClientError> {
        match &self.transport {
            Transport::Unix(path) => {
                UnixStream::connect(path)
                    .await
                    .map(Conn::Unix)
                    .map_err(|source| ClientError::Connect {
                        at: path.display().to_string(),
                        source,
                    })
            }
            Transport::Tcp { addr, .. } => TcpStream::connect(addr)
                .await
                .map(|s| {
                    let _ = s.set_nodelay(true);
                    Conn::Tcp(s)
                })
                .map_err(|source| ClientError::Connect {
                    at: addr.to_string(),
                    source,
                }),
        }
    }

    fn host(&self) -> String {
        match &self.transport {
            Transport::Unix(_) => "localhost".to_string(),
            Transport::Tcp { addr, .. } => addr.to_string(),
        }
    }

    /// A request builder with `Host` and, over TCP, the bearer token already set.
    pub fn builder(&self, method: Method, path: &str) -> http::request::Builder {
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, self.host());
        if let Transport::Tcp {
            token: Some(token), ..
        } = &self.transport
        {
            b = b.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        b
    }

    /// Sends a request as is and returns whatever the daemon answers, error statuses included.
    pub async fn send(&self, req: Request<Body>) -> Result<Response<Incoming>, ClientError> {
        let io = TokioIo::new(self.connect().await?);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender.send_request(req).await?)
    }

    /// Sends a request and turns an error status into [`ClientError::Api`].
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Body,
        content_type: Option<&str>,
    ) -> Result<Response<Incoming>, ClientError> {
        let mut b = self.builder(method, path);
        if let Some(ct) = content_type {
            b = b.header(header::CONTENT_TYPE, ct);
        }
        let resp = self.send(b.body(body)?).await?;
        check(resp).await
    }

    /// `GET path` decoded from JSON.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let resp = self.request(Method::GET, path, empty(), None).await?;
        decode(resp, path).await
    }

    /// `method path` with a JSON body, decoded from JSON.
    pub async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let resp = self
            .request(method, path, json(body), Some("application/json"))
            .await?;
        decode(resp, path).await
    }

    /// `method path` without a body, decoded from JSON.
    pub async fn call_empty<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
    ) -> Result<T, ClientError> {
        let resp = self.request(method, path, empty(), None).await?;
        decode(resp, path).await
    }

    /// `method path` whose answer has no body worth reading (204).
    pub async fn call_no_content(
        &self,
        method: Method,
        path: &str,
        body: Body,
        content_type: Option<&str>,
    ) -> Result<(), ClientError> {
        let resp = self.request(method, path, body, content_type).await?;
        resp.into_body().collect().await?;
        Ok(())
    }

    /// Opens a WebSocket on `path` (with the query string).
    pub async fn websocket(&self, path: &str) -> Result<WebSocket, ClientError> {
        let conn = self.connect().await?;
        let mut req = format!("ws://{}{}", self.host(), path).into_client_request()?;
        if let Transport::Tcp {
            token: Some(token), ..
        } = &self.transport
        {
            let value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|e| ClientError::Request(e.into()))?;
            req.headers_mut().insert(header::AUTHORIZATION, value);
        }
        match tokio_tungstenite::client_async(req, conn).await {
            Ok((ws, _)) => Ok(ws),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                let status = resp.status();
                let body = resp.body().clone().unwrap_or_default();
                Err(api_error(status, &body))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Passes a success through; turns an error status into [`ClientError::Api`].
pub async fn check(resp: Response<Incoming>) -> Result<Response<Incoming>, ClientError> {
    if resp.status().is_success() || resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        return Ok(resp);
    }
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Err(api_error(status, &body))
}

/// The error the daemon sent, or a generic one naming the status.
pub fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => ClientError::Api {
            status: status.as_u16(),
            code: e.error.code.to_string(),
            message: e.error.message,
        },
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            ClientError::Api {
                status: status.as_u16(),
                code: format!("http_{}", status.as_u16()),
                message: if text.is_empty() {
                    status.canonical_reason().unwrap_or("error").to_string()
                } else {
                    text.chars().take(300).collect()
                },
            }
        }
    }
}

/// Reads a whole answer and decodes it from JSON.
pub async fn decode<T: DeserializeOwned>(
    resp: Response<Incoming>,
    what: &str,
) -> Result<T, ClientError> {
    let body = resp.into_body().collect().await?.to_bytes();
    serde_json::from_slice(&body).map_err(|source| ClientError::Decode {
        what: what.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_errors_keep_code_and_message() {
        let e = api_error(
            StatusCode::NOT_FOUND,
            br#"{"error":{"code":"not_found","message":"No sandbox sbx_1"}}"#,
        );
        assert_eq!(e.code(), "not_found");
        assert_eq!(e.status(), Some(404));
        assert_eq!(e.to_string(), "No sandbox sbx_1");
    }

    #[test]
    fn non_json_errors_name_the_status() {
        let e = api_error(StatusCode::BAD_GATEWAY, b"");
        assert_eq!(e.code(), "http_502");
        assert_eq!(e.to_string(), "Bad Gateway");
    }

    /// Serves one connection on a real Unix socket with a canned answer, returning the
    /// request head the client sent.
    async fn serve_once(
        dir: &Path,
        answer: &'static [u8],
    ) -> (PathBuf, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let sock = dir.join("d.sock");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let handle = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                head.extend_from_slice(&buf[..n]);
            }
            s.write_all(answer).await.unwrap();
            s.shutdown().await.unwrap();
            String::from_utf8(head).unwrap()
        });
        (sock, handle)
    }

    #[tokio::test]
    async fn get_decodes_json_over_a_unix_socket() {
        let dir = tempfile::tempdir().unwrap();
        let (sock, server) = serve_once(
            dir.path(),
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 8\r\n\r\n{\"a\": 1}",
        )
        .await;
        let v: serde_json::Value = Client::unix(&sock).get("/v1/info").await.unwrap();
        assert_eq!(v["a"], 1);
        let head = server.await.unwrap().to_ascii_lowercase();
        assert!(head.starts_with("get /v1/info http/1.1\r\n"), "{head}");
        assert!(head.contains("host: localhost"), "{head}");
        assert!(!head.contains("authorization"), "{head}");
    }

    #[tokio::test]
    async fn error_answers_become_api_errors() {
        let dir = tempfile::tempdir().unwrap();
        let body = br#"{"error":{"code":"bad_request","message":"timeout_ms must be positive"}}"#;
        let answer: &'static [u8] = Box::leak(
            [
                format!(
                    "HTTP/1.1 400 Bad Request\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
                body,
            ]
            .concat()
            .into_boxed_slice(),
        );
        let (sock, _server) = serve_once(dir.path(), answer).await;
        let e = Client::unix(&sock)
            .get::<serde_json::Value>("/v1/sandboxes")
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(400));
        assert_eq!(e.code(), "bad_request");
        assert_eq!(e.to_string(), "timeout_ms must be positive");
    }

    #[tokio::test]
    async fn tcp_requests_carry_the_bearer_token() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                head.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8(head).unwrap()
        });
        Client::tcp(addr, Some("s3cret".into()))
            .call_no_content(Method::DELETE, "/v1/sandboxes/sbx_1", empty(), None)
            .await
            .unwrap();
        let head = server.await.unwrap().to_ascii_lowercase();
        assert!(head.contains("authorization: bearer s3cret"), "{head}");
        assert!(head.contains(&format!("host: {addr}")), "{head}");
    }

    #[tokio::test]
    async fn missing_socket_is_a_connect_error() {
        let dir = tempfile::tempdir().unwrap();
        let c = Client::unix(dir.path().join("nope.sock"));
        let e = c.get::<serde_json::Value>("/v1/info").await.unwrap_err();
        assert_eq!(e.code(), "daemon_unavailable");
    }
}
