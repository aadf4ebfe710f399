//! Templates: a template over an image with env, limits, a timeout and a pool of 2; a create
//! from it is served by its pool and gets its defaults, with the request's own fields over
//! them; templates survive a restart; a replaced template's pool is made again to its new
//! defaults; an unknown image, a duplicate name, an unknown
//! template and removing an image a template uses are refused with stable codes; removing a
//! template destroys its pooled sandboxes. Needs root, the `base` image, buildah and
//! busybox-static, like the other namespace and OCI e2e tests.

use std::time::Duration;

use belljar_api::{CreateTemplate, ListSandboxesQuery, Sandbox};
use belljar_e2e::{Daemon, eventually, sh_ok, stderr, stdout};

/// The pool's marker in a sandbox directory (see the daemon's `sandbox::pool`).
const MARKER: &str = "pooled";

/// Ids of the pooled sandboxes whose directories are still there, ready or starting.
fn pooled(d: &Daemon) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(d.paths.data.join("sandboxes")) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().join(MARKER).exists())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

/// Waits until template `name`'s pool has `n` ready and none starting, and returns the ids
/// of the pooled sandboxes.
async fn pool_ready(d: &Daemon, name: &str, n: u32) -> Vec<String> {
    let c = d.unix();
    eventually(
        Duration::from_secs(60),
        "the template's pool to fill",
        || async {
            let t = c.template(name).await.unwrap();
            let ids = pooled(d);
            (t.pool_ready == n && t.pool_starting == 0 && ids.len() == n as usize).then_some(ids)
        },
    )
    .await
}

fn ok(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{}", stderr(out));
    stdout(out)
}

/// An image of busybox alone, imported under `name`.
fn import_busybox(d: &Daemon, work: &std::path::Path, name: &str) {
    let archive = work.join("busy.tar");
    belljar_e2e::oci::buildah(
        work,
        &format!(
            r#"c=$($B from scratch)
m=$($B mount "$c")
mkdir -p "$m/bin"
cp "$BUSYBOX" "$m/bin/busybox"
ln -s busybox "$m/bin/sh"
$B unmount "$c"
$B commit -q "$c" tpl-img >/dev/null
$B push -q tpl-img docker-archive:{archive}:{name}
"#,
            archive = archive.display()
        ),
    );
    ok(&d.cli(["images", "import", archive.to_str().unwrap()]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_serves_creates_from_its_pool_with_its_defaults() {
    let d = Daemon::start();
    let c = d.unix();
    let out = d.cli([
        "templates",
        "create",
        "web",
        "--image",
        "base",
        "--memory",
        "512",
        "--vcpus",
        "1",
        "--env",
        "GREETING=hello",
        "--env",
        "MODE=template",
        "--timeout",
        "10m",
        "--pool",
        "2",
    ]);
    assert_eq!(ok(&out).trim(), "web");
    let first_pool = pool_ready(&d, "web", 2).await;
    // Pooled sandboxes are nobody's yet: not listed.
    let listed = c
        .all_sandboxes(&ListSandboxesQuery::default())
        .await
        .unwrap();
    assert!(listed.is_empty(), "{listed:?}");
    let ls = ok(&d.cli(["templates", "ls"]));
    assert!(
        ls.contains("web") && ls.contains("base") && ls.contains("2/2"),
        "{ls}"
    );

    // From the template, with one env override: served by its pool, with its defaults.
    let out = d.cli([
        "--json",
        "create",
        "--template",
        "web",
        "--env",
        "MODE=mine",
        "--name",
        "one",
    ]);
    let one: Sandbox = serde_json::from_str(&ok(&out)).unwrap();
    assert!(
        first_pool.contains(&one.id),
        "not served by the pool: {} {first_pool:?}",
        one.id
    );
    assert_eq!(one.image, "base");
    assert_eq!(
        one.template.as_deref(),
        Some("web"),
        "it records its template"
    );
    assert_eq!((one.memory_mib, one.vcpus), (512, 1));
    assert_eq!(one.timeout_ms, 600_000);
    assert_eq!(one.env["GREETING"], "hello");
    assert_eq!(one.env["MODE"], "mine");
    assert_eq!(
        sh_ok(&c, &one.id, "echo $GREETING $MODE").await,
        "hello mine\n"
    );
    assert!(
        !d.paths
            .data
            .join("sandboxes")
            .join(&one.id)
            .join(MARKER)
            .exists()
    );
    // The pool refills in the background, with a new sandbox.
    let refilled = pool_ready(&d, "web", 2).await;
    assert!(!refilled.contains(&one.id));

    // A limit the pool was not started with: launched as usual, the other defaults kept.
    let other = c
        .create_sandbox(&belljar_api::CreateSandbox {
            template: Some("web".into()),
            memory_mib: Some(256),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!refilled.contains(&other.id));
    assert_eq!((other.memory_mib, other.vcpus), (256, 1));
    assert_eq!(other.env["MODE"], "template");

    // Refusals, each with its code; nothing changes.
    let spec = |name: &str, image: &str| CreateTemplate {
        name: name.into(),
        image: image.into(),
        ..Default::default()
    };
    let err = c
        .create_template(&spec("nope", "no-such-image"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "image_not_available", "{err}");
    let err = c.create_template(&spec("web", "base")).await.unwrap_err();
    assert_eq!(err.code(), "conflict", "{err}");
    let err = c
        .create_sandbox(&belljar_api::CreateSandbox {
            template: Some("absent".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "template_not_found", "{err}");
    let out = d.cli(["templates", "create", "Bad", "--image", "base"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("bad_request"), "{}", stderr(&out));
    let names: Vec<String> = (c.list_templates().await.unwrap().templates.into_iter())
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["web"]);

    // An image a template uses stays.
    let work = tempfile::Builder::new()
        .prefix("belljar-tpl-")
        .tempdir()
        .unwrap();
    let image = format!("localhost/e2e-templates/busy:{}", std::process::id());
    import_busybox(&d, work.path(), &image);
    ok(&d.cli(["templates", "create", "busy", "--image", &image]));
    let err = c.remove_image(&image).await.unwrap_err();
    assert_eq!(err.code(), "conflict", "{err}");
    assert!(err.to_string().contains("busy"), "{err}");

    // A restart keeps the templates, and the pool fills again.
    d.kill9();
    d.restart();
    let c = d.unix();
    let web = c.template("web").await.unwrap();
    assert_eq!((web.memory_mib, web.pool), (Some(512), 2));
    assert_eq!(
        c.sandbox(&one.id).await.unwrap().template.as_deref(),
        Some("web")
    );
    assert_eq!(
        c.sandbox(&other.id).await.unwrap().template.as_deref(),
        Some("web")
    );
    assert_eq!(web.env["GREETING"], "hello");
    let after = pool_ready(&d, "web", 2).await;
    assert!(
        after.iter().all(|id| !refilled.contains(id)),
        "{after:?} {refilled:?}"
    );

    // Replaced: new creates get the new defaults, the pool is made again to them (the old
    // pooled sandboxes go), and sandboxes made before keep theirs.
    let out = d.cli([
        "templates",
        "update",
        "web",
        "--image",
        "base",
        "--memory",
        "256",
        "--env",
        "GREETING=bye",
        "--pool",
        "1",
    ]);
    assert_eq!(ok(&out).trim(), "web");
    let renewed = pool_ready(&d, "web", 1).await;
    assert!(
        after.iter().all(|id| !renewed.contains(id)),
        "{renewed:?} {after:?}"
    );
    let web = c.template("web").await.unwrap();
    assert_eq!((web.memory_mib, web.vcpus, web.pool), (Some(256), None, 1));
    let third = c
        .create_sandbox(&belljar_api::CreateSandbox {
            template: Some("web".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        renewed,
        std::slice::from_ref(&third.id),
        "served by the new pool"
    );
    assert_eq!(third.memory_mib, 256);
    assert_eq!(third.template.as_deref(), Some("web"));
    assert_eq!(sh_ok(&c, &third.id, "echo $GREETING").await, "bye\n");
    assert_eq!(c.sandbox(&one.id).await.unwrap().env["GREETING"], "hello");
    let err = c
        .replace_template(&spec("absent", "base"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "template_not_found", "{err}");
    let err = c
        .replace_template(&CreateTemplate {
            pool: Some(65),
            ..spec("web", "base")
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "bad_request", "{err}");
    assert_eq!(
        c.template("web").await.unwrap().memory_mib,
        Some(256),
        "unchanged"
    );

    // Removing the templates: the pooled sandboxes go, the sandboxes made from it stay, and
    // the image may go.
    ok(&d.cli(["templates", "rm", "web", "busy"]));
    assert_eq!(
        c.template("web").await.unwrap_err().code(),
        "template_not_found"
    );
    eventually(
        Duration::from_secs(30),
        "the pooled sandboxes to go",
        || async { pooled(&d).is_empty().then_some(()) },
    )
    .await;
    for id in &after {
        assert!(
            !d.paths.data.join("sandboxes").join(id).exists(),
            "{id} left behind"
        );
    }
    let mut ids: Vec<String> = (c
        .all_sandboxes(&ListSandboxesQuery::default())
        .await
        .unwrap())
    .into_iter()
    .map(|s| s.id)
    .collect();
    ids.sort();
    let mut made = vec![one.id.clone(), other.id.clone(), third.id.clone()];
    made.sort();
    assert_eq!(ids, made);
    c.remove_image(&image).await.unwrap();
}
