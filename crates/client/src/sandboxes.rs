//! The sandbox routes: create, list, get, usage, update, extend, stop, delete.

use belljar_api::{
    CreateSandbox, ExtendSandbox, ListSandboxesQuery, Sandbox, SandboxList, SandboxUsage,
    UpdateSandbox,
};
use http::Method;

use crate::body::empty;
use crate::client::Client;
use crate::error::ClientError;
use crate::routes::{self, SANDBOXES, with_query};

/// The largest page the daemon answers; listing everything asks for pages this big.
const PAGE: u32 = 200;

impl Client {
    /// `POST /v1/sandboxes`: a running sandbox.
    pub async fn create_sandbox(&self, req: &CreateSandbox) -> Result<Sandbox, ClientError> {
        self.call(Method::POST, SANDBOXES, req).await
    }

    /// `POST /v1/sandboxes` with an `Idempotency-Key`: a retry with the same key answers the
    /// sandbox the first request created.
    pub async fn create_sandbox_once(
        &self,
        req: &CreateSandbox,
        key: &str,
    ) -> Result<Sandbox, ClientError> {
        self.call_once(Method::POST, SANDBOXES, req, key).await
    }

    /// `GET /v1/sandboxes`: one page, newest first.
    pub async fn list_sandboxes(&self, q: &ListSandboxesQuery) -> Result<SandboxList, ClientError> {
        let url = with_query(
            SANDBOXES,
            &[
                ("status", q.status.map(|s| s.as_str().to_string())),
                ("tag", q.tag.clone()),
                ("since", q.since.map(|v| v.to_string())),
                ("until", q.until.map(|v| v.to_string())),
                ("limit", q.limit.map(|v| v.to_string())),
                ("cursor", q.cursor.clone()),
            ],
        );
        self.get(&url).await
    }

    /// Every sandbox that matches `q` (its `limit` and `cursor` are ignored), page by page.
    pub async fn all_sandboxes(&self, q: &ListSandboxesQuery) -> Result<Vec<Sandbox>, ClientError> {
        let mut q = ListSandboxesQuery {
            limit: Some(PAGE),
            cursor: None,
            ..q.clone()
        };
        let mut all = Vec::new();
        loop {
            let page = self.list_sandboxes(&q).await?;
            all.extend(page.sandboxes);
            match page.next_cursor {
                Some(c) => q.cursor = Some(c),
                None => return Ok(all),
            }
        }
    }

    /// `GET /v1/sandboxes/{id}`.
    pub async fn sandbox(&self, id: &str) -> Result<Sandbox, ClientError> {
        self.get(&routes::sandbox(id)).await
    }

    /// `GET /v1/sandboxes/{id}/usage`: what the running or paused sandbox uses now.
    pub async fn sandbox_usage(&self, id: &str) -> Result<SandboxUsage, ClientError> {
        self.get(&routes::sandbox_sub(id, "usage")).await
    }

    /// `PATCH /v1/sandboxes/{id}`: new tags or name.
    pub async fn update_sandbox(
        &self,
        id: &str,
        req: &UpdateSandbox,
    ) -> Result<Sandbox, ClientError> {
        self.call(Method::PATCH, &routes::sandbox(id), req).await
    }

    /// `POST /v1/sandboxes/{id}/extend`: a later timeout.
    pub async fn extend_sandbox(&self, id: &str, duration_ms: i64) -> Result<Sandbox, ClientError> {
        let path = routes::sandbox_sub(id, "extend");
        self.call(Method::POST, &path, &ExtendSandbox { duration_ms })
            .await
    }

    /// `POST /v1/sandboxes/{id}/stop`: the stopped sandbox.
    pub async fn stop_sandbox(&self, id: &str) -> Result<Sandbox, ClientError> {
        self.call_empty(Method::POST, &routes::sandbox_sub(id, "stop"))
            .await
    }

    /// `DELETE /v1/sandboxes/{id}`.
    pub async fn delete_sandbox(&self, id: &str) -> Result<(), ClientError> {
        self.call_no_content(Method::DELETE, &routes::sandbox(id), empty(), None)
            .await
    }
}
