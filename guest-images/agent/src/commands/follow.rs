//! A command's whole life on its start's request (`POST /v1/commands?follow=true`).

use belljar_agent_proto::{CommandInfo, Followed, FollowedEnd, FollowedStart};
use bytes::Bytes;
use futures::Stream as FutStream;
use tokio::sync::mpsc;

use super::Commands;
use crate::error::AgentError;

impl Commands {
    /// A started command's life as one NDJSON stream (`POST /v1/commands?follow=true`): a
    /// [`Followed::Started`] line with `started`, every line of its output, then a
    /// [`Followed::Ended`] line once it has exited and its output is complete (what
    /// `?wait=true` answers). A client gets a command's start, output and end in one request.
    pub fn follow(
        &self,
        started: CommandInfo,
    ) -> Result<impl FutStream<Item = std::io::Result<Bytes>> + Send + 'static, AgentError> {
        let command = self.get(&started.id)?;
        Ok(sent_by(move |tx| async move {
            if tx
                .send(followed(&Followed::Started(FollowedStart { started })))
                .await
                .is_err()
            {
                return;
            }
            if let Err(e) = command.log.read_into(0, true, tx.clone()).await {
                let _ = tx.send(Err(e)).await;
                return;
            }
            tokio::select! {
                () = command.ended() => {
                    let _ = tx.send(followed(&Followed::Ended(FollowedEnd {
                        ended: command.info(),
                    }))).await;
                }
                () = tx.closed() => {}
            }
        }))
    }
}

/// A stream of what `send` sends on its channel, run as its own task.
pub(super) fn sent_by<F, Fut>(
    send: F,
) -> impl FutStream<Item = std::io::Result<Bytes>> + Send + 'static
where
    F: FnOnce(mpsc::Sender<std::io::Result<Bytes>>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(send(tx));
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

/// One NDJSON line of a followed start.
fn followed(line: &Followed) -> std::io::Result<Bytes> {
    let mut bytes = serde_json::to_vec(line).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    Ok(bytes.into())
}
