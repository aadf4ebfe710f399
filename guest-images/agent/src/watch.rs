//! Watching a path for changes with inotify (through the `notify` crate) and streaming them as
//! NDJSON [`WatchEvent`]s. The watch lives exactly as long as the response stream: when the
//! client goes away, the stream and with it the watcher are dropped.

use std::io;
use std::path::PathBuf;

use belljar_agent_proto::{WatchEvent, WatchKind};
use bytes::Bytes;
use futures::Stream;
use notify::event::{EventKind, ModifyKind, RenameMode};
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::commands::now_ms;
use crate::error::AgentError;
use crate::files::check_path;

/// Events waiting for a slow client before the watcher's thread blocks.
const QUEUE: usize = 1024;

/// Starts watching `path` and returns the NDJSON event stream.
pub fn watch(
    path: &str,
    recursive: bool,
) -> Result<impl Stream<Item = io::Result<Bytes>> + Send + 'static, AgentError> {
    let p = check_path(path)?;
    std::fs::symlink_metadata(&p).map_err(|e| AgentError::io(e, path))?;
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(QUEUE);
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let Ok(event) = res else { return };
        for ev in convert(&event) {
            let Ok(mut line) = serde_json::to_vec(&ev) else {
                continue;
            };
            line.push(b'\n');
            if tx.blocking_send(Ok(Bytes::from(line))).is_err() {
                return;
            }
        }
    })
    .map_err(|e| AgentError::Internal(format!("cannot watch: {e}")))?;
    let mode = if recursive {
        RecursiveMode::Recursive
    } else {
        RecursiveMode::NonRecursive
    };
    watcher.watch(&p, mode).map_err(|e| match e.kind {
        notify::ErrorKind::Io(io) => AgentError::io(io, path),
        notify::ErrorKind::PathNotFound => AgentError::NotFound(path.to_owned()),
        _ => AgentError::Internal(format!("cannot watch {path}: {e}")),
    })?;
    Ok(futures::stream::unfold(
        (rx, watcher),
        |(mut rx, watcher)| async move { rx.recv().await.map(|item| (item, (rx, watcher))) },
    ))
}

/// Maps one notify event to the API's events. A rename whose both ends are inside the watch
/// is reported once, as a `rename` with both paths; the lone halves of a move into or out of
/// the watched tree and access events are not reported.
fn convert(event: &notify::Event) -> Vec<WatchEvent> {
    let ts = now_ms();
    let one = |kind, path: &PathBuf, to: Option<&PathBuf>| WatchEvent {
        kind,
        path: path.to_string_lossy().into_owned(),
        to: to.map(|t| t.to_string_lossy().into_owned()),
        is_dir: to.unwrap_or(path).is_dir(),
        ts,
    };
    match event.kind {
        EventKind::Create(_) => event
            .paths
            .iter()
            .map(|p| one(WatchKind::Create, p, None))
            .collect(),
        EventKind::Remove(kind) => event
            .paths
            .iter()
            .map(|p| WatchEvent {
                is_dir: kind == notify::event::RemoveKind::Folder,
                ..one(WatchKind::Remove, p, None)
            })
            .collect(),
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) if event.paths.len() == 2 => {
            vec![one(
                WatchKind::Rename,
                &event.paths[0],
                Some(&event.paths[1]),
            )]
        }
        EventKind::Modify(ModifyKind::Name(_)) => Vec::new(),
        EventKind::Modify(_) => event
            .paths
            .iter()
            .map(|p| one(WatchKind::Modify, p, None))
            .collect(),
        _ => Vec::new(),
    }
}
