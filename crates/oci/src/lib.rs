//! OCI images for Belljar: what a user's image is, where it comes from, and how its layers
//! become a root filesystem without ever writing outside it.
//!
//! - [`reference`]: image references (`alpine`, `localhost:5000/tools/cli:1.2@sha256:…`), as
//!   Docker and Podman read them.
//! - [`spec`]: the OCI and Docker manifest, index and image-config documents.
//! - [`registry`]: a client of the OCI distribution API (token and basic auth, redirects,
//!   every digest verified while streaming).
//! - [`archive`]: `docker save` / `podman save` archives and OCI layouts.
//! - [`unpack`]: layers applied to a root directory: whiteouts, hard links, owners, modes,
//!   extended attributes; every path resolved inside the root, never following a link out,
//!   and the bytes written bounded.
//!
//! Everything here treats its input as hostile: a registry, an archive and a layer may lie.

pub mod archive;
pub mod build;
pub mod digest;
pub mod dockerfile;
pub mod export;
pub mod layers;
pub mod reference;
pub mod registry;
pub mod spec;
pub mod store;
pub mod unpack;

pub use digest::Digest;
pub use reference::Reference;

/// Why an image could not be had. Each variant has a stable [`Error::code`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The reference is not one Docker would accept.
    #[error("Invalid image reference {reference:?}: {reason}")]
    BadReference { reference: String, reason: String },
    /// The registry (or archive) has no such repository, tag or digest.
    #[error("Image {reference} not found: {detail}")]
    NotFound { reference: String, detail: String },
    /// The registry refused our credentials, or wants some we do not have.
    #[error("The registry refused access to {reference}: {detail}")]
    Denied { reference: String, detail: String },
    /// The registry cannot be reached, stalled, or answered in a way the API does not allow.
    #[error("Registry {registry}: {detail}")]
    Registry { registry: String, detail: String },
    /// A document or layer breaks the rules: a digest that does not match, a size it lied
    /// about, a path out of the root, a manifest over size, a media type we cannot read.
    #[error("Invalid image: {0}")]
    Invalid(String),
    /// The image would hold more than the configured cap.
    #[error("The image would hold more than {limit} bytes")]
    TooLarge { limit: u64 },
    /// No `linux/amd64` image in the index.
    #[error("Image {reference} has no linux/amd64 variant (it has: {available})")]
    NoPlatform {
        reference: String,
        available: String,
    },
    /// A Dockerfile that cannot be built as written.
    #[error(transparent)]
    Dockerfile(#[from] dockerfile::ParseError),
    /// A build step names a file it may not have: out of the build context, missing, or
    /// with a name the image format reserves.
    #[error("{0}")]
    Context(String),
    /// Reading or writing local files failed.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The stable code of this error, one of the API's error codes.
    pub fn code(&self) -> &'static str {
        match self {
            Error::BadReference { .. } => "bad_request",
            Error::NotFound { .. } => "image_not_found",
            Error::Denied { .. } => "registry_denied",
            Error::Registry { .. } => "registry_unavailable",
            Error::Invalid(_) => "image_invalid",
            Error::TooLarge { .. } => "image_too_large",
            Error::NoPlatform { .. } => "image_not_found",
            Error::Dockerfile(_) => "dockerfile_invalid",
            Error::Context(_) => "invalid_path",
            Error::Io { .. } => "internal",
        }
    }

    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
