//! Users' images: the OCI image store's side of [`Images`] (pull, import, removal, and how
//! their commands run).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use belljar_api::{Image, ImageBuildEvent, ImageStatus, PruneImages, PrunedImage, PrunedImages};
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{ImageError, Images, KNOWN, ResolvedImage, valid_name};

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
            // A fraction of a GiB is taken too (the tests' tiny stores).
            cap_bytes: var("BELLJAR_IMAGE_STORE_GIB")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|g| g.is_finite() && *g >= 0.0)
                .map_or(64 << 30, gib_to_bytes),
        }
    }
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "float to int saturates, which is what is wanted"
)]
fn gib_to_bytes(gib: f64) -> u64 {
    (gib * f64::from(1u32 << 30)) as u64
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
        Progress::Shared { index } => format!("layer {}: already here (shared)", index + 1),
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

impl Images {
    pub(crate) fn oci(&self) -> Result<&belljar_oci::store::Store, ImageError> {
        self.oci
            .as_ref()
            .ok_or_else(|| ImageError::NoStore(self.paths.cache.join("oci")))
    }

    /// A user's image `name` (a reference or an id), with its run defaults.
    pub(super) fn resolve_oci(&self, name: &str) -> Result<Option<ResolvedImage>, ImageError> {
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
            id: Some(image.id.to_string()),
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

    /// How commands of a sandbox of image `name` (made from the image `id`, when it has
    /// one) run, when it is a user's image. Cached by id, or by name for a sandbox recorded
    /// without one (a pull, import or removal forgets those), since every command asks.
    pub fn run_defaults(&self, name: &str, id: Option<&str>) -> Option<Arc<RunDefaults>> {
        if id.is_none() && valid_name(name) && KNOWN.contains(&name) {
            return None;
        }
        let key = match id {
            Some(id) => id.to_owned(),
            None => format!("name:{name}"),
        };
        if let Some(d) = self
            .defaults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Some(d.clone());
        }
        let d = self.resolve_pinned(name, id).ok()?.oci?;
        self.defaults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, d.clone());
        Some(d)
    }

    /// Names a built image `tag` (moving the name from any other image).
    pub(crate) fn name_built(
        &self,
        tag: &str,
        image: &belljar_oci::store::StoredImage,
    ) -> Result<Image, ImageError> {
        self.oci()?.name(tag, &image.id)?;
        self.names_changed();
        Ok(self.oci_image(image, tag))
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
                    image: Box::new(this.oci_image(&image, &parsed.to_string())),
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
                            image: Box::new(this.oci_image(i, &name)),
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
        // A template names the image by this name: it would no longer start.
        let templates = self
            .store
            .templates_of_image(name)
            .map_err(|e| ImageError::InUse(format!("cannot read the templates: {e}")))?;
        if !templates.is_empty() {
            return Err(ImageError::InUse(format!(
                "templates use image {name} ({}); remove them first",
                templates.join(", ")
            )));
        }
        // The image's files go only with its last name, and never under a sandbox, a
        // snapshot or a template that stands on them.
        if last {
            let users: Vec<String> = self
                .store
                .images_in_use()
                .map_err(|e| ImageError::InUse(format!("cannot read the sandboxes: {e}")))?
                .into_iter()
                .filter(|(n, id)| match id {
                    Some(id) => *id == image.id.to_string(),
                    // Recorded before ids were: by what the name names now.
                    None => store.get(n).is_some_and(|i| i.id == image.id),
                })
                .map(|(n, _)| n)
                .collect();
            if !users.is_empty() {
                return Err(ImageError::InUse(format!(
                    "sandboxes, snapshots or templates stand on image {} (as {}); delete them first",
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

    /// Counts a Dockerfile build as under way until the guard is dropped.
    pub fn build_running(&self) -> super::BuildRunning {
        self.dockerfile_builds
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        super::BuildRunning(self.dockerfile_builds.clone())
    }

    /// Removes the user's images nothing stands on (no sandbox, usable snapshot or
    /// template): unnamed ones; with `all`, named ones too; with `build_cache`, the
    /// Dockerfile step cache and its steps' images (refused while a build runs, whose steps
    /// are not yet cached or named).
    pub fn prune(&self, req: &PruneImages) -> Result<PrunedImages, ImageError> {
        let store = self.oci()?;
        let build_cache = req.build_cache.unwrap_or(false);
        if build_cache
            && self
                .dockerfile_builds
                .load(std::sync::atomic::Ordering::SeqCst)
                > 0
        {
            return Err(ImageError::InUse(
                "A Dockerfile build is running: prune the build cache when it has ended".into(),
            ));
        }
        let in_use: std::collections::HashSet<String> = self
            .store
            .images_in_use()
            .map_err(|e| ImageError::InUse(format!("cannot read the sandboxes: {e}")))?
            .into_iter()
            .filter_map(|(name, id)| id.or_else(|| store.get(&name).map(|i| i.id.to_string())))
            .collect();
        let mut out = PrunedImages::default();
        let before = store.used_bytes();
        for image in store.list() {
            let id = image.id.to_string();
            let named = !image.names.is_empty();
            let step = !named && image.source == belljar_oci::build::BUILD_SOURCE;
            if !prunable(named, step, req) || in_use.contains(&id) {
                continue;
            }
            if store.remove(&id)?.is_some() {
                out.removed.push(PrunedImage {
                    id,
                    names: image.names.clone(),
                    build_step: step,
                    size_bytes: image.size_bytes,
                });
            }
        }
        if build_cache {
            store.clear_build_cache()?;
        }
        // Layers no image names: left by pulls and builds that failed, or by images removed
        // while a pull held the layers.
        store.collect_chains(true)?;
        out.reclaimed_bytes = before.saturating_sub(store.used_bytes());
        self.names_changed();
        Ok(out)
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

    pub(crate) fn oci_image(&self, image: &belljar_oci::store::StoredImage, name: &str) -> Image {
        let all = self.oci.as_ref().map(|s| s.list()).unwrap_or_default();
        self.oci_image_among(image, name, &all)
    }

    /// `image` as `name`, with the bytes it shares with the others of `all`.
    pub(crate) fn oci_image_among(
        &self,
        image: &belljar_oci::store::StoredImage,
        name: &str,
        all: &[belljar_oci::store::StoredImage],
    ) -> Image {
        let store = self.oci.as_ref();
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
            shared_bytes: store.map(|s| s.shared_bytes(image, all)),
            last_used_at: store.and_then(|s| s.last_used(image)),
            source: Some(image.source.clone()),
            used_by: None,
        }
    }

    /// Writes the user's image `name` (a name or an id) as an OCI archive into a scratch
    /// file, opened and already unlinked (it goes when the reader is done). Blocking.
    pub fn export(&self, name: &str) -> Result<(std::fs::File, u64), ImageError> {
        if valid_name(name) && self.is_recipe(name) {
            return Err(ImageError::BadName(format!(
                "{name} is one of Belljar's own images, which are not exported"
            )));
        }
        let store = self.oci()?;
        if store.get(name).is_none() {
            return Err(ImageError::NotPulled(name.to_owned()));
        }
        let path = self.scratch_dir()?.join(format!(
            "{}export-{}.tar",
            belljar_oci::store::scratch_prefix(),
            crate::util::new_id("exp")
        ));
        let written = std::fs::File::create(&path)
            .map_err(|e| ImageError::Oci(belljar_oci::Error::io("Cannot write the archive")(e)))
            .and_then(|f| {
                store.export(name, std::io::BufWriter::with_capacity(1 << 20, f))?;
                Ok(())
            });
        let opened = written.and_then(|()| {
            std::fs::File::open(&path)
                .map_err(|e| ImageError::Oci(belljar_oci::Error::io("Cannot read the archive")(e)))
        });
        let _ = std::fs::remove_file(&path);
        let file = opened?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok((file, len))
    }

    /// Records that a sandbox is made from the user's image `id` now.
    pub fn used(&self, id: &str) {
        if let (Some(store), Ok(d)) = (&self.oci, belljar_oci::Digest::parse(id)) {
            store.touch(&d);
        }
    }
}

/// Whether a prune as `req` asks takes an image nothing stands on: an unnamed one always, a
/// step of the build cache with `build_cache`, a named one with `all`.
fn prunable(named: bool, build_step: bool, req: &PruneImages) -> bool {
    if build_step {
        req.build_cache.unwrap_or(false)
    } else {
        !named || req.all.unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prune_takes_what_it_is_asked_for() {
        let ask = |all, build_cache| PruneImages {
            all: Some(all),
            build_cache: Some(build_cache),
        };
        // (named, build step) → taken by a plain prune, --all, --build-cache.
        for (named, step, plain, all, cache) in [
            (false, false, true, true, true),
            (true, false, false, true, false),
            (false, true, false, false, true),
        ] {
            assert_eq!(prunable(named, step, &PruneImages::default()), plain);
            assert_eq!(prunable(named, step, &ask(true, false)), all);
            assert_eq!(prunable(named, step, &ask(false, true)), cache);
        }
    }
}
