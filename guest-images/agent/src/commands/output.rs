//! A command's output, kept on disk as NDJSON [`OutputLine`]s so that memory stays constant
//! whatever a command prints, and so that a client that connects later can read it again from
//! any line and follow it live. The file is bounded; bytes beyond the bound are counted, not
//! kept. It is made with the first line of output: most commands print little or nothing, and
//! creating (then opening twice) a file per command was a large share of the agent's time
//! with many commands in flight; a command without output has no file and reads as empty.

use std::io;
use std::path::{Path, PathBuf};

use belljar_agent_proto::{OutputLine, Stream};
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

/// How far the output file has been written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of complete NDJSON lines in the file.
    pub committed: u64,
    /// Raw output bytes kept.
    pub kept: u64,
    /// Raw output bytes dropped because of the bound.
    pub dropped: u64,
    /// No more output will come.
    pub closed: bool,
}

/// One chunk read from a command, before it is written down.
#[derive(Debug)]
pub struct Chunk {
    pub stream: Stream,
    pub data: Bytes,
    pub ts: i64,
}

/// The on-disk output of one command.
#[derive(Debug)]
pub struct OutputLog {
    path: PathBuf,
    progress: watch::Sender<Progress>,
}

impl OutputLog {
    /// The output of a command, kept at `path` once there is any. A file already at `path`
    /// (left by an earlier agent with the same state directory) is replaced by the first line.
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            progress: watch::Sender::new(Progress::default()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn progress(&self) -> Progress {
        *self.progress.borrow()
    }

    /// Resolves once no more output will come and all that was read is in the file.
    pub async fn closed(&self) {
        let _ = self.progress.subscribe().wait_for(|p| p.closed).await;
    }

    /// Writes chunks from `rx` until every sender is gone, keeping at most `limit` raw bytes.
    /// The log is closed once `rx` ends and `done` resolves (the command has exited).
    pub async fn write_from(
        &self,
        mut rx: mpsc::Receiver<Chunk>,
        limit: u64,
        done: impl Future<Output = ()>,
    ) {
        let result = async {
            let mut file = None;
            while let Some(chunk) = rx.recv().await {
                let p = self.progress();
                let room = usize::try_from(limit.saturating_sub(p.kept)).unwrap_or(usize::MAX);
                let keep = chunk.data.len().min(room);
                let dropped = (chunk.data.len() - keep) as u64;
                let mut committed = 0;
                if keep > 0 {
                    let line = OutputLine::new(chunk.stream, &chunk.data[..keep], chunk.ts);
                    let mut json = serde_json::to_vec(&line).map_err(io::Error::other)?;
                    json.push(b'\n');
                    let file = match &mut file {
                        Some(file) => file,
                        None => file.insert(
                            tokio::fs::OpenOptions::new()
                                .write(true)
                                .create(true)
                                .truncate(true)
                                .open(&self.path)
                                .await?,
                        ),
                    };
                    file.write_all(&json).await?;
                    file.flush().await?;
                    committed = json.len() as u64;
                }
                self.progress.send_modify(|p| {
                    p.committed += committed;
                    p.kept += keep as u64;
                    p.dropped += dropped;
                });
            }
            Ok::<_, io::Error>(())
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(path = %self.path.display(), "command output not kept: {e}");
            // Keep draining so the command never blocks on a full pipe.
            while let Some(chunk) = rx.recv().await {
                self.progress
                    .send_modify(|p| p.dropped += chunk.data.len() as u64);
            }
        }
        done.await;
        self.progress.send_modify(|p| p.closed = true);
    }

    /// Streams the NDJSON from line `skip` into `tx`: what is there now, or, with `follow`,
    /// everything until the log closes. Ends early when the receiver goes away.
    pub async fn read_into(
        &self,
        skip: u64,
        follow: bool,
        tx: mpsc::Sender<io::Result<Bytes>>,
    ) -> io::Result<()> {
        let mut progress = self.progress.subscribe();
        // Opened once there is something to read: before that the file may not exist.
        let mut file = None;
        let mut offset = 0u64;
        let mut skipped = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let p = *progress.borrow_and_update();
            if offset < p.committed {
                let unread = usize::try_from(p.committed - offset).unwrap_or(usize::MAX);
                let want = unread.min(buf.len());
                let file = match &mut file {
                    Some(file) => file,
                    None => file.insert(tokio::fs::File::open(&self.path).await?),
                };
                file.seek(io::SeekFrom::Start(offset)).await?;
                file.read_exact(&mut buf[..want]).await?;
                offset += want as u64;
                let mut start = 0;
                while skipped < skip && start < want {
                    match buf[start..want].iter().position(|&b| b == b'\n') {
                        Some(nl) => {
                            start += nl + 1;
                            skipped += 1;
                        }
                        None => start = want,
                    }
                }
                if start < want
                    && tx
                        .send(Ok(Bytes::copy_from_slice(&buf[start..want])))
                        .await
                        .is_err()
                {
                    return Ok(());
                }
                continue;
            }
            if p.closed || !follow {
                return Ok(());
            }
            tokio::select! {
                changed = progress.changed() => if changed.is_err() { return Ok(()) },
                _ = tx.closed() => return Ok(()),
            }
        }
    }
}

/// Splits off the longest prefix of `buf` that does not end inside a UTF-8 sequence, so that a
/// multi-byte character split across two reads is sent whole. Returns the prefix length; when
/// `buf` is not UTF-8 at all, the whole buffer goes (as base64).
pub fn utf8_cut(buf: &[u8]) -> usize {
    match std::str::from_utf8(buf) {
        Ok(_) => buf.len(),
        Err(e) if e.error_len().is_none() && buf.len() - e.valid_up_to() < 4 => e.valid_up_to(),
        Err(_) => buf.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_cut_keeps_sequences_whole() {
        let text = "aé€😀".as_bytes();
        assert_eq!(utf8_cut(text), text.len());
        // "😀" is 4 bytes; cutting inside it leaves it for the next read.
        assert_eq!(utf8_cut(&text[..text.len() - 1]), text.len() - 4);
        assert_eq!(utf8_cut(&text[..2]), 1);
        assert_eq!(utf8_cut(&[0xff, 0x00]), 2);
        assert_eq!(utf8_cut(&[0xe2]), 0);
    }

    #[tokio::test]
    async fn a_command_without_output_has_no_file_and_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.ndjson");
        let log = std::sync::Arc::new(OutputLog::new(path.clone()));
        let (tx, rx) = mpsc::channel::<Chunk>(4);
        let (exited_tx, exited_rx) = tokio::sync::oneshot::channel::<()>();
        let writer = {
            let log = log.clone();
            tokio::spawn(async move {
                let done = async move {
                    let _ = exited_rx.await;
                };
                log.write_from(rx, 10, done).await
            })
        };
        // A follower that came before the end waits for it, without a file to open.
        let (btx, mut brx) = mpsc::channel(4);
        let follower = {
            let log = log.clone();
            tokio::spawn(async move { log.read_into(0, true, btx).await })
        };
        drop(tx);
        exited_tx.send(()).unwrap();
        writer.await.unwrap();
        follower.await.unwrap().unwrap();
        assert!(brx.recv().await.is_none());
        assert!(log.progress().closed);
        assert!(!path.exists());
        let (btx, mut brx) = mpsc::channel(4);
        log.read_into(0, false, btx).await.unwrap();
        assert!(brx.recv().await.is_none());
    }

    #[tokio::test]
    async fn keeps_output_bounded_and_reads_from_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.ndjson");
        let log = std::sync::Arc::new(OutputLog::new(path.clone()));
        let (tx, rx) = mpsc::channel(4);
        let writer = {
            let log = log.clone();
            tokio::spawn(async move { log.write_from(rx, 10, async {}).await })
        };
        for word in ["abcd", "efgh", "ijkl"] {
            let chunk = Chunk {
                stream: Stream::Stdout,
                data: Bytes::from(word),
                ts: 1,
            };
            tx.send(chunk).await.unwrap();
        }
        drop(tx);
        writer.await.unwrap();
        let p = log.progress();
        assert_eq!((p.kept, p.dropped, p.closed), (10, 2, true));
        assert!(path.exists());

        let (btx, mut brx) = mpsc::channel(4);
        log.read_into(1, true, btx).await.unwrap();
        let mut out = Vec::new();
        while let Some(b) = brx.recv().await {
            out.extend_from_slice(&b.unwrap());
        }
        let lines: Vec<OutputLine> = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].data.as_deref(), Some("efgh"));
        assert_eq!(lines[1].data.as_deref(), Some("ij"));
    }
}
