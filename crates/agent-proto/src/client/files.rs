//! The agent's file routes: read and write (streamed), directories, listing, stat, remove,
//! move, tar archives both ways and the watch stream.

use super::*;

impl AgentClient {
    /// `GET /v1/files/read`: the file's length and its bytes, streamed.
    pub async fn read_file(&self, path: &str) -> Result<(Option<u64>, ByteStream), ClientError> {
        let uri = format!("/v1/files/read{}", query::build(&[("path", path)]));
        let resp = self.send(Method::GET, &uri, None, empty_body()).await?;
        let len = resp
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        Ok((len, body_stream(resp)))
    }

    /// `PUT /v1/files/write`: streams `body` into `path` (parents are created).
    pub async fn write_file(
        &self,
        path: &str,
        mode: Option<u32>,
        user: Option<&str>,
        body: RequestBody,
    ) -> Result<FileEntry, ClientError> {
        let mode = mode.map(|m| format!("{m:o}"));
        let mut pairs = vec![("path", path)];
        if let Some(mode) = &mode {
            pairs.push(("mode", mode));
        }
        if let Some(user) = user {
            pairs.push(("user", user));
        }
        let uri = format!("/v1/files/write{}", query::build(&pairs));
        // The upload streams for as long as the caller's body lasts; only the answer is timed.
        let resp = self
            .send_untimed(Method::PUT, &uri, Some("application/octet-stream"), body)
            .await?;
        within(self.timeout, json_body(resp)).await
    }

    /// `POST /v1/files/mkdir`.
    pub async fn mkdir(&self, req: &MkdirRequest) -> Result<FileEntry, ClientError> {
        self.json(Method::POST, "/v1/files/mkdir", Some(req)).await
    }

    /// `GET /v1/files/list`: one page of at most `limit` entries after `cursor`. The body is
    /// read with a bound, so a hostile agent cannot make the caller buffer more than a page.
    pub async fn list_page(
        &self,
        path: &str,
        limit: Option<usize>,
        cursor: Option<&str>,
    ) -> Result<FileListPage, ClientError> {
        let limit = limit.map(|l| l.to_string());
        let mut pairs = vec![("path", path)];
        if let Some(limit) = &limit {
            pairs.push(("limit", limit));
        }
        if let Some(cursor) = cursor {
            pairs.push(("cursor", cursor));
        }
        let uri = format!("/v1/files/list{}", query::build(&pairs));
        let resp = self.send(Method::GET, &uri, None, empty_body()).await?;
        // Twice the agent's own bound leaves room for its estimate being off.
        let bytes = bounded(resp, 2 * crate::LIST_PAGE_BYTES).await?;
        Ok(serde_json::from_slice(&bytes)?)
    }

    /// Every entry of a directory, page by page. For tests and small directories: the result
    /// grows with the directory, so the daemon pages with [`AgentClient::list_page`] instead.
    pub async fn list(&self, path: &str) -> Result<Vec<FileEntry>, ClientError> {
        let mut entries = Vec::new();
        let mut cursor = None;
        loop {
            let page = self.list_page(path, None, cursor.as_deref()).await?;
            entries.extend(page.entries);
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(entries),
            }
        }
    }

    /// `GET /v1/files/stat`.
    pub async fn stat(&self, path: &str) -> Result<FileEntry, ClientError> {
        let uri = format!("/v1/files/stat{}", query::build(&[("path", path)]));
        self.json(Method::GET, &uri, None::<&()>).await
    }

    /// `POST /v1/files/remove`.
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<(), ClientError> {
        let body = RemoveRequest {
            path: path.to_owned(),
            recursive,
        };
        self.no_content(Method::POST, "/v1/files/remove", &body)
            .await
    }

    /// `POST /v1/files/move`.
    pub async fn move_path(&self, req: &MoveRequest) -> Result<FileEntry, ClientError> {
        self.json(Method::POST, "/v1/files/move", Some(req)).await
    }

    /// `GET /v1/files/tar`: the tree under `path` as a tar stream.
    pub async fn download_tar(&self, path: &str) -> Result<ByteStream, ClientError> {
        let uri = format!("/v1/files/tar{}", query::build(&[("path", path)]));
        let resp = self.send(Method::GET, &uri, None, empty_body()).await?;
        Ok(body_stream(resp))
    }

    /// `PUT /v1/files/tar`: extracts the tar stream `body` under `path`.
    pub async fn upload_tar(
        &self,
        path: &str,
        user: Option<&str>,
        body: RequestBody,
    ) -> Result<(), ClientError> {
        let mut pairs = vec![("path", path)];
        if let Some(user) = user {
            pairs.push(("user", user));
        }
        let uri = format!("/v1/files/tar{}", query::build(&pairs));
        let resp = self
            .send_untimed(Method::PUT, &uri, Some("application/x-tar"), body)
            .await?;
        within(self.timeout, drain(resp)).await
    }

    /// `GET /v1/watch`: events until the returned stream is dropped.
    pub async fn watch(
        &self,
        path: &str,
        recursive: bool,
    ) -> Result<JsonStream<WatchEvent>, ClientError> {
        let uri = format!(
            "/v1/watch{}",
            query::build(&[
                ("path", path),
                ("recursive", if recursive { "true" } else { "false" })
            ])
        );
        let resp = self.send(Method::GET, &uri, None, empty_body()).await?;
        Ok(ndjson(body_stream(resp)))
    }
}
