//! Layers shared by digest: the files of every prefix of an image's layers, kept once.
//!
//! ```text
//! <root>/layers/<chain hex>/rootfs      the files after the layers of the chain
//!                          layer.json   what the store knows of it (`ChainInfo`)
//! <root>/layers.lock                    flock: shared by pulls, imports and builds; taken
//!                                       exclusively to collect unused chains
//! ```
//!
//! A chain is named by its OCI chain id: the first layer's diff id, then
//! `sha256(parent chain + " " + diff id)` for each layer on top. Its tree is the parent's
//! made anew with every file hard-linked ([`crate::build::tree::link_copy`]) and the layer
//! applied on top (which unlinks what it replaces, never writing through a link), so two
//! images that share their first layers share those layers' files and a pull fetches only
//! the layers it does not have. A tree that starts from a directory out of the store
//! (one of Belljar's own images a Dockerfile builds on, or an image stored whole before
//! layers were shared) is a chain too, named after what it starts from.
//!
//! A chain is made in a scratch directory and renamed into place complete, so its presence
//! means it is whole. Chains nothing names are collected when an image goes, unless a pull,
//! import or build (of any daemon sharing the store) is unpacking then; `prune` waits for
//! those and collects them too.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::store::Store;
use crate::{Digest, Error};

/// What the store knows of one chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainInfo {
    /// The chain below, when the tree was made from one.
    #[serde(default)]
    pub parent: Option<Digest>,
    /// The layer applied on top, when there was one.
    #[serde(default)]
    pub diff_id: Option<Digest>,
    /// Bytes of file data the layer wrote: what this chain adds to the store.
    pub layer_bytes: u64,
    /// Bytes of file data the whole tree holds.
    pub tree_bytes: u64,
    /// Bytes of the tree linked from a directory out of the store (counted there).
    #[serde(default)]
    pub outside_bytes: u64,
}

/// The OCI chain ids of layers with `diff_ids`, bottom first.
pub fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut out: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for d in diff_ids {
        out.push(match out.last() {
            None => d.clone(),
            Some(parent) => child_chain(parent, d),
        });
    }
    out
}

/// The chain of layer `diff_id` on top of `parent`.
pub fn child_chain(parent: &Digest, diff_id: &Digest) -> Digest {
    Digest::of(format!("{parent} {diff_id}").as_bytes())
}

/// The chain of a tree made from the directory `key` names (an image out of the store).
pub fn tree_chain(key: &str) -> Digest {
    Digest::of(format!("tree {key}").as_bytes())
}

/// A hold on the store's chains: none is collected while it lives.
pub struct ChainsHeld(#[expect(dead_code, reason = "held for its lock")] OwnedFd);

/// What a new chain starts from.
pub enum Base<'a> {
    /// Nothing: the first layer.
    Empty,
    /// A chain in the store.
    Chain(&'a Digest),
    /// A directory out of the store, whose files are counted where they are.
    Outside(&'a Path),
}

impl Store {
    fn layers_dir(&self) -> PathBuf {
        self.root.join("layers")
    }

    /// The root filesystem of chain `chain`.
    pub fn chain_rootfs(&self, chain: &Digest) -> PathBuf {
        self.layers_dir().join(chain.hex()).join("rootfs")
    }

    /// Chain `chain`'s record, when it is here (whole).
    pub fn chain(&self, chain: &Digest) -> Option<ChainInfo> {
        let bytes = std::fs::read(self.layers_dir().join(chain.hex()).join("layer.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Holds the chains against collection (shared with every other holder) until dropped.
    pub fn hold_chains(&self) -> Result<ChainsHeld, Error> {
        let fd = self.chains_lock_file()?;
        rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockShared)
            .map_err(|e| Error::io("Cannot lock the layer store")(e.into()))?;
        Ok(ChainsHeld(fd))
    }

    fn chains_lock_file(&self) -> Result<OwnedFd, Error> {
        std::fs::create_dir_all(self.layers_dir())
            .map_err(Error::io("Cannot make the layer store"))?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.root.join("layers.lock"))
            .map_err(Error::io("Cannot open the layer store's lock"))?;
        Ok(file.into())
    }

    /// Makes chain `chain` from `base` with `apply` (which writes the layer into the tree
    /// and returns the bytes it wrote), unless it is here already. Blocking; the caller holds
    /// the chains ([`Store::hold_chains`]).
    pub fn make_chain(
        &self,
        chain: &Digest,
        base: Base<'_>,
        diff_id: Option<&Digest>,
        apply: impl FnOnce(&Path) -> Result<u64, Error>,
    ) -> Result<ChainInfo, Error> {
        if let Some(info) = self.chain(chain) {
            return Ok(info);
        }
        let work = self.scratch()?;
        let rootfs = work.path().join("rootfs");
        let (parent, linked, outside) = match base {
            Base::Empty => {
                std::fs::create_dir(&rootfs).map_err(Error::io("Cannot make a layer's root"))?;
                (None, 0, 0)
            }
            Base::Chain(p) => {
                let info = self
                    .chain(p)
                    .ok_or_else(|| Error::Invalid(format!("layer chain {p} is gone")))?;
                let linked = crate::build::tree::link_copy(&self.chain_rootfs(p), &rootfs)?;
                (Some(p.clone()), linked, info.outside_bytes)
            }
            Base::Outside(dir) => {
                let linked = crate::build::tree::link_copy(dir, &rootfs)?;
                (None, linked, linked)
            }
        };
        let written = apply(&rootfs)?;
        let info = ChainInfo {
            parent,
            diff_id: diff_id.cloned(),
            layer_bytes: written,
            tree_bytes: linked + written,
            outside_bytes: outside,
        };
        let json = serde_json::to_vec_pretty(&info).map_err(|e| Error::Io {
            what: "Cannot write layer.json".into(),
            source: e.into(),
        })?;
        std::fs::write(work.path().join("layer.json"), json)
            .map_err(Error::io("Cannot write layer.json"))?;
        let dest = self.layers_dir().join(chain.hex());
        let work = work.keep();
        if std::fs::rename(&work, &dest).is_err() {
            // Made by a concurrent pull first: keep that one.
            let _ = std::fs::remove_dir_all(&work);
            return self.chain(chain).ok_or_else(|| Error::Io {
                what: format!("Cannot move a layer into {}", dest.display()),
                source: std::io::Error::other("rename failed"),
            });
        }
        Ok(info)
    }

    /// Bytes of file data the chains hold (what they add, each counted once).
    pub(crate) fn chain_bytes(&self) -> u64 {
        self.chain_hexes()
            .iter()
            .filter_map(|h| Digest::parse(&format!("sha256:{h}")).ok())
            .filter_map(|c| self.chain(&c))
            .map(|i| i.layer_bytes)
            .sum()
    }

    fn chain_hexes(&self) -> Vec<String> {
        std::fs::read_dir(self.layers_dir())
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| Digest::parse(&format!("sha256:{n}")).is_ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Removes the chains no image names, unless a pull, import or build holds them now
    /// (or, with `wait`, once none does: those hold them only while they unpack, not while
    /// they download). Returns the bytes of layer data removed. The files go on a thread of
    /// their own.
    pub fn collect_chains(&self, wait: bool) -> Result<u64, Error> {
        let fd = self.chains_lock_file()?;
        let op = if wait {
            rustix::fs::FlockOperation::LockExclusive
        } else {
            rustix::fs::FlockOperation::NonBlockingLockExclusive
        };
        if let Err(e) = rustix::fs::flock(&fd, op) {
            if wait {
                return Err(Error::io("Cannot lock the layer store")(e.into()));
            }
            return Ok(0);
        }
        let named: HashSet<String> = self
            .list()
            .iter()
            .flat_map(|i| i.chain.iter().map(|c| c.hex().to_owned()))
            .collect();
        let mut freed = 0;
        let mut trash = Vec::new();
        for hex in self.chain_hexes() {
            if named.contains(&hex) {
                continue;
            }
            let dir = self.layers_dir().join(&hex);
            let bytes = Digest::parse(&format!("sha256:{hex}"))
                .ok()
                .and_then(|c| self.chain(&c))
                .map_or(0, |i| i.layer_bytes);
            let to = self
                .root
                .join("tmp")
                .join(format!("{}layer-{hex}", crate::store::scratch_prefix()));
            if std::fs::rename(&dir, &to).is_ok() {
                freed += bytes;
                trash.push(to);
            }
        }
        drop(fd);
        crate::store::remove_in_background(trash);
        Ok(freed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_ids_are_the_oci_ones() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        let ids = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(ids[0], a);
        assert_eq!(ids[1], Digest::of(format!("{a} {b}").as_bytes()));
        assert_ne!(chain_ids(&[b, a])[1], ids[1]);
    }

    #[test]
    fn a_chain_shares_its_parents_files_and_is_collected_when_unnamed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1 << 30).unwrap();
        let held = store.hold_chains().unwrap();
        let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
        let ca = store
            .make_chain(&a, Base::Empty, Some(&a), |root| {
                std::fs::write(root.join("f"), "12345").unwrap();
                Ok(5)
            })
            .unwrap();
        assert_eq!((ca.layer_bytes, ca.tree_bytes), (5, 5));
        let cb_id = child_chain(&a, &b);
        let cb = store
            .make_chain(&cb_id, Base::Chain(&a), Some(&b), |root| {
                std::fs::write(root.join("g"), "67").unwrap();
                Ok(2)
            })
            .unwrap();
        assert_eq!((cb.layer_bytes, cb.tree_bytes), (2, 7));
        use std::os::unix::fs::MetadataExt;
        let f = std::fs::metadata(store.chain_rootfs(&cb_id).join("f")).unwrap();
        assert_eq!(f.nlink(), 2, "the parent's file is linked, not copied");
        // Made again: the one here is taken, `apply` not run.
        store
            .make_chain(&cb_id, Base::Chain(&a), Some(&b), |_| panic!("made twice"))
            .unwrap();
        assert_eq!(store.chain_bytes(), 7);
        // Held by a pull under way: nothing is collected.
        assert_eq!(store.collect_chains(false).unwrap(), 0);
        assert!(store.chain(&a).is_some());
        drop(held);
        assert_eq!(store.collect_chains(true).unwrap(), 7);
        assert!(store.chain(&a).is_none() && store.chain(&cb_id).is_none());
    }
}
