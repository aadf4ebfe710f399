//! Renders the TypeScript declarations of every wire type into one file for the UI and SDK.
//!
//! The file is committed once, in the TypeScript SDK at `sdk/typescript/src/generated/api.ts`
//! (the SDK is published on its own); the UI's `ui/src/generated/api.ts` re-exports it. The
//! test below regenerates it and fails when the committed file drifted from the Rust types. Run
//! `BELLJAR_WRITE_TS=1 cargo test -p belljar-api` to rewrite it after changing a type.

use ts_rs::{Config, TS};

use crate::*;

/// The header that marks the file as generated.
pub const HEADER: &str = "// Generated from crates/api by `BELLJAR_WRITE_TS=1 cargo test -p belljar-api`. Do not edit.\n";

/// Every exported declaration, in a stable order.
pub fn render() -> String {
    // JSON numbers reach JavaScript as `number`; our times and sizes stay below 2^53.
    let cfg = Config::default().with_large_int("number");
    let decls = [
        ErrorBody::decl(&cfg),
        ErrorDetail::decl(&cfg),
        ErrorCode::decl(&cfg),
        SandboxStatus::decl(&cfg),
        Backend::decl(&cfg),
        BackendChoice::decl(&cfg),
        Source::decl(&cfg),
        CreateSandbox::decl(&cfg),
        LimitsReport::decl(&cfg),
        LimitState::decl(&cfg),
        SandboxLifecycle::decl(&cfg),
        Sandbox::decl(&cfg),
        SandboxUsage::decl(&cfg),
        ListSandboxesQuery::decl(&cfg),
        SandboxList::decl(&cfg),
        UpdateSandbox::decl(&cfg),
        ExtendSandbox::decl(&cfg),
        SnapshotStatus::decl(&cfg),
        SnapshotMount::decl(&cfg),
        SandboxMounts::decl(&cfg),
        UnmountQuery::decl(&cfg),
        VolumeMount::decl(&cfg),
        CreateVolume::decl(&cfg),
        Volume::decl(&cfg),
        VolumeList::decl(&cfg),
        CreateTemplate::decl(&cfg),
        Template::decl(&cfg),
        TemplateList::decl(&cfg),
        Snapshot::decl(&cfg),
        CreateSnapshot::decl(&cfg),
        UpdateSnapshot::decl(&cfg),
        KeepLastSnapshots::decl(&cfg),
        ForkSandbox::decl(&cfg),
        ListSnapshotsQuery::decl(&cfg),
        SnapshotList::decl(&cfg),
        NetworkMode::decl(&cfg),
        NetworkPolicy::decl(&cfg),
        NetworkRules::decl(&cfg),
        DomainAllow::decl(&cfg),
        DomainRule::decl(&cfg),
        Transform::decl(&cfg),
        Subnets::decl(&cfg),
        Port::decl(&cfg),
        AddPort::decl(&cfg),
        PortList::decl(&cfg),
        FlowProtocol::decl(&cfg),
        FlowVerdict::decl(&cfg),
        NetworkFlow::decl(&cfg),
        FlowsQuery::decl(&cfg),
        NetworkUsage::decl(&cfg),
        NetworkInfo::decl(&cfg),
        DiffQuery::decl(&cfg),
        ChangeKind::decl(&cfg),
        EntryKind::decl(&cfg),
        DiffEntry::decl(&cfg),
        FileChange::decl(&cfg),
        SnapshotDiff::decl(&cfg),
        PtySize::decl(&cfg),
        RunCommand::decl(&cfg),
        CommandStatus::decl(&cfg),
        Command::decl(&cfg),
        CommandList::decl(&cfg),
        Stream::decl(&cfg),
        LogLine::decl(&cfg),
        KillCommand::decl(&cfg),
        TerminalMessage::decl(&cfg),
        FileKind::decl(&cfg),
        FileEntry::decl(&cfg),
        FileList::decl(&cfg),
        MkdirRequest::decl(&cfg),
        MoveRequest::decl(&cfg),
        WatchKind::decl(&cfg),
        WatchEvent::decl(&cfg),
        Event::decl(&cfg),
        BackendInfo::decl(&cfg),
        Info::decl(&cfg),
        PoolInfo::decl(&cfg),
        SessionToken::decl(&cfg),
        ImageStatus::decl(&cfg),
        Image::decl(&cfg),
        ImageUsers::decl(&cfg),
        ImageBuildEvent::decl(&cfg),
        PullImage::decl(&cfg),
        PruneImages::decl(&cfg),
        PrunedImages::decl(&cfg),
        PrunedImage::decl(&cfg),
        ImportQuery::decl(&cfg),
        BuildQuery::decl(&cfg),
        DoctorStatus::decl(&cfg),
        DoctorFinding::decl(&cfg),
        DoctorReport::decl(&cfg),
    ];
    let mut out = String::from(HEADER);
    for decl in decls {
        out.push_str("\nexport ");
        out.push_str(&decl);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    #[test]
    fn generated_typescript_matches_the_rust_types() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let fresh = super::render();
        {
            let file = "sdk/typescript/src/generated/api.ts";
            let path = root.join(file);
            if std::env::var_os("BELLJAR_WRITE_TS").is_some() {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &fresh).unwrap();
            }
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                committed == fresh,
                "{file} is out of date: run `BELLJAR_WRITE_TS=1 cargo test -p belljar-api`"
            );
        }
    }
}
