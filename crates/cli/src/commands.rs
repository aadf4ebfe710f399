//! What each `belljar` subcommand does: turn its arguments into API calls and print the
//! answer, as a table or (`--json`) the API's JSON.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};

use anyhow::{Context, Result};
use belljar_api::{
    BackendChoice, CreateSandbox, ErrorCode, ListSandboxesQuery, Sandbox, SandboxStatus, Source,
    Stream,
};
use belljar_cli::compat;
use belljar_cli::cp::{self, Location};
use belljar_cli::duration::parse_ms;
use belljar_cli::exec::{self, ExecOptions};
use belljar_cli::launcher;
use belljar_cli::logs::{self, LogSink};
use belljar_cli::output::{self, now_ms};
use belljar_cli::terminal::{self, ShellOptions};
use belljar_client::{Client, ClientError, Paths};
use clap::CommandFactory;

use crate::args::{
    Cli, Cmd, CreateArgs, E2bCmd, ExecArgs, ImagesCmd, LsArgs, ModalCmd, RunArgs, Sandbox0Cmd,
    SandboxOpts, VercelCmd, VolumesCmd,
};
use crate::host;
use crate::timeline;

/// A command-line value the daemon would reject anyway, caught before asking it.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// `K=V` without `=`.
    #[error("{flag} {value:?}: expected KEY=VALUE")]
    KeyValue { flag: &'static str, value: String },
    /// An unknown status or backend name.
    #[error("{flag} {value:?}: expected one of {allowed}")]
    Choice {
        flag: &'static str,
        value: String,
        allowed: &'static str,
    },
    /// `--mount` without `:`.
    #[error("--mount {0:?}: expected SNAPSHOT:PATH")]
    Mount(String),
    /// `-v` without a `SOURCE:PATH`.
    #[error(
        "--volume {0:?}: expected SOURCE:PATH or SOURCE:PATH:ro (SOURCE a host path or a volume name)"
    )]
    Volume(String),
    /// A name that matches no sandbox.
    #[error("No sandbox with id or name {0:?}")]
    UnknownSandbox(String),
    /// A name that matches several sandboxes.
    #[error("Several sandboxes are named {0:?}; use the id")]
    AmbiguousName(String),
    /// `belljar run IMAGE` with no command, of an image that has none of its own.
    #[error("Image {0} has no command of its own: give one after --")]
    NoImageCommand(String),
}

/// Runs one command; returns the process exit status.
pub async fn run(cli: Cli) -> Result<i32> {
    let json = cli.json;
    let paths = Paths::from_env()?;
    match cli.command {
        Cmd::Completions { shell } => {
            // Rendered first: clap_complete panics on a write error such as a closed pipe.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "belljar", &mut script);
            std::io::stdout().lock().write_all(&script)?;
            Ok(0)
        }
        Cmd::Daemon { action } => host::daemon(&paths, action, json).await,
        Cmd::Doctor => host::doctor(&paths, json).await,
        Cmd::Mcp => {
            let client = launcher::ensure_running(&paths).await?;
            belljar_cli::mcp::serve(client).await?;
            Ok(0)
        }
        command => {
            let client = launcher::ensure_running(&paths).await?;
            dispatch(&client, &paths, command, json).await
        }
    }
}

async fn dispatch(client: &Client, paths: &Paths, command: Cmd, json: bool) -> Result<i32> {
    match command {
        Cmd::Create(a) => create(client, a, json).await,
        Cmd::Ls(a) => ls(client, a, json).await,
        Cmd::Info { id } => {
            let id = resolve(client, &id).await?;
            let s = client.sandbox(&id).await?;
            if json {
                print_json(&s)?;
            } else {
                out!("{}", output::sandbox(&s, now_ms()))?;
                let cmds = client.commands(&id).await?;
                if !cmds.commands.is_empty() {
                    outln!(
                        "\n{}",
                        output::commands(&cmds.commands, now_ms()).trim_end()
                    )?;
                }
            }
            Ok(0)
        }
        Cmd::Usage { id } => {
            let id = resolve(client, &id).await?;
            let usage = client.sandbox_usage(&id).await?;
            if json {
                print_json(&usage)?;
            } else {
                out!("{}", output::usage(&usage))?;
            }
            Ok(0)
        }
        Cmd::Exec(a) => exec_cmd(client, a, json).await,
        Cmd::Run(a) => run_cmd(client, a).await,
        Cmd::Sh { id, cwd, sudo } => {
            let id = resolve(client, &id).await?;
            Ok(terminal::shell(client, &id, &ShellOptions { cwd, sudo }).await?)
        }
        Cmd::Cp { src, dst, quiet } => {
            let mut src = Location::parse(&src);
            let mut dst = Location::parse(&dst);
            for loc in [&mut src, &mut dst] {
                if let Location::Sandbox { id, .. } = loc {
                    *id = resolve(client, id).await?;
                }
            }
            let progress = !quiet && !json && std::io::stderr().is_terminal();
            let report = cp::copy(client, &src, &dst, progress).await?;
            if json {
                print_json(&serde_json::json!({
                    "destination": report.destination,
                    "bytes": report.bytes,
                    "directory": report.directory,
                }))?;
            }
            Ok(0)
        }
        Cmd::Logs { id, cmd_id, follow } => {
            let id = resolve(client, &id).await?;
            let mut out = |stream: Stream, data: &[u8]| write_stream(stream, data);
            let mut raw = |line: &[u8]| write_stream(Stream::Stdout, line);
            let mut sink = if json {
                LogSink::Json(&mut raw)
            } else {
                LogSink::Output(&mut out)
            };
            logs::logs(client, &id, cmd_id.as_deref(), follow, &mut sink).await?;
            Ok(0)
        }
        Cmd::Extend { id, duration } => {
            let id = resolve(client, &id).await?;
            let duration_ms = parse_ms(&duration)?;
            let s = client.extend_sandbox(&id, duration_ms).await?;
            if json {
                print_json(&s)?;
            } else if let Some(at) = s.expires_at {
                outln!(
                    "{id} now expires in {}",
                    belljar_cli::duration::format_ms((at - now_ms()).max(0))
                )?;
            }
            Ok(0)
        }
        Cmd::Stop { ids } => {
            for id in ids {
                let id = resolve(client, &id).await?;
                let s = client.stop_sandbox(&id).await?;
                if json {
                    print_json(&s)?;
                }
            }
            Ok(0)
        }
        Cmd::Rm { ids } => {
            for id in ids {
                let id = resolve(client, &id).await?;
                client.delete_sandbox(&id).await?;
            }
            Ok(0)
        }
        Cmd::Images { action: None } => {
            let images = client.images().await?;
            if json {
                print_json(&images)?;
            } else {
                out!("{}", output::images(&images, now_ms()))?;
            }
            Ok(0)
        }
        Cmd::Images {
            action: Some(ImagesCmd::Build {
                target, tag: None, ..
            }),
        } => host::build_image(client, &target, json).await,
        Cmd::Images {
            action:
                Some(ImagesCmd::Build {
                    target,
                    tag: Some(tag),
                    file,
                    build_arg,
                    no_cache,
                }),
        } => {
            let build = crate::build::Build {
                dir: target.into(),
                tag,
                file,
                build_args: build_arg,
                no_cache,
            };
            crate::build::build(client, build, json).await
        }
        Cmd::Images {
            action:
                Some(ImagesCmd::Pull {
                    reference,
                    insecure_registry,
                }),
        } => host::pull_image(client, &reference, insecure_registry, json).await,
        Cmd::Images {
            action: Some(ImagesCmd::Import { path, tag }),
        } => host::import_image(client, &path, tag.as_deref(), json).await,
        Cmd::Images {
            action: Some(ImagesCmd::Rm { names }),
        } => {
            for n in &names {
                client.remove_image(n).await?;
                if !json {
                    outln!("{n}")?;
                }
            }
            Ok(0)
        }
        Cmd::Images {
            action: Some(ImagesCmd::Export { image, output }),
        } => {
            let mut download = client.export_image(&image).await?;
            let mut out: Box<dyn std::io::Write> = if output == "-" {
                Box::new(std::io::stdout().lock())
            } else {
                // Written beside its place and renamed when whole: a failed export leaves no
                // archive that looks complete.
                Box::new(std::fs::File::create(format!("{output}.part"))?)
            };
            while let Some(chunk) = download.chunk().await? {
                out.write_all(&chunk)?;
            }
            out.flush()?;
            drop(out);
            if output != "-" {
                std::fs::rename(format!("{output}.part"), &output)?;
                outln!("{image} written to {output}")?;
            }
            Ok(0)
        }
        Cmd::Images {
            action: Some(ImagesCmd::Prune { all, build_cache }),
        } => {
            let req = belljar_api::PruneImages {
                all: all.then_some(true),
                build_cache: build_cache.then_some(true),
            };
            let pruned = client.prune_images(&req).await?;
            if json {
                print_json(&pruned)?;
                return Ok(0);
            }
            for r in &pruned.removed {
                let shown = r.names.first().unwrap_or(&r.id);
                let what = if r.build_step { " (build step)" } else { "" };
                outln!("{shown}{what}")?;
            }
            outln!(
                "{} images removed, {:.1} MiB reclaimed",
                pruned.removed.len(),
                pruned.reclaimed_bytes as f64 / 1048576.0
            )?;
            Ok(0)
        }
        Cmd::Ui { no_open } => host::ui(client, paths, no_open).await,
        Cmd::Volumes { action } => volumes_cmd(client, action, json).await,
        Cmd::Templates { action } => crate::templates::templates(client, action, json).await,
        Cmd::Snapshot {
            id,
            keep_running,
            expiration,
            path,
        } => timeline::snapshot(client, &id, (keep_running, path), expiration, json).await,
        Cmd::Snapshots { action } => timeline::snapshots(client, action, json).await,
        Cmd::Fork(a) => timeline::fork(client, a, json).await,
        Cmd::Mount { id, snapshot, path } => {
            timeline::mount(client, &id, snapshot.zip(path), json).await
        }
        Cmd::Unmount { id, path } => timeline::unmount(client, &id, &path).await,
        Cmd::Pause { ids } => timeline::pause_or_resume(client, ids, true, json).await,
        Cmd::Resume { ids } => timeline::pause_or_resume(client, ids, false, json).await,
        Cmd::Vercel { action, command } => {
            let env = belljar_cli::vercel::environment(client, paths).await?;
            let print = matches!(action, Some(VercelCmd::Env));
            launch(&env, print, &command, "vercel", "node app.mjs")
        }
        Cmd::Sandbox0 { action, command } => {
            let env = compat::environment(
                client,
                paths,
                compat::Port::Api,
                belljar_cli::sandbox0::variables,
            )
            .await?;
            let print = matches!(action, Some(Sandbox0Cmd::Env));
            launch(&env, print, &command, "sandbox0", "python3 app.py")
        }
        Cmd::E2b { action, command } => {
            let env = compat::environment(
                client,
                paths,
                compat::Port::Api,
                belljar_cli::e2b::variables,
            )
            .await?;
            let print = matches!(action, Some(E2bCmd::Env));
            launch(&env, print, &command, "e2b", "python3 app.py")
        }
        Cmd::Modal { action, command } => {
            let env = compat::environment(
                client,
                paths,
                compat::Port::Modal,
                belljar_cli::modal::variables,
            )
            .await?;
            let print = matches!(action, Some(ModalCmd::Env));
            launch(&env, print, &command, "modal", "python3 app.py")
        }
        Cmd::Network { action } => crate::netcmd::network(client, action, json).await,
        Cmd::Port { action } => crate::netcmd::port(client, action, json).await,
        Cmd::Start { ids } => timeline::start(client, ids, json).await,
        Cmd::Daemon { .. } | Cmd::Completions { .. } | Cmd::Doctor | Cmd::Mcp => {
            unreachable!("handled before")
        }
    }
}

/// `belljar LAYER env` prints the layer's variables as `export` lines; `belljar LAYER -- CMD`
/// becomes CMD with them (`example` is the CMD shown when none is given).
fn launch(
    env: &[(String, std::ffi::OsString)],
    print_env: bool,
    command: &[String],
    layer: &'static str,
    example: &'static str,
) -> Result<i32> {
    if print_env {
        out!("{}", compat::export_lines(env))?;
        return Ok(0);
    }
    Err(compat::exec(command, env, layer, example).into())
}

pub(crate) fn print_json<T: serde::Serialize>(value: &T) -> Result<()> {
    // Rendered first: serde_json's writer errors hide the `io::Error` (a closed pipe) that
    // `main` looks for.
    let text = serde_json::to_string_pretty(value)?;
    outln!("{text}")?;
    Ok(())
}

fn write_stream(stream: Stream, data: &[u8]) -> std::io::Result<()> {
    match stream {
        Stream::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(data)?;
            out.flush()
        }
        Stream::Stderr => {
            let mut err = std::io::stderr().lock();
            err.write_all(data)?;
            err.flush()
        }
    }
}

/// An id as given, or the id of the one sandbox with that name.
pub(crate) async fn resolve(client: &Client, id_or_name: &str) -> Result<String> {
    if id_or_name.starts_with("sbx_") {
        return Ok(id_or_name.to_string());
    }
    let mut found: Vec<String> = client
        .all_sandboxes(&ListSandboxesQuery::default())
        .await?
        .into_iter()
        .filter(|s| s.name.as_deref() == Some(id_or_name))
        .map(|s| s.id)
        .collect();
    match found.len() {
        0 => Err(InputError::UnknownSandbox(id_or_name.to_string()).into()),
        1 => Ok(found.remove(0)),
        _ => Err(InputError::AmbiguousName(id_or_name.to_string()).into()),
    }
}

/// `--mount SNAPSHOT:PATH`, repeatable.
fn mounts(items: &[String]) -> Result<Option<Vec<belljar_api::SnapshotMount>>> {
    let mut out = Vec::new();
    for item in items {
        let (snapshot_id, path) = item
            .split_once(':')
            .ok_or_else(|| InputError::Mount(item.clone()))?;
        out.push(belljar_api::SnapshotMount {
            snapshot_id: snapshot_id.to_owned(),
            path: path.to_owned(),
        });
    }
    Ok((!out.is_empty()).then_some(out))
}

/// `-v SOURCE:PATH[:ro]`, repeatable (Docker's syntax): a source starting with `/`, `.` or
/// `~` is a host folder, resolved here to an absolute path; any other a volume's name.
fn volumes(items: &[String]) -> Result<Option<Vec<belljar_api::VolumeMount>>> {
    let mut out = Vec::new();
    for item in items {
        let bad = || InputError::Volume(item.clone());
        let (rest, read_only) = match item.rsplit_once(':') {
            Some((rest, "ro")) => (rest, Some(true)),
            Some((rest, "rw")) => (rest, None),
            _ => (item.as_str(), None),
        };
        let (source, path) = rest.rsplit_once(':').ok_or_else(bad)?;
        if source.is_empty() || path.is_empty() {
            return Err(bad().into());
        }
        let source = if source.starts_with(['/', '.', '~']) {
            let expanded = match source.strip_prefix('~') {
                Some(tail) if tail.is_empty() || tail.starts_with('/') => {
                    let home = std::env::var_os("HOME").ok_or_else(bad)?;
                    format!("{}{tail}", home.to_string_lossy())
                }
                _ => source.to_owned(),
            };
            std::fs::canonicalize(&expanded)
                .with_context(|| format!("--volume {item}: {expanded}"))?
                .display()
                .to_string()
        } else {
            source.to_owned()
        };
        out.push(belljar_api::VolumeMount {
            source,
            path: path.to_owned(),
            read_only,
        });
    }
    Ok((!out.is_empty()).then_some(out))
}

/// `belljar volumes ...`.
async fn volumes_cmd(client: &Client, action: VolumesCmd, json: bool) -> Result<i32> {
    match action {
        VolumesCmd::Create { name, size } => {
            let v = client
                .create_volume(&belljar_api::CreateVolume {
                    name,
                    size_mib: size,
                })
                .await?;
            if json {
                print_json(&v)?;
            } else {
                outln!("{}", v.name)?;
            }
        }
        VolumesCmd::Ls => {
            let list = client.list_volumes().await?;
            if json {
                print_json(&list)?;
            } else {
                out!("{}", output::volumes(&list.volumes, output::now_ms()))?;
            }
        }
        VolumesCmd::Inspect { name } => {
            let v = client.volume(&name).await?;
            if json {
                print_json(&v)?;
            } else {
                out!("{}", output::volume(&v, output::now_ms()))?;
            }
        }
        VolumesCmd::Rm { names } => {
            for n in &names {
                client.delete_volume(n).await?;
                if !json {
                    outln!("{n}")?;
                }
            }
        }
    }
    Ok(0)
}

pub(crate) fn key_values(flag: &'static str, items: &[String]) -> Result<BTreeMap<String, String>> {
    let mut map = BTreeMap::new();
    for item in items {
        let (k, v) = item.split_once('=').ok_or_else(|| InputError::KeyValue {
            flag,
            value: item.clone(),
        })?;
        if k.is_empty() {
            return Err(InputError::KeyValue {
                flag,
                value: item.clone(),
            }
            .into());
        }
        map.insert(k.to_string(), v.to_string());
    }
    Ok(map)
}

fn source(text: &str) -> Result<Source> {
    let looks_remote = text.contains("://") || text.starts_with("git@");
    if looks_remote {
        return Ok(Source::Git {
            url: text.to_string(),
            revision: None,
        });
    }
    let path = std::fs::canonicalize(text).with_context(|| format!("--source {text}"))?;
    if path.join(".git").exists() || text.ends_with(".git") {
        return Ok(Source::Git {
            url: path.display().to_string(),
            revision: None,
        });
    }
    Ok(Source::Path {
        path: path.display().to_string(),
    })
}

/// `--backend NAME`.
pub(crate) fn backend_choice(b: Option<&str>) -> Result<Option<BackendChoice>> {
    Ok(b.map(|b| {
        b.parse::<BackendChoice>().map_err(|_| InputError::Choice {
            flag: "--backend",
            value: b.to_string(),
            allowed: "auto, microvm, namespace",
        })
    })
    .transpose()?)
}

fn create_request(image: Option<String>, o: &SandboxOpts) -> Result<CreateSandbox> {
    let backend = backend_choice(o.backend.as_deref())?;
    let env = key_values("--env", &o.env)?;
    let tags = key_values("--tag", &o.tags)?;
    Ok(CreateSandbox {
        image,
        backend,
        vcpus: o.vcpus,
        memory_mib: o.memory,
        disk_mib: o.disk,
        timeout_ms: o.timeout.as_deref().map(parse_ms).transpose()?,
        env: (!env.is_empty()).then_some(env),
        tags: (!tags.is_empty()).then_some(tags),
        name: o.name.clone(),
        source: match &o.from {
            Some(snapshot_id) => Some(Source::Snapshot {
                snapshot_id: snapshot_id.clone(),
            }),
            None => o.source.as_deref().map(source).transpose()?,
        },
        network_policy: crate::netcmd::policy(&o.policy)?,
        ports: (!o.ports.is_empty()).then(|| o.ports.clone()),
        mounts: mounts(&o.mounts)?,
        volumes: volumes(&o.volumes)?,
        persistent: o.persistent.then_some(true),
        idle_timeout_ms: o.idle_timeout.as_deref().map(parse_ms).transpose()?,
        hard_ttl_ms: o.hard_ttl.as_deref().map(parse_ms).transpose()?,
        auto_resume: o.no_auto_resume.then_some(false),
        ..Default::default()
    })
}

async fn create(client: &Client, a: CreateArgs, json: bool) -> Result<i32> {
    let mut req = create_request(a.image, &a.opts)?;
    req.template = a.template;
    let s = create_pulling(client, &req).await?;
    if json {
        print_json(&s)?;
    } else {
        outln!("{}", s.id)?;
    }
    Ok(0)
}

/// Creates the sandbox, first pulling its image when it names a registry and is not here
/// (progress on stderr).
async fn create_pulling(client: &Client, req: &CreateSandbox) -> Result<Sandbox> {
    match client.create_sandbox(req).await {
        Err(ClientError::Api {
            code: ErrorCode::ImageNotAvailable,
            message,
            ..
        }) if message.contains("belljar images pull") => {
            let image = req.image.clone().unwrap_or_default();
            host::pull_for_create(client, &image).await?;
            Ok(client.create_sandbox(req).await?)
        }
        other => Ok(other?),
    }
}

async fn ls(client: &Client, a: LsArgs, json: bool) -> Result<i32> {
    let status = match a.status.as_deref() {
        None => None,
        Some(s) => Some(s.parse::<SandboxStatus>().map_err(|_| InputError::Choice {
            flag: "--status",
            value: s.to_string(),
            allowed: "pending, running, paused, stopping, stopped, failed",
        })?),
    };
    let query = ListSandboxesQuery {
        status,
        tag: a.tag.clone(),
        ..Default::default()
    };
    let all = client.all_sandboxes(&query).await?;
    if json {
        print_json(&all)?;
    } else {
        out!("{}", output::sandboxes(&all, now_ms()))?;
    }
    Ok(0)
}

async fn exec_cmd(client: &Client, a: ExecArgs, json: bool) -> Result<i32> {
    let id = resolve(client, &a.id).await?;
    let opts = ExecOptions {
        argv: a.argv,
        cwd: a.cwd,
        env: key_values("--env", &a.env)?,
        sudo: a.sudo,
        detach: a.detach,
        tty: a.tty,
        stdin: a.interactive,
    };
    let mut sink = |stream: Stream, data: &[u8]| write_stream(stream, data);
    let cmd = exec::exec(client, &id, &opts, &mut sink).await?;
    if a.detach {
        if json {
            print_json(&cmd)?;
        } else {
            outln!("{}", cmd.id)?;
        }
        return Ok(0);
    }
    warn_if_truncated(&cmd);
    Ok(exec::exit_status(&cmd))
}

fn warn_if_truncated(cmd: &belljar_api::Command) {
    if let Some(w) = exec::truncation_warning(cmd) {
        eprintln!("{w}");
    }
}

async fn run_cmd(client: &Client, a: RunArgs) -> Result<i32> {
    let req = create_request(Some(a.image.clone()), &a.opts)?;
    let s = create_pulling(client, &req).await?;
    let argv = if a.argv.is_empty() {
        let images = client.images().await?;
        let own = images
            .iter()
            .find(|i| {
                i.digest.is_some()
                    && (i.name == s.image || i.digest.as_deref() == Some(s.image.as_str()))
            })
            .and_then(|i| i.command.clone());
        match own {
            Some(argv) => argv,
            None => {
                let _ = client.delete_sandbox(&s.id).await;
                return Err(InputError::NoImageCommand(s.image.clone()).into());
            }
        }
    } else {
        a.argv
    };
    let opts = ExecOptions {
        argv,
        cwd: a.cwd,
        env: BTreeMap::new(),
        sudo: a.sudo,
        detach: false,
        tty: a.tty,
        stdin: a.interactive,
    };
    let mut sink = |stream: Stream, data: &[u8]| write_stream(stream, data);
    let result = tokio::select! {
        r = exec::exec(client, &s.id, &opts, &mut sink) => r
            .map(|c| {
                warn_if_truncated(&c);
                exec::exit_status(&c)
            })
            .map_err(anyhow::Error::from),
        _ = tokio::signal::ctrl_c() => Ok(130),
    };
    if !a.keep {
        let deleted = client.delete_sandbox(&s.id).await;
        if let (Ok(_), Err(e)) = (&result, deleted) {
            return Err(e.into());
        }
    } else {
        eprintln!("sandbox {} kept", s.id);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_flags_follow_dockers_syntax() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().canonicalize().unwrap();
        let given = [
            format!("{}:/w", dir.display()),
            format!("{}/./:/r:ro", dir.display()),
            "cache:/cache:rw".to_owned(),
        ];
        let v = volumes(&given).unwrap().unwrap();
        assert_eq!(v[0].source, dir.display().to_string());
        assert_eq!((v[0].path.as_str(), v[0].read_only), ("/w", None));
        assert_eq!(v[1].source, dir.display().to_string());
        assert_eq!((v[1].path.as_str(), v[1].read_only), ("/r", Some(true)));
        assert_eq!(
            (v[2].source.as_str(), v[2].path.as_str()),
            ("cache", "/cache")
        );
        for bad in ["nocolon", ":/w", "cache:", "./does-not-exist-here:/w"] {
            assert!(volumes(&[bad.to_owned()]).is_err(), "{bad}");
        }
        assert!(volumes(&[]).unwrap().is_none());
    }

    #[test]
    fn key_values_need_an_equals_sign() {
        let m = key_values("--env", &["A=1".into(), "B=x=y".into(), "C=".into()]).unwrap();
        assert_eq!(m["A"], "1");
        assert_eq!(m["B"], "x=y");
        assert_eq!(m["C"], "");
        assert!(key_values("--env", &["nope".into()]).is_err());
        assert!(key_values("--tag", &["=v".into()]).is_err());
    }

    #[test]
    fn create_request_maps_flags() {
        let o = SandboxOpts {
            timeout: Some("10m".into()),
            env: vec!["A=1".into()],
            backend: Some("namespace".into()),
            memory: Some(512),
            ..Default::default()
        };
        let r = create_request(Some("base".into()), &o).unwrap();
        assert_eq!(r.timeout_ms, Some(600_000));
        assert_eq!(r.backend, Some(BackendChoice::Namespace));
        assert_eq!(r.memory_mib, Some(512));
        assert!(r.tags.is_none());
        // A bare number is seconds, as the daemon reads its own flags.
        let bare = SandboxOpts {
            timeout: Some("300".into()),
            ..Default::default()
        };
        assert_eq!(
            create_request(None, &bare).unwrap().timeout_ms,
            Some(300_000)
        );
        let bad = SandboxOpts {
            backend: Some("docker".into()),
            ..Default::default()
        };
        assert!(create_request(None, &bad).is_err());
    }

    #[test]
    fn sources_are_git_urls_or_local_paths() {
        assert!(matches!(
            source("https://example.invalid/r.git").unwrap(),
            Source::Git { .. }
        ));
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            source(dir.path().to_str().unwrap()).unwrap(),
            Source::Path { .. }
        ));
        std::fs::create_dir(dir.path().join(".git")).unwrap();
        assert!(matches!(
            source(dir.path().to_str().unwrap()).unwrap(),
            Source::Git { .. }
        ));
        assert!(source("/definitely/not/here").is_err());
    }
}
