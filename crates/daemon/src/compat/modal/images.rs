//! Images through the Modal layer: each layer the client defines (`debian_slim()`,
//! `from_registry(ref)`, then one layer per `run_commands`, `env`, `workdir`, `apt_install`,
//! `pip_install`, ...) is a Dockerfile built by the daemon's builder ([`crate::build`]).
//!
//! The client sends a layer as Dockerfile commands over the images it names (`FROM base`,
//! where `base` is the id of the layer below), asks for it with `ImageGetOrCreate` and, when
//! the answer has no result yet, follows the build with `ImageJoinStreaming` (its log lines,
//! then the result). Here a layer's image is named after a hash of its definition
//! (`belljar-modal:<hash>`, id `im-belljar-modal:<hash>`), so the same definition is the same
//! image, and a build of it again takes every step from the builder's step cache.
//!
//! Modal's base images are local ones: `debian_slim()` (any Python version) is Belljar's
//! Python image, and its apt and pip set-up steps are not run; `from_registry(ref)` is the
//! local image `ref` if there is one, else the daemon pulls it (from the registry the
//! reference names, or the daemon's default registry) before the layer's other commands run.
//! Nothing reaches Modal's registry. What the builder cannot be given here is refused as a
//! failed build says so: image secrets, files the client uploads as a mount
//! (`add_local_*(copy=True)`), build functions.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use belljar_api::ImageBuildEvent;
use futures::StreamExt;
use hyper::body::Incoming;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};

use super::error::{ModalError, Result};
use super::wire::{
    GenericResult, Image, ImageFromIdRequest, ImageFromIdResponse, ImageGetOrCreateRequest,
    ImageGetOrCreateResponse, ImageJoinStreamingRequest, ImageJoinStreamingResponse, TaskLogs, fd,
    status,
};
use super::{Messages, Modal, ids, lock, streaming, unary};

/// What `Image.debian_slim()` is here: Belljar's Debian image with Python.
pub const DEBIAN_SLIM: &str = "python3.13";
/// The repository of the images built for Modal layers.
const REPOSITORY: &str = "belljar-modal";
/// How many builds the layer remembers (their logs and results); the oldest finished one
/// goes first.
const MAX_BUILDS: usize = 256;
/// The most log lines a build keeps; later lines are counted, not kept.
const MAX_LINES: usize = 20_000;
/// The longest a join holds a request (the client asks again after).
const LONG_POLL: Duration = Duration::from_secs(55);

/// The builds started through the layer, by image id.
#[derive(Default)]
pub struct Builds {
    by_id: HashMap<String, Arc<Build>>,
    order: VecDeque<String>,
}

/// One build: its log lines so far and, once it has ended, its result.
struct Build {
    state: watch::Sender<State>,
}

#[derive(Default, Clone)]
struct State {
    lines: Vec<String>,
    dropped: usize,
    result: Option<GenericResult>,
}

impl Build {
    fn line(&self, text: String) {
        self.state.send_modify(|s| {
            if s.lines.len() < MAX_LINES {
                s.lines.push(text);
            } else {
                s.dropped += 1;
            }
        });
    }

    fn end(&self, result: GenericResult) {
        self.state.send_modify(|s| {
            if s.dropped > 0 {
                s.lines
                    .push(format!("({} more lines were not kept)\n", s.dropped));
                s.dropped = 0;
            }
            s.result = Some(result);
        });
    }

    fn result(&self) -> Option<GenericResult> {
        self.state.borrow().result.clone()
    }
}

/// The control plane's image routes.
pub async fn route(
    m: &Modal,
    method: &str,
    req: hyper::Request<Incoming>,
) -> Option<hyper::Response<tonic::body::Body>> {
    let m = m.clone();
    Some(match method {
        "ImageGetOrCreate" => unary(req, |r| get_or_create(m.clone(), r)).await,
        "ImageJoinStreaming" => streaming(req, |r| join(m.clone(), r)).await,
        "ImageFromId" => unary(req, |r| from_id(m.clone(), r)).await,
        _ => return None,
    })
}

/// How a layer becomes a local image.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// An image that is here already, by name.
    Local(String),
    /// A Dockerfile to build, after pulling `pull` if it is not here.
    Build {
        dockerfile: String,
        files: Vec<(String, Vec<u8>)>,
        pull: Option<String>,
    },
}

impl Plan {
    /// The name of the image this plan makes: a hash of everything the build reads.
    fn tag(&self) -> String {
        let mut h = Sha256::new();
        if let Plan::Build {
            dockerfile,
            files,
            pull,
        } = self
        {
            h.update(dockerfile.as_bytes());
            for (name, data) in files {
                h.update([0]);
                h.update(name.as_bytes());
                h.update([0]);
                h.update((data.len() as u64).to_le_bytes());
                h.update(data);
            }
            h.update([1]);
            h.update(pull.as_deref().unwrap_or_default().as_bytes());
        }
        let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        format!("{REPOSITORY}:{}", &hex[..32])
    }
}

/// The plan of a layer, or why it cannot be built here (the build's failure message).
fn plan(image: &Image, m: &Modal) -> std::result::Result<Plan, String> {
    if !image.secret_ids.is_empty() {
        return Err(not_here("Image secrets (secrets= of an image step)"));
    }
    if !image.context_mount_id.is_empty() {
        return Err(not_here(
            "Files uploaded into an image (add_local_file/add_local_dir with copy=True)",
        ));
    }
    if image.build_function.is_some() || !image.build_function_def.is_empty() {
        return Err(not_here("Build functions (Image.run_function)"));
    }
    let (first, rest) = image
        .dockerfile_commands
        .split_first()
        .ok_or_else(|| "The image layer has no Dockerfile commands".to_owned())?;
    let from = first
        .strip_prefix("FROM ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| format!("The image layer must start with FROM, not {first:?}"))?;
    let bases: HashMap<&str, &str> = image
        .base_images
        .iter()
        .map(|b| (b.docker_tag.as_str(), b.image_id.as_str()))
        .collect();
    let files = image
        .context_files
        .iter()
        .map(|f| (f.filename.clone(), f.data.clone()))
        .collect();
    if bases.is_empty() {
        if is_debian_slim(from) {
            return Ok(Plan::Local(DEBIAN_SLIM.into()));
        }
        let here = m.st().images.resolve(from).is_ok();
        if rest.is_empty() && here {
            return Ok(Plan::Local(from.to_owned()));
        }
        return Ok(Plan::Build {
            dockerfile: image.dockerfile_commands.join("\n") + "\n",
            files,
            pull: (!here).then(|| from.to_owned()),
        });
    }
    Ok(Plan::Build {
        dockerfile: rewrite_from(&image.dockerfile_commands, &bases)?,
        files,
        pull: None,
    })
}

/// The Dockerfile of commands over base images: each `FROM <docker tag>` names the local
/// image of that base image's id.
fn rewrite_from(
    commands: &[String],
    bases: &HashMap<&str, &str>,
) -> std::result::Result<String, String> {
    let mut text = String::new();
    for command in commands {
        let line = match command.strip_prefix("FROM ") {
            Some(args) => {
                let mut words = args.split_whitespace();
                let name = words.next().unwrap_or_default();
                match bases.get(name) {
                    Some(id) => {
                        let local = ids::image_of(id).map_err(|e| e.to_string())?;
                        let rest: Vec<&str> = words.collect();
                        format!("FROM {local} {}", rest.join(" "))
                            .trim_end()
                            .to_owned()
                    }
                    None => command.clone(),
                }
            }
            None => command.clone(),
        };
        text.push_str(&line);
        text.push('\n');
    }
    Ok(text)
}

fn not_here(what: &str) -> String {
    format!("{what} are not built by Belljar's Modal compatibility layer yet")
}

/// Whether `tag` is the registry image `debian_slim()` starts from
/// (`python:<version>-slim-<debian>`).
fn is_debian_slim(tag: &str) -> bool {
    tag.strip_prefix("python:")
        .is_some_and(|v| v.contains("-slim-") && v.starts_with(|c: char| c.is_ascii_digit()))
}

fn failed(exception: String) -> GenericResult {
    GenericResult {
        status: status::FAILURE,
        exception,
        exitcode: 0,
    }
}

fn ok() -> GenericResult {
    GenericResult {
        status: status::SUCCESS,
        ..GenericResult::default()
    }
}

async fn get_or_create(m: Modal, req: ImageGetOrCreateRequest) -> Result<ImageGetOrCreateResponse> {
    let image = req.image.unwrap_or_default();
    let plan = match plan(&image, &m) {
        Ok(p) => p,
        Err(why) => {
            return Ok(ImageGetOrCreateResponse {
                image_id: ids::image("unbuilt"),
                result: Some(failed(why)),
            });
        }
    };
    if let Plan::Local(name) = &plan {
        let result = match m.st().images.resolve(name) {
            Ok(_) => ok(),
            Err(e) => failed(e.to_string()),
        };
        return Ok(ImageGetOrCreateResponse {
            image_id: ids::image(name),
            result: Some(result),
        });
    }
    let tag = plan.tag();
    let image_id = ids::image(&tag);
    let force = req.force_build || req.ignore_cache;
    let known = lock(&m.0.builds).by_id.get(&image_id).cloned();
    if let Some(build) = known {
        match build.result() {
            // Still building: the client joins it.
            None => return Ok(pending(image_id)),
            Some(r) if r.status == status::SUCCESS && !force => {
                if m.st().images.resolve(&tag).is_ok() {
                    return Ok(ImageGetOrCreateResponse {
                        image_id,
                        result: Some(r),
                    });
                }
            }
            Some(_) => {}
        }
    }
    let build = m.keep_build(&image_id);
    let Plan::Build {
        dockerfile,
        files,
        pull,
    } = plan
    else {
        unreachable!("a local image was answered above");
    };
    let m2 = m.clone();
    tokio::spawn(async move {
        let result = match run(&m2, &build, &tag, dockerfile, files, pull, force).await {
            Ok(()) => ok(),
            Err(message) => {
                build.line(format!("{message}\n"));
                failed(message)
            }
        };
        build.end(result);
    });
    Ok(pending(image_id))
}

/// The answer for a build that goes on: no result, so the client joins it.
fn pending(image_id: String) -> ImageGetOrCreateResponse {
    ImageGetOrCreateResponse {
        image_id,
        result: None,
    }
}

/// Pulls the base if asked, then builds the layer as `tag`; the error is the failure's
/// message.
async fn run(
    m: &Modal,
    build: &Build,
    tag: &str,
    dockerfile: String,
    files: Vec<(String, Vec<u8>)>,
    pull: Option<String>,
    force: bool,
) -> std::result::Result<(), String> {
    let images = &m.st().images;
    let mut dockerfile = dockerfile;
    if let Some(reference) = pull {
        build.line(format!("Pulling {reference}\n"));
        let mut events = images.pull(&reference, false).map_err(|e| e.to_string())?;
        let mut pulled = None;
        while let Some(event) = events.next().await {
            match event {
                ImageBuildEvent::Progress { message } => build.line(format!("{message}\n")),
                ImageBuildEvent::Done { image } => pulled = Some(image.name),
                ImageBuildEvent::Error { message, .. } => return Err(message),
                ImageBuildEvent::Step { .. } => {}
            }
        }
        let name = pulled.ok_or("The pull ended without an image")?;
        // The pulled image's full name (its registry included) is what FROM names.
        if let Some((_, rest)) = dockerfile.split_once('\n') {
            dockerfile = format!("FROM {name}\n{rest}");
        }
    }
    let context = context_tar(images, &dockerfile, &files).map_err(|e| e.to_string())?;
    let req = crate::build::BuildRequest {
        tag: tag.to_owned(),
        dockerfile: "Dockerfile".into(),
        build_args: Default::default(),
        no_cache: force,
    };
    let mut events = match crate::build::start(images, &m.st().sandboxes, context.clone(), req) {
        Ok(events) => events,
        Err(e) => {
            let _ = std::fs::remove_file(&context);
            return Err(e.to_string());
        }
    };
    let mut end = Err("The build ended without a result".to_owned());
    while let Some(event) = events.next().await {
        match event {
            ImageBuildEvent::Step {
                step,
                steps,
                instruction,
                cached,
            } => {
                let cached = if cached { " (cached)" } else { "" };
                build.line(format!("=> Step {step}/{steps}: {instruction}{cached}\n"));
            }
            ImageBuildEvent::Progress { message } => build.line(format!("{message}\n")),
            ImageBuildEvent::Done { .. } => end = Ok(()),
            ImageBuildEvent::Error { message, .. } => end = Err(message),
        }
    }
    end
}

/// Writes the build context (the Dockerfile and the layer's files) as a tar file in the image
/// store's scratch space, where the builder reads and then removes it.
fn context_tar(
    images: &crate::images::Images,
    dockerfile: &str,
    files: &[(String, Vec<u8>)],
) -> std::result::Result<std::path::PathBuf, ModalError> {
    let io = |e: std::io::Error| {
        ModalError::Api(crate::http::error::ApiError::Internal(format!(
            "Cannot write the build context: {e}"
        )))
    };
    let path = images
        .scratch_dir()
        .map_err(|e| ModalError::Api(e.into()))?
        .join(format!(
            "{}context-{}.tar",
            belljar_oci::store::scratch_prefix(),
            crate::util::new_id("bld")
        ));
    let write = || -> std::io::Result<()> {
        let mut tar = tar::Builder::new(std::fs::File::create(&path)?);
        let mut add = |name: &str, data: &[u8]| {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(0);
            header.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut header, name.trim_start_matches('/'), data)
        };
        add("Dockerfile", dockerfile.as_bytes())?;
        for (name, data) in files {
            add(name, data)?;
        }
        tar.into_inner()?.sync_all()
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&path);
        io(e)
    })?;
    Ok(path)
}

impl Modal {
    /// A new build under `image_id`, remembered in place of any earlier one; the oldest
    /// finished build is forgotten when there are too many.
    fn keep_build(&self, image_id: &str) -> Arc<Build> {
        let (state, _) = watch::channel(State::default());
        let build = Arc::new(Build { state });
        let mut b = lock(&self.0.builds);
        if b.by_id.len() >= MAX_BUILDS {
            let finished = b
                .order
                .iter()
                .position(|id| b.by_id.get(id).is_none_or(|x| x.result().is_some()));
            if let Some(i) = finished
                && let Some(old) = b.order.remove(i)
            {
                b.by_id.remove(&old);
            }
        }
        b.order.retain(|id| id != image_id);
        b.order.push_back(image_id.to_owned());
        b.by_id.insert(image_id.to_owned(), build.clone());
        build
    }
}

/// The build's log lines from the entry `last_entry_id` (a line index), as they come, and
/// its result at the end; for up to [`LONG_POLL`], after which the client asks again.
async fn join(
    m: Modal,
    req: ImageJoinStreamingRequest,
) -> Result<Messages<ImageJoinStreamingResponse>> {
    let build = lock(&m.0.builds).by_id.get(&req.image_id).cloned();
    let (tx, rx) = mpsc::channel(16);
    let Some(build) = build else {
        // Not built through this daemon run: a finished image is here or not.
        let name = ids::image_of(&req.image_id)?;
        m.st()
            .images
            .resolve(&name)
            .map_err(|_| ModalError::NotFound(format!("Image {} not found", req.image_id)))?;
        let _ = tx.try_send(Ok(ImageJoinStreamingResponse {
            result: Some(ok()),
            eof: true,
            ..ImageJoinStreamingResponse::default()
        }));
        return Ok(Messages::new(rx));
    };
    let mut from: usize = req.last_entry_id.parse().unwrap_or(0);
    let hold = Duration::try_from_secs_f32(req.timeout.max(0.0))
        .unwrap_or(LONG_POLL)
        .min(LONG_POLL);
    let mut seen = build.state.subscribe();
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + hold;
        loop {
            let (lines, result) = {
                let s = seen.borrow_and_update();
                let from_here = from.min(s.lines.len());
                (s.lines[from_here..].to_vec(), s.result.clone())
            };
            from += lines.len();
            let done = result.is_some();
            if !lines.is_empty() || done {
                let message = ImageJoinStreamingResponse {
                    result,
                    task_logs: lines
                        .into_iter()
                        .map(|data| TaskLogs {
                            data,
                            file_descriptor: fd::STDOUT,
                        })
                        .collect(),
                    entry_id: from.to_string(),
                    eof: done,
                };
                if tx.send(Ok(message)).await.is_err() {
                    return;
                }
            }
            if done {
                return;
            }
            tokio::select! {
                changed = seen.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(deadline) => return,
            }
        }
    });
    Ok(Messages::new(rx))
}

async fn from_id(m: Modal, req: ImageFromIdRequest) -> Result<ImageFromIdResponse> {
    let name = ids::image_of(&req.image_id)?;
    m.st()
        .images
        .resolve(&name)
        .map_err(|e| ModalError::NotFound(e.to_string()))?;
    Ok(ImageFromIdResponse {
        image_id: req.image_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compat::modal::wire::BaseImage;

    fn layer(commands: &[&str]) -> Image {
        Image {
            dockerfile_commands: commands.iter().map(|c| c.to_string()).collect(),
            ..Image::default()
        }
    }

    #[test]
    fn base_images_are_named_by_their_local_image() {
        let mut on_top = layer(&["FROM base", "RUN echo hi", "ENV A=1"]);
        on_top.base_images.push(BaseImage {
            image_id: ids::image("belljar-modal:abc"),
            docker_tag: "base".into(),
        });
        assert_eq!(
            rewrite(&on_top),
            "FROM belljar-modal:abc\nRUN echo hi\nENV A=1\n"
        );
    }

    #[test]
    fn the_same_definition_is_the_same_image() {
        let a = Plan::Build {
            dockerfile: "FROM base\nRUN true\n".into(),
            files: vec![],
            pull: None,
        };
        let b = Plan::Build {
            dockerfile: "FROM base\nRUN false\n".into(),
            files: vec![],
            pull: None,
        };
        assert_eq!(a.tag(), a.tag());
        assert_ne!(a.tag(), b.tag());
        assert!(belljar_oci::Reference::parse(&a.tag()).is_ok());
        assert!(is_debian_slim("python:3.11.9-slim-bookworm"));
        assert!(!is_debian_slim("python:latest"));
    }

    /// The Dockerfile of a layer over base images (which needs no daemon).
    fn rewrite(image: &Image) -> String {
        let bases: HashMap<&str, &str> = image
            .base_images
            .iter()
            .map(|b| (b.docker_tag.as_str(), b.image_id.as_str()))
            .collect();
        rewrite_from(&image.dockerfile_commands, &bases).unwrap()
    }
}
