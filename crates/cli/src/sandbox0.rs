//! `belljar sandbox0`: runs a program with Sandbox0's SDK pointed at the local daemon, or
//! prints the environment that does it (`belljar sandbox0 env`).
//!
//! Sandbox0's SDKs take a base URL for self-hosted deployments and a bearer token from
//! `SANDBOX0_BASE_URL` and `SANDBOX0_TOKEN`: the first is the daemon's Sandbox0 layer on
//! 127.0.0.1, the second the daemon's own token, which the layer checks like the rest of the
//! API. No account and no network are involved.

use std::ffi::OsString;

/// Where the daemon serves Sandbox0's API.
pub const PREFIX: &str = "/compat/sandbox0";

/// The variables for a daemon on `port` with `token`.
pub fn variables(port: u16, token: &str) -> Vec<(String, OsString)> {
    vec![
        (
            "SANDBOX0_BASE_URL".into(),
            format!("http://127.0.0.1:{port}{PREFIX}").into(),
        ),
        ("SANDBOX0_TOKEN".into(), token.into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_is_pointed_at_the_daemon() {
        let env = variables(4242, "tok");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).unwrap().1.clone();
        assert_eq!(
            get("SANDBOX0_BASE_URL"),
            "http://127.0.0.1:4242/compat/sandbox0"
        );
        assert_eq!(get("SANDBOX0_TOKEN"), "tok");
    }
}
