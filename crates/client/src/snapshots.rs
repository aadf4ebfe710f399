//! The snapshot routes: take (`POST /v1/sandboxes/{id}/snapshots`), list, get, delete; and
//! the mounts of directory snapshots in a sandbox (`/v1/sandboxes/{id}/mounts`).

use belljar_api::{
    CreateSnapshot, ListSnapshotsQuery, SandboxMounts, Snapshot, SnapshotList, SnapshotMount,
};
use http::Method;

use crate::client::Client;
use crate::error::ClientError;
use crate::routes::{SNAPSHOTS, sandbox_sub, segment, with_query};

impl Client {
    /// `POST /v1/sandboxes/{id}/snapshots`: a new snapshot (the sandbox stops unless
    /// `keep_running`).
    pub async fn snapshot_sandbox(
        &self,
        id: &str,
        req: &CreateSnapshot,
    ) -> Result<Snapshot, ClientError> {
        self.call(Method::POST, &sandbox_sub(id, "snapshots"), req)
            .await
    }

    /// `GET /v1/snapshots`: one page, newest first.
    pub async fn list_snapshots(
        &self,
        q: &ListSnapshotsQuery,
    ) -> Result<SnapshotList, ClientError> {
        let status = q.status.map(|s| <&'static str>::from(s).to_string());
        let url = with_query(
            SNAPSHOTS,
            &[
                ("sandbox_id", q.sandbox_id.clone()),
                ("status", status),
                ("since", q.since.map(|v| v.to_string())),
                ("until", q.until.map(|v| v.to_string())),
                ("limit", q.limit.map(|v| v.to_string())),
                ("cursor", q.cursor.clone()),
            ],
        );
        self.get(&url).await
    }

    /// `GET /v1/snapshots/{id}`.
    pub async fn snapshot(&self, id: &str) -> Result<Snapshot, ClientError> {
        self.get(&format!("{SNAPSHOTS}/{}", segment(id))).await
    }

    /// `GET /v1/snapshots/{id}/diff[?to=]`: what changed from the snapshot to `to` (a snapshot
    /// or a sandbox), or what the snapshot changed on top of its parent.
    pub async fn snapshot_diff(
        &self,
        id: &str,
        to: Option<&str>,
    ) -> Result<belljar_api::SnapshotDiff, ClientError> {
        self.get(&with_query(
            &format!("{SNAPSHOTS}/{}/diff", segment(id)),
            &[("to", to.map(str::to_owned))],
        ))
        .await
    }

    /// `PATCH /v1/snapshots/{id}`: sets how long it lives from now (`0`: never expires).
    pub async fn set_snapshot_expiration(
        &self,
        id: &str,
        expiration_ms: i64,
    ) -> Result<Snapshot, ClientError> {
        self.call(
            Method::PATCH,
            &format!("{SNAPSHOTS}/{}", segment(id)),
            &belljar_api::UpdateSnapshot { expiration_ms },
        )
        .await
    }

    /// `DELETE /v1/snapshots/{id}`: the snapshot, now `deleted`.
    pub async fn delete_snapshot(&self, id: &str) -> Result<Snapshot, ClientError> {
        self.call_empty(Method::DELETE, &format!("{SNAPSHOTS}/{}", segment(id)))
            .await
    }

    /// `GET /v1/sandboxes/{id}/mounts`: the directory snapshots mounted in the sandbox.
    pub async fn sandbox_mounts(&self, id: &str) -> Result<SandboxMounts, ClientError> {
        self.get(&sandbox_sub(id, "mounts")).await
    }

    /// `POST /v1/sandboxes/{id}/mounts`: mounts a directory snapshot into the running
    /// sandbox (Modal's `mount_image`).
    pub async fn mount_snapshot(
        &self,
        id: &str,
        mount: &SnapshotMount,
    ) -> Result<SnapshotMount, ClientError> {
        self.call(Method::POST, &sandbox_sub(id, "mounts"), mount)
            .await
    }

    /// `DELETE /v1/sandboxes/{id}/mounts?path=`: unmounts the snapshot mounted at `path`
    /// (Modal's `unmount_image`); the sandbox's writes under it are discarded.
    pub async fn unmount_snapshot(&self, id: &str, path: &str) -> Result<(), ClientError> {
        let url = with_query(
            &sandbox_sub(id, "mounts"),
            &[("path", Some(path.to_owned()))],
        );
        self.call_no_content(Method::DELETE, &url, crate::body::empty(), None)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_routes_are_encoded() {
        let q = ListSnapshotsQuery {
            sandbox_id: Some("sbx_a".into()),
            limit: Some(2),
            ..Default::default()
        };
        let url = with_query(SNAPSHOTS, &[("sandbox_id", q.sandbox_id.clone())]);
        assert_eq!(url, "/v1/snapshots?sandbox_id=sbx_a");
        assert_eq!(
            sandbox_sub("sbx_a", "snapshots"),
            "/v1/sandboxes/sbx_a/snapshots"
        );
        assert_eq!(
            format!("{SNAPSHOTS}/{}", segment("../x")),
            "/v1/snapshots/..%2Fx"
        );
    }
}
