//! The bodies of Belljar's fuzz targets, one module per parser that a guest or a client can
//! reach.
//!
//! They live in a normal workspace crate (not in `fuzz/`, which needs nightly and
//! libFuzzer) so that `cargo test` replays every committed corpus file through exactly the
//! code the fuzzer runs: a crash once found stays found. Each module's `run` takes the raw
//! fuzz input, never panics on behalf of the input, and panics (the fuzzer's "crash") when
//! the code under test panics or breaks one of the invariants the module checks.
#![forbid(unsafe_code)]

pub mod agent_answer;
pub mod agent_request;
pub mod daemon;
pub mod daemon_body;
pub mod daemon_query;
pub mod guest_frames;
pub mod input;
pub mod tar_upload;
pub mod virtio_blk_chain;
pub mod virtio_net_chain;
pub mod virtqueue;
pub mod vsock_chain;

/// A target's body: takes one fuzz input.
pub type Harness = fn(&[u8]);

/// Every target by the name of its `fuzz/fuzz_targets/<name>.rs` and corpus directory.
pub const TARGETS: &[(&str, Harness)] = &[
    ("virtio_blk_chain", virtio_blk_chain::run),
    ("vsock_chain", vsock_chain::run),
    ("virtio_net_chain", virtio_net_chain::run),
    ("agent_request", agent_request::run),
    ("agent_answer", agent_answer::run),
    ("tar_upload", tar_upload::run),
    ("daemon_body", daemon_body::run),
    ("daemon_query", daemon_query::run),
    ("guest_frames", guest_frames::run),
];

/// Removes the scratch directories this process's harnesses made under the temporary
/// directory (they live as long as the process, which for a fuzzer is the whole run).
pub fn remove_scratch() {
    let pid = std::process::id();
    for kind in ["blk", "vsock", "net", "agent", "home"] {
        let _ = std::fs::remove_dir_all(
            std::env::temp_dir().join(format!("belljar-fuzz-{kind}-{pid}")),
        );
    }
    tar_upload::remove_scratch();
}
