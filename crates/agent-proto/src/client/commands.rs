//! The agent's command routes: start (alone or followed to the command's end), list,
//! inspect and wait, output, stdin, signals and resizes.

use super::*;

impl AgentClient {
    /// `POST /v1/commands`: starts a command and returns at once.
    pub async fn start_command(&self, start: &StartCommand) -> Result<CommandInfo, ClientError> {
        self.json(Method::POST, "/v1/commands", Some(start)).await
    }

    /// `POST /v1/commands?follow=true`: starts the command and returns it with the rest of its
    /// life (output lines, then its end; see [`Followed`]) as a stream on the same request.
    /// An agent older than that answers with the command alone: the stream is then `None`,
    /// and the caller follows the output and waits as before.
    pub async fn start_following(
        &self,
        start: &StartCommand,
    ) -> Result<(CommandInfo, Option<JsonStream<Followed>>), ClientError> {
        within(self.timeout, async {
            let resp = self
                .send_json(Method::POST, "/v1/commands?follow=true", Some(start))
                .await?;
            let ndjson_answer = resp
                .headers()
                .get(hyper::header::CONTENT_TYPE)
                .is_some_and(|ct| ct.as_bytes().starts_with(b"application/x-ndjson"));
            if !ndjson_answer {
                return Ok((json_body(resp).await?, None));
            }
            let mut lines = ndjson::<Followed>(body_stream(resp));
            match lines.next().await.transpose()? {
                Some(Followed::Started(s)) => Ok((s.started, Some(lines))),
                _ => Err(ClientError::Protocol(
                    "a followed start did not begin with the started command",
                )),
            }
        })
        .await
    }

    /// `GET /v1/commands`.
    pub async fn list_commands(&self) -> Result<Vec<CommandInfo>, ClientError> {
        self.json(Method::GET, "/v1/commands", None::<&()>).await
    }

    /// `GET /v1/commands?fence=epoch`: the commands, after which the agent refuses starts of
    /// any other epoch. The fence the agent now holds, or `None` from an agent too old to
    /// fence (it ignores the parameter).
    pub async fn list_commands_fenced(
        &self,
        epoch: u64,
    ) -> Result<(Vec<CommandInfo>, Option<u64>), ClientError> {
        let path = format!("/v1/commands?fence={epoch}");
        within(self.timeout, async {
            let resp = self.send_json(Method::GET, &path, None::<&()>).await?;
            let fence = resp
                .headers()
                .get(crate::FENCE_HEADER)
                .and_then(|v| v.to_str().ok()?.parse().ok());
            Ok((json_body(resp).await?, fence))
        })
        .await
    }

    /// `GET /v1/commands/{id}`.
    pub async fn command(&self, id: &str) -> Result<CommandInfo, ClientError> {
        let path = format!("/v1/commands/{}", query::encode(id));
        self.json(Method::GET, &path, None::<&()>).await
    }

    /// `GET /v1/commands/{id}?wait=true`: blocks until the command exits and its output is
    /// complete, so that reading the output afterwards finds all of it.
    pub async fn wait_command(&self, id: &str) -> Result<CommandInfo, ClientError> {
        let path = format!("/v1/commands/{}?wait=true", query::encode(id));
        // A long poll: no deadline on the answer, only a bound on its size.
        let resp = self
            .send_untimed(Method::GET, &path, None, empty_body())
            .await?;
        json_body(resp).await
    }

    /// `GET /v1/commands/{id}/output`: the output from line `skip`, followed until the command
    /// ends when `follow` is set.
    pub async fn output(
        &self,
        id: &str,
        skip: u64,
        follow: bool,
    ) -> Result<JsonStream<OutputLine>, ClientError> {
        let skip = skip.to_string();
        let path = format!(
            "/v1/commands/{}/output{}",
            query::encode(id),
            query::build(&[
                ("follow", if follow { "true" } else { "false" }),
                ("skip", &skip)
            ])
        );
        let resp = self.send(Method::GET, &path, None, empty_body()).await?;
        Ok(ndjson(body_stream(resp)))
    }

    /// `POST /v1/commands/{id}/stdin`: streams `body` to the command's stdin, closing it at the
    /// end when `close` is set.
    pub async fn write_stdin(
        &self,
        id: &str,
        body: RequestBody,
        close: bool,
    ) -> Result<(), ClientError> {
        let path = format!(
            "/v1/commands/{}/stdin{}",
            query::encode(id),
            query::build(&[("close", if close { "true" } else { "false" })])
        );
        let resp = self
            .send_untimed(Method::POST, &path, Some("application/octet-stream"), body)
            .await?;
        within(self.timeout, drain(resp)).await
    }

    /// `POST /v1/commands/{id}/signal`.
    pub async fn signal(&self, id: &str, signal: &str) -> Result<(), ClientError> {
        let path = format!("/v1/commands/{}/signal", query::encode(id));
        let body = SignalRequest {
            signal: signal.to_owned(),
        };
        self.no_content(Method::POST, &path, &body).await
    }

    /// `POST /v1/commands/{id}/resize`.
    pub async fn resize(&self, id: &str, size: PtySize) -> Result<(), ClientError> {
        let path = format!("/v1/commands/{}/resize", query::encode(id));
        self.no_content(Method::POST, &path, &size).await
    }
}
