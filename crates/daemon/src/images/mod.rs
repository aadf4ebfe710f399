//! Images: finding built root filesystems in the cache and building them with
//! `guest-images/build-image.sh`.
//!
//! A built image is `<cache>/images/<name>/current/` (a symlink to its digest directory) with
//! `rootfs/` (the tree the namespace backend mounts), `rootfs.ext4` (the microVM disk) and
//! `manifest.json`. The daemon never writes there itself; the build script does.
//!
//! Users' own images (pulled from a registry, imported from an archive) live in the OCI image
//! store at `<cache>/oci/` ([`belljar_oci::store`]), found by their canonical names
//! (`localhost:5000/app:1.0`); they run on the namespace backend, with their configuration's
//! environment, working directory and user as the defaults of every command.

mod oci;
mod recipes;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use belljar_api::{Image, ImageStatus, ImageUsers};
use serde::Deserialize;

pub use self::oci::{RegistrySettings, RunDefaults, run_defaults};
use crate::paths::Paths;
use crate::store::Store;
use crate::util::now_ms;

/// The images the project's recipes provide, listed even before they are built.
pub const KNOWN: &[&str] = &["base", "python3.13", "node24", "node22"];

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The name is not a plausible image name.
    #[error("Invalid image name {0:?}")]
    BadName(String),
    /// No recipe and no built image of that name.
    #[error("Unknown image {0:?}")]
    Unknown(String),
    /// The image exists as a recipe but is not built; `build` is the command that builds it
    /// for this daemon ([`Images::build_command`]).
    #[error("Image {name} is not built; run `{build}`")]
    NotBuilt { name: String, build: String },
    /// This daemon is not root, and only root can build an image (debootstrap, chroot and
    /// device nodes); `build` is the command that does it with sudo.
    #[error(
        "Building image {name} needs root (debootstrap, chroot, device nodes), and this daemon runs as an ordinary user: run `{build}`"
    )]
    NeedsRoot { name: String, build: String },
    /// A build of the image is already running.
    #[error("Image {0} is already being built")]
    Busy(String),
    /// The build script is missing.
    #[error("Cannot find the image build script at {0}")]
    NoScript(PathBuf),
    /// The image a sandbox or snapshot was made from is no longer in the store.
    #[error("Image {id} (once named {name}) is no longer here")]
    Gone { name: String, id: String },
    /// A reference to an image this daemon has not pulled or imported.
    #[error("Image {0} is not here; run `belljar images pull {0}` (or import it)")]
    NotPulled(String),
    /// Pulling, importing or removing a user's image failed.
    #[error(transparent)]
    Oci(#[from] belljar_oci::Error),
    /// The image is used by sandboxes or snapshots.
    #[error("{0}")]
    InUse(String),
    /// A user's image needs the statically linked agent, and this daemon has only `0`
    /// (dynamically linked) and no built image to take the static one from.
    #[error(
        "The agent {} is dynamically linked, and a pulled or imported image may have no C library: build the base image (scripts/setup.sh) or set the daemon's agent to a static build",
        .0.display()
    )]
    NoStaticAgent(PathBuf),
    /// The OCI image store could not be opened (see the daemon's log).
    #[error("The image store at {0} is not usable; see the daemon's log")]
    NoStore(PathBuf),
}

/// A built image on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedImage {
    /// `<cache>/images/<name>/current`.
    pub dir: PathBuf,
    pub rootfs: PathBuf,
    pub ext4: PathBuf,
    /// A user's image (from the OCI store), with how its commands run.
    pub oci: Option<Arc<RunDefaults>>,
    /// A user's image's id (`sha256:…`), which a sandbox made from it keeps.
    pub id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Manifest {
    #[serde(default)]
    digest: Option<String>,
    #[serde(default)]
    created: Option<String>,
    #[serde(default)]
    size_bytes: Option<u64>,
}

#[derive(Clone)]
pub struct Images {
    paths: Paths,
    guest_images: PathBuf,
    store: Store,
    building: Arc<Mutex<HashSet<String>>>,
    /// Whether this daemon runs as root, the only user that can build an image.
    root: bool,
    oci: Option<belljar_oci::store::Store>,
    registries: Arc<RegistrySettings>,
    /// Users' images' run defaults by image id: read once, they never change.
    defaults: Arc<Mutex<std::collections::HashMap<String, Arc<RunDefaults>>>>,
    /// Dockerfile builds under way: their steps' images are not yet named or cached.
    dockerfile_builds: Arc<std::sync::atomic::AtomicUsize>,
}

/// Counts a Dockerfile build as under way while it lives ([`Images::build_running`]).
pub struct BuildRunning(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for BuildRunning {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Image names are recipe directory names: lowercase letters, digits, `.`, `-`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
}

impl Images {
    /// `guest_images` is the `guest-images/` directory holding the build script and recipes.
    pub fn new(paths: Paths, guest_images: PathBuf, store: Store) -> Self {
        let registries = RegistrySettings::from_env();
        let oci_root = paths.cache.join("oci");
        let oci = belljar_oci::store::Store::open(&oci_root, registries.cap_bytes)
            .inspect_err(|e| tracing::warn!(error = %e, store = %oci_root.display(), "cannot open the image store"))
            .ok();
        Self {
            paths,
            guest_images,
            store,
            building: Default::default(),
            root: nix::unistd::Uid::effective().is_root(),
            oci,
            registries: Arc::new(registries),
            defaults: Default::default(),
            dockerfile_builds: Default::default(),
        }
    }

    /// The command that builds image `name` for this daemon: through the API as root; for an
    /// ordinary user's daemon, the build script with sudo, writing into this daemon's cache
    /// (the script finds the static agent that the set-up built, or the one a package ships
    /// beside it).
    pub fn build_command(&self, name: &str) -> String {
        recipes::build_command(
            self.root,
            &self.paths.cache,
            &self.guest_images.join("build-image.sh"),
            name,
        )
    }

    /// The built image `name`.
    pub fn resolve(&self, name: &str) -> Result<ResolvedImage, ImageError> {
        if !valid_name(name) || !self.is_recipe(name) && !self.paths.image_dir(name).exists() {
            if let Some(image) = self.resolve_oci(name)? {
                return Ok(image);
            }
            if belljar_oci::Reference::parse(name).is_ok() {
                if valid_name(name) {
                    return Err(ImageError::Unknown(name.to_owned()));
                }
                return Err(ImageError::NotPulled(name.to_owned()));
            }
            return Err(ImageError::BadName(name.to_owned()));
        }
        let dir = self.paths.image_dir(name);
        let rootfs = dir.join("rootfs");
        if !rootfs.is_dir() && !dir.join("rootfs.ext4").is_file() {
            if self.is_recipe(name) {
                return Err(ImageError::NotBuilt {
                    name: name.to_owned(),
                    build: self.build_command(name),
                });
            }
            return Err(ImageError::Unknown(name.to_owned()));
        }
        Ok(ResolvedImage {
            ext4: dir.join("rootfs.ext4"),
            rootfs,
            dir,
            oci: None,
            id: None,
        })
    }

    /// The image a sandbox or snapshot stands on: by the id it was made with when it has one
    /// (the name may name another image since), else by its name.
    pub fn resolve_pinned(
        &self,
        name: &str,
        id: Option<&str>,
    ) -> Result<ResolvedImage, ImageError> {
        let Some(id) = id else {
            return self.resolve(name);
        };
        self.resolve_oci(id)?
            .filter(|r| r.id.as_deref() == Some(id))
            .ok_or_else(|| ImageError::Gone {
                name: name.to_owned(),
                id: id.to_owned(),
            })
    }

    pub(super) fn recipe(&self, name: &str) -> PathBuf {
        self.guest_images.join("recipes").join(name)
    }

    /// Whether `name` is an image this build tree has a recipe for, or one Belljar ships
    /// (known even where the recipes are not readable): one that can be built.
    pub(super) fn is_recipe(&self, name: &str) -> bool {
        KNOWN.contains(&name) || self.recipe(name).is_dir()
    }

    /// One image's state.
    pub fn get(&self, name: &str) -> Image {
        let dir = self.paths.image_dir(name);
        let building = self.is_building(name);
        let manifest: Option<Manifest> = std::fs::read(dir.join("manifest.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let built = dir.join("rootfs").is_dir() || dir.join("rootfs.ext4").is_file();
        let status = if building {
            ImageStatus::Building
        } else if built {
            ImageStatus::Ready
        } else {
            ImageStatus::Missing
        };
        let mut image = Image {
            name: name.to_owned(),
            status,
            digest: None,
            size_bytes: None,
            built_at: None,
            command: None,
            shared_bytes: None,
            last_used_at: None,
            source: None,
            used_by: None,
        };
        if let (true, Some(m)) = (built, manifest) {
            image.digest = m.digest;
            image.size_bytes = m.size_bytes;
            image.built_at = m.created.as_deref().and_then(crate::time::parse_rfc3339);
            if let Err(e) = self.store.put_image(&image, now_ms()) {
                tracing::warn!(error = %e, "cannot record image");
            }
        }
        image
    }

    /// Every known image: the recipes, the cache's directories and the project's four.
    pub fn list(&self) -> Vec<Image> {
        let mut names: Vec<String> = KNOWN.iter().map(|s| s.to_string()).collect();
        for dir in [
            self.guest_images.join("recipes"),
            self.paths.cache.join("images"),
        ] {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if valid_name(&n) && e.path().is_dir() && !names.contains(&n) {
                        names.push(n);
                    }
                }
            }
        }
        names.sort();
        let mut all: Vec<Image> = names.iter().map(|n| self.get(n)).collect();
        if let Some(store) = &self.oci {
            let stored = store.list();
            for image in &stored {
                // A build's unnamed images are its steps (the step cache), not the user's.
                if image.names.is_empty() && image.source != belljar_oci::build::BUILD_SOURCE {
                    all.push(self.oci_image_among(image, image.id.as_str(), &stored));
                }
                for n in &image.names {
                    all.push(self.oci_image_among(image, n, &stored));
                }
            }
        }
        match self.store.image_users() {
            Ok(users) => {
                for image in &mut all {
                    image.used_by = Some(self.users_of(image, &users));
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read what stands on the images"),
        }
        all
    }

    /// What of `users` stands on `image`: by the id they were made with, else (recorded
    /// before ids were, or one of Belljar's own) by name.
    fn users_of(&self, image: &Image, users: &[crate::store::ImageUser]) -> ImageUsers {
        let mut out = ImageUsers::default();
        let same_name = |n: &str| match (&self.oci, &image.digest) {
            (Some(store), Some(id)) if image.source.is_some() => {
                store.get(n).is_some_and(|i| i.id.as_str() == id)
            }
            _ => n == image.name,
        };
        for u in users {
            let on = match (&u.image_id, &image.digest) {
                (Some(id), Some(d)) if image.source.is_some() => id == d,
                (Some(_), _) => false,
                (None, _) => same_name(&u.image),
            };
            if on {
                match u.kind {
                    crate::store::ImageUserKind::Sandbox => out.sandboxes.push(u.id.clone()),
                    crate::store::ImageUserKind::Snapshot => out.snapshots.push(u.id.clone()),
                    crate::store::ImageUserKind::Template => out.templates.push(u.id.clone()),
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use std::path::Path;

    use belljar_api::ImageBuildEvent;

    use super::recipes::build_command;
    use super::*;

    fn setup() -> (tempfile::TempDir, Images) {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::resolve(
            Some(&dir.path().join("home")),
            Some(&dir.path().join("cache")),
        )
        .unwrap();
        paths.create().unwrap();
        let gi = dir.path().join("guest-images");
        std::fs::create_dir_all(gi.join("recipes/base")).unwrap();
        let images = Images::new(paths, gi, Store::open_in_memory().unwrap());
        (dir, images)
    }

    #[test]
    fn names_the_build_command_for_root_and_for_an_ordinary_user() {
        let script = Path::new("/src/guest-images/build-image.sh");
        assert_eq!(
            build_command(true, Path::new("/c"), script, "node24"),
            "belljar images build node24"
        );
        assert_eq!(
            build_command(
                false,
                Path::new("/home/ann/.cache/belljar"),
                script,
                "node24"
            ),
            "sudo env BELLJAR_CACHE=/home/ann/.cache/belljar /src/guest-images/build-image.sh node24"
        );
        // A shell reads the words back as they were.
        let command = build_command(false, Path::new("/home/a b/it's"), script, "base");
        let words = command.strip_prefix("sudo env ").unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf '%s\\n' {words}"))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "BELLJAR_CACHE=/home/a b/it's\n/src/guest-images/build-image.sh\nbase\n"
        );
    }

    #[test]
    fn parses_build_timestamps() {
        assert_eq!(crate::time::parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            crate::time::parse_rfc3339("2024-03-01T12:30:05Z"),
            Some(1_709_296_205_000)
        );
        assert_eq!(crate::time::parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn resolves_built_images_and_explains_missing_ones() {
        let (dir, images) = setup();
        assert!(matches!(
            images.resolve("base"),
            Err(ImageError::NotBuilt { .. })
        ));
        assert!(matches!(
            images.resolve("nope"),
            Err(ImageError::Unknown(_))
        ));
        assert!(matches!(
            images.resolve("../x"),
            Err(ImageError::BadName(_))
        ));
        let cur = dir.path().join("cache/images/base/current");
        std::fs::create_dir_all(cur.join("rootfs")).unwrap();
        std::fs::write(
            cur.join("manifest.json"),
            r#"{"name":"base","digest":"abc","created":"1970-01-01T00:00:01Z","size_bytes":7}"#,
        )
        .unwrap();
        assert_eq!(images.resolve("base").unwrap().rootfs, cur.join("rootfs"));
        let list = images.list();
        let base = list.iter().find(|i| i.name == "base").unwrap();
        assert_eq!(base.status, ImageStatus::Ready);
        assert_eq!(base.digest.as_deref(), Some("abc"));
        assert_eq!(base.built_at, Some(1000));
        let node = list.iter().find(|i| i.name == "node24").unwrap();
        assert_eq!(node.status, ImageStatus::Missing);
    }

    #[tokio::test]
    async fn build_streams_the_script_output_and_reports_failure() {
        let (dir, images) = setup();
        std::fs::write(
            dir.path().join("guest-images/build-image.sh"),
            "echo step one >&2\necho \"building $1\"\nexit 3\n",
        )
        .unwrap();
        let events: Vec<_> = images.build("base").unwrap().collect().await;
        assert!(events.contains(&ImageBuildEvent::Progress {
            message: "step one".into()
        }));
        assert!(events.contains(&ImageBuildEvent::Progress {
            message: "building base".into()
        }));
        match events.last().unwrap() {
            ImageBuildEvent::Error { message, .. } => assert!(message.contains("step one")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            images.build("python9"),
            Err(ImageError::Unknown(_))
        ));
    }
}
