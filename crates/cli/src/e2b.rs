//! `belljar e2b`: runs a program with E2B's SDKs (`e2b` on PyPI and npm) pointed at the local
//! daemon, or prints the environment that does it (`belljar e2b env`).
//!
//! The SDKs read their endpoints from the environment: `E2B_API_URL` (the control plane) and
//! `E2B_SANDBOX_URL` (envd, the in-sandbox API; with it set, the SDK names the sandbox in a
//! header, so one daemon endpoint serves them all) point at the daemon's E2B layer on
//! 127.0.0.1, and `E2B_API_KEY` is the daemon's own token. `E2B_HTTP_VERSION=1.1` because the
//! daemon speaks HTTP/1.1. No account and no network are involved.

use std::ffi::OsString;

/// Where the daemon serves E2B's control plane.
pub const PREFIX: &str = "/compat/e2b";

/// Where the daemon serves envd, under [`PREFIX`].
pub const ENVD: &str = "/envd";

/// The variables for a daemon on `port` with `token`.
pub fn variables(port: u16, token: &str) -> Vec<(String, OsString)> {
    let api = format!("http://127.0.0.1:{port}{PREFIX}");
    vec![
        ("E2B_API_URL".into(), api.clone().into()),
        ("E2B_SANDBOX_URL".into(), format!("{api}{ENVD}").into()),
        ("E2B_API_KEY".into(), token.into()),
        ("E2B_DOMAIN".into(), "127.0.0.1".into()),
        ("E2B_HTTP_VERSION".into(), "1.1".into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_is_pointed_at_the_daemon() {
        let env = variables(4242, "tok");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).unwrap().1.clone();
        assert_eq!(get("E2B_API_URL"), "http://127.0.0.1:4242/compat/e2b");
        assert_eq!(
            get("E2B_SANDBOX_URL"),
            "http://127.0.0.1:4242/compat/e2b/envd"
        );
        assert_eq!(get("E2B_API_KEY"), "tok");
        assert!(!env.iter().any(|(k, _)| k == "E2B_DEBUG"));
    }
}
