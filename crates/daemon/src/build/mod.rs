//! Dockerfile builds (`POST /v1/images/build`): a context and a Dockerfile become an image of
//! the OCI store, named as asked, runnable like a pulled one.
//!
//! Each step's result is an image of the store (unnamed: the step cache, hidden from the
//! list) and an entry of the step cache keyed by its parent's key and its instruction after
//! substitution (and for `COPY`/`ADD` the digest of the files' layer), so a rebuild reruns
//! only the steps after the first one that changed. `RUN` runs in a sandbox ([`run`]);
//! `COPY` and `ADD` are layers written on the host from the context ([`belljar_oci::build`]).
//! Only a complete build names an image: a failure leaves the unnamed steps it finished
//! (cache for the next try) and nothing else; the sandboxes it made are always deleted.

mod context;
mod run;
mod stage;

use std::collections::BTreeMap;
use std::path::PathBuf;

use belljar_api::{ErrorCode, Image, ImageBuildEvent};
use belljar_oci::build::copy::{self, Copy, Owner, Scope};
use belljar_oci::build::{CachedStep, LayerFile, Parent, step_key, tar_out};
use belljar_oci::dockerfile::{self, Instruction, Kind, Paths};
use belljar_oci::spec::ImageConfig;
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use self::stage::Stage;
use crate::images::{ImageError, Images};
use crate::sandbox::{SandboxError, Sandboxes};

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    pub tag: String,
    /// The Dockerfile's path in the context.
    pub dockerfile: String,
    pub build_args: BTreeMap<String, String>,
    pub no_cache: bool,
}

/// Why a build stopped. Each has its stable code ([`BuildError::code`]).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Oci(#[from] belljar_oci::Error),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// An instruction that cannot be built as written.
    #[error("Dockerfile line {line}: {message}")]
    Invalid { line: usize, message: String },
    /// The context's ignore file cannot be read as one.
    #[error("{file}: {message}")]
    Ignore { file: String, message: String },
    /// `FROM` (or `COPY --from`) names no image here and no stage.
    #[error("Image {0} is not here: pull, import or build it first")]
    NoImage(String),
    /// A `RUN` command failed.
    #[error("The command failed with exit code {code}; its last output:\n{tail}")]
    Failed { code: i32, tail: String },
    /// The client went away: the build was stopped.
    #[error("The client went away")]
    Cancelled,
}

impl BuildError {
    pub fn code(&self) -> ErrorCode {
        match self {
            BuildError::Oci(e) => e.code().parse().unwrap_or(ErrorCode::Internal),
            BuildError::Image(e) => crate::http::error::image_code(e),
            BuildError::Sandbox(e) => crate::http::error::sandbox_parts(e).1,
            BuildError::Invalid { .. } | BuildError::Ignore { .. } => ErrorCode::DockerfileInvalid,
            BuildError::NoImage(_) => ErrorCode::ImageNotFound,
            BuildError::Failed { .. } | BuildError::Cancelled => ErrorCode::BuildFailed,
        }
    }
}

/// The build's shared parts.
pub(crate) struct Ctx {
    images: Images,
    sandboxes: Sandboxes,
    store: belljar_oci::store::Store,
    tx: mpsc::Sender<ImageBuildEvent>,
    tag: String,
}

impl Ctx {
    fn progress(&self, message: String) {
        let _ = self.tx.try_send(ImageBuildEvent::Progress { message });
    }
}

/// Starts a build of the context in the tar file `context` (removed after); progress
/// arrives as `step` and `progress` events, then `done` or `error`. A client that goes away
/// stops the build.
pub fn start(
    images: &Images,
    sandboxes: &Sandboxes,
    context: PathBuf,
    req: BuildRequest,
) -> Result<impl Stream<Item = ImageBuildEvent> + use<>, ImageError> {
    belljar_oci::Reference::parse(&req.tag)?;
    let store = images.oci()?.clone();
    let (tx, rx) = mpsc::channel(1024);
    let ctx = Ctx {
        images: images.clone(),
        sandboxes: sandboxes.clone(),
        store,
        tx: tx.clone(),
        tag: req.tag.clone(),
    };
    let running = images.build_running();
    tokio::spawn(async move {
        let _running = running;
        let result = build(&ctx, &context, &req).await;
        let _ = tokio::fs::remove_file(&context).await;
        let end = match result {
            Ok(image) => ImageBuildEvent::Done {
                image: Box::new(image),
            },
            Err(e) => {
                // The whole chain: a sandbox that failed to launch says why.
                let message = belljar_api::error_chain(&e);
                tracing::info!(tag = %req.tag, error = %message, "build failed");
                ImageBuildEvent::Error {
                    code: e.code(),
                    message,
                }
            }
        };
        let _ = tx.send(end).await;
    });
    Ok(ReceiverStream::new(rx))
}

async fn build(
    ctx: &Ctx,
    context: &std::path::Path,
    req: &BuildRequest,
) -> Result<Image, BuildError> {
    // The context, unpacked by the same rules as a layer, into scratch space.
    let scratch = ctx.store.build_scratch()?;
    let root = scratch.path().join("context");
    std::fs::create_dir(&root).map_err(|e| belljar_oci::Error::Io {
        what: "Cannot make the context's directory".into(),
        source: e,
    })?;
    {
        let (file, root) = (context.to_owned(), root.clone());
        let cap = ctx.images.cap_bytes();
        tokio::task::spawn_blocking(move || -> Result<(), belljar_oci::Error> {
            let f = std::fs::File::open(&file).map_err(|e| belljar_oci::Error::Io {
                what: "Cannot read the context".into(),
                source: e,
            })?;
            let limits = belljar_oci::unpack::Limits {
                max_bytes: cap,
                max_entries: 1_000_000,
            };
            let mut used = 0;
            belljar_oci::unpack::apply(&root, std::io::BufReader::new(f), &limits, &mut used)
                .map(drop)
        })
        .await
        .map_err(|e| belljar_oci::Error::Invalid(format!("context: {e}")))??;
    }
    let ctx_fd = copy::open_root(&root)?;
    let text = copy::read_file(
        &ctx_fd,
        &req.dockerfile,
        Scope::Context,
        dockerfile::MAX_DOCKERFILE as u64,
    )?;
    let text = String::from_utf8(text).map_err(|_| BuildError::Invalid {
        line: 1,
        message: "the Dockerfile is not UTF-8".into(),
    })?;
    let instructions = dockerfile::parse(&text).map_err(|e| BuildError::Invalid {
        line: e.line,
        message: e.message,
    })?;
    // What the ignore file excludes goes before any step can see it.
    let ignore = context::read_ignore(&root, &ctx_fd, &req.dockerfile)?;
    {
        let root = root.clone();
        tokio::task::spawn_blocking(move || context::remove_ignored(&root, &ignore))
            .await
            .map_err(|e| belljar_oci::Error::Invalid(format!("context: {e}")))?
            .map_err(|e| belljar_oci::Error::Io {
                what: "Cannot apply the .dockerignore".into(),
                source: e,
            })?;
    }
    let steps = u32::try_from(instructions.len()).map_err(|_| BuildError::Invalid {
        line: 1,
        message: "the Dockerfile has too many instructions".into(),
    })?;
    let mut global: BTreeMap<String, String> = BTreeMap::new();
    let mut done: Vec<Stage> = Vec::new();
    let mut current: Option<Stage> = None;
    for (step, ins) in (1..=steps).zip(&instructions) {
        let step_event = |cached: bool| {
            let _ = ctx.tx.try_send(ImageBuildEvent::Step {
                step,
                steps,
                instruction: ins.text.clone(),
                cached,
            });
        };
        if ctx.tx.is_closed() {
            return Err(BuildError::Cancelled);
        }
        let invalid = |message: String| BuildError::Invalid {
            line: ins.line,
            message,
        };
        let Some(stage) = current.as_mut() else {
            // Before the first FROM: global arguments, or the FROM itself.
            match &ins.kind {
                Kind::Arg(_) => {
                    let mut s = Stage::empty();
                    s.args = global.clone();
                    s.apply(&ins.kind, &req.build_args, &BTreeMap::new())
                        .map_err(|b| invalid(b.0))?;
                    global = s.args;
                    step_event(false);
                }
                Kind::From { image, alias } => {
                    step_event(false);
                    current =
                        Some(from(ctx, &done, image, alias, &global).map_err(|e| at_line(e, ins))?);
                }
                _ => unreachable!("the parser puts FROM first"),
            }
            continue;
        };
        match &ins.kind {
            Kind::From { image, alias } => {
                step_event(false);
                let next = from(ctx, &done, image, alias, &global).map_err(|e| at_line(e, ins))?;
                done.push(std::mem::replace(stage, next));
            }
            Kind::Run(form) => {
                let key = step_key(&stage.key, &ins.text, None);
                if let Some(hit) = cached(ctx, req, &key) {
                    step_event(true);
                    take(ctx, stage, key, hit)?;
                    continue;
                }
                step_event(false);
                let layer = run::run(ctx, stage, form.argv()).await?;
                commit(ctx, stage, key, layer).await?;
            }
            Kind::Copy(args) | Kind::Add(args) => {
                let unpack = matches!(ins.kind, Kind::Add(_));
                let layer = copy_step(ctx, stage, &done, &ctx_fd, args, unpack, ins)?;
                let key = step_key(&stage.key, &ins.text, Some(&layer.diff_id));
                if let Some(hit) = cached(ctx, req, &key) {
                    step_event(true);
                    take(ctx, stage, key, hit)?;
                    continue;
                }
                step_event(false);
                commit(ctx, stage, key, Some(layer)).await?;
            }
            kind => {
                let text = stage
                    .apply(kind, &req.build_args, &global)
                    .map_err(|b| invalid(b.0))?;
                let key = step_key(&stage.key, &text, None);
                let hit = cached(ctx, req, &key);
                step_event(hit.is_some());
                if let Kind::Workdir(_) = kind {
                    let dir = stage.workdir();
                    let into = copy::open_root(&stage.rootfs)?;
                    if hit.is_none() && !copy::is_dir_in(&into, &dir) {
                        let layer = ctx.store.write_layer(|w| {
                            let mut t = tar_out::TarOut::new(w);
                            let meta = tar_out::Meta {
                                mode: 0o755,
                                uid: 0,
                                gid: 0,
                                mtime: 0,
                            };
                            t.dir(dir.trim_start_matches('/').as_bytes(), &meta, &[])
                                .and_then(|()| t.finish())
                                .map_err(|e| belljar_oci::Error::Io {
                                    what: "Cannot write the layer".into(),
                                    source: e,
                                })
                        })?;
                        commit(ctx, stage, key, Some(layer)).await?;
                        continue;
                    }
                }
                match hit {
                    Some(hit) => take(ctx, stage, key, hit)?,
                    None => commit(ctx, stage, key, None).await?,
                }
            }
        }
    }
    let Some(stage) = current else {
        return Err(BuildError::Invalid {
            line: 1,
            message: "no FROM instruction".into(),
        });
    };
    finish(ctx, stage, &req.tag).await
}

fn at_line(e: BuildError, ins: &Instruction) -> BuildError {
    match e {
        BuildError::Invalid { message, .. } => BuildError::Invalid {
            line: ins.line,
            message,
        },
        other => other,
    }
}

/// The step cache's entry for `key`, unless the build asked for none.
fn cached(ctx: &Ctx, req: &BuildRequest, key: &str) -> Option<CachedStep> {
    if req.no_cache {
        return None;
    }
    ctx.store.cached_step(key, |name| {
        ctx.images.resolve(name).is_ok_and(|r| r.oci.is_none())
    })
}

/// Takes a cached step's result as the stage's state.
fn take(ctx: &Ctx, stage: &mut Stage, key: String, hit: CachedStep) -> Result<(), BuildError> {
    stage.rootfs = ctx.images.resolve(&hit.files)?.rootfs;
    stage.files = hit.files;
    stage.config = hit.config;
    stage.key = key;
    Ok(())
}

/// Makes the step's image (the stage's files with `layer` on top), records it in the step
/// cache and makes it the stage's state.
async fn commit(
    ctx: &Ctx,
    stage: &mut Stage,
    key: String,
    layer: Option<LayerFile>,
) -> Result<(), BuildError> {
    if let Some(layer) = layer {
        let mut config = stage.config.clone();
        config.rootfs.diff_ids.push(layer.diff_id.clone());
        let image = build_on(ctx, stage, Some(layer), config.clone()).await?;
        stage.files = image.id.hex().to_owned();
        stage.rootfs = image.rootfs();
        stage.config = config;
    }
    stage.key = key.clone();
    ctx.store.cache_step(
        &key,
        &CachedStep {
            files: stage.files.clone(),
            config: stage.config.clone(),
        },
    )?;
    Ok(())
}

/// A stage's start: a previous stage by name, or an image here (one of Belljar's own or the
/// store's).
fn from(
    ctx: &Ctx,
    done: &[Stage],
    image: &str,
    alias: &Option<String>,
    global: &BTreeMap<String, String>,
) -> Result<Stage, BuildError> {
    let name = dockerfile::words::word(image, global).map_err(|e| BuildError::Invalid {
        line: 0,
        message: e.to_string(),
    })?;
    let mut stage = if let Some(prev) = done
        .iter()
        .rev()
        .find(|s| s.alias.as_deref() == Some(name.as_str()))
    {
        let mut s = prev.clone();
        s.args = BTreeMap::new();
        s.cmd_inherited = true;
        s
    } else {
        let resolved = ctx
            .images
            .resolve(&name)
            .map_err(|_| BuildError::NoImage(name.clone()))?;
        let (config, identity) = match &resolved.oci {
            Some(_) => {
                let stored = ctx
                    .store
                    .get(&name)
                    .ok_or_else(|| BuildError::NoImage(name.clone()))?;
                (stored.config()?, stored.id.to_string())
            }
            None => {
                let own = ctx.images.get(&name);
                let mut config = ImageConfig::default();
                config.config.env = Some(vec![
                    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                ]);
                (config, format!("{name}@{}", own.digest.unwrap_or_default()))
            }
        };
        let files = match &resolved.oci {
            Some(_) => ctx
                .store
                .get(&name)
                .map(|s| s.id.hex().to_owned())
                .unwrap_or_default(),
            None => name.clone(),
        };
        Stage {
            alias: None,
            key: step_key("", &format!("FROM {identity}"), None),
            files,
            rootfs: resolved.rootfs,
            config: ImageConfig {
                architecture: "amd64".into(),
                os: "linux".into(),
                ..config
            },
            args: BTreeMap::new(),
            cmd_inherited: true,
        }
    };
    stage.alias = alias.clone();
    Ok(stage)
}

/// The layer of a `COPY` or `ADD`.
fn copy_step(
    ctx: &Ctx,
    stage: &Stage,
    done: &[Stage],
    context: &std::os::fd::OwnedFd,
    args: &dockerfile::CopyArgs,
    unpack: bool,
    ins: &Instruction,
) -> Result<LayerFile, BuildError> {
    let invalid = |message: String| BuildError::Invalid {
        line: ins.line,
        message,
    };
    let vars = stage.vars();
    let mut words = match &args.paths {
        Paths::Words(t) => {
            dockerfile::words::words(t, &vars).map_err(|e| invalid(e.to_string()))?
        }
        Paths::Json(v) => v
            .iter()
            .map(|w| dockerfile::words::word(w, &vars))
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(e.to_string()))?,
    };
    if words.len() < 2 {
        return Err(invalid("COPY and ADD take SOURCE... DEST".into()));
    }
    let dest_word = words.pop().unwrap_or_default();
    let trailing = dest_word.ends_with('/');
    let dest = if dest_word.starts_with('/') {
        dest_word.clone()
    } else {
        format!("{}/{dest_word}", stage.workdir())
    };
    let mut dest = stage::normalise(&dest);
    if trailing && dest != "/" {
        dest.push('/');
    }
    let into = copy::open_root(&stage.rootfs)?;
    let chown = args
        .chown
        .as_deref()
        .map(|c| copy::owner_ids(&into, c))
        .transpose()?;
    let (from_fd, scope, owner) = match &args.from {
        None => (
            None,
            Scope::Context,
            Owner::Fixed(chown.map_or(0, |c| c.0), chown.map_or(0, |c| c.1)),
        ),
        Some(f) => {
            let by_index = f.parse::<usize>().ok().and_then(|i| done.get(i));
            let rootfs = match by_index.or_else(|| {
                done.iter()
                    .rev()
                    .find(|s| s.alias.as_deref() == Some(f.as_str()))
            }) {
                Some(s) => s.rootfs.clone(),
                None => {
                    ctx.images
                        .resolve(f)
                        .map_err(|_| BuildError::NoImage(f.clone()))?
                        .rootfs
                }
            };
            let owner = chown.map_or(Owner::Keep, |(u, g)| Owner::Fixed(u, g));
            (Some(copy::open_root(&rootfs)?), Scope::Image, owner)
        }
    };
    let from = from_fd.as_ref().unwrap_or(context);
    let layer = ctx.store.write_layer(|w| {
        copy::copy_layer(
            &Copy {
                from,
                scope,
                sources: &words,
                dest: &dest,
                into: &into,
                owner,
                chmod: args.chmod,
                unpack,
            },
            w,
        )
    })?;
    Ok(layer)
}

/// Names the last stage's image: the step's own when its configuration is the final one,
/// else an image of the same files with it.
async fn finish(ctx: &Ctx, stage: Stage, tag: &str) -> Result<Image, BuildError> {
    let config = stage.config.clone();
    let image = build_on(ctx, &stage, None, config).await?;
    Ok(ctx.images.name_built(tag, &image)?)
}

/// The image of `config` with the stage's files and `layer` on top.
async fn build_on(
    ctx: &Ctx,
    stage: &Stage,
    layer: Option<LayerFile>,
    config: ImageConfig,
) -> Result<belljar_oci::store::StoredImage, BuildError> {
    // The stage's files are an image of the store (its id), or one of Belljar's own, named
    // for good by its name and digest.
    let stored = if belljar_oci::Digest::parse(&format!("sha256:{}", stage.files)).is_ok() {
        Some(
            ctx.store
                .get(&stage.files)
                .ok_or_else(|| BuildError::NoImage(stage.files.clone()))?,
        )
    } else {
        None
    };
    let own_key = match stored {
        Some(_) => String::new(),
        None => format!(
            "{}@{}",
            stage.files,
            ctx.images.get(&stage.files).digest.unwrap_or_default()
        ),
    };
    let (store, rootfs) = (ctx.store.clone(), stage.rootfs.clone());
    let image = tokio::task::spawn_blocking(move || {
        let parent = match &stored {
            Some(image) => Parent::Stored(image),
            None => Parent::Outside {
                rootfs: &rootfs,
                key: &own_key,
            },
        };
        store.build_image(&parent, layer.as_ref(), &config)
    })
    .await
    .map_err(|e| belljar_oci::Error::Invalid(format!("build step: {e}")))??;
    Ok(image)
}
