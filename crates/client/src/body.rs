//! Request and answer bodies: empty, in memory, JSON, or streamed chunk by chunk from a file,
//! a tar builder or another sandbox's download, so no transfer is held in memory.

use std::io;

use bytes::Bytes;
use futures::{Stream, TryStreamExt};
use http::Response;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde::Serialize;

use crate::ClientError;

/// The error of a streamed request body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Any request body: empty, in memory, or streamed from a file or a tar builder.
pub type Body = BoxBody<Bytes, BoxError>;

/// An empty request body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// A request body held in memory.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A request body streamed chunk by chunk.
pub fn streamed<S>(stream: S) -> Body
where
    S: Stream<Item = io::Result<Bytes>> + Send + Sync + 'static,
{
    let frames = stream
        .map_ok(Frame::data)
        .map_err(|e| Box::new(e) as BoxError);
    BodyExt::boxed(StreamBody::new(frames))
}

/// A JSON request body.
pub fn json<T: Serialize>(value: &T) -> Body {
    full(serde_json::to_vec(value).expect("API types always serialize"))
}

/// A streamed answer (a file's bytes, a tar stream), read as it arrives.
#[derive(Debug)]
pub struct Download {
    resp: Response<Incoming>,
}

impl Download {
    pub(crate) fn new(resp: Response<Incoming>) -> Self {
        Self { resp }
    }

    /// The length the daemon announced; a file whose size the sandbox's kernel does not
    /// know (`/proc`, `/sys`) comes without one and is read to its end.
    pub fn content_length(&self) -> Option<u64> {
        self.resp
            .headers()
            .get(http::header::CONTENT_LENGTH)?
            .to_str()
            .ok()?
            .parse()
            .ok()
    }

    /// The next chunk, or `None` at the end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
        while let Some(frame) = self.resp.body_mut().frame().await {
            if let Ok(data) = frame?.into_data() {
                return Ok(Some(data));
            }
        }
        Ok(None)
    }

    /// The whole answer in memory.
    pub async fn bytes(self) -> Result<Bytes, ClientError> {
        Ok(self.resp.into_body().collect().await?.to_bytes())
    }

    /// The body, to pass on as another request's body (sandbox to sandbox) unread.
    pub fn into_body(self) -> Incoming {
        self.resp.into_body()
    }
}
