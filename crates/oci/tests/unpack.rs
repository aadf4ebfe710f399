//! `unpack::apply` against ordinary and hostile layers, built here header by header (the
//! tar crate's builder refuses the names a hostile layer has, so names are written raw).
//! Runs as root or not: owners and root-only attributes are checked only as root.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use belljar_oci::Error;
use belljar_oci::unpack::{self, Limits, Stats};
use tar::{EntryType, Header};

const LIMITS: Limits = Limits {
    max_bytes: 64 << 20,
    max_entries: 1000,
};

/// A layer under construction.
struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    fn new() -> Self {
        Layer(tar::Builder::new(Vec::new()))
    }

    /// Appends an entry with `name` and `link` written as they are, however hostile.
    fn raw(
        &mut self,
        name: &str,
        kind: EntryType,
        mode: u32,
        link: &str,
        data: &[u8],
        edit: impl FnOnce(&mut Header),
    ) -> &mut Self {
        let mut header = Header::new_ustar();
        let old = header.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(data.len() as u64);
        header.set_mtime(1_600_000_000);
        edit(&mut header);
        header.set_cksum();
        self.0.append(&header, data).unwrap();
        self
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> &mut Self {
        self.raw(name, EntryType::Regular, mode, "", data, |_| {})
    }

    fn dir(&mut self, name: &str, mode: u32) -> &mut Self {
        self.raw(name, EntryType::Directory, mode, "", b"", |_| {})
    }

    fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(name, EntryType::Symlink, 0o777, target, b"", |_| {})
    }

    fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(name, EntryType::Link, 0o644, target, b"", |_| {})
    }

    /// A PAX header whose records describe the next entry.
    fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        let mut data = Vec::new();
        for (key, value) in records {
            // "<len> <key>=<value>\n", where <len> counts itself.
            let rest = key.len() + value.len() + 3;
            let mut len = rest + 1;
            while len != rest + len.to_string().len() {
                len = rest + len.to_string().len();
            }
            data.extend_from_slice(format!("{len} {key}=").as_bytes());
            data.extend_from_slice(value);
            data.push(b'\n');
        }
        self.raw("pax", EntryType::XHeader, 0o644, "", &data, |_| {})
    }

    fn bytes(&mut self) -> Vec<u8> {
        self.0.get_mut().extend_from_slice(&[0; 1024]);
        self.0.get_ref().clone()
    }
}

/// A root directory inside a scratch directory, so that anything written beside the root
/// can be seen.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("root")).unwrap();
        Scratch { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root().join(relative)
    }

    fn apply(&self, layer: &mut Layer) -> Result<Stats, Error> {
        let mut used = 0;
        unpack::apply(&self.root(), &layer.bytes()[..], &LIMITS, &mut used)
    }

    /// Asserts that the scratch directory holds the root and nothing else.
    fn assert_only_root(&self) {
        let names: Vec<_> = fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["root"]);
    }

    fn names(&self, relative: &str) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(self.path(relative))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn invalid_naming(result: Result<Stats, Error>, name: &str) -> String {
    match result {
        Err(e @ Error::Invalid(_)) => {
            assert_eq!(e.code(), "image_invalid");
            let message = e.to_string();
            assert!(message.contains(name), "{message:?} does not name {name:?}");
            message
        }
        other => panic!("expected Invalid naming {name:?}, got {other:?}"),
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

fn exists(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok()
}

#[test]
fn ordinary_entries_get_their_contents_modes_owners_and_times() {
    let scratch = Scratch::new();
    let mut layer = Layer::new();
    layer
        .dir("./usr/", 0o755)
        .dir("usr/bin/", 0o755)
        .raw("usr/bin/su", EntryType::Regular, 0o4755, "", b"#!su", |h| {
            h.set_uid(1234);
            h.set_gid(5678);
            h.set_mtime(1_234_567_890);
        })
        .raw("tmp/", EntryType::Directory, 0o1777, "", b"", |h| {
            h.set_mtime(1_111_111_111)
        })
        .file("tmp/scratch", 0o600, b"x")
        .dir("ro/", 0o555)
        .file("ro/inside", 0o444, b"read only")
        .symlink("usr/bin/sh", "/bin/busybox")
        .symlink("usr/rel", "bin/su")
        .hardlink("usr/bin/su2", "usr/bin/su")
        .raw("run/fifo", EntryType::Fifo, 0o620, "", b"", |_| {})
        .raw("sgid", EntryType::Regular, 0o2750, "", b"", |_| {});
    let stats = scratch.apply(&mut layer).unwrap();
    assert_eq!(
        stats,
        Stats {
            entries: 12,
            bytes: 14,
            whiteouts: 0,
            skipped_devices: 0
        }
    );

    let su = scratch.path("usr/bin/su");
    assert_eq!(fs::read(&su).unwrap(), b"#!su");
    assert_eq!(mode(&su), 0o4755);
    let meta = fs::metadata(&su).unwrap();
    assert_eq!(meta.mtime(), 1_234_567_890);
    if is_root() {
        assert_eq!((meta.uid(), meta.gid()), (1234, 5678));
        assert_eq!(mode(&scratch.path("sgid")), 0o2750);
    }
    // Directory modes and times hold although entries were written into them afterwards.
    let tmp = scratch.path("tmp");
    assert_eq!(mode(&tmp), 0o1777);
    assert_eq!(fs::metadata(&tmp).unwrap().mtime(), 1_111_111_111);
    assert_eq!(mode(&scratch.path("ro")), 0o555);
    assert_eq!(fs::read(scratch.path("ro/inside")).unwrap(), b"read only");
    // A missing parent is made, 0755.
    assert!(scratch.path("run").is_dir());
    assert_eq!(mode(&scratch.path("run")), 0o755);

    assert_eq!(
        fs::read_link(scratch.path("usr/bin/sh")).unwrap(),
        Path::new("/bin/busybox")
    );
    assert_eq!(
        fs::read_link(scratch.path("usr/rel")).unwrap(),
        Path::new("bin/su")
    );
    assert_eq!(
        fs::symlink_metadata(scratch.path("usr/bin/sh"))
            .unwrap()
            .mtime(),
        1_600_000_000
    );
    let su2 = fs::metadata(scratch.path("usr/bin/su2")).unwrap();
    assert_eq!(su2.ino(), meta.ino());
    assert_eq!(su2.nlink(), 2);

    let fifo = fs::symlink_metadata(scratch.path("run/fifo")).unwrap();
    assert!(fifo.file_type().is_fifo());
    assert_eq!(fifo.permissions().mode() & 0o7777, 0o620);
    scratch.assert_only_root();
}

#[test]
fn absolute_names_are_taken_relative_to_the_root() {
    let scratch = Scratch::new();
    let mut layer = Layer::new();
    layer
        .file("/abs/file", 0o644, b"in")
        .file("//./x//./y", 0o644, b"y");
    scratch.apply(&mut layer).unwrap();
    assert_eq!(fs::read(scratch.path("abs/file")).unwrap(), b"in");
    assert_eq!(fs::read(scratch.path("x/y")).unwrap(), b"y");
    scratch.assert_only_root();
}

#[test]
fn pax_mtime_keeps_nanoseconds() {
    let scratch = Scratch::new();
    let mut layer = Layer::new();
    layer
        .pax(&[("mtime", b"1500000000.123456789")])
        .file("f", 0o644, b"");
    scratch.apply(&mut layer).unwrap();
    let meta = fs::metadata(scratch.path("f")).unwrap();
    assert_eq!(
        (meta.mtime(), meta.mtime_nsec()),
        (1_500_000_000, 123_456_789)
    );
}

#[test]
fn whiteouts_remove_a_file_and_a_directory_of_a_lower_layer() {
    let scratch = Scratch::new();
    let mut lower = Layer::new();
    lower
        .file("a/file", 0o644, b"1")
        .file("a/stays", 0o644, b"2")
        .file("d/x", 0o644, b"3")
        .file("d/sub/y", 0o644, b"4")
        .symlink("d/link", "/");
    scratch.apply(&mut lower).unwrap();

    let mut upper = Layer::new();
    upper
        .file("a/.wh.file", 0o644, b"")
        .file(".wh.d", 0o644, b"")
        .file(".wh.never-was", 0o644, b"")
        .file("missing/.wh.x", 0o644, b"");
    let stats = scratch.apply(&mut upper).unwrap();
    assert_eq!(stats.whiteouts, 4);
    assert_eq!(scratch.names(""), ["a"]);
    assert_eq!(scratch.names("a"), ["stays"]);
    scratch.assert_only_root();
}

#[test]
fn an_opaque_directory_keeps_only_this_layers_entries() {
    let scratch = Scratch::new();
    let mut lower = Layer::new();
    lower
        .file("o/lower", 0o644, b"")
        .file("o/kept-dir/lower", 0o644, b"")
        .file("o/gone-dir/lower", 0o644, b"")
        .file("o/replaced", 0o644, b"lower")
        .file("beside", 0o644, b"");
    scratch.apply(&mut lower).unwrap();

    let mut upper = Layer::new();
    upper
        .dir("o/", 0o755)
        .file("o/before", 0o644, b"")
        .dir("o/kept-dir/", 0o755)
        .file("o/kept-dir/new", 0o644, b"")
        .file("o/replaced", 0o644, b"upper")
        .file("o/.wh..wh..opq", 0o644, b"")
        .file("o/after", 0o644, b"");
    let stats = scratch.apply(&mut upper).unwrap();
    assert_eq!(stats.whiteouts, 1);
    assert_eq!(
        scratch.names("o"),
        ["after", "before", "kept-dir", "replaced"]
    );
    assert_eq!(scratch.names("o/kept-dir"), ["new"]);
    assert_eq!(fs::read(scratch.path("o/replaced")).unwrap(), b"upper");
    assert!(exists(&scratch.path("beside")));
}

#[test]
fn malformed_whiteouts_are_refused() {
    for name in ["a/.wh..", "a/.wh...", ".wh."] {
        let scratch = Scratch::new();
        let mut layer = Layer::new();
        layer.dir("a/", 0o755).file(name, 0o644, b"");
        invalid_naming(scratch.apply(&mut layer), name);
        assert!(exists(&scratch.path("a")), "{name} removed its directory");
    }
}

#[test]
fn dot_dot_is_refused_and_nothing_is_written_outside() {
    for name in ["../escape", "a/../../escape", "./../escape", "/../escape"] {
        let scratch = Scratch::new();
        let mut layer = Layer::new();
        layer.file(name, 0o644, b"out");
        let message = invalid_naming(scratch.apply(&mut layer), name);
        assert!(message.contains(".."), "{message}");
        scratch.assert_only_root();
        assert!(scratch.names("").is_empty());
    }
}

#[test]
fn a_link_to_the_host_root_is_followed_inside_the_root() {
    let scratch = Scratch::new();
    // A name no file on the host has, so that an escape could not go unseen.
    let unique = scratch
        .dir
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .map(|name| format!("pwned{name}"))
        .unwrap();
    let mut layer = Layer::new();
    layer
        .symlink("evil", "/")
        .file(&format!("evil/tmp/{unique}"), 0o644, b"pwned")
        .symlink("up", "../../../..")
        .file(&format!("up/{unique}-up"), 0o644, b"pwned")
        .symlink("etc", "/tmp")
        .file(&format!("etc/{unique}-etc"), 0o644, b"pwned");
    scratch.apply(&mut layer).unwrap();
    assert_eq!(
        fs::read(scratch.path(&format!("tmp/{unique}"))).unwrap(),
        b"pwned"
    );
    assert!(exists(&scratch.path(&format!("{unique}-up"))));
    assert!(exists(&scratch.path(&format!("tmp/{unique}-etc"))));
    for outside in [
        format!("/tmp/{unique}"),
        format!("/{unique}-up"),
        format!("/tmp/{unique}-etc"),
    ] {
        assert!(!exists(Path::new(&outside)), "{outside} was written");
    }
    scratch.assert_only_root();
}

#[test]
fn a_hard_link_cannot_reach_a_host_file() {
    for target in ["etc/passwd", "/etc/passwd", "../../etc/passwd"] {
        let scratch = Scratch::new();
        let mut layer = Layer::new();
        layer.hardlink("pw", target);
        invalid_naming(scratch.apply(&mut layer), "pw");
        assert!(!exists(&scratch.path("pw")));
        scratch.assert_only_root();
    }
}

#[test]
fn a_hard_link_through_a_linked_directory_stays_inside() {
    let scratch = Scratch::new();
    let mut layer = Layer::new();
    layer
        .symlink("hostetc", "/etc")
        .hardlink("pw", "hostetc/passwd");
    invalid_naming(scratch.apply(&mut layer), "pw");
    assert!(!exists(&scratch.path("pw")));

    let mut layer = Layer::new();
    layer
        .file("etc/passwd", 0o644, b"root:x:0:0::/root:/bin/sh\n")
        .hardlink("pw", "hostetc/passwd");
    scratch.apply(&mut layer).unwrap();
    let pw = fs::metadata(scratch.path("pw")).unwrap();
    assert_eq!(
        pw.ino(),
        fs::metadata(scratch.path("etc/passwd")).unwrap().ino()
    );
    if let Ok(host) = fs::metadata("/etc/passwd") {
        assert_ne!((pw.dev(), pw.ino()), (host.dev(), host.ino()));
    }
    scratch.assert_only_root();
}

#[test]
fn a_hard_link_to_a_directory_or_to_nothing_is_refused() {
    let scratch = Scratch::new();
    let mut layer = Layer::new();
    layer.dir("d/", 0o755).hardlink("to-dir", "d");
    let message = invalid_naming(scratch.apply(&mut layer), "to-dir");
    assert!(message.contains("directory"), "{message}");

    let mut layer = Layer::new();
    layer.hardlink("self", "self");
    invalid_naming(scratch.apply(&mut layer), "self");
}

#[test]
fn devices_are_skipped_and_counted() {
    let scratch = Scratch::new();
    let mut layer = Layer::new();
    layer
        .raw("dev/null", EntryType::Char, 0o666, "", b"", |h| {
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
        })
        .raw("dev/sda", EntryType::Block, 0o660, "", b"", |h| {
            h.set_device_major(8).unwrap();
            h.set_device_minor(0).unwrap();
        })
        .file("dev/keep", 0o644, b"");
    let stats = scratch.apply(&mut layer).unwrap();
    assert_eq!(stats.skipped_devices, 2);
    assert_eq!(stats.entries, 3);
    assert_eq!(scratch.names("dev"), ["keep"]);
}

/// The bytes a root's files take on disk.
fn disk_usage(path: &Path) -> u64 {
    let meta = fs::symlink_metadata(path).unwrap();
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        for entry in fs::read_dir(path).unwrap() {
            total += disk_usage(&entry.unwrap().path());
        }
    }
    total
}

#[test]
fn a_tar_bomb_fails_before_it_is_written() {
    let scratch = Scratch::new();
    // A header declaring 10 GiB, followed by only a little of it: the refusal must come
    // from the header, before any data is read.
    let mut header = Header::new_ustar();
    header.set_path("bomb").unwrap();
    header.set_entry_type(EntryType::Regular);
    header.set_mode(0o644);
    header.set_size(10 << 30);
    header.set_cksum();
    let mut tar = header.as_bytes().to_vec();
    tar.extend_from_slice(&[0; 4096]);
    let limits = Limits {
        max_bytes: 1 << 20,
        max_entries: 100,
    };
    let mut used = 0;
    match unpack::apply(&scratch.root(), &tar[..], &limits, &mut used) {
        Err(e @ Error::TooLarge { limit: 1_048_576 }) => assert_eq!(e.code(), "image_too_large"),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(!exists(&scratch.path("bomb")));
    assert!(disk_usage(&scratch.root()) < 64 << 10);
}

#[test]
fn the_byte_limit_counts_across_files_and_layers() {
    let scratch = Scratch::new();
    let limits = Limits {
        max_bytes: 1000,
        max_entries: 100,
    };
    let mut used = 0;
    let mut first = Layer::new();
    first.file("a", 0o644, &[1; 600]);
    let stats = unpack::apply(&scratch.root(), &first.bytes()[..], &limits, &mut used).unwrap();
    assert_eq!((stats.bytes, used), (600, 600));

    let mut second = Layer::new();
    second
        .file("b", 0o644, &[2; 300])
        .file("c", 0o644, &[3; 300]);
    let result = unpack::apply(&scratch.root(), &second.bytes()[..], &limits, &mut used);
    assert!(
        matches!(result, Err(Error::TooLarge { limit: 1000 })),
        "{result:?}"
    );
    assert!(exists(&scratch.path("b")));
    assert!(!exists(&scratch.path("c")));
}

#[test]
fn too_many_entries_are_refused() {
    let scratch = Scratch::new();
    let mut layer = Layer::new();
    for i in 0..5 {
        layer.file(&format!("f{i}"), 0o644, b"");
    }
    let limits = Limits {
        max_bytes: 1 << 20,
        max_entries: 4,
    };
    let result = unpack::apply(&scratch.root(), &layer.bytes()[..], &limits, &mut 0);
    match result {
        Err(Error::Invalid(message)) => assert!(message.contains("more than 4 entries")),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn an_oversized_long_name_is_refused_without_reading_it_all() {
    let scratch = Scratch::new();
    // A GNU long name claiming 1 GiB: the tar crate would read it into memory.
    let mut header = Header::new_gnu();
    header.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
    header.set_entry_type(EntryType::GNULongName);
    header.set_size(1 << 30);
    header.set_cksum();
    let mut tar = header.as_bytes().to_vec();
    tar.resize(tar.len() + (4 << 20), b'a');
    match unpack::apply(&scratch.root(), &tar[..], &LIMITS, &mut 0) {
        Err(Error::Invalid(message)) => assert!(message.contains("tar headers"), "{message}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn compressed_layers_are_recognised_by_their_magic() {
    let mut layer = Layer::new();
    layer.file("hello", 0o644, b"world");
    let tar = layer.bytes();

    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(&tar).unwrap();
    let gzip = gzip.finish().unwrap();
    let zstd = zstd::encode_all(&tar[..], 3).unwrap();

    for (kind, bytes) in [("plain", tar.clone()), ("gzip", gzip), ("zstd", zstd)] {
        let scratch = Scratch::new();
        let stream = unpack::decompressed(&bytes[..]).unwrap();
        let stats = unpack::apply(&scratch.root(), stream, &LIMITS, &mut 0)
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(stats.entries, 1, "{kind}");
        assert_eq!(fs::read(scratch.path("hello")).unwrap(), b"world", "{kind}");
    }
    // Fewer bytes than any magic: an (empty) plain stream, not an error.
    let mut short = unpack::decompressed(&[0x1f][..]).unwrap();
    let mut read = Vec::new();
    std::io::Read::read_to_end(&mut short, &mut read).unwrap();
    assert_eq!(read, [0x1f]);
}

/// A file capability granting cap_net_bind_service, effective (`vfs_cap_data`, revision 2).
const NET_BIND_CAP: [u8; 20] = [
    0x01, 0, 0, 0x02, // magic: revision 2, effective
    0x00, 0x04, 0, 0, // permitted, low word: bit 10
    0, 0, 0, 0, // inheritable, low word
    0, 0, 0, 0, // permitted, high word
    0, 0, 0, 0, // inheritable, high word
];

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0; 256];
    rustix::fs::lgetxattr(path, name, &mut buf[..])
        .ok()
        .map(|n| buf[..n].to_vec())
}

#[test]
fn extended_attributes_are_set_by_namespace() {
    let scratch = Scratch::new();
    let mut layer = Layer::new();
    layer
        .pax(&[
            ("SCHILY.xattr.user.test", b"hello"),
            ("SCHILY.xattr.security.capability", &NET_BIND_CAP),
            ("SCHILY.xattr.trusted.overlay.opaque", b"y"),
        ])
        .raw("ping", EntryType::Regular, 0o755, "", b"bin", |h| {
            h.set_uid(1000);
            h.set_gid(1000);
        })
        .pax(&[("SCHILY.xattr.user.dir", b"d")])
        .dir("d/", 0o755);
    scratch.apply(&mut layer).unwrap();
    let ping = scratch.path("ping");
    assert_eq!(xattr(&ping, "user.test").as_deref(), Some(&b"hello"[..]));
    assert_eq!(
        xattr(&scratch.path("d"), "user.dir").as_deref(),
        Some(&b"d"[..])
    );
    assert_eq!(xattr(&ping, "trusted.overlay.opaque"), None);
    if is_root() {
        // Set after the chown, which would have cleared it.
        assert_eq!(
            xattr(&ping, "security.capability").as_deref(),
            Some(&NET_BIND_CAP[..])
        );
    } else {
        assert_eq!(xattr(&ping, "security.capability"), None);
    }
}

#[test]
fn entries_replace_each_other_across_layers() {
    let scratch = Scratch::new();
    let mut lower = Layer::new();
    lower
        .dir("x/", 0o755)
        .file("x/child", 0o644, b"")
        .dir("x/deeper/", 0o755)
        .file("x/deeper/leaf", 0o644, b"")
        .file("y", 0o644, b"file")
        .symlink("z", "/")
        .dir("keep/", 0o700)
        .file("keep/old", 0o644, b"");
    scratch.apply(&mut lower).unwrap();

    let mut upper = Layer::new();
    upper
        .file("x", 0o600, b"now a file")
        .dir("y/", 0o750)
        .file("y/inner", 0o644, b"")
        .dir("z/", 0o755)
        .dir("keep/", 0o711);
    scratch.apply(&mut upper).unwrap();
    assert_eq!(fs::read(scratch.path("x")).unwrap(), b"now a file");
    assert!(scratch.path("y").is_dir());
    assert_eq!(mode(&scratch.path("y")), 0o750);
    assert_eq!(scratch.names("y"), ["inner"]);
    // The link is replaced, not followed.
    assert!(fs::symlink_metadata(scratch.path("z")).unwrap().is_dir());
    // A directory over a directory stays, contents and all, with the new mode.
    assert_eq!(scratch.names("keep"), ["old"]);
    assert_eq!(mode(&scratch.path("keep")), 0o711);
    scratch.assert_only_root();
}

#[test]
fn a_parent_that_is_not_a_directory_is_refused() {
    let scratch = Scratch::new();
    let mut layer = Layer::new();
    layer.file("f", 0o644, b"").file("f/x", 0o644, b"");
    let message = invalid_naming(scratch.apply(&mut layer), "f/x");
    assert!(message.contains("not a directory"), "{message}");

    let mut layer = Layer::new();
    layer
        .symlink("dangling", "/nowhere/at/all")
        .file("dangling/x", 0o644, b"");
    invalid_naming(scratch.apply(&mut layer), "dangling/x");
    assert!(!exists(Path::new("/nowhere")));
}

#[test]
fn unknown_entry_types_are_refused_and_global_headers_skipped() {
    let scratch = Scratch::new();
    let mut layer = Layer::new();
    layer
        .raw(
            "global",
            EntryType::XGlobalHeader,
            0o644,
            "",
            b"8 a=bcd\n",
            |_| {},
        )
        .file("after", 0o644, b"");
    let stats = scratch.apply(&mut layer).unwrap();
    assert_eq!(scratch.names(""), ["after"]);
    assert_eq!(stats.entries, 2);

    let mut layer = Layer::new();
    layer.raw("label", EntryType::new(b'V'), 0o644, "", b"", |_| {});
    invalid_naming(scratch.apply(&mut layer), "label");
}

#[test]
fn a_sparse_file_is_written_with_holes() {
    let scratch = Scratch::new();
    let mut header = Header::new_gnu();
    header.set_path("sparse").unwrap();
    header.set_entry_type(EntryType::GNUSparse);
    header.set_mode(0o644);
    header.set_mtime(1_600_000_000);
    header.set_size(512);
    let gnu = header.as_gnu_mut().unwrap();
    gnu.set_real_size(8 << 20);
    gnu.sparse[0].set_offset(4 << 20);
    gnu.sparse[0].set_length(512);
    gnu.sparse[1].set_offset(8 << 20);
    gnu.sparse[1].set_length(0);
    header.set_cksum();
    let mut tar = header.as_bytes().to_vec();
    tar.extend_from_slice(&[7; 512]);
    tar.extend_from_slice(&[0; 1024]);

    let mut used = 0;
    let stats = unpack::apply(&scratch.root(), &tar[..], &LIMITS, &mut used).unwrap();
    assert_eq!(stats.bytes, 8 << 20);
    let data = fs::read(scratch.path("sparse")).unwrap();
    assert_eq!(data.len(), 8 << 20);
    assert!(data[..4 << 20].iter().all(|b| *b == 0));
    assert!(data[4 << 20..(4 << 20) + 512].iter().all(|b| *b == 7));
    assert!(data[(4 << 20) + 512..].iter().all(|b| *b == 0));
    assert!(disk_usage(&scratch.path("sparse")) < 1 << 20);
}
