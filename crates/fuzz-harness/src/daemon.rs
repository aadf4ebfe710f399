//! One in-process daemon for the `daemon_*` targets: the real router and extractors over a
//! temporary home with no image and no backend, so that no request, however well-formed,
//! can start a sandbox or build an image; a request that gets past parsing and validation
//! ends in a clean "image not available" or "not found". Requests are sent through the same
//! layers as the Unix socket or, with the input's headers, the TCP listener.

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::body::Body;
use axum::middleware;
use belljar_api::ErrorBody;
use belljard::events::Events;
use belljard::http::auth::{self, Auth};
use belljard::http::{AppState, router};
use belljard::images::Images;
use belljard::paths::Paths;
use belljard::sandbox::backend::Backends;
use belljard::sandbox::{Sandboxes, Settings};
use belljard::store::Store;
use http_body_util::BodyExt;
use tower::ServiceExt;

/// The token the TCP layer accepts.
pub const TOKEN: &str = "fuzz-token-0123456789abcdef";

pub struct Daemon {
    pub unix: Router,
    pub tcp: Router,
}

/// The daemon, made once inside the runtime.
pub fn daemon() -> &'static Daemon {
    static DAEMON: OnceLock<Daemon> = OnceLock::new();
    DAEMON.get_or_init(|| {
        let home = std::env::temp_dir().join(format!("belljar-fuzz-home-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        let paths = Paths::resolve(Some(&home), Some(&home.join("cache"))).expect("paths");
        paths.create().expect("home");
        let store = Store::open_in_memory().expect("store");
        let events = Arc::new(Events::new(store.clone()));
        let images = Images::new(paths.clone(), home.join("no-guest-images"), store.clone());
        let paths_dirs = paths.dirs.clone();
        let sandboxes = Sandboxes::new(
            store,
            events.clone(),
            paths,
            Backends::new(Vec::new()),
            images.clone(),
            Settings::default(),
        );
        let auth = Arc::new(Auth::new(
            TOKEN.into(),
            vec!["https://allowed.example".into()],
        ));
        auth.set_port(7423);
        let state = AppState {
            sandboxes,
            images,
            events,
            auth: auth.clone(),
            ui_dir: home.join("no-ui"),
            dirs: paths_dirs,
            // The fuzz target cannot act as a doctor probe child (only belljard's `main`
            // answers the probe variable), so `GET /v1/doctor` here runs a binary that fails:
            // the probes report a failure and the route still answers.
            probe_exe: "/bin/false".into(),
            vercel_token_lifetime: belljard::compat::vercel::token::LIFETIME_SECS,
        };
        Daemon {
            unix: router(state.clone()).layer(middleware::from_fn(auth::unix_caller)),
            tcp: auth::tcp_layers(router(state), auth),
        }
    })
}

/// Sends one request and checks the answer: no 500, and every error is an `ErrorBody`.
pub async fn send(router: &Router, req: http::Request<Body>) {
    let what = format!("{} {}", req.method(), req.uri());
    let resp = router
        .clone()
        .oneshot(req)
        .await
        .expect("the router is infallible");
    let status = resp.status();
    let json = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"application/json"));
    assert_ne!(status, http::StatusCode::INTERNAL_SERVER_ERROR, "{what}");
    if status.is_client_error() || status.is_server_error() {
        assert!(json, "{what}: {status} is not JSON");
    }
    if !json {
        // Streams (events, logs) and redirects: their parsing is done.
        return;
    }
    let bytes = resp
        .into_body()
        .collect()
        .await
        .expect("a JSON body is whole")
        .to_bytes();
    if !status.is_success() {
        // Decoding checks the code too: `ErrorCode` is a closed list.
        let _: ErrorBody = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!("{what}: {status} without an error body with a known code: {e}")
        });
    }
}
