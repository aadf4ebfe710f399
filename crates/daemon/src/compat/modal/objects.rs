//! The control plane's routes, and the objects a sandbox is made from: the handshake, apps,
//! the environment, secrets and images.
//!
//! Apps have nothing of their own here: an app's id follows from its name ([`ids::app`]) and
//! its sandboxes carry it in a tag. Secrets made from a dict (which is how `Sandbox.create`
//! sends `env=`) live in the daemon's memory only. An image is a local one: `debian_slim()`
//! is Belljar's Python image, `from_registry(name)` the local image of that name (one of
//! Belljar's, or one pulled with `belljar images pull`). Building layers on top (`run_commands`,
//! `pip_install`, ...) is not done yet; such an image fails to build with a message that says
//! so, as a failed build does on Modal.

use hyper::body::Incoming;

use super::error::{ModalError, Result};
use super::wire::{
    AppGetOrCreateRequest, AppGetOrCreateResponse, AppHandleMetadata, ClientHelloResponse, Empty,
    EnvironmentGetOrCreateRequest, EnvironmentGetOrCreateResponse, EnvironmentMetadata,
    EnvironmentSettings, GenericResult, Image, ImageFromIdRequest, ImageFromIdResponse,
    ImageGetOrCreateRequest, ImageGetOrCreateResponse, SecretGetOrCreateRequest,
    SecretGetOrCreateResponse, SecretMetadata, status,
};
use super::{Modal, ids, sandboxes, streaming, unary};

/// The image builder version the environment reports: one the tested client knows.
pub const BUILDER_VERSION: &str = "2025.06";
/// The environment every app is in.
const ENVIRONMENT: &str = "main";
const ENVIRONMENT_ID: &str = "en-BelljarLocal";
/// What `Image.debian_slim()` is here: Belljar's Debian image with Python.
pub const DEBIAN_SLIM: &str = "python3.13";

/// The control plane's answer to `method`, `None` for one it does not serve.
pub async fn route(
    m: &Modal,
    method: &str,
    req: hyper::Request<Incoming>,
) -> Option<hyper::Response<tonic::body::Body>> {
    let m = m.clone();
    Some(match method {
        "ClientHello" => unary(req, |_: Empty| hello()).await,
        "AppGetOrCreate" => unary(req, app).await,
        "EnvironmentGetOrCreate" => unary(req, environment).await,
        "SecretGetOrCreate" => unary(req, |r| secret(m.clone(), r)).await,
        "ImageGetOrCreate" => unary(req, |r| image(m.clone(), r)).await,
        "ImageFromId" => unary(req, |r| image_from_id(m.clone(), r)).await,
        "SandboxCreate" => unary(req, |r| sandboxes::create(m.clone(), r)).await,
        "SandboxGetTaskId" => unary(req, |r| sandboxes::task_id(m.clone(), r)).await,
        "SandboxWait" => unary(req, |r| sandboxes::wait(m.clone(), r)).await,
        "SandboxTerminate" => unary(req, |r| sandboxes::terminate(m.clone(), r)).await,
        "SandboxGetLogs" => streaming(req, |r| sandboxes::logs(m.clone(), r)).await,
        "SandboxStdinWrite" => unary(req, |r| sandboxes::stdin_write(m.clone(), r)).await,
        "TaskGetCommandRouterAccess" => unary(req, |r| sandboxes::router(m.clone(), r)).await,
        _ => return None,
    })
}

async fn hello() -> Result<ClientHelloResponse> {
    Ok(ClientHelloResponse {
        warning: String::new(),
        image_builder_version: BUILDER_VERSION.into(),
    })
}

fn environment_name(name: &str) -> &str {
    if name.is_empty() { ENVIRONMENT } else { name }
}

async fn app(req: AppGetOrCreateRequest) -> Result<AppGetOrCreateResponse> {
    let environment = environment_name(&req.environment_name).to_owned();
    let app_id = if ids::is_app(&req.app_name) {
        req.app_name.clone()
    } else if req.app_name.is_empty() {
        return Err(ModalError::BadRequest("app_name: must not be empty".into()));
    } else {
        ids::app(&environment, &req.app_name)
    };
    Ok(AppGetOrCreateResponse {
        handle_metadata: Some(AppHandleMetadata {
            description: req.app_name,
            app_id: app_id.clone(),
            environment_name: environment,
        }),
        app_id,
    })
}

async fn environment(req: EnvironmentGetOrCreateRequest) -> Result<EnvironmentGetOrCreateResponse> {
    Ok(EnvironmentGetOrCreateResponse {
        environment_id: ENVIRONMENT_ID.into(),
        metadata: Some(EnvironmentMetadata {
            name: environment_name(&req.deployment_name).to_owned(),
            settings: Some(EnvironmentSettings {
                image_builder_version: BUILDER_VERSION.into(),
                webhook_suffix: String::new(),
            }),
        }),
    })
}

async fn secret(m: Modal, req: SecretGetOrCreateRequest) -> Result<SecretGetOrCreateResponse> {
    if !req.deployment_name.is_empty() {
        return Err(ModalError::NotImplemented("Named Secrets".into()));
    }
    let id = format!("st-{}", random_tail());
    let mut keys: Vec<String> = req.env_dict.keys().cloned().collect();
    keys.sort();
    m.keep_secret(&id, req.env_dict);
    Ok(SecretGetOrCreateResponse {
        secret_id: id,
        metadata: Some(SecretMetadata {
            name: String::new(),
            keys,
        }),
    })
}

/// 22 random letters and digits, the length of Modal's ids.
fn random_tail() -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::thread_rng();
    (0..22)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

async fn image(m: Modal, req: ImageGetOrCreateRequest) -> Result<ImageGetOrCreateResponse> {
    let image = req.image.unwrap_or_default();
    let (name, result) = match local_image(&image) {
        Ok(name) => match m.st().images.resolve(&name) {
            Ok(_) => (name, ok()),
            Err(e) => (name, failed(e.to_string())),
        },
        Err(why) => ("unbuilt".to_owned(), failed(why)),
    };
    Ok(ImageGetOrCreateResponse {
        image_id: ids::image(&name),
        result: Some(result),
    })
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

async fn image_from_id(m: Modal, req: ImageFromIdRequest) -> Result<ImageFromIdResponse> {
    let name = ids::image_of(&req.image_id)?;
    m.st()
        .images
        .resolve(&name)
        .map_err(|e| ModalError::NotFound(e.to_string()))?;
    Ok(ImageFromIdResponse {
        image_id: req.image_id,
    })
}

/// The local image an image layer stands for, or why there is none.
///
/// A layer with no base images starts `FROM` a registry name. `python:<version>-slim-<debian>`
/// is the base of `debian_slim()`, whose further steps (apt and pip set-up) Belljar's Python
/// image needs no more than it needs Modal's registry; any other name must be the whole layer
/// (`from_registry(name)`).
fn local_image(image: &Image) -> std::result::Result<String, String> {
    let not_yet = "Belljar does not build images yet: use Image.debian_slim() or \
                   Image.from_registry() of a local image, with no further steps";
    if !image.base_images.is_empty()
        || !image.context_files.is_empty()
        || !image.secret_ids.is_empty()
        || !image.context_mount_id.is_empty()
    {
        return Err(not_yet.into());
    }
    let (first, rest) = image
        .dockerfile_commands
        .split_first()
        .ok_or_else(|| not_yet.to_owned())?;
    let tag = first
        .strip_prefix("FROM ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| not_yet.to_owned())?;
    if is_debian_slim(tag) {
        return Ok(DEBIAN_SLIM.into());
    }
    if !rest.is_empty() {
        return Err(not_yet.into());
    }
    Ok(tag.to_owned())
}

/// Whether `tag` is the registry image `debian_slim()` starts from.
fn is_debian_slim(tag: &str) -> bool {
    tag.strip_prefix("python:")
        .is_some_and(|v| v.contains("-slim-") && v.starts_with(|c: char| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(commands: &[&str]) -> Image {
        Image {
            dockerfile_commands: commands.iter().map(|c| c.to_string()).collect(),
            ..Image::default()
        }
    }

    #[test]
    fn debian_slim_and_registry_names_are_local_images() {
        let slim = layer(&[
            "FROM python:3.11.9-slim-bookworm",
            "RUN apt-get update",
            "RUN pip install --upgrade pip",
        ]);
        assert_eq!(local_image(&slim).unwrap(), DEBIAN_SLIM);
        assert_eq!(
            local_image(&layer(&["FROM alpine:3.20"])).unwrap(),
            "alpine:3.20"
        );
        assert!(local_image(&layer(&["FROM alpine:3.20", "RUN apk add git"])).is_err());
        let mut on_top = layer(&["FROM base", "RUN echo hi"]);
        on_top
            .base_images
            .push(super::super::wire::BaseImage::default());
        assert!(local_image(&on_top).is_err());
        assert!(local_image(&layer(&[])).is_err());
    }
}
