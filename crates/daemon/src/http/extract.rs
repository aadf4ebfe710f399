//! Extractors whose rejections are our own `bad_request` errors naming the field, instead of
//! axum's plain-text ones.

use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// The largest JSON body accepted.
const MAX_JSON: usize = 1 << 20;

/// A JSON body; an empty body counts as `{}` so that bodies with only optional fields may be
/// left out. Any content type is accepted (the CLI and curl users forget it).
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::BadRequest(format!("body: {}", e.body_text())))?;
        if bytes.len() > MAX_JSON {
            return Err(ApiError::BadRequest("body: larger than 1 MiB".into()));
        }
        parse_json(&bytes).map(ApiJson)
    }
}

/// Parses JSON, naming the offending field in the error.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
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

/// A query string.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| ApiQuery(q))
            .map_err(|e| {
                ApiError::BadRequest(
                    e.body_text()
                        .replace("Failed to deserialize query string: ", ""),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use belljar_api::{CreateSandbox, ExtendSandbox, RunCommand};

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
}
