//! The daemon's request bodies: every JSON body type of the API through the daemon's own
//! `parse_json` (the extractor's parser), a serde round trip of what it accepts, and the
//! same bytes through the real router to the route that takes them (a sandbox that does
//! not exist, or creation, which validates before it needs an image). No panic, no 500,
//! every error an `ErrorBody`.

use std::fmt::Debug;

use axum::body::Body;
use belljar_api::{
    CreateSandbox, ExtendSandbox, KillCommand, MkdirRequest, MoveRequest, PtySize, RunCommand,
    UpdateSandbox,
};
use belljard::http::extract::parse_json;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::agent_answer::runtime;
use crate::daemon::{daemon, send};
use crate::input::Input;

/// What the daemon accepted, it can write and read back to the same value.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(body: &[u8]) {
    let Ok(value) = parse_json::<T>(body) else {
        return;
    };
    let text = serde_json::to_vec(&value).expect("an accepted body serialises");
    let again: T = parse_json(&text)
        .unwrap_or_else(|e| panic!("{value:?} does not parse back from its own JSON: {e:?}"));
    assert_eq!(value, again);
}

pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let which = input.u8();
    let id = if input.one_in(8) {
        String::from_utf8_lossy(input.string(16))
            .bytes()
            .map(|b| format!("%{b:02X}"))
            .collect()
    } else {
        "sbx-missing".to_owned()
    };
    let body = input.rest();
    let (method, path) = match which % 9 {
        0 => {
            round_trip::<CreateSandbox>(body);
            ("POST", "/v1/sandboxes".to_owned())
        }
        1 => {
            round_trip::<UpdateSandbox>(body);
            ("PATCH", format!("/v1/sandboxes/{id}"))
        }
        2 => {
            round_trip::<ExtendSandbox>(body);
            ("POST", format!("/v1/sandboxes/{id}/extend"))
        }
        3 => {
            round_trip::<RunCommand>(body);
            ("POST", format!("/v1/sandboxes/{id}/commands"))
        }
        4 => {
            round_trip::<KillCommand>(body);
            ("POST", format!("/v1/sandboxes/{id}/commands/cmd-1/kill"))
        }
        5 => {
            round_trip::<PtySize>(body);
            ("POST", format!("/v1/sandboxes/{id}/commands/cmd-1/resize"))
        }
        6 => {
            round_trip::<MkdirRequest>(body);
            ("POST", format!("/v1/sandboxes/{id}/files/mkdir"))
        }
        7 => {
            round_trip::<MoveRequest>(body);
            ("POST", format!("/v1/sandboxes/{id}/files/move"))
        }
        _ => ("POST", "/v1/session/token".to_owned()),
    };
    let Ok(req) = http::Request::builder()
        .method(method)
        .uri(&path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_vec()))
    else {
        return;
    };
    runtime().block_on(async { send(&daemon().unix, req).await });
}
