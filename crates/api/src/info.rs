//! What the daemon is and can do: version, backends, images.

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::ToSchema;

use crate::limits::{self, Invalid, Validate};
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
    /// What a sandbox of the image runs when `belljar run IMAGE` names no command: a pulled
    /// or imported image's `Entrypoint` followed by its `Cmd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub command: Option<Vec<String>>,
    /// Bytes of its files that other images hold too (layers they share, and what a
    /// Dockerfile build took from one of Belljar's own images), for a user's image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub shared_bytes: Option<u64>,
    /// When a sandbox was last made from it (ms since the epoch), for a user's image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub last_used_at: Option<i64>,
    /// Where a user's image came from: `pull REF`, `import FILE` or `build`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub source: Option<String>,
    /// What stands on it, in `GET /v1/images`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub used_by: Option<ImageUsers>,
}

/// What stands on an image: a sandbox, snapshot or template keeps it from being removed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
pub struct ImageUsers {
    /// The sandboxes' ids.
    pub sandboxes: Vec<String>,
    /// The usable snapshots' ids.
    pub snapshots: Vec<String>,
    /// The templates' names.
    pub templates: Vec<String>,
}

/// The body of `POST /v1/images/prune`: which of the images nothing stands on (no sandbox,
/// usable snapshot or template) go. Unnamed images (a name pulled, imported or built again
/// moved to another image) always do; Belljar's own images never.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct PruneImages {
    /// Also every named image of yours that nothing stands on.
    #[serde(default)]
    #[ts(optional)]
    pub all: Option<bool>,
    /// Also the Dockerfile step cache (its steps' unnamed images).
    #[serde(default)]
    #[ts(optional)]
    pub build_cache: Option<bool>,
}

impl Validate for PruneImages {
    fn validate(&self) -> Result<(), Invalid> {
        Ok(())
    }
}

/// What `POST /v1/images/prune` removed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
pub struct PrunedImages {
    /// The removed images' ids (`sha256:…`), with the names they had.
    pub removed: Vec<PrunedImage>,
    /// Bytes of file data they held.
    pub reclaimed_bytes: u64,
}

/// One image `POST /v1/images/prune` removed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
pub struct PrunedImage {
    pub id: String,
    pub names: Vec<String>,
    /// Whether it was a step of the Dockerfile step cache.
    pub build_step: bool,
    pub size_bytes: u64,
}

/// The body of `POST /v1/images/pull`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct PullImage {
    /// `[registry/]repository[:tag][@sha256:…]`. A reference without a registry is pulled
    /// from the daemon's default registry (`BELLJAR_DEFAULT_REGISTRY`), else refused.
    pub reference: String,
    /// Speak plain HTTP to this registry although it is not on loopback (Docker's
    /// `--insecure-registry`).
    #[serde(default)]
    #[ts(optional)]
    pub insecure: Option<bool>,
}

impl Validate for PullImage {
    fn validate(&self) -> Result<(), Invalid> {
        if self.reference.is_empty() {
            return Err(Invalid::new("reference", "must not be empty"));
        }
        limits::text("reference", &self.reference, 512)
    }
}

/// `POST /v1/images/import`'s query: names the imported images get besides their own.
#[derive(
    Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS, utoipa::IntoParams,
)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ImportQuery {
    /// A name (`[registry/]repository[:tag]`) for the imported image.
    #[serde(default)]
    #[ts(optional)]
    #[param(max_length = 512)]
    pub tag: Option<String>,
}

impl Validate for ImportQuery {
    fn validate(&self) -> Result<(), Invalid> {
        match &self.tag {
            Some(t) => limits::text("tag", t, 512),
            None => Ok(()),
        }
    }
}

/// `POST /v1/images/build`'s query: what to build from the context sent as the body.
#[derive(
    Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS, utoipa::IntoParams,
)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct BuildQuery {
    /// The name the built image gets (`[registry/]repository[:tag]`).
    #[param(max_length = 512)]
    pub tag: String,
    /// The Dockerfile's path in the context; default `Dockerfile`.
    #[serde(default)]
    #[ts(optional)]
    #[param(max_length = 4096)]
    pub dockerfile: Option<String>,
    /// The build arguments, as a JSON object of strings (`{"VERSION":"1.2"}`), as Docker's
    /// `buildargs`.
    #[serde(default)]
    #[ts(optional)]
    #[param(max_length = 65536)]
    pub build_args: Option<String>,
    /// Run every step again instead of taking it from the step cache.
    #[serde(default)]
    #[ts(optional)]
    pub no_cache: Option<bool>,
}

impl Validate for BuildQuery {
    fn validate(&self) -> Result<(), Invalid> {
        if self.tag.is_empty() {
            return Err(Invalid::new("tag", "must not be empty"));
        }
        limits::text("tag", &self.tag, 512)?;
        if let Some(d) = &self.dockerfile {
            limits::text("dockerfile", d, 4096)?;
        }
        if let Some(a) = &self.build_args {
            limits::text("build_args", a, 65536)?;
        }
        Ok(())
    }
}

/// One NDJSON line of `POST /v1/images/build`, `POST /v1/images/{name}/build`,
/// `POST /v1/images/pull` and `POST /v1/images/import`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageBuildEvent {
    Progress {
        message: String,
    },
    /// A Dockerfile build starts step `step` of `steps` (1-based, every stage's counted);
    /// `cached` when its result comes from the step cache.
    Step {
        step: u32,
        steps: u32,
        instruction: String,
        cached: bool,
    },
    Done {
        image: Box<Image>,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
}
