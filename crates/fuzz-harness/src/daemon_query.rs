//! The daemon's query strings and path segments, and the TCP listener's header checks
//! (`Host`, `Origin`, `Authorization`, the session cookie, the WebSocket token query):
//! every route that takes a query, with the input's query, through the real router and
//! extractors of the Unix socket or the TCP listener. No panic, no 500, every error an
//! `ErrorBody`.

use axum::body::Body;

use crate::agent_answer::runtime;
use crate::daemon::{TOKEN, daemon, send};
use crate::input::Input;

/// Escapes what a URI cannot carry, as any client would have to, and keeps the rest.
fn uri_safe(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() && b != b'#' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let which = input.u8();
    let tcp = input.one_in(4);
    let id = match input.u8() % 8 {
        0 => input
            .string(16)
            .iter()
            .map(|b| format!("%{b:02X}"))
            .collect(),
        _ => "sbx-missing".to_owned(),
    };
    let query = uri_safe(input.string(200));
    let (method, path) = match which % 20 {
        0 => ("GET", "/v1/sandboxes".to_owned()),
        1 => ("GET", "/v1/events".to_owned()),
        2 => ("GET", format!("/v1/sandboxes/{id}/commands/cmd-1")),
        3 => ("GET", format!("/v1/sandboxes/{id}/commands/cmd-1/logs")),
        4 => ("POST", format!("/v1/sandboxes/{id}/commands/cmd-1/stdin")),
        5 => ("GET", format!("/v1/sandboxes/{id}/files")),
        6 => ("PUT", format!("/v1/sandboxes/{id}/files")),
        7 => ("DELETE", format!("/v1/sandboxes/{id}/files")),
        8 => ("GET", format!("/v1/sandboxes/{id}/files/list")),
        9 => ("GET", format!("/v1/sandboxes/{id}/files/stat")),
        10 => ("GET", format!("/v1/sandboxes/{id}/files/tar")),
        11 => ("PUT", format!("/v1/sandboxes/{id}/files/tar")),
        12 => ("GET", format!("/v1/sandboxes/{id}/files/watch")),
        13 => ("GET", format!("/v1/sandboxes/{id}/files/thumbnail")),
        14 => ("GET", format!("/v1/sandboxes/{id}/terminal")),
        15 => ("GET", "/ui".to_owned()),
        16 => ("GET", format!("/v1/sandboxes/{id}")),
        17 => ("GET", "/v1/info".to_owned()),
        18 => ("GET", "/v1/images".to_owned()),
        _ => ("GET", format!("/v1/sandboxes/{id}/commands")),
    };
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("{path}?{query}"));
    if tcp {
        let names = [
            http::header::HOST,
            http::header::ORIGIN,
            http::header::AUTHORIZATION,
            http::header::COOKIE,
            http::header::UPGRADE,
            http::header::SEC_WEBSOCKET_PROTOCOL,
        ];
        for name in names {
            let value = match input.u8() % 4 {
                0 => continue,
                1 if name == http::header::AUTHORIZATION => format!("Bearer {TOKEN}").into_bytes(),
                1 if name == http::header::HOST => b"127.0.0.1:7423".to_vec(),
                _ => input.string(64).to_vec(),
            };
            if let Ok(v) = http::HeaderValue::from_bytes(&value) {
                req = req.header(name, v);
            }
        }
    }
    let Ok(req) = req.body(Body::from(input.rest().to_vec())) else {
        return;
    };
    let d = daemon();
    runtime().block_on(async { send(if tcp { &d.tcp } else { &d.unix }, req).await });
}
