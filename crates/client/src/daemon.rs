//! The daemon-wide routes: info, doctor, the OpenAPI document, images and their builds, the event
//! stream, the browser's sign-in token and the terminal WebSocket.

use belljar_api::{
    BuildQuery, DoctorReport, Event, Image, ImageBuildEvent, Info, PruneImages, PrunedImages,
    PullImage, SessionToken,
};
use http::Method;

use crate::body::{Body, empty, json};
use crate::client::{Client, WebSocket};
use crate::error::ClientError;
use crate::ndjson::NdjsonStream;
use crate::routes::{self, DOCTOR, EVENTS, IMAGES, INFO, OPENAPI, SESSION_TOKEN, with_query};

/// How to open a terminal: its size, directory and user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TerminalOptions {
    pub rows: Option<u16>,
    pub cols: Option<u16>,
    pub cwd: Option<String>,
    /// A root shell.
    pub sudo: bool,
}

impl Client {
    /// `GET /v1/info`: version, backends, images, free memory.
    pub async fn info(&self) -> Result<Info, ClientError> {
        self.get(INFO).await
    }

    /// `GET /v1/doctor`: the host's findings, checked by the daemon as its own user.
    pub async fn doctor(&self) -> Result<DoctorReport, ClientError> {
        self.get(DOCTOR).await
    }

    /// `GET /v1/openapi.json`: the API's description, generated from the daemon's handlers.
    pub async fn openapi(&self) -> Result<serde_json::Value, ClientError> {
        self.get(OPENAPI).await
    }

    /// `GET /v1/images`.
    pub async fn images(&self) -> Result<Vec<Image>, ClientError> {
        self.get(IMAGES).await
    }

    /// `POST /v1/images/{name}/build`: progress lines, then `done` or `error`.
    pub async fn build_image(
        &self,
        name: &str,
    ) -> Result<NdjsonStream<ImageBuildEvent>, ClientError> {
        let resp = self
            .request(Method::POST, &routes::image_build(name), empty(), None)
            .await?;
        Ok(NdjsonStream::new(resp.into_body()))
    }

    /// `POST /v1/images/pull`: progress lines, then `done` or `error`.
    pub async fn pull_image(
        &self,
        reference: &str,
        insecure: bool,
    ) -> Result<NdjsonStream<ImageBuildEvent>, ClientError> {
        let req = PullImage {
            reference: reference.to_owned(),
            insecure: insecure.then_some(true),
        };
        let resp = self
            .request(
                Method::POST,
                routes::IMAGE_PULL,
                json(&req),
                Some("application/json"),
            )
            .await?;
        Ok(NdjsonStream::new(resp.into_body()))
    }

    /// `POST /v1/images/import?tag=`: the archive `tar` (docker-archive or OCI layout) in;
    /// progress lines, then one `done` per image, or `error`.
    pub async fn import_image(
        &self,
        tar: Body,
        tag: Option<&str>,
    ) -> Result<NdjsonStream<ImageBuildEvent>, ClientError> {
        let url = with_query(routes::IMAGE_IMPORT, &[("tag", tag.map(str::to_owned))]);
        let resp = self
            .request(Method::POST, &url, tar, Some("application/x-tar"))
            .await?;
        Ok(NdjsonStream::new(resp.into_body()))
    }

    /// `POST /v1/images/build?tag=&dockerfile=&build_args=&no_cache=`: a Dockerfile build of
    /// the context `tar`; `step` and `progress` lines, then `done` or `error`.
    pub async fn build_dockerfile(
        &self,
        tar: Body,
        query: &BuildQuery,
    ) -> Result<NdjsonStream<ImageBuildEvent>, ClientError> {
        let url = with_query(
            routes::IMAGE_BUILD,
            &[
                ("tag", Some(query.tag.clone())),
                ("dockerfile", query.dockerfile.clone()),
                ("build_args", query.build_args.clone()),
                ("no_cache", query.no_cache.map(|b| b.to_string())),
            ],
        );
        let resp = self
            .request(Method::POST, &url, tar, Some("application/x-tar"))
            .await?;
        Ok(NdjsonStream::new(resp.into_body()))
    }

    /// `GET /v1/images/{name}/export`: a user's image as an OCI archive, as it arrives.
    pub async fn export_image(&self, name: &str) -> Result<crate::body::Download, ClientError> {
        let resp = self
            .request(Method::GET, &routes::image_export(name), empty(), None)
            .await?;
        Ok(crate::body::Download::new(resp))
    }

    /// `POST /v1/images/prune`: removes the images nothing stands on, as `req` says.
    pub async fn prune_images(&self, req: &PruneImages) -> Result<PrunedImages, ClientError> {
        self.call(Method::POST, routes::IMAGE_PRUNE, req).await
    }

    /// `DELETE /v1/images/{name}`: a pulled or imported image's name.
    pub async fn remove_image(&self, name: &str) -> Result<(), ClientError> {
        self.call_no_content(Method::DELETE, &routes::image(name), empty(), None)
            .await
    }

    /// `GET /v1/events?since=`: sandbox and command changes, replayed from after `since`
    /// (else from now on); the stream stays open.
    pub async fn events(&self, since: Option<u64>) -> Result<NdjsonStream<Event>, ClientError> {
        let url = with_query(EVENTS, &[("since", since.map(|s| s.to_string()))]);
        let resp = self.request(Method::GET, &url, empty(), None).await?;
        Ok(NdjsonStream::new(resp.into_body()))
    }

    /// `POST /v1/session/token`: a one-time token that signs a browser in.
    pub async fn session_token(&self) -> Result<SessionToken, ClientError> {
        self.call_empty(Method::POST, SESSION_TOKEN).await
    }

    /// `http://127.0.0.1:<port>/ui?token=<one-time>`: the daemon's web UI, signed in, for a
    /// browser or the app's window to open (the token is valid once, for 60 seconds).
    pub async fn ui_login_url(&self, port: u16) -> Result<String, ClientError> {
        let token = self.session_token().await?.token;
        Ok(with_query(
            &format!("http://127.0.0.1:{port}/ui"),
            &[("token", Some(token))],
        ))
    }

    /// `GET /v1/sandboxes/{id}/terminal` as a WebSocket: binary frames are terminal bytes,
    /// text frames `TerminalMessage`s.
    pub async fn terminal(
        &self,
        id: &str,
        opts: &TerminalOptions,
    ) -> Result<WebSocket, ClientError> {
        let path = with_query(
            &routes::sandbox_sub(id, "terminal"),
            &[
                ("rows", opts.rows.map(|r| r.to_string())),
                ("cols", opts.cols.map(|c| c.to_string())),
                ("cwd", opts.cwd.clone()),
                ("sudo", opts.sudo.then(|| "true".to_string())),
            ],
        );
        self.websocket(&path).await
    }
}
