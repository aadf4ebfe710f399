//! `belljar sandbox0`: runs a program with Sandbox0's SDK pointed at the local daemon, or
//! prints the environment that does it (`belljar sandbox0 env`).
//!
//! Sandbox0's SDKs take a base URL for self-hosted deployments and a bearer token from
//! `SANDBOX0_BASE_URL` and `SANDBOX0_TOKEN`: the first is the daemon's Sandbox0 layer on
//! 127.0.0.1, the second the daemon's own token, which the layer checks like the rest of the
//! API. No account and no network are involved.

use std::ffi::OsString;

use belljar_client::Paths;

/// Where the daemon serves Sandbox0's API.
pub const PREFIX: &str = "/compat/sandbox0";

#[derive(Debug, thiserror::Error)]
pub enum Sandbox0Error {
    /// The daemon's TCP port or token is not known (it writes them at start).
    #[error("The daemon's TCP port or token is not known; is it listening on 127.0.0.1?")]
    NotListening,
    /// The program could not be started.
    #[error("Cannot run {program}")]
    Exec {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// No program was given.
    #[error("Give a program to run: belljar sandbox0 -- python3 app.py")]
    NoProgram,
}

impl Sandbox0Error {
    /// The stable code printed after the message.
    pub fn code(&self) -> &str {
        match self {
            Self::NotListening => "daemon_not_listening",
            Self::Exec { .. } => "exec_failed",
            Self::NoProgram => "bad_request",
        }
    }
}

/// The variables to add to a program's environment, in order.
pub fn environment(paths: &Paths) -> Result<Vec<(String, OsString)>, Sandbox0Error> {
    let port = paths.port().ok_or(Sandbox0Error::NotListening)?;
    let token = paths.token().ok_or(Sandbox0Error::NotListening)?;
    Ok(vec![
        (
            "SANDBOX0_BASE_URL".into(),
            format!("http://127.0.0.1:{port}{PREFIX}").into(),
        ),
        ("SANDBOX0_TOKEN".into(), token.into()),
    ])
}

/// Replaces this process with `argv` under `env` (returns only on failure).
pub fn exec(argv: &[String], env: &[(String, OsString)]) -> Sandbox0Error {
    use std::os::unix::process::CommandExt;
    let Some((program, args)) = argv.split_first() else {
        return Sandbox0Error::NoProgram;
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).envs(env.iter().map(|(k, v)| (k, v)));
    Sandbox0Error::Exec {
        program: program.clone(),
        source: cmd.exec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_program_is_a_bad_request() {
        assert_eq!(exec(&[], &[]).code(), "bad_request");
    }
}
