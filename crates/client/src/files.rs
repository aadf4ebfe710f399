//! The file routes: read and write (streamed), stat, list, mkdir, move, remove, tar streams
//! of whole trees both ways, watches and thumbnails.

use belljar_api::{FileEntry, FileList, MkdirRequest, MoveRequest, WatchEvent};
use bytes::Bytes;
use http::Method;

use crate::body::{Body, Download, empty};
use crate::client::{Client, decode};
use crate::error::ClientError;
use crate::ndjson::NdjsonStream;
use crate::routes::{self, with_query};

impl Client {
    /// `GET /v1/sandboxes/{id}/files?path=`: the file's bytes as they arrive.
    pub async fn read_file(&self, id: &str, path: &str) -> Result<Download, ClientError> {
        let url = routes::file(id, "", path);
        let resp = self.request(Method::GET, &url, empty(), None).await?;
        Ok(Download::new(resp))
    }

    /// The whole file in memory (small files; stream bigger ones with [`Client::read_file`]).
    pub async fn read_file_bytes(&self, id: &str, path: &str) -> Result<Bytes, ClientError> {
        self.read_file(id, path).await?.bytes().await
    }

    /// `PUT /v1/sandboxes/{id}/files?path=&mode=`: writes `body` (streamed; missing parents
    /// are created) with permission bits `mode` when given.
    pub async fn write_file(
        &self,
        id: &str,
        path: &str,
        mode: Option<u32>,
        body: Body,
    ) -> Result<FileEntry, ClientError> {
        let url = with_query(
            &routes::file(id, "", path),
            &[("mode", mode.map(|m| format!("{m:o}")))],
        );
        let octets = Some("application/octet-stream");
        let resp = self.request(Method::PUT, &url, body, octets).await?;
        decode(resp, "file write").await
    }

    /// `GET /v1/sandboxes/{id}/files/stat?path=`.
    pub async fn stat(&self, id: &str, path: &str) -> Result<FileEntry, ClientError> {
        self.get(&routes::file(id, "/stat", path)).await
    }

    /// The entry at `path`, or `None` when nothing is there.
    pub async fn try_stat(&self, id: &str, path: &str) -> Result<Option<FileEntry>, ClientError> {
        match self.stat(id, path).await {
            Ok(e) => Ok(Some(e)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `GET /v1/sandboxes/{id}/files/list?path=&limit=&cursor=`: one page of a directory.
    pub async fn list_files(
        &self,
        id: &str,
        path: &str,
        limit: Option<u32>,
        cursor: Option<&str>,
    ) -> Result<FileList, ClientError> {
        let url = with_query(
            &routes::file(id, "/list", path),
            &[
                ("limit", limit.map(|l| l.to_string())),
                ("cursor", cursor.map(str::to_owned)),
            ],
        );
        self.get(&url).await
    }

    /// `POST /v1/sandboxes/{id}/files/mkdir` (`mkdir -p`): the directory.
    pub async fn mkdir(&self, id: &str, path: &str) -> Result<FileEntry, ClientError> {
        let req = MkdirRequest {
            path: path.to_owned(),
        };
        let url = routes::sandbox_sub(id, "files/mkdir");
        self.call(Method::POST, &url, &req).await
    }

    /// `POST /v1/sandboxes/{id}/files/move`: the entry at its new path.
    pub async fn move_file(&self, id: &str, req: &MoveRequest) -> Result<FileEntry, ClientError> {
        let url = routes::sandbox_sub(id, "files/move");
        self.call(Method::POST, &url, req).await
    }

    /// `DELETE /v1/sandboxes/{id}/files?path=&recursive=`.
    pub async fn remove(&self, id: &str, path: &str, recursive: bool) -> Result<(), ClientError> {
        let url = with_query(
            &routes::file(id, "", path),
            &[("recursive", recursive.then(|| "true".to_string()))],
        );
        self.call_no_content(Method::DELETE, &url, empty(), None)
            .await
    }

    /// `GET /v1/sandboxes/{id}/files/tar?path=`: a tar stream of the tree under `path`.
    pub async fn download_tar(&self, id: &str, path: &str) -> Result<Download, ClientError> {
        let url = routes::file(id, "/tar", path);
        let resp = self.request(Method::GET, &url, empty(), None).await?;
        Ok(Download::new(resp))
    }

    /// `PUT /v1/sandboxes/{id}/files/tar?path=`: extracts a tar stream into directory `path`.
    pub async fn upload_tar(&self, id: &str, path: &str, tar: Body) -> Result<(), ClientError> {
        let url = routes::file(id, "/tar", path);
        self.call_no_content(Method::PUT, &url, tar, Some("application/x-tar"))
            .await
    }

    /// `GET /v1/sandboxes/{id}/files/watch?path=&recursive=`: changes under `path` as they
    /// happen, until the caller drops the stream.
    pub async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<NdjsonStream<WatchEvent>, ClientError> {
        let url = with_query(
            &routes::file(id, "/watch", path),
            &[("recursive", Some(recursive.to_string()))],
        );
        let resp = self.request(Method::GET, &url, empty(), None).await?;
        Ok(NdjsonStream::new(resp.into_body()))
    }

    /// `GET /v1/sandboxes/{id}/files/thumbnail?path=&size=`: a PNG of an image file.
    pub async fn thumbnail(
        &self,
        id: &str,
        path: &str,
        size: Option<u32>,
    ) -> Result<Bytes, ClientError> {
        let url = with_query(
            &routes::file(id, "/thumbnail", path),
            &[("size", size.map(|s| s.to_string()))],
        );
        let resp = self.request(Method::GET, &url, empty(), None).await?;
        Download::new(resp).bytes().await
    }
}
