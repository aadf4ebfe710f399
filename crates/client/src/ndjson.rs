//! Reads NDJSON answers (logs, events, watches, image builds) line by line as they arrive,
//! without waiting for the stream to end.

use std::marker::PhantomData;

use bytes::{Buf, Bytes, BytesMut};
use futures::Stream;
use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};
use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error)]
pub enum NdjsonError {
    /// The stream broke off.
    #[error("Stream from the daemon broke off: {0}")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A line is not the JSON the API promises.
    #[error("Unexpected line from the daemon: {source}: {line}")]
    Decode {
        line: String,
        source: serde_json::Error,
    },
}

/// A line reader over any HTTP body.
pub struct Lines<B = Incoming> {
    body: B,
    buf: BytesMut,
    done: bool,
}

impl<B> Lines<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    pub fn new(body: B) -> Self {
        Self {
            body,
            buf: BytesMut::new(),
            done: false,
        }
    }

    /// The next non-empty line without its newline, or `None` at the end of the stream.
    pub async fn next_line(&mut self) -> Result<Option<Bytes>, NdjsonError> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line = self.buf.split_to(pos).freeze();
                self.buf.advance(1);
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(line));
            }
            if self.done {
                if self.buf.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                return Ok(Some(self.buf.split().freeze()));
            }
            match self.body.frame().await {
                None => self.done = true,
                Some(Err(e)) => return Err(NdjsonError::Body(e.into())),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// The next line decoded as `T`.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, NdjsonError> {
        match self.next_line().await? {
            None => Ok(None),
            Some(line) => decode_line(&line).map(Some),
        }
    }
}

/// A streamed answer of one API type per line: command logs, events, watches, image builds.
pub struct NdjsonStream<T> {
    lines: Lines<Incoming>,
    item: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> NdjsonStream<T> {
    pub(crate) fn new(body: Incoming) -> Self {
        Self {
            lines: Lines::new(body),
            item: PhantomData,
        }
    }

    /// The next item, or `None` once the daemon ended the stream.
    pub async fn next(&mut self) -> Result<Option<T>, NdjsonError> {
        self.lines.next().await
    }

    /// The next line as the daemon sent it, undecoded (for `--json` output).
    pub async fn next_line(&mut self) -> Result<Option<Bytes>, NdjsonError> {
        self.lines.next_line().await
    }

    /// The items as a [`Stream`], for `select!` and combinators.
    pub fn into_stream(self) -> impl Stream<Item = Result<T, NdjsonError>> + Send + 'static
    where
        T: Send + 'static,
    {
        futures::stream::unfold(self, |mut s| async move {
            s.next().await.transpose().map(|item| (item, s))
        })
    }
}

/// Decodes one NDJSON line as `T`.
pub fn decode_line<T: DeserializeOwned>(line: &[u8]) -> Result<T, NdjsonError> {
    serde_json::from_slice(line).map_err(|source| NdjsonError::Decode {
        line: String::from_utf8_lossy(line).into_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    #[tokio::test]
    async fn splits_lines_across_chunks() {
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"{\"a\":1}\n{\"a\""))),
            Ok(Frame::data(Bytes::from_static(b":2}\n\n"))),
            Ok(Frame::data(Bytes::from_static(b"{\"a\":3}"))),
        ];
        let mut lines = Lines::new(StreamBody::new(stream::iter(chunks)));
        let mut got = Vec::new();
        while let Some(v) = lines.next::<serde_json::Value>().await.unwrap() {
            got.push(v["a"].as_i64().unwrap());
        }
        assert_eq!(got, vec![1, 2, 3]);
    }

    #[tokio::test]
    async fn bad_json_is_an_error() {
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> =
            vec![Ok(Frame::data(Bytes::from_static(b"nope\n")))];
        let mut lines = Lines::new(StreamBody::new(stream::iter(chunks)));
        assert!(lines.next::<serde_json::Value>().await.is_err());
    }
}
