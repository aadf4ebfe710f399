//! Guest memory: one anonymous mapping per RAM range, laid out around the MMIO window.

use vm_memory::{GuestAddress, GuestMemoryBackend};

use crate::conv::to_usize;
use crate::layout::{MMIO_GAP_END, MMIO_GAP_START};

/// Guest physical memory as every part of the VMM sees it.
pub type GuestMemory = vm_memory::GuestMemoryMmap<()>;

/// Errors creating guest memory.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Guest memory size must be at least 1 MiB and a multiple of 4 KiB (got {0} bytes)
    BadSize(u64),
    /// Cannot map guest memory
    Mmap(#[source] vm_memory::mmap::FromRangesError),
}

/// The guest RAM ranges for `size` bytes: below the MMIO window, then above 4 GiB.
pub fn ram_ranges(size: u64) -> Vec<(GuestAddress, usize)> {
    if size <= MMIO_GAP_START {
        vec![(GuestAddress(0), to_usize(size))]
    } else {
        vec![
            (GuestAddress(0), to_usize(MMIO_GAP_START)),
            (GuestAddress(MMIO_GAP_END), to_usize(size - MMIO_GAP_START)),
        ]
    }
}

/// Allocates `size` bytes of guest RAM (lazily: untouched pages cost nothing).
pub fn create(size: u64) -> Result<GuestMemory, Error> {
    if size < (1 << 20) || size & 0xfff != 0 {
        return Err(Error::BadSize(size));
    }
    GuestMemory::from_ranges(&ram_ranges(size)).map_err(Error::Mmap)
}

/// Total RAM in bytes.
pub fn total_size(mem: &GuestMemory) -> u64 {
    use vm_memory::GuestMemoryRegion;
    mem.iter().map(|r| r.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_memory_is_one_range() {
        let mem = create(64 << 20).unwrap();
        assert_eq!(mem.num_regions(), 1);
        assert_eq!(total_size(&mem), 64 << 20);
    }

    #[test]
    fn large_memory_skips_the_mmio_window() {
        let r = ram_ranges(MMIO_GAP_START + (1 << 30));
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].0, GuestAddress(MMIO_GAP_END));
        assert_eq!(r[1].1, 1 << 30);
    }

    #[test]
    fn rejects_bad_sizes() {
        assert!(matches!(create(0), Err(Error::BadSize(0))));
        assert!(create((2 << 20) + 1).is_err());
    }
}
