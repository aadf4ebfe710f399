//! The vsock packet header as it sits in guest memory.

use vm_memory::{ByteValued, Le16, Le32, Le64};

/// `struct virtio_vsock_hdr` (44 bytes, packed, little endian).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
#[repr(C, packed)]
pub struct PacketHeader {
    pub src_cid: Le64,
    pub dst_cid: Le64,
    pub src_port: Le32,
    pub dst_port: Le32,
    pub len: Le32,
    pub type_: Le16,
    pub op: Le16,
    pub flags: Le32,
    pub buf_alloc: Le32,
    pub fwd_cnt: Le32,
}

// SAFETY: packed plain-old-data made of little-endian integers; every bit pattern is valid.
unsafe impl ByteValued for PacketHeader {}

/// Size of `PacketHeader` in guest memory.
pub const HEADER_SIZE: usize = std::mem::size_of::<PacketHeader>();

impl PacketHeader {
    pub fn op(&self) -> u16 {
        self.op.to_native()
    }
    pub fn payload_len(&self) -> u32 {
        self.len.to_native()
    }
    pub fn src_port(&self) -> u32 {
        self.src_port.to_native()
    }
    pub fn dst_port(&self) -> u32 {
        self.dst_port.to_native()
    }
    pub fn src_cid(&self) -> u64 {
        self.src_cid.to_native()
    }
    pub fn dst_cid(&self) -> u64 {
        self.dst_cid.to_native()
    }
    pub fn flags(&self) -> u32 {
        self.flags.to_native()
    }
    pub fn buf_alloc(&self) -> u32 {
        self.buf_alloc.to_native()
    }
    pub fn fwd_cnt(&self) -> u32 {
        self.fwd_cnt.to_native()
    }
    pub fn type_(&self) -> u16 {
        self.type_.to_native()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_44_bytes() {
        assert_eq!(HEADER_SIZE, 44);
    }
}
