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

/// The base image: busybox, a passwd with `app` (1000), a world-writable `/tmp`.
fn make_base(work: &Path, daemon: &Daemon) {
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
$B push -q e2e-build-base docker-archive:{archive}:{BASE}
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

fn names(daemon: &Daemon) -> Vec<(String, Option<String>)> {
    let client = daemon.unix();
    let mut all: Vec<_> = block_on(client.images())
        .unwrap()
        .into_iter()
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
    belljar_e2e::require_image("base");
    let work = tempfile::Builder::new()
        .prefix("belljar-build-")
        .tempdir()
        .unwrap();
    let daemon = Daemon::start();
    make_base(work.path(), &daemon);
    let ctx = work.path().join("ctx");
    write(&ctx, "Dockerfile", DOCKERFILE);
    write(&ctx, "files/a.txt", "content\n");
    let tag = "localhost/e2e/built:1";
    let _ = daemon.cli(["images", "rm", tag]);
    let at_start = names(&daemon);

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
    let added: Vec<String> = names(&daemon)
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
    let before = names(&daemon);
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
    assert_eq!(names(&daemon), before, "a failed build adds no image");

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
    assert_eq!(names(&daemon), before);

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
    let before = names(&daemon);
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
    assert_eq!(names(&daemon), before);
}
