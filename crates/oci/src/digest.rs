//! Content digests (`sha256:<64 hex>`), the only algorithm the daemon accepts, and a reader
//! that verifies one while it streams.

use std::fmt;
use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

use crate::Error;

/// A `sha256:` digest, checked to be 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    pub fn parse(text: &str) -> Result<Self, Error> {
        let hex = text
            .strip_prefix("sha256:")
            .ok_or_else(|| Error::Invalid(format!("digest {text:?}: only sha256 is supported")))?;
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(Error::Invalid(format!(
                "digest {text:?} is not sha256:<64 hex digits>"
            )));
        }
        Ok(Self(text.to_owned()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }

    /// The 64 hex digits, safe as a file name.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Digest::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Reads through to `inner`, hashing what passes; at the end (and only there) the bytes must
/// be exactly `size` long and hash to `digest`, else the read fails with `InvalidData`. More
/// than `size` bytes fail as soon as they arrive: a lying source cannot make us read on.
pub struct Verified<R> {
    inner: R,
    hasher: Sha256,
    expected: Digest,
    size: u64,
    read: u64,
    done: bool,
}

impl<R> Verified<R> {
    pub fn new(inner: R, expected: Digest, size: u64) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            expected,
            size,
            read: 0,
            done: false,
        }
    }
}

/// The message a [`Verified`] read fails with; [`is_mismatch`] finds it again.
const MISMATCH: &str = "belljar-oci: content does not match its digest or size";

/// Whether an I/O error is a [`Verified`] reader's mismatch.
pub fn is_mismatch(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::InvalidData && e.to_string().starts_with(MISMATCH)
}

impl<R: Read> Read for Verified<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{MISMATCH}: {} is longer than its {} bytes",
                    self.expected, self.size
                ),
            ));
        }
        self.hasher.update(&buf[..n]);
        if n == 0 {
            self.done = true;
            let got = format!("sha256:{}", hex::encode(self.hasher.clone().finalize()));
            if self.read != self.size || got != self.expected.as_str() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{MISMATCH}: expected {} ({} bytes), got {got} ({} bytes)",
                        self.expected, self.size, self.read
                    ),
                ));
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_sha256() {
        let d = Digest::of(b"abc");
        assert_eq!(Digest::parse(d.as_str()).unwrap(), d);
        assert!(Digest::parse("sha512:00").is_err());
        assert!(Digest::parse("sha256:../../etc").is_err());
        assert!(Digest::parse(&d.as_str().to_uppercase().replace("SHA256", "sha256")).is_err());
    }

    #[test]
    fn verified_reader_refuses_wrong_content_and_size() {
        let d = Digest::of(b"hello");
        let mut out = Vec::new();
        Verified::new(&b"hello"[..], d.clone(), 5)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"hello");
        let e = Verified::new(&b"hellp"[..], d.clone(), 5)
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(is_mismatch(&e), "{e}");
        let e = Verified::new(&b"hello!"[..], d.clone(), 5)
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(is_mismatch(&e), "{e}");
        let e = Verified::new(&b"hell"[..], d, 5)
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(is_mismatch(&e), "{e}");
    }
}
