//! The Connect protocol as envd speaks it with the SDKs' JSON codec: a unary call is a JSON
//! body answered with a JSON body (an error: a Connect error with its status); a
//! server-streaming call sends one enveloped message and gets enveloped messages back, the
//! last one flagged end-of-stream and carrying the error, if any. An envelope is a flags byte,
//! a big-endian 32-bit length and the message.

use std::convert::Infallible;

use axum::Json;
use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use belljar_api::limits::MAX_JSON_BODY;
use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::error::{E2bError, Result};
use super::wire::EndOfStream;
use crate::http::error::ApiError;

/// The flag of the last envelope of a stream.
const END_STREAM: u8 = 0x02;
/// The flag of a compressed envelope, which the SDKs never send (compression is off).
const COMPRESSED: u8 = 0x01;

/// The whole body, at most [`MAX_JSON_BODY`] bytes.
async fn read_body(body: Body) -> Result<Bytes> {
    let limited = http_body_util::Limited::new(body, MAX_JSON_BODY);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::PayloadTooLarge(MAX_JSON_BODY).into())
        }
        Err(e) => Err(E2bError::BadRequest(format!("body: {e}"))),
    }
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| E2bError::BadRequest(format!("message: {e}")))
}

/// A unary request's message.
pub async fn unary<T: DeserializeOwned>(body: Body) -> Result<T> {
    parse(&read_body(body).await?)
}

/// A server-streaming request's one message, out of its envelope.
pub async fn stream_request<T: DeserializeOwned>(body: Body) -> Result<T> {
    let bytes = read_body(body).await?;
    let message = unenvelope(&bytes)?;
    parse(message)
}

fn unenvelope(bytes: &[u8]) -> Result<&[u8]> {
    let Some((head, rest)) = bytes.split_first_chunk::<5>() else {
        return Err(E2bError::BadRequest(
            "envelope: shorter than 5 bytes".into(),
        ));
    };
    if head[0] & COMPRESSED != 0 {
        return Err(E2bError::BadRequest(
            "envelope: compressed messages are not accepted".into(),
        ));
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    rest.get(..len)
        .ok_or_else(|| E2bError::BadRequest("envelope: shorter than its length".into()))
}

/// `message` in an envelope with `flags`.
fn envelope(flags: u8, message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(flags);
    out.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    out.put_slice(message);
    out.freeze()
}

/// A unary answer.
pub fn ok<T: Serialize>(message: &T) -> Response {
    Json(message).into_response()
}

/// The sending half of a server stream.
pub struct Sender(mpsc::Sender<Result<Bytes, Infallible>>);

impl Sender {
    /// Sends one message; `false` when the client went away.
    pub async fn send<T: Serialize>(&self, message: &T) -> bool {
        let json = serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec());
        self.0.send(Ok(envelope(0, &json))).await.is_ok()
    }

    /// Ends the stream, with `error` if it failed.
    pub async fn end(self, error: Option<&E2bError>) {
        let end = EndOfStream {
            error: error.map(E2bError::connect),
        };
        let json = serde_json::to_vec(&end).unwrap_or_else(|_| b"{}".to_vec());
        let _ = self.0.send(Ok(envelope(END_STREAM, &json))).await;
    }
}

/// A server stream's answer and the sender that feeds it.
pub fn stream() -> (Sender, Response) {
    let (tx, rx) = mpsc::channel(16);
    let response = (
        [(header::CONTENT_TYPE, "application/connect+json")],
        Body::from_stream(ReceiverStream::new(rx)),
    )
        .into_response();
    (Sender(tx), response)
}

/// A stream that fails before its first message: Connect sends the error as its end.
pub async fn stream_error(e: E2bError) -> Response {
    let (tx, response) = stream();
    tx.end(Some(&e)).await;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_bad_ones_are_refused() {
        let e = envelope(0, br#"{"a":1}"#);
        assert_eq!(&e[..5], &[0, 0, 0, 0, 7]);
        assert_eq!(unenvelope(&e).unwrap(), br#"{"a":1}"#);
        assert!(unenvelope(&e[..4]).is_err());
        assert!(unenvelope(&e[..8]).is_err());
        let mut compressed = e.to_vec();
        compressed[0] = COMPRESSED;
        assert!(unenvelope(&compressed).is_err());
    }

    #[test]
    fn an_empty_message_is_the_default() {
        let v: super::super::wire::PathRequest = parse(b"").unwrap();
        assert_eq!(v.path, "");
        assert!(parse::<super::super::wire::PathRequest>(b"[").is_err());
    }
}
