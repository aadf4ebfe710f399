//! Images in files: `docker save` / `podman save` archives (docker-archive: a `manifest.json`
//! listing each image's config, tags and layer tars) and OCI image layouts (`oci-layout`,
//! `index.json`, `blobs/`), as a directory or a tar of one.
//!
//! An archive is hostile input like a registry: a tar is opened into a scratch directory
//! (regular files, directories and links only, never outside it), every file it names is
//! looked up inside that directory, and every blob with a digest is verified when read.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use crate::digest::Verified;
use crate::spec::{self, Document, ImageConfig, MAX_CONFIG, MAX_MANIFEST};
use crate::{Digest, Error};

/// An opened archive: its directory (the caller's, or a scratch copy of a tar's).
pub struct Archive {
    root: PathBuf,
    _scratch: Option<tempfile::TempDir>,
}

/// One image an archive holds.
pub struct ArchiveImage {
    /// The names it is known by (`RepoTags`, or the layout's `ref.name` annotations).
    pub names: Vec<String>,
    pub config_bytes: Vec<u8>,
    pub config: ImageConfig,
    pub layers: Vec<ArchiveLayer>,
}

/// A layer file and how to check it: by its blob digest and size (OCI layouts), or only by
/// the config's diff id once decompressed (docker-archive's plain tars).
pub struct ArchiveLayer {
    pub path: PathBuf,
    pub blob: Option<(Digest, u64)>,
}

impl ArchiveLayer {
    /// The layer's bytes as stored (possibly compressed), verified against its blob digest
    /// where it has one.
    pub fn open(&self) -> Result<Box<dyn Read + Send>, Error> {
        let file = File::open(&self.path)
            .map_err(Error::io(format!("Cannot open {}", self.path.display())))?;
        let file = BufReader::with_capacity(1 << 20, file);
        Ok(match &self.blob {
            Some((d, size)) => Box::new(Verified::new(file, d.clone(), Some(*size))),
            None => Box::new(file),
        })
    }
}

impl Archive {
    /// Opens `path`: a directory as it is, a tar file unpacked into a scratch directory made
    /// under `scratch_in`, holding at most `max_bytes`.
    pub fn open(path: &Path, scratch_in: &Path, max_bytes: u64) -> Result<Self, Error> {
        let meta = std::fs::metadata(path)
            .map_err(Error::io(format!("Cannot read {}", path.display())))?;
        if meta.is_dir() {
            return Ok(Self {
                root: path
                    .canonicalize()
                    .map_err(Error::io(format!("Cannot read {}", path.display())))?,
                _scratch: None,
            });
        }
        let scratch = tempfile::Builder::new()
            .prefix(&crate::store::scratch_prefix())
            .tempdir_in(scratch_in)
            .map_err(Error::io("Cannot make a scratch directory"))?;
        let file =
            File::open(path).map_err(Error::io(format!("Cannot open {}", path.display())))?;
        unpack_plain(BufReader::new(file), scratch.path(), max_bytes)?;
        Ok(Self {
            root: scratch
                .path()
                .canonicalize()
                .map_err(Error::io("Cannot read the scratch directory"))?,
            _scratch: Some(scratch),
        })
    }

    /// A file the archive names, inside it (through links too, but never out of it).
    fn file(&self, name: &str) -> Result<PathBuf, Error> {
        let rel = Path::new(name);
        if rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(Error::Invalid(format!(
                "the archive names the file {name:?}"
            )));
        }
        let path = self.root.join(rel);
        let real = path
            .canonicalize()
            .map_err(|_| Error::Invalid(format!("the archive has no file {name:?}")))?;
        if !real.starts_with(&self.root) || !real.is_file() {
            return Err(Error::Invalid(format!(
                "the archive's {name:?} is not a file inside it"
            )));
        }
        Ok(real)
    }

    fn read_small(&self, name: &str, max: u64) -> Result<Vec<u8>, Error> {
        let path = self.file(name)?;
        let mut bytes = Vec::new();
        File::open(&path)
            .and_then(|f| f.take(max + 1).read_to_end(&mut bytes))
            .map_err(Error::io(format!("Cannot read {}", path.display())))?;
        if bytes.len() as u64 > max {
            return Err(Error::Invalid(format!("{name} is larger than {max} bytes")));
        }
        Ok(bytes)
    }

    fn blob(&self, d: &Digest, max: u64) -> Result<Vec<u8>, Error> {
        let bytes = self.read_small(&format!("blobs/sha256/{}", d.hex()), max)?;
        if Digest::of(&bytes) != *d {
            return Err(Error::Invalid(format!(
                "blob {d} does not match its digest"
            )));
        }
        Ok(bytes)
    }

    /// Every image in the archive.
    pub fn images(&self) -> Result<Vec<ArchiveImage>, Error> {
        if self.root.join("index.json").is_file() {
            self.oci_images()
        } else if self.root.join("manifest.json").is_file() {
            self.docker_images()
        } else {
            Err(Error::Invalid(
                "not an image archive: it has neither index.json (OCI layout) nor manifest.json (docker-archive)"
                    .into(),
            ))
        }
    }

    fn docker_images(&self) -> Result<Vec<ArchiveImage>, Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Entry {
            config: String,
            #[serde(default)]
            repo_tags: Option<Vec<String>>,
            layers: Vec<String>,
        }
        let bytes = self.read_small("manifest.json", MAX_MANIFEST)?;
        let entries: Vec<Entry> = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Invalid(format!("manifest.json: {e}")))?;
        entries
            .into_iter()
            .map(|e| {
                let config_bytes = self.read_small(&e.config, MAX_CONFIG)?;
                let config = ImageConfig::parse(&config_bytes)?;
                if e.layers.len() > spec::MAX_LAYERS {
                    return Err(Error::Invalid(format!(
                        "an image of {} layers",
                        e.layers.len()
                    )));
                }
                let layers = e
                    .layers
                    .iter()
                    .map(|l| {
                        Ok(ArchiveLayer {
                            path: self.file(l)?,
                            blob: None,
                        })
                    })
                    .collect::<Result<Vec<_>, Error>>()?;
                Ok(ArchiveImage {
                    names: e.repo_tags.unwrap_or_default(),
                    config_bytes,
                    config,
                    layers,
                })
            })
            .collect()
    }

    fn oci_images(&self) -> Result<Vec<ArchiveImage>, Error> {
        let bytes = self.read_small("index.json", MAX_MANIFEST)?;
        let Document::Index(index) = spec::parse_document(spec::OCI_INDEX, &bytes)? else {
            return Err(Error::Invalid("index.json is not an index".into()));
        };
        let mut out = Vec::new();
        for desc in &index.manifests {
            // containerd's annotation is the full name, beside which `ref.name` is only the
            // tag; without it, `ref.name` is what the layout names the image.
            let names: Vec<String> = [
                "io.containerd.image.name",
                "org.opencontainers.image.ref.name",
            ]
            .iter()
            .find_map(|k| desc.annotations.get(*k).cloned())
            .into_iter()
            .collect();
            let mut doc =
                spec::parse_document(&desc.media_type, &self.blob(&desc.digest, MAX_MANIFEST)?)?;
            if let Document::Index(inner) = &doc {
                let chosen = spec::choose_platform(inner, "the archive's image")?;
                doc = spec::parse_document(
                    &chosen.media_type,
                    &self.blob(&chosen.digest, MAX_MANIFEST)?,
                )?;
            }
            let Document::Manifest(m) = doc else {
                return Err(Error::Invalid(
                    "an index inside an index inside an index".into(),
                ));
            };
            let config_bytes = self.blob(&m.config.digest, MAX_CONFIG)?;
            let config = ImageConfig::parse(&config_bytes)?;
            let layers = m
                .layers
                .iter()
                .map(|l| {
                    Ok(ArchiveLayer {
                        path: self.file(&format!("blobs/sha256/{}", l.digest.hex()))?,
                        blob: Some((l.digest.clone(), l.size)),
                    })
                })
                .collect::<Result<Vec<_>, Error>>()?;
            out.push(ArchiveImage {
                names,
                config_bytes,
                config,
                layers,
            });
        }
        Ok(out)
    }
}

/// Unpacks an archive tar's files, directories and symbolic links into `dest`; anything
/// else, or a name out of `dest`, is refused. At most `max_bytes` of file data.
fn unpack_plain(reader: impl Read, dest: &Path, max_bytes: u64) -> Result<(), Error> {
    let mut tar = tar::Archive::new(reader);
    tar.set_preserve_ownerships(false);
    tar.set_preserve_permissions(false);
    tar.set_unpack_xattrs(false);
    let mut total = 0u64;
    let entries = tar
        .entries()
        .map_err(|e| Error::Invalid(format!("not a tar archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| Error::Invalid(format!("a broken tar archive: {e}")))?;
        let kind = entry.header().entry_type();
        let name = entry
            .path()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                total = total.saturating_add(entry.size());
                if total > max_bytes {
                    return Err(Error::TooLarge { limit: max_bytes });
                }
            }
            tar::EntryType::Directory | tar::EntryType::Symlink => {}
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => continue,
            other => {
                return Err(Error::Invalid(format!(
                    "the archive's {name:?} is a {other:?}, not a file, directory or link"
                )));
            }
        }
        let inside = entry
            .unpack_in(dest)
            .map_err(Error::io(format!("Cannot unpack the archive's {name:?}")))?;
        if !inside {
            return Err(Error::Invalid(format!(
                "the archive's {name:?} is outside it"
            )));
        }
    }
    Ok(())
}
