//! Command output on the host: every line the agent streams is appended to the command's
//! NDJSON file, and readers tail that file.
//!
//! The file is the durable copy: a finished command's output survives a `kill -9` of the
//! daemon, and a command that still runs is re-attached from the line after the last complete
//! one in the file. Readers wait on a watch channel instead of polling, and only ever hand
//! out complete lines. The file is made with the first line: a command without output (most
//! of them, under load) costs no file, and a missing log reads as an empty one. Creating a
//! file per command was the daemon's largest single cost with 1000 commands in flight.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belljar_agent_proto::OutputLine;
use bytes::Bytes;
use futures::Stream;
use tokio::fs::{File, OpenOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// How far a command's log has got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogState {
    pub lines: u64,
    /// No more lines will come.
    pub done: bool,
}

/// The live logs of this daemon's followed commands, by command id.
#[derive(Default)]
pub struct LogRegistry {
    map: Mutex<HashMap<String, Arc<watch::Sender<LogState>>>>,
}

impl LogRegistry {
    /// Starts tracking a command whose log will grow.
    pub fn register(&self, command_id: &str, lines: u64) -> Arc<watch::Sender<LogState>> {
        let (tx, _) = watch::channel(LogState { lines, done: false });
        let tx = Arc::new(tx);
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(command_id.to_owned(), tx.clone());
        tx
    }

    /// Follows a command's log; `None` when nothing is appending to it any more.
    pub fn subscribe(&self, command_id: &str) -> Option<watch::Receiver<LogState>> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(command_id)
            .map(|tx| tx.subscribe())
    }

    /// Marks the log complete and stops tracking it.
    pub fn finish(&self, command_id: &str) {
        if let Some(tx) = self
            .map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(command_id)
        {
            tx.send_modify(|s| s.done = true);
        }
    }
}

/// The largest a command's log file grows on the host. The agent stops at 64 MiB of output,
/// which is at most ~90 MiB as NDJSON (binary output is base64); an agent that ignores its own
/// cap (a hostile guest) must not fill the host's disk.
pub const MAX_LOG_BYTES: u64 = 96 << 20;

/// Appends agent output lines to a command's log file.
pub struct LogWriter {
    path: PathBuf,
    /// Opened (and created) with the first line, unless the file was already there.
    file: Option<File>,
    state: Arc<watch::Sender<LogState>>,
    /// Bytes in the file.
    len: u64,
    limit: u64,
    /// Output bytes of lines dropped past `limit`.
    dropped: u64,
}

impl LogWriter {
    pub async fn open(path: &Path, state: Arc<watch::Sender<LogState>>) -> io::Result<Self> {
        Self::with_limit(path, state, MAX_LOG_BYTES).await
    }

    /// The writer of a command just recorded, whose log cannot exist yet (a new id, or a
    /// revived command whose old log was removed): it skips looking for one, a blocking-pool
    /// round trip per command. The file is still made with the first line, never through a
    /// link.
    pub fn new_log(path: &Path, state: Arc<watch::Sender<LogState>>) -> Self {
        Self {
            path: path.to_owned(),
            file: None,
            state,
            len: 0,
            limit: MAX_LOG_BYTES,
            dropped: 0,
        }
    }

    /// A writer that drops lines once the file would pass `limit` bytes.
    pub async fn with_limit(
        path: &Path,
        state: Arc<watch::Sender<LogState>>,
        limit: u64,
    ) -> io::Result<Self> {
        // A log already there (a command re-attached after a restart) is opened now, so that
        // its length counts against the limit; a link planted there fails here too.
        let (file, len) = match tokio::fs::symlink_metadata(path).await {
            Ok(_) => {
                let file = open_for_append(path).await?;
                let len = file.metadata().await?.len();
                (Some(file), len)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => (None, 0),
            Err(e) => return Err(e),
        };
        Ok(Self {
            path: path.to_owned(),
            file,
            state,
            len,
            limit,
            dropped: 0,
        })
    }

    /// Appends one line; it is in the file (the page cache) when this returns. A line that
    /// would take the file past its limit is dropped and counted in [`Self::dropped`].
    pub async fn append(&mut self, line: &OutputLine) -> io::Result<()> {
        let mut buf = serde_json::to_vec(line).map_err(io::Error::other)?;
        buf.push(b'\n');
        if self.len + buf.len() as u64 > self.limit {
            if self.dropped == 0 {
                tracing::warn!(
                    limit = self.limit,
                    "a command's log is full; dropping output"
                );
            }
            self.dropped += line.bytes().len() as u64;
            return Ok(());
        }
        let file = match &mut self.file {
            Some(file) => file,
            None => {
                if let Some(dir) = self.path.parent() {
                    tokio::fs::create_dir_all(dir).await?;
                }
                self.file.insert(open_for_append(&self.path).await?)
            }
        };
        file.write_all(&buf).await?;
        file.flush().await?;
        self.len += buf.len() as u64;
        self.state.send_modify(|s| s.lines += 1);
        Ok(())
    }

    /// Output bytes dropped because the log was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    pub fn lines(&self) -> u64 {
        self.state.borrow().lines
    }
}

/// Opens (creating) a log to append to, never through a symbolic link.
async fn open_for_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .await
}

/// Makes a log file end at a line boundary (a `kill -9` mid-write can leave half a line) and
/// returns how many complete lines it holds. A missing file holds none.
pub fn repair(path: &Path) -> io::Result<u64> {
    use std::io::BufRead;
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
    {
        Ok(f) => f,
        // No output yet: the writer makes the file with the first line.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    // Streamed: a log may be as large as `MAX_LOG_BYTES`.
    let mut reader = io::BufReader::with_capacity(64 * 1024, &file);
    let (mut lines, mut complete, mut pos) = (0u64, 0u64, 0u64);
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        for (i, _) in buf.iter().enumerate().filter(|(_, b)| **b == b'\n') {
            lines += 1;
            complete = pos + i as u64 + 1;
        }
        let n = buf.len();
        pos += n as u64;
        reader.consume(n);
    }
    if complete != pos {
        file.set_len(complete)?;
    }
    Ok(lines)
}

/// The log's complete lines as a byte stream; with `follow`, waits for more until `state`
/// says the log is done (or until there is no `state`, i.e. nothing appends any more).
pub fn tail(
    path: PathBuf,
    follow: bool,
    state: Option<watch::Receiver<LogState>>,
) -> impl Stream<Item = io::Result<Bytes>> {
    struct St {
        path: PathBuf,
        file: Option<File>,
        carry: Vec<u8>,
        follow: bool,
        state: Option<watch::Receiver<LogState>>,
    }
    let st = St {
        path,
        file: None,
        carry: Vec::new(),
        follow,
        state,
    };
    futures::stream::try_unfold(st, |mut st| async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // Seen before reading, so a line appended after the read is not missed.
            let done_before = match &st.state {
                Some(rx) => rx.borrow().done,
                None => true,
            };
            if st.file.is_none() {
                match File::open(&st.path).await {
                    Ok(file) => st.file = Some(file),
                    // No line yet (the file comes with the first one).
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            let n = match st.file.as_mut() {
                Some(file) => file.read(&mut buf).await?,
                None => 0,
            };
            if n > 0 {
                st.carry.extend_from_slice(&buf[..n]);
                if let Some(end) = st.carry.iter().rposition(|&b| b == b'\n') {
                    let rest = st.carry.split_off(end + 1);
                    let out = std::mem::replace(&mut st.carry, rest);
                    return Ok(Some((Bytes::from(out), st)));
                }
                continue;
            }
            if !st.follow || done_before {
                return Ok(None);
            }
            let rx = st.state.as_mut().expect("not done without a state");
            // Wake on a new line; the timeout re-checks the file in case a wake-up was missed.
            if let Ok(Err(_)) = tokio::time::timeout(Duration::from_secs(1), rx.changed()).await {
                st.state = None;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use belljar_agent_proto::Stream as Out;
    use futures::TryStreamExt;

    use super::*;

    #[test]
    fn repair_drops_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.ndjson");
        assert_eq!(repair(&p).unwrap(), 0);
        assert_eq!(repair(&dir.path().join("commands/none.ndjson")).unwrap(), 0);
        std::fs::write(&p, b"{\"a\":1}\n{\"b\":2}\n{\"c\":").unwrap();
        assert_eq!(repair(&p).unwrap(), 2);
        assert_eq!(std::fs::read(&p).unwrap(), b"{\"a\":1}\n{\"b\":2}\n");
    }

    #[tokio::test]
    async fn a_follower_sees_every_line_then_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.ndjson");
        let reg = LogRegistry::default();
        let tx = reg.register("cmd_a", 0);
        let mut w = LogWriter::open(&p, tx).await.unwrap();
        w.append(&OutputLine::new(Out::Stdout, b"one\n", 1))
            .await
            .unwrap();
        let reader = tokio::spawn(
            tail(p.clone(), true, reg.subscribe("cmd_a"))
                .map_ok(|b| b.to_vec())
                .try_concat(),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.append(&OutputLine::new(Out::Stderr, &[0xff, 0x00], 2))
            .await
            .unwrap();
        assert_eq!(w.lines(), 2);
        reg.finish("cmd_a");
        let all = reader.await.unwrap().unwrap();
        let lines: Vec<OutputLine> = all
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].data.as_deref(), Some("one\n"));
        assert_eq!(lines[1].bytes(), [0xff, 0x00]);
        assert!(reg.subscribe("cmd_a").is_none());

        // Without follow, a reader gets what is there and ends.
        let now: Vec<Bytes> = tail(p, false, None).try_collect().await.unwrap();
        assert_eq!(now.concat().iter().filter(|&&b| b == b'\n').count(), 2);
    }

    #[tokio::test]
    async fn the_file_comes_with_the_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("commands").join("c.ndjson");
        let reg = LogRegistry::default();
        let mut w = LogWriter::open(&p, reg.register("cmd_a", 0)).await.unwrap();
        // A follower that starts before any output waits for the file instead of failing.
        let reader = tokio::spawn(
            tail(p.clone(), true, reg.subscribe("cmd_a"))
                .map_ok(|b| b.to_vec())
                .try_concat(),
        );
        assert!(!p.exists(), "no output, no file");
        let empty: Vec<Bytes> = tail(p.clone(), false, None).try_collect().await.unwrap();
        assert!(empty.is_empty());

        w.append(&OutputLine::new(Out::Stdout, b"late\n", 1))
            .await
            .unwrap();
        assert!(p.is_file());
        reg.finish("cmd_a");
        let all = reader.await.unwrap().unwrap();
        let line: OutputLine = serde_json::from_slice(all.strip_suffix(b"\n").unwrap()).unwrap();
        assert_eq!(line.data.as_deref(), Some("late\n"));
    }

    #[tokio::test]
    async fn an_agent_that_ignores_its_cap_cannot_fill_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.ndjson");
        let reg = LogRegistry::default();
        let mut w = LogWriter::with_limit(&p, reg.register("cmd_a", 0), 4096)
            .await
            .unwrap();
        let chunk = vec![b'x'; 1000];
        for i in 0..100 {
            w.append(&OutputLine::new(Out::Stdout, &chunk, i))
                .await
                .unwrap();
        }
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len <= 4096, "{len}");
        assert_eq!(w.lines(), 3);
        assert_eq!(w.dropped(), 97 * 1000);
        // A writer opened again (after a restart) counts what is already there.
        let mut again = LogWriter::with_limit(&p, reg.register("cmd_a", 3), 4096)
            .await
            .unwrap();
        again
            .append(&OutputLine::new(Out::Stdout, &chunk, 0))
            .await
            .unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), len);
        assert_eq!(again.dropped(), 1000);
        // A link planted at the log's path is not followed.
        let link = dir.path().join("link.ndjson");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(
            LogWriter::open(&link, reg.register("cmd_b", 0))
                .await
                .is_err()
        );
    }
}
