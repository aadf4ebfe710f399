//! `belljar e2b`: runs a program with E2B's SDKs (`e2b` on PyPI and npm) pointed at the local
//! daemon, or prints the environment that does it (`belljar e2b env`).
//!
//! The SDKs read their endpoints from the environment: `E2B_API_URL` (the control plane) and
//! `E2B_SANDBOX_URL` (envd, the in-sandbox API; with it set, the SDK names the sandbox in a
//! header, so one daemon endpoint serves them all) point at the daemon's E2B layer on
//! 127.0.0.1, and `E2B_API_KEY` is the daemon's own token. `E2B_HTTP_VERSION=1.1` because the
//! daemon speaks HTTP/1.1. No account and no network are involved.

use std::ffi::OsString;

use belljar_client::{Client, ClientError, Paths};

/// Where the daemon serves E2B's control plane.
pub const PREFIX: &str = "/compat/e2b";

/// Where the daemon serves envd, under [`PREFIX`].
pub const ENVD: &str = "/envd";

#[derive(Debug, thiserror::Error)]
pub enum E2bError {
    /// The daemon could not be reached.
    #[error("Cannot reach the daemon")]
    Daemon(#[source] ClientError),
    /// The daemon's TCP port is not known (it writes it at start).
    #[error("The daemon's TCP port is not known; is it listening on 127.0.0.1?")]
    NoPort,
    /// The daemon's token is not readable.
    #[error("Cannot read the daemon's token")]
    NoToken,
    /// The program could not be started.
    #[error("Cannot run {program}")]
    Exec {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// No program was given.
    #[error("Give a program to run: belljar e2b -- python3 app.py")]
    NoProgram,
}

impl E2bError {
    /// The stable code printed after the message.
    pub fn code(&self) -> &str {
        match self {
            Self::Daemon(e) => e.code(),
            Self::NoPort => "daemon_not_listening",
            Self::NoToken => "io",
            Self::Exec { .. } => "exec_failed",
            Self::NoProgram => "bad_request",
        }
    }
}

/// The variables to add to a program's environment, in order.
pub async fn environment(
    client: &Client,
    paths: &Paths,
) -> Result<Vec<(String, OsString)>, E2bError> {
    // Starts the daemon if it is not running, so that its port and token are there.
    client.info().await.map_err(E2bError::Daemon)?;
    let port = paths.port().ok_or(E2bError::NoPort)?;
    let token = paths.token().ok_or(E2bError::NoToken)?;
    Ok(variables(port, &token))
}

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

/// Replaces this process with `argv` under `env` (returns only on failure).
pub fn exec(argv: &[String], env: &[(String, OsString)]) -> E2bError {
    use std::os::unix::process::CommandExt;
    let Some((program, args)) = argv.split_first() else {
        return E2bError::NoProgram;
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    E2bError::Exec {
        program: program.clone(),
        source: cmd.exec(),
    }
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
