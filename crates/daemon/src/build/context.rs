//! The build context after its `.dockerignore` ([`belljar_api::dockerignore`]): what the file
//! excludes is removed from the unpacked context before any step reads it, the Dockerfile and
//! the ignore file included when they are excluded (Docker's rule: they are read, never
//! copied). The CLI leaves the same files out of what it sends; an API client may send them.

use std::os::fd::OwnedFd;
use std::path::Path;

use belljar_api::dockerignore::{self, Ignore};
use belljar_oci::build::copy::{self, Scope};

use super::BuildError;

/// The most bytes of an ignore file read.
const MAX_IGNORE_FILE: u64 = 1 << 20;

/// The ignore file of a build of `dockerfile` in the context at `root` (opened as `fd`): the
/// Dockerfile's own one, else the context's, else nothing excluded.
pub(super) fn read_ignore(
    root: &Path,
    fd: &OwnedFd,
    dockerfile: &str,
) -> Result<Ignore, BuildError> {
    for name in dockerignore::candidates(dockerfile) {
        // Whether it is there at all; reading it is refused if it leads out of the context.
        if root.join(&name).symlink_metadata().is_err() {
            continue;
        }
        let bytes = copy::read_file(fd, &name, Scope::Context, MAX_IGNORE_FILE)?;
        let text = String::from_utf8(bytes).map_err(|_| BuildError::Ignore {
            file: name.clone(),
            message: "it is not UTF-8".into(),
        })?;
        return Ignore::parse(&text).map_err(|e| BuildError::Ignore {
            file: name,
            message: e.to_string(),
        });
    }
    Ok(Ignore::default())
}

/// Removes from the context at `root` what `ignore` excludes. A directory excluded whole goes
/// at once; one an exception may reopen is looked into, and goes if nothing in it is kept.
/// Links are removed as links, never followed.
pub(super) fn remove_ignored(root: &Path, ignore: &Ignore) -> std::io::Result<()> {
    if ignore.is_empty() {
        return Ok(());
    }
    prune(root, "", ignore)
}

fn prune(dir: &Path, rel: &str, ignore: &Ignore) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            // Not UTF-8: no pattern (which is text) can name it, but one can name its parent.
            continue;
        };
        let path = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let is_dir = entry.file_type()?.is_dir();
        if !ignore.excludes(&path) {
            if is_dir {
                prune(&entry.path(), &path, ignore)?;
            }
            continue;
        }
        if !is_dir {
            std::fs::remove_file(entry.path())?;
        } else if ignore.may_keep_inside(&path) {
            prune(&entry.path(), &path, ignore)?;
            if std::fs::read_dir(entry.path())?.next().is_none() {
                std::fs::remove_dir(entry.path())?;
            }
        } else {
            std::fs::remove_dir_all(entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(root: &Path, files: &[&str]) {
        for f in files {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, f.as_bytes()).unwrap();
        }
    }

    fn listing(root: &Path) -> Vec<String> {
        fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                let name = format!("{rel}{}", e.file_name().to_str().unwrap());
                if e.file_type().unwrap().is_dir() {
                    out.push(format!("{name}/"));
                    walk(&e.path(), &format!("{name}/"), out);
                } else {
                    out.push(name);
                }
            }
        }
        let mut out = Vec::new();
        walk(root, "", &mut out);
        out.sort();
        out
    }

    #[test]
    fn excluded_files_leave_the_context_and_exceptions_stay() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        tree(
            root,
            &[
                "Dockerfile",
                ".dockerignore",
                "src/main.rs",
                "node_modules/a/index.js",
                "logs/app.log",
                "vendor/drop.txt",
                "vendor/keep.txt",
                "notes.md",
                "README.md",
            ],
        );
        std::os::unix::fs::symlink("/etc", root.join("outside")).unwrap();
        let ignore = Ignore::parse(
            "node_modules\n**/*.log\nvendor\n!vendor/keep.txt\n*.md\n!README.md\noutside\n\
             Dockerfile\n.dockerignore\n",
        )
        .unwrap();
        remove_ignored(root, &ignore).unwrap();
        assert_eq!(
            listing(root),
            [
                "README.md",
                "logs/",
                "src/",
                "src/main.rs",
                "vendor/",
                "vendor/keep.txt"
            ]
        );
        assert!(
            Path::new("/etc/passwd").exists(),
            "the link was removed, not followed"
        );
    }

    #[test]
    fn a_reopened_directory_with_nothing_kept_goes() {
        let dir = tempfile::tempdir().unwrap();
        tree(dir.path(), &["cache/x", "cache/y"]);
        let ignore = Ignore::parse("cache\n!cache/z\n").unwrap();
        remove_ignored(dir.path(), &ignore).unwrap();
        assert!(listing(dir.path()).is_empty());
    }

    #[test]
    fn the_dockerfile_s_own_ignore_file_wins() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        tree(root, &["docker/app.Dockerfile", "a", "b"]);
        std::fs::write(root.join(".dockerignore"), "a\n").unwrap();
        std::fs::write(root.join("docker/app.Dockerfile.dockerignore"), "b\n").unwrap();
        let fd = copy::open_root(root).unwrap();
        let ignore = read_ignore(root, &fd, "docker/app.Dockerfile").unwrap();
        assert!(ignore.excludes("b") && !ignore.excludes("a"));
        let ignore = read_ignore(root, &fd, "Dockerfile").unwrap();
        assert!(ignore.excludes("a") && !ignore.excludes("b"));
    }

    #[test]
    fn an_ignore_file_that_leads_out_or_is_bad_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::os::unix::fs::symlink("/etc/passwd", root.join(".dockerignore")).unwrap();
        let fd = copy::open_root(root).unwrap();
        let e = read_ignore(root, &fd, "Dockerfile").unwrap_err();
        assert_eq!(e.code(), belljar_api::ErrorCode::InvalidPath, "{e}");
        std::fs::remove_file(root.join(".dockerignore")).unwrap();
        std::fs::write(root.join(".dockerignore"), "ok\n[oops\n").unwrap();
        let e = read_ignore(root, &fd, "Dockerfile").unwrap_err();
        assert_eq!(e.code(), belljar_api::ErrorCode::DockerfileInvalid);
        assert!(e.to_string().contains("line 2"), "{e}");
    }
}
