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
    let events = client.build_image(name).await?;
    follow_image_events(events, "built", json).await
}

pub(crate) async fn pull_image(
    client: &Client,
    reference: &str,
    insecure: bool,
    json: bool,
) -> Result<i32> {
    let events = client.pull_image(reference, insecure).await?;
    follow_image_events(events, "pulled", json).await
}

/// Pulls the image a sandbox is being made of, reporting only on stderr (stdout is the
/// sandbox's, or its command's).
pub(crate) async fn pull_for_create(client: &Client, reference: &str) -> Result<()> {
    eprintln!("pulling {reference}");
    let events = client.pull_image(reference, false).await?;
    follow_events_to(events, "pulled", false, true)
        .await
        .map(|_| ())
}

/// `belljar images import PATH`: a file is sent as it is, a directory (an OCI layout) as a tar
/// of it.
pub(crate) async fn import_image(
    client: &Client,
    path: &std::path::Path,
    tag: Option<&str>,
    json: bool,
) -> Result<i32> {
    let meta = tokio::fs::metadata(path)
        .await
        .with_context(|| format!("Cannot read {}", path.display()))?;
    let events = if meta.is_dir() {
        let (tarball, builder) = belljar_cli::cp::tar_stream(path.to_path_buf(), None);
        let events = client
            .import_image(belljar_client::streamed(tarball), tag)
            .await?;
        builder
            .await
            .context("The archive's tar writer failed")?
            .with_context(|| format!("Cannot read {}", path.display()))?;
        events
    } else {
        let file = tokio::fs::File::open(path)
            .await
            .with_context(|| format!("Cannot open {}", path.display()))?;
        let body = tokio_util::io::ReaderStream::with_capacity(file, 1 << 20);
        client
            .import_image(belljar_client::streamed(body), tag)
            .await?
    };
    follow_image_events(events, "imported", json).await
}

/// Prints an image operation's progress (on stderr) and each image it made; the first
/// `error` fails the command with its code.
pub(crate) async fn follow_image_events(
    events: belljar_client::NdjsonStream<ImageBuildEvent>,
    verb: &str,
    json: bool,
) -> Result<i32> {
    follow_events_to(events, verb, json, false).await
}

/// See [`follow_image_events`]; with `stderr_only`, the images made are reported on stderr
/// and nothing goes to stdout.
async fn follow_events_to(
    mut events: belljar_client::NdjsonStream<ImageBuildEvent>,
    verb: &str,
    json: bool,
    stderr_only: bool,
) -> Result<i32> {
    let mut done = 0;
    while let Some(event) = events.next().await? {
        if json && !stderr_only {
            outln!("{}", serde_json::to_string(&event)?)?;
        }
        match event {
            ImageBuildEvent::Progress { message } => {
                if !json || stderr_only {
                    eprintln!("{message}");
                }
            }
            ImageBuildEvent::Step {
                step,
                steps,
                instruction,
                cached,
            } => {
                if !json || stderr_only {
                    let first = instruction.lines().next().unwrap_or_default();
                    let mark = if cached { " CACHED" } else { "" };
                    eprintln!("[{step}/{steps}] {first}{mark}");
                }
            }
            ImageBuildEvent::Done { image } => {
                let line = format!(
                    "{} {verb}{}",
                    image.name,
                    image.digest.map(|d| format!(" ({d})")).unwrap_or_default()
                );
                if stderr_only {
                    eprintln!("{line}");
                } else if !json {
                    outln!("{line}")?;
                }
                done += 1;
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
    if done == 0 {
        anyhow::bail!("The image stream ended without a result");
    }
    Ok(0)
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
