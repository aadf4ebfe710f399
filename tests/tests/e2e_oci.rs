//! Users' own images, end to end against real peers: images made by `buildah` from files this
//! test writes (busybox-static), pushed to Debian's `docker-registry` on loopback and saved as
//! a docker-archive, then pulled or imported by the daemon and run in namespace sandboxes:
//! whiteouts, hard links, owners, setuid bits, extended attributes, the config's Env,
//! WorkingDir, User and Cmd; a registry whose blob was tampered with; a missing tag.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use belljar_api::{BackendChoice, CreateSandbox, ErrorCode, ImageBuildEvent};
use belljar_client::{Client, ClientError};
use belljar_e2e::{Daemon, block_on, eventually, run, stdout};

/// The registry, killed with the test.
struct Registry {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn require(tool: &str) -> PathBuf {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("{tool} is not installed: scripts/setup.sh installs it (docker-registry buildah skopeo busybox-static)")
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_registry(work: &Path) -> Registry {
    let bin = require("docker-registry");
    let port = free_port();
    let dir = work.join("registry");
    std::fs::create_dir_all(&dir).unwrap();
    let config = work.join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.display()
        ),
    )
    .unwrap();
    let child = Command::new(bin)
        .arg("serve")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start docker-registry");
    let registry = Registry { child, port, dir };
    block_on(eventually(
        Duration::from_secs(30),
        "the registry to listen",
        || async { std::net::TcpStream::connect(("127.0.0.1", port)).ok() },
    ));
    registry
}

/// Builds the test image in two layers with buildah (in its own storage under `work`), pushes
/// it to the registry (gzip and zstd) and saves it as a docker-archive.
fn build_and_push(work: &Path, port: u16) -> PathBuf {
    require("buildah");
    let archive = work.join("busy.tar");
    let script = format!(
        r#"c=$($B from scratch)
m=$($B mount "$c")
mkdir -p "$m/bin" "$m/etc" "$m/srv" "$m/gone/deep" "$m/data" "$m/home/app"
cp "$BUSYBOX" "$m/bin/busybox"
for a in sh cat stat id pwd env ls echo test; do ln -s busybox "$m/bin/$a"; done
printf 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n' > "$m/etc/passwd"
printf 'root:x:0:\napp:x:1000:\n' > "$m/etc/group"
echo hello > "$m/etc/hello"
echo doomed > "$m/etc/doomed"
echo old > "$m/gone/deep/file"
echo linked > "$m/data/a"
ln "$m/data/a" "$m/data/b"
chown 1234:5678 "$m/data/a"
cp "$BUSYBOX" "$m/data/suid" && chmod 4755 "$m/data/suid"
python3 -c 'import os,sys; os.setxattr(sys.argv[1], "user.belljar", b"kept")' "$m/data/a"
$B unmount "$c"
$B commit -q "$c" e2e-l1 >/dev/null
c2=$($B from e2e-l1)
m=$($B mount "$c2")
rm -rf "$m/gone" "$m/etc/doomed"
echo second > "$m/etc/second"
$B unmount "$c2"
$B config --env FOO=from-image --env PATH=/bin --workingdir /srv --user 1000 \
  --entrypoint '["/bin/sh","-c"]' --cmd '["echo from-cmd"]' "$c2"
$B commit -q "$c2" e2e-img >/dev/null
c3=$($B from e2e-l1)
m=$($B mount "$c3")
echo other > "$m/etc/other"
$B unmount "$c3"
$B commit -q "$c3" e2e-other >/dev/null
$B push -q --tls-verify=false e2e-other docker://127.0.0.1:{port}/e2e/busy:other
$B push -q --tls-verify=false e2e-img docker://127.0.0.1:{port}/e2e/busy:1
$B push -q --tls-verify=false --compression-format zstd e2e-img docker://127.0.0.1:{port}/e2e/busy:zstd
$B push -q e2e-img docker-archive:{archive}:localhost/e2e/busy:archived
"#,
        archive = archive.display(),
    );
    belljar_e2e::oci::buildah(work, &script);
    archive
}

/// The files of the store's image `digest`: those of the top of its layers.
fn rootfs_of(digest: &str) -> PathBuf {
    let hex = digest.trim_start_matches("sha256:");
    let oci = belljar_e2e::cache_dir().join("oci");
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(oci.join(format!("images/{hex}/image.json"))).unwrap(),
    )
    .unwrap();
    let top = json["chain"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_str()
        .unwrap();
    oci.join(format!(
        "layers/{}/rootfs",
        top.trim_start_matches("sha256:")
    ))
}

/// The progress lines of a pull, and the images it made.
async fn follow_lines(
    events: Result<belljar_client::NdjsonStream<ImageBuildEvent>, ClientError>,
) -> (Vec<String>, Vec<belljar_api::Image>) {
    let mut events = events.unwrap();
    let (mut lines, mut done) = (Vec::new(), Vec::new());
    while let Some(e) = events.next().await.unwrap() {
        match e {
            ImageBuildEvent::Progress { message } => lines.push(message),
            ImageBuildEvent::Done { image } => done.push(*image),
            other => panic!("{other:?}"),
        }
    }
    (lines, done)
}

/// Follows an image operation to its end: the images it made, or the error's code and text.
async fn follow(
    events: Result<belljar_client::NdjsonStream<ImageBuildEvent>, ClientError>,
) -> Result<Vec<belljar_api::Image>, (ErrorCode, String)> {
    let mut events = match events {
        Ok(e) => e,
        Err(ClientError::Api { code, message, .. }) => return Err((code, message)),
        Err(e) => panic!("{e}"),
    };
    let mut done = Vec::new();
    while let Some(e) = events.next().await.unwrap() {
        match e {
            ImageBuildEvent::Progress { .. } | ImageBuildEvent::Step { .. } => {}
            ImageBuildEvent::Done { image } => done.push(*image),
            ImageBuildEvent::Error { code, message } => return Err((code, message)),
        }
    }
    Ok(done)
}

async fn sandbox_of(daemon: &Daemon, client: &Client, image: &str) -> String {
    daemon
        .create(
            client,
            CreateSandbox {
                image: Some(image.into()),
                backend: Some(BackendChoice::Namespace),
                ..Default::default()
            },
        )
        .await
        .id
}

async fn out_of(client: &Client, id: &str, script: &str, sudo: bool) -> String {
    let (code, out) = run(client, id, &["sh", "-c", script], sudo).await;
    assert_eq!(code, 0, "{script}: {out}");
    out.trim().to_owned()
}

/// What the image's files and config look like inside a sandbox, as `podman run` shows them.
async fn check_image(client: &Client, id: &str) {
    // The config: WorkingDir, User, Env.
    assert_eq!(
        out_of(client, id, "pwd; id -u; echo $FOO", false).await,
        "/srv\n1000\nfrom-image"
    );
    // The second layer's whiteouts hid a file and a whole tree; its new file is there.
    assert_eq!(
        out_of(
            client,
            id,
            "test ! -e /etc/doomed && test ! -e /gone && cat /etc/hello /etc/second",
            false
        )
        .await,
        "hello\nsecond"
    );
    // A hard link is one file; owners and the setuid bit are kept.
    let stat = out_of(
        client,
        id,
        "stat -c '%i %h %u:%g' /data/a /data/b; stat -c %a /data/suid",
        true,
    )
    .await;
    let lines: Vec<&str> = stat.lines().collect();
    assert_eq!(lines[0], lines[1], "{stat}");
    // (The link count counts the store's sharing too: the layer's files are linked from
    // each image that has the layer.)
    let links: u32 = lines[0].split(' ').nth(1).unwrap().parse().unwrap();
    assert!(links >= 2 && lines[0].ends_with(" 1234:5678"), "{stat}");
    assert_eq!(lines[2], "4755", "{stat}");
}

#[test]
fn pulls_imports_and_runs_images_made_by_buildah() {
    let work = tempfile::Builder::new()
        .prefix("belljar-oci-")
        .tempdir()
        .unwrap();
    let registry = start_registry(work.path());
    let archive = build_and_push(work.path(), registry.port);
    let daemon = Daemon::start();
    let client = daemon.unix();
    let reg = format!("127.0.0.1:{}", registry.port);
    block_on(async {
        // `belljar run` of an image that is not here pulls it first (gzip layers).
        let name = format!("{reg}/e2e/busy:1");
        let out = daemon.cli(["run", name.as_str(), "--", "cat", "/etc/hello"]);
        assert_eq!(
            stdout(&out).trim(),
            "hello",
            "{}",
            belljar_e2e::stderr(&out)
        );
        // Pulling again finds it here.
        let images = follow(client.pull_image(&name, false).await).await.unwrap();
        assert_eq!(images.len(), 1);
        assert_eq!(images[0].name, name);
        let listed = client.images().await.unwrap();
        assert!(listed.iter().any(|i| i.name == name), "{listed:?}");
        let id = sandbox_of(&daemon, &client, &name).await;
        check_image(&client, &id).await;
        // The user's xattr came through, into the store's copy of the image.
        let file = rootfs_of(images[0].digest.as_deref().unwrap()).join("data/a");
        let out = Command::new("python3")
            .args([
                "-c",
                "import os,sys; print(os.getxattr(sys.argv[1], 'user.belljar').decode())",
            ])
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "kept",
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );

        // An image with the same first layer: that layer is not fetched again, and its files
        // are the first image's (one copy on disk).
        let other = format!("{reg}/e2e/busy:other");
        let (lines, made) = follow_lines(client.pull_image(&other, false).await).await;
        assert!(
            lines.iter().any(|l| l == "layer 1: already here (shared)"),
            "{lines:?}"
        );
        use std::os::unix::fs::MetadataExt;
        let (busy_files, other_files) = (
            rootfs_of(images[0].digest.as_deref().unwrap()),
            rootfs_of(made[0].digest.as_deref().unwrap()),
        );
        let ino = |p: PathBuf| std::fs::metadata(p).unwrap().ino();
        assert_eq!(
            ino(busy_files.join("etc/hello")),
            ino(other_files.join("etc/hello"))
        );
        let listed = client.images().await.unwrap();
        let row = |n: &str| listed.iter().find(|i| i.name == n).unwrap().clone();
        let (busy_row, other_row) = (row(&name), row(&other));
        assert!(busy_row.shared_bytes.unwrap() > 0, "{busy_row:?}");
        assert_eq!(busy_row.shared_bytes, other_row.shared_bytes);
        assert!(
            other_row.shared_bytes < other_row.size_bytes,
            "{other_row:?}"
        );
        // The sandbox made from it above: when, and that it stands on it.
        assert!(busy_row.last_used_at.is_some(), "{busy_row:?}");
        assert_eq!(busy_row.used_by.unwrap().sandboxes, vec![id.clone()]);
        assert_eq!(other_row.last_used_at, None);
        assert_eq!(
            busy_row.source.as_deref(),
            Some(format!("pull {name}").as_str())
        );

        // zstd layers of the same image: the same image (one id), already here.
        let zstd = format!("{reg}/e2e/busy:zstd");
        let z = follow(client.pull_image(&zstd, false).await).await.unwrap();
        assert_eq!(z[0].digest, images[0].digest);

        // The archive, imported under its own name and one more.
        let bytes = std::fs::read(&archive).unwrap();
        let imported = follow(
            client
                .import_image(belljar_client::full(bytes), Some("localhost/extra:7"))
                .await,
        )
        .await
        .unwrap();
        assert_eq!(imported.len(), 1);
        assert_eq!(imported[0].digest, images[0].digest, "the same image by id");
        let id2 = sandbox_of(&daemon, &client, "localhost/extra:7").await;
        check_image(&client, &id2).await;
        let id3 = sandbox_of(&daemon, &client, "localhost/e2e/busy:archived").await;
        assert_eq!(
            out_of(&client, &id3, "cat /etc/hello", false).await,
            "hello"
        );

        // A missing tag says so, with the registry's answer.
        let (code, msg) = follow(
            client
                .pull_image(&format!("{reg}/e2e/busy:nope"), false)
                .await,
        )
        .await
        .unwrap_err();
        assert_eq!(code, ErrorCode::ImageNotFound, "{msg}");
        assert!(
            msg.contains("MANIFEST_UNKNOWN") || msg.contains("manifest unknown"),
            "{msg}"
        );
        // A name with no registry and no default registry: a clear refusal.
        let (code, _) = follow(client.pull_image("busy", false).await)
            .await
            .unwrap_err();
        assert_eq!(code, ErrorCode::BadRequest);
        // An image not pulled: sandbox creation says how to get it.
        let e = client
            .create_sandbox(&CreateSandbox {
                image: Some(format!("{reg}/e2e/other:1")),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("belljar images pull"), "{e}");

        // With no command, the image's own: Entrypoint + Cmd.
        let out = daemon.cli(["run", name.as_str()]);
        assert_eq!(
            stdout(&out).trim(),
            "from-cmd",
            "{}",
            belljar_e2e::stderr(&out)
        );

        // Removing a name leaves the image its others; removing it by id takes all of them.
        client.remove_image(&zstd).await.unwrap();
        let listed = client.images().await.unwrap();
        assert!(!listed.iter().any(|i| i.name == zstd), "{listed:?}");
        assert!(listed.iter().any(|i| i.name == name), "{listed:?}");
        let image_id = images[0].digest.clone().unwrap();
        // Not while sandboxes stand on it.
        let e = client.remove_image(&image_id).await.unwrap_err();
        assert!(
            matches!(
                &e,
                ClientError::Api {
                    code: ErrorCode::Conflict,
                    ..
                }
            ),
            "{e}"
        );
        for s in [&id, &id2, &id3] {
            client.delete_sandbox(s).await.unwrap();
        }
        client.remove_image(&image_id).await.unwrap();
        let listed = client.images().await.unwrap();
        assert!(
            !listed
                .iter()
                .any(|i| i.digest.as_deref() == Some(&image_id)),
            "{listed:?}"
        );
        let e = client.remove_image(&name).await.unwrap_err();
        assert!(e.to_string().contains("not here"), "{e}");
        // The image that shares its first layer still has all of its files.
        let id4 = sandbox_of(&daemon, &client, &other).await;
        assert_eq!(
            out_of(&client, &id4, "cat /etc/hello /etc/other", false).await,
            "hello\nother"
        );
        client.delete_sandbox(&id4).await.unwrap();
        // Exported as an OCI archive: skopeo reads it (every digest checked on the copy), and
        // imported again under another name it has the same files.
        let exported = work.path().join("other.tar");
        let out = daemon.cli([
            "images",
            "export",
            other.as_str(),
            "-o",
            exported.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", belljar_e2e::stderr(&out));
        let copied = work.path().join("copied");
        let skopeo = Command::new(require("skopeo"))
            .arg("copy")
            .arg(format!("oci-archive:{}", exported.display()))
            .arg(format!("dir:{}", copied.display()))
            .output()
            .unwrap();
        assert!(
            skopeo.status.success(),
            "{}",
            String::from_utf8_lossy(&skopeo.stderr)
        );
        let back = follow(
            client
                .import_image(
                    belljar_client::full(std::fs::read(&exported).unwrap()),
                    Some("localhost/e2e/exported:1"),
                )
                .await,
        )
        .await
        .unwrap();
        assert_eq!(back[0].name, other, "known by its own name too: {back:?}");
        let id5 = sandbox_of(&daemon, &client, "localhost/e2e/exported:1").await;
        assert_eq!(
            out_of(
                &client,
                &id5,
                "cat /etc/hello /etc/other /gone/deep/file",
                false
            )
            .await,
            "hello\nother\nold"
        );
        client.delete_sandbox(&id5).await.unwrap();
        let back_id = back[0].digest.clone().unwrap();
        client.remove_image(&back_id).await.unwrap();
        // The import took the name: the pulled image is known by its id only now.
        client
            .remove_image(made[0].digest.as_deref().unwrap())
            .await
            .unwrap();
    });
    drop(registry);
}

#[test]
fn a_tampered_blob_is_refused_and_leaves_nothing() {
    let work = tempfile::Builder::new()
        .prefix("belljar-oci-")
        .tempdir()
        .unwrap();
    let registry = start_registry(work.path());
    build_and_push(work.path(), registry.port);
    // Rewrite every stored blob's content but keep its size: what a lying mirror serves.
    let blobs = registry.dir.join("docker/registry/v2/blobs/sha256");
    let mut tampered = 0;
    for prefix in std::fs::read_dir(&blobs).unwrap().flatten() {
        for blob in std::fs::read_dir(prefix.path()).unwrap().flatten() {
            let data = blob.path().join("data");
            let mut bytes = std::fs::read(&data).unwrap();
            // Layers are the large blobs; configs and manifests are JSON and stay.
            if bytes.first() == Some(&b'{') {
                continue;
            }
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff;
            std::fs::write(&data, bytes).unwrap();
            tampered += 1;
        }
    }
    assert!(tampered > 0);
    let daemon = Daemon::start();
    let client = daemon.unix();
    let name = format!("127.0.0.1:{}/e2e/busy:1", registry.port);
    block_on(async {
        let (code, msg) = follow(client.pull_image(&name, false).await)
            .await
            .unwrap_err();
        assert_eq!(code, ErrorCode::ImageInvalid, "{msg}");
        let listed = client.images().await.unwrap();
        assert!(!listed.iter().any(|i| i.name == name), "{listed:?}");
    });
}
