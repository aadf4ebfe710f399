//! The documents of an image: OCI and Docker (schema 2) manifests and indexes, and the image
//! configuration. Only the fields Belljar uses are read; unknown ones are ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Digest, Error};

/// The largest manifest or index read (containerd's limit).
pub const MAX_MANIFEST: u64 = 4 << 20;
/// The largest image configuration read (its history can be long).
pub const MAX_CONFIG: u64 = 16 << 20;
/// The most layers an image may have (Docker's limit is 127 for overlay).
pub const MAX_LAYERS: usize = 256;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// What a registry is asked to answer a manifest request with.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// A reference to a blob by digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    fn label(&self) -> String {
        match &self.variant {
            Some(v) => format!("{}/{}/{v}", self.os, self.architecture),
            None => format!("{}/{}", self.os, self.architecture),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    #[serde(default)]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub manifests: Vec<Descriptor>,
}

/// A manifest document of either kind.
#[derive(Debug, Clone)]
pub enum Document {
    Index(Index),
    Manifest(Manifest),
}

/// Reads a manifest or index, its kind from `content_type` (a registry's `Content-Type`,
/// empty when unknown) or else from its own `mediaType` or shape.
pub fn parse_document(content_type: &str, bytes: &[u8]) -> Result<Document, Error> {
    let bad = |e: serde_json::Error| Error::Invalid(format!("manifest: {e}"));
    let mt = content_type.split(';').next().unwrap_or("").trim();
    let declared = match mt {
        OCI_INDEX | DOCKER_LIST => Some(true),
        OCI_MANIFEST | DOCKER_MANIFEST => Some(false),
        _ => None,
    };
    let is_index = match declared {
        Some(i) => i,
        None => {
            let v: serde_json::Value = serde_json::from_slice(bytes).map_err(bad)?;
            if v.get("schemaVersion").and_then(|s| s.as_u64()) == Some(1) {
                return Err(Error::Invalid(
                    "manifest schema 1 is not supported (push the image again with a current tool)"
                        .into(),
                ));
            }
            match v.get("mediaType").and_then(|m| m.as_str()) {
                Some(OCI_INDEX | DOCKER_LIST) => true,
                Some(OCI_MANIFEST | DOCKER_MANIFEST) => false,
                _ => v.get("manifests").is_some(),
            }
        }
    };
    if is_index {
        Ok(Document::Index(serde_json::from_slice(bytes).map_err(bad)?))
    } else {
        let m: Manifest = serde_json::from_slice(bytes).map_err(bad)?;
        if m.layers.len() > MAX_LAYERS {
            return Err(Error::Invalid(format!(
                "the manifest has {} layers, more than {MAX_LAYERS}",
                m.layers.len()
            )));
        }
        if m.config.size > MAX_CONFIG {
            return Err(Error::Invalid(format!(
                "the image config is {} bytes, more than {MAX_CONFIG}",
                m.config.size
            )));
        }
        Ok(Document::Manifest(m))
    }
}

/// The `linux/amd64` manifest of an index (the plain one before a variant's).
pub fn choose_platform<'a>(index: &'a Index, reference: &str) -> Result<&'a Descriptor, Error> {
    let amd64 = |d: &&Descriptor| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
    };
    index
        .manifests
        .iter()
        .filter(amd64)
        .min_by_key(|d| d.platform.as_ref().and_then(|p| p.variant.clone()))
        .ok_or_else(|| Error::NoPlatform {
            reference: reference.to_owned(),
            available: index
                .manifests
                .iter()
                .filter_map(|d| d.platform.as_ref().map(Platform::label))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// An image configuration (the parts a sandbox honours).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: RunConfig,
    #[serde(default)]
    pub rootfs: RootFs,
}

/// The `config` object: how a container of the image runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposed_ports: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub diff_ids: Vec<Digest>,
}

impl ImageConfig {
    pub fn parse(bytes: &[u8]) -> Result<Self, Error> {
        let c: ImageConfig = serde_json::from_slice(bytes)
            .map_err(|e| Error::Invalid(format!("image config: {e}")))?;
        if !c.os.is_empty() && c.os != "linux" {
            return Err(Error::Invalid(format!(
                "the image is for {}, not linux",
                c.os
            )));
        }
        if !c.architecture.is_empty() && c.architecture != "amd64" {
            return Err(Error::Invalid(format!(
                "the image is for {}, not amd64",
                c.architecture
            )));
        }
        Ok(c)
    }

    /// The environment as pairs (`KEY=value`; an entry without `=` is a key with no value).
    pub fn env(&self) -> Vec<(String, String)> {
        self.config
            .env
            .iter()
            .flatten()
            .map(|e| match e.split_once('=') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (e.clone(), String::new()),
            })
            .collect()
    }

    /// What `docker run IMAGE` runs: the entrypoint followed by the command.
    pub fn default_argv(&self) -> Vec<String> {
        let mut argv = self.config.entrypoint.clone().unwrap_or_default();
        argv.extend(self.config.cmd.clone().unwrap_or_default());
        argv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_kinds_and_picks_amd64() {
        let d = Digest::of(b"m");
        let index = format!(
            r#"{{"schemaVersion":2,"manifests":[
              {{"mediaType":"{OCI_MANIFEST}","digest":"{d}","size":1,"platform":{{"architecture":"arm64","os":"linux","variant":"v8"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"{d}","size":2,"platform":{{"architecture":"amd64","os":"linux"}}}}]}}"#
        );
        let Document::Index(i) = parse_document("", index.as_bytes()).unwrap() else {
            panic!("not an index")
        };
        assert_eq!(choose_platform(&i, "x").unwrap().size, 2);
        let arm = Index {
            manifests: vec![i.manifests[0].clone()],
        };
        let e = choose_platform(&arm, "x").unwrap_err();
        assert!(e.to_string().contains("linux/arm64/v8"), "{e}");
        let m = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"{OCI_CONFIG}","digest":"{d}","size":3}},"layers":[]}}"#
        );
        assert!(matches!(
            parse_document(DOCKER_MANIFEST, m.as_bytes()).unwrap(),
            Document::Manifest(_)
        ));
        assert!(parse_document("", br#"{"schemaVersion":1}"#).is_err());
    }

    #[test]
    fn config_gives_env_and_argv() {
        let c = ImageConfig::parse(
            br#"{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin","EMPTY"],"Entrypoint":["/bin/app"],"Cmd":["--serve"],"WorkingDir":"/srv","User":"1000:1000"},"rootfs":{"type":"layers","diff_ids":[]}}"#,
        )
        .unwrap();
        assert_eq!(
            c.env(),
            vec![
                ("PATH".into(), "/bin".into()),
                ("EMPTY".into(), String::new())
            ]
        );
        assert_eq!(c.default_argv(), vec!["/bin/app", "--serve"]);
        assert!(ImageConfig::parse(br#"{"architecture":"arm64","os":"linux"}"#).is_err());
    }
}
