//! Who may talk to the daemon over TCP: a loopback `Host`, no foreign `Origin`, and the bearer
//! token or a browser session cookie.
//!
//! The Unix socket is private to the user (mode 0600) and needs none of this. On 127.0.0.1
//! any local process or web page could connect, so: a `Host` that is not a loopback name means
//! DNS rebinding (403); an `Origin` other than the daemon's own or the desktop app's means a
//! foreign page (403); then the bearer token from `<config>/token`, or the cookie that
//! `GET /ui?token=<one-time>` sets, must be present (401).

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rand::RngCore;
use subtle::ConstantTimeEq;
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::error::ApiError;

/// The browser session cookie's name.
pub const SESSION_COOKIE: &str = "belljar_session";

/// How long a one-time UI token stays valid.
const ONE_TIME_TTL: Duration = Duration::from_secs(60);

/// How a request was let in; handlers that mint credentials look at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The user's private Unix socket.
    Unix,
    /// TCP with the bearer token.
    Bearer,
    /// TCP with a browser session cookie.
    Session,
    /// TCP without credentials, on a route that needs none (the UI's files).
    Anonymous,
}

pub struct Auth {
    token: String,
    port: AtomicU16,
    extra_origins: Vec<String>,
    one_time: Mutex<HashMap<String, Instant>>,
    sessions: Mutex<HashSet<String>>,
}

/// 32 random bytes as hex.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads the bearer token, creating it (mode 0600) on first start.
pub fn load_or_create_token(path: &Path) -> std::io::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let token = random_token();
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(token.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(token)
}

/// Whether `host` (a `Host` header value) names this machine's loopback.
pub fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((name, _)) => name,
            None => return false,
        }
    } else {
        host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                name
            } else {
                host
            }
        })
    };
    let name = name.to_ascii_lowercase();
    name == "localhost"
        || name == "::1"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Auth {
    pub fn new(token: String, extra_origins: Vec<String>) -> Self {
        Self {
            token,
            port: AtomicU16::new(0),
            extra_origins,
            one_time: Default::default(),
            sessions: Default::default(),
        }
    }

    /// The bearer token, for the compatibility layers that sign their own credentials with it.
    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// The TCP port actually bound, which the daemon's own origins carry.
    pub fn set_port(&self, port: u16) {
        self.port.store(port, Ordering::Relaxed);
    }

    /// Whether a browser page from `origin` may call the daemon.
    pub fn origin_allowed(&self, origin: &str) -> bool {
        let port = self.port.load(Ordering::Relaxed);
        let own = [
            format!("http://127.0.0.1:{port}"),
            format!("http://localhost:{port}"),
        ];
        let app = [
            "tauri://localhost",
            "http://tauri.localhost",
            "https://tauri.localhost",
        ];
        own.iter().any(|o| o == origin)
            || app.contains(&origin)
            || self.extra_origins.iter().any(|o| o == origin)
    }

    /// A one-time token for `GET /ui?token=`.
    pub fn issue_one_time(&self) -> String {
        let token = random_token();
        let mut map = self.one_time.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        map.retain(|_, issued| now.duration_since(*issued) < ONE_TIME_TTL);
        map.insert(token.clone(), now);
        token
    }

    /// Trades a one-time token for a new session id.
    pub fn redeem(&self, one_time: &str) -> Option<String> {
        let issued = self
            .one_time
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(one_time)?;
        if issued.elapsed() >= ONE_TIME_TTL {
            return None;
        }
        let session = random_token();
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(session.clone());
        Some(session)
    }

    /// Checks a TCP request's headers; how it was let in, or why not.
    pub fn check(&self, headers: &HeaderMap, needs_credentials: bool) -> Result<Caller, ApiError> {
        self.check_site(headers)?;
        self.check_credentials(headers, needs_credentials)
    }

    /// The first check: a loopback `Host` (no DNS rebinding) and no foreign `Origin` (403).
    pub fn check_site(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if let Some(host) = headers.get(header::HOST) {
            let host = host.to_str().unwrap_or_default();
            if !is_loopback_host(host) {
                return Err(ApiError::Forbidden(format!(
                    "Host {host:?} is not a loopback name"
                )));
            }
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or_default();
            if !self.origin_allowed(origin) {
                return Err(ApiError::Forbidden(format!(
                    "Origin {origin:?} may not use the daemon"
                )));
            }
        }
        Ok(())
    }

    /// The second check: the bearer token or a session cookie (401), unless the route needs
    /// none.
    pub fn check_credentials(
        &self,
        headers: &HeaderMap,
        needs_credentials: bool,
    ) -> Result<Caller, ApiError> {
        if let Some(bearer) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
        {
            // Constant time, so the answer's timing does not tell how much of a guess was right.
            if bool::from(bearer.trim().as_bytes().ct_eq(self.token.as_bytes())) {
                return Ok(Caller::Bearer);
            }
            return Err(ApiError::Unauthorized);
        }
        if let Some(session) = session_cookie(headers)
            && self
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(session)
        {
            return Ok(Caller::Session);
        }
        if needs_credentials {
            Err(ApiError::Unauthorized)
        } else {
            Ok(Caller::Anonymous)
        }
    }
}

fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == SESSION_COOKIE)
        .map(|(_, v)| v)
}

/// The `Set-Cookie` value of a new session.
pub fn session_set_cookie(session: &str) -> String {
    format!("{SESSION_COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/")
}

/// The layers of the TCP listener, outermost first: [`site_guard`] refuses a foreign `Host` or
/// `Origin` (403, before anything else, preflights included); [`cors`] answers the preflights of
/// the allowed origins (the desktop app's) and lets their pages read every answer, refusals
/// included; [`credentials_guard`] wants the token or a session (401) under `/v1`.
pub fn tcp_layers(router: axum::Router, auth: std::sync::Arc<Auth>) -> axum::Router {
    router
        .layer(axum::middleware::from_fn_with_state(
            auth.clone(),
            credentials_guard,
        ))
        .layer(cors(auth.clone()))
        .layer(axum::middleware::from_fn_with_state(auth, site_guard))
}

/// Refuses what [`Auth::check_site`] refuses.
pub async fn site_guard(
    State(auth): State<std::sync::Arc<Auth>>,
    req: Request,
    next: Next,
) -> Response {
    match auth.check_site(req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// CORS for the origins [`Auth::origin_allowed`] accepts; no other origin gets a CORS header.
pub fn cors(auth: std::sync::Arc<Auth>) -> CorsLayer {
    CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(move |origin, _| {
            origin.to_str().is_ok_and(|o| auth.origin_allowed(o))
        }))
        .allow_methods([
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
            Method::OPTIONS,
        ])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
        .max_age(Duration::from_secs(600))
}

/// Refuses what [`Auth::check_credentials`] refuses. The API under `/v1` and the
/// compatibility APIs under `/compat/` need credentials; the UI's static files and `/ui` do not
/// (they hold no secret).
pub async fn credentials_guard(
    State(auth): State<std::sync::Arc<Auth>>,
    mut req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    let needs = path == "/v1" || path.starts_with("/v1/") || path.starts_with("/compat/");
    let e2b = path.starts_with(crate::compat::e2b::PREFIX);
    if path.starts_with(crate::compat::vercel::PREFIX) {
        // Vercel's SDK sends its credential as a JWT; one the daemon signed stands for the token.
        let now = crate::compat::vercel::token::now();
        if let Err(e) = crate::compat::vercel::token::accept(&auth, req.headers_mut(), now) {
            return crate::compat::vercel::error::VercelError::from(e).into_response();
        }
    }
    if e2b {
        // E2B's SDK sends the daemon's token as its API key or envd access token.
        crate::compat::e2b::accept(&mut req);
    }
    if let Some(bearer) = websocket_query_token(&req) {
        // A browser cannot set headers on a WebSocket, so the desktop app sends its token in
        // the query of the upgrade; it is checked exactly like the header.
        if let Ok(value) = HeaderValue::from_str(&format!("Bearer {bearer}")) {
            req.headers_mut().insert(header::AUTHORIZATION, value);
        }
    }
    match auth.check_credentials(req.headers(), needs) {
        Ok(caller) => {
            if matches!(caller, Caller::Bearer | Caller::Session)
                && let Some(place) = req.extensions().get::<super::tcp::Unauthenticated>()
            {
                place.release();
            }
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        // Sandbox0's SDK reads only its own error envelope.
        Err(ApiError::Unauthorized) if path_is(&req, crate::compat::sandbox0::PREFIX) => {
            crate::compat::sandbox0::error::Sandbox0Error::Unauthorized.into_response()
        }
        // E2B's SDKs read `{ "code": 401, "message" }`, on both of its APIs.
        Err(e) if e2b => crate::compat::e2b::error::E2bError::from(e).into_response(),
        Err(e) => e.into_response(),
    }
}

fn path_is(req: &Request, prefix: &str) -> bool {
    req.uri().path().starts_with(prefix)
}

/// The `access_token` query parameter of a WebSocket upgrade without an `Authorization` header.
fn websocket_query_token(req: &Request) -> Option<String> {
    let upgrade = req.headers().get(header::UPGRADE)?.to_str().ok()?;
    if !upgrade.eq_ignore_ascii_case("websocket")
        || req.headers().contains_key(header::AUTHORIZATION)
    {
        return None;
    }
    req.uri()
        .query()?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "access_token")
        .map(|(_, v)| v.to_owned())
}

/// Who is at the other end of a Unix-socket connection, as the kernel says
/// (`SO_PEERCRED`): whose permissions decide which host folders it may mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnixPeer {
    pub uid: Option<u32>,
}

impl
    axum::extract::connect_info::Connected<
        axum::serve::IncomingStream<'_, tokio::net::UnixListener>,
    > for UnixPeer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, tokio::net::UnixListener>) -> Self {
        Self {
            uid: stream.io().peer_cred().ok().map(|c| c.uid()),
        }
    }
}

/// Middleware of the Unix listener: marks the caller as the socket's owner, and passes on
/// the connection's peer credentials.
pub async fn unix_caller(mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Caller::Unix);
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<UnixPeer>>()
        .map(|c| c.0);
    if let Some(peer) = peer {
        req.extensions_mut().insert(peer);
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {

    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn auth() -> Auth {
        let a = Auth::new("secret".into(), vec![]);
        a.set_port(7423);
        a
    }

    fn code(r: Result<Caller, ApiError>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(ApiError::Unauthorized) => "401",
            Err(ApiError::Forbidden(_)) => "403",
            Err(_) => "other",
        }
    }

    #[test]
    fn loopback_hosts_only() {
        for ok in [
            "127.0.0.1:7423",
            "localhost",
            "LOCALHOST:1",
            "[::1]:7423",
            "127.1.2.3",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example:7423",
            "10.0.0.1",
            "localhost.evil.com",
            "[::2]",
            "0.0.0.0",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn origins_host_and_credentials_are_checked_in_order() {
        let a = auth();
        let bearer = (header::AUTHORIZATION, "Bearer secret");
        assert_eq!(
            code(a.check(&headers(std::slice::from_ref(&bearer)), true)),
            "ok"
        );
        assert_eq!(code(a.check(&headers(&[]), true)), "401");
        assert_eq!(code(a.check(&headers(&[]), false)), "ok");
        assert_eq!(
            code(a.check(&headers(&[(header::AUTHORIZATION, "Bearer nope")]), true)),
            "401"
        );
        let foreign = (header::ORIGIN, "https://evil.example");
        assert_eq!(
            code(a.check(&headers(&[bearer.clone(), foreign]), true)),
            "403"
        );
        let rebinding = (header::HOST, "evil.example:7423");
        assert_eq!(
            code(a.check(&headers(&[bearer.clone(), rebinding]), true)),
            "403"
        );
        for origin in [
            "http://127.0.0.1:7423",
            "http://localhost:7423",
            "tauri://localhost",
            "http://tauri.localhost",
        ] {
            let h = headers(&[
                bearer.clone(),
                (header::ORIGIN, origin),
                (header::HOST, "127.0.0.1:7423"),
            ]);
            assert_eq!(code(a.check(&h, true)), "ok", "{origin}");
        }
        // Another port on localhost is another web site.
        assert_eq!(
            code(a.check(
                &headers(&[bearer, (header::ORIGIN, "http://localhost:8080")]),
                true
            )),
            "403"
        );
    }

    #[test]
    fn one_time_tokens_become_sessions_once() {
        let a = auth();
        let t = a.issue_one_time();
        let session = a.redeem(&t).unwrap();
        assert!(a.redeem(&t).is_none());
        assert!(a.redeem("forged").is_none());
        let cookie = format!("theme=dark; {SESSION_COOKIE}={session}");
        assert!(matches!(
            a.check(&headers(&[(header::COOKIE, &cookie)]), true),
            Ok(Caller::Session)
        ));
        let forged = format!("{SESSION_COOKIE}=abc");
        assert_eq!(
            code(a.check(&headers(&[(header::COOKIE, &forged)]), true)),
            "401"
        );
        assert!(session_set_cookie(&session).contains("HttpOnly; SameSite=Strict"));
    }

    #[test]
    fn the_token_file_is_private_and_stable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        let t1 = load_or_create_token(&p).unwrap();
        let t2 = load_or_create_token(&p).unwrap();
        assert_eq!(t1, t2);
        assert_eq!(t1.len(), 64);
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
