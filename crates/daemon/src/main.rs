//! belljard: parse the configuration, then run the daemon until SIGTERM.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BELLJAR_LOG")
                .unwrap_or_else(|_| "belljard=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = belljard::config::Config::parse();
    belljard::server::run(config).await?;
    Ok(())
}
