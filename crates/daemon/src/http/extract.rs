//! Extractors whose rejections are our own errors naming the field, instead of axum's plain
//! text ones, and which check every body and query against its bounds
//! ([`belljar_api::limits`]) before a handler sees it; and a layer that gives the rejections
//! axum still makes on its own the same error shape.

use axum::Json;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use belljar_api::limits::MAX_JSON_BODY;
use belljar_api::{ErrorBody, ErrorCode, Validate};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON object body, within its bounds; an empty body counts as `{}` so that bodies with
/// only optional fields may be left out. Any content type is accepted (the CLI and curl users
/// forget it). At most [`MAX_JSON_BODY`] bytes are read (413 beyond).
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned + Validate, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let body = Limited::new(req.into_body(), MAX_JSON_BODY);
        let bytes = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                return Err(ApiError::PayloadTooLarge(MAX_JSON_BODY));
            }
            Err(e) => return Err(ApiError::BadRequest(format!("body: {e}"))),
        };
        let value: T = parse_json(&bytes)?;
        value
            .validate()
            .map_err(|e| ApiError::BadRequest(e.to_string()))?;
        Ok(ApiJson(value))
    }
}

/// Parses a JSON object, naming the offending field in the error. Anything but an object is
/// refused first: serde reads a struct from a JSON array too (`[null,null]` would be a
/// `CreateSandbox`), which no client means.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        None => b"{}",
        Some(b'{') => bytes,
        Some(_) => return Err(ApiError::BadRequest("body: must be a JSON object".into())),
    };
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let field = if path.is_empty() || path == "." || path == "?" {
            "body".to_owned()
        } else {
            path
        };
        ApiError::BadRequest(format!("{field}: {inner}"))
    })
}

/// A query string, within its bounds.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned + Validate, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(q) = Query::<T>::from_request_parts(parts, state)
            .await
            .map_err(|e| {
                ApiError::BadRequest(
                    e.body_text()
                        .replace("Failed to deserialize query string: ", ""),
                )
            })?;
        q.validate()
            .map_err(|e| ApiError::BadRequest(e.to_string()))?;
        Ok(ApiQuery(q))
    }
}

/// Path parameters. A malformed one (bad percent-encoding, not UTF-8) is a 400 naming it.
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(p)| ApiPath(p))
            .map_err(|e| ApiError::BadRequest(format!("path: {}", e.body_text())))
    }
}

/// Turns the plain-text answers axum makes on its own under `/v1` and `/compat/` (a path segment that is
/// not UTF-8 once decoded, a WebSocket route asked without an upgrade, a method the route
/// does not have) into `{"error":{"code","message"}}` with the same status. Answers that are
/// already JSON, and everything outside the API (the web UI), pass unchanged.
pub async fn json_rejections(req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let api = path == "/v1" || path.starts_with("/v1/") || path.starts_with("/compat/");
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"application/json"));
    if !api || is_json || !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let code = match status {
        StatusCode::UNAUTHORIZED => ErrorCode::Unauthorized,
        StatusCode::FORBIDDEN => ErrorCode::Forbidden,
        StatusCode::NOT_FOUND => ErrorCode::NotFound,
        s if s.is_server_error() => ErrorCode::Internal,
        _ => ErrorCode::BadRequest,
    };
    // axum's rejection texts are one short line; a longer body is not one of them.
    let text = axum::body::to_bytes(resp.into_body(), 4096)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_owned();
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("Bad request")
            .to_owned()
    } else {
        text
    };
    (status, Json(ErrorBody::new(code, message))).into_response()
}

#[cfg(test)]
mod tests {
    use belljar_api::{CreateSandbox, ExtendSandbox, RunCommand, UpdateSandbox};

    use super::*;

    fn message(e: ApiError) -> String {
        match e {
            ApiError::BadRequest(m) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_bodies_name_their_field() {
        let e = parse_json::<CreateSandbox>(br#"{"timeout_ms":"soon"}"#)
            .err()
            .unwrap();
        assert!(message(e).starts_with("timeout_ms: invalid type"));
        let e = parse_json::<CreateSandbox>(br#"{"vcpus":2,"colour":"red"}"#)
            .err()
            .unwrap();
        assert!(message(e).contains("unknown field `colour`"));
        let e = parse_json::<ExtendSandbox>(b"").err().unwrap();
        assert!(message(e).contains("duration_ms"));
        let e = parse_json::<RunCommand>(b"{not json").err().unwrap();
        assert!(message(e).starts_with("body: "));
        let ok: CreateSandbox = parse_json(b"  ").unwrap();
        assert_eq!(ok, CreateSandbox::default());
    }

    #[test]
    fn only_objects_are_bodies() {
        for body in [&b"[null,null]"[..], b" [] ", b"null", b"1", b"\"x\""] {
            let e = parse_json::<CreateSandbox>(body).err().unwrap();
            assert_eq!(message(e), "body: must be a JSON object");
            assert!(parse_json::<UpdateSandbox>(body).is_err());
        }
    }
}
