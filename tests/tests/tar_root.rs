//! Downloading a sandbox's whole tree (`GET .../files/tar?path=/`) completes: other
//! filesystems mounted inside it (`/proc`, `/sys`, `/dev`) come as empty directories, as with
//! `tar --one-file-system`, instead of breaking the stream on a `/proc` file that cannot be
//! read (found by tests/api-fuzz).

use belljar_api::CreateSandbox;
use belljar_e2e::Daemon;

#[tokio::test(flavor = "multi_thread")]
async fn the_root_downloads_as_one_filesystem() {
    let d = Daemon::start();
    let c = d.http();
    let s = d.create(&c, CreateSandbox::default()).await;
    let tar = c.download_tar(&s.id, "/").await.unwrap();
    let bytes = tar.bytes().await.expect("the whole tar stream");
    let mut archive = tar::Archive::new(&bytes[..]);
    let mut names = Vec::new();
    for entry in archive.entries().expect("a tar stream") {
        let entry = entry.expect("a whole tar entry");
        names.push(entry.path().unwrap().to_string_lossy().into_owned());
    }
    assert!(names.iter().any(|n| n == "etc/passwd"), "no etc/passwd");
    assert!(
        names.iter().any(|n| n == "proc"),
        "the mount point itself is there"
    );
    assert!(
        !names.iter().any(|n| n.starts_with("proc/")),
        "/proc's contents are another filesystem"
    );
}
