//! `POST /v1/sandboxes/{id}/pause`, `/resume`, `/fork` and `/start`.

use belljar_api::{ForkSandbox, Sandbox};
use http::Method;

use crate::client::Client;
use crate::error::ClientError;
use crate::routes::sandbox_sub;

impl Client {
    /// Freezes a running sandbox's processes; the sandbox, now `paused`.
    pub async fn pause_sandbox(&self, id: &str) -> Result<Sandbox, ClientError> {
        self.call_empty(Method::POST, &sandbox_sub(id, "pause"))
            .await
    }

    /// Lets a paused sandbox run on; the sandbox, now `running`.
    pub async fn resume_sandbox(&self, id: &str) -> Result<Sandbox, ClientError> {
        self.call_empty(Method::POST, &sandbox_sub(id, "resume"))
            .await
    }

    /// Starts a stopped persistent sandbox again from its latest snapshot; the sandbox, now
    /// `running`.
    pub async fn start_sandbox(&self, id: &str) -> Result<Sandbox, ClientError> {
        self.call_empty(Method::POST, &sandbox_sub(id, "start"))
            .await
    }

    /// A new running sandbox with the files of `id` now (which keeps running).
    pub async fn fork_sandbox(&self, id: &str, req: &ForkSandbox) -> Result<Sandbox, ClientError> {
        self.call(Method::POST, &sandbox_sub(id, "fork"), req).await
    }
}
