//! `GET /v1/openapi.json`: the OpenAPI document, built from the route table below and the
//! wire types' utoipa schemas, so that the schemas can never drift from the code.

use belljar_api as api;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::{
    ComponentsBuilder, ContentBuilder, InfoBuilder, OpenApi, OpenApiBuilder, PathItem,
    PathsBuilder, Ref, Required, ResponseBuilder,
};

/// What a request carries or a response holds.
#[derive(Clone, Copy)]
enum Body {
    None,
    /// A JSON schema by name.
    Json(&'static str),
    /// A JSON array of a schema.
    JsonList(&'static str),
    /// NDJSON lines of a schema.
    Ndjson(&'static str),
    /// Raw bytes of a media type.
    Raw(&'static str),
}

struct Route {
    method: HttpMethod,
    path: &'static str,
    summary: &'static str,
    query: &'static [&'static str],
    request: Body,
    status: &'static str,
    response: Body,
}

const fn r(
    method: HttpMethod,
    path: &'static str,
    summary: &'static str,
    query: &'static [&'static str],
    request: Body,
    status: &'static str,
    response: Body,
) -> Route {
    Route {
        method,
        path,
        summary,
        query,
        request,
        status,
        response,
    }
}

use Body::{Json, JsonList, Ndjson, None as Nothing, Raw};
use HttpMethod::{Delete, Get, Patch, Post, Put};

const S: &str = "/v1/sandboxes/{id}";

fn routes() -> Vec<Route> {
    vec![
        r(
            Get,
            "/v1/info",
            "The daemon, its backends and images",
            &[],
            Nothing,
            "200",
            Json("Info"),
        ),
        r(
            Get,
            "/v1/events",
            "Sandbox and command changes (also a WebSocket)",
            &["since"],
            Nothing,
            "200",
            Ndjson("Event"),
        ),
        r(
            Post,
            "/v1/session/token",
            "A one-time token for GET /ui?token=",
            &[],
            Nothing,
            "200",
            Json("SessionToken"),
        ),
        r(
            Get,
            "/v1/images",
            "Images",
            &[],
            Nothing,
            "200",
            JsonList("Image"),
        ),
        r(
            Post,
            "/v1/images/{name}/build",
            "Build an image",
            &[],
            Nothing,
            "200",
            Ndjson("ImageBuildEvent"),
        ),
        r(
            Post,
            "/v1/sandboxes",
            "Create a sandbox",
            &[],
            Json("CreateSandbox"),
            "201",
            Json("Sandbox"),
        ),
        r(
            Get,
            "/v1/sandboxes",
            "List sandboxes, newest first",
            &["status", "tag", "since", "until", "limit", "cursor"],
            Nothing,
            "200",
            Json("SandboxList"),
        ),
        r(
            Get,
            S,
            "Get a sandbox",
            &[],
            Nothing,
            "200",
            Json("Sandbox"),
        ),
        r(
            Patch,
            S,
            "Replace tags or the name",
            &[],
            Json("UpdateSandbox"),
            "200",
            Json("Sandbox"),
        ),
        r(
            Delete,
            S,
            "Stop and delete a sandbox",
            &[],
            Nothing,
            "204",
            Nothing,
        ),
        r(
            Post,
            "/v1/sandboxes/{id}/extend",
            "Add time",
            &[],
            Json("ExtendSandbox"),
            "200",
            Json("Sandbox"),
        ),
        r(
            Post,
            "/v1/sandboxes/{id}/stop",
            "Stop a sandbox",
            &[],
            Nothing,
            "200",
            Json("Sandbox"),
        ),
        r(
            Post,
            "/v1/sandboxes/{id}/commands",
            "Run a command",
            &[],
            Json("RunCommand"),
            "200",
            Json("Command"),
        ),
        r(
            Get,
            "/v1/sandboxes/{id}/commands",
            "List commands",
            &[],
            Nothing,
            "200",
            Json("CommandList"),
        ),
        r(
            Get,
            "/v1/sandboxes/{id}/commands/{cid}",
            "Get (or wait for) a command",
            &["wait"],
            Nothing,
            "200",
            Json("Command"),
        ),
        r(
            Get,
            "/v1/sandboxes/{id}/commands/{cid}/logs",
            "A command's output",
            &["follow"],
            Nothing,
            "200",
            Ndjson("LogLine"),
        ),
        r(
            Post,
            "/v1/sandboxes/{id}/commands/{cid}/kill",
            "Signal a command",
            &[],
            Json("KillCommand"),
            "200",
            Json("Command"),
        ),
        r(
            Post,
            "/v1/sandboxes/{id}/commands/{cid}/stdin",
            "Write to a command's stdin",
            &["close"],
            Raw("application/octet-stream"),
            "204",
            Nothing,
        ),
        r(
            Post,
            "/v1/sandboxes/{id}/commands/{cid}/resize",
            "Resize a command's PTY",
            &[],
            Json("PtySize"),
            "204",
            Nothing,
        ),
        r(
            Get,
            "/v1/sandboxes/{id}/files",
            "Read a file",
            &["path"],
            Nothing,
            "200",
            Raw("application/octet-stream"),
        ),
        r(
            Put,
            "/v1/sandboxes/{id}/files",
            "Write a file (parents created)",
            &["path", "mode"],
            Raw("application/octet-stream"),
            "200",
            Json("FileEntry"),
        ),
        r(
            Delete,
            "/v1/sandboxes/{id}/files",
            "Remove a file or directory",
            &["path", "recursive"],
            Nothing,
            "204",
            Nothing,
        ),
        r(
            Get,
            "/v1/sandboxes/{id}/files/list",
            "List a directory, one page at a time",
            &["path", "limit", "cursor"],
            Nothing,
            "200",
            Json("FileList"),
        ),
        r(
            Get,
            "/v1/sandboxes/{id}/files/stat",
            "A file's metadata",
            &["path"],
            Nothing,
            "200",
            Json("FileEntry"),
        ),
        r(
            Post,
            "/v1/sandboxes/{id}/files/mkdir",
            "Make a directory (with parents)",
            &[],
            Json("MkdirRequest"),
            "200",
            Json("FileEntry"),
        ),
        r(
            Post,
            "/v1/sandboxes/{id}/files/move",
            "Move or rename",
            &[],
            Json("MoveRequest"),
            "200",
            Json("FileEntry"),
        ),
        r(
            Get,
            "/v1/sandboxes/{id}/files/tar",
            "Download a tree as tar",
            &["path"],
            Nothing,
            "200",
            Raw("application/x-tar"),
        ),
        r(
            Put,
            "/v1/sandboxes/{id}/files/tar",
            "Extract a tar under a path",
            &["path"],
            Raw("application/x-tar"),
            "204",
            Nothing,
        ),
        r(
            Get,
            "/v1/sandboxes/{id}/files/watch",
            "Watch a path (also a WebSocket)",
            &["path", "recursive"],
            Nothing,
            "200",
            Ndjson("WatchEvent"),
        ),
        r(
            Get,
            "/v1/sandboxes/{id}/files/thumbnail",
            "A PNG thumbnail of an image file",
            &["path", "size"],
            Nothing,
            "200",
            Raw("image/png"),
        ),
        r(
            Get,
            "/v1/sandboxes/{id}/terminal",
            "An interactive shell (WebSocket only)",
            &["rows", "cols", "cwd", "sudo"],
            Nothing,
            "101",
            Nothing,
        ),
    ]
}

fn content(body: Body) -> Option<(String, utoipa::openapi::Content)> {
    match body {
        Body::None => None,
        Body::Json(name) => Some((
            "application/json".into(),
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(name)))
                .build(),
        )),
        Body::JsonList(name) => Some((
            "application/json".into(),
            ContentBuilder::new()
                .schema(Some(
                    utoipa::openapi::schema::ArrayBuilder::new().items(Ref::from_schema_name(name)),
                ))
                .build(),
        )),
        Body::Ndjson(name) => Some((
            api::routes::NDJSON.into(),
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(name)))
                .build(),
        )),
        Body::Raw(media) => Some((media.into(), ContentBuilder::new().build())),
    }
}

/// The whole document.
pub fn document() -> OpenApi {
    let mut paths = PathsBuilder::new();
    for route in routes() {
        let mut op = OperationBuilder::new().summary(Some(route.summary));
        for name in ["id", "cid", "name"] {
            if route.path.contains(&format!("{{{name}}}")) {
                op = op.parameter(
                    ParameterBuilder::new()
                        .name(name)
                        .parameter_in(ParameterIn::Path)
                        .required(Required::True),
                );
            }
        }
        for q in route.query {
            op = op.parameter(
                ParameterBuilder::new()
                    .name(*q)
                    .parameter_in(ParameterIn::Query)
                    .required(if *q == "path" {
                        Required::True
                    } else {
                        Required::False
                    }),
            );
        }
        if let Some((media, c)) = content(route.request) {
            op = op.request_body(Some(RequestBodyBuilder::new().content(media, c).build()));
        }
        let mut ok = ResponseBuilder::new().description("Success");
        if let Some((media, c)) = content(route.response) {
            ok = ok.content(media, c);
        }
        let err = ResponseBuilder::new()
            .description("An error: 400 bad_request, 401, 403, 404 not_found, 409, 502, 507")
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            );
        let op = op.response(route.status, ok).response("default", err);
        paths = paths.path(route.path, PathItem::new(route.method, op));
    }
    let components = ComponentsBuilder::new()
        .schema_from::<api::ErrorBody>()
        .schema_from::<api::ErrorDetail>()
        .schema_from::<api::SandboxStatus>()
        .schema_from::<api::Backend>()
        .schema_from::<api::BackendChoice>()
        .schema_from::<api::Source>()
        .schema_from::<api::CreateSandbox>()
        .schema_from::<api::LimitsReport>()
        .schema_from::<api::LimitState>()
        .schema_from::<api::Sandbox>()
        .schema_from::<api::SandboxList>()
        .schema_from::<api::UpdateSandbox>()
        .schema_from::<api::ExtendSandbox>()
        .schema_from::<api::PtySize>()
        .schema_from::<api::RunCommand>()
        .schema_from::<api::CommandStatus>()
        .schema_from::<api::Command>()
        .schema_from::<api::CommandList>()
        .schema_from::<api::Stream>()
        .schema_from::<api::LogLine>()
        .schema_from::<api::KillCommand>()
        .schema_from::<api::TerminalMessage>()
        .schema_from::<api::FileKind>()
        .schema_from::<api::FileEntry>()
        .schema_from::<api::FileList>()
        .schema_from::<api::MkdirRequest>()
        .schema_from::<api::MoveRequest>()
        .schema_from::<api::WatchKind>()
        .schema_from::<api::WatchEvent>()
        .schema_from::<api::Event>()
        .schema_from::<api::BackendInfo>()
        .schema_from::<api::Info>()
        .schema_from::<api::SessionToken>()
        .schema_from::<api::ImageStatus>()
        .schema_from::<api::Image>()
        .schema_from::<api::ImageBuildEvent>()
        .build();
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("Belljar daemon API")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "Local, disposable Linux sandboxes. Over TCP every /v1 request needs \
                     `Authorization: Bearer <token>` or the session cookie.",
                ))
                .build(),
        )
        .paths(paths.build())
        .components(Some(components))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_referenced_schema_is_defined_and_every_route_is_there() {
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
        let paths = doc["paths"].as_object().unwrap();
        assert!(paths["/v1/sandboxes"]["post"].is_object());
        assert!(paths["/v1/sandboxes"]["get"].is_object());
        assert!(paths["/v1/sandboxes/{id}/files"]["put"].is_object());
        assert_eq!(paths.len(), 24);
    }
}
