//! Files a hostile or careless sandbox user can point the API at, through the real agent:
//! FIFOs, devices and `/proc` files on read, moves of `/`, huge directories listed in pages,
//! links to `/` in tar downloads, and truncated tar uploads.

mod common;

use std::time::Duration;

use belljar_agent_proto::client::{ClientError, body_from_bytes};
use belljar_agent_proto::{LIST_MAX_LIMIT, LIST_PAGE_BYTES, MoveRequest, codes};
use bytes::Bytes;
use common::Agent;
use futures::TryStreamExt;

/// Long enough for any answer here; a hang (the FIFO defect) fails instead of blocking CI.
const DEADLINE: Duration = Duration::from_secs(20);

fn code<T>(r: Result<T, ClientError>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(e) => e.code().unwrap_or("none").to_owned(),
    }
}

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not answer within {DEADLINE:?}"))
}

#[tokio::test]
async fn reads_refuse_fifos_and_devices_and_stream_proc_files() {
    let agent = Agent::start().await;
    let c = &agent.client;
    let fifo = agent.path("fifo");
    nix::unistd::mkfifo(
        fifo.as_str(),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
    )
    .unwrap();
    // Several at once: each used to hold an agent thread forever.
    for _ in 0..8 {
        let r = within("a FIFO read", c.read_file(&fifo)).await;
        assert_eq!(code(r), codes::NOT_A_REGULAR_FILE);
    }
    let r = within("a device read", c.read_file("/dev/zero")).await;
    assert_eq!(code(r), codes::NOT_A_REGULAR_FILE);
    let r = within("a device read", c.read_file("/dev/null")).await;
    assert_eq!(code(r), codes::NOT_A_REGULAR_FILE);
    // The agent still answers after all that.
    within("health", c.health()).await.unwrap();

    // /proc files say they are empty; their contents must come through anyway.
    let (len, body) = within("a /proc read", c.read_file("/proc/self/status"))
        .await
        .unwrap();
    assert_eq!(len, None, "no length is announced for a /proc file");
    let body: Vec<Bytes> = within("a /proc body", body.try_collect()).await.unwrap();
    let text = String::from_utf8(body.concat()).unwrap();
    assert!(text.contains("Pid:"), "{text}");

    // A regular file still has its length.
    c.write_file(&agent.path("f"), None, None, body_from_bytes("12345"))
        .await
        .unwrap();
    let (len, _) = c.read_file(&agent.path("f")).await.unwrap();
    assert_eq!(len, Some(5));

    // A FIFO inside a downloaded tree is skipped, not read.
    let tar = within("a tar of a tree with a FIFO", async {
        let body = c.download_tar(&agent.path("")).await.unwrap();
        body.try_collect::<Vec<Bytes>>().await.unwrap().concat()
    })
    .await;
    let names: Vec<String> = tar::Archive::new(&tar[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert_eq!(names, ["f"]);
}

#[tokio::test]
async fn moving_the_root_is_an_invalid_path() {
    let agent = Agent::start().await;
    let c = &agent.client;
    let mv = |from: &str, to: &str| MoveRequest {
        from: from.into(),
        to: to.into(),
        overwrite: true,
    };
    let elsewhere = agent.path("root");
    assert_eq!(
        code(c.move_path(&mv("/", &elsewhere)).await),
        codes::INVALID_PATH
    );
    std::fs::create_dir(&elsewhere).unwrap();
    assert_eq!(
        code(c.move_path(&mv(&elsewhere, "/")).await),
        codes::INVALID_PATH
    );
    assert!(std::path::Path::new(&elsewhere).is_dir());
}

#[tokio::test]
async fn lists_big_directories_in_bounded_pages() {
    let agent = Agent::start().await;
    let c = &agent.client;
    let dir = agent.path("big");
    std::fs::create_dir(&dir).unwrap();
    let count = 12_345;
    // Long names, so that the byte bound of a page matters as well as its entry bound.
    let long = "n".repeat(200);
    for i in 0..count {
        std::fs::File::create(format!("{dir}/{long}{i:06}")).unwrap();
    }

    let first = c.list_page(&dir, None, None).await.unwrap();
    assert_eq!(first.entries.len(), belljar_agent_proto::LIST_DEFAULT_LIMIT);
    assert!(first.next_cursor.is_some());

    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = c
            .list_page(&dir, Some(LIST_MAX_LIMIT), cursor.as_deref())
            .await
            .unwrap();
        assert!(page.entries.len() <= LIST_MAX_LIMIT);
        assert!(serde_json::to_vec(&page).unwrap().len() <= LIST_PAGE_BYTES + (64 << 10));
        pages += 1;
        names.extend(page.entries.into_iter().map(|e| e.name));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let want: Vec<String> = (0..count).map(|i| format!("{long}{i:06}")).collect();
    assert_eq!(names, want, "every entry once, in name order");
    assert!(pages >= 3, "{pages} pages");

    assert_eq!(
        code(c.list_page(&dir, Some(LIST_MAX_LIMIT + 1), None).await),
        codes::BAD_REQUEST
    );
    assert_eq!(
        code(c.list_page(&dir, Some(0), None).await),
        codes::BAD_REQUEST
    );
    assert_eq!(
        code(c.list_page(&dir, None, Some("not hex")).await),
        codes::BAD_REQUEST
    );
}

#[tokio::test]
async fn downloaded_links_keep_their_targets() {
    let agent = Agent::start().await;
    let c = &agent.client;
    let src = agent.path("src");
    std::fs::create_dir_all(format!("{src}/d")).unwrap();
    std::os::unix::fs::symlink("/", format!("{src}/root")).unwrap();
    std::os::unix::fs::symlink("/etc/", format!("{src}/d/etc")).unwrap();
    let long = format!("/{}", "x/".repeat(80));
    std::os::unix::fs::symlink(&long, format!("{src}/long")).unwrap();

    let tar: Vec<Bytes> = c
        .download_tar(&src)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let tar = tar.concat();
    let mut links = Vec::new();
    for entry in tar::Archive::new(&tar[..]).entries().unwrap() {
        let entry = entry.unwrap();
        if let Some(target) = entry.link_name_bytes() {
            links.push((
                entry.path().unwrap().display().to_string(),
                String::from_utf8(target.into_owned()).unwrap(),
            ));
        }
    }
    let want = [("d/etc", "/etc/"), ("long", long.as_str()), ("root", "/")];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    assert_eq!(links, want);
}

#[tokio::test]
async fn a_truncated_tar_upload_leaves_nothing_behind() {
    let agent = Agent::start().await;
    let c = &agent.client;
    let dst = agent.path("dst");
    std::fs::create_dir(&dst).unwrap();
    std::fs::write(format!("{dst}/keep.txt"), "old").unwrap();

    let mut builder = tar::Builder::new(Vec::new());
    for (name, len) in [
        ("small.txt", 10usize),
        ("keep.txt", 3000),
        ("big.bin", 1 << 20),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(len as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, name, &vec![b'n'; len][..])
            .unwrap();
    }
    let whole = builder.into_inner().unwrap();
    let cut = whole[..whole.len() / 2].to_vec();

    let r = c.upload_tar(&dst, None, body_from_bytes(cut)).await;
    assert_eq!(code(r), codes::BAD_REQUEST);
    let mut left: Vec<String> = std::fs::read_dir(&dst)
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["keep.txt"], "only what was there before");
    assert_eq!(
        std::fs::read_to_string(format!("{dst}/keep.txt")).unwrap(),
        "old"
    );

    // The whole stream lands, over the existing file.
    c.upload_tar(&dst, None, body_from_bytes(whole))
        .await
        .unwrap();
    assert_eq!(
        std::fs::metadata(format!("{dst}/big.bin")).unwrap().len(),
        1 << 20
    );
    assert_eq!(
        std::fs::metadata(format!("{dst}/keep.txt")).unwrap().len(),
        3000
    );
    let names = std::fs::read_dir(&dst).unwrap().count();
    assert_eq!(names, 3, "no staging directory is left");
}
