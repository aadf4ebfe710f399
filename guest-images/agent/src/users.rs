//! Users and groups from /etc/passwd and /etc/group, parsed by hand: the agent is linked
//! statically, where glibc's NSS lookups do not work.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

/// A user as commands and files need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
    /// Supplementary groups, the primary group included.
    pub groups: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum UsersError {
    /// No such user in the passwd file.
    #[error("Unknown user {0}")]
    Unknown(String),
    /// The passwd or group file cannot be read.
    #[error("Cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// Looks `name` up in `<etc>/passwd` and `<etc>/group`.
pub fn lookup_in(etc: &Path, name: &str) -> Result<User, UsersError> {
    let passwd = read(&etc.join("passwd"))?;
    let group = read(&etc.join("group")).unwrap_or_else(|_| "".into());
    find(&passwd, &group, |fields| fields[0] == name)
        .ok_or_else(|| UsersError::Unknown(name.to_owned()))
}

/// Looks up the user with `uid` in `<etc>/passwd` and `<etc>/group`.
pub fn lookup_uid_in(etc: &Path, uid: u32) -> Result<User, UsersError> {
    let passwd = read(&etc.join("passwd"))?;
    let group = read(&etc.join("group")).unwrap_or_else(|_| "".into());
    find(&passwd, &group, |fields| fields[2].parse() == Ok(uid))
        .ok_or_else(|| UsersError::Unknown(uid.to_string()))
}

/// Looks `name` up in /etc.
pub fn lookup(name: &str) -> Result<User, UsersError> {
    lookup_in(Path::new("/etc"), name)
}

/// Looks `uid` up in /etc.
pub fn lookup_uid(uid: u32) -> Result<User, UsersError> {
    lookup_uid_in(Path::new("/etc"), uid)
}

/// The user a request runs as. As root: the named user, or `belljar` when none is named (root
/// when the system has no `belljar`). As any other user the agent cannot switch users, so the
/// request's `user` is ignored and everything runs as the agent's own user.
pub fn resolve(requested: Option<&str>) -> Result<User, UsersError> {
    let euid = nix::unistd::geteuid().as_raw();
    if euid != 0 {
        return Ok(lookup_uid(euid).unwrap_or_else(|_| synthesized(euid)));
    }
    match requested {
        Some(name) => match lookup(name) {
            Err(UsersError::Read { .. }) if name == "root" => Ok(synthesized(0)),
            other => other,
        },
        None => lookup(belljar_agent_proto::DEFAULT_USER)
            .or_else(|_| lookup("root"))
            .or_else(|_| Ok(synthesized(0))),
    }
}

/// A user for a uid that has no passwd entry.
fn synthesized(uid: u32) -> User {
    let gid = nix::unistd::getegid().as_raw();
    User {
        name: if uid == 0 {
            "root".into()
        } else {
            uid.to_string()
        },
        uid,
        gid,
        home: std::env::var("HOME").unwrap_or_else(|_| "/".into()),
        shell: "/bin/sh".into(),
        groups: vec![gid],
    }
}

/// What identifies a version of a file: when any of it changes, the file is read again.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    size: u64,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            size: meta.size(),
        }
    }
}

/// The passwd and group files as last read, by path: every command's start looks its user
/// up, and a `stat` is much cheaper than reading and closing both files each time. A file
/// replaced (new inode, as `useradd` does), appended to, or written at another time is read
/// again.
static FILES: LazyLock<Mutex<Files>> = LazyLock::new(Default::default);

/// A file's text by path, with the stamp it was read at.
type Files = HashMap<PathBuf, (Stamp, Arc<str>)>;

fn read(path: &Path) -> Result<Arc<str>, UsersError> {
    let failed = |source| UsersError::Read {
        path: path.display().to_string(),
        source,
    };
    // Stamped before reading: a change during the read gives a new stamp, so the next
    // lookup reads the file again.
    let stamp = Stamp::of(&fs::metadata(path).map_err(failed)?);
    let mut files = FILES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((cached, text)) = files.get(path)
        && *cached == stamp
    {
        return Ok(text.clone());
    }
    let text: Arc<str> = fs::read_to_string(path).map_err(failed)?.into();
    files.insert(path.to_owned(), (stamp, text.clone()));
    Ok(text)
}

fn find(passwd: &str, group: &str, matches: impl Fn(&[&str]) -> bool) -> Option<User> {
    let fields = passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 7 && !f[0].starts_with('#') && matches(f))?;
    let uid = fields[2].parse().ok()?;
    let gid = fields[3].parse().ok()?;
    let name = fields[0].to_owned();
    let mut groups = vec![gid];
    for line in group.lines() {
        let g: Vec<_> = line.split(':').collect();
        if g.len() < 4 {
            continue;
        }
        let Ok(id) = g[2].parse::<u32>() else {
            continue;
        };
        if g[3].split(',').any(|member| member == name) && !groups.contains(&id) {
            groups.push(id);
        }
    }
    Some(User {
        name,
        uid,
        gid,
        home: fields[5].to_owned(),
        shell: if fields[6].is_empty() {
            "/bin/sh".to_owned()
        } else {
            fields[6].to_owned()
        },
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        # comment\n\
        belljar:x:1000:1000:Belljar,,,:/home/belljar:/bin/bash\n\
        nobody:x:65534:65534:nobody:/nonexistent:\n";
    const GROUP: &str =
        "root:x:0:\nsudo:x:27:belljar\nbelljar:x:1000:\nusers:x:100:alice,belljar\n";

    #[test]
    fn finds_users_with_their_groups() {
        let user = find(PASSWD, GROUP, |f| f[0] == "belljar").unwrap();
        assert_eq!(user.uid, 1000);
        assert_eq!(user.home, "/home/belljar");
        assert_eq!(user.groups, [1000, 27, 100]);
        let nobody = find(PASSWD, GROUP, |f| f[2] == "65534").unwrap();
        assert_eq!(nobody.shell, "/bin/sh");
        assert!(find(PASSWD, GROUP, |f| f[0] == "mallory").is_none());
    }

    #[test]
    fn reads_files_from_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("passwd"), PASSWD).unwrap();
        fs::write(dir.path().join("group"), GROUP).unwrap();
        assert_eq!(lookup_in(dir.path(), "root").unwrap().uid, 0);
        assert_eq!(lookup_uid_in(dir.path(), 1000).unwrap().name, "belljar");
        assert!(matches!(
            lookup_in(dir.path(), "x"),
            Err(UsersError::Unknown(_))
        ));
    }

    #[test]
    fn users_added_or_changed_after_a_lookup_are_seen() {
        let dir = tempfile::tempdir().unwrap();
        let (passwd, group) = (dir.path().join("passwd"), dir.path().join("group"));
        fs::write(&passwd, PASSWD).unwrap();
        fs::write(&group, GROUP).unwrap();
        assert!(lookup_in(dir.path(), "alice").is_err());
        // Appended, as `echo >> /etc/passwd` does.
        let mut more = fs::OpenOptions::new().append(true).open(&passwd).unwrap();
        io::Write::write_all(&mut more, b"alice:x:1001:1001::/home/alice:/bin/sh\n").unwrap();
        assert_eq!(lookup_in(dir.path(), "alice").unwrap().uid, 1001);
        // Replaced by a file of the same size, as `useradd` and `usermod` do (a new file
        // renamed over the old one).
        let edited = dir.path().join("passwd+");
        fs::write(
            &edited,
            fs::read_to_string(&passwd)
                .unwrap()
                .replace("1001:1001", "1002:1002"),
        )
        .unwrap();
        fs::rename(&edited, &passwd).unwrap();
        assert_eq!(lookup_uid_in(dir.path(), 1002).unwrap().name, "alice");
        // A group gained the user.
        fs::write(&group, format!("{GROUP}dev:x:500:alice\n")).unwrap();
        assert_eq!(
            lookup_in(dir.path(), "alice").unwrap().groups,
            [1002, 100, 500]
        );
    }
}
