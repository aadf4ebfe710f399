//! `RUN`: the command runs in a namespace sandbox of the image so far, made and deleted by
//! the daemon's own sandbox lifecycle (the same isolation, limits and network policy as any
//! sandbox). Its output streams to the build's client; its writes, copied out while the
//! sandbox is frozen, become the step's layer.

use std::collections::{BTreeMap, VecDeque};

use base64::Engine;
use belljar_api::{BackendChoice, CreateSandbox, KillCommand, LogLine, RunCommand};
use belljar_oci::build::{LayerFile, tar_out};
use futures::StreamExt;

use super::stage::Stage;
use super::{BuildError, Ctx};
use crate::images::run_defaults;

/// Lines of a failed command's output its error shows.
const TAIL_LINES: usize = 20;

/// What the sandbox's own set-up writes into its writable layer: never part of a step.
const SET_UP_PATHS: &[&str] = &["etc/resolv.conf", "etc/hosts", "etc/hostname"];

/// Runs `argv` in a sandbox of `stage`; returns the layer of what it wrote (none when it
/// wrote nothing). The sandbox is deleted whatever happens.
pub async fn run(
    ctx: &Ctx,
    stage: &Stage,
    argv: Vec<String>,
) -> Result<Option<LayerFile>, BuildError> {
    let sandbox = ctx
        .sandboxes
        .create(CreateSandbox {
            image: Some(stage.files.clone()),
            backend: Some(BackendChoice::Namespace),
            tags: Some(BTreeMap::from([("belljar.build".into(), ctx.tag.clone())])),
            ..Default::default()
        })
        .await?;
    let result = run_in(ctx, stage, &sandbox.id, argv).await;
    if let Err(e) = ctx.sandboxes.delete(&sandbox.id).await {
        tracing::warn!(sandbox = %sandbox.id, error = %e, "cannot delete a build's sandbox");
    }
    result
}

async fn run_in(
    ctx: &Ctx,
    stage: &Stage,
    id: &str,
    argv: Vec<String>,
) -> Result<Option<LayerFile>, BuildError> {
    let defaults = run_defaults(&stage.config, &stage.rootfs);
    let mut env: BTreeMap<String, String> = stage.args.clone();
    env.extend(defaults.env);
    let cmd = ctx
        .sandboxes
        .run_command_as(
            id,
            RunCommand {
                argv,
                cwd: Some(defaults.cwd),
                env: Some(env),
                sudo: false,
                detached: true,
                pty: None,
                stdin: false,
            },
            None,
            Some(defaults.user),
        )
        .await?;
    let mut logs = std::pin::pin!(ctx.sandboxes.command_logs(id, &cmd.id, true)?);
    let mut tail: VecDeque<String> = VecDeque::new();
    let mut pending = Vec::new();
    loop {
        let chunk = tokio::select! {
            c = logs.next() => c,
            () = ctx.tx.closed() => {
                let _ = ctx.sandboxes.kill_command(id, &cmd.id, KillCommand { signal: Some("KILL".into()) }).await;
                return Err(BuildError::Cancelled);
            }
        };
        let Some(chunk) = chunk else { break };
        let Ok(chunk) = chunk else { break };
        pending.extend_from_slice(&chunk);
        while let Some(nl) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            let Ok(log) = serde_json::from_slice::<LogLine>(&line) else {
                continue;
            };
            let text = match (log.data, log.data_base64) {
                (Some(d), _) => d,
                (None, Some(b)) => base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default(),
                (None, None) => String::new(),
            };
            for l in text.lines() {
                ctx.progress(l.to_owned());
                tail.push_back(l.to_owned());
                if tail.len() > TAIL_LINES {
                    tail.pop_front();
                }
            }
        }
    }
    let done = ctx.sandboxes.wait_command(id, &cmd.id).await?;
    match done.exit_code {
        Some(0) => {}
        code => {
            return Err(BuildError::Failed {
                code: code.unwrap_or(-1),
                tail: tail.into_iter().collect::<Vec<_>>().join("\n"),
            });
        }
    }
    let scratch = ctx.store.build_scratch()?;
    let captured = ctx.sandboxes.capture_writes(id, scratch.path()).await?;
    let layer = ctx
        .store
        .write_layer(|w| tar_out::overlay_layer(&captured, w, SET_UP_PATHS))?;
    // A tar with no entries is its two end blocks.
    let empty = std::fs::metadata(&layer.path).is_ok_and(|m| m.len() <= 1024 * 10);
    Ok((!empty || has_entries(&layer)).then_some(layer))
}

/// Whether the layer tar holds any entry.
fn has_entries(layer: &LayerFile) -> bool {
    std::fs::File::open(&layer.path)
        .ok()
        .and_then(|f| {
            tar::Archive::new(f)
                .entries()
                .ok()
                .map(|mut e| e.next().is_some())
        })
        .unwrap_or(false)
}
