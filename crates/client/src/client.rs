//! The connection to the daemon: over its Unix socket (no token needed) or over 127.0.0.1
//! with the bearer token, HTTP/1.1 and WebSocket, plus the raw request methods the typed
//! ones are built on. The raw methods stay public for what has no typed method yet and for
//! tests of the HTTP surface itself (malformed bodies, missing tokens).
//!
//! One connection per request keeps the client simple and has no pool to go stale across a
//! daemon restart; on a Unix socket a connection costs microseconds.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::body::{Body, empty, json};
use crate::error::{ClientError, api_error};
use crate::paths::Paths;

/// A WebSocket to the daemon (terminal, watch, events).
pub type WebSocket = WebSocketStream<Conn>;

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

    /// The daemon at `paths`, over its Unix socket.
    pub fn local(paths: &Paths) -> Self {
        Self::unix(paths.socket())
    }

    /// The daemon at `paths` over 127.0.0.1 with its bearer token, the way the browser UI
    /// and the SDKs reach it; `None` until the daemon has written its port.
    pub fn local_tcp(paths: &Paths) -> Option<Self> {
        let port = paths.port()?;
        Some(Self::tcp(
            SocketAddr::from(([127, 0, 0, 1], port)),
            paths.token(),
        ))
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

    /// Whether something answers HTTP there (any status: a daemon that refuses the request
    /// still runs).
    pub async fn answers(&self) -> bool {
        let Ok(req) = self.builder(Method::GET, crate::routes::INFO).body(empty()) else {
            return false;
        };
        self.send(req).await.is_ok()
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

    /// `method path` with a JSON body and an `Idempotency-Key`, decoded from JSON: a retry
    /// with the same key answers what the first request did instead of doing it again.
    pub async fn call_once<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &B,
        key: &str,
    ) -> Result<T, ClientError> {
        let req = self
            .builder(method, path)
            .header(header::CONTENT_TYPE, "application/json")
            .header(belljar_api::IDEMPOTENCY_KEY_HEADER, key)
            .body(json(body))?;
        let resp = check(self.send(req).await?).await?;
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

    /// `method path` with a JSON body whose answer has no body worth reading (204).
    pub async fn call_json_no_content<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: &B,
    ) -> Result<(), ClientError> {
        self.call_no_content(method, path, json(body), Some("application/json"))
            .await
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
