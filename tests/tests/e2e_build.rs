//! Dockerfile builds end to end on the namespace backend: a multi-stage Dockerfile over a
//! small busybox image (made by `buildah` from files this test writes, imported as a
//! docker-archive), built by `belljar images build` and run by `belljar run`; a rebuild that
//! changes only the last line takes every earlier step from the step cache; and the bad
//! builds, each with its stable code and no image left behind.

use std::path::Path;
use std::time::Duration;

use belljar_api::{ErrorCode, ImageBuildEvent, ListSandboxesQuery};
use belljar_e2e::{Daemon, block_on, eventually, stderr, stdout};

const BASE: &str = "localhost/e2e/build-base:1";

/// The base image `name`: busybox, a passwd with `app` (1000), a world-writable `/tmp`.
fn make_base(work: &Path, daemon: &Daemon, name: &str) {
    let archive = work.join("base.tar");
    let script = format!(
        r#"c=$($B from scratch)
m=$($B mount "$c")
mkdir -p "$m/bin" "$m/etc" "$m/srv"
mkdir -m 1777 "$m/tmp"
cp "$BUSYBOX" "$m/bin/busybox"
for a in sh cat stat id pwd env ls echo test mkdir sleep; do ln -s busybox "$m/bin/$a"; done
printf 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/srv:/bin/sh\n' > "$m/etc/passwd"
printf 'root:x:0:\napp:x:1000:\n' > "$m/etc/group"
$B unmount "$c"
$B config --env PATH=/bin "$c"
$B commit -q "$c" e2e-build-base >/dev/null
$B push -q e2e-build-base docker-archive:{archive}:{name}
"#,
        archive = archive.display(),
    );
    belljar_e2e::oci::buildah(work, &script);
    let out = daemon.cli(["images", "import", archive.to_str().unwrap()]);
    assert!(out.status.success(), "import: {}", stderr(&out));
}

const DOCKERFILE: &str = r#"# syntax=docker/dockerfile:1
ARG BASE=localhost/e2e/build-base:1
FROM $BASE AS build
RUN mkdir -p /out && echo built > /out/artifact && \
    echo "running the build stage"
FROM ${BASE}
ARG GREETING=hello
ENV GREETING=$GREETING APP_HOME=/srv/app
WORKDIR $APP_HOME
COPY --chown=app:app files/ ./files/
COPY --from=build /out/artifact /opt/artifact
USER app
RUN id -u > files/whoami && echo "as $(id -un)"
CMD ["/bin/sh", "-c", "echo $GREETING from $(pwd) as $(id -u); cat /opt/artifact"]
"#;

/// A scratch directory and a daemon with the base image `name` imported.
fn with_base(name: &str) -> (tempfile::TempDir, Daemon) {
    belljar_e2e::require_image("base");
    let work = tempfile::Builder::new()
        .prefix("belljar-build-")
        .tempdir()
        .unwrap();
    let daemon = Daemon::start();
    make_base(work.path(), &daemon, name);
    (work, daemon)
}

/// Builds `dir` with the CLI (`--json`): its events and whether it succeeded.
fn build(daemon: &Daemon, dir: &Path, tag: &str, extra: &[&str]) -> (bool, Vec<ImageBuildEvent>) {
    let mut args = vec!["--json", "images", "build", "-t", tag];
    args.extend_from_slice(extra);
    args.push(dir.to_str().unwrap());
    let out = daemon.cli(&args);
    let events = stdout(&out)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (out.status.success(), events)
}

fn failure(events: &[ImageBuildEvent]) -> (ErrorCode, String) {
    match events.last() {
        Some(ImageBuildEvent::Error { code, message }) => (*code, message.clone()),
        other => panic!("not a failure: {other:?}"),
    }
}

/// The images named under `scope` (the store is shared by the daemons of tests running at
/// once: each test names its images under a scope of its own).
fn names(daemon: &Daemon, scope: &str) -> Vec<(String, Option<String>)> {
    let client = daemon.unix();
    let mut all: Vec<_> = block_on(client.images())
        .unwrap()
        .into_iter()
        .filter(|i| i.name.starts_with(scope))
        .map(|i| (i.name, i.digest))
        .collect();
    all.sort();
    all
}

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn builds_a_multi_stage_dockerfile_caches_steps_and_refuses_bad_builds() {
    let (work, daemon) = with_base(BASE);
    let ctx = work.path().join("ctx");
    write(&ctx, "Dockerfile", DOCKERFILE);
    write(&ctx, "files/a.txt", "content\n");
    let tag = "localhost/e2e/built:1";
    let _ = daemon.cli(["images", "rm", tag]);
    let at_start = names(&daemon, "localhost/e2e/");

    // The first build runs every step (the step cache is shared with earlier runs).
    let (ok, events) = build(
        &daemon,
        &ctx,
        tag,
        &["--no-cache", "--build-arg", "GREETING=hi"],
    );
    assert!(ok, "{events:?}");
    assert!(
        events.iter().any(|e| matches!(e, ImageBuildEvent::Progress { message } if message == "running the build stage")),
        "RUN output streams: {events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ImageBuildEvent::Progress { message } if message == "as app")),
        "{events:?}"
    );
    let out = daemon.cli(["run", tag]);
    assert_eq!(
        stdout(&out),
        "hi from /srv/app as 1000\nbuilt\n",
        "{}",
        stderr(&out)
    );
    let out = daemon.cli([
        "run",
        tag,
        "--",
        "sh",
        "-c",
        "stat -c %u:%g files/a.txt; cat files/a.txt files/whoami; echo $APP_HOME",
    ]);
    assert_eq!(
        stdout(&out),
        "1000:1000\ncontent\n1000\n/srv/app\n",
        "{}",
        stderr(&out)
    );
    // The one image more is the build's, named; its steps are not listed.
    let added: Vec<String> = names(&daemon, "localhost/e2e/")
        .into_iter()
        .filter(|n| !at_start.contains(n))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(added, [tag]);

    // Only the last line changed: every earlier step comes from the cache, the last runs.
    write(
        &ctx,
        "Dockerfile",
        &format!("{DOCKERFILE}LABEL step=last\n"),
    );
    let (ok, events) = build(&daemon, &ctx, tag, &["--build-arg", "GREETING=hi"]);
    assert!(ok, "{events:?}");
    let steps: Vec<(String, bool)> = events
        .iter()
        .filter_map(|e| match e {
            ImageBuildEvent::Step {
                instruction,
                cached,
                ..
            } => Some((instruction.clone(), *cached)),
            _ => None,
        })
        .collect();
    let (last, earlier) = steps.split_last().unwrap();
    assert_eq!(last, &("LABEL step=last".to_owned(), false));
    for (instruction, cached) in earlier {
        let uncached = instruction.starts_with("FROM") || instruction.starts_with("ARG BASE");
        assert_eq!(*cached, !uncached, "{instruction}: {steps:?}");
    }
    assert!(
        !events.iter().any(
            |e| matches!(e, ImageBuildEvent::Progress { message } if message.contains("running"))
        ),
        "a cached RUN does not run: {events:?}"
    );
    let out = daemon.cli(["run", tag]);
    assert_eq!(
        stdout(&out),
        "hi from /srv/app as 1000\nbuilt\n",
        "{}",
        stderr(&out)
    );

    // Bad builds: each its code, and no image more.
    let before = names(&daemon, "localhost/e2e/");
    let bad = work.path().join("bad");
    let cases: [(&str, ErrorCode, &str); 5] = [
        (
            "FROM localhost/e2e/build-base:1\nRUN true\nFROBNICATE x\n",
            ErrorCode::DockerfileInvalid,
            "line 3",
        ),
        (
            "FROM localhost/e2e/build-base:1\nCOPY ../outside /x\n",
            ErrorCode::InvalidPath,
            "outside",
        ),
        (
            "FROM localhost/e2e/build-base:1\nCOPY out /x\n",
            ErrorCode::InvalidPath,
            "outside",
        ),
        (
            "FROM localhost/e2e/build-base:1\nRUN echo failing-output; exit 3\n",
            ErrorCode::BuildFailed,
            "exit code 3",
        ),
        (
            "FROM localhost/e2e/no-such:1\n",
            ErrorCode::ImageNotFound,
            "no-such",
        ),
    ];
    std::fs::create_dir_all(&bad).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", bad.join("out")).unwrap();
    for (dockerfile, code, says) in cases {
        write(&bad, "Dockerfile", dockerfile);
        let (ok, events) = build(&daemon, &bad, "localhost/e2e/bad:1", &["--no-cache"]);
        assert!(!ok, "{dockerfile}: {events:?}");
        let (got, message) = failure(&events);
        assert_eq!(got, code, "{dockerfile}: {message}");
        assert!(message.contains(says), "{dockerfile}: {message}");
        if code == ErrorCode::BuildFailed {
            assert!(message.contains("failing-output"), "{message}");
        }
    }
    assert_eq!(
        names(&daemon, "localhost/e2e/"),
        before,
        "a failed build adds no image"
    );

    // A client that goes away mid-build: the build's sandbox goes too.
    write(
        &bad,
        "Dockerfile",
        "FROM localhost/e2e/build-base:1\nRUN echo started; sleep 60\n",
    );
    let mut child = daemon
        .cli_command()
        .args([
            "images",
            "build",
            "-t",
            "localhost/e2e/bad:1",
            "--no-cache",
            bad.to_str().unwrap(),
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let client = daemon.unix();
    let building = |want: bool| {
        let client = client.clone();
        async move {
            let list = client
                .list_sandboxes(&ListSandboxesQuery::default())
                .await
                .ok()?;
            let any = list
                .sandboxes
                .iter()
                .any(|s| s.tags.contains_key("belljar.build"));
            (any == want).then_some(())
        }
    };
    block_on(eventually(
        Duration::from_secs(60),
        "the build's sandbox",
        || building(true),
    ));
    let _ = child.kill();
    let _ = child.wait();
    block_on(eventually(
        Duration::from_secs(60),
        "the build's sandbox to go",
        || building(false),
    ));
    assert_eq!(names(&daemon, "localhost/e2e/"), before);

    let out = daemon.cli(["images", "rm", tag]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_context_over_the_store_cap_is_refused() {
    let work = tempfile::Builder::new()
        .prefix("belljar-build-")
        .tempdir()
        .unwrap();
    // About 100 KiB of store.
    let daemon = Daemon::start_with_env(&[("BELLJAR_IMAGE_STORE_GIB", "0.0001")]);
    let ctx = work.path().join("ctx");
    write(&ctx, "Dockerfile", "FROM base\n");
    std::fs::write(ctx.join("big"), vec![7u8; 1 << 20]).unwrap();
    let before = names(&daemon, "localhost/e2e/");
    let (ok, events) = build(&daemon, &ctx, "localhost/e2e/big:1", &[]);
    assert!(!ok);
    let _ = events;
    let out = daemon.cli([
        "images",
        "build",
        "-t",
        "localhost/e2e/big:1",
        ctx.to_str().unwrap(),
    ]);
    assert!(
        stderr(&out).contains("image_too_large") || stderr(&out).contains("more than"),
        "{}",
        stderr(&out)
    );
    assert_eq!(names(&daemon, "localhost/e2e/"), before);
}

const IGNORE_SCOPE: &str = "localhost/e2e-ignore/";
const IGNORE_BASE: &str = "localhost/e2e-ignore/base:1";

#[test]
fn a_dockerignore_leaves_files_out_of_the_context_from_the_cli_and_the_api() {
    let (work, daemon) = with_base(IGNORE_BASE);
    let ctx = work.path().join("ctx");
    write(
        &ctx,
        "Dockerfile",
        &format!("FROM {IGNORE_BASE}\nCOPY . /ctx\n"),
    );
    write(
        &ctx,
        ".dockerignore",
        "# what the image must not get\nnode_modules\n**/*.log\n!keep.log\nsecrets/\nDockerfile\n",
    );
    for f in [
        "src/app.txt",
        "node_modules/dep/index.js",
        "a.log",
        "src/b.log",
        "keep.log",
        "secrets/key",
    ] {
        write(&ctx, f, f);
    }
    let probe = "for p in src/app.txt keep.log .dockerignore node_modules a.log src/b.log \
                 secrets Dockerfile; do test -e /ctx/$p && echo $p; done; true";
    let expected = "src/app.txt\nkeep.log\n.dockerignore\n";

    // Through the CLI, which leaves the files out of what it sends.
    let tag = "localhost/e2e-ignore/built:1";
    let (ok, events) = build(&daemon, &ctx, tag, &["--no-cache"]);
    assert!(ok, "{events:?}");
    let out = daemon.cli(["run", tag, "--", "sh", "-c", probe]);
    assert_eq!(stdout(&out), expected, "{}", stderr(&out));

    // Through the API with the whole directory in the tar: the daemon leaves them out.
    let mut tarball = tar::Builder::new(Vec::new());
    tarball.append_dir_all(".", &ctx).unwrap();
    let tarball = tarball.into_inner().unwrap();
    let api_tag = "localhost/e2e-ignore/api:1";
    let query = belljar_api::BuildQuery {
        tag: api_tag.into(),
        dockerfile: None,
        build_args: None,
        no_cache: Some(true),
    };
    let client = daemon.unix();
    let events: Vec<ImageBuildEvent> = block_on(async {
        let mut stream = client
            .build_dockerfile(belljar_client::full(tarball), &query)
            .await
            .unwrap();
        let mut events = Vec::new();
        while let Some(e) = stream.next().await.unwrap() {
            events.push(e);
        }
        events
    });
    assert!(
        matches!(events.last(), Some(ImageBuildEvent::Done { .. })),
        "{events:?}"
    );
    let out = daemon.cli(["run", api_tag, "--", "sh", "-c", probe]);
    assert_eq!(stdout(&out), expected, "{}", stderr(&out));

    // A pattern that cannot be read fails the build with its line, and adds no image.
    write(&ctx, ".dockerignore", "ok\n[unclosed\n");
    let before = names(&daemon, IGNORE_SCOPE);
    let (ok, events) = build(&daemon, &ctx, "localhost/e2e-ignore/bad:1", &[]);
    assert!(!ok);
    let out = daemon.cli([
        "images",
        "build",
        "-t",
        "localhost/e2e-ignore/bad:1",
        ctx.to_str().unwrap(),
    ]);
    assert!(
        stderr(&out).contains("line 2"),
        "{events:?} {}",
        stderr(&out)
    );
    assert_eq!(names(&daemon, IGNORE_SCOPE), before);
    for t in [tag, api_tag] {
        let out = daemon.cli(["images", "rm", t]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
}

/// The id of image `name`, from `belljar images --json`.
fn image_id(daemon: &Daemon, name: &str) -> String {
    let all = names(daemon, name);
    let [(_, Some(id))] = all.as_slice() else {
        panic!("{name}: {all:?}");
    };
    id.clone()
}

fn sandbox(daemon: &Daemon, id: &str) -> belljar_api::Sandbox {
    let out = daemon.cli(["--json", "info", id]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

#[test]
fn a_sandbox_keeps_its_image_when_the_name_moves_and_prune_keeps_what_is_used() {
    let name = "localhost/e2e-pin/base:1";
    let (work, daemon) = with_base(name);
    let first = image_id(&daemon, name);
    let out = daemon.cli(["create", "--persistent", "--image", name]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_owned();
    assert_eq!(
        sandbox(&daemon, &id).image_id.as_deref(),
        Some(first.as_str())
    );

    // The same name imported again names another image; the old one is unnamed.
    let again = work.path().join("again");
    std::fs::create_dir(&again).unwrap();
    make_base(&again, &daemon, name);
    let second = image_id(&daemon, name);
    assert_ne!(first, second, "buildah's images differ in their times");

    // Pruning keeps what a sandbox stands on; the sandbox starts again on its own image.
    let prune = |args: &[&str]| -> belljar_api::PrunedImages {
        let mut all = vec!["--json", "images", "prune"];
        all.extend_from_slice(args);
        let out = daemon.cli(&all);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_str(&stdout(&out)).unwrap()
    };
    let pruned = prune(&[]);
    assert!(pruned.removed.iter().all(|r| r.id != first), "{pruned:?}");
    for step in [["stop", id.as_str()], ["start", id.as_str()]] {
        let out = daemon.cli(step);
        assert!(out.status.success(), "{step:?}: {}", stderr(&out));
    }
    let s = sandbox(&daemon, &id);
    assert_eq!(s.image_id.as_deref(), Some(first.as_str()));
    let out = daemon.cli(["exec", &id, "--", "cat", "/etc/group"]);
    assert!(stdout(&out).contains("app:x:1000:"), "{}", stderr(&out));
    // A sandbox made now stands on what the name names now.
    let out = daemon.cli(["create", "--image", name]);
    assert!(out.status.success(), "{}", stderr(&out));
    let newer = stdout(&out).trim().to_owned();
    assert_eq!(
        sandbox(&daemon, &newer).image_id.as_deref(),
        Some(second.as_str())
    );
    // `images rm` of the old id is refused while the sandbox stands on it.
    let out = daemon.cli(["images", "rm", &first]);
    assert!(
        stderr(&out).contains("conflict") || stderr(&out).contains("stand on"),
        "{}",
        stderr(&out)
    );

    // Its stop's snapshot stands on it too, and is made from it again.
    let client = daemon.unix();
    let query = belljar_api::ListSnapshotsQuery {
        sandbox_id: Some(id.clone()),
        ..Default::default()
    };
    let snapshots = block_on(client.list_snapshots(&query)).unwrap().snapshots;
    assert!(!snapshots.is_empty());
    assert!(
        snapshots
            .iter()
            .all(|s| s.image_id.as_deref() == Some(first.as_str()))
    );
    let out = daemon.cli(["rm", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(prune(&[]).removed.iter().all(|r| r.id != first));
    let out = daemon.cli(["create", "--from", &snapshots[0].id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let from_snapshot = stdout(&out).trim().to_owned();
    assert_eq!(
        sandbox(&daemon, &from_snapshot).image_id.as_deref(),
        Some(first.as_str())
    );
    let out = daemon.cli(["rm", &from_snapshot]);
    assert!(out.status.success(), "{}", stderr(&out));

    // Once nothing stands on it, the unnamed image goes; the named one stays.
    for s in &snapshots {
        block_on(client.delete_snapshot(&s.id)).unwrap();
    }
    let pruned = prune(&[]);
    let gone = pruned.removed.iter().find(|r| r.id == first);
    assert!(gone.is_some_and(|r| r.size_bytes > 0), "{pruned:?}");
    // (What that frees is its layers no other image has: the step cache's images hold a
    // build's layers, so here nothing but its own record.)
    assert!(
        pruned.reclaimed_bytes <= pruned.removed.iter().map(|r| r.size_bytes).sum::<u64>(),
        "{pruned:?}"
    );
    assert_eq!(image_id(&daemon, name), second);
    // (`--all` and `--build-cache` are left out here: the store is shared by the tests that
    // run at once, and they would take those tests' images.)
    let out = daemon.cli(["rm", &newer]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = daemon.cli(["images", "rm", name]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(names(&daemon, "localhost/e2e-pin/").is_empty());
}
