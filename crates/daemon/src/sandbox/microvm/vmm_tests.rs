//! The VMM's config and state files without a VM, and one real `belljar-vmm` launched,
//! adopted and stopped.

use super::*;

#[test]
fn the_config_wires_disks_vsock_and_the_agent() {
    let spec = VmSpec {
        vmm: "/bin/belljar-vmm".into(),
        kernel: "/k/vmlinux".into(),
        root_disk: "/img/rootfs.ext4".into(),
        state_dir: "/s".into(),
        hostname: "sbx-a".into(),
        vcpus: 2,
        memory_mib: 1024,
        disk_mib: 4096,
        agent_env: vec![("BELLJAR_OUTPUT_LIMIT".into(), "4096".into())],
        lower_disks: vec![],
        mounts: vec![],
    };
    let c = config(&spec, 42).unwrap();
    assert!(c.disks[0].read_only);
    assert_eq!(c.disks[1].path, Path::new("/s/layer.ext4"));
    assert_eq!(
        c.vsock.as_ref().unwrap().uds_path,
        Path::new("/s/vsock.sock")
    );
    assert_eq!(c.vcpus, 2);
    let cmdline = &c.cmdline;
    assert!(cmdline.contains("init=/sbin/belljar-agent BELLJAR_MODE=microvm"));
    assert!(cmdline.contains("BELLJAR_CLOCK_MS=42"));
    assert!(cmdline.ends_with(" BELLJAR_OUTPUT_LIMIT=4096"), "{cmdline}");
    // What the VMM reads back is what was meant.
    assert_eq!(VmConfig::from_json("vm.json", &c.to_json()).unwrap(), c);
}

/// Snapshot layers are read-only disks after the writable one, named for the agent in
/// the same order (topmost first).
#[test]
fn snapshot_layers_are_read_only_disks_the_agent_is_told_about() {
    let spec = VmSpec {
        vmm: "/bin/belljar-vmm".into(),
        kernel: "/k/vmlinux".into(),
        root_disk: "/img/rootfs.ext4".into(),
        state_dir: "/s".into(),
        hostname: "sbx-a".into(),
        vcpus: 1,
        memory_mib: 512,
        disk_mib: 1024,
        agent_env: vec![],
        lower_disks: vec!["/l/top.ext4".into(), "/l/bottom.ext4".into()],
        mounts: vec![],
    };
    let c = config(&spec, 1).unwrap();
    let disks: Vec<_> = c
        .disks
        .iter()
        .map(|d| (d.id.as_str(), d.path.to_str().unwrap(), d.read_only))
        .collect();
    assert_eq!(
        disks,
        [
            ("root", "/img/rootfs.ext4", true),
            ("layer", "/s/layer.ext4", false),
            ("lower0", "/l/top.ext4", true),
            ("lower1", "/l/bottom.ext4", true),
        ]
    );
    assert!(
        c.cmdline
            .ends_with(" BELLJAR_LOWER_DEVICES=/dev/vdc,/dev/vdd"),
        "{}",
        c.cmdline
    );
    assert!(
        !config(
            &VmSpec {
                lower_disks: vec![],
                mounts: vec![],
                ..spec.clone()
            },
            1
        )
        .unwrap()
        .cmdline
        .contains("BELLJAR_LOWER_DEVICES")
    );

    // Snapshot mounts: one disk each after the layer disks, named to the agent with its
    // slot and path (a space cannot cut the kernel command line).
    let c = config(
        &VmSpec {
            mounts: vec![
                VmMount {
                    slot: 2,
                    disk: "/l/m2.ext4".into(),
                    path: "/srv/my data".into(),
                },
                VmMount {
                    slot: 0,
                    disk: "/l/m0.ext4".into(),
                    path: "/m".into(),
                },
            ],
            ..spec
        },
        1,
    )
    .unwrap();
    let ids: Vec<_> = c.disks.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        ["root", "layer", "lower0", "lower1", "mount2", "mount0"]
    );
    assert!(c.disks[4..].iter().all(|d| d.read_only));
    assert!(
        c.cmdline.contains(
            " BELLJAR_LOWER_DEVICES=/dev/vdc,/dev/vdd BELLJAR_MOUNTS=2:/dev/vde:/srv/my%20data,0:/dev/vdf:/m"
        ),
        "{}",
        c.cmdline
    );
}

/// The daemon's command line had drifted from the VMM's default (it dropped the i8042
/// parameters, so every boot probed for a keyboard the VMM does not have).
#[test]
fn the_cmdline_starts_with_the_vmm_default() {
    let line = cmdline("sbx-a", 1);
    assert!(line.starts_with(DEFAULT_CMDLINE), "{line}");
    assert!(line.contains("i8042.nomux"), "{line}");
}

#[test]
fn too_many_vcpus_are_refused_not_clamped() {
    let spec = VmSpec {
        vmm: "/bin/belljar-vmm".into(),
        kernel: "/k/vmlinux".into(),
        root_disk: "/img/rootfs.ext4".into(),
        state_dir: "/s".into(),
        hostname: "sbx-a".into(),
        vcpus: 300,
        memory_mib: 1024,
        disk_mib: 4096,
        agent_env: vec![],
        lower_disks: vec![],
        mounts: vec![],
    };
    let e = config(&spec, 0).unwrap_err();
    assert!(
        e.to_string()
            .contains("vCPU count must be between 1 and 32"),
        "{e}"
    );
}

/// This test process stands in for a VMM: its usage is what the host counts for it, and
/// grows with the CPU it burns; a recorded VMM that is gone has none.
#[test]
fn usage_is_the_vmm_process_as_the_host_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let me = VmmProcess {
        pid: std::process::id(),
        start_time: start_time(std::process::id()).unwrap(),
    };
    let record = |p: &VmmProcess| {
        std::fs::write(
            dir.path().join("vmm.json"),
            serde_json::to_string(p).unwrap(),
        )
        .unwrap()
    };
    record(&me);
    let before = usage(dir.path()).unwrap().unwrap();
    let rss = before.rss_bytes.unwrap();
    assert!(rss > 1 << 20, "{before:?}");
    assert!(before.peak_rss_bytes.unwrap() >= rss, "{before:?}");
    // Burn CPU until the kernel's tick-granular count moves (a deadline, not a guess).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut spins = 0u64;
    let after = loop {
        spins = std::hint::black_box(spins.wrapping_add(1));
        if spins.is_multiple_of(1 << 20) {
            let now = usage(dir.path()).unwrap().unwrap();
            if now.cpu_usec > before.cpu_usec {
                break now;
            }
            assert!(Instant::now() < deadline, "CPU time did not grow: {now:?}");
        }
    };
    let tick_usec = 1_000_000 / rustix::param::clock_ticks_per_second();
    assert!(after.cpu_usec >= before.cpu_usec + tick_usec, "{after:?}");

    record(&VmmProcess {
        start_time: me.start_time + 1,
        ..me
    });
    assert_eq!(usage(dir.path()).unwrap(), None);
    std::fs::remove_file(dir.path().join("vmm.json")).unwrap();
    assert_eq!(usage(dir.path()).unwrap(), None);
}

#[test]
fn start_time_tells_a_live_process_from_a_gone_one() {
    let me = start_time(std::process::id()).unwrap();
    assert!(me > 0);
    assert!(start_time(u32::MAX - 1).is_none());
    let dir = tempfile::tempdir().unwrap();
    let rec = VmmProcess {
        pid: std::process::id(),
        start_time: me,
    };
    std::fs::write(
        dir.path().join("vmm.json"),
        serde_json::to_string(&rec).unwrap(),
    )
    .unwrap();
    assert_eq!(adopt(dir.path()), Some(rec.clone()));
    let stale = VmmProcess {
        start_time: me + 1,
        ..rec
    };
    std::fs::write(
        dir.path().join("vmm.json"),
        serde_json::to_string(&stale).unwrap(),
    )
    .unwrap();
    assert_eq!(adopt(dir.path()), None);
}

#[test]
fn the_layer_is_a_sparse_ext4_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("layer.ext4");
    make_layer(&p, 64).unwrap();
    let meta = std::fs::metadata(&p).unwrap();
    assert_eq!(meta.len(), 64 << 20);
    let out = Command::new("dumpe2fs").arg("-h").arg(&p).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("Filesystem magic number"));
}

/// What the real VMM test boots: `BELLJAR_VMM`, `BELLJAR_KERNEL` and `BELLJAR_ROOT_DISK`, else
/// the `belljar-vmm` built next to this test, the newest cached kernel and `base`'s root disk.
/// CI builds all three before the tests and has /dev/kvm (scripts/setup.sh), so there a
/// missing one fails the test; elsewhere the test says what is missing and is not run.
fn real_vmm_inputs() -> Option<(PathBuf, PathBuf, PathBuf)> {
    let from_env = |k: &str| std::env::var_os(k).map(PathBuf::from);
    let cache = belljar_client::paths::image_cache(from_env("BELLJAR_CACHE").as_deref()).ok()?;
    // This test runs from `target/<profile>/deps`; the binaries are in `target/<profile>`.
    let exe = std::env::current_exe().ok()?;
    let bins = exe.parent()?.parent()?;
    let vmm = from_env("BELLJAR_VMM").unwrap_or_else(|| bins.join("belljar-vmm"));
    let kernel = from_env("BELLJAR_KERNEL").or_else(|| find_kernel(&cache));
    let root_disk = from_env("BELLJAR_ROOT_DISK")
        .unwrap_or_else(|| cache.join("images/base/current/rootfs.ext4"));
    let mut missing: Vec<String> = [Path::new("/dev/kvm"), &vmm, &root_disk]
        .into_iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    match kernel {
        Some(kernel) if missing.is_empty() && kernel.exists() => {
            return Some((vmm, kernel, root_disk));
        }
        Some(kernel) if !kernel.exists() => missing.push(kernel.display().to_string()),
        Some(_) => {}
        None => missing.push(format!("a kernel in {}", cache.join("kernel").display())),
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI builds the VMM, the kernel and the base image first: missing {missing:?}"
    );
    eprintln!("not run: missing {missing:?}");
    None
}

/// Boots the real `belljar-vmm` with the real kernel and base image, then stops it. On a
/// software-KVM host the guest does not get far, but the process management is the same.
#[test]
fn launches_adopts_and_stops_a_real_vmm() {
    let Some((vmm, kernel, root_disk)) = real_vmm_inputs() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let spec = VmSpec {
        vmm,
        kernel,
        root_disk,
        state_dir: dir.path().join("vm"),
        hostname: "sbx-test".into(),
        vcpus: 1,
        memory_mib: 256,
        disk_mib: 128,
        agent_env: vec![],
        lower_disks: vec![],
        mounts: vec![],
    };
    let proc = launch(&spec, 0).unwrap();
    let log = || std::fs::read_to_string(spec.state_dir.join("vmm.log")).unwrap_or_default();
    // The VMM is up once it has bound its control socket.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !spec.state_dir.join("vmm.sock").exists() {
        assert!(Instant::now() < deadline, "no vmm.sock; vmm.log: {}", log());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        adopt(&spec.state_dir),
        Some(proc.clone()),
        "vmm.log: {}",
        log()
    );
    stop(&spec.state_dir, Duration::from_secs(3)).unwrap();
    assert_eq!(adopt(&spec.state_dir), None);
}
