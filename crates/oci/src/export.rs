//! Images out of the store: an OCI image layout as one tar (`oci-archive`), with Docker's
//! `manifest.json` beside `index.json`, so that `podman load`, `docker load`, `skopeo` and
//! Belljar's own import all read it.
//!
//! The store keeps files, not the layer tars they came from: each layer is written again as
//! the difference between its chain's tree and the one below ([`layer_diff`]): the entries
//! whose inode the layer made (a tree shares the unchanged ones with its parent by hard
//! links), the directories it made or changed, and a whiteout for each name it removed. The
//! files are the same; the tars, and so the diff ids and the image id, are new ones.

use std::collections::HashMap;
use std::fs;
use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::build::Hashing;
use crate::build::tar_out::{Meta, TarOut, kept_xattrs};
use crate::store::{Store, StoredImage};
use crate::{Digest, Error};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

fn read_err(p: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |e| Error::Io {
        what: format!("Cannot read {}", p.display()),
        source: e,
    }
}

/// Writes the layer that makes `upper` of `lower` (of nothing: the whole tree) as a tar.
pub fn layer_diff<W: Write>(lower: Option<&Path>, upper: &Path, out: W) -> Result<W, Error> {
    let mut tar = TarOut::new(out);
    let mut links: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    // (the directory in upper, its counterpart in lower when that is a directory, its path)
    let mut stack: Vec<(PathBuf, Option<PathBuf>, Vec<u8>)> =
        vec![(upper.to_owned(), lower.map(Path::to_owned), Vec::new())];
    let write_err = |e: io::Error| Error::Io {
        what: "Cannot write the layer".into(),
        source: e,
    };
    while let Some((dir, below, rel)) = stack.pop() {
        let mut names: Vec<_> = fs::read_dir(&dir)
            .map_err(read_err(&dir))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(read_err(&dir))?;
        names.sort();
        if let Some(below) = &below {
            let mut gone: Vec<_> = fs::read_dir(below)
                .map_err(read_err(below))?
                .filter_map(|e| e.ok().map(|e| e.file_name()))
                .filter(|n| !names.contains(n))
                .collect();
            gone.sort();
            for n in gone {
                tar.whiteout(&rel, n.as_bytes()).map_err(write_err)?;
            }
        }
        let mut subdirs = Vec::new();
        for name in names {
            let p = dir.join(&name);
            let r = crate::build::copy::join(&rel, name.as_bytes());
            let m = fs::symlink_metadata(&p).map_err(read_err(&p))?;
            let old = below
                .as_ref()
                .and_then(|b| fs::symlink_metadata(b.join(&name)).ok());
            let ft = m.file_type();
            let meta = Meta::of(&m);
            if ft.is_dir() {
                let xattrs = kept_xattrs(&p);
                let old_dir = old.as_ref().filter(|o| o.is_dir());
                let same = old_dir.is_some_and(|o| {
                    Meta::of(o) == meta
                        && kept_xattrs(&below.as_ref().unwrap().join(&name)) == xattrs
                });
                if !same {
                    tar.dir(&r, &meta, &xattrs).map_err(write_err)?;
                }
                let under = old_dir.map(|_| below.as_ref().unwrap().join(&name));
                subdirs.push((p, under, r));
                continue;
            }
            // A tree shares what its layer left alone with the one below: the same inode.
            if old.is_some_and(|o| o.dev() == m.dev() && o.ino() == m.ino()) {
                continue;
            }
            // Devices, fifos and sockets: nothing a layer holds (the unpacker makes none).
            if ft.is_symlink() || ft.is_file() {
                tar.entry_of(&r, &p, &m, &mut links).map_err(read_err(&p))?;
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
    tar.finish().map_err(write_err)
}

/// A blob written into the scratch directory, with its digest and size.
struct Blob {
    path: PathBuf,
    digest: Digest,
    size: u64,
}

fn descriptor(media_type: &str, b: &Blob) -> serde_json::Value {
    serde_json::json!({"mediaType": media_type, "digest": b.digest.as_str(), "size": b.size})
}

impl Store {
    /// The trees each of `image`'s layers is the difference of: (below, tree), bottom first.
    fn layer_trees(&self, image: &StoredImage) -> Vec<(Option<PathBuf>, PathBuf)> {
        if image.chain.is_empty() {
            return vec![(None, image.rootfs())];
        }
        let mut out = Vec::new();
        let mut below: Option<PathBuf> = None;
        for c in &image.chain {
            let tree = self.chain_rootfs(c);
            // A chain made from a directory out of the store is a whole tree.
            let whole = self.chain(c).is_none_or(|i| i.parent.is_none());
            out.push((if whole { None } else { below.clone() }, tree.clone()));
            below = Some(tree);
        }
        out
    }

    /// Writes image `name` (a name or an id) as an OCI archive to `out`, named `name` when
    /// it is one (else by its names). Blocking.
    pub fn export(&self, name: &str, out: impl Write) -> Result<(), Error> {
        let image = self.get(name).ok_or_else(|| Error::NotFound {
            reference: name.to_owned(),
            detail: "no such image here".into(),
        })?;
        let _held = self.hold_chains()?;
        let work = self.scratch()?;
        let write_blob = |bytes: &[u8]| -> Result<Blob, Error> {
            let digest = Digest::of(bytes);
            let path = work.path().join(digest.hex());
            fs::write(&path, bytes).map_err(Error::io("Cannot write the archive"))?;
            Ok(Blob {
                path,
                digest,
                size: bytes.len() as u64,
            })
        };
        let mut layers = Vec::new();
        for (i, (below, tree)) in self.layer_trees(&image).iter().enumerate() {
            let path = work.path().join(format!("layer-{i}.tar"));
            let file = fs::File::create(&path).map_err(Error::io("Cannot write the archive"))?;
            let out = layer_diff(
                below.as_deref(),
                tree,
                Hashing::new(BufWriter::with_capacity(1 << 20, file)),
            )?;
            let (mut w, digest) = out.finish();
            w.flush().map_err(Error::io("Cannot write the archive"))?;
            let size = fs::metadata(&path)
                .map_err(Error::io("Cannot write the archive"))?
                .len();
            layers.push(Blob { path, digest, size });
        }
        // The configuration with the new layers' diff ids; its history kept only while it
        // still counts the same layers.
        let config_path = image.dir.join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_slice(&fs::read(&config_path).map_err(read_err(&config_path))?)
                .map_err(|e| Error::Invalid(format!("the image's config: {e}")))?;
        let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
        config["rootfs"] = serde_json::json!({"type": "layers", "diff_ids": diff_ids});
        let counted = config["history"].as_array().map(|h| {
            h.iter()
                .filter(|e| !e["empty_layer"].as_bool().unwrap_or(false))
                .count()
        });
        if counted.is_some_and(|n| n != layers.len())
            && let Some(o) = config.as_object_mut()
        {
            o.remove("history");
        }
        let config = write_blob(&serde_json::to_vec(&config).map_err(json_err)?)?;
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": descriptor(OCI_CONFIG, &config),
            "layers": layers.iter().map(|l| descriptor(OCI_LAYER, l)).collect::<Vec<_>>(),
        });
        let manifest = write_blob(&serde_json::to_vec(&manifest).map_err(json_err)?)?;
        let names: Vec<String> = match crate::Reference::parse(name) {
            Ok(r) if image.names.contains(&r.to_string()) => vec![r.to_string()],
            _ => image.names.clone(),
        };
        let mut desc = descriptor(OCI_MANIFEST, &manifest);
        if let Some(first) = names.first() {
            let tag = crate::Reference::parse(first)
                .ok()
                .and_then(|r| r.tag)
                .unwrap_or_else(|| "latest".into());
            desc["annotations"] = serde_json::json!({
                "io.containerd.image.name": first,
                "org.opencontainers.image.ref.name": tag,
            });
        }
        let index = serde_json::json!({
            "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [desc],
        });
        let docker = serde_json::json!([{
            "Config": format!("blobs/sha256/{}", config.digest.hex()),
            "RepoTags": names,
            "Layers": layers.iter().map(|l| format!("blobs/sha256/{}", l.digest.hex())).collect::<Vec<_>>(),
        }]);

        let mut tar = tar::Builder::new(out);
        let small = |tar: &mut tar::Builder<_>, path: &str, bytes: &[u8]| {
            let mut h = tar::Header::new_ustar();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut h, path, bytes)
        };
        let werr = |e: io::Error| Error::Io {
            what: "Cannot write the archive".into(),
            source: e,
        };
        small(&mut tar, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(werr)?;
        small(
            &mut tar,
            "index.json",
            &serde_json::to_vec(&index).map_err(json_err)?,
        )
        .map_err(werr)?;
        small(
            &mut tar,
            "manifest.json",
            &serde_json::to_vec(&docker).map_err(json_err)?,
        )
        .map_err(werr)?;
        for b in layers.iter().chain([&config, &manifest]) {
            let mut f = fs::File::open(&b.path).map_err(read_err(&b.path))?;
            let mut h = tar::Header::new_ustar();
            h.set_size(b.size);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut h, format!("blobs/sha256/{}", b.digest.hex()), &mut f)
                .map_err(werr)?;
        }
        tar.into_inner().and_then(|mut w| w.flush()).map_err(werr)
    }
}

fn json_err(e: serde_json::Error) -> Error {
    Error::Io {
        what: "Cannot write the archive".into(),
        source: e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_is_what_its_tree_changed() {
        let t = tempfile::tempdir().unwrap();
        let (low, up) = (t.path().join("low"), t.path().join("up"));
        fs::create_dir_all(low.join("etc/keep")).unwrap();
        fs::write(low.join("etc/same"), "s").unwrap();
        fs::write(low.join("etc/old"), "o").unwrap();
        fs::write(low.join("etc/changed"), "1").unwrap();
        crate::build::tree::link_copy(&low, &up).unwrap();
        fs::remove_file(up.join("etc/old")).unwrap();
        fs::remove_file(up.join("etc/changed")).unwrap();
        fs::write(up.join("etc/changed"), "2").unwrap();
        fs::write(up.join("new"), "n").unwrap();
        fs::hard_link(up.join("new"), up.join("twin")).unwrap();
        let tar = layer_diff(Some(&low), &up, Vec::new()).unwrap();
        let mut a = tar::Archive::new(&tar[..]);
        let names: Vec<String> = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            ["new", "twin", "etc/.wh.old", "etc/changed"],
            "{names:?}"
        );
        // Of nothing: everything.
        let whole = layer_diff(None, &up, Vec::new()).unwrap();
        let n = tar::Archive::new(&whole[..]).entries().unwrap().count();
        assert_eq!(n, 6, "etc/ new twin etc/changed etc/keep/ etc/same");
    }
}
