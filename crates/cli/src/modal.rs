//! `belljar modal`: runs a program with Modal's Python client (`modal` on PyPI, 1.x) pointed at
//! the local daemon, or prints the environment that does it (`belljar modal env`).
//!
//! The client reads its server and credentials from the environment: `MODAL_SERVER_URL` is the
//! daemon's Modal layer (gRPC on a loopback port of its own, written to `<runtime>/modal-port`;
//! a loopback `http://` URL, because only then does the client reach a sandbox's command
//! router in plain text), and `MODAL_TOKEN_ID`/`MODAL_TOKEN_SECRET` a fixed id and the daemon's
//! own token. `MODAL_SANDBOX_V2=0` picks the client's sandboxes driven through the
//! control-plane RPCs (its "V1" kind, which it also uses for GPU sandboxes), the kind the
//! layer serves. No account and no network are involved.

use std::ffi::OsString;

/// The token id the daemon's Modal layer expects beside its token.
pub const TOKEN_ID: &str = "ak-belljar";

/// The variables for a daemon whose Modal layer is on `port`, with `token`.
pub fn variables(port: u16, token: &str) -> Vec<(String, OsString)> {
    vec![
        (
            "MODAL_SERVER_URL".into(),
            format!("http://127.0.0.1:{port}").into(),
        ),
        ("MODAL_TOKEN_ID".into(), TOKEN_ID.into()),
        ("MODAL_TOKEN_SECRET".into(), token.into()),
        ("MODAL_SANDBOX_V2".into(), "0".into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_is_pointed_at_the_daemon() {
        let env = variables(4242, "tok");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).unwrap().1.clone();
        assert_eq!(get("MODAL_SERVER_URL"), "http://127.0.0.1:4242");
        assert_eq!(get("MODAL_TOKEN_ID"), TOKEN_ID);
        assert_eq!(get("MODAL_TOKEN_SECRET"), "tok");
        assert_eq!(get("MODAL_SANDBOX_V2"), "0");
    }
}
