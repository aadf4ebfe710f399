//! Files through the real agent: streamed reads and writes, directories, metadata, removal,
//! moves, tar trees, watches, ownership, metrics, shutdown, and bad input.

mod common;

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use belljar_agent_proto::client::{ClientError, body_from_bytes, body_from_stream};
use belljar_agent_proto::{FileKind, MkdirRequest, MoveRequest, ShutdownAction, WatchKind, codes};
use bytes::Bytes;
use common::Agent;
use futures::TryStreamExt;

fn code<T>(r: Result<T, ClientError>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(e) => e.code().unwrap_or("none").to_owned(),
    }
}

async fn read_all(agent: &Agent, path: &str) -> Vec<u8> {
    let (_, body) = agent.client.read_file(path).await.unwrap();
    let chunks: Vec<Bytes> = body.try_collect().await.unwrap();
    chunks.concat()
}

#[tokio::test]
async fn writes_and_reads_files_with_mode_and_parents() {
    let agent = Agent::start().await;
    let path = agent.path("a/b/c/hello.txt");
    let chunks =
        futures::stream::iter(["hello ", "streamed ", "world"].map(|s| Ok(Bytes::from(s))));
    let entry = agent
        .client
        .write_file(&path, Some(0o600), None, body_from_stream(chunks))
        .await
        .unwrap();
    assert_eq!(entry.kind, FileKind::File);
    assert_eq!(entry.size, 20);
    assert_eq!(entry.mode, 0o600);
    assert_eq!(entry.name, "hello.txt");
    assert_eq!(entry.path, path);
    let (len, _) = agent.client.read_file(&path).await.unwrap();
    assert_eq!(len, Some(20));
    assert_eq!(read_all(&agent, &path).await, b"hello streamed world");
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    assert!(std::path::Path::new(&agent.path("a/b/c")).is_dir());

    // Overwriting keeps the mode unless a new one is given; no temporary file is left behind.
    agent
        .client
        .write_file(&path, None, None, body_from_bytes("new"))
        .await
        .unwrap();
    let stat = agent.client.stat(&path).await.unwrap();
    assert_eq!((stat.size, stat.mode), (3, 0o600));
    let names: Vec<_> = agent
        .client
        .list(&agent.path("a/b/c"))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["hello.txt"]);

    // Empty files, and awkward names.
    let odd = agent.path("sp ace/ä&b=c%.txt");
    let entry = agent
        .client
        .write_file(&odd, None, None, body_from_bytes(""))
        .await
        .unwrap();
    assert_eq!(
        (entry.size, entry.mode, entry.name.as_str()),
        (0, 0o644, "ä&b=c%.txt")
    );
}

#[tokio::test]
async fn refuses_bad_file_requests_with_stable_codes() {
    let agent = Agent::start().await;
    let c = &agent.client;
    let dir = agent.path("");
    let file = agent.path("file");
    c.write_file(&file, None, None, body_from_bytes("x"))
        .await
        .unwrap();
    let missing = agent.path("missing/nothing");

    assert_eq!(code(c.read_file(&missing).await), codes::NOT_FOUND);
    assert_eq!(code(c.read_file(&dir).await), codes::IS_A_DIRECTORY);
    assert_eq!(
        code(c.write_file(&dir, None, None, body_from_bytes("x")).await),
        codes::IS_A_DIRECTORY
    );
    assert_eq!(
        code(
            c.write_file(&format!("{file}/sub"), None, None, body_from_bytes("x"))
                .await
        ),
        codes::NOT_A_DIRECTORY
    );
    assert_eq!(code(c.list(&file).await), codes::NOT_A_DIRECTORY);
    assert_eq!(code(c.list(&missing).await), codes::NOT_FOUND);
    assert_eq!(code(c.stat(&missing).await), codes::NOT_FOUND);
    assert_eq!(code(c.stat("relative/path").await), codes::INVALID_PATH);
    assert_eq!(code(c.read_file("").await), codes::INVALID_PATH);
    assert_eq!(code(c.remove(&missing, true).await), codes::NOT_FOUND);
    assert_eq!(code(c.remove("/", true).await), codes::PERMISSION_DENIED);
    let mkdir = |path: &str, parents| MkdirRequest {
        path: path.into(),
        parents,
        mode: None,
        user: None,
    };
    assert_eq!(code(c.mkdir(&mkdir(&file, true)).await), codes::EXISTS);
    assert_eq!(code(c.mkdir(&mkdir(&dir, false)).await), codes::EXISTS);
    assert_eq!(
        code(c.mkdir(&mkdir(&agent.path("x/y"), false)).await),
        codes::NOT_FOUND
    );
    let mv = |from: &str, to: &str| MoveRequest {
        from: from.into(),
        to: to.into(),
        overwrite: false,
    };
    assert_eq!(
        code(c.move_path(&mv(&missing, &agent.path("n"))).await),
        codes::NOT_FOUND
    );
    c.write_file(&agent.path("other"), None, None, body_from_bytes("y"))
        .await
        .unwrap();
    assert_eq!(
        code(c.move_path(&mv(&file, &agent.path("other"))).await),
        codes::EXISTS
    );
    assert_eq!(code(c.download_tar(&missing).await), codes::NOT_FOUND);
    assert_eq!(code(c.watch(&missing, false).await), codes::NOT_FOUND);
    let err = c
        .write_file(&file, Some(0o7777 + 1), None, body_from_bytes(""))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(codes::BAD_REQUEST));
    let garbage = c
        .upload_tar(&agent.path("t"), None, body_from_bytes(vec![7u8; 1024]))
        .await;
    assert_eq!(code(garbage), codes::BAD_REQUEST);
    if !common::is_root() {
        assert_eq!(
            code(c.read_file("/etc/shadow").await),
            codes::PERMISSION_DENIED
        );
    }
}

#[tokio::test]
async fn makes_lists_stats_moves_and_removes() {
    let agent = Agent::start().await;
    let c = &agent.client;
    let deep = agent.path("m/n/o");
    let entry = c
        .mkdir(&MkdirRequest {
            path: deep.clone(),
            parents: true,
            mode: Some(0o750),
            user: None,
        })
        .await
        .unwrap();
    assert_eq!((entry.kind, entry.mode), (FileKind::Directory, 0o750));
    // mkdir -p of an existing directory is fine.
    c.mkdir(&MkdirRequest {
        path: deep.clone(),
        parents: true,
        mode: None,
        user: None,
    })
    .await
    .unwrap();
    for name in ["b.txt", "a.txt", "c.txt"] {
        c.write_file(&format!("{deep}/{name}"), None, None, body_from_bytes(name))
            .await
            .unwrap();
    }
    std::os::unix::fs::symlink("a.txt", format!("{deep}/link")).unwrap();
    let list = c.list(&deep).await.unwrap();
    let names: Vec<_> = list.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["a.txt", "b.txt", "c.txt", "link"]);
    assert_eq!(list[3].kind, FileKind::Symlink);
    assert_eq!(list[3].link_target.as_deref(), Some("a.txt"));
    assert!(list[0].mtime > 1_600_000_000_000);

    let moved = c
        .move_path(&MoveRequest {
            from: format!("{deep}/a.txt"),
            to: format!("{deep}/z.txt"),
            overwrite: false,
        })
        .await
        .unwrap();
    assert_eq!((moved.name.as_str(), moved.size), ("z.txt", 5));
    c.move_path(&MoveRequest {
        from: format!("{deep}/b.txt"),
        to: format!("{deep}/c.txt"),
        overwrite: true,
    })
    .await
    .unwrap();
    assert_eq!(read_all(&agent, &format!("{deep}/c.txt")).await, b"b.txt");

    assert_eq!(
        code(c.remove(&agent.path("m"), false).await),
        codes::NOT_EMPTY
    );
    c.remove(&format!("{deep}/link"), false).await.unwrap();
    assert!(
        std::path::Path::new(&format!("{deep}/z.txt")).exists(),
        "removing a link removed its target"
    );
    c.remove(&agent.path("m"), true).await.unwrap();
    assert_eq!(code(c.stat(&agent.path("m")).await), codes::NOT_FOUND);
}

#[tokio::test]
async fn downloads_and_uploads_trees_as_tar() {
    let agent = Agent::start().await;
    let c = &agent.client;
    let src = agent.path("src");
    for (path, data) in [
        ("top.txt", "top"),
        ("d1/one.txt", "one"),
        ("d1/d2/two.bin", "\u{0}\u{1}two"),
    ] {
        c.write_file(
            &format!("{src}/{path}"),
            Some(0o640),
            None,
            body_from_bytes(data),
        )
        .await
        .unwrap();
    }
    c.mkdir(&MkdirRequest {
        path: format!("{src}/empty"),
        parents: true,
        mode: None,
        user: None,
    })
    .await
    .unwrap();
    std::os::unix::fs::symlink("top.txt", format!("{src}/link")).unwrap();

    let tar = c.download_tar(&src).await.unwrap();
    let chunks: Vec<Bytes> = tar.try_collect().await.unwrap();
    let tar = chunks.concat();
    let mut names: Vec<String> = tar::Archive::new(&tar[..])
        .entries()
        .unwrap()
        .map(|e| {
            e.unwrap()
                .path()
                .unwrap()
                .display()
                .to_string()
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "d1",
            "d1/d2",
            "d1/d2/two.bin",
            "d1/one.txt",
            "empty",
            "link",
            "top.txt"
        ]
    );

    let dst = agent.path("dst/inner");
    c.upload_tar(&dst, None, body_from_bytes(tar))
        .await
        .unwrap();
    assert_eq!(
        read_all(&agent, &format!("{dst}/d1/d2/two.bin")).await,
        b"\x00\x01two"
    );
    assert_eq!(read_all(&agent, &format!("{dst}/top.txt")).await, b"top");
    assert_eq!(
        c.stat(&format!("{dst}/d1/one.txt")).await.unwrap().mode,
        0o640
    );
    assert_eq!(
        c.stat(&format!("{dst}/link"))
            .await
            .unwrap()
            .link_target
            .as_deref(),
        Some("top.txt")
    );
    assert_eq!(
        c.stat(&format!("{dst}/empty")).await.unwrap().kind,
        FileKind::Directory
    );

    // A single file downloads as a one-entry archive.
    let tar: Vec<Bytes> = c
        .download_tar(&format!("{src}/top.txt"))
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let tar = tar.concat();
    let mut archive = tar::Archive::new(&tar[..]);
    let names: Vec<_> = archive
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert_eq!(names, ["top.txt"]);

    // Entries that try to escape the target are not written.
    let mut evil = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(4);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    {
        let name = b"../escaped.txt";
        let gnu = header.as_gnu_mut().unwrap();
        gnu.name[..name.len()].copy_from_slice(name);
    }
    header.set_cksum();
    evil.append(&header, &b"evil"[..]).unwrap();
    let evil = evil.into_inner().unwrap();
    let _ = c
        .upload_tar(&agent.path("jail"), None, body_from_bytes(evil))
        .await;
    assert!(!std::path::Path::new(&agent.path("escaped.txt")).exists());
}

#[tokio::test]
async fn watches_create_modify_rename_and_remove() {
    let agent = Agent::start().await;
    let c = &agent.client;
    let dir = agent.path("w");
    c.mkdir(&MkdirRequest {
        path: format!("{dir}/sub"),
        parents: true,
        mode: None,
        user: None,
    })
    .await
    .unwrap();
    let mut events = c.watch(&dir, true).await.unwrap();
    let file = format!("{dir}/sub/f.txt");
    std::fs::write(&file, "1").unwrap();
    std::fs::rename(&file, format!("{dir}/sub/g.txt")).unwrap();
    std::fs::remove_file(format!("{dir}/sub/g.txt")).unwrap();
    let mut seen = Vec::new();
    let wanted = [
        WatchKind::Create,
        WatchKind::Modify,
        WatchKind::Rename,
        WatchKind::Remove,
    ];
    while !wanted.iter().all(|k| seen.iter().any(|(s, _, _)| s == k)) {
        let event = tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await
            .expect("no watch event")
            .unwrap()
            .expect("watch ended");
        seen.push((event.kind, event.path, event.to));
    }
    assert!(
        seen.contains(&(WatchKind::Create, file.clone(), None)),
        "{seen:?}"
    );
    assert!(
        seen.contains(&(
            WatchKind::Rename,
            file.clone(),
            Some(format!("{dir}/sub/g.txt"))
        )),
        "{seen:?}"
    );

    // Non-recursive watches do not see into subdirectories.
    let mut flat = c.watch(&dir, false).await.unwrap();
    std::fs::write(format!("{dir}/sub/deep.txt"), "x").unwrap();
    std::fs::write(format!("{dir}/top.txt"), "x").unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), flat.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(event.path, format!("{dir}/top.txt"));
}

#[tokio::test]
async fn files_belong_to_the_requested_user() {
    if !common::root_or_not_run("to give files away") {
        return;
    }
    let agent = Agent::start().await;
    let c = &agent.client;
    let path = agent.path("owned/by/nobody.txt");
    c.write_file(&path, None, Some("nobody"), body_from_bytes("x"))
        .await
        .unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().uid(), 65534);
    assert_eq!(
        std::fs::metadata(agent.path("owned/by")).unwrap().uid(),
        65534
    );
    let dir = agent.path("made");
    c.mkdir(&MkdirRequest {
        path: dir.clone(),
        parents: true,
        mode: None,
        user: Some("nobody".into()),
    })
    .await
    .unwrap();
    assert_eq!(std::fs::metadata(&dir).unwrap().uid(), 65534);
    assert_eq!(
        code(
            c.write_file(
                &agent.path("q"),
                None,
                Some("no-such-user-here"),
                body_from_bytes("")
            )
            .await
        ),
        codes::UNKNOWN_USER
    );
}

#[tokio::test]
async fn reports_metrics() {
    let agent = Agent::start().await;
    let m = agent.client.metrics().await.unwrap();
    assert!(m.cpu_count >= 1);
    assert!(m.memory_total_bytes > 0 && m.memory_used_bytes <= m.memory_total_bytes);
    assert!(m.disk_total_bytes > 0 && m.disk_used_bytes <= m.disk_total_bytes);
    assert!(m.process_count >= 1);
    assert!(m.uptime_ms < 600_000);
}

#[tokio::test]
async fn shuts_down_on_request_and_kills_its_commands() {
    let mut agent = Agent::start().await;
    let started = agent
        .client
        .start_command(&common::argv(&["sleep", "100"]))
        .await
        .unwrap();
    agent
        .client
        .shutdown(ShutdownAction::Poweroff)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = agent.child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "agent did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success());
    let alive =
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(started.pid as i32), None).is_ok();
    assert!(!alive || common::is_zombie(started.pid));
}
