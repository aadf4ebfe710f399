//! Request bodies at the edge (issue 10, defect 12), against a real daemon with the real `base`
//! image: only JSON objects are bodies, and every number, string, map and list is within its
//! documented bound (`belljar_api::limits`), refused with 400 `bad_request` naming the field
//! before anything is created or run; an oversized body is 413.

use belljar_api::CreateSandbox;
use belljar_client::{self as client, Client, routes};
use belljar_e2e::Daemon;
use http::Method;
use http_body_util::BodyExt;
use serde_json::{Value, json};

/// Sends `body` and returns the status and the error's message (or the body).
async fn send(c: &Client, method: Method, path: &str, body: String) -> (u16, String) {
    let resp = c
        .request(method, path, client::full(body), Some("application/json"))
        .await;
    let (status, bytes) = match resp {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.into_body().collect().await.unwrap().to_bytes())
        }
        Err(belljar_client::ClientError::Api {
            status,
            code,
            message,
        }) => return (status, format!("{code}: {message}")),
        Err(e) => panic!("{e}"),
    };
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let text = match v["error"]["code"].as_str() {
        Some(code) => format!("{code}: {}", v["error"]["message"].as_str().unwrap_or("")),
        None => String::from_utf8_lossy(&bytes).into_owned(),
    };
    (status, text)
}

/// Asserts a 400 `bad_request` whose message starts with `field`.
async fn refused(c: &Client, method: Method, path: &str, body: Value, field: &str) {
    let (status, text) = send(c, method.clone(), path, body.to_string()).await;
    assert_eq!(status, 400, "{method} {path} {body:.200}: {text}");
    assert!(
        text.starts_with(&format!("bad_request: {field}")),
        "{method} {path}: {text} does not name {field}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_are_objects_within_their_bounds() {
    let d = Daemon::start();
    let c = d.http();
    let s = d.create(&c, CreateSandbox::default()).await;
    let sandbox = routes::sandbox(&s.id);
    let commands = routes::commands(&s.id);

    // A struct also deserializes from a JSON array; no client means that.
    for (method, path) in [
        (Method::POST, routes::SANDBOXES),
        (Method::PATCH, sandbox.as_str()),
        (Method::POST, commands.as_str()),
    ] {
        let (status, text) = send(&c, method.clone(), path, "[null,null]".into()).await;
        assert_eq!(
            (status, text.as_str()),
            (400, "bad_request: body: must be a JSON object"),
            "{method} {path}"
        );
    }

    let create = routes::SANDBOXES;
    let post = Method::POST;
    refused(&c, post.clone(), create, json!({"vcpus": 256}), "vcpus").await;
    refused(&c, post.clone(), create, json!({"vcpus": 0}), "vcpus").await;
    refused(
        &c,
        post.clone(),
        create,
        json!({"disk_mib": u64::MAX}),
        "disk_mib",
    )
    .await;
    refused(
        &c,
        post.clone(),
        create,
        json!({"memory_mib": 1u64 << 40}),
        "memory_mib",
    )
    .await;
    refused(
        &c,
        post.clone(),
        create,
        json!({"timeout_ms": i64::MAX}),
        "timeout_ms",
    )
    .await;
    let big = "x".repeat(200_000);
    refused(
        &c,
        post.clone(),
        create,
        json!({"env": {"BIG": big}}),
        "env.BIG",
    )
    .await;
    refused(&c, post.clone(), create, json!({"env": {"1X": "v"}}), "env").await;
    let many: serde_json::Map<String, Value> =
        (0..51).map(|i| (format!("k{i}"), json!("v"))).collect();
    refused(
        &c,
        post.clone(),
        create,
        json!({"tags": many.clone()}),
        "tags",
    )
    .await;
    refused(
        &c,
        post.clone(),
        create,
        json!({"tags": {"k": "v".repeat(257)}}),
        "tags.k",
    )
    .await;
    refused(
        &c,
        post.clone(),
        create,
        json!({"name": "n".repeat(129)}),
        "name",
    )
    .await;

    refused(&c, Method::PATCH, &sandbox, json!({"tags": many}), "tags").await;
    let ext = format!("{sandbox}/extend");
    refused(
        &c,
        post.clone(),
        &ext,
        json!({"duration_ms": i64::MAX}),
        "duration_ms",
    )
    .await;

    refused(
        &c,
        post.clone(),
        &commands,
        json!({"argv": ["echo", big]}),
        "argv[1]",
    )
    .await;
    refused(
        &c,
        post.clone(),
        &commands,
        json!({"argv": ["true"], "env": {"A": big}}),
        "env.A",
    )
    .await;
    refused(
        &c,
        post.clone(),
        &commands,
        json!({"argv": ["true"], "pty": {"rows": 0, "cols": 80}}),
        "pty.rows",
    )
    .await;

    // Over 1 MiB is refused before it is parsed.
    let huge = json!({"name": "x".repeat(2 << 20)}).to_string();
    let (status, text) = send(&c, post.clone(), create, huge).await;
    assert_eq!(status, 413, "{text:.200}");
    assert!(text.starts_with("payload_too_large"), "{text:.200}");

    // None of it created a sandbox, and the one there still runs commands.
    let list = c.list_sandboxes(&Default::default()).await.unwrap();
    assert_eq!(list.sandboxes.len(), 1);
    let (status, text) = send(
        &c,
        post,
        &commands,
        json!({"argv": ["true"], "env": {"OK": "x".repeat(30_000)}}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
}
