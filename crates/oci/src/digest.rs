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

/// Content checked against a digest, and against a declared size when there is one, as it
/// passes: [`update`](Self::update) with each piece (more than the size fails at once, so a
/// lying source cannot make us read on), then [`finish`](Self::finish).
pub struct Check {
    hasher: Sha256,
    expected: Digest,
    size: Option<u64>,
    seen: u64,
}

/// Content that is not what its digest (or size) says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub expected: Digest,
    pub size: Option<u64>,
    /// The bytes seen so far.
    pub seen: u64,
    /// The content's digest, when it ended; `None` when it outgrew its size.
    pub got: Option<Digest>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let declared = self
            .size
            .map(|s| format!(" ({s} bytes)"))
            .unwrap_or_default();
        match &self.got {
            None => write!(
                f,
                "{MISMATCH}: {}{declared} is longer than that",
                self.expected
            ),
            Some(got) => write!(
                f,
                "{MISMATCH}: expected {}{declared}, got {got} ({} bytes)",
                self.expected, self.seen
            ),
        }
    }
}

impl std::error::Error for Mismatch {}

impl From<Mismatch> for io::Error {
    fn from(m: Mismatch) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, m.to_string())
    }
}

impl From<Mismatch> for Error {
    fn from(m: Mismatch) -> Self {
        Error::Invalid(m.to_string())
    }
}

impl Check {
    pub fn new(expected: Digest, size: Option<u64>) -> Self {
        Self {
            hasher: Sha256::new(),
            expected,
            size,
            seen: 0,
        }
    }

    pub fn update(&mut self, bytes: &[u8]) -> Result<(), Mismatch> {
        self.seen += bytes.len() as u64;
        if self.size.is_some_and(|size| self.seen > size) {
            return Err(self.mismatch(None));
        }
        self.hasher.update(bytes);
        Ok(())
    }

    /// At the content's end: it must be exactly the size and hash to the digest.
    pub fn finish(self) -> Result<(), Mismatch> {
        let got = Digest(format!(
            "sha256:{}",
            hex::encode(self.hasher.clone().finalize())
        ));
        if got != self.expected || self.size.is_some_and(|size| self.seen != size) {
            return Err(self.mismatch(Some(got)));
        }
        Ok(())
    }

    fn mismatch(&self, got: Option<Digest>) -> Mismatch {
        Mismatch {
            expected: self.expected.clone(),
            size: self.size,
            seen: self.seen,
            got,
        }
    }
}

/// Reads through to `inner`, [checking](Check) what passes: the read that meets the end fails
/// with `InvalidData` unless the content matched, and one past the size fails at once.
pub struct Verified<R> {
    inner: R,
    check: Option<Check>,
}

impl<R> Verified<R> {
    pub fn new(inner: R, expected: Digest, size: Option<u64>) -> Self {
        Self {
            inner,
            check: Some(Check::new(expected, size)),
        }
    }
}

/// The start of a mismatch's message; [`is_mismatch`] finds it again.
const MISMATCH: &str = "belljar-oci: content does not match its digest or size";

/// Whether an I/O error is a [`Verified`] reader's mismatch.
pub fn is_mismatch(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::InvalidData && e.to_string().starts_with(MISMATCH)
}

impl<R: Read> Read for Verified<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(check) = self.check.as_mut() else {
            return Ok(0);
        };
        let n = self.inner.read(buf)?;
        check.update(&buf[..n])?;
        if n == 0
            && let Some(check) = self.check.take()
        {
            check.finish()?;
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
        Verified::new(&b"hello"[..], d.clone(), Some(5))
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"hello");
        let e = Verified::new(&b"hellp"[..], d.clone(), Some(5))
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(is_mismatch(&e), "{e}");
        let e = Verified::new(&b"hello!"[..], d.clone(), Some(5))
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(is_mismatch(&e), "{e}");
        let e = Verified::new(&b"hell"[..], d, Some(5))
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(is_mismatch(&e), "{e}");
    }

    #[test]
    fn a_check_without_a_size_checks_the_digest_only() {
        let d = Digest::of(b"hello world");
        let mut c = Check::new(d.clone(), None);
        c.update(b"hello ").unwrap();
        c.update(b"world").unwrap();
        c.finish().unwrap();
        let mut c = Check::new(d, None);
        c.update(b"hello").unwrap();
        let m = c.finish().unwrap_err();
        assert_eq!(m.seen, 5);
        assert!(m.got.is_some());
        assert!(is_mismatch(&io::Error::from(m)));
    }
}
