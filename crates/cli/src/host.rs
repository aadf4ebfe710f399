//! The `belljar` subcommands that act on the host rather than on one sandbox: the daemon's
//! start/stop/status, the web UI's login link, image builds and `doctor`. Kept apart from
//! `commands` so that file holds the sandbox commands only.

use anyhow::{Context, Result};
use belljar_api::ImageBuildEvent;
use belljar_cli::launcher;
use belljar_cli::output;
use belljar_client::{Client, ClientError, Paths};

use crate::args::DaemonCmd;
use crate::commands::print_json;

pub(crate) async fn build_image(client: &Client, name: &str, json: bool) -> Result<i32> {
    let mut events = client.build_image(name).await?;
    while let Some(event) = events.next().await? {
        if json {
            outln!("{}", serde_json::to_string(&event)?)?;
        }
        match event {
            ImageBuildEvent::Progress { message } => {
                if !json {
                    eprintln!("{message}");
                }
            }
            ImageBuildEvent::Done { image } => {
                if !json {
                    outln!(
                        "{} built{}",
                        image.name,
                        image.digest.map(|d| format!(" ({d})")).unwrap_or_default()
                    )?;
                }
                return Ok(0);
            }
            ImageBuildEvent::Error { code, message } => {
                return Err(ClientError::Api {
                    status: code.status(),
                    code,
                    message,
                }
                .into());
            }
        }
    }
    anyhow::bail!("The image build stream ended without a result")
}

pub(crate) async fn ui(client: &Client, paths: &Paths, no_open: bool) -> Result<i32> {
    let port = paths
        .port()
        .context("The daemon has not written its TCP port")?;
    let url = client.ui_login_url(port).await?;
    outln!("{url}")?;
    let has_display =
        std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some();
    if !no_open && has_display {
        let _ = std::process::Command::new("xdg-open")
            .arg(&url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
    }
    Ok(0)
}

pub(crate) async fn daemon(paths: &Paths, action: DaemonCmd, json: bool) -> Result<i32> {
    let client = Client::local(paths);
    match action {
        DaemonCmd::Start { port } => {
            if client.answers().await {
                eprintln!("belljard is already running");
                return Ok(0);
            }
            let args: Vec<String> = port
                .map(|p| vec!["--port".to_string(), p.to_string()])
                .unwrap_or_default();
            let pid = launcher::start(paths, &args).await?;
            if json {
                print_json(&serde_json::json!({"pid": pid, "socket": paths.socket()}))?;
            } else {
                outln!(
                    "belljard started (pid {pid}), log: {}",
                    paths.log_file().display()
                )?;
            }
            Ok(0)
        }
        DaemonCmd::Stop => {
            let pid = launcher::stop(paths).await?;
            if !json {
                outln!("belljard stopped (pid {pid})")?;
            }
            Ok(0)
        }
        DaemonCmd::Status => {
            if !client.answers().await {
                if json {
                    print_json(&serde_json::json!({"running": false}))?;
                } else {
                    outln!("running:   no")?;
                }
                return Ok(1);
            }
            let info = client.info().await?;
            let pid = paths.pid();
            let port = paths.port();
            if json {
                print_json(&serde_json::json!({
                    "running": true,
                    "pid": pid,
                    "socket": paths.socket(),
                    "port": port,
                    "info": info,
                }))?;
            } else {
                out!(
                    "{}",
                    output::daemon(&info, pid, &paths.socket().display().to_string(), port)
                )?;
            }
            Ok(0)
        }
    }
}

/// `belljar doctor`: exit status 1 when a finding is a problem.
pub(crate) async fn doctor(paths: &Paths, json: bool) -> Result<i32> {
    let exe = std::env::current_exe().context("cannot find the belljar binary")?;
    let report = belljar_doctor::gather(paths, &exe).await;
    if json {
        print_json(&report)?;
    } else {
        out!("{}", belljar_doctor::render(&report))?;
    }
    Ok(if report.ok { 0 } else { 1 })
}
