//! The volume routes: create (`POST /v1/volumes`), list, get, delete.

use belljar_api::{CreateVolume, Volume, VolumeList};
use http::Method;

use crate::client::Client;
use crate::error::ClientError;
use crate::routes::{VOLUMES, segment};

impl Client {
    /// `POST /v1/volumes`: a new named volume.
    pub async fn create_volume(&self, req: &CreateVolume) -> Result<Volume, ClientError> {
        self.call(Method::POST, VOLUMES, req).await
    }

    /// `GET /v1/volumes`: every volume, by name.
    pub async fn list_volumes(&self) -> Result<VolumeList, ClientError> {
        self.get(VOLUMES).await
    }

    /// `GET /v1/volumes/{name}`: the volume and the sandboxes that mount it.
    pub async fn volume(&self, name: &str) -> Result<Volume, ClientError> {
        self.get(&format!("{VOLUMES}/{}", segment(name))).await
    }

    /// `DELETE /v1/volumes/{name}`: refused (`volume_in_use`) while a sandbox mounts it.
    pub async fn delete_volume(&self, name: &str) -> Result<(), ClientError> {
        self.call_no_content(
            Method::DELETE,
            &format!("{VOLUMES}/{}", segment(name)),
            crate::body::empty(),
            None,
        )
        .await
    }
}
