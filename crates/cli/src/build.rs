//! `belljar images build -t NAME [-f FILE] [--build-arg K=V] [--no-cache] DIR`: the context
//! directory is sent to the daemon as a tar (links as links), and the build's steps and its
//! commands' output are printed on stderr as they come.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use belljar_api::BuildQuery;
use belljar_api::dockerignore::{self, Ignore};
use belljar_cli::cp::Selection;
use belljar_client::Client;

use crate::host::follow_image_events;

pub(crate) struct Build {
    pub dir: PathBuf,
    pub tag: String,
    pub file: Option<PathBuf>,
    pub build_args: Vec<String>,
    pub no_cache: bool,
}

pub(crate) async fn build(client: &Client, b: Build, json: bool) -> Result<i32> {
    let dir = std::fs::canonicalize(&b.dir)
        .with_context(|| format!("Cannot read the context directory {}", b.dir.display()))?;
    if !dir.is_dir() {
        bail!("{} is not a directory", b.dir.display());
    }
    let dockerfile = match &b.file {
        None => None,
        Some(f) => Some(inside(&dir, f)?),
    };
    let selection = selection(&dir, dockerfile.as_deref().unwrap_or("Dockerfile"))?;
    let query = BuildQuery {
        tag: b.tag.clone(),
        dockerfile,
        build_args: build_args(&b.build_args)?,
        no_cache: b.no_cache.then_some(true),
    };
    let (tarball, writer) = belljar_cli::cp::tar_stream(dir.clone(), selection);
    let events = client
        .build_dockerfile(belljar_client::streamed(tarball), &query)
        .await?;
    writer
        .await
        .context("The context's tar writer failed")?
        .with_context(|| format!("Cannot read {}", dir.display()))?;
    follow_image_events(events, "built", json).await
}

/// The Dockerfile's path in the context (it must be in it: the daemon reads it from there).
fn inside(dir: &Path, file: &Path) -> Result<String> {
    let real = std::fs::canonicalize(file)
        .with_context(|| format!("Cannot read the Dockerfile {}", file.display()))?;
    let rel = real.strip_prefix(dir).map_err(|_| {
        anyhow::anyhow!(
            "The Dockerfile {} is not inside the context {}: move it there",
            file.display(),
            dir.display()
        )
    })?;
    Ok(rel.to_string_lossy().into_owned())
}

/// What of the context goes to the daemon: all but what its ignore file excludes (the
/// Dockerfile's own `.dockerignore`, else the context's), the Dockerfile and that file always.
fn selection(dir: &Path, dockerfile: &str) -> Result<Option<Selection>> {
    for name in dockerignore::candidates(dockerfile) {
        let path = dir.join(&name);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("Cannot read {}", path.display())),
        };
        let ignore = Ignore::parse(&text).with_context(|| format!("{}", path.display()))?;
        return Ok(Some(Selection {
            ignore,
            always: vec![dockerfile.to_owned(), name],
        }));
    }
    Ok(None)
}

/// `KEY=VALUE` words as the query's JSON object; a bare `KEY` takes the value of this
/// shell's variable, as Docker's does.
fn build_args(words: &[String]) -> Result<Option<String>> {
    if words.is_empty() {
        return Ok(None);
    }
    let mut map = BTreeMap::new();
    for w in words {
        match w.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                map.insert(k.to_owned(), v.to_owned());
            }
            None if !w.is_empty() => {
                if let Ok(v) = std::env::var(w) {
                    map.insert(w.clone(), v);
                }
            }
            _ => bail!("--build-arg {w:?}: expected KEY=VALUE"),
        }
    }
    Ok(Some(serde_json::to_string(&map)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_args_become_a_json_object() {
        let got = build_args(&["A=1".into(), "B=x=y".into()])
            .unwrap()
            .unwrap();
        assert_eq!(got, r#"{"A":"1","B":"x=y"}"#);
        assert!(build_args(&["=v".into()]).is_err());
        assert_eq!(build_args(&[]).unwrap(), None);
    }
}
