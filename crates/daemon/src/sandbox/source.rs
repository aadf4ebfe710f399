//! Putting a sandbox's source into `/workspace` at creation: a host directory or tarball
//! streamed through the agent's tar upload, a host git repository cloned on the host and then
//! uploaded, or a git URL cloned inside the sandbox.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use belljar_agent_proto::client::{AgentClient, body_from_reader};
use belljar_agent_proto::{CommandStatus, StartCommand};
use belljar_api::Source;
use futures::StreamExt;
use tokio_util::io::SyncIoBridge;

use super::SandboxError;

const WORKSPACE: &str = belljar_agent_proto::DEFAULT_CWD;

/// Checks a source before any sandbox is started for it.
pub fn validate(source: &Source) -> Result<(), SandboxError> {
    match source {
        Source::Path { path } => {
            let p = Path::new(path);
            if !p.is_absolute() {
                return Err(SandboxError::BadRequest(
                    "source.path: must be absolute".into(),
                ));
            }
            if p.is_dir() || (p.is_file() && tar_kind(p).is_some()) {
                Ok(())
            } else {
                Err(SandboxError::BadRequest(format!(
                    "source.path: {path} is not a directory or a .tar/.tar.gz/.tgz file"
                )))
            }
        }
        Source::Git { url, revision } => {
            if url.is_empty() || url.starts_with('-') {
                return Err(SandboxError::BadRequest("source.url: invalid".into()));
            }
            if revision
                .as_deref()
                .is_some_and(|r| r.is_empty() || r.starts_with('-'))
            {
                return Err(SandboxError::BadRequest("source.revision: invalid".into()));
            }
            if let Some(local) = local_repo(url)
                && !local.is_dir()
            {
                return Err(SandboxError::BadRequest(format!(
                    "source.url: {} is not a directory",
                    local.display()
                )));
            }
            Ok(())
        }
        // Checked against the store by the lifecycle.
        Source::Snapshot { .. } => Ok(()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TarKind {
    Plain,
    Gzip,
}

fn tar_kind(p: &Path) -> Option<TarKind> {
    let name = p.file_name()?.to_string_lossy().to_lowercase();
    if name.ends_with(".tar") {
        Some(TarKind::Plain)
    } else if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
        Some(TarKind::Gzip)
    } else {
        None
    }
}

/// A git URL that names a host path: absolute, `./`-relative or `file://`.
fn local_repo(url: &str) -> Option<PathBuf> {
    if let Some(rest) = url.strip_prefix("file://") {
        return Some(PathBuf::from(rest));
    }
    (url.starts_with('/') || url.starts_with("./") || url.starts_with("../"))
        .then(|| PathBuf::from(url))
}

/// Installs `source` into `/workspace` of a running sandbox.
pub async fn install(
    agent: &AgentClient,
    source: &Source,
    env: &BTreeMap<String, String>,
) -> Result<(), SandboxError> {
    match source {
        Source::Path { path } => upload_path(agent, Path::new(path)).await,
        Source::Git { url, revision } => match local_repo(url) {
            Some(local) => {
                let tmp = tempfile::tempdir()?;
                let dest = tmp.path().join("repo");
                clone_on_host(&local, &dest, revision.as_deref()).await?;
                upload_path(agent, &dest).await
            }
            None => clone_in_sandbox(agent, url, revision.as_deref(), env).await,
        },
        // The snapshot's files are the sandbox's lower layers already.
        Source::Snapshot { .. } => Ok(()),
    }
}

/// Streams a directory (as a tar built on the fly) or a tarball to the agent.
async fn upload_path(agent: &AgentClient, path: &Path) -> Result<(), SandboxError> {
    let (reader, writer) = tokio::io::duplex(256 * 1024);
    let path = path.to_path_buf();
    let producer = tokio::task::spawn_blocking(move || -> io::Result<()> {
        let mut out = SyncIoBridge::new(writer);
        if path.is_dir() {
            let mut builder = tar::Builder::new(&mut out);
            builder.follow_symlinks(false);
            builder.append_dir_all(".", &path)?;
            builder.finish()?;
        } else {
            let file = std::fs::File::open(&path)?;
            let mut input: Box<dyn Read> = match tar_kind(&path) {
                Some(TarKind::Gzip) => Box::new(flate2::read::GzDecoder::new(file)),
                _ => Box::new(file),
            };
            io::copy(&mut input, &mut out)?;
        }
        std::io::Write::flush(&mut out)?;
        Ok(())
    });
    let uploaded = agent
        .upload_tar(WORKSPACE, None, body_from_reader(reader))
        .await;
    let produced = producer.await.map_err(io::Error::other)?;
    uploaded?;
    produced.map_err(|e| SandboxError::BadRequest(format!("source.path: cannot read: {e}")))
}

async fn clone_on_host(
    repo: &Path,
    dest: &Path,
    revision: Option<&str>,
) -> Result<(), SandboxError> {
    let out = tokio::process::Command::new("git")
        .arg("clone")
        .arg("--quiet")
        .arg("--")
        .arg(repo)
        .arg(dest)
        .output()
        .await?;
    if !out.status.success() {
        return Err(SandboxError::BadRequest(format!(
            "source.url: git clone failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    if let Some(rev) = revision {
        let out = tokio::process::Command::new("git")
            .arg("-C")
            .arg(dest)
            .args(["checkout", "--quiet", "--detach", rev])
            .output()
            .await?;
        if !out.status.success() {
            return Err(SandboxError::BadRequest(format!(
                "source.revision: git checkout failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    Ok(())
}

async fn clone_in_sandbox(
    agent: &AgentClient,
    url: &str,
    revision: Option<&str>,
    env: &BTreeMap<String, String>,
) -> Result<(), SandboxError> {
    let mut script = String::from("git clone --quiet -- \"$1\" . ");
    if revision.is_some() {
        script.push_str("&& git checkout --quiet --detach \"$2\"");
    }
    let argv = vec![
        "sh".into(),
        "-c".into(),
        script,
        "sh".into(),
        url.to_owned(),
        revision.unwrap_or_default().to_owned(),
    ];
    let start = StartCommand {
        argv,
        cwd: Some(WORKSPACE.into()),
        env: env.clone(),
        ..Default::default()
    };
    let info = agent.start_command(&start).await?;
    let done = agent.wait_command(&info.id).await?;
    if done.status == CommandStatus::Exited && done.exit_code == Some(0) {
        return Ok(());
    }
    let mut tail = String::new();
    if let Ok(mut lines) = agent.output(&info.id, 0, false).await {
        while let Some(Ok(line)) = lines.next().await {
            tail.push_str(&String::from_utf8_lossy(&line.bytes()));
        }
    }
    let tail: String = tail
        .trim()
        .chars()
        .rev()
        .take(500)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    Err(SandboxError::BadRequest(format!(
        "source.url: git clone in the sandbox failed: {tail}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_sources_before_anything_starts() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_string_lossy().into_owned();
        assert!(validate(&Source::Path { path: d.clone() }).is_ok());
        assert!(
            validate(&Source::Path {
                path: "rel/path".into()
            })
            .is_err()
        );
        let f = dir.path().join("x.tgz");
        std::fs::write(&f, b"").unwrap();
        assert!(
            validate(&Source::Path {
                path: f.to_string_lossy().into()
            })
            .is_ok()
        );
        let f = dir.path().join("x.zip");
        std::fs::write(&f, b"").unwrap();
        assert!(
            validate(&Source::Path {
                path: f.to_string_lossy().into()
            })
            .is_err()
        );
        let git = |url: &str| Source::Git {
            url: url.into(),
            revision: None,
        };
        assert!(validate(&git("https://example.invalid/r.git")).is_ok());
        assert!(validate(&git(&d)).is_ok());
        assert!(validate(&git("/no/such/repo")).is_err());
        assert!(validate(&git("--upload-pack=x")).is_err());
        assert_eq!(local_repo("file:///r"), Some(PathBuf::from("/r")));
        assert_eq!(local_repo("git@host:r.git"), None);
    }
}
