//! A cursor over the fuzz input that hands out integers and byte strings, so that each
//! target can spend the fuzzer's bytes on decisions (which descriptor, which route) as well
//! as on the data itself. Running out of input yields zeros and empty slices, never a panic:
//! every prefix of an input is a valid input.

/// The remaining fuzz input.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Up to `n` bytes (fewer at the end of the input).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, tail) = self.data.split_at(n);
        self.data = tail;
        head
    }

    /// A length-prefixed byte string of at most `max` bytes (a one-byte or two-byte length).
    pub fn string(&mut self, max: usize) -> &'a [u8] {
        let len = if max <= 255 {
            usize::from(self.u8())
        } else {
            usize::from(self.u16())
        };
        self.bytes(len.min(max))
    }

    /// Everything that is left.
    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.data.len())
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let b = self.bytes(N);
        out[..b.len()].copy_from_slice(b);
        out
    }

    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    /// True for one byte value in `n`: a rare branch the fuzzer can still pick at will.
    pub fn one_in(&mut self, n: u8) -> bool {
        self.u8().is_multiple_of(n)
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_yields_zeros_and_empty_slices() {
        let mut i = Input::new(&[1, 2, 3]);
        assert_eq!(i.u16(), 0x0201);
        assert_eq!(i.u32(), 3);
        assert_eq!(i.u64(), 0);
        assert!(i.bytes(5).is_empty());
        let mut i = Input::new(&[2, b'a', b'b', b'c']);
        assert_eq!(i.string(10), b"ab");
        assert_eq!(i.rest(), b"c");
        assert!(i.is_empty());
    }
}
