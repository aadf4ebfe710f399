//! `belljar`: the command-line client of `belljard`. Parses the command line, runs one
//! command, and prints errors as one line (`error: <message> (<code>)`) with exit status 1
//! (clap's usage errors exit with 2).

#![forbid(unsafe_code)]

mod args;
mod commands;

use std::io::Write;
use std::process::ExitCode;

use belljar_cli::client::ClientError;
use belljar_cli::cp::CopyError;
use belljar_cli::duration::DurationError;
use belljar_cli::exec::ExecError;
use belljar_cli::launcher::LauncherError;
use belljar_cli::ndjson::NdjsonError;
use belljar_cli::paths::PathsError;
use belljar_cli::terminal::TerminalError;
use clap::Parser;

fn main() -> ExitCode {
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
        Err(err) => {
            let _ = std::io::stdout().flush();
            eprintln!("error: {} ({})", one_line(&err), code_of(&err));
            1
        }
    };
    let _ = std::io::stdout().flush();
    // Exit now: a thread blocked reading stdin must not keep the process alive.
    std::process::exit(status);
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
        if let Some(e) = cause.downcast_ref::<LauncherError>() {
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
