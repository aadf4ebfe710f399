//! The served OpenAPI document and the served routes are the same set: every documented
//! operation is routed (its method on its path does not fall through to "no route"), and every
//! other method on a documented path is 405. Together with `utoipa_axum`, which adds a route
//! only with its operation, the document cannot name a route that is not there, nor miss one.

mod common;

use common::Daemon;

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

/// A documented path with its parameters filled in (ids that do not exist, an image that is
/// not one, so nothing is created, built or streamed).
fn concrete(path: &str) -> String {
    path.replace("{id}", "sbx_nope")
        .replace("{cid}", "cmd_nope")
        .replace("{name}", "no-such-image")
}

#[test]
fn the_document_lists_exactly_the_routes_that_answer() {
    let d = Daemon::start();
    let doc = d.unix("GET", "/v1/openapi.json", "").json();
    let paths = doc["paths"].as_object().unwrap();
    let mut operations = 0;
    for (path, item) in paths {
        let documented: Vec<String> = item
            .as_object()
            .unwrap()
            .keys()
            .map(|m| m.to_ascii_uppercase())
            .collect();
        // `since=x` makes the one stream without an id (`/v1/events`) answer 400 at once.
        let url = format!("{}?since=x", concrete(path));
        for method in METHODS {
            let reply = d.unix(method, &url, "[");
            if documented.iter().any(|m| m == method) {
                operations += 1;
                assert_ne!(
                    reply.status, 405,
                    "{method} {path} is documented, not routed"
                );
                assert!(
                    !(reply.status == 404 && reply.body.contains("No route")),
                    "{method} {path} is documented, not routed: {}",
                    reply.body
                );
            } else {
                assert_eq!(
                    reply.status, 405,
                    "{method} {path} is routed, not documented: {}",
                    reply.body
                );
            }
        }
    }
    assert_eq!(operations, 68);
    let none = d.unix("GET", "/v1/no-such-route", "");
    assert_eq!((none.status, none.code().as_str()), (404, "not_found"));
}
