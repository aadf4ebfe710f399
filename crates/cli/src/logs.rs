//! `belljar logs`: the stored output of a sandbox's commands, read any time after they ran
//! (also after a daemon restart), optionally followed while the command still runs.

use belljar_api::{LogLine, Stream};
use belljar_client::{Client, log_bytes, ndjson::decode_line};

use crate::exec::ExecError;

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
            let mut cmds = client.commands(sandbox).await?.commands;
            cmds.sort_by_key(|c| c.started_at);
            cmds.into_iter().map(|c| c.id).collect()
        }
    };
    let last = ids.len().saturating_sub(1);
    for (i, id) in ids.iter().enumerate() {
        let follow = follow && i == last;
        let mut lines = client.command_logs(sandbox, id, follow).await?;
        while let Some(raw) = lines.next_line().await? {
            match sink {
                LogSink::Json(write) => {
                    let mut with_nl = raw.to_vec();
                    with_nl.push(b'\n');
                    write(&with_nl)?;
                }
                LogSink::Output(write) => {
                    let line: LogLine = decode_line(&raw)?;
                    write(line.stream, &log_bytes(&line))?;
                }
            }
        }
    }
    Ok(())
}
