//! What a namespace sandbox holds on the host (its directory, PID 1, cgroups and mounts), read
//! from its state file, so that tests can check a delete or a pool hand-over left none of it.

use std::path::{Path, PathBuf};

use crate::Daemon;

/// What a running sandbox holds on the host, read from its state file.
pub struct Held {
    pub dir: PathBuf,
    pub pid: i32,
    pub cgroups: Vec<PathBuf>,
}

pub fn held(d: &Daemon, id: &str) -> Held {
    let dir = d.paths.data.join("sandboxes").join(id);
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("namespace/sandbox.json")).expect("namespace state file"),
    )
    .unwrap();
    let groups = &state["groups"];
    let cgroups = groups["v2"]
        .as_str()
        .into_iter()
        .chain(
            groups["v1"]
                .as_object()
                .into_iter()
                .flat_map(|m| m.values().filter_map(|v| v.as_str())),
        )
        .map(PathBuf::from)
        .collect();
    Held {
        dir,
        pid: i32::try_from(state["pid"].as_i64().unwrap()).unwrap(),
        cgroups,
    }
}

/// Mount points under `dir` in this process's mount namespace.
pub fn mounted_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .map(str::to_owned)
        .collect()
}
