//! Copying a regular file into a layer without writing its holes, and hashing it without
//! reading them.
//!
//! A sandbox can make a file of any apparent size at no cost to its disk (`truncate -s 6G`
//! allocates nothing), so a copy that writes files in full lets any guest fill the host's disk
//! and keeps the sandbox frozen while it does. Here only the file's data extents
//! (`SEEK_DATA`/`SEEK_HOLE`) are read; within them, every 4 KiB block of zeros is left a hole
//! too (as `cp --sparse=always` does), and the copy is given the file's size at the end.
//!
//! The content hash must not depend on where a filesystem happened to allocate: the same
//! content hashes the same whether it arrived as holes or as written zeros, on whichever
//! filesystem it was read from. So the hash is taken over a canonical stream of the file's
//! maximal runs, each run a data run (`bytes ‖ len ‖ 'D'`) or a zero run (`len ‖ 'Z'`), where
//! zero runs are the whole 4 KiB blocks (or the tail) that are all zeros. Read from its end,
//! the stream parses in one way only, so two different contents never give one stream; and
//! a zero run costs the hash sixteen bytes, whatever its length.
//!
//! What a capture may write is bounded ([`Budget`]): the caller passes the sandbox's own disk
//! size, which is all a sandbox could have written.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use sha2::{Digest, Sha256};

/// The granularity of holes in the copy and of zero runs in the hash.
const BLOCK: u64 = 4096;
/// [`BLOCK`] as a length.
const BLOCK_LEN: usize = 4096;
const _: () = assert!(BLOCK_LEN as u64 == BLOCK);

/// Bytes of file data a capture may still write.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    /// The whole allowance, for the error.
    pub limit: u64,
    /// What is left of it.
    pub left: u64,
}

impl Budget {
    pub(crate) fn new(limit: Option<u64>) -> Self {
        let limit = limit.unwrap_or(u64::MAX);
        Self { limit, left: limit }
    }
}

/// Why a file could not be copied.
#[derive(Debug)]
pub(crate) enum CopyError {
    /// Reading the source failed.
    Read(io::Error),
    /// Writing the copy failed.
    Write(io::Error),
    /// The copy would write more than the budget allows.
    OverBudget,
}

/// A copied file: its content hash and the bytes of data written (holes excluded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Copied {
    pub content: [u8; 32],
    pub stored: u64,
}

/// Copies `input` (a regular file of `len` bytes) into the empty `output`, holes and zero
/// blocks as holes, through `buf` (a multiple of [`BLOCK`]).
pub(crate) fn copy(
    input: &File,
    output: &File,
    len: u64,
    buf: &mut [u8],
    budget: &mut Budget,
) -> Result<Copied, CopyError> {
    debug_assert!(!buf.is_empty() && (buf.len() as u64).is_multiple_of(BLOCK));
    let mut hash = RunHash::default();
    let mut stored = 0u64;
    // Everything before `done` is hashed (and, where it is data, written).
    let mut done = 0u64;
    while done < len {
        let Some((data, hole)) = next_extent(input, done, len).map_err(CopyError::Read)? else {
            break;
        };
        // Blocks are aligned to the file's start, so the same content is cut the same way
        // wherever its filesystem put the extents.
        let start = (data / BLOCK * BLOCK).max(done);
        let end = hole.next_multiple_of(BLOCK).min(len);
        hash.zeros(start - done);
        let mut at = start;
        while at < end {
            let want = usize::try_from((end - at).min(buf.len() as u64)).unwrap_or(buf.len());
            let chunk = &mut buf[..want];
            read_exact_at(input, chunk, at)?;
            for (i, block) in chunk.chunks(BLOCK_LEN).enumerate() {
                let n = block.len() as u64;
                if block.iter().all(|&b| b == 0) {
                    hash.zeros(n);
                } else {
                    if budget.left < n {
                        return Err(CopyError::OverBudget);
                    }
                    budget.left -= n;
                    output
                        .write_all_at(block, at + i as u64 * BLOCK)
                        .map_err(CopyError::Write)?;
                    stored += n;
                    hash.data(block);
                }
            }
            at += want as u64;
        }
        done = end;
    }
    hash.zeros(len - done);
    output.set_len(len).map_err(CopyError::Write)?;
    Ok(Copied {
        content: hash.finish(),
        stored,
    })
}

/// The next data extent at or after `from` as (start, end), or `None` past the last one.
/// A filesystem without `SEEK_DATA` reports the whole rest as data.
fn next_extent(file: &File, from: u64, len: u64) -> io::Result<Option<(u64, u64)>> {
    let fd = file.as_raw_fd();
    let seek = |offset: u64, whence: i32| -> io::Result<Option<u64>> {
        let offset = libc::off_t::try_from(offset).map_err(io::Error::other)?;
        // SAFETY: lseek on an open descriptor this function borrows; it changes only the
        // descriptor's offset, which nothing else here uses (reads are positional).
        let r = unsafe { libc::lseek(fd, offset, whence) };
        if r >= 0 {
            return Ok(Some(r as u64));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        }
    };
    let data = match seek(from, libc::SEEK_DATA) {
        Ok(Some(d)) if d < len => d,
        Ok(_) => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(Some((from, len))),
        Err(e) => return Err(e),
    };
    let hole = seek(data, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
    Ok(Some((data, hole)))
}

fn read_exact_at(file: &File, buf: &mut [u8], at: u64) -> Result<(), CopyError> {
    match file.read_exact_at(buf, at) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(CopyError::Read(
            io::Error::other("changed while it was copied"),
        )),
        Err(e) => Err(CopyError::Read(e)),
    }
}

/// The content hash over the file's runs (see the module's comment).
#[derive(Default)]
pub(crate) struct RunHash {
    sha: Sha256,
    run: Run,
}

#[derive(Default, Clone, Copy)]
enum Run {
    #[default]
    None,
    Zeros(u64),
    Data(u64),
}

impl RunHash {
    /// `n` bytes of zeros follow.
    pub(crate) fn zeros(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        self.run = match self.run {
            Run::Zeros(k) => Run::Zeros(k + n),
            Run::Data(k) => {
                self.end_data(k);
                Run::Zeros(n)
            }
            Run::None => Run::Zeros(n),
        };
    }

    /// `bytes` (not all zeros) follow.
    pub(crate) fn data(&mut self, bytes: &[u8]) {
        let n = bytes.len() as u64;
        self.run = match self.run {
            Run::Data(k) => Run::Data(k + n),
            Run::Zeros(k) => {
                self.end_zeros(k);
                Run::Data(n)
            }
            Run::None => Run::Data(n),
        };
        self.sha.update(bytes);
    }

    pub(crate) fn finish(mut self) -> [u8; 32] {
        match self.run {
            Run::Zeros(k) => self.end_zeros(k),
            Run::Data(k) => self.end_data(k),
            Run::None => {}
        }
        self.sha.finalize().into()
    }

    fn end_data(&mut self, len: u64) {
        self.sha.update(len.to_le_bytes());
        self.sha.update(b"D");
    }

    fn end_zeros(&mut self, len: u64) {
        self.sha.update(len.to_le_bytes());
        self.sha.update(b"Z");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn copy_of(
        src: &File,
        budget: Option<u64>,
    ) -> (tempfile::NamedTempFile, Result<Copied, CopyError>) {
        let out = tempfile::NamedTempFile::new().unwrap();
        let len = src.metadata().unwrap().len();
        let mut buf = vec![0; 1 << 16];
        let r = copy(src, out.as_file(), len, &mut buf, &mut Budget::new(budget));
        (out, r)
    }

    fn read_all(f: &File) -> Vec<u8> {
        let len = f.metadata().unwrap().len();
        let mut v = vec![0; usize::try_from(len).unwrap()];
        f.read_exact_at(&mut v, 0).unwrap();
        v
    }

    /// A 6 GiB file with 8 KiB of data at 3 GiB is copied as 8 KiB, its data in place.
    #[test]
    fn a_sparse_file_is_copied_as_its_data() {
        let src = tempfile::tempfile().unwrap();
        src.set_len(6 << 30).unwrap();
        src.write_all_at(&[7u8; 8192], 3 << 30).unwrap();
        src.write_all_at(b"end", (6 << 30) - 3).unwrap();
        let (out, r) = copy_of(&src, Some(1 << 20));
        let copied = r.unwrap();
        let meta = out.as_file().metadata().unwrap();
        assert_eq!(meta.len(), 6 << 30);
        assert!(
            meta.blocks() * 512 <= 64 << 10,
            "{} bytes allocated",
            meta.blocks() * 512
        );
        assert_eq!(copied.stored, 8192 + 4096);
        let mut got = vec![0u8; 8192 + 2];
        out.as_file()
            .read_exact_at(&mut got, (3 << 30) - 1)
            .unwrap();
        assert_eq!(got[0], 0);
        assert!(got[1..8193].iter().all(|&b| b == 7));
        assert_eq!(got[8193], 0);
        let mut tail = [0u8; 3];
        out.as_file()
            .read_exact_at(&mut tail, (6 << 30) - 3)
            .unwrap();
        assert_eq!(&tail, b"end");
    }

    /// Written zeros and holes are the same content: same hash, and the copy holds neither.
    #[test]
    fn holes_and_written_zeros_hash_alike() {
        let sparse = tempfile::tempfile().unwrap();
        sparse.set_len(1 << 20).unwrap();
        sparse.write_all_at(b"x", 100_000).unwrap();
        let dense = tempfile::tempfile().unwrap();
        let mut bytes = vec![0u8; 1 << 20];
        bytes[100_000] = b'x';
        dense.write_all_at(&bytes, 0).unwrap();
        let (a_out, a) = copy_of(&sparse, None);
        let (b_out, b) = copy_of(&dense, None);
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, b);
        assert_eq!(a.stored, 4096);
        assert_eq!(read_all(a_out.as_file()), bytes);
        assert_eq!(read_all(b_out.as_file()), bytes);
        assert!(b_out.as_file().metadata().unwrap().blocks() * 512 <= 16 << 10);
    }

    /// Different contents hash differently, also where only a run's length differs.
    #[test]
    fn the_hash_tells_run_lengths_and_bytes_apart() {
        let hash = |f: &dyn Fn(&mut RunHash)| {
            let mut h = RunHash::default();
            f(&mut h);
            h.finish()
        };
        let a = hash(&|h| {
            h.data(b"ab");
            h.zeros(4096);
        });
        let b = hash(&|h| {
            h.data(b"ab");
            h.zeros(8192);
        });
        let c = hash(&|h| {
            h.zeros(4096);
            h.data(b"ab");
        });
        let d = hash(&|h| h.data(b"ab"));
        let e = hash(&|h| {
            h.data(b"a");
            h.data(b"b");
        });
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        assert_eq!(d, e, "a run's hash does not depend on how it was read");
        assert_eq!(hash(&|_| {}), <[u8; 32]>::from(Sha256::digest(b"")));
    }

    /// Data past the budget is refused before it is written.
    #[test]
    fn a_copy_stops_at_its_budget() {
        let src = tempfile::tempfile().unwrap();
        src.write_all_at(&vec![1u8; 64 << 10], 0).unwrap();
        let (out, r) = copy_of(&src, Some(32 << 10));
        assert!(matches!(r, Err(CopyError::OverBudget)));
        assert!(out.as_file().metadata().unwrap().blocks() * 512 <= 40 << 10);
        let (_, r) = copy_of(&src, Some(64 << 10));
        assert_eq!(r.unwrap().stored, 64 << 10);
    }
}
