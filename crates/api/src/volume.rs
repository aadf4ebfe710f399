//! Host folders and named volumes mounted into sandboxes (`-v SOURCE:PATH[:ro]`), and the
//! named volumes themselves (`/v1/volumes`), which outlive the sandboxes that mount them.

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::ToSchema;

use crate::limits::{self, Invalid, Validate};

/// The most host folders and volumes one sandbox mounts.
pub const MAX_VOLUME_MOUNTS: usize = 16;

/// A host folder or a named volume mounted at a path of the sandbox, two-way and live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// An absolute host path (a host folder) or a volume's name (`[a-z0-9][a-z0-9_.-]*`).
    #[schema(min_length = 1, max_length = 4096)]
    pub source: String,
    /// Absolute path in the sandbox; not `/`, without `.` or `..`.
    #[schema(min_length = 1, max_length = 1024)]
    pub path: String,
    /// Mounted read-only (the kernel's read-only mount flag). Default `false`.
    #[serde(default)]
    #[ts(optional)]
    pub read_only: Option<bool>,
}

impl VolumeMount {
    /// Whether the source names a host folder (an absolute path) rather than a volume.
    pub fn is_host_folder(&self) -> bool {
        self.source.starts_with('/')
    }

    pub fn read_only(&self) -> bool {
        self.read_only.unwrap_or(false)
    }
}

impl Validate for VolumeMount {
    fn validate(&self) -> Result<(), Invalid> {
        limits::text("source", &self.source, 4096)?;
        limits::text("path", &self.path, 1024)?;
        if !self.is_host_folder() && !valid_volume_name(&self.source) {
            return Err(Invalid::new(
                "source",
                "must be an absolute host path or a volume name of 1 to 64 characters of \
                 [a-z0-9_.-] starting with a letter or digit",
            ));
        }
        Ok(())
    }
}

/// Whether `name` is a volume's name: 1 to 64 characters of `[a-z0-9_.-]`, starting with a
/// letter or a digit.
pub fn valid_volume_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'.' | b'-')
        })
}

/// The body of `POST /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// 1 to 64 characters of `[a-z0-9_.-]`, starting with a letter or a digit.
    #[schema(min_length = 1, max_length = 64)]
    pub name: String,
    /// A cap on what the volume holds, enforced by the kernel (writes past it fail with
    /// ENOSPC); none when absent. 16 to 1048576 (1 TiB).
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 16, maximum = 1048576)]
    pub size_mib: Option<u64>,
}

impl Validate for CreateVolume {
    fn validate(&self) -> Result<(), Invalid> {
        if !valid_volume_name(&self.name) {
            return Err(Invalid::new(
                "name",
                "must be 1 to 64 characters of [a-z0-9_.-] starting with a letter or digit",
            ));
        }
        limits::range("size_mib", self.size_mib, 16, 1 << 20)
    }
}

/// A named volume: files that outlive the sandboxes that mount them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct Volume {
    pub name: String,
    /// Its cap, when it has one.
    #[serde(default)]
    #[ts(optional)]
    pub size_mib: Option<u64>,
    pub created_at: i64,
    /// The sandboxes (ids) that mount it.
    pub used_by: Vec<String>,
}

/// `GET /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct VolumeList {
    pub volumes: Vec<Volume>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_sources() {
        for ok in ["data", "a", "cache-1.2_x", "0abc"] {
            assert!(valid_volume_name(ok), "{ok}");
        }
        for bad in ["", "-x", ".x", "Data", "a/b", "a b", &"x".repeat(65)] {
            assert!(!valid_volume_name(bad), "{bad}");
        }
        let m = |source: &str| VolumeMount {
            source: source.into(),
            path: "/w".into(),
            read_only: None,
        };
        assert!(m("/home/me/project").validate().is_ok());
        assert!(m("data").validate().is_ok());
        assert!(m("./rel").validate().is_err());
        assert!(m("~/x").validate().is_err());
        assert!(!m("/x").read_only());
    }
}
