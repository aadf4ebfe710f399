//! The control plane's routes, and the objects a sandbox is made from: the handshake, apps,
//! the environment and secrets (images are [`images`]'s).
//!
//! Apps have nothing of their own here: an app's id follows from its name ([`ids::app`]) and
//! its sandboxes carry it in a tag. Secrets made from a dict (which is how `Sandbox.create`
//! sends `env=`) live in the daemon's memory only; named secrets (`Secret.objects.create`,
//! `Secret.from_name`) in its store, by environment and name, and nowhere else.

use hyper::body::Incoming;

use super::error::{ModalError, Result};
use super::wire::{
    AppGetOrCreateRequest, AppGetOrCreateResponse, AppHandleMetadata, ClientHelloResponse, Empty,
    EnvironmentGetOrCreateRequest, EnvironmentGetOrCreateResponse, EnvironmentMetadata,
    EnvironmentSettings, SecretDeleteRequest, SecretGetOrCreateRequest, SecretGetOrCreateResponse,
    SecretMetadata, creation,
};
use super::{Modal, ids, images, sandboxes, streaming, tags, unary, volumes};
use crate::sandbox::SandboxError;
use crate::store::ModalSecret;
use crate::util::now_ms;

/// The image builder version the environment reports: one the tested client knows.
pub const BUILDER_VERSION: &str = "2025.06";
/// The environment every app is in.
const ENVIRONMENT: &str = "main";
const ENVIRONMENT_ID: &str = "en-BelljarLocal";

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
        "SecretDelete" => unary(req, |r| secret_delete(m.clone(), r)).await,
        "SandboxCreate" => unary(req, |r| sandboxes::create(m.clone(), r)).await,
        "SandboxGetTaskId" => unary(req, |r| sandboxes::task_id(m.clone(), r)).await,
        "SandboxWait" => unary(req, |r| sandboxes::wait(m.clone(), r)).await,
        "SandboxTerminate" => unary(req, |r| sandboxes::terminate(m.clone(), r)).await,
        "SandboxTagsSet" => unary(req, |r| tags::set(m.clone(), r)).await,
        "SandboxTagsGet" => unary(req, |r| tags::get(m.clone(), r)).await,
        "SandboxList" => unary(req, |r| tags::list(m.clone(), r)).await,
        "SandboxGetFromName" => unary(req, |r| tags::from_name(m.clone(), r)).await,
        "SandboxGetLogs" => streaming(req, |r| sandboxes::logs(m.clone(), r)).await,
        "SandboxStdinWrite" => unary(req, |r| sandboxes::stdin_write(m.clone(), r)).await,
        "TaskGetCommandRouterAccess" => unary(req, |r| sandboxes::router(m.clone(), r)).await,
        m2 if m2.starts_with("Image") => return images::route(&m, method, req).await,
        m2 if m2.starts_with("Volume") => return volumes::route(&m, method, req).await,
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
    if req.deployment_name.is_empty() {
        // `Secret.from_dict` (and `env=`): in memory only, for as long as the daemon runs.
        let id = format!("st-{}", random_tail());
        let keys = keys_of(&req.env_dict);
        m.keep_secret(&id, req.env_dict);
        return Ok(answer(id, String::new(), keys));
    }
    let store = m.st().sandboxes.store().clone();
    let environment = environment_name(&req.environment_name).to_owned();
    let name = req.deployment_name;
    let stored = |e: crate::store::StoreError| ModalError::from(SandboxError::from(e));
    let existing = store
        .modal_secret_named(&environment, &name)
        .map_err(stored)?;
    let secret = match (req.object_creation_type, existing) {
        (creation::LOOKUP | creation::CREATE_IF_MISSING, Some(found)) => found,
        (creation::CREATE_FAIL_IF_EXISTS, Some(_)) => {
            return Err(ModalError::AlreadyExists(format!(
                "Secret '{name}' already exists in environment '{environment}'"
            )));
        }
        (creation::LOOKUP, None) => {
            return Err(ModalError::NotFound(format!(
                "Secret '{name}' not found in environment '{environment}'"
            )));
        }
        (
            creation::CREATE_IF_MISSING
            | creation::CREATE_FAIL_IF_EXISTS
            | creation::CREATE_OVERWRITE_IF_EXISTS,
            _,
        ) => {
            let new = ModalSecret {
                id: format!("st-{}", random_tail()),
                env: req.env_dict,
            };
            let replace = req.object_creation_type == creation::CREATE_OVERWRITE_IF_EXISTS;
            let put = store.put_modal_secret(&environment, &name, &new, now_ms(), replace);
            if !put.map_err(stored)? {
                // Made by another request since the lookup: that one is the secret.
                store
                    .modal_secret_named(&environment, &name)
                    .map_err(stored)?
                    .ok_or_else(|| {
                        ModalError::Conflict(format!("Secret '{name}' changed; try again"))
                    })?
            } else {
                new
            }
        }
        (other, _) => {
            return Err(ModalError::BadRequest(format!(
                "object_creation_type: {other} is not served for named secrets"
            )));
        }
    };
    let missing: Vec<&str> = req
        .required_keys
        .iter()
        .filter(|k| !secret.env.contains_key(*k))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(ModalError::NotFound(format!(
            "Secret '{name}' is missing the keys {}",
            missing.join(", ")
        )));
    }
    let keys = keys_of(&secret.env);
    Ok(answer(secret.id, name, keys))
}

fn keys_of(env: &std::collections::HashMap<String, String>) -> Vec<String> {
    let mut keys: Vec<String> = env.keys().cloned().collect();
    keys.sort();
    keys
}

fn answer(secret_id: String, name: String, keys: Vec<String>) -> SecretGetOrCreateResponse {
    SecretGetOrCreateResponse {
        secret_id,
        metadata: Some(SecretMetadata { name, keys }),
    }
}

/// Deletes a named secret (`Secret.objects.delete`).
async fn secret_delete(m: Modal, req: SecretDeleteRequest) -> Result<Empty> {
    let deleted = m
        .st()
        .sandboxes
        .store()
        .delete_modal_secret(&req.secret_id)
        .map_err(|e| ModalError::from(SandboxError::from(e)))?;
    if !deleted {
        return Err(ModalError::NotFound(format!(
            "Secret {} not found",
            req.secret_id
        )));
    }
    Ok(Empty {})
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
