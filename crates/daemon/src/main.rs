//! belljard: parse the configuration, then run the daemon until SIGTERM.

fn main() -> std::process::ExitCode {
    // Before any runtime thread starts: `GET /v1/doctor` re-runs this binary as a probe child,
    // which needs a single-threaded process for its user namespace.
    if let Some(status) = belljar_doctor::run_probe_if_asked() {
        return std::process::ExitCode::from(u8::try_from(status).unwrap_or(1));
    }
    // A sandbox's tap opened through a child of belljard (the rootless path; see
    // `sandbox::network::open_tap`), for the same reason.
    if let Some(status) = belljar_network::tap_attach::run_if_asked() {
        return std::process::ExitCode::from(u8::try_from(status).unwrap_or(1));
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("belljard: error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(run())
}

async fn run() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BELLJAR_LOG")
                .unwrap_or_else(|_| "belljard=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = belljard::config::Config::load();
    match belljard::server::run(config).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line that the CLI shows when it started this daemon: the error with its
            // causes, no backtrace.
            eprintln!("belljard: error: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its sources on one line, each cause once.
fn one_line(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text.replace('\n', " ")
}
