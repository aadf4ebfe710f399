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

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use belljar_api::{Image, ImageBuildEvent, ImageStatus};
use futures::Stream;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

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

/// How a user's image runs: what its configuration asks of every command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunDefaults {
    /// The image's `Env`, under the sandbox's and the command's own.
    pub env: Vec<(String, String)>,
    /// `WorkingDir`, else `/`.
    pub cwd: String,
    /// `User` as the agent names users (a name; a numeric id is looked up in the image's
    /// `/etc/passwd`), else `root`.
    pub user: String,
    /// `Entrypoint` + `Cmd`: what `belljar run IMAGE` runs with no command.
    pub argv: Vec<String>,
}

/// Where users' images come from, and how much of them the store may hold.
#[derive(Debug, Clone)]
pub struct RegistrySettings {
    /// The registry a reference without one is pulled from (`BELLJAR_DEFAULT_REGISTRY`).
    pub default_registry: Option<String>,
    /// Registries spoken to over plain HTTP (`BELLJAR_INSECURE_REGISTRIES`, comma-separated).
    pub insecure: Vec<String>,
    /// The most bytes of file data the image store holds (`BELLJAR_IMAGE_STORE_GIB`, 64).
    pub cap_bytes: u64,
    /// When set, the only registries pulled from (`BELLJAR_ALLOWED_REGISTRIES`,
    /// comma-separated `host[:port]`).
    pub allowed: Option<Vec<String>>,
}

impl RegistrySettings {
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Self {
            default_registry: var("BELLJAR_DEFAULT_REGISTRY"),
            insecure: var("BELLJAR_INSECURE_REGISTRIES")
                .map(|v| {
                    v.split(',')
                        .map(|s| s.trim().to_owned())
                        .filter(|s| !s.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
            allowed: var("BELLJAR_ALLOWED_REGISTRIES").map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            }),
            cap_bytes: var("BELLJAR_IMAGE_STORE_GIB")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(64)
                << 30,
        }
    }
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
        }
    }

    fn oci(&self) -> Result<&belljar_oci::store::Store, ImageError> {
        self.oci
            .as_ref()
            .ok_or_else(|| ImageError::NoStore(self.paths.cache.join("oci")))
    }

    /// A user's image `name` (a reference or an id), with its run defaults.
    fn resolve_oci(&self, name: &str) -> Result<Option<ResolvedImage>, ImageError> {
        let Some(store) = &self.oci else {
            return Ok(None);
        };
        let Some(image) = store.get(name) else {
            return Ok(None);
        };
        Ok(Some(ResolvedImage {
            ext4: image.dir.join("rootfs.ext4"),
            rootfs: image.rootfs(),
            dir: image.dir.clone(),
            oci: Some(self.defaults_of(&image)?),
        }))
    }

    /// A user's image's run defaults, read from its config once (by id: they never change).
    fn defaults_of(
        &self,
        image: &belljar_oci::store::StoredImage,
    ) -> Result<Arc<RunDefaults>, ImageError> {
        let key = image.id.to_string();
        let cached = self
            .defaults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(d) = cached {
            return Ok(d);
        }
        let d = Arc::new(run_defaults(&image.config()?, &image.rootfs()));
        self.defaults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, d.clone());
        Ok(d)
    }

    /// How commands of a sandbox of image `name` run, when it is a user's image. Cached by
    /// name (a pull, import or removal forgets the cache), since every command asks.
    pub fn run_defaults(&self, name: &str) -> Option<Arc<RunDefaults>> {
        if valid_name(name) && KNOWN.contains(&name) {
            return None;
        }
        let key = format!("name:{name}");
        if let Some(d) = self
            .defaults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Some(d.clone());
        }
        let d = self.resolve(name).ok()?.oci?;
        self.defaults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, d.clone());
        Some(d)
    }

    /// Forgets the run defaults cached by name (a name may now mean another image).
    fn names_changed(&self) {
        self.defaults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| !k.starts_with("name:"));
    }

    /// Pulls `reference` into the image store; progress lines arrive as `progress`, then
    /// `done` or `error`. The pull goes on if the receiver is dropped.
    pub fn pull(
        &self,
        reference: &str,
        insecure: bool,
    ) -> Result<impl Stream<Item = ImageBuildEvent> + use<>, ImageError> {
        let parsed = belljar_oci::Reference::parse(reference)?;
        let parsed = match (&parsed.domain, &self.registries.default_registry) {
            (Some(_), _) => parsed,
            (None, Some(default)) => parsed.on(default),
            (None, None) => {
                return Err(belljar_oci::Error::BadReference {
                    reference: reference.to_owned(),
                    reason: "it names no registry, and this daemon has no default registry (BELLJAR_DEFAULT_REGISTRY); write it as host[:port]/repository[:tag]".into(),
                }
                .into());
            }
        };
        if let (Some(allowed), Some(domain)) = (&self.registries.allowed, &parsed.domain)
            && !allowed.contains(domain)
        {
            return Err(belljar_oci::Error::Denied {
                reference: parsed.to_string(),
                detail: format!(
                    "this daemon pulls only from {} (BELLJAR_ALLOWED_REGISTRIES)",
                    allowed.join(", ")
                ),
            }
            .into());
        }
        let store = self.oci()?.clone();
        let mut options = belljar_oci::registry::Options {
            insecure: self.registries.insecure.clone(),
            credentials: belljar_oci::registry::Credentials::load(&self.auth_files()),
            ..Default::default()
        };
        if insecure && let Some(d) = &parsed.domain {
            options.insecure.push(d.clone());
        }
        let (tx, rx) = mpsc::channel(256);
        let this = self.clone();
        tokio::spawn(async move {
            let mut progress = progress_events(tx.clone());
            let got = store.pull(&parsed, options, &mut progress).await;
            this.names_changed();
            let end = match got {
                Ok(image) => ImageBuildEvent::Done {
                    image: this.oci_image(&image, &parsed.to_string()),
                },
                Err(e) => ImageBuildEvent::Error {
                    code: oci_code(&e),
                    message: e.to_string(),
                },
            };
            let _ = tx.send(end).await;
        });
        Ok(ReceiverStream::new(rx))
    }

    /// Imports the docker-archive or OCI layout at `path` (a tar file or directory) into the
    /// image store, naming its images by `tags` too; `path` is removed when `remove_after`.
    pub fn import(
        &self,
        path: PathBuf,
        tags: Vec<String>,
        remove_after: bool,
    ) -> Result<impl Stream<Item = ImageBuildEvent> + use<>, ImageError> {
        let store = self.oci()?.clone();
        let (tx, rx) = mpsc::channel(256);
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut progress = progress_events(tx.clone());
            let got = store.import(&path, &tags, &mut progress);
            this.names_changed();
            if remove_after {
                let _ = std::fs::remove_file(&path);
            }
            let events: Vec<ImageBuildEvent> = match got {
                Ok(images) => images
                    .iter()
                    .map(|i| {
                        let name = i.names.first().cloned().unwrap_or_else(|| i.id.to_string());
                        ImageBuildEvent::Done {
                            image: this.oci_image(i, &name),
                        }
                    })
                    .collect(),
                Err(e) => vec![ImageBuildEvent::Error {
                    code: oci_code(&e),
                    message: e.to_string(),
                }],
            };
            for e in events {
                let _ = tx.blocking_send(e);
            }
        });
        Ok(ReceiverStream::new(rx))
    }

    /// The most bytes the image store holds.
    pub fn cap_bytes(&self) -> u64 {
        self.registries.cap_bytes
    }

    /// A directory for uploads on the image store's filesystem (removed when the daemon
    /// opens the store again).
    pub fn scratch_dir(&self) -> Result<PathBuf, ImageError> {
        self.oci()?;
        Ok(self.paths.cache.join("oci/tmp"))
    }

    /// Removes a user's image name (the image with its last name).
    pub fn remove(&self, name: &str) -> Result<(), ImageError> {
        if valid_name(name) && self.is_recipe(name) {
            return Err(ImageError::BadName(format!(
                "{name} is one of Belljar's own images; it is removed with the cache"
            )));
        }
        let store = self.oci()?;
        let (image, last) = store
            .removal(name)
            .ok_or_else(|| ImageError::NotPulled(name.to_owned()))?;
        // The image's files go only with its last name, and never under a sandbox or a
        // snapshot that stands on them.
        if last {
            let users: Vec<String> = self
                .store
                .images_in_use()
                .map_err(|e| ImageError::InUse(format!("cannot read the sandboxes: {e}")))?
                .into_iter()
                .filter(|n| store.get(n).is_some_and(|i| i.id == image.id))
                .collect();
            if !users.is_empty() {
                return Err(ImageError::InUse(format!(
                    "sandboxes or snapshots stand on image {} (as {}); delete them first",
                    image.id,
                    users.join(", ")
                )));
            }
        }
        let removed = store.remove(name)?;
        self.names_changed();
        match removed {
            Some(_) => Ok(()),
            None => Err(ImageError::NotPulled(name.to_owned())),
        }
    }

    /// The auth files read for registry credentials: this daemon's own (`belljar login`),
    /// `$REGISTRY_AUTH_FILE`, Podman's and Docker's.
    fn auth_files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.paths.cache.join("oci/auth.json")];
        if let Some(f) = std::env::var_os("REGISTRY_AUTH_FILE") {
            files.push(PathBuf::from(f));
        }
        if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
            files.push(PathBuf::from(d).join("containers/auth.json"));
        }
        if let Some(h) = std::env::var_os("HOME") {
            files.push(PathBuf::from(h).join(".docker/config.json"));
        }
        files
    }

    fn oci_image(&self, image: &belljar_oci::store::StoredImage, name: &str) -> Image {
        Image {
            name: name.to_owned(),
            status: ImageStatus::Ready,
            digest: Some(image.id.to_string()),
            size_bytes: Some(image.size_bytes),
            built_at: Some(image.created_ms),
            command: self
                .defaults_of(image)
                .ok()
                .map(|d| d.argv.clone())
                .filter(|a| !a.is_empty()),
        }
    }

    /// The command that builds image `name` for this daemon: through the API as root; for an
    /// ordinary user's daemon, the build script with sudo, writing into this daemon's cache
    /// (the script finds the static agent that the set-up built, or the one a package ships
    /// beside it).
    pub fn build_command(&self, name: &str) -> String {
        build_command(
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
        })
    }

    fn recipe(&self, name: &str) -> PathBuf {
        self.guest_images.join("recipes").join(name)
    }

    /// Whether `name` is an image this build tree has a recipe for, or one Belljar ships
    /// (known even where the recipes are not readable): one that can be built.
    fn is_recipe(&self, name: &str) -> bool {
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
        };
        if let (true, Some(m)) = (built, manifest) {
            image.digest = m.digest;
            image.size_bytes = m.size_bytes;
            image.built_at = m.created.as_deref().and_then(parse_rfc3339_ms);
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
            for image in store.list() {
                if image.names.is_empty() {
                    all.push(self.oci_image(&image, image.id.as_str()));
                }
                for n in &image.names {
                    all.push(self.oci_image(&image, n));
                }
            }
        }
        all
    }

    fn is_building(&self, name: &str) -> bool {
        self.building
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
    }

    /// Starts `build-image.sh NAME`; its output lines arrive as `progress`, then `done` or
    /// `error`. The build goes on if the receiver is dropped.
    pub fn build(
        &self,
        name: &str,
    ) -> Result<impl Stream<Item = ImageBuildEvent> + use<>, ImageError> {
        if !valid_name(name) {
            return Err(ImageError::BadName(name.to_owned()));
        }
        // Before the recipe is looked at: an ordinary user's daemon may not be able to read
        // the build tree, and whatever it holds, this daemon cannot build.
        if !self.root && self.is_recipe(name) {
            return Err(ImageError::NeedsRoot {
                name: name.to_owned(),
                build: self.build_command(name),
            });
        }
        if !self.recipe(name).is_dir() {
            return Err(ImageError::Unknown(name.to_owned()));
        }
        let script = self.guest_images.join("build-image.sh");
        if !script.is_file() {
            return Err(ImageError::NoScript(script));
        }
        if !self
            .building
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned())
        {
            return Err(ImageError::Busy(name.to_owned()));
        }
        let (tx, rx) = mpsc::channel(256);
        let this = self.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            let last = this.run_build(&script, &name, &tx).await;
            this.building
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&name);
            let end = match last {
                Ok(()) => ImageBuildEvent::Done {
                    image: this.get(&name),
                },
                Err(message) => ImageBuildEvent::Error {
                    code: belljar_api::ErrorCode::BuildFailed,
                    message,
                },
            };
            let _ = tx.send(end).await;
        });
        Ok(ReceiverStream::new(rx))
    }

    async fn run_build(
        &self,
        script: &Path,
        name: &str,
        tx: &mpsc::Sender<ImageBuildEvent>,
    ) -> Result<(), String> {
        let mut child = tokio::process::Command::new("bash")
            .arg(script)
            .arg(name)
            .env("BELLJAR_CACHE", &self.paths.cache)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(false)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", script.display()))?;
        let stdout = child.stdout.take().map(|s| BufReader::new(s).lines());
        let stderr = child.stderr.take().map(|s| BufReader::new(s).lines());
        let last_err = Arc::new(Mutex::new(String::new()));
        let forward = |lines: Option<tokio::io::Lines<_>>, keep: Option<Arc<Mutex<String>>>| {
            let tx = tx.clone();
            async move {
                let Some(mut lines) = lines else { return };
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(k) = &keep {
                        *k.lock().unwrap_or_else(|e| e.into_inner()) = line.clone();
                    }
                    // A slow or gone reader must not stall the build.
                    let _ = tx.try_send(ImageBuildEvent::Progress { message: line });
                }
            }
        };
        let out = forward_lines(stdout, tx.clone());
        let err = forward(stderr, Some(last_err.clone()));
        let ((), ()) = tokio::join!(out, err);
        let status = child.wait().await.map_err(|e| e.to_string())?;
        if status.success() {
            Ok(())
        } else {
            let last = last_err.lock().unwrap_or_else(|e| e.into_inner()).clone();
            Err(format!("build-image.sh {name} failed ({status}): {last}"))
        }
    }
}

/// A progress callback that sends each step's line (see [`progress_line`]) as a `progress`
/// event; a slow or gone reader must not stall the pull or import.
fn progress_events(
    tx: mpsc::Sender<ImageBuildEvent>,
) -> impl FnMut(belljar_oci::store::Progress) + Send {
    let mut last_shown = std::collections::HashMap::<usize, u64>::new();
    move |p| {
        if let Some(message) = progress_line(&p, &mut last_shown) {
            let _ = tx.try_send(ImageBuildEvent::Progress { message });
        }
    }
}

/// The stable code of a pull's or import's failure.
fn oci_code(e: &belljar_oci::Error) -> belljar_api::ErrorCode {
    e.code().parse().unwrap_or(belljar_api::ErrorCode::Internal)
}

/// A progress line for a pull's or import's step; a layer's bytes at most every 8 MiB.
fn progress_line(
    p: &belljar_oci::store::Progress,
    last: &mut std::collections::HashMap<usize, u64>,
) -> Option<String> {
    use belljar_oci::store::Progress;
    Some(match p {
        Progress::Resolved { layers, bytes } => format!("{layers} layers, {bytes} bytes"),
        Progress::Layer { index, done, size } => {
            let shown = last.entry(*index).or_insert(0);
            if *done < *size && *done < *shown + (8 << 20) {
                return None;
            }
            *shown = *done;
            format!("layer {}: {done}/{size} bytes", index + 1)
        }
        Progress::Unpacked { index, stats } => format!(
            "layer {}: unpacked {} entries, {} bytes{}",
            index + 1,
            stats.entries,
            stats.bytes,
            if stats.skipped_devices > 0 {
                format!(" ({} device nodes left out)", stats.skipped_devices)
            } else {
                String::new()
            }
        ),
        Progress::Cached => "already here".into(),
    })
}

/// The run defaults of an image's configuration; `rootfs` is its root, where a numeric
/// `User` is looked up.
pub fn run_defaults(config: &belljar_oci::spec::ImageConfig, rootfs: &Path) -> RunDefaults {
    let c = &config.config;
    let user = c
        .user
        .as_deref()
        .map(|u| u.split(':').next().unwrap_or(u).trim())
        .filter(|u| !u.is_empty())
        .map_or_else(|| "root".to_owned(), |u| user_name(u, rootfs));
    RunDefaults {
        env: config.env(),
        cwd: c
            .working_dir
            .clone()
            .filter(|w| w.starts_with('/'))
            .unwrap_or_else(|| "/".into()),
        user,
        argv: config.default_argv(),
    }
}

/// `user` as a name: a numeric id becomes the name `/etc/passwd` gives it (`0` is `root`).
fn user_name(user: &str, rootfs: &Path) -> String {
    let Ok(uid) = user.parse::<u32>() else {
        return user.to_owned();
    };
    if uid == 0 {
        return "root".into();
    }
    // A link could point anywhere on the host: the file is read only when it and `etc` are
    // no links.
    let passwd = rootfs.join("etc/passwd");
    let real = |p: &Path, dir: bool| {
        std::fs::symlink_metadata(p).is_ok_and(|m| {
            if dir {
                m.is_dir()
            } else {
                m.is_file() && m.len() < (4 << 20)
            }
        })
    };
    let text = (real(&rootfs.join("etc"), true) && real(&passwd, false))
        .then_some(())
        .and_then(|_| std::fs::read_to_string(&passwd).ok())
        .unwrap_or_default();
    text.lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[2].parse() == Ok(uid))
        .map_or_else(|| user.to_owned(), |f| f[0].to_owned())
}

/// See [`Images::build_command`].
fn build_command(root: bool, cache: &Path, script: &Path, name: &str) -> String {
    if root {
        return format!("belljar images build {name}");
    }
    format!(
        "sudo env BELLJAR_CACHE={} {} {name}",
        shell_word(&cache.display().to_string()),
        shell_word(&script.display().to_string())
    )
}

/// `s` as one word of a POSIX shell (quoted only where it must be). A path or setting never
/// holds a NUL, the one thing a shell word cannot carry; it would be shown as it is.
fn shell_word(s: &str) -> String {
    shlex::try_quote(s).map_or_else(|_| s.to_owned(), |q| q.into_owned())
}

async fn forward_lines(
    lines: Option<tokio::io::Lines<BufReader<tokio::process::ChildStdout>>>,
    tx: mpsc::Sender<ImageBuildEvent>,
) {
    let Some(mut lines) = lines else { return };
    while let Ok(Some(line)) = lines.next_line().await {
        let _ = tx.try_send(ImageBuildEvent::Progress { message: line });
    }
}

/// Parses `YYYY-MM-DDTHH:MM:SSZ` (what the build script writes) to Unix milliseconds.
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || !text.ends_with('Z') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + hh) * 60 + mm) * 60_000 + ss * 1000)
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

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
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ms("2024-03-01T12:30:05Z"),
            Some(1_709_296_205_000)
        );
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
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
