//! Helpers of the microVM end-to-end tests (`e2e_microvm`, run by scripts/test-microvm.sh):
//! microVM sandboxes made over the API, their consoles for failure messages, and what their
//! VMM says of them.

use std::time::Duration;

use belljar_api::{BackendChoice, CreateSandbox};
use belljar_client::Client;
use belljar_vmm_api::ControlClient;
use belljar_vmm_api::control::VmState;

use crate::{Daemon, stdout};

/// The sandbox's console log (the guest kernel's and the agent's output) and the VMM's own
/// log, for failures.
pub fn console(d: &Daemon, id: &str) -> String {
    let mut found = String::new();
    let Ok(walk) = std::process::Command::new("find")
        .arg(d.home.path())
        .args([
            "(",
            "-name",
            "console.log",
            "-o",
            "-name",
            "vmm.log",
            ")",
            "-path",
        ])
        .arg(format!("*{id}*"))
        .output()
    else {
        return found;
    };
    for p in stdout(&walk).lines() {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        found += &format!("--- {p}\n");
        found += &lines[lines.len().saturating_sub(60)..].join("\n");
        found += "\n";
    }
    found
}

/// A microVM sandbox over the API (30 min timeout, as the CLI-made ones in `e2e_microvm` get); with the daemon's
/// log and the consoles when it fails.
pub async fn create_vm(d: &Daemon, c: &Client, req: CreateSandbox) -> belljar_api::Sandbox {
    let req = CreateSandbox {
        backend: req.backend.or(Some(BackendChoice::Microvm)),
        timeout_ms: Some(30 * 60_000),
        ..req
    };
    match c.create_sandbox(&req).await {
        Ok(s) => s,
        Err(e) => panic!(
            "create failed: {e}\nlog:\n{}\nconsoles:\n{}",
            d.log(),
            console(d, "sbx_")
        ),
    }
}

/// What the VMM of a microVM sandbox says its vCPUs do.
pub fn vm_state(d: &Daemon, id: &str) -> VmState {
    let sock = d
        .paths
        .data
        .join("sandboxes")
        .join(id)
        .join("microvm/vmm.sock");
    ControlClient::connect(&sock, Duration::from_secs(5))
        .and_then(|mut c| c.status())
        .unwrap_or_else(|e| panic!("the VMM of {id}: {e}"))
        .state
}

/// 512 MiB sandboxes: L1 has 3 GiB, and up to three microVMs and a namespace sandbox of
/// this test run at once.
pub fn small() -> CreateSandbox {
    CreateSandbox {
        memory_mib: Some(512),
        ..Default::default()
    }
}
