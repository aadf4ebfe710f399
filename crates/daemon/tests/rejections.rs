//! Requests that axum's own extractors reject still get the one error shape,
//! `{"error":{"code","message"}}`: found by the `daemon_query` fuzz target. The router runs
//! in-process over a temporary home with no image and no backend.

use std::sync::Arc;

use axum::body::Body;
use axum::middleware;
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

fn app(home: &std::path::Path) -> axum::Router {
    let paths = Paths::resolve(Some(home), Some(&home.join("cache"))).unwrap();
    paths.create().unwrap();
    let store = Store::open_in_memory().unwrap();
    let events = Arc::new(Events::new(store.clone()));
    let images = Images::new(paths.clone(), home.join("no-recipes"), store.clone());
    let dirs = paths.dirs.clone();
    let sandboxes = Sandboxes::new(
        store,
        events.clone(),
        paths,
        Backends::new(Vec::new()),
        images.clone(),
        Settings::default(),
    );
    let state = AppState {
        sandboxes,
        images,
        events,
        auth: Arc::new(Auth::new("t".into(), Vec::new())),
        ui_dir: home.join("no-ui"),
        dirs,
        // These tests send no doctor request; a binary that fails stands for belljard.
        probe_exe: "/bin/false".into(),
        vercel_token_lifetime: belljard::compat::vercel::token::LIFETIME_SECS,
    };
    router(state).layer(middleware::from_fn(auth::unix_caller))
}

async fn error_code(app: &axum::Router, method: &str, uri: &str) -> (u16, String) {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_else(|e| {
        panic!(
            "{method} {uri}: {status} {:?} is not JSON: {e}",
            String::from_utf8_lossy(&body)
        )
    });
    (
        status,
        json["error"]["code"].as_str().unwrap_or("").to_owned(),
    )
}

#[tokio::test]
async fn extractor_rejections_are_error_bodies() {
    let home = tempfile::tempdir().unwrap();
    let app = app(home.path());
    // A terminal asked for without a WebSocket upgrade.
    assert_eq!(
        error_code(&app, "GET", "/v1/sandboxes/sbx_x/terminal").await,
        (400, "bad_request".to_owned())
    );
    // A path segment that is not UTF-8 once decoded.
    assert_eq!(
        error_code(&app, "GET", "/v1/sandboxes/%FF").await,
        (400, "bad_request".to_owned())
    );
    // A method the route does not have keeps its status.
    assert_eq!(
        error_code(&app, "PUT", "/v1/sandboxes").await,
        (405, "bad_request".to_owned())
    );
}
