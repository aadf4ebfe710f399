//! Belljar's own images: building them from `guest-images/recipes` with `build-image.sh`.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use belljar_api::ImageBuildEvent;
use futures::Stream;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{ImageError, Images, valid_name};

impl Images {
    pub(super) fn is_building(&self, name: &str) -> bool {
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
                    image: Box::new(this.get(&name)),
                },
                Err(e) => ImageBuildEvent::Error {
                    code: belljar_api::ErrorCode::BuildFailed,
                    message: crate::util::error_chain(&e),
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
    ) -> Result<(), RecipeError> {
        let mut child = tokio::process::Command::new("bash")
            .arg(script)
            .arg(name)
            .env("BELLJAR_CACHE", &self.paths.cache)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(false)
            .spawn()
            .map_err(|e| RecipeError::Start(script.to_owned(), e))?;
        let stdout = child.stdout.take().map(|s| BufReader::new(s).lines());
        let stderr = child.stderr.take().map(|s| BufReader::new(s).lines());
        let last_err = Arc::new(Mutex::new(String::new()));
        let out = forward_lines(stdout, tx.clone(), None);
        let err = forward_lines(stderr, tx.clone(), Some(last_err.clone()));
        let ((), ()) = tokio::join!(out, err);
        let status = child.wait().await.map_err(RecipeError::Wait)?;
        if status.success() {
            Ok(())
        } else {
            let last = last_err.lock().unwrap_or_else(|e| e.into_inner()).clone();
            Err(RecipeError::Failed {
                name: name.to_owned(),
                status,
                last,
            })
        }
    }
}

/// Why one of our own images could not be built.
#[derive(Debug, thiserror::Error)]
enum RecipeError {
    #[error("cannot start {}", .0.display())]
    Start(std::path::PathBuf, #[source] std::io::Error),
    #[error("cannot wait for the image build")]
    Wait(#[source] std::io::Error),
    /// `last`: the script's last line on stderr.
    #[error("build-image.sh {name} failed ({status}): {last}")]
    Failed {
        name: String,
        status: std::process::ExitStatus,
        last: String,
    },
}

/// See [`Images::build_command`].
pub(super) fn build_command(root: bool, cache: &Path, script: &Path, name: &str) -> String {
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

/// Sends each line as a `progress` event (a slow or gone reader must not stall the build),
/// keeping the last one in `keep`.
async fn forward_lines<R: tokio::io::AsyncBufRead + Unpin>(
    lines: Option<tokio::io::Lines<R>>,
    tx: mpsc::Sender<ImageBuildEvent>,
    keep: Option<Arc<Mutex<String>>>,
) {
    let Some(mut lines) = lines else { return };
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(k) = &keep {
            *k.lock().unwrap_or_else(|e| e.into_inner()) = line.clone();
        }
        let _ = tx.try_send(ImageBuildEvent::Progress { message: line });
    }
}
