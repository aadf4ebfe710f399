//! What a Dockerfile build needs of the image store: each step's result is an image of the
//! store (unnamed until the build names it), its parent's layers with the step's on top
//! ([`crate::layers`]: a tree made by hard links, [`tree::link_copy`], and the layer applied by
//! the same unpacker as a pulled layer), so a build's files obey the same rules as a
//! registry's. A layer is written
//! once as a tar ([`tar_out`], [`copy`]), hashed on the way (its diff id), then applied.
//!
//! The step cache (`<store>/build-cache/<key>.json`) maps a step's key (its parent's key, its
//! instruction after substitution, and for `COPY`/`ADD` the digest of the files' layer) to
//! the state the step left: the image holding the files and the configuration so far.

pub mod copy;
pub mod tar_out;
pub mod tree;

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::layers::{Base, child_chain, tree_chain};
use crate::spec::ImageConfig;
use crate::store::{Store, StoredImage};
use crate::{Digest, Error, unpack};

/// Where a build's images came from, in `image.json` (an unnamed one is a step's).
pub const BUILD_SOURCE: &str = "build";

/// What a cached step left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedStep {
    /// The image whose root filesystem holds the files after the step: a store id (hex), or
    /// the name of one of Belljar's own images.
    pub files: String,
    /// The configuration after the step.
    pub config: ImageConfig,
}

/// A writer that hashes what passes through it.
pub struct Hashing<W> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Hashing<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            hash: Sha256::new(),
        }
    }

    pub fn finish(self) -> (W, Digest) {
        let d = Digest::parse(&format!("sha256:{}", hex::encode(self.hash.finalize())))
            .expect("a sha256 is a digest");
        (self.inner, d)
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The key of a step: its parent's key and what the step is.
pub fn step_key(parent: &str, instruction: &str, content: Option<&Digest>) -> String {
    let mut h = Sha256::new();
    h.update(parent.as_bytes());
    h.update([0]);
    h.update(instruction.as_bytes());
    h.update([0]);
    if let Some(d) = content {
        h.update(d.as_str().as_bytes());
    }
    hex::encode(h.finalize())
}

/// A layer tar being written into a scratch directory, with its diff id.
pub struct LayerFile {
    pub path: PathBuf,
    pub diff_id: Digest,
    _dir: tempfile::TempDir,
}

impl Store {
    /// A scratch directory on the store's filesystem, removed when dropped (or by the next
    /// daemon, should this one die first).
    pub fn build_scratch(&self) -> Result<tempfile::TempDir, Error> {
        self.scratch()
    }

    fn cache_path(&self, key: &str) -> PathBuf {
        self.root.join("build-cache").join(format!("{key}.json"))
    }

    /// The cached result of step `key`, when the image it names is still here (or is one of
    /// Belljar's own, which `own` says exists).
    pub fn cached_step(&self, key: &str, own: impl Fn(&str) -> bool) -> Option<CachedStep> {
        let bytes = std::fs::read(self.cache_path(key)).ok()?;
        let step: CachedStep = serde_json::from_slice(&bytes).ok()?;
        (own(&step.files) || self.get(&step.files).is_some()).then_some(step)
    }

    /// Forgets every cached step (their images are removed by the caller).
    pub fn clear_build_cache(&self) -> Result<(), Error> {
        match std::fs::remove_dir_all(self.root.join("build-cache")) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(Error::io("Cannot remove the build cache")(e))
            }
            _ => Ok(()),
        }
    }

    /// Records the result of step `key`.
    pub fn cache_step(&self, key: &str, step: &CachedStep) -> Result<(), Error> {
        let path = self.cache_path(key);
        let dir = self.root.join("build-cache");
        std::fs::create_dir_all(&dir).map_err(Error::io("Cannot make the build cache"))?;
        let tmp = dir.join(format!("{}{key}.tmp", crate::store::scratch_prefix()));
        let bytes = serde_json::to_vec_pretty(step).map_err(|e| Error::Io {
            what: "Cannot write the build cache".into(),
            source: e.into(),
        })?;
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(Error::io("Cannot write the build cache"))
    }

    /// Writes a layer tar with `write` into a scratch file, hashing it.
    pub fn write_layer(
        &self,
        write: impl FnOnce(
            Hashing<io::BufWriter<std::fs::File>>,
        ) -> Result<Hashing<io::BufWriter<std::fs::File>>, Error>,
    ) -> Result<LayerFile, Error> {
        let dir = self.scratch()?;
        let path = dir.path().join("layer.tar");
        let file = std::fs::File::create(&path).map_err(Error::io("Cannot write the layer"))?;
        let out = write(Hashing::new(io::BufWriter::with_capacity(1 << 20, file)))?;
        let (mut w, diff_id) = out.finish();
        w.flush().map_err(Error::io("Cannot write the layer"))?;
        Ok(LayerFile {
            path,
            diff_id,
            _dir: dir,
        })
    }

    /// The image of `config` whose files are `parent`'s with `layer` applied: made when it
    /// is not here yet, unnamed, and complete before it is visible. Its layers are
    /// `parent`'s and the new one on top, shared as every image's are ([`crate::layers`]):
    /// a step without a layer copies nothing.
    pub fn build_image(
        &self,
        parent: &Parent<'_>,
        layer: Option<&LayerFile>,
        config: &ImageConfig,
    ) -> Result<StoredImage, Error> {
        let config_bytes = serde_json::to_vec(config).map_err(|e| Error::Io {
            what: "Cannot write the image config".into(),
            source: e.into(),
        })?;
        let id = Digest::of(&config_bytes);
        if let Some(existing) = self.get(id.as_str()) {
            return Ok(existing);
        }
        let held = self.hold_chains()?;
        let mut chain = match parent {
            Parent::Stored(image) if !image.chain.is_empty() => image.chain.clone(),
            Parent::Stored(image) => {
                let c = tree_chain(&format!("image {}", image.id));
                self.make_chain(&c, Base::Outside(&image.rootfs()), None, |_| Ok(0))?;
                vec![c]
            }
            Parent::Outside { rootfs, key } => {
                let c = tree_chain(key);
                self.make_chain(&c, Base::Outside(rootfs), None, |_| Ok(0))?;
                vec![c]
            }
        };
        if let Some(layer) = layer {
            let below = chain.last().cloned().unwrap_or_else(|| tree_chain(""));
            let top = child_chain(&below, &layer.diff_id);
            let limits = unpack::Limits {
                max_bytes: self.cap_bytes.saturating_sub(self.used_bytes()),
                max_entries: 4_000_000,
            };
            self.make_chain(&top, Base::Chain(&below), Some(&layer.diff_id), |root| {
                let file =
                    std::fs::File::open(&layer.path).map_err(Error::io("Cannot read the layer"))?;
                let mut written = 0u64;
                unpack::apply(root, io::BufReader::new(file), &limits, &mut written)?;
                Ok(written)
            })?;
            chain.push(top);
        }
        let work = self.scratch()?;
        let image = self.commit(work, &id, &config_bytes, None, chain, BUILD_SOURCE.into())?;
        drop(held);
        Ok(image)
    }
}

/// What a build step's files start from.
pub enum Parent<'a> {
    /// An image of the store.
    Stored(&'a StoredImage),
    /// A root directory out of the store (one of Belljar's own images), and what names its
    /// files for good (its name and digest).
    Outside { rootfs: &'a Path, key: &'a str },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_chain_and_depend_on_content() {
        let a = step_key("p", "RUN true", None);
        assert_ne!(a, step_key("q", "RUN true", None));
        assert_ne!(a, step_key("p", "RUN false", None));
        let d = Digest::of(b"x");
        assert_ne!(
            step_key("p", "COPY a /", Some(&d)),
            step_key("p", "COPY a /", Some(&Digest::of(b"y")))
        );
    }
}
