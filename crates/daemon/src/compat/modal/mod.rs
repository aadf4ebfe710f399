//! Modal's gRPC API, for the `modal` Python client (1.x): the control plane
//! (`modal.client.ModalClient`: apps, images, secrets, sandboxes and their streams) and the
//! task command router (`modal.task_command_router.TaskCommandRouter`: commands run in a
//! sandbox), both on one loopback TCP port of the daemon's own.
//!
//! A port, not the daemon's Unix socket: the client reaches the command router only over
//! `http://` (or `https://`) and, in plain text, only when its server URL is a loopback
//! address, so `belljar modal` sets `MODAL_SERVER_URL=http://127.0.0.1:<port>` and the layer
//! names the same address as every sandbox's command router. The client speaks HTTP/2 with
//! prior knowledge, which the daemon's HTTP/1.1 port does not.
//!
//! Every request is checked before it is translated: the daemon's token as the token secret
//! (`MODAL_TOKEN_SECRET`, sent as `x-modal-token-secret`) on the control plane, and as the
//! bearer "JWT" the control plane hands out for the command router; and, on the control plane,
//! the client's version (`x-modal-client-version`), refused outside [`TESTED`]'s minor series
//! as Modal's server refuses a client it no longer supports, so an unknown client fails with
//! an upgrade or downgrade message instead of meeting a message it cannot read.

pub mod error;
mod exec;
pub mod ids;
mod images;
mod objects;
mod output;
mod sandboxes;
mod tags;
mod volumes;
pub mod wire;

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::body::Body;
use tonic::server::Grpc;
use tonic_prost::ProstCodec;

use self::error::{ModalError, Result};
use crate::http::AppState;
use crate::http::tcp::TcpLimits;

/// The client version the layer is tested with; it answers the clients of the same minor
/// series (`1.6.*`).
pub const TESTED: &str = "1.6.4";

/// The token id `belljar modal` sets (`MODAL_TOKEN_ID`); the secret is the daemon's token.
pub const TOKEN_ID: &str = "ak-belljar";

const CONTROL: &str = "/modal.client.ModalClient/";
const ROUTER: &str = "/modal.task_command_router.TaskCommandRouter/";

/// How many `Secret.from_dict` secrets are kept; the oldest goes first.
const MAX_SECRETS: usize = 4096;

/// The layer's state, shared by every connection.
#[derive(Clone)]
pub struct Modal(Arc<Inner>);

struct Inner {
    st: AppState,
    /// This listener's URL, handed out as every sandbox's command router.
    url: String,
    /// The variables of each secret made from a dict, by id; never written to disk.
    secrets: Mutex<Secrets>,
    /// Held while a named sandbox is checked and created, so that a name is taken once.
    naming: tokio::sync::Mutex<()>,
    /// The image builds started through the layer, by image id.
    builds: Mutex<images::Builds>,
    /// The commands started through the command router, by the client's exec id.
    execs: Mutex<HashMap<String, exec::Exec>>,
    /// The last stdin write index of each sandbox's entrypoint (a repeated one is a retry).
    stdin: Mutex<HashMap<String, u32>>,
}

#[derive(Default)]
struct Secrets {
    by_id: HashMap<String, HashMap<String, String>>,
    order: VecDeque<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Modal {
    /// The layer of the daemon whose state is `st`, listening on 127.0.0.1:`port`.
    pub fn new(st: AppState, port: u16) -> Self {
        Self(Arc::new(Inner {
            st,
            url: format!("http://127.0.0.1:{port}"),
            secrets: Mutex::default(),
            naming: tokio::sync::Mutex::new(()),
            builds: Mutex::default(),
            execs: Mutex::default(),
            stdin: Mutex::default(),
        }))
    }

    fn st(&self) -> &AppState {
        &self.0.st
    }

    fn keep_secret(&self, id: &str, env: HashMap<String, String>) {
        let mut s = lock(&self.0.secrets);
        if s.order.len() >= MAX_SECRETS
            && let Some(old) = s.order.pop_front()
        {
            s.by_id.remove(&old);
        }
        s.order.push_back(id.to_owned());
        s.by_id.insert(id.to_owned(), env);
    }

    /// The variables of secret `id`: one made from a dict, or a named one.
    fn secret(&self, id: &str) -> Result<HashMap<String, String>> {
        if let Some(env) = lock(&self.0.secrets).by_id.get(id) {
            return Ok(env.clone());
        }
        self.st()
            .sandboxes
            .store()
            .modal_secret(id)
            .map_err(|e| ModalError::from(crate::sandbox::SandboxError::from(e)))?
            .map(|s| s.env)
            .ok_or_else(|| ModalError::NotFound(format!("Secret {id} not found")))
    }

    /// Checks a request's credentials and, on the control plane, the client's version.
    fn admit(&self, headers: &HeaderMap, control: bool) -> Result<()> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let secret = if control {
            text("x-modal-token-secret")
        } else {
            text(header::AUTHORIZATION.as_str()).and_then(|v| v.strip_prefix("Bearer "))
        };
        let mut bearer = HeaderMap::new();
        if let Some(v) = secret.and_then(|s| HeaderValue::from_str(&format!("Bearer {s}")).ok()) {
            bearer.insert(header::AUTHORIZATION, v);
        }
        if self.st().auth.check_credentials(&bearer, true).is_err() {
            return Err(ModalError::Unauthenticated(
                "Token missing or wrong: run the program with `belljar modal --`".into(),
            ));
        }
        if control {
            check_version(text("x-modal-client-version"))?;
        }
        Ok(())
    }
}

/// Refuses a client outside the tested minor series, the way Modal's server answers a client
/// it does not support (`FAILED_PRECONDITION`, which the client raises as `ConflictError`).
fn check_version(version: Option<&str>) -> Result<()> {
    let minor = |v: &str| -> Option<(u32, u32)> {
        let mut parts = v.split('.');
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    let tested = minor(TESTED);
    let Some(version) = version else {
        return Err(ModalError::UnsupportedClient(format!(
            "The client sent no version. Please use the modal client {TESTED} (pip install 'modal=={TESTED}')"
        )));
    };
    match minor(version) {
        Some(v) if Some(v) == tested => Ok(()),
        Some(v) if tested.is_some_and(|t| v > t) => Err(ModalError::UnsupportedClient(format!(
            "The modal client version ({version}) is newer than Belljar's Modal layer supports. \
             Please downgrade (pip install 'modal=={TESTED}')"
        ))),
        _ => Err(ModalError::UnsupportedClient(format!(
            "The modal client version ({version}) is too old for Belljar's Modal layer. \
             Please upgrade (pip install 'modal=={TESTED}')"
        ))),
    }
}

/// Serves the layer on `listener` within `limits` (the TCP port's own, `http::tcp`), until the
/// future is dropped. Any local process can open this port, so a connection that has not yet
/// made a request the token lets in holds one of `limits.max_unauthenticated` places (one
/// over is closed as soon as it is accepted) and is closed when `limits.header_read_timeout`
/// passes before it does: HTTP/2 has no header timeout of its own, and without these bounds
/// connections that never sent a request held a descriptor and a task each for good.
pub async fn serve(listener: TcpListener, modal: Modal, limits: TcpLimits) -> Infallible {
    let places = Arc::new(Semaphore::new(limits.max_unauthenticated.max(1)));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept a Modal connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            tracing::debug!("too many unauthenticated Modal connections; closing a new one");
            drop(stream);
            continue;
        };
        let modal = modal.clone();
        tokio::spawn(async move {
            let admitted = Admitted::new(place);
            let seen = admitted.clone();
            let service =
                hyper::service::service_fn(move |req| handle(modal.clone(), seen.clone(), req));
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let served = tokio::select! {
                r = &mut conn => r,
                () = admitted.wait(limits.header_read_timeout) => {
                    if !admitted.is_admitted() {
                        tracing::debug!("a Modal connection made no admitted request in time; closing it");
                        return;
                    }
                    conn.await
                }
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "a Modal connection ended with an error");
            }
        });
    }
}

/// Whether a connection has made a request the token let in; until then it holds its place
/// among the unauthenticated ones.
#[derive(Clone)]
struct Admitted(Arc<AdmittedInner>);

struct AdmittedInner {
    place: Mutex<Option<OwnedSemaphorePermit>>,
    done: tokio::sync::Notify,
}

impl Admitted {
    fn new(place: OwnedSemaphorePermit) -> Admitted {
        Admitted(Arc::new(AdmittedInner {
            place: Mutex::new(Some(place)),
            done: tokio::sync::Notify::new(),
        }))
    }

    fn admit(&self) {
        if self
            .0
            .place
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some()
        {
            self.0.done.notify_one();
        }
    }

    fn is_admitted(&self) -> bool {
        self.0
            .place
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// Returns when the connection is admitted or `within` has passed, whichever is first.
    async fn wait(&self, within: Duration) {
        let done = self.0.done.notified();
        if self.is_admitted() {
            return;
        }
        let _ = tokio::time::timeout(within, done).await;
    }
}

async fn handle(
    modal: Modal,
    admitted: Admitted,
    req: hyper::Request<Incoming>,
) -> std::result::Result<hyper::Response<Body>, Infallible> {
    let path = req.uri().path().to_owned();
    let (control, method) = match (path.strip_prefix(CONTROL), path.strip_prefix(ROUTER)) {
        (Some(m), _) => (true, m),
        (None, Some(m)) => (false, m),
        (None, None) => return Ok(unimplemented(&path)),
    };
    if let Err(e) = modal.admit(req.headers(), control) {
        return Ok(Status::from(e).into_http());
    }
    admitted.admit();
    let answer = if control {
        objects::route(&modal, method, req).await
    } else {
        exec::route(&modal, method, req).await
    };
    Ok(answer.unwrap_or_else(|| unimplemented(&path)))
}

fn unimplemented(path: &str) -> hyper::Response<Body> {
    Status::from(ModalError::NotImplemented(
        path.trim_start_matches('/').to_owned(),
    ))
    .into_http()
}

/// Answers a unary RPC with `f`.
async fn unary<Req, Resp, F, Fut>(req: hyper::Request<Incoming>, mut f: F) -> hyper::Response<Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnMut(Req) -> Fut,
    Fut: Future<Output = Result<Resp>> + Send + 'static,
{
    let service = tower::service_fn(move |r: tonic::Request<Req>| {
        let answer = f(r.into_inner());
        async move { answer.await.map(tonic::Response::new).map_err(Status::from) }
    });
    Grpc::new(ProstCodec::<Resp, Req>::default())
        .unary(service, req)
        .await
}

/// The messages of a server-streaming answer, sent by the task that makes them.
type Messages<T> = ReceiverStream<std::result::Result<T, Status>>;

/// Answers a server-streaming RPC with the stream `f` opens.
async fn streaming<Req, Resp, F, Fut>(
    req: hyper::Request<Incoming>,
    mut f: F,
) -> hyper::Response<Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnMut(Req) -> Fut,
    Fut: Future<Output = Result<Messages<Resp>>> + Send + 'static,
{
    let service = tower::service_fn(move |r: tonic::Request<Req>| {
        let answer = f(r.into_inner());
        async move { answer.await.map(tonic::Response::new).map_err(Status::from) }
    });
    Grpc::new(ProstCodec::<Resp, Req>::default())
        .server_streaming(service, req)
        .await
}

/// Runs `fut` in a task of its own: a client that goes away cannot leave a sandbox or a
/// command half made.
async fn detached<T: Send + 'static>(
    fut: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    tokio::spawn(fut)
        .await
        .map_err(|e| ModalError::Api(crate::http::error::ApiError::Internal(e.to_string())))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_tested_minor_series_is_answered() {
        assert!(check_version(Some("1.6.4")).is_ok());
        assert!(check_version(Some("1.6.0")).is_ok());
        let newer = check_version(Some("1.7.0")).unwrap_err().to_string();
        assert!(newer.contains("downgrade"), "{newer}");
        let older = check_version(Some("0.73.1")).unwrap_err().to_string();
        assert!(older.contains("upgrade"), "{older}");
        assert!(check_version(Some("junk")).is_err());
        assert!(check_version(None).is_err());
    }
}
