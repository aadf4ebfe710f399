//! The integer narrowing the VMM does on purpose, in one place, so that
//! `clippy::cast_possible_truncation` can stay on everywhere else: virtio and x86 split
//! 64-bit values into 32-bit register halves, and `u64` sizes become `usize` lengths, which is
//! lossless because the VMM only builds for 64-bit hosts (asserted below). Every other
//! narrowing converts with `try_from` and handles the value that does not fit.

const _: () = assert!(usize::BITS == 64, "belljar-vmm needs a 64-bit host");

/// The low 32 bits of `v` (a 64-bit value's lower register half).
#[expect(
    clippy::cast_possible_truncation,
    reason = "dropping the high half is the point"
)]
pub const fn lo32(v: u64) -> u32 {
    v as u32
}

/// The high 32 bits of `v` (a 64-bit value's upper register half).
pub const fn hi32(v: u64) -> u32 {
    lo32(v >> 32)
}

/// `v` as a length or index: lossless, since `usize` is 64 bits wide here.
#[expect(
    clippy::cast_possible_truncation,
    reason = "usize is 64 bits (asserted above)"
)]
pub const fn to_usize(v: u64) -> usize {
    v as usize
}

/// A `u32` constant from virtio-bindings (which types every constant `u32`) that must fit a
/// byte; used in `const` items, so a value that does not fit fails the build.
pub const fn byte_const(v: u32) -> u8 {
    assert!(v <= 0xff, "constant does not fit a byte");
    v.to_le_bytes()[0]
}

/// As `byte_const`, for 16-bit fields.
pub const fn u16_const(v: u32) -> u16 {
    assert!(v <= 0xffff, "constant does not fit 16 bits");
    let b = v.to_le_bytes();
    u16::from_le_bytes([b[0], b[1]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_and_lengths() {
        assert_eq!(lo32(0x1234_5678_9abc_def0), 0x9abc_def0);
        assert_eq!(hi32(0x1234_5678_9abc_def0), 0x1234_5678);
        assert_eq!(to_usize(u64::MAX), usize::MAX);
        assert_eq!(byte_const(0xab), 0xab);
        assert_eq!(u16_const(0xabcd), 0xabcd);
    }
}
