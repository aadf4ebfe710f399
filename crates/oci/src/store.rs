//! The image store on disk: every image unpacked into a root filesystem, found by its names.
//!
//! ```text
//! <root>/images/<config hex>/rootfs/        the image's files, owners as the layers say
//!                           config.json     the image configuration, as pulled
//!                           image.json      what the store knows of it (`StoredImage`)
//! <root>/names.json                         name → config hex
//! <root>/layers/                            the files of its layers, shared ([`crate::layers`])
//! <root>/tmp/                               pulls and imports in progress
//! ```
//!
//! An image's files are those of the top chain of its layers, under `layers/`, which images
//! with the same first layers share (its `rootfs` is a link to them); one stored before
//! layers were shared has its own `rootfs/`.
//!
//! An image is identified by its config's digest, as Docker's image id. It is unpacked
//! under `tmp/` and renamed into `images/` only when complete, and only then named: a
//! failure or a `kill -9` mid-pull leaves nothing visible, and the next [`Store::open`]
//! empties `tmp/`.

use std::collections::BTreeMap;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::archive::Archive;
use crate::digest::Verified;
use crate::layers::{Base, chain_ids};
use crate::registry::{Options, Registry};
use crate::spec::{self, Document, ImageConfig, MAX_CONFIG};
use crate::{Digest, Error, Reference, unpack};

/// What the store knows of one image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredImage {
    /// The config's digest.
    pub id: Digest,
    /// The names it is known by, canonical (`localhost:5000/app:1.0`).
    #[serde(default)]
    pub names: Vec<String>,
    /// The manifest it was pulled by, when it came from a registry or layout.
    #[serde(default)]
    pub manifest: Option<Digest>,
    /// Bytes of file data in the root filesystem.
    pub size_bytes: u64,
    pub created_ms: i64,
    /// Where it came from (`pull REF`, `import FILE`).
    pub source: String,
    /// The chains of its layers, bottom first ([`crate::layers`]); empty for an image with
    /// files of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chain: Vec<Digest>,
    #[serde(skip)]
    pub dir: PathBuf,
    #[serde(skip)]
    rootfs: PathBuf,
}

impl StoredImage {
    /// Its root filesystem (shared with the images its layers are in too: read only).
    pub fn rootfs(&self) -> PathBuf {
        self.rootfs.clone()
    }

    pub fn config(&self) -> Result<ImageConfig, Error> {
        let path = self.dir.join("config.json");
        let bytes =
            std::fs::read(&path).map_err(Error::io(format!("Cannot read {}", path.display())))?;
        ImageConfig::parse(&bytes)
    }
}

/// A step of a pull or import, for progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The manifest is known: `layers` layers of `bytes` bytes to fetch.
    Resolved { layers: usize, bytes: u64 },
    /// Layer `index` (of `layers`) has `done` of its `size` bytes.
    Layer { index: usize, done: u64, size: u64 },
    /// Layer `index` is unpacked.
    Unpacked { index: usize, stats: unpack::Stats },
    /// The image is already in the store.
    Cached,
    /// Layer `index` is in the store already (another image has it).
    Shared { index: usize },
}

#[derive(Clone)]
pub struct Store {
    pub(crate) root: PathBuf,
    /// The most bytes of file data the whole store may hold.
    pub(crate) cap_bytes: u64,
    /// Serialises the writes of `names.json`.
    names_lock: Arc<Mutex<()>>,
}

impl Store {
    /// Opens (making it when needed) the store at `root`, holding at most `cap_bytes`.
    pub fn open(root: &Path, cap_bytes: u64) -> Result<Self, Error> {
        for d in ["images", "tmp"] {
            std::fs::create_dir_all(root.join(d))
                .map_err(Error::io(format!("Cannot make {}", root.join(d).display())))?;
        }
        // Scratch entries are named after the process that made them: those of processes
        // gone are pulls and imports that never finished (several daemons may share a cache).
        if let Ok(entries) = std::fs::read_dir(root.join("tmp")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let owner = name.split('.').next().and_then(|p| p.parse::<i32>().ok());
                let alive = owner.is_some_and(|pid| {
                    rustix::process::Pid::from_raw(pid)
                        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
                });
                if !alive {
                    let _ = remove_tree(&e.path());
                }
            }
        }
        Ok(Self {
            root: root.to_owned(),
            cap_bytes,
            names_lock: Default::default(),
        })
    }

    fn names(&self) -> BTreeMap<String, String> {
        std::fs::read(self.root.join("names.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn write_names(&self, names: &BTreeMap<String, String>) -> Result<(), Error> {
        let tmp = self.root.join("names.json.tmp");
        let text = serde_json::to_vec_pretty(names).map_err(|e| Error::Io {
            what: "Cannot write names.json".into(),
            source: e.into(),
        })?;
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, self.root.join("names.json")))
            .map_err(Error::io("Cannot write names.json"))
    }

    fn image_dir(&self, id: &Digest) -> PathBuf {
        self.root.join("images").join(id.hex())
    }

    /// Where the files of the image in `dir` with layers `chain` are: its top layer's, or
    /// (no layers) its own `rootfs/`.
    fn files_of(&self, dir: &Path, chain: &[Digest]) -> PathBuf {
        match chain.last() {
            Some(top) => self.chain_rootfs(top),
            None => dir.join("rootfs"),
        }
    }

    /// Image `hex` as stored, with its names from `names` (names.json, read once by the
    /// caller).
    fn load(&self, hex: &str, names: &BTreeMap<String, String>) -> Option<StoredImage> {
        let dir = self.root.join("images").join(hex);
        let bytes = std::fs::read(dir.join("image.json")).ok()?;
        let mut image: StoredImage = serde_json::from_slice(&bytes).ok()?;
        image.rootfs = self.files_of(&dir, &image.chain);
        image.dir = dir;
        image.names = names
            .iter()
            .filter(|(_, h)| h.as_str() == hex)
            .map(|(n, _)| n.clone())
            .collect();
        Some(image)
    }

    /// The image `name` names: a canonical reference, or an id (`sha256:…`, or 12 or more
    /// of its hex digits).
    pub fn get(&self, name: &str) -> Option<StoredImage> {
        self.get_in(name, &self.names())
    }

    fn get_in(&self, name: &str, names: &BTreeMap<String, String>) -> Option<StoredImage> {
        if let Some(n) = by_name(names, name) {
            return self.load(&names[&n], names);
        }
        let hex = name.strip_prefix("sha256:").unwrap_or(name);
        if hex.len() >= 12 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            let found: Vec<_> = self
                .ids()
                .into_iter()
                .filter(|h| h.starts_with(hex))
                .collect();
            if let [one] = found.as_slice() {
                return self.load(one, names);
            }
        }
        None
    }

    fn ids(&self) -> Vec<String> {
        std::fs::read_dir(self.root.join("images"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| Digest::parse(&format!("sha256:{n}")).is_ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every image, newest first.
    pub fn list(&self) -> Vec<StoredImage> {
        let names = self.names();
        let mut all: Vec<_> = self
            .ids()
            .iter()
            .filter_map(|h| self.load(h, &names))
            .collect();
        all.sort_by_key(|i| std::cmp::Reverse(i.created_ms));
        all
    }

    /// Bytes of file data the store holds: its layers', each once, and those of images with
    /// files of their own.
    pub fn used_bytes(&self) -> u64 {
        let own: u64 = self
            .list()
            .iter()
            .filter(|i| i.chain.is_empty())
            .map(|i| i.size_bytes)
            .sum();
        own + self.chain_bytes()
    }

    /// Bytes of `image`'s file data that other images hold too: its layers that are theirs
    /// too, and what it has of one of Belljar's own images.
    pub fn shared_bytes(&self, image: &StoredImage, all: &[StoredImage]) -> u64 {
        let Some(top) = image.chain.last() else {
            return 0;
        };
        let others: std::collections::HashSet<&Digest> = all
            .iter()
            .filter(|i| i.id != image.id)
            .flat_map(|i| i.chain.iter())
            .collect();
        let layers: u64 = image
            .chain
            .iter()
            .filter(|c| others.contains(c))
            .filter_map(|c| self.chain(c))
            .map(|i| i.layer_bytes)
            .sum();
        layers + self.chain(top).map_or(0, |i| i.outside_bytes)
    }

    /// Records that a sandbox was made from image `id` now.
    pub fn touch(&self, id: &Digest) {
        let _ = std::fs::write(self.image_dir(id).join("last-used"), now_ms().to_string());
    }

    /// When a sandbox was last made from `image` (ms since the epoch).
    pub fn last_used(&self, image: &StoredImage) -> Option<i64> {
        std::fs::read_to_string(image.dir.join("last-used"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Gives image `id` the name `name` (moving the name from any other image).
    pub fn name(&self, name: &str, id: &Digest) -> Result<(), Error> {
        let r = Reference::parse(name)?;
        let _guard = self.names_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut names = self.names();
        names.insert(r.to_string(), id.hex().to_owned());
        self.write_names(&names)
    }

    /// What removing `name` would take: the image it names, and whether the image's files
    /// go with it (the name is its last, or `name` is its id).
    pub fn removal(&self, name: &str) -> Option<(StoredImage, bool)> {
        let names = self.names();
        let image = self.get_in(name, &names)?;
        let last = !names_after_removal(&names, name, &image)
            .values()
            .any(|h| h == image.id.hex());
        Some((image, last))
    }

    /// Removes the name `name`; the image goes with its last name (or at once, when `name`
    /// is its id). The image's id is returned.
    pub fn remove(&self, name: &str) -> Result<Option<Digest>, Error> {
        let _guard = self.names_lock.lock().unwrap_or_else(|e| e.into_inner());
        let names = self.names();
        let Some(image) = self.get_in(name, &names) else {
            return Ok(None);
        };
        let names = names_after_removal(&names, name, &image);
        self.write_names(&names)?;
        if !names.values().any(|h| h == image.id.hex()) {
            let trash =
                self.root
                    .join("tmp")
                    .join(format!("{}rm-{}", scratch_prefix(), image.id.hex()));
            std::fs::rename(&image.dir, &trash)
                .map_err(Error::io(format!("Cannot remove {}", image.dir.display())))?;
            // Gone from the store once renamed; the files (a large image's take seconds on a
            // busy disk) go on a thread of their own, so that the removal answers at once.
            // What a crash leaves of them is scratch of a process gone: the next
            // [`Store::open`] removes it.
            remove_in_background(vec![trash]);
            if !image.chain.is_empty() {
                self.collect_chains(false)?;
            }
        }
        Ok(Some(image.id))
    }

    /// Pulls `reference` (which names its registry) into the store and names it.
    pub async fn pull(
        &self,
        reference: &Reference,
        options: Options,
        progress: &mut (dyn FnMut(Progress) + Send),
    ) -> Result<StoredImage, Error> {
        let registry = Registry::new(reference, options)?;
        let shown = reference.to_string();
        let (mt, bytes, mut manifest_digest) = registry.manifest(&reference.manifest_ref()).await?;
        let mut doc = spec::parse_document(&mt, &bytes)?;
        if let Document::Index(index) = &doc {
            let chosen = spec::choose_platform(index, &shown)?.clone();
            let (mt, bytes, d) = registry.manifest(chosen.digest.as_str()).await?;
            if d != chosen.digest {
                return Err(Error::Invalid(format!(
                    "manifest {d} is not the index's {}",
                    chosen.digest
                )));
            }
            manifest_digest = d;
            doc = spec::parse_document(&mt, &bytes)?;
        }
        let Document::Manifest(manifest) = doc else {
            return Err(Error::Invalid(format!("{shown}: an index inside an index")));
        };
        let config_bytes = registry.blob_bytes(&manifest.config, MAX_CONFIG).await?;
        let config = ImageConfig::parse(&config_bytes)?;
        let id = manifest.config.digest.clone();
        if let Some(existing) = self.load(id.hex(), &self.names()) {
            progress(Progress::Cached);
            self.name(&shown, &id)?;
            return Ok(self.load(id.hex(), &self.names()).unwrap_or(existing));
        }
        check_layers(&config, manifest.layers.len())?;
        let chains = chain_ids(&config.rootfs.diff_ids);
        let have = self.chains_here(&chains);
        let total: u64 = manifest.layers[have..].iter().map(|l| l.size).sum();
        progress(Progress::Resolved {
            layers: manifest.layers.len(),
            bytes: total,
        });
        for index in 0..have {
            progress(Progress::Shared { index });
        }
        let work = self.scratch()?;
        let blob_of = |index: usize| work.path().join(format!("layer-{index}"));
        // The layers are fetched first, holding nothing: a prune does not wait for a
        // download, only for the unpacking below.
        for (index, layer) in manifest.layers.iter().enumerate().skip(have) {
            registry
                .blob_to_file(layer, &blob_of(index), &mut |done| {
                    progress(Progress::Layer {
                        index,
                        done,
                        size: layer.size,
                    })
                })
                .await?;
        }
        let held = self.hold_chains()?;
        // Layers removed since they were found here are fetched now.
        let have_now = self.chains_here(&chains).min(have);
        for (index, layer) in manifest.layers.iter().enumerate().take(have).skip(have_now) {
            registry
                .blob_to_file(layer, &blob_of(index), &mut |_| {})
                .await?;
        }
        let mut used = 0u64;
        let budget = self.cap_bytes.saturating_sub(self.used_bytes());
        for index in have_now..manifest.layers.len() {
            let store = self.clone();
            let (diff_id, chains) = (config.rootfs.diff_ids[index].clone(), chains.clone());
            let blob_path = blob_of(index);
            let (stats, u) = tokio::task::spawn_blocking(move || {
                let file = std::fs::File::open(&blob_path)
                    .map_err(Error::io(format!("Cannot open {}", blob_path.display())))?;
                let made =
                    store.apply_chain(&chains, index, Box::new(file), &diff_id, budget, used);
                let _ = std::fs::remove_file(&blob_path);
                made
            })
            .await
            .map_err(|e| Error::Io {
                what: "The unpacking task failed".into(),
                source: std::io::Error::other(e),
            })??;
            used = u;
            progress(Progress::Unpacked { index, stats });
        }
        let image = self.commit(
            work,
            &id,
            &config_bytes,
            Some(manifest_digest),
            chains,
            format!("pull {shown}"),
        )?;
        drop(held);
        self.name(&shown, &id)?;
        Ok(self.load(id.hex(), &self.names()).unwrap_or(image))
    }

    /// Imports every image of a docker-archive or OCI layout (a directory, or a tar of
    /// one), naming each as the archive does and by `extra_names` too. Blocking.
    pub fn import(
        &self,
        path: &Path,
        extra_names: &[String],
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<StoredImage>, Error> {
        for n in extra_names {
            Reference::parse(n)?;
        }
        let budget = self.cap_bytes.saturating_sub(self.used_bytes());
        let archive = Archive::open(path, &self.root.join("tmp"), budget)?;
        let images = archive.images()?;
        if images.is_empty() {
            return Err(Error::Invalid("the archive holds no image".into()));
        }
        let mut out = Vec::new();
        for image in images {
            let id = Digest::of(&image.config_bytes);
            let names: Vec<String> = image
                .names
                .iter()
                .chain(extra_names)
                .filter_map(|n| Reference::parse(n).ok().map(|r| r.to_string()))
                .collect();
            if self.load(id.hex(), &self.names()).is_none() {
                check_layers(&image.config, image.layers.len())?;
                let held = self.hold_chains()?;
                let chains = chain_ids(&image.config.rootfs.diff_ids);
                let have = self.chains_here(&chains);
                progress(Progress::Resolved {
                    layers: image.layers.len(),
                    bytes: 0,
                });
                for index in 0..have {
                    progress(Progress::Shared { index });
                }
                let work = self.scratch()?;
                let mut used = 0u64;
                for (index, layer) in image.layers.iter().enumerate().skip(have) {
                    let diff_id = &image.config.rootfs.diff_ids[index];
                    let (stats, u) =
                        self.apply_chain(&chains, index, layer.open()?, diff_id, budget, used)?;
                    used = u;
                    progress(Progress::Unpacked { index, stats });
                }
                self.commit(
                    work,
                    &id,
                    &image.config_bytes,
                    None,
                    chains,
                    format!("import {}", path.display()),
                )?;
                drop(held);
            } else {
                progress(Progress::Cached);
            }
            for n in &names {
                self.name(n, &id)?;
            }
            out.extend(self.load(id.hex(), &self.names()));
        }
        Ok(out)
    }

    pub(crate) fn scratch(&self) -> Result<tempfile::TempDir, Error> {
        tempfile::Builder::new()
            .prefix(&scratch_prefix())
            .tempdir_in(self.root.join("tmp"))
            .map_err(Error::io("Cannot make a scratch directory"))
    }

    /// How many of the first of `chains` are here already.
    fn chains_here(&self, chains: &[Digest]) -> usize {
        (0..chains.len())
            .rev()
            .find(|&i| self.chain(&chains[i]).is_some())
            .map_or(0, |i| i + 1)
    }

    /// Makes chain `chains[index]` from the one below and layer `stored` (checked against
    /// `diff_id`). Returns the layer's stats and the new running total of bytes written.
    fn apply_chain(
        &self,
        chains: &[Digest],
        index: usize,
        stored: Box<dyn Read + Send>,
        diff_id: &Digest,
        budget: u64,
        used: u64,
    ) -> Result<(unpack::Stats, u64), Error> {
        let base = match index.checked_sub(1) {
            Some(below) => Base::Chain(&chains[below]),
            None => Base::Empty,
        };
        let mut out = (unpack::Stats::default(), used);
        self.make_chain(&chains[index], base, Some(diff_id), |root| {
            out = apply_checked(root, stored, diff_id, budget, used)?;
            Ok(out.1 - used)
        })?;
        Ok(out)
    }

    /// Moves a complete image into place (unless a concurrent pull did first); its files
    /// are those of the chains, already in place.
    pub(crate) fn commit(
        &self,
        work: tempfile::TempDir,
        id: &Digest,
        config_bytes: &[u8],
        manifest: Option<Digest>,
        chain: Vec<Digest>,
        source: String,
    ) -> Result<StoredImage, Error> {
        // An image of no layers has an empty root of its own; the others' `rootfs` is a link
        // to their top layer's files (what a sandbox's launch finds in the image directory).
        let size_bytes = match chain.last() {
            Some(top) => {
                let bytes = self
                    .chain(top)
                    .ok_or_else(|| Error::Invalid(format!("layer chain {top} is gone")))?
                    .tree_bytes;
                std::os::unix::fs::symlink(
                    format!("../../layers/{}/rootfs", top.hex()),
                    work.path().join("rootfs"),
                )
                .map_err(Error::io("Cannot link the image's root"))?;
                bytes
            }
            None => {
                std::fs::create_dir(work.path().join("rootfs"))
                    .map_err(Error::io("Cannot make the image's root"))?;
                0
            }
        };
        let dir = self.image_dir(id);
        let image = StoredImage {
            id: id.clone(),
            names: Vec::new(),
            manifest,
            size_bytes,
            created_ms: now_ms(),
            source,
            rootfs: self.files_of(&dir, &chain),
            chain,
            dir,
        };
        let write = |name: &str, bytes: &[u8]| {
            std::fs::write(work.path().join(name), bytes)
                .map_err(Error::io(format!("Cannot write {name}")))
        };
        write("config.json", config_bytes)?;
        write(
            "image.json",
            &serde_json::to_vec_pretty(&image).map_err(|e| Error::Io {
                what: "Cannot write image.json".into(),
                source: e.into(),
            })?,
        )?;
        let work = work.keep();
        if std::fs::rename(&work, &image.dir).is_err() {
            // Another pull of the same image finished first: keep its copy.
            let _ = remove_tree(&work);
            if !image.dir.join("image.json").is_file() {
                return Err(Error::Io {
                    what: format!("Cannot move the image into {}", image.dir.display()),
                    source: std::io::Error::other("rename failed"),
                });
            }
        }
        Ok(image)
    }
}

/// `name`'s canonical form, when it is one of `names`.
fn by_name(names: &BTreeMap<String, String>, name: &str) -> Option<String> {
    Reference::parse(name)
        .ok()
        .map(|r| r.to_string())
        .filter(|n| names.contains_key(n))
}

/// `names` without what removing `name` takes from `image`: that name, or (`name` being the
/// image's id) all of its names.
fn names_after_removal(
    names: &BTreeMap<String, String>,
    name: &str,
    image: &StoredImage,
) -> BTreeMap<String, String> {
    let mut after = names.clone();
    match by_name(names, name) {
        Some(n) => {
            after.remove(&n);
        }
        None => after.retain(|_, h| h != image.id.hex()),
    }
    after
}

/// Every layer has its diff id, as the config promises.
fn check_layers(config: &ImageConfig, layers: usize) -> Result<(), Error> {
    if config.rootfs.diff_ids.len() != layers {
        return Err(Error::Invalid(format!(
            "the manifest has {layers} layers, the config names {} diff ids",
            config.rootfs.diff_ids.len()
        )));
    }
    Ok(())
}

/// Decompresses and applies one layer, checking the tar against the config's diff id
/// (after it is applied: a layer that does not match fails the whole image, whose scratch
/// directory is then removed). Returns the stats and the new running total.
fn apply_checked(
    root: &Path,
    stored: Box<dyn Read + Send>,
    diff_id: &Digest,
    budget: u64,
    mut used: u64,
) -> Result<(unpack::Stats, u64), Error> {
    let tar = unpack::decompressed(BufReader::with_capacity(1 << 20, stored))
        .map_err(|e| Error::Invalid(format!("layer {diff_id}: {e}")))?;
    let mut hashing = Verified::new(tar, diff_id.clone(), None);
    let limits = unpack::Limits {
        max_bytes: budget,
        max_entries: 4_000_000,
    };
    let stats = unpack::apply(root, &mut hashing, &limits, &mut used)?;
    // The tar's end marks may leave bytes unread; the digest covers them too.
    std::io::copy(&mut hashing, &mut std::io::sink())
        .map_err(|e| Error::Invalid(format!("layer {diff_id} against its diff id: {e}")))?;
    Ok((stats, used))
}

/// The start of a scratch entry's name: this process's id (see [`Store::open`]).
pub fn scratch_prefix() -> String {
    format!("{}.", std::process::id())
}

/// Removes trees already out of the store's view (renamed into `tmp/`) on a thread of their
/// own, so that a removal answers at once (a large image's files take seconds on a busy
/// disk). What a crash leaves of them is scratch of a process gone: the next [`Store::open`]
/// removes it.
pub(crate) fn remove_in_background(trees: Vec<PathBuf>) {
    if trees.is_empty() {
        return;
    }
    let spawned = std::thread::Builder::new().name("image-rm".into()).spawn({
        let trees = trees.clone();
        move || {
            for t in &trees {
                let _ = remove_tree(t);
            }
        }
    });
    if spawned.is_err() {
        for t in &trees {
            let _ = remove_tree(t);
        }
    }
}

/// Removes a tree the store made (never following a link out of it).
fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    /// A layer tar of `files` (name, text).
    fn layer(files: &[(&str, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, text) in files {
            let mut h = tar::Header::new_ustar();
            h.set_size(text.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, name, text.as_bytes()).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// A docker-archive directory of one image `tag` with `layers`.
    fn archive(dir: &Path, tag: &str, layers: &[Vec<u8>]) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let mut names = Vec::new();
        let mut diff_ids = Vec::new();
        for (i, l) in layers.iter().enumerate() {
            let name = format!("l{i}.tar");
            std::fs::write(dir.join(&name), l).unwrap();
            names.push(name);
            diff_ids.push(Digest::of(l).to_string());
        }
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux", "config": {},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let manifest =
            serde_json::json!([{"Config": "config.json", "RepoTags": [tag], "Layers": names}]);
        std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
        dir.to_owned()
    }

    #[test]
    fn images_share_their_first_layers_and_the_last_one_takes_them() {
        let work = tempfile::tempdir().unwrap();
        let store = Store::open(&work.path().join("store"), 1 << 30).unwrap();
        let base = layer(&[("hello", "hello\n")]);
        let a = archive(
            &work.path().join("a"),
            "localhost/a:1",
            &[base.clone(), layer(&[("a", "aaaa")])],
        );
        let b = archive(
            &work.path().join("b"),
            "localhost/b:1",
            &[base, layer(&[("b", "bbbbbbbb")])],
        );
        let mut steps = Vec::new();
        let ia = store
            .import(&a, &[], &mut |p| steps.push(p))
            .unwrap()
            .remove(0);
        assert!(!steps.contains(&Progress::Shared { index: 0 }));
        steps.clear();
        let ib = store
            .import(&b, &[], &mut |p| steps.push(p))
            .unwrap()
            .remove(0);
        assert!(steps.contains(&Progress::Shared { index: 0 }), "{steps:?}");
        assert_eq!((ia.size_bytes, ib.size_bytes), (10, 14));
        let ino = |i: &StoredImage| std::fs::metadata(i.rootfs().join("hello")).unwrap().ino();
        assert_eq!(ino(&ia), ino(&ib), "one copy of the shared layer's file");
        assert_eq!(
            std::fs::read_to_string(ia.dir.join("rootfs/a")).unwrap(),
            "aaaa",
            "the image directory's rootfs is its files"
        );
        let all = store.list();
        assert_eq!(store.shared_bytes(&ia, &all), 6);
        assert_eq!(store.shared_bytes(&ib, &all), 6);
        // Each layer counted once: 6 + 4 + 8.
        assert_eq!(store.used_bytes(), 18);

        // Exported and imported into another store: the same files, and its name.
        let out = work.path().join("b-export.tar");
        store
            .export("localhost/b:1", std::fs::File::create(&out).unwrap())
            .unwrap();
        let other = Store::open(&work.path().join("other"), 1 << 30).unwrap();
        let back = other.import(&out, &[], &mut |_| {}).unwrap().remove(0);
        assert_eq!(back.names, ["localhost/b:1"]);
        for (f, text) in [("hello", "hello\n"), ("b", "bbbbbbbb")] {
            assert_eq!(
                std::fs::read_to_string(back.rootfs().join(f)).unwrap(),
                text
            );
        }
        assert!(!back.rootfs().join("a").exists());

        store.remove("localhost/a:1").unwrap();
        assert_eq!(
            std::fs::read_to_string(ib.rootfs().join("hello")).unwrap(),
            "hello\n"
        );
        assert!(!ia.rootfs().exists(), "the layer only it had went with it");
        assert_eq!(store.used_bytes(), 14);
        assert_eq!(store.shared_bytes(&ib, &store.list()), 0);
        store.remove("localhost/b:1").unwrap();
        assert_eq!(store.used_bytes(), 0);
        assert_eq!(
            std::fs::read_dir(work.path().join("store/layers"))
                .unwrap()
                .count(),
            0
        );
    }
}
