//! The agent's one stream transport: a Unix socket (namespace sandboxes, tests) or AF_VSOCK
//! on any CID (a microVM, reached from the host through the VMM's hybrid vsock socket), and
//! the loop that serves HTTP/2 with prior knowledge on each connection.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, VsockAddr, accept4, bind, listen, socket,
};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::config::ListenAddr;
use crate::fdio::FdStream;
use crate::server::{App, handle};

/// A connected byte stream of either transport.
pub trait Conn: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Conn for T {}

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Binding the socket failed.
    #[error("Cannot listen on {addr}")]
    Bind {
        addr: String,
        #[source]
        source: io::Error,
    },
}

/// A bound, listening socket.
#[derive(Debug)]
pub enum Listener {
    Unix(tokio::net::UnixListener),
    Vsock(AsyncFd<OwnedFd>),
}

impl Listener {
    /// Binds `addr` (replacing a stale Unix socket file).
    pub fn bind(addr: &ListenAddr) -> Result<Self, ListenError> {
        let fail = |source: io::Error| ListenError::Bind {
            addr: format!("{addr:?}"),
            source,
        };
        match addr {
            ListenAddr::Unix(path) => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(fail)?;
                }
                remove_stale(path);
                tokio::net::UnixListener::bind(path)
                    .map(Listener::Unix)
                    .map_err(fail)
            }
            ListenAddr::Vsock(port) => bind_vsock(*port).map(Listener::Vsock).map_err(fail),
            ListenAddr::Fd(fd) => inherited_unix(*fd).map(Listener::Unix).map_err(fail),
        }
    }

    /// Waits for the next connection.
    pub async fn accept(&self) -> io::Result<Box<dyn Conn>> {
        match self {
            Listener::Unix(l) => Ok(Box::new(l.accept().await?.0)),
            Listener::Vsock(fd) => loop {
                let mut guard = fd.readable().await?;
                match guard.try_io(|fd| {
                    accept4(fd.as_raw_fd(), SockFlag::SOCK_CLOEXEC).map_err(io::Error::from)
                }) {
                    Ok(raw) => {
                        // SAFETY: `accept4` just returned this descriptor; nothing else owns it.
                        let owned = unsafe { OwnedFd::from_raw_fd(raw?) };
                        return Ok(Box::new(FdStream::new(owned)?));
                    }
                    Err(_would_block) => continue,
                }
            },
        }
    }
}

fn remove_stale(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Takes over an inherited descriptor, after checking that it is a listening Unix stream
/// socket (anything else is a mistake of whoever started the agent).
fn inherited_unix(fd: i32) -> io::Result<tokio::net::UnixListener> {
    use nix::sys::socket::{UnixAddr, getsockname, getsockopt, sockopt};
    use std::os::fd::BorrowedFd;
    // SAFETY: the descriptor is only borrowed for the checks; ownership is taken below, once
    // it is known to be the socket we were handed.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let listening = getsockopt(&borrowed, sockopt::AcceptConn).map_err(io::Error::from)?;
    let is_unix = getsockname::<UnixAddr>(fd).is_ok();
    let is_stream =
        getsockopt(&borrowed, sockopt::SockType).map_err(io::Error::from)? == SockType::Stream;
    if !(listening && is_unix && is_stream) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("fd {fd} is not a listening Unix stream socket"),
        ));
    }
    // SAFETY: the checks above found an open socket at `fd`, inherited for this agent alone;
    // nothing else in this process owns it.
    let std_listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
    nix::fcntl::fcntl(
        std_listener.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(io::Error::from)?;
    std_listener.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(std_listener)
}

fn bind_vsock(port: u32) -> io::Result<AsyncFd<OwnedFd>> {
    let fd = socket(
        AddressFamily::Vsock,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    bind(fd.as_raw_fd(), &VsockAddr::new(libc::VMADDR_CID_ANY, port))?;
    listen(&fd, Backlog::new(128)?)?;
    // SAFETY: `fd` is an open socket owned by the `AsyncFd` for its whole life.
    Ok(unsafe { AsyncFd::register(fd)? })
}

/// Serves HTTP/2 (prior knowledge) on one connection until it closes.
pub async fn serve_conn(app: Arc<App>, io: Box<dyn Conn>) {
    let mut builder =
        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()).http2_only();
    builder
        .http2()
        .max_concurrent_streams(4096)
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(16 << 20)
        .max_frame_size(belljar_agent_proto::MAX_FRAME)
        .max_send_buf_size(belljar_agent_proto::MAX_FRAME as usize);
    let service = hyper::service::service_fn(move |req| handle(app.clone(), req));
    if let Err(e) = builder.serve_connection(TokioIo::new(io), service).await {
        tracing::debug!("connection ended: {e}");
    }
}

/// Accepts connections for ever; the caller drops this future to stop.
pub async fn serve(app: Arc<App>, listener: Listener) {
    loop {
        match listener.accept().await {
            Ok(io) => {
                tokio::spawn(serve_conn(app.clone(), io));
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}
