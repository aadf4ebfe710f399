//! Guest memory in a snapshot: one raw file, the RAM regions one after the other.
//!
//! Saving skips all-zero pages (the file stays sparse: a fresh guest's untouched RAM costs
//! no disk). Restoring maps the file privately (`MAP_PRIVATE`): pages are read from it on
//! first touch and copied only when the guest writes them, so the file is never changed and
//! any number of VMs restored from it share every page none of them wrote.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use vm_memory::mmap::MmapRegion;
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap,
    MemoryRegionAddress,
};

use crate::conv::to_usize;
use crate::memory::GuestMemory;

const PAGE: usize = 4096;
const ZERO_PAGE: [u8; PAGE] = [0; PAGE];
/// Bytes copied out of guest memory at a time.
const CHUNK: usize = 1 << 20;

/// Errors saving or mapping guest memory.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot write guest memory to {0}
    Write(String, #[source] std::io::Error),
    /// Cannot read guest memory
    Read(String),
    /// Cannot open the memory file {0}
    Open(String, #[source] std::io::Error),
    /// Memory file holds {got} bytes, the snapshot's RAM is {expected}
    Size { expected: u64, got: u64 },
    /// Cannot map the memory file: {0}
    Map(String),
}

/// Writes every region of `mem` to `file` (emptied first); returns the bytes actually
/// written (non-zero pages). Only calls on the open file: it works under the seccomp filter.
pub fn save(mem: &GuestMemory, file: &File) -> Result<u64, Error> {
    let name = "memory".to_string();
    // Emptied, so pages skipped as zero read as zero even if the file held something.
    file.set_len(0).map_err(|e| Error::Write(name.clone(), e))?;
    let total = crate::memory::total_size(mem);
    file.set_len(total)
        .map_err(|e| Error::Write(name.clone(), e))?;
    let mut buf = vec![0u8; CHUNK];
    let mut file_off = 0u64;
    let mut written = 0u64;
    for region in mem.iter() {
        let len = to_usize(region.len());
        let mut off = 0usize;
        while off < len {
            let n = CHUNK.min(len - off);
            region
                .read_slice(&mut buf[..n], MemoryRegionAddress(off as u64))
                .map_err(|e| Error::Read(e.to_string()))?;
            for (i, page) in buf[..n].chunks(PAGE).enumerate() {
                // A slice comparison (memcmp), fast even in a debug build.
                if page == &ZERO_PAGE[..page.len()] {
                    continue;
                }
                let at = file_off + (off + i * PAGE) as u64;
                file.write_all_at(page, at)
                    .map_err(|e| Error::Write(name.clone(), e))?;
                written += page.len() as u64;
            }
            off += n;
        }
        file_off += region.len();
    }
    file.sync_data().map_err(|e| Error::Write(name, e))?;
    Ok(written)
}

/// Maps `path` privately as guest RAM laid out in `ranges`.
pub fn restore(path: &Path, ranges: &[(GuestAddress, usize)]) -> Result<GuestMemory, Error> {
    let name = path.display().to_string();
    let file = File::open(path).map_err(|e| Error::Open(name.clone(), e))?;
    let got = file
        .metadata()
        .map_err(|e| Error::Open(name.clone(), e))?
        .len();
    let expected: u64 = ranges.iter().map(|(_, len)| *len as u64).sum();
    if got != expected {
        return Err(Error::Size { expected, got });
    }
    let file = std::sync::Arc::new(file);
    let mut regions = Vec::with_capacity(ranges.len());
    let mut offset = 0u64;
    for &(addr, len) in ranges {
        let mapping = MmapRegion::build(
            Some(FileOffset::from_arc(file.clone(), offset)),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_NORESERVE,
        )
        .map_err(|e| Error::Map(e.to_string()))?;
        let region = GuestRegionMmap::new(mapping, addr)
            .ok_or_else(|| Error::Map("region overflows the address space".into()))?;
        regions.push(region);
        offset += len as u64;
    }
    GuestMemory::from_regions(regions).map_err(|e| Error::Map(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_round_trip_and_writes_stay_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory");
        let mem = crate::memory::create(4 << 20).unwrap();
        mem.write_obj(0xdead_beef_u32, GuestAddress(0x2000))
            .unwrap();
        mem.write_obj(7u8, GuestAddress((4 << 20) - 1)).unwrap();
        // A file that held something is emptied first, not overwritten in place.
        std::fs::write(&path, vec![0xff_u8; 3 * PAGE]).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        // Two non-zero pages, the rest skipped.
        assert_eq!(save(&mem, &file).unwrap(), 2 * PAGE as u64);
        let ranges = crate::memory::ram_ranges(4 << 20);
        let a = restore(&path, &ranges).unwrap();
        let b = restore(&path, &ranges).unwrap();
        assert_eq!(
            a.read_obj::<u32>(GuestAddress(0x2000)).unwrap(),
            0xdead_beef
        );
        assert_eq!(a.read_obj::<u8>(GuestAddress((4 << 20) - 1)).unwrap(), 7);
        // The file's old 0xff bytes did not survive where the guest had zeros.
        assert_eq!(a.read_obj::<u32>(GuestAddress(0x1000)).unwrap(), 0);
        a.write_obj(1u32, GuestAddress(0x2000)).unwrap();
        // Neither the other mapping nor the file saw the write.
        assert_eq!(
            b.read_obj::<u32>(GuestAddress(0x2000)).unwrap(),
            0xdead_beef
        );
        let c = restore(&path, &ranges).unwrap();
        assert_eq!(
            c.read_obj::<u32>(GuestAddress(0x2000)).unwrap(),
            0xdead_beef
        );
    }

    #[test]
    fn a_short_memory_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory");
        std::fs::write(&path, [0u8; 4096]).unwrap();
        let ranges = crate::memory::ram_ranges(1 << 20);
        assert!(matches!(
            restore(&path, &ranges),
            Err(Error::Size { got: 4096, .. })
        ));
    }
}
