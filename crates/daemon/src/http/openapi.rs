//! `GET /v1/openapi.json`: the OpenAPI document, generated from the handlers themselves.
//!
//! Every API route is registered through `utoipa_axum`'s `routes!`, which takes each handler's
//! `#[utoipa::path]` (method, path, parameters, body, every status) and adds the route and its
//! operation together, so the document and the router cannot differ. This module holds what
//! the operations share: the security schemes, the error responses, the path parameters and
//! the schema of raw bodies.

use belljar_api::ErrorBody;
use serde::Deserialize;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{OpenApi as Document, RefOr, Schema};
use utoipa::{IntoParams, IntoResponses, Modify, OpenApi, PartialSchema, ToSchema};

use super::auth::SESSION_COOKIE;

/// The document's frame: title, description, security; the operations come from the routers.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Belljar daemon API",
        description = "Local, disposable Linux sandboxes. Over TCP (127.0.0.1) every /v1 request \
            needs `Authorization: Bearer <token>` (the token is in `<config>/token`) or the \
            browser session cookie that `GET /ui?token=<one-time>` sets; over the user's Unix \
            socket none. Errors are `ErrorBody` with a stable `code`."
    ),
    modifiers(&SecuritySchemes),
    security(("bearer" = []), ("session" = [])),
    components(schemas(ErrorBody, belljar_api::ErrorDetail, belljar_api::ErrorCode))
)]
pub struct ApiDoc;

/// The bearer token and the browser UI's session cookie.
struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("The token in `<config>/token`"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "session",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                SESSION_COOKIE,
                "Set by `GET /ui?token=<one-time>` (see `POST /v1/session/token`)",
            ))),
        );
    }
}

/// The error answers every API operation may give, each an `ErrorBody` with its `code`.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum Errors {
    /// `bad_request` (the message names the field), `image_not_available`, or an agent code
    /// such as `invalid_path`, `is_a_directory`, `not_a_directory`, `exec_failed`,
    /// `unknown_user`, `not_an_image`.
    #[response(status = 400)]
    BadRequest(#[to_schema] ErrorBody),
    /// `unauthorized`: no or a wrong bearer token or session cookie (TCP only).
    #[response(status = 401)]
    Unauthorized(#[to_schema] ErrorBody),
    /// `forbidden`: a foreign `Origin` or a non-loopback `Host`; an image build asked of a
    /// daemon that is not root (the message names the command that builds it); or the agent's
    /// `permission_denied`.
    #[response(status = 403)]
    Forbidden(#[to_schema] ErrorBody),
    /// `not_found`: no such sandbox, command, image or file, or no such route;
    /// `volume_not_found`, `template_not_found`.
    #[response(status = 404)]
    NotFound(#[to_schema] ErrorBody),
    /// `sandbox_not_running`, `conflict`, `snapshot_not_usable`, or the agent's `exists`,
    /// `not_empty`, `command_finished`.
    #[response(status = 409)]
    Conflict(#[to_schema] ErrorBody),
    /// `payload_too_large`: a JSON body over 1 MiB.
    #[response(status = 413)]
    PayloadTooLarge(#[to_schema] ErrorBody),
    /// `internal`: a bug or an unexpected host failure; the details are in the daemon's log.
    #[response(status = 500)]
    Internal(#[to_schema] ErrorBody),
    /// `not_supported`: the sandbox's backend cannot do this yet.
    #[response(status = 501)]
    NotImplemented(#[to_schema] ErrorBody),
    /// `agent_unavailable` or another failure of the sandbox's agent.
    #[response(status = 502)]
    BadGateway(#[to_schema] ErrorBody),
    /// `backend_unavailable`: the requested backend cannot run on this host.
    #[response(status = 503)]
    Unavailable(#[to_schema] ErrorBody),
    /// `insufficient_resources` (host memory or disk) or the agent's `no_space`.
    #[response(status = 507)]
    InsufficientStorage(#[to_schema] ErrorBody),
}

/// `{id}`: a sandbox.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SandboxPath {
    /// The sandbox's id, `sbx_` and lowercase letters and digits.
    #[param(pattern = "^sbx_[a-z0-9]{1,64}$", max_length = 68)]
    pub id: String,
}

/// `{id}`: a snapshot.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SnapshotPath {
    /// The snapshot's id, `snap_` and lowercase letters and digits.
    #[param(pattern = "^snap_[a-z0-9]{1,64}$", max_length = 69)]
    pub id: String,
}

/// `{id}` and `{cid}`: a command of a sandbox.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct CommandPath {
    /// The sandbox's id.
    #[param(pattern = "^sbx_[a-z0-9]{1,64}$", max_length = 68)]
    pub id: String,
    /// The command's id, `cmd_` and lowercase letters and digits.
    #[param(pattern = "^cmd_[a-z0-9]{1,64}$", max_length = 68)]
    pub cid: String,
}

/// `{name}`: a volume.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct VolumePath {
    /// The volume's name.
    #[param(max_length = 64)]
    pub name: String,
}

/// `{name}`: a template.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TemplatePath {
    /// The template's name.
    #[param(max_length = 64)]
    pub name: String,
}

/// `{name}`: an image.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ImagePath {
    /// `base`, `python3.13`, `node24` or `node22`, or a pulled or imported image's name
    /// (`localhost:5000/app:1.0`, percent-encoded) or id.
    #[param(max_length = 512)]
    pub name: String,
}

/// Raw bytes of a request or response body (a file, a tar stream, stdin, a PNG).
pub struct RawBytes;

impl PartialSchema for RawBytes {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
            .into()
    }
}

impl ToSchema for RawBytes {}

/// The whole document of `router`'s operations.
pub fn document() -> Document {
    super::api_router().split_for_parts().1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_referenced_schema_is_defined() {
        let doc = serde_json::to_value(document()).unwrap();
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("#/components/schemas/") {
            rest = &rest[i + "#/components/schemas/".len()..];
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric()).collect();
            assert!(
                schemas.contains_key(&name),
                "{name} is referenced but not defined"
            );
        }
        let schemes = doc["components"]["securitySchemes"].as_object().unwrap();
        assert_eq!(schemes["bearer"]["scheme"], "bearer");
        assert_eq!(schemes["session"]["in"], "cookie");
    }

    #[test]
    fn every_operation_has_typed_parameters_and_every_error_status() {
        let doc = serde_json::to_value(document()).unwrap();
        let mut operations = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                operations += 1;
                for p in op["parameters"].as_array().into_iter().flatten() {
                    assert!(p["schema"].is_object(), "{method} {path}: {p}");
                    if p["in"] == "path" {
                        assert!(path.contains(&format!("{{{}}}", p["name"].as_str().unwrap())));
                    }
                }
                let statuses = op["responses"].as_object().unwrap();
                for s in [
                    "400", "401", "403", "404", "409", "413", "500", "501", "502", "503", "507",
                ] {
                    assert!(statuses.contains_key(s), "{method} {path} lacks {s}");
                }
            }
        }
        assert_eq!(operations, 68);
        let create = &doc["components"]["schemas"]["CreateSandbox"]["properties"];
        assert_eq!(create["vcpus"]["maximum"], 32);
        assert_eq!(create["disk_mib"]["maximum"], 1_048_576);
        assert_eq!(create["env"]["additionalProperties"]["maxLength"], 32_768);
    }
}
