//! `belljar`: the command-line client of `belljard`. Parses the command line, runs one
//! command, and prints errors as one line (`error: <message> (<code>)`) with exit status 1
//! (clap's usage errors exit with 2).
//!
//! A closed standard output (`belljar ls | head -1`) ends the CLI quietly with status 141,
//! the status of a process that SIGPIPE killed, as `ls`, `cat` and `seq` report it: every
//! write to stdout goes through [`out!`]/[`outln!`], which return the error instead of
//! panicking as `print!` does, and [`main`] turns a broken pipe anywhere in an error's chain
//! into that status.

#![forbid(unsafe_code)]

/// `print!` that returns the `io::Error` instead of panicking on it.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `println!` that returns the `io::Error` instead of panicking on it.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

mod args;
mod build;
mod commands;
mod host;
mod netcmd;
mod templates;
mod timeline;

use std::io::Write;
use std::process::ExitCode;

use belljar_cli::cp::CopyError;
use belljar_cli::duration::DurationError;
use belljar_cli::exec::ExecError;
use belljar_cli::launcher::LauncherError;
use belljar_cli::terminal::TerminalError;
use belljar_client::{ClientError, NdjsonError, PathsError};
use clap::Parser;

fn main() -> ExitCode {
    // Before the runtime starts: a doctor probe child needs a single-threaded process.
    if let Some(status) = belljar_doctor::run_probe_if_asked() {
        return ExitCode::from(u8::try_from(status).unwrap_or(1));
    }
    let cli = args::Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e} (internal)");
            return ExitCode::from(1);
        }
    };
    let status = match runtime.block_on(commands::run(cli)) {
        Ok(status) => status,
        Err(err) if is_broken_pipe(&err) => BROKEN_PIPE,
        Err(err) => {
            let _ = std::io::stdout().flush();
            eprintln!("error: {} ({})", one_line(&err), code_of(&err));
            1
        }
    };
    let status = match std::io::stdout().flush() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => BROKEN_PIPE,
        _ => status,
    };
    // Exit now: a thread blocked reading stdin must not keep the process alive.
    std::process::exit(status);
}

/// The exit status after the reader of stdout went away: 128 + SIGPIPE, what a shell reports
/// for a process that the signal killed.
const BROKEN_PIPE: i32 = 141;

/// Whether the error, or any cause of it, is a write into a closed pipe. A broken pipe
/// under a [`ClientError`] is the daemon's socket, not stdout: that one is an error to print.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    for cause in err.chain() {
        if cause.is::<ClientError>() {
            return false;
        }
        if cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return true;
        }
    }
    false
}

/// The message of an error and its causes on one line.
fn one_line(err: &anyhow::Error) -> String {
    let text = format!("{err:#}");
    text.replace('\n', " ")
}

/// The stable code of the first typed error in the chain.
fn code_of(err: &anyhow::Error) -> String {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<ClientError>() {
            return e.code().to_string();
        }
        if let Some(e) = cause.downcast_ref::<ExecError>() {
            return e.code().to_string();
        }
        if let Some(e) = cause.downcast_ref::<CopyError>() {
            return e.code().to_string();
        }
        if let Some(e) = cause.downcast_ref::<TerminalError>() {
            return e.code().to_string();
        }
        if let Some(e) = cause.downcast_ref::<belljar_cli::mcp::McpError>() {
            return e.code().to_string();
        }
        if let Some(e) = cause.downcast_ref::<LauncherError>() {
            return e.code().to_string();
        }
        if let Some(e) = cause.downcast_ref::<belljar_cli::vercel::VercelError>() {
            return e.code().to_string();
        }
        if let Some(e) = cause.downcast_ref::<belljar_cli::compat::CompatError>() {
            return e.code().to_string();
        }
        if cause.downcast_ref::<DurationError>().is_some()
            || cause.downcast_ref::<commands::InputError>().is_some()
        {
            return "bad_request".to_string();
        }
        if cause.downcast_ref::<NdjsonError>().is_some() {
            return "connection_lost".to_string();
        }
        if cause.downcast_ref::<PathsError>().is_some() {
            return "no_home".to_string();
        }
    }
    "error".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::BrokenPipe)
    }

    #[test]
    fn a_closed_stdout_ends_quietly_but_a_closed_daemon_socket_is_an_error() {
        let stdout = anyhow::Error::from(pipe()).context("writing the listing");
        assert!(is_broken_pipe(&stdout));
        let socket = ClientError::Connect {
            at: "/run/belljar.sock".into(),
            source: pipe(),
        };
        assert!(!is_broken_pipe(
            &anyhow::Error::from(socket).context("build")
        ));
    }
}
