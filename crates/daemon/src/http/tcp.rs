//! The connections of the TCP listener on 127.0.0.1, served by hand rather than by
//! `axum::serve`, because any local process can open them and `axum::serve` bounds neither
//! how long a client takes over its headers nor how many connections wait unauthenticated:
//! 5,000 connections that sent half a request line stayed open, each holding a descriptor
//! and a task, until the daemon ran out of both.
//!
//! Two bounds, both for the TCP port only (the Unix socket is the user's own):
//! - a connection has [`TcpLimits::header_read_timeout`] to send each request's headers,
//!   the first one and every later one on a kept-alive connection alike, or it is closed;
//! - at most [`TcpLimits::max_unauthenticated`] connections may be open that no request with
//!   the token or a session has come through yet; one over that is closed as soon as it is
//!   accepted, before a byte of it is read. A connection leaves the count with its first
//!   request that [`super::auth::credentials_guard`] lets in with credentials.
//!
//! HTTP/1.1 only, as before: the header timeout is HTTP/1's, and no client of this port
//! speaks HTTP/2 in clear text.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

/// The bounds on the TCP listener's clients.
#[derive(Debug, Clone, Copy)]
pub struct TcpLimits {
    /// How long a client may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// How many connections may be open without having authenticated.
    pub max_unauthenticated: usize,
}

/// A connection's place among the unauthenticated ones, in every request's extensions; the
/// place is given back by [`Unauthenticated::release`] or when the connection closes.
#[derive(Clone)]
pub struct Unauthenticated(Arc<Mutex<Option<OwnedSemaphorePermit>>>);

impl Unauthenticated {
    /// The connection has shown credentials: it no longer counts against the bound.
    pub fn release(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// Serves `app` on `listener` within `limits`, until the future is dropped.
pub async fn serve(listener: TcpListener, app: Router, limits: TcpLimits) -> Infallible {
    let places = Arc::new(Semaphore::new(limits.max_unauthenticated.max(1)));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, most likely (the places bound the connections that a
                // stranger can hold, not the daemon's other files): as `axum::serve` does, wait
                // a moment rather than spin, and go on.
                tracing::warn!(error = %e, "cannot accept a TCP connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            tracing::debug!("too many unauthenticated TCP connections; closing a new one");
            drop(stream);
            continue;
        };
        let place = Unauthenticated(Arc::new(Mutex::new(Some(place))));
        let app = app.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let mut req = req.map(Body::new);
                req.extensions_mut().insert(place.clone());
                app.clone().oneshot(req)
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
            if let Err(e) = served {
                tracing::trace!(error = %e, "TCP connection ended");
            }
        });
    }
}
