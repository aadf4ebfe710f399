//! Can this host run microVMs at all? The facts about KVM (is `/dev/kvm` there and openable,
//! does the CPU have `vmx`/`svm`, is KVM the software PVM flavour) and the verdict drawn from
//! them. Shared here, in a crate without KVM dependencies, so that the daemon's backend probe
//! and `belljar doctor` reach the same verdict from the same code.

use std::path::Path;

/// What the probe looks at, gathered from the host so the decision itself is testable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// `None` when `/dev/kvm` is missing; the open error's kind when it cannot be opened.
    pub kvm: Option<Result<(), std::io::ErrorKind>>,
    /// The `flags` of `/proc/cpuinfo`.
    pub cpu_flags: String,
    /// `/sys/module/kvm_pvm` exists: KVM is the software PVM flavour.
    pub pvm: bool,
}

impl HostFacts {
    pub fn gather() -> Self {
        let kvm = Path::new("/dev/kvm").exists().then(|| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/kvm")
                .map(drop)
                .map_err(|e| e.kind())
        });
        let cpu_flags = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("flags"))
            .unwrap_or_default()
            .to_owned();
        Self {
            kvm,
            cpu_flags,
            pvm: Path::new("/sys/module/kvm_pvm").exists(),
        }
    }
}

/// Why a host cannot run microVMs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no /dev/kvm: hardware virtualization is not exposed to this host")]
    NoKvm,
    #[error("cannot open /dev/kvm: {0}")]
    KvmClosed(std::io::ErrorKind),
    #[error("KVM is software-based (PVM) here: guest kernels would run emulated")]
    Pvm,
    #[error("the CPU has no vmx or svm flag: KVM here is not hardware-accelerated")]
    NoVirtualization,
}

/// The host-side verdict before the tiny probe guest: the CPU's flag (`vmx` or `svm`), or
/// why microVMs cannot work.
pub fn host_verdict(facts: &HostFacts) -> Result<&'static str, Refusal> {
    match &facts.kvm {
        None => return Err(Refusal::NoKvm),
        Some(Err(kind)) => return Err(Refusal::KvmClosed(*kind)),
        Some(Ok(())) => {}
    }
    if facts.pvm {
        return Err(Refusal::Pvm);
    }
    let has = |flag: &str| facts.cpu_flags.split_whitespace().any(|f| f == flag);
    if has("vmx") {
        Ok("vmx")
    } else if has("svm") {
        Ok("svm")
    } else {
        Err(Refusal::NoVirtualization)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(kvm: Option<Result<(), std::io::ErrorKind>>, flags: &str, pvm: bool) -> HostFacts {
        HostFacts {
            kvm,
            cpu_flags: format!("flags\t\t: fpu {flags} sse"),
            pvm,
        }
    }

    #[test]
    fn pvm_and_missing_flags_rule_microvms_out() {
        let pvm = host_verdict(&facts(Some(Ok(())), "vmx", true)).unwrap_err();
        assert_eq!(
            pvm.to_string(),
            "KVM is software-based (PVM) here: guest kernels would run emulated"
        );
        assert_eq!(
            host_verdict(&facts(None, "vmx", false)),
            Err(Refusal::NoKvm)
        );
        let denied = std::io::ErrorKind::PermissionDenied;
        let closed = host_verdict(&facts(Some(Err(denied)), "vmx", false)).unwrap_err();
        assert_eq!(
            closed.to_string(),
            "cannot open /dev/kvm: permission denied"
        );
        assert_eq!(
            host_verdict(&facts(Some(Ok(())), "hypervisor", false)),
            Err(Refusal::NoVirtualization)
        );
        assert_eq!(host_verdict(&facts(Some(Ok(())), "svm", false)), Ok("svm"));
        assert_eq!(host_verdict(&facts(Some(Ok(())), "vmx", false)), Ok("vmx"));
    }
}
