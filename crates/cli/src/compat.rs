//! What the compatibility launchers share (`belljar vercel|sandbox0|e2b|modal`): the daemon's
//! port and token, which each layer's variables are made of; the `export` lines of `env`; and
//! the program that `-- CMD` becomes, under those variables.

use std::ffi::OsString;

use belljar_client::{Client, ClientError, Paths};

#[derive(Debug, thiserror::Error)]
pub enum CompatError {
    /// The daemon could not be reached (and not started).
    #[error("Cannot reach the daemon")]
    Daemon(#[source] ClientError),
    /// The daemon has not written the port a layer is served on (it writes them at start).
    #[error("The daemon's {port} is not known; is it listening on 127.0.0.1?")]
    NoPort { port: &'static str },
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
    #[error("Give a program to run: belljar {layer} -- {example}")]
    NoProgram {
        layer: &'static str,
        example: &'static str,
    },
}

impl CompatError {
    /// The stable code printed after the message.
    pub fn code(&self) -> &str {
        match self {
            Self::Daemon(e) => e.code(),
            Self::NoPort { .. } => "daemon_not_listening",
            Self::NoToken => "io",
            Self::Exec { .. } => "exec_failed",
            Self::NoProgram { .. } => "bad_request",
        }
    }
}

/// Which of the daemon's ports a layer is served on.
#[derive(Debug, Clone, Copy)]
pub enum Port {
    /// The HTTP API's TCP port (`<runtime>/port`).
    Api,
    /// The Modal layer's gRPC port (`<runtime>/modal-port`).
    Modal,
}

/// The daemon's `port` and its token, starting the daemon first if it is not running (so that
/// it has written both).
async fn port_and_token(
    client: &Client,
    paths: &Paths,
    port: Port,
) -> Result<(u16, String), CompatError> {
    client.info().await.map_err(CompatError::Daemon)?;
    let number = match port {
        Port::Api => paths.port().ok_or(CompatError::NoPort { port: "TCP port" }),
        Port::Modal => paths
            .modal_port()
            .ok_or(CompatError::NoPort { port: "Modal port" }),
    }?;
    let token = paths.token().ok_or(CompatError::NoToken)?;
    Ok((number, token))
}

/// A layer's variables (`variables` of the daemon's `port` and its token), in order.
pub async fn environment(
    client: &Client,
    paths: &Paths,
    port: Port,
    variables: fn(u16, &str) -> Vec<(String, OsString)>,
) -> Result<Vec<(String, OsString)>, CompatError> {
    let (number, token) = port_and_token(client, paths, port).await?;
    Ok(variables(number, &token))
}

/// The variables as shell `export` lines, which a shell reads back as they were.
pub fn export_lines(env: &[(String, OsString)]) -> String {
    env.iter()
        .map(|(k, v)| {
            let v = v.to_string_lossy();
            // An environment value never holds a NUL, the one thing a shell word cannot carry.
            let quoted = shlex::try_quote(&v).map_or_else(|_| v.to_string(), |q| q.into_owned());
            format!("export {k}={quoted}\n")
        })
        .collect()
}

/// Replaces this process with `argv` under `env` added to its own (returns only on failure);
/// `layer` and `example` name the launcher when no program is given.
pub fn exec(
    argv: &[String],
    env: &[(String, OsString)],
    layer: &'static str,
    example: &'static str,
) -> CompatError {
    use std::os::unix::process::CommandExt;
    let Some((program, args)) = argv.split_first() else {
        return CompatError::NoProgram { layer, example };
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).envs(env.iter().map(|(k, v)| (k, v)));
    CompatError::Exec {
        program: program.clone(),
        source: cmd.exec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_shells() {
        let odd = "a'b c \"$HOME\" `x` \\ \n!";
        let env = [("ODD".to_owned(), OsString::from(odd))];
        let script = format!("{}printf %s \"$ODD\"", export_lines(&env));
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), odd);
    }

    #[test]
    fn no_program_is_a_bad_request_naming_the_launcher() {
        let e = exec(&[], &[], "modal", "python3 app.py");
        assert_eq!(e.code(), "bad_request");
        assert_eq!(
            e.to_string(),
            "Give a program to run: belljar modal -- python3 app.py"
        );
    }

    #[test]
    fn a_missing_program_is_exec_failed() {
        let e = exec(
            &["/nonexistent/belljar-no-such-program".into()],
            &[],
            "e2b",
            "python3 app.py",
        );
        assert_eq!(e.code(), "exec_failed");
    }
}
