//! One output stream of a daemon command, as the bytes Modal's readers ask for: from a byte
//! offset (what a reconnecting reader already has) to the end, following the command while it
//! runs. Both the sandbox's own streams (`SandboxGetLogs`) and an exec's (`TaskExecStdioRead`)
//! read the command's log this way.

use std::pin::Pin;

use base64::Engine;
use belljar_api::{LogLine, Stream};
use bytes::Bytes;
use futures::TryStreamExt;
use tokio::io::AsyncBufReadExt;
use tokio_util::io::StreamReader;

use crate::sandbox::{SandboxError, Sandboxes};

type Lines =
    StreamReader<Pin<Box<dyn futures::Stream<Item = std::io::Result<Bytes>> + Send>>, Bytes>;

/// A reader of one stream of one command.
pub struct Output {
    lines: Lines,
    which: Stream,
    /// Bytes still to pass over before the first one the reader wants.
    skip: u64,
    /// Bytes of the stream read so far, the skipped ones included.
    pub offset: u64,
    /// The line being read: kept when a read is cancelled half-way, cleared once handled.
    line: Vec<u8>,
}

impl Output {
    /// `which` stream of command `cid`, from byte `from`.
    pub fn open(
        sandboxes: &Sandboxes,
        sid: &str,
        cid: &str,
        which: Stream,
        from: u64,
    ) -> Result<Self, SandboxError> {
        let logs = sandboxes.command_logs(sid, cid, true)?;
        let logs: Pin<Box<dyn futures::Stream<Item = std::io::Result<Bytes>> + Send>> =
            Box::pin(logs.map_err(std::io::Error::other));
        Ok(Self {
            lines: StreamReader::new(logs),
            which,
            skip: from,
            offset: 0,
            line: Vec::new(),
        })
    }

    /// The next piece of the stream, `None` once the command has ended and all is read.
    /// Cancel-safe: a read cut short goes on where it stopped.
    pub async fn next(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        loop {
            if self.lines.read_until(b'\n', &mut self.line).await? == 0 {
                return Ok(None);
            }
            let piece = decode(&self.line)
                .filter(|(stream, _)| *stream == self.which)
                .map(|(_, bytes)| bytes);
            self.line.clear();
            let Some(bytes) = piece else {
                continue;
            };
            let len = bytes.len() as u64;
            let start = self.skip.min(len);
            self.skip -= start;
            self.offset += len;
            if start < len {
                // `start` is at most `len`, a length in memory.
                let start = usize::try_from(start).unwrap_or(bytes.len());
                return Ok(Some(bytes[start..].to_vec()));
            }
        }
    }
}

/// The stream and bytes of one line of a command's log.
fn decode(raw: &[u8]) -> Option<(Stream, Vec<u8>)> {
    let line: LogLine = serde_json::from_slice(raw).ok()?;
    let bytes = match (line.data, line.data_base64) {
        (Some(d), _) => d.into_bytes(),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD.decode(b).ok()?,
        (None, None) => return None,
    };
    Some((line.stream, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_decode_to_their_bytes() {
        let (s, b) = decode(br#"{"stream":"stderr","data":"hi","ts":1}"#).unwrap();
        assert_eq!((s, b.as_slice()), (Stream::Stderr, b"hi".as_slice()));
        let (_, b) = decode(br#"{"stream":"stdout","data_base64":"/w==","ts":1}"#).unwrap();
        assert_eq!(b, [0xff]);
        assert!(decode(b"junk").is_none());
    }
}
