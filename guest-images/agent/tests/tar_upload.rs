//! Tar uploads whose entry names are absolute: found by the `tar_upload` fuzz target. The
//! tar crate unpacks `/x/y` under the target, but the agent then chowned the raw name `/x/y`
//! itself, so an upload could hand any file in the sandbox to the requesting user.

mod common;

use std::os::unix::fs::MetadataExt;

use belljar_agent_proto::client::body_from_bytes;
use common::Agent;

#[tokio::test]
async fn absolute_entry_names_chown_nothing_outside_the_target() {
    if !common::root_or_not_run("to see ownership") {
        return;
    }
    let agent = Agent::start().await;
    let victim = agent.path("victim.txt");
    std::fs::write(&victim, "not yours").unwrap();
    std::os::unix::fs::lchown(&victim, Some(4242), Some(4242)).unwrap();

    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(5);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    let name = victim.as_bytes();
    header.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name);
    header.set_cksum();
    tar.append(&header, &b"pwned"[..]).unwrap();
    let jail = agent.path("jail");
    agent
        .client
        .upload_tar(
            &jail,
            Some("nobody"),
            body_from_bytes(tar.into_inner().unwrap()),
        )
        .await
        .unwrap();

    let meta = std::fs::metadata(&victim).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (4242, 4242), "victim was chowned");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "not yours");
    let inside = format!("{jail}{victim}");
    assert_eq!(std::fs::read_to_string(&inside).unwrap(), "pwned");
    assert_eq!(std::fs::metadata(&inside).unwrap().uid(), 65534);
}
