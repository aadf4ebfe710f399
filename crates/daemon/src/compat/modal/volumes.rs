//! Volumes through the Modal layer: `Volume.from_name(name, create_if_missing=)` and
//! `Volume.objects.create` are the daemon's named volumes of the same name, mounted by
//! `Sandbox.create(volumes={path: volume})`; `reload_volumes()` has nothing to do, since a
//! mount is live (every write is seen at once), and only checks that the sandbox runs.
//!
//! A volume's id is `vo-` and its name. Modal's names may hold capitals, which the daemon's
//! volume names do not: such a name is refused with what the daemon accepts. Ephemeral
//! volumes and mounting a volume's sub-path are not served yet.

use belljar_api::{CreateVolume, VolumeMount as DaemonMount, volume::valid_volume_name};
use hyper::body::Incoming;

use super::error::{ModalError, Result};
use super::wire::{
    Empty, TaskReloadVolumesRequest, VolumeGetOrCreateRequest, VolumeGetOrCreateResponse,
    VolumeMetadata, VolumeMount, creation,
};
use super::{Modal, ids, unary};
use crate::sandbox::SandboxError;

const VOLUME: &str = "vo-";
/// `VolumeFsVersion.V2`, the version the client makes by default.
const VERSION: i32 = 2;

/// The control plane's volume routes.
pub async fn route(
    m: &Modal,
    method: &str,
    req: hyper::Request<Incoming>,
) -> Option<hyper::Response<tonic::body::Body>> {
    let m = m.clone();
    Some(match method {
        "VolumeGetOrCreate" => unary(req, |r| get_or_create(m.clone(), r)).await,
        _ => return None,
    })
}

async fn get_or_create(
    m: Modal,
    req: VolumeGetOrCreateRequest,
) -> Result<VolumeGetOrCreateResponse> {
    let name = req.deployment_name;
    if name.is_empty() {
        return Err(ModalError::NotImplemented("Ephemeral volumes".into()));
    }
    if !valid_volume_name(&name) {
        return Err(ModalError::BadRequest(format!(
            "Volume name {name:?}: Belljar's volume names are 1 to 64 characters of \
             [a-z0-9_.-] starting with a letter or digit"
        )));
    }
    let environment = if req.environment_name.is_empty() {
        "main"
    } else {
        req.environment_name.as_str()
    };
    let sandboxes = &m.st().sandboxes;
    let existing = match sandboxes.volume(&name) {
        Ok(_) => true,
        Err(SandboxError::VolumeNotFound(_)) => false,
        Err(e) => return Err(e.into()),
    };
    match (req.object_creation_type, existing) {
        (creation::LOOKUP | creation::CREATE_IF_MISSING, true) => {}
        (creation::CREATE_FAIL_IF_EXISTS, true) => {
            return Err(ModalError::AlreadyExists(format!(
                "Volume '{name}' already exists in environment '{environment}'"
            )));
        }
        (creation::LOOKUP, false) => {
            return Err(ModalError::NotFound(format!(
                "Volume '{name}' not found in environment '{environment}'"
            )));
        }
        (creation::CREATE_IF_MISSING | creation::CREATE_FAIL_IF_EXISTS, false) => {
            let create = CreateVolume {
                name: name.clone(),
                size_mib: None,
            };
            let s = sandboxes.clone();
            match super::detached(async move { Ok(s.create_volume(create).await?) }).await {
                Ok(_) => {}
                // Made by another request since the lookup: that one is the volume.
                Err(ModalError::Api(crate::http::error::ApiError::Sandbox(
                    SandboxError::Conflict(_),
                ))) if req.object_creation_type == creation::CREATE_IF_MISSING => {}
                Err(e) => return Err(e),
            }
        }
        (other, _) => {
            return Err(ModalError::NotImplemented(format!(
                "Volumes of object_creation_type {other}"
            )));
        }
    }
    Ok(VolumeGetOrCreateResponse {
        volume_id: format!("{VOLUME}{name}"),
        version: VERSION,
        metadata: Some(VolumeMetadata {
            version: VERSION,
            name,
        }),
    })
}

/// The daemon's mounts of a sandbox definition's volumes.
pub fn mounts(mounts: &[VolumeMount]) -> Result<Vec<DaemonMount>> {
    mounts
        .iter()
        .map(|v| {
            if !v.sub_path.is_empty() {
                return Err(ModalError::NotImplemented(
                    "Mounting a volume's sub-path".into(),
                ));
            }
            let name = v
                .volume_id
                .strip_prefix(VOLUME)
                .filter(|n| valid_volume_name(n))
                .ok_or_else(|| ModalError::NotFound(format!("Volume {} not found", v.volume_id)))?;
            Ok(DaemonMount {
                source: name.to_owned(),
                path: v.mount_path.clone(),
                read_only: v.read_only.then_some(true),
            })
        })
        .collect()
}

/// `reload_volumes()`: the mounts are live, so only the sandbox is checked.
pub async fn reload(m: Modal, req: TaskReloadVolumesRequest) -> Result<Empty> {
    let id = ids::sandbox_of_task(&req.task_id)?;
    let s = m.st().sandboxes.get(&id)?;
    if s.status.is_final() {
        return Err(ModalError::Conflict(super::sandboxes::finished(
            &ids::sandbox(&id),
        )));
    }
    Ok(Empty {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_ids_are_the_daemons_names() {
        let m = mounts(&[VolumeMount {
            volume_id: "vo-data".into(),
            mount_path: "/mnt/data".into(),
            read_only: true,
            sub_path: String::new(),
        }])
        .unwrap();
        assert_eq!(m[0].source, "data");
        assert_eq!(m[0].read_only, Some(true));
        for bad in ["data", "vo-../x", "vo-"] {
            let v = VolumeMount {
                volume_id: bad.into(),
                mount_path: "/mnt".into(),
                ..VolumeMount::default()
            };
            assert!(mounts(&[v]).is_err(), "{bad}");
        }
    }
}
