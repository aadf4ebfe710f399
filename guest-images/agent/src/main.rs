//! `belljar-agent`: parse the configuration, prepare the system for the mode (mounts as a
//! microVM's or namespace sandbox's init), serve the daemon, end the sandbox.

use std::io::Write;

use belljar_agent::agent::{Outcome, run};
use belljar_agent::config::{Config, Mode};
use belljar_agent::system;

fn main() {
    let config = Config::load().unwrap_or_else(|e| e.exit());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BELLJAR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let mode = config.mode();

    if let Err(e) = system::init(&config) {
        fail(&config, mode, &describe(&e));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&config, mode, &format!("cannot start the runtime: {e}")));
    match runtime.block_on(run(&config)) {
        Ok(outcome) => {
            if config.selfcheck {
                println!("BELLJAR-SELFCHECK-OK");
                let _ = std::io::stdout().flush();
            }
            end(&config, mode, outcome == Outcome::Reboot)
        }
        Err(e) => fail(&config, mode, &describe(&e)),
    }
}

fn describe(e: &dyn std::error::Error) -> String {
    match e.source() {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

/// Reports `why` and ends: as init the sandbox powers off (init must never just exit).
fn fail(config: &Config, mode: Mode, why: &str) -> ! {
    if config.selfcheck {
        println!("BELLJAR-SELFCHECK-FAILED {why}");
        let _ = std::io::stdout().flush();
    }
    eprintln!("belljar-agent: {why}");
    if std::process::id() == 1 {
        system::end(mode, false);
    }
    std::process::exit(1)
}

fn end(config: &Config, mode: Mode, reboot: bool) -> ! {
    if config.selfcheck && std::process::id() != 1 {
        std::process::exit(0);
    }
    system::end(mode, reboot)
}
