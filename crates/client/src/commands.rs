//! The command routes: run, list, get, wait, kill, logs, stdin and resize.

use base64::Engine;
use belljar_api::{Command, CommandList, KillCommand, LogLine, PtySize, RunCommand};
use bytes::Bytes;
use http::Method;

use crate::body::{empty, full};
use crate::client::Client;
use crate::error::ClientError;
use crate::ndjson::NdjsonStream;
use crate::routes::{self, with_query};

impl Client {
    /// `POST /v1/sandboxes/{id}/commands`: the command exited, or running when `detached`.
    pub async fn run_command(&self, id: &str, req: &RunCommand) -> Result<Command, ClientError> {
        self.call(Method::POST, &routes::commands(id), req).await
    }

    /// `POST /v1/sandboxes/{id}/commands` with an `Idempotency-Key`: a retry with the same
    /// key answers the command the first request started instead of starting another.
    pub async fn run_command_once(
        &self,
        id: &str,
        req: &RunCommand,
        key: &str,
    ) -> Result<Command, ClientError> {
        self.call_once(Method::POST, &routes::commands(id), req, key)
            .await
    }

    /// `GET /v1/sandboxes/{id}/commands`: newest first.
    pub async fn commands(&self, id: &str) -> Result<CommandList, ClientError> {
        self.get(&routes::commands(id)).await
    }

    /// `GET /v1/sandboxes/{id}/commands/{cid}`.
    pub async fn command(&self, id: &str, cid: &str) -> Result<Command, ClientError> {
        self.get(&routes::command(id, cid)).await
    }

    /// `GET /v1/sandboxes/{id}/commands/{cid}?wait=true`: answers once the command exited.
    pub async fn wait_command(&self, id: &str, cid: &str) -> Result<Command, ClientError> {
        let url = with_query(&routes::command(id, cid), &[("wait", Some("true".into()))]);
        self.get(&url).await
    }

    /// `POST /v1/sandboxes/{id}/commands/{cid}/kill` with a signal number or name (`TERM`
    /// when `None`).
    pub async fn kill_command(
        &self,
        id: &str,
        cid: &str,
        signal: Option<&str>,
    ) -> Result<Command, ClientError> {
        let req = KillCommand {
            signal: signal.map(str::to_owned),
        };
        self.call(Method::POST, &routes::command_sub(id, cid, "kill"), &req)
            .await
    }

    /// `GET /v1/sandboxes/{id}/commands/{cid}/logs`: the stored output; with `follow`, the
    /// stream stays open until the command exits.
    pub async fn command_logs(
        &self,
        id: &str,
        cid: &str,
        follow: bool,
    ) -> Result<NdjsonStream<LogLine>, ClientError> {
        let url = with_query(
            &routes::command_sub(id, cid, "logs"),
            &[("follow", follow.then(|| "true".to_string()))],
        );
        let resp = self.request(Method::GET, &url, empty(), None).await?;
        Ok(NdjsonStream::new(resp.into_body()))
    }

    /// `POST /v1/sandboxes/{id}/commands/{cid}/stdin`: `data` to the command's stdin, which
    /// `close` then closes.
    pub async fn write_stdin(
        &self,
        id: &str,
        cid: &str,
        data: Bytes,
        close: bool,
    ) -> Result<(), ClientError> {
        let url = with_query(
            &routes::command_sub(id, cid, "stdin"),
            &[("close", close.then(|| "true".to_string()))],
        );
        if data.is_empty() {
            return self
                .call_no_content(Method::POST, &url, empty(), None)
                .await;
        }
        let octets = Some("application/octet-stream");
        self.call_no_content(Method::POST, &url, full(data), octets)
            .await
    }

    /// `POST /v1/sandboxes/{id}/commands/{cid}/resize`: a PTY command's new size.
    pub async fn resize_command(
        &self,
        id: &str,
        cid: &str,
        size: PtySize,
    ) -> Result<(), ClientError> {
        self.call_json_no_content(Method::POST, &routes::command_sub(id, cid, "resize"), &size)
            .await
    }
}

/// The bytes of one log line: its text, or its base64 when the chunk was not UTF-8.
pub fn log_bytes(line: &LogLine) -> Vec<u8> {
    if let Some(b64) = &line.data_base64 {
        return base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_default();
    }
    line.data.clone().unwrap_or_default().into_bytes()
}

#[cfg(test)]
mod tests {
    use belljar_api::Stream;

    use super::*;

    #[test]
    fn log_bytes_decodes_text_and_base64() {
        let text = LogLine {
            stream: Stream::Stdout,
            data: Some("héllo".into()),
            data_base64: None,
            ts: 0,
        };
        assert_eq!(log_bytes(&text), "héllo".as_bytes());
        let bin = LogLine {
            stream: Stream::Stderr,
            data: None,
            data_base64: Some("/wA=".into()),
            ts: 0,
        };
        assert_eq!(log_bytes(&bin), vec![0xff, 0x00]);
    }
}
