//! Small helpers shared across modules: the clock and id generation.

use rand::Rng;

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub use belljar_api::error_chain;

/// A new id: `prefix_` and 12 lowercase letters and digits.
pub fn new_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    let tail: String = (0..12)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}_{tail}")
}

/// Whether `id` looks like an id this daemon made (`prefix_` + lowercase letters and digits),
/// so that nothing else reaches a file path.
pub fn is_id(prefix: &str, id: &str) -> bool {
    id.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('_'))
        .is_some_and(|tail| {
            !tail.is_empty()
                && tail
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// Whether `path` is an ELF executable with no program interpreter (statically linked): one
/// that runs in a root with no C library.
pub fn is_static_elf(path: &std::path::Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let mut head = [0u8; 64];
    if f.read_exact(&mut head).is_err() || &head[..4] != b"\x7fELF" || head[4] != 2 {
        return false;
    }
    let phoff = u64::from_le_bytes(head[32..40].try_into().unwrap_or_default());
    let phentsize = usize::from(u16::from_le_bytes([head[54], head[55]]));
    let phnum = usize::from(u16::from_le_bytes([head[56], head[57]]));
    if phentsize < 4 || phnum == 0 || phnum > 256 {
        return false;
    }
    let mut table = vec![0u8; phentsize * phnum];
    if f.seek(SeekFrom::Start(phoff)).is_err() || f.read_exact(&mut table).is_err() {
        return false;
    }
    /// `PT_INTERP`: the program asks for a dynamic loader.
    const PT_INTERP: u32 = 3;
    !table
        .chunks(phentsize)
        .any(|h| u32::from_le_bytes([h[0], h[1], h[2], h[3]]) == PT_INTERP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_recognised_and_path_tricks_are_not() {
        let id = new_id("sbx");
        assert!(is_id("sbx", &id), "{id}");
        assert_ne!(id, new_id("sbx"));
        assert!(!is_id("sbx", "sbx_../../etc"));
        assert!(!is_id("sbx", "sbx_"));
        assert!(!is_id("sbx", "cmd_abc"));
        assert!(!is_id("sbx", "sbx_ABC"));
    }

    #[test]
    fn tells_static_from_dynamic_executables() {
        // This test binary is linked dynamically (it has an interpreter); a text file is no ELF.
        let me = std::env::current_exe().unwrap();
        assert!(!is_static_elf(&me));
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("t");
        std::fs::write(&text, "#!/bin/sh\n").unwrap();
        assert!(!is_static_elf(&text));
        // busybox-static (installed by the set-up) is static.
        let busybox = std::path::Path::new("/bin/busybox");
        if busybox.is_file() {
            assert!(is_static_elf(busybox));
        }
    }
}
