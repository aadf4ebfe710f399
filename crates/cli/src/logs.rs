//! `belljar logs`: the stored output of a sandbox's commands, read any time after they ran
//! (also after a daemon restart), optionally followed while the command still runs.

use belljar_api::{CommandList, LogLine, Stream};
use http::Method;

use crate::client::{self, Client};
use crate::exec::{ExecError, log_bytes};
use crate::ndjson::Lines;
use crate::query::with_query;

/// What `logs` writes: decoded output, or each NDJSON line as the daemon sent it (`--json`).
pub enum LogSink<'a> {
    Output(&'a mut (dyn FnMut(Stream, &[u8]) -> std::io::Result<()> + Send)),
    Json(&'a mut (dyn FnMut(&[u8]) -> std::io::Result<()> + Send)),
}

/// Writes the output of one command, or of every command of the sandbox oldest first when
/// `command` is `None`; `follow` keeps reading the (last) command until it exits.
pub async fn logs(
    client: &Client,
    sandbox: &str,
    command: Option<&str>,
    follow: bool,
    sink: &mut LogSink<'_>,
) -> Result<(), ExecError> {
    let ids: Vec<String> = match command {
        Some(c) => vec![c.to_string()],
        None => {
            let list: CommandList = client
                .get(&format!("/v1/sandboxes/{sandbox}/commands"))
                .await?;
            let mut cmds = list.commands;
            cmds.sort_by_key(|c| c.started_at);
            cmds.into_iter().map(|c| c.id).collect()
        }
    };
    let last = ids.len().saturating_sub(1);
    for (i, id) in ids.iter().enumerate() {
        let follow = follow && i == last;
        let path = with_query(
            &format!("/v1/sandboxes/{sandbox}/commands/{id}/logs"),
            &[("follow", follow.then(|| "true".to_string()))],
        );
        let resp = client
            .request(Method::GET, &path, client::empty(), None)
            .await?;
        let mut lines = Lines::new(resp.into_body());
        while let Some(raw) = lines.next_line().await? {
            match sink {
                LogSink::Json(write) => {
                    let mut with_nl = raw.to_vec();
                    with_nl.push(b'\n');
                    write(&with_nl)?;
                }
                LogSink::Output(write) => {
                    let line: LogLine = serde_json::from_slice(&raw).map_err(|source| {
                        crate::ndjson::NdjsonError::Decode {
                            line: String::from_utf8_lossy(&raw).into_owned(),
                            source,
                        }
                    })?;
                    write(line.stream, &log_bytes(&line))?;
                }
            }
        }
    }
    Ok(())
}
