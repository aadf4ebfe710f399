//! The template routes: create (`POST /v1/templates`), list, get, delete.

use belljar_api::{CreateTemplate, Template, TemplateList};
use http::Method;

use crate::client::Client;
use crate::error::ClientError;
use crate::routes::{TEMPLATES, segment};

impl Client {
    /// `POST /v1/templates`: a new template; its pool starts filling in the background.
    pub async fn create_template(&self, req: &CreateTemplate) -> Result<Template, ClientError> {
        self.call(Method::POST, TEMPLATES, req).await
    }

    /// `PUT /v1/templates/{name}`: replaces the template's image and defaults (`req.name` is
    /// its name); its pool is made again.
    pub async fn replace_template(&self, req: &CreateTemplate) -> Result<Template, ClientError> {
        self.call(
            Method::PUT,
            &format!("{TEMPLATES}/{}", segment(&req.name)),
            req,
        )
        .await
    }

    /// `GET /v1/templates`: every template, by name, with its pool's state.
    pub async fn list_templates(&self) -> Result<TemplateList, ClientError> {
        self.get(TEMPLATES).await
    }

    /// `GET /v1/templates/{name}`.
    pub async fn template(&self, name: &str) -> Result<Template, ClientError> {
        self.get(&format!("{TEMPLATES}/{}", segment(name))).await
    }

    /// `DELETE /v1/templates/{name}`: its pooled sandboxes are destroyed.
    pub async fn delete_template(&self, name: &str) -> Result<(), ClientError> {
        self.call_no_content(
            Method::DELETE,
            &format!("{TEMPLATES}/{}", segment(name)),
            crate::body::empty(),
            None,
        )
        .await
    }
}
