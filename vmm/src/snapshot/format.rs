//! The snapshot state file: what a restore trusts, so it is checked before anything is used.
//!
//! Layout (little endian): magic `BJVMSNAP` (8 bytes), format version (u32), length of the
//! VMM version string (u16) and the string, length of the state (u64) and the state (JSON),
//! then a CRC-32 of every byte before it. Reads are bounded by `MAX_STATE_LEN`, so a hostile
//! or broken file cannot make the VMM allocate more than that. A file made by another VMM
//! version is refused before its state is parsed (the state's layout may differ).

use std::io::Read;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The file's first bytes.
pub const MAGIC: [u8; 8] = *b"BJVMSNAP";
/// Bumped whenever the layout above changes.
pub const FORMAT_VERSION: u32 = 1;
/// The largest state a restore reads (vCPU and device state of 32 vCPUs is far below it).
pub const MAX_STATE_LEN: u64 = 16 << 20;
/// The VMM version a snapshot must have been made by.
pub const VMM_VERSION: &str = env!("CARGO_PKG_VERSION");
const MAX_VERSION_LEN: usize = 256;

/// Why a state file was refused. `code()` is the stable name the VMM reports.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot read snapshot file {0}
    Io(String, #[source] std::io::Error),
    /// Cannot write snapshot file {0}
    Write(String, #[source] std::io::Error),
    /// Not a belljar-vmm snapshot (bad magic)
    BadMagic,
    /// Snapshot format {0} is not this VMM's format
    FormatVersion(u32),
    /// Snapshot made by belljar-vmm {0}, not by this version
    VmmVersion(String),
    /// Snapshot state of {0} bytes is over the limit
    TooLarge(u64),
    /// Snapshot file is truncated
    Truncated,
    /// Snapshot checksum does not match its contents
    Checksum,
    /// Snapshot state cannot be parsed: {0}
    Corrupt(String),
}

impl Error {
    /// The stable code for this refusal.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Io(..) | Error::Write(..) => "io",
            Error::BadMagic => "bad_magic",
            Error::FormatVersion(_) => "format_version",
            Error::VmmVersion(_) => "vmm_version",
            Error::TooLarge(_) => "too_large",
            Error::Truncated => "truncated",
            Error::Checksum => "checksum",
            Error::Corrupt(_) => "corrupt",
        }
    }
}

/// The whole file for `state`, made by this VMM.
pub fn encode<T: Serialize>(state: &T) -> Result<Vec<u8>, Error> {
    encode_as(state, VMM_VERSION)
}

fn encode_as<T: Serialize>(state: &T, version: &str) -> Result<Vec<u8>, Error> {
    let json = serde_json::to_vec(state).map_err(|e| Error::Corrupt(e.to_string()))?;
    let mut out = Vec::with_capacity(json.len() + 64);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    let v = version.as_bytes();
    let vlen = u16::try_from(v.len().min(MAX_VERSION_LEN)).expect("short version");
    out.extend_from_slice(&vlen.to_le_bytes());
    out.extend_from_slice(&v[..usize::from(vlen)]);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Writes `state` to `path` (through a temporary file, so `path` is whole or absent).
pub fn write<T: Serialize>(path: &Path, state: &T) -> Result<(), Error> {
    let bytes = encode(state)?;
    let name = path.display().to_string();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, &bytes).map_err(|e| Error::Write(name.clone(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::Write(name, e))
}

/// Writes `state` into `file` (emptied first), for a file opened by someone else.
pub fn write_file<T: Serialize>(file: &std::fs::File, state: &T) -> Result<(), Error> {
    use std::io::{Seek, Write};
    let bytes = encode(state)?;
    let name = "state".to_string();
    let mut f = file;
    f.set_len(0)
        .and_then(|()| f.rewind())
        .and_then(|()| f.write_all(&bytes))
        .and_then(|()| f.sync_data())
        .map_err(|e| Error::Write(name, e))
}

/// Reads exactly `buf.len()` bytes; a short read is `Truncated`.
fn take(r: &mut impl Read, buf: &mut [u8]) -> Result<(), Error> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => Error::Truncated,
        _ => Error::Io(String::new(), e),
    })
}

/// Parses and checks a whole file, never reading more than its limits allow.
pub fn decode<T: DeserializeOwned>(r: &mut impl Read) -> Result<T, Error> {
    let mut crc = crc32fast::Hasher::new();
    let mut head = [0u8; 14];
    take(r, &mut head)?;
    if head[..8] != MAGIC {
        return Err(Error::BadMagic);
    }
    let format = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    if format != FORMAT_VERSION {
        return Err(Error::FormatVersion(format));
    }
    crc.update(&head);
    let vlen = usize::from(u16::from_le_bytes([head[12], head[13]]));
    if vlen > MAX_VERSION_LEN {
        return Err(Error::Corrupt(format!("version string of {vlen} bytes")));
    }
    let mut version = vec![0u8; vlen];
    take(r, &mut version)?;
    crc.update(&version);
    let mut len = [0u8; 8];
    take(r, &mut len)?;
    crc.update(&len);
    let len = u64::from_le_bytes(len);
    if len > MAX_STATE_LEN {
        return Err(Error::TooLarge(len));
    }
    let mut json = vec![0u8; crate::conv::to_usize(len)];
    take(r, &mut json)?;
    crc.update(&json);
    let mut sum = [0u8; 4];
    take(r, &mut sum)?;
    if u32::from_le_bytes(sum) != crc.finalize() {
        return Err(Error::Checksum);
    }
    let version = String::from_utf8_lossy(&version).into_owned();
    if version != VMM_VERSION {
        return Err(Error::VmmVersion(version));
    }
    serde_json::from_slice(&json).map_err(|e| Error::Corrupt(e.to_string()))
}

/// Reads and checks the state file at `path`.
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<T, Error> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| Error::Io(name.clone(), e))?;
    let mut r = std::io::BufReader::new(file);
    decode(&mut r).map_err(|e| match e {
        Error::Io(_, e) => Error::Io(name, e),
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct S {
        a: u32,
        b: Vec<u8>,
    }

    fn sample() -> S {
        S {
            a: 7,
            b: vec![1, 2, 3],
        }
    }

    fn dec(bytes: &[u8]) -> Result<S, Error> {
        decode(&mut &bytes[..])
    }

    #[test]
    fn round_trip() {
        assert_eq!(dec(&encode(&sample()).unwrap()).unwrap(), sample());
    }

    #[test]
    fn a_flipped_byte_fails_the_checksum() {
        let mut f = encode(&sample()).unwrap();
        let n = f.len();
        f[n - 10] ^= 1;
        assert!(matches!(dec(&f), Err(Error::Checksum)), "{:?}", dec(&f));
    }

    #[test]
    fn another_format_or_magic_is_refused() {
        let mut f = encode(&sample()).unwrap();
        f[8] = 9;
        assert_eq!(dec(&f).unwrap_err().code(), "format_version");
        f[0] = b'X';
        assert_eq!(dec(&f).unwrap_err().code(), "bad_magic");
    }

    #[test]
    fn another_vmm_version_is_refused_by_name() {
        let f = encode_as(&sample(), "0.0.1-other").unwrap();
        let e = dec(&f).unwrap_err();
        assert_eq!(e.code(), "vmm_version");
        assert!(e.to_string().contains("0.0.1-other"), "{e}");
    }

    #[test]
    fn every_truncation_is_refused() {
        let f = encode(&sample()).unwrap();
        for n in 0..f.len() {
            assert_eq!(dec(&f[..n]).unwrap_err().code(), "truncated", "at {n}");
        }
    }

    #[test]
    fn an_oversized_length_is_refused_before_allocating() {
        let mut f = encode(&sample()).unwrap();
        let at = 14 + VMM_VERSION.len();
        f[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(dec(&f), Err(Error::TooLarge(u64::MAX))));
    }
}
