//! `belljar-agent`: parse the configuration, prepare the system for the mode (mounts as a
//! microVM's or namespace sandbox's init), serve the daemon, end the sandbox.

use std::io::Write;
use std::time::Duration;

use belljar_agent::agent::{Outcome, run};
use belljar_agent::config::{Config, Mode};
use belljar_agent::system;

/// Blocking threads started at once and kept (see `main`).
const WARM_BLOCKING_THREADS: usize = 4;

/// Long enough that idle blocking threads are never given back in practice.
const BLOCKING_THREAD_KEEP_ALIVE: Duration = Duration::from_secs(365 * 24 * 3600);

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
    // Inside a sandbox the agent shares the sandbox's pids limit, so a fork bomb can leave it
    // unable to start threads. Tokio panics when a blocking task finds no blocking thread and
    // cannot start one, so the agent starts a few at once and keeps them for its whole life:
    // when the limit is hit, blocking work queues on them instead.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_keep_alive(BLOCKING_THREAD_KEEP_ALIVE)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&config, mode, &format!("cannot start the runtime: {e}")));
    // Each task waits until all of them run, so each holds a thread of its own: the blocking
    // pool starts a thread for a task whenever none is idle, which none is while they all
    // wait. The threads are made here, before the agent serves (so before any command can
    // spend the pids limit); their start is not waited for, which held the agent's first
    // answer ~2 ms on a busy host.
    let all_started = std::sync::Arc::new(std::sync::Barrier::new(WARM_BLOCKING_THREADS));
    for _ in 0..WARM_BLOCKING_THREADS {
        let all_started = all_started.clone();
        drop(runtime.spawn_blocking(move || {
            all_started.wait();
        }));
    }
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
