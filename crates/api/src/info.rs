//! What the daemon is and can do: version, backends, images.

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::ToSchema;

use crate::{Backend, ErrorCode};

/// Whether one backend can run here, and why (not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct BackendInfo {
    pub backend: Backend,
    pub available: bool,
    pub reason: String,
}

/// `GET /v1/info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct Info {
    pub version: String,
    /// The backend `auto` resolves to on this host.
    pub default_backend: Backend,
    /// Why, e.g. "KVM is software-based (PVM) here: guest kernels would run emulated".
    pub default_backend_reason: String,
    pub backends: Vec<BackendInfo>,
    pub images: Vec<Image>,
    /// Host memory available to new sandboxes, MiB.
    pub free_memory_mib: u64,
    /// The warm pool (`belljard --pool`), one entry per configured image; empty when off.
    pub pool: Vec<PoolInfo>,
}

/// The warm pool of one image: sandboxes started ahead of demand on the default backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct PoolInfo {
    pub image: String,
    /// How many the daemon keeps ready.
    pub configured: u32,
    /// How many are ready now.
    pub ready: u32,
    /// How many are starting now (refills).
    pub starting: u32,
}

/// `POST /v1/session/token`: a one-time token for `GET /ui?token=<token>`, which turns it into
/// the browser's session cookie. Valid for one use within 60 seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct SessionToken {
    pub token: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(rename_all = "snake_case")]
pub enum ImageStatus {
    Ready,
    Missing,
    Building,
}

/// A root filesystem image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct Image {
    /// `base`, `python3.13`, `node24`, `node22`.
    pub name: String,
    pub status: ImageStatus,
    #[ts(optional)]
    pub digest: Option<String>,
    #[ts(optional)]
    pub size_bytes: Option<u64>,
    #[ts(optional)]
    pub built_at: Option<i64>,
}

/// One NDJSON line of `POST /v1/images/{name}/build`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageBuildEvent {
    Progress { message: String },
    Done { image: Image },
    Error { code: ErrorCode, message: String },
}
