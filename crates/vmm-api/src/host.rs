//! Can this host run microVMs at all? The facts about KVM (is `/dev/kvm` there and openable,
//! does the CPU have `vmx`/`svm`, is KVM the software PVM flavour) and the verdict drawn from
//! them. Shared here, in a crate without KVM dependencies, so that the daemon's backend probe
//! and `belljar doctor` reach the same verdict from the same code.

use std::path::Path;

/// What the probe looks at, gathered from the host so the decision itself is testable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// `None` when `/dev/kvm` is missing; the open error when it cannot be opened.
    pub kvm: Option<Result<(), String>>,
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
                .map_err(|e| e.to_string())
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

/// The host-side verdict before the tiny probe guest: `Err(reason)` when microVMs cannot work.
pub fn host_verdict(facts: &HostFacts) -> Result<&'static str, String> {
    match &facts.kvm {
        None => {
            return Err("no /dev/kvm: hardware virtualization is not exposed to this host".into());
        }
        Some(Err(e)) => return Err(format!("cannot open /dev/kvm: {e}")),
        Some(Ok(())) => {}
    }
    if facts.pvm {
        return Err("KVM is software-based (PVM) here: guest kernels would run emulated".into());
    }
    let has = |flag: &str| facts.cpu_flags.split_whitespace().any(|f| f == flag);
    if has("vmx") {
        Ok("vmx")
    } else if has("svm") {
        Ok("svm")
    } else {
        Err("the CPU has no vmx or svm flag: KVM here is not hardware-accelerated".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(kvm: Option<Result<(), String>>, flags: &str, pvm: bool) -> HostFacts {
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
            pvm,
            "KVM is software-based (PVM) here: guest kernels would run emulated"
        );
        assert!(
            host_verdict(&facts(None, "vmx", false))
                .unwrap_err()
                .contains("/dev/kvm")
        );
        assert!(
            host_verdict(&facts(Some(Err("denied".into())), "vmx", false))
                .unwrap_err()
                .contains("denied")
        );
        assert!(host_verdict(&facts(Some(Ok(())), "hypervisor", false)).is_err());
        assert_eq!(host_verdict(&facts(Some(Ok(())), "svm", false)), Ok("svm"));
        assert_eq!(host_verdict(&facts(Some(Ok(())), "vmx", false)), Ok("vmx"));
    }
}
