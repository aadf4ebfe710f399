//! The paths of the daemon's routes, built in one place with every variable part
//! percent-encoded, so that a file name with spaces, `&` or unicode, or an id from a user,
//! reaches the daemon intact and cannot reach another route.
//!
//! The typed methods use these; they are public for tests that drive a route by hand
//! (malformed bodies, missing tokens).

use std::fmt::Write;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// What a path segment keeps unencoded: the unreserved characters of RFC 3986.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// What a query value keeps unencoded: a segment's characters and `/`, so sandbox paths
/// stay readable in logs.
const QUERY_VALUE: &AsciiSet = &SEGMENT.remove(b'/');

pub const INFO: &str = "/v1/info";
pub const DOCTOR: &str = "/v1/doctor";
pub const OPENAPI: &str = "/v1/openapi.json";
pub const IMAGES: &str = "/v1/images";
pub const EVENTS: &str = "/v1/events";
pub const SESSION_TOKEN: &str = "/v1/session/token";
pub const SANDBOXES: &str = "/v1/sandboxes";
pub const SNAPSHOTS: &str = "/v1/snapshots";
pub const VOLUMES: &str = "/v1/volumes";
pub const TEMPLATES: &str = "/v1/templates";

/// Percent-encodes one path segment.
pub fn segment(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// Percent-encodes a query value.
pub fn query_value(s: &str) -> String {
    utf8_percent_encode(s, QUERY_VALUE).to_string()
}

/// `path?k1=v1&k2=v2` with each value encoded; pairs with a `None` value are left out.
pub fn with_query(path: &str, pairs: &[(&str, Option<String>)]) -> String {
    let mut out = path.to_string();
    let mut sep = if path.contains('?') { '&' } else { '?' };
    for (k, v) in pairs {
        if let Some(v) = v {
            let _ = write!(out, "{sep}{k}={}", query_value(v));
            sep = '&';
        }
    }
    out
}

/// `/v1/images/pull`.
pub const IMAGE_PULL: &str = "/v1/images/pull";
/// `/v1/images/build`.
pub const IMAGE_BUILD: &str = "/v1/images/build";
/// `/v1/images/import`.
pub const IMAGE_IMPORT: &str = "/v1/images/import";
/// `/v1/images/prune`.
pub const IMAGE_PRUNE: &str = "/v1/images/prune";

/// `/v1/images/{name}`.
pub fn image(name: &str) -> String {
    format!("{IMAGES}/{}", segment(name))
}

/// `/v1/images/{name}/export`.
pub fn image_export(name: &str) -> String {
    format!("{IMAGES}/{}/export", segment(name))
}

/// `/v1/images/{name}/build`.
pub fn image_build(name: &str) -> String {
    format!("{IMAGES}/{}/build", segment(name))
}

/// `/v1/sandboxes/{id}`.
pub fn sandbox(id: &str) -> String {
    format!("{SANDBOXES}/{}", segment(id))
}

/// `/v1/sandboxes/{id}/{rest}`, for the routes below a sandbox (`extend`, `stop`,
/// `terminal`, `files/tar`, ...).
pub fn sandbox_sub(id: &str, rest: &str) -> String {
    format!("{}/{rest}", sandbox(id))
}

/// `/v1/sandboxes/{id}/commands`.
pub fn commands(id: &str) -> String {
    sandbox_sub(id, "commands")
}

/// `/v1/sandboxes/{id}/commands/{cid}`.
pub fn command(id: &str, cid: &str) -> String {
    format!("{}/{}", commands(id), segment(cid))
}

/// `/v1/sandboxes/{id}/commands/{cid}/{rest}` (`logs`, `kill`, `stdin`, `resize`).
pub fn command_sub(id: &str, cid: &str, rest: &str) -> String {
    format!("{}/{rest}", command(id, cid))
}

/// `/v1/sandboxes/{id}/files{rest}?path=...`: `rest` is `""`, `/stat`, `/list`, `/tar`, ...
pub fn file(id: &str, rest: &str, path: &str) -> String {
    with_query(
        &sandbox_sub(id, &format!("files{rest}")),
        &[("path", Some(path.to_string()))],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_keep_slashes_and_encode_the_rest() {
        assert_eq!(query_value("/a b/é&x=1"), "/a%20b/%C3%A9%26x%3D1");
        assert_eq!(query_value("plain/path.txt~-_"), "plain/path.txt~-_");
        assert_eq!(query_value("a+b?c#d%"), "a%2Bb%3Fc%23d%25");
    }

    #[test]
    fn builds_query_strings() {
        assert_eq!(
            with_query(
                "/v1/x",
                &[
                    ("path", Some("/a b".into())),
                    ("mode", None),
                    ("r", Some("1".into()))
                ]
            ),
            "/v1/x?path=/a%20b&r=1"
        );
        assert_eq!(with_query("/v1/x", &[("a", None)]), "/v1/x");
        assert_eq!(
            with_query("/v1/x?a=1", &[("b", Some("2".into()))]),
            "/v1/x?a=1&b=2"
        );
    }

    #[test]
    fn a_segment_cannot_climb_to_another_route() {
        assert_eq!(sandbox("../info"), "/v1/sandboxes/..%2Finfo");
        assert_eq!(
            command("sbx_1", "cmd_a?x"),
            "/v1/sandboxes/sbx_1/commands/cmd_a%3Fx"
        );
        assert_eq!(image_build("python3.13"), "/v1/images/python3.13/build");
        assert_eq!(
            file("sbx_1", "/stat", "/tmp/a b"),
            "/v1/sandboxes/sbx_1/files/stat?path=/tmp/a%20b"
        );
    }
}
