//! Assembles a VM from a `VmConfig`: memory, interrupt controller, devices on the buses,
//! kernel, vCPU threads and the device thread; then waits for it to end.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use vm_memory::{Bytes, GuestAddress};

use crate::boot::{self, EntryPoint};
use crate::bus::IoBus;
use crate::config::{BootMode, VmConfig};
use crate::devices::legacy::{I8042, PowerOff, Rtc};
use crate::devices::serial::{Serial, SerialOutput};
use crate::devices::virtio::VirtioDevice;
use crate::devices::virtio::block::{Block, BlockConfig};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::net::Net;
use crate::devices::virtio::rng::Rng;
use crate::devices::virtio::vsock::{Vsock, VsockConfig};
use crate::devices::{Interrupt, IrqLine};
use crate::exit::{ExitLatch, ExitReason};
use crate::hypervisor::{Hypervisor, Vm};
use crate::layout::*;
use crate::memory::{self, GuestMemory};
use crate::metrics::{DeviceMetrics, VcpuMetrics, VmmMetrics};
use crate::vcpu::{self, HaltPolicy, RunState, VcpuHandle, Vcpus};
use belljar_vmm_api::control::VmState;
use belljar_vmm_api::metrics::Metrics;

/// Errors building or running a VM.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot set up guest memory
    Memory(#[from] memory::Error),
    /// Hypervisor error
    Hypervisor(#[from] crate::hypervisor::Error),
    /// Cannot boot the kernel
    Boot(#[from] boot::Error),
    /// Cannot set up the boot vCPU
    Cpu(#[from] crate::arch::Error),
    /// Cannot place a device on the bus
    Bus(#[from] crate::bus::Error),
    /// Cannot attach a disk
    Block(#[from] crate::devices::virtio::block::Error),
    /// Cannot create the rng device
    Rng(#[from] crate::devices::virtio::rng::Error),
    /// Cannot create the vsock device
    Vsock(#[from] crate::devices::virtio::vsock::Error),
    /// Cannot create the net device
    Net(#[from] crate::devices::virtio::net::Error),
    /// Cannot start the vCPUs
    Vcpu(#[from] vcpu::Error),
    /// Cannot open serial log {0}
    SerialLog(String, #[source] std::io::Error),
    /// Cannot read raw image {0}
    RawImage(String, #[source] std::io::Error),
    /// Cannot start the device event loop: {0}
    EventLoop(String),
}

/// Lower-level knobs, for tests and benchmarks.
#[derive(Debug, Clone, Copy)]
pub struct BuildOptions {
    /// Create the in-kernel interrupt controller. Without it, `hlt` ends the VM.
    pub irqchip: bool,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions { irqchip: true }
    }
}

/// A running VM.
pub struct Vmm {
    vm: Arc<dyn Vm>,
    memory: GuestMemory,
    exit: Arc<ExitLatch>,
    metrics: Arc<VmmMetrics>,
    vcpus: Mutex<Vcpus>,
    paused: AtomicBool,
    event_stop: Arc<AtomicBool>,
    event_thread: Mutex<Option<JoinHandle<()>>>,
    started: Instant,
    /// The devices whose state a snapshot saves.
    pub(crate) devices: SavedDevices,
    /// What a restore must rebuild the same way (memory, vCPUs, devices).
    pub(crate) shape: VmShape,
    /// The kernel command line given to the guest (with virtio-mmio entries).
    pub cmdline: String,
    /// Guest physical address and IRQ of each virtio device, in creation order.
    pub virtio_devices: Vec<(String, u64, u32)>,
    /// The devices' listening sockets (vsock, net frames): the only fds besides the control
    /// socket's that the seccomp filter lets the VMM `accept` on.
    pub listener_fds: Vec<std::os::fd::RawFd>,
}

/// The stateful devices, kept for snapshots. The i8042 and the power-off port hold no state
/// worth saving (the i8042's configuration byte matters only to Linux's boot-time probe).
pub(crate) struct SavedDevices {
    pub serial: Arc<Mutex<Serial>>,
    pub transports: Vec<Arc<Mutex<MmioTransport>>>,
}

/// The parts of a VM's configuration a snapshot must be restored into unchanged: guest
/// memory, vCPUs, interrupt controller and the virtio devices in their order (the guest
/// found them at fixed addresses). Host-side paths (sockets, logs, disk files) may differ.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmShape {
    pub memory_mib: u64,
    pub vcpus: u8,
    pub irqchip: bool,
    pub devices: Vec<String>,
}

type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;

/// A VM assembled up to its vCPUs: memory, hypervisor VM, devices on the buses.
pub(crate) struct Parts {
    pub vm: Arc<dyn Vm>,
    pub mem: GuestMemory,
    pub exit: Arc<ExitLatch>,
    pub metrics: VmmMetrics,
    pub io: IoBus,
    pub devices: SavedDevices,
    pub subscribers: Vec<Subscriber>,
    pub listener_fds: Vec<std::os::fd::RawFd>,
    pub virtio_devices: Vec<(String, u64, u32)>,
    pub shape: VmShape,
    pub opts: BuildOptions,
    pub started: Instant,
}

impl Vmm {
    /// Builds the VM described by `config` and starts its vCPUs.
    pub fn start(config: &VmConfig, hv: &dyn Hypervisor) -> Result<Arc<Vmm>, Error> {
        Self::start_with(config, hv, BuildOptions::default())
    }

    /// `start` with lower-level options.
    pub fn start_with(
        config: &VmConfig,
        hv: &dyn Hypervisor,
        opts: BuildOptions,
    ) -> Result<Arc<Vmm>, Error> {
        let started = Instant::now();
        let mem = memory::create(config.memory_mib << 20)?;
        let parts = assemble(config, hv, opts, mem, started)?;
        let (entry, cmdline_text) = load_kernel(config, hv, &parts)?;
        let mut vcpu_objs = Vec::new();
        for id in 0..config.vcpus {
            let mut vcpu = parts.vm.create_vcpu(id, config.vcpus)?;
            if id == 0 {
                boot::setup_boot_cpu(&parts.mem, vcpu.as_mut(), entry, config.vcpus)?;
            }
            vcpu_objs.push(vcpu);
        }
        launch(parts, vcpu_objs, cmdline_text)
    }
    /// Whether the VMM was asked to pause (and not to resume since).
    pub(crate) fn pause_requested(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// The paused vCPUs' saved states, in vCPU order.
    pub(crate) fn save_vcpus(&self) -> Result<Vec<crate::hypervisor::VcpuSnapshot>, vcpu::Error> {
        let vcpus = self.vcpus.lock().unwrap_or_else(|e| e.into_inner());
        vcpus.save(Duration::from_secs(2))
    }

    /// The VM handle (for raising interrupts from outside devices).
    pub fn vm(&self) -> &Arc<dyn Vm> {
        &self.vm
    }

    /// Guest memory.
    pub fn memory(&self) -> &GuestMemory {
        &self.memory
    }

    /// Waits until the VM ends (or `timeout` passes).
    pub fn wait(&self, timeout: Duration) -> Option<ExitReason> {
        self.exit.wait_timeout(timeout)
    }

    /// Asks the VM to stop (as `stop` on the control socket).
    pub fn request_stop(&self) {
        self.exit.set(ExitReason::Stopped);
    }

    /// Why the VM ended, if it did.
    pub fn exit_reason(&self) -> Option<ExitReason> {
        self.exit.get()
    }

    /// Pauses all vCPUs.
    pub fn pause(&self) -> Result<(), Error> {
        let vcpus = self.vcpus.lock().unwrap_or_else(|e| e.into_inner());
        vcpus.pause(Duration::from_secs(2))?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Resumes paused vCPUs.
    pub fn resume(&self) {
        let vcpus = self.vcpus.lock().unwrap_or_else(|e| e.into_inner());
        vcpus.resume();
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Running, pausing, paused or stopped.
    pub fn state(&self) -> VmState {
        if self.exit.get().is_some() {
            return VmState::Stopped;
        }
        let vcpus = self.vcpus.lock().unwrap_or_else(|e| e.into_inner());
        let states = vcpus.states();
        if !states.is_empty() && states.iter().all(|s| *s == RunState::Paused) {
            VmState::Paused
        } else if self.paused.load(Ordering::SeqCst) {
            VmState::Pausing
        } else {
            VmState::Running
        }
    }

    /// Time since `start` was called.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Counters.
    pub fn metrics(&self) -> Metrics {
        self.metrics.snapshot(memory::total_size(&self.memory))
    }

    /// Stops vCPUs and the device thread. Call once the VM has ended (or to end it).
    pub fn shutdown(&self) {
        self.exit.set(ExitReason::Stopped);
        let mut vcpus = self.vcpus.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = vcpus.stop(Duration::from_secs(2)) {
            tracing::warn!(error = %e, "vCPUs did not stop in time");
        }
        self.event_stop.store(true, Ordering::Relaxed);
        let t = self
            .event_thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

/// Memory in place: creates the VM, the interrupt controller and every device on the buses.
pub(crate) fn assemble(
    config: &VmConfig,
    hv: &dyn Hypervisor,
    opts: BuildOptions,
    mem: GuestMemory,
    started: Instant,
) -> Result<Parts, Error> {
    // Cached now, while the VMM may still read /proc (snapshots need it under seccomp).
    let _ = crate::snapshot::host_cpu_model();
    let vm: Arc<dyn Vm> = Arc::from(hv.create_vm()?);
    vm.map_memory(&mem)?;
    if opts.irqchip {
        vm.create_irq_controller()?;
    }
    let exit = Arc::new(ExitLatch::new());
    let mut metrics = VmmMetrics::default();
    let mut io = IoBus::new(metrics.bus.clone());

    // Legacy devices.
    let serial_metrics = Arc::new(DeviceMetrics::default());
    let log = match &config.serial.log {
        Some(p) => Some(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| Error::SerialLog(p.display().to_string(), e))?,
        ),
        None => None,
    };
    let serial_irq: Arc<dyn Interrupt> = Arc::new(IrqLine::new(vm.clone(), SERIAL_IRQ));
    let serial = Arc::new(Mutex::new(Serial::new(
        serial_irq,
        SerialOutput::new(log, config.serial.echo, serial_metrics.clone()),
    )));
    io.pio
        .insert(u64::from(SERIAL_PORT), Serial::LEN, serial.clone())?;
    metrics.devices.push(("serial".into(), serial_metrics));
    io.pio.insert(
        u64::from(I8042_PORT),
        I8042::LEN,
        Arc::new(Mutex::new(I8042::new(exit.clone()))),
    )?;
    io.pio.insert(
        u64::from(RTC_PORT),
        Rtc::LEN,
        Arc::new(Mutex::new(Rtc::new())),
    )?;
    io.pio.insert(
        u64::from(POWER_OFF_PORT),
        PowerOff::LEN,
        Arc::new(Mutex::new(PowerOff::new(exit.clone()))),
    )?;

    // Virtio devices: disks first so the root disk is /dev/vda.
    let mut devices: Vec<(String, Arc<Mutex<dyn VirtioDevice>>)> = Vec::new();
    let mut subscribers: Vec<Subscriber> = Vec::new();
    let mut listener_fds = Vec::new();
    for (i, disk) in config.disks.iter().enumerate() {
        let blk = Block::new(BlockConfig {
            path: disk.path.clone(),
            read_only: disk.read_only,
            id: if disk.id.is_empty() {
                format!("disk{i}")
            } else {
                disk.id.clone()
            },
        })?;
        devices.push((format!("block{i}"), Arc::new(Mutex::new(blk))));
    }
    if let Some(v) = &config.vsock {
        let vsock = Arc::new(Mutex::new(Vsock::new(VsockConfig {
            guest_cid: v.guest_cid,
            uds_path: v.uds_path.clone(),
        })?));
        listener_fds.push(
            vsock
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .listener_fd(),
        );
        subscribers.push(vsock.clone());
        devices.push(("vsock".into(), vsock));
    }
    if let Some(n) = &config.net {
        let net = Arc::new(Mutex::new(Net::new(n)?));
        listener_fds.push(net.lock().unwrap_or_else(|e| e.into_inner()).listener_fd());
        subscribers.push(net.clone());
        devices.push(("net".into(), net));
    }
    if config.rng {
        devices.push(("rng".into(), Arc::new(Mutex::new(Rng::new()?))));
    }
    let mut virtio_devices = Vec::new();
    let mut transports = Vec::new();
    for (i, (name, dev)) in devices.into_iter().enumerate() {
        let addr = VIRTIO_MMIO_BASE + i as u64 * VIRTIO_MMIO_SIZE;
        // `VmConfig::validate` caps the devices at MAX_VIRTIO_DEVICES, which the lines allow.
        let irq = virtio_irq(i).expect("no more devices than interrupt lines");
        metrics.devices.push((
            name.clone(),
            dev.lock().unwrap_or_else(|e| e.into_inner()).metrics(),
        ));
        let line: Arc<dyn Interrupt> = Arc::new(IrqLine::new(vm.clone(), irq));
        let transport = Arc::new(Mutex::new(MmioTransport::new(mem.clone(), dev, line)));
        io.mmio.insert(addr, VIRTIO_MMIO_SIZE, transport.clone())?;
        transports.push(transport);
        virtio_devices.push((name, addr, irq));
    }
    let shape = VmShape {
        memory_mib: config.memory_mib,
        vcpus: config.vcpus,
        irqchip: opts.irqchip,
        devices: virtio_devices.iter().map(|(n, _, _)| n.clone()).collect(),
    };
    Ok(Parts {
        vm,
        mem,
        exit,
        metrics,
        io,
        devices: SavedDevices { serial, transports },
        subscribers,
        listener_fds,
        virtio_devices,
        shape,
        opts,
        started,
    })
}

/// Loads the kernel (or raw image); returns its entry and the command line given to it.
fn load_kernel(
    config: &VmConfig,
    hv: &dyn Hypervisor,
    parts: &Parts,
) -> Result<(EntryPoint, String), Error> {
    let mem = &parts.mem;
    let kernel = config
        .kernel
        .as_ref()
        .ok_or(boot::Error::Load("no kernel".into()))?;
    Ok(match config.boot {
        BootMode::Linux => {
            let entries: Vec<(u64, u32)> = parts
                .virtio_devices
                .iter()
                .map(|(_, a, i)| (*a, *i))
                .collect();
            let mut base = config.cmdline.clone();
            for extra in hv.guest_cmdline_extra() {
                if !base.split_whitespace().any(|w| w == extra) {
                    base.push(' ');
                    base.push_str(&extra);
                }
            }
            let cmdline = boot::build_cmdline(base.trim(), &entries)?;
            let text = cmdline
                .as_cstring()
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            (boot::load_kernel(mem, kernel, &cmdline)?, text)
        }
        BootMode::Raw => {
            let name = kernel.display().to_string();
            let file = std::fs::File::open(kernel).map_err(|e| Error::RawImage(name.clone(), e))?;
            let len = file
                .metadata()
                .map_err(|e| Error::RawImage(name.clone(), e))?
                .len();
            let mut code = vec![0u8; crate::conv::to_usize(len)];
            file.read_exact_at(&mut code, 0)
                .map_err(|e| Error::RawImage(name.clone(), e))?;
            mem.write_slice(&code, GuestAddress(HIMEM_START))
                .map_err(|e| Error::RawImage(name, std::io::Error::other(e.to_string())))?;
            (EntryPoint::Linux64 { entry: HIMEM_START }, String::new())
        }
    })
}

/// Starts the device thread and one thread per vCPU: the VM runs from here on.
pub(crate) fn launch(
    parts: Parts,
    vcpu_objs: Vec<Box<dyn crate::hypervisor::Vcpu>>,
    cmdline: String,
) -> Result<Arc<Vmm>, Error> {
    let Parts {
        vm,
        mem,
        exit,
        mut metrics,
        io,
        devices,
        subscribers,
        listener_fds,
        virtio_devices,
        shape,
        opts,
        started,
    } = parts;
    for _ in &vcpu_objs {
        metrics.vcpus.push(Arc::new(VcpuMetrics::default()));
    }
    let event_stop = Arc::new(AtomicBool::new(false));
    let event_thread = if subscribers.is_empty() {
        None
    } else {
        let mut manager: EventManager<Subscriber> =
            EventManager::new().map_err(|e| Error::EventLoop(format!("{e:?}")))?;
        for s in subscribers {
            manager.add_subscriber(s);
        }
        let stop = event_stop.clone();
        Some(
            std::thread::Builder::new()
                .name("devices".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Err(e) = manager.run_with_timeout(50) {
                            tracing::error!(error = ?e, "device event loop failed");
                            break;
                        }
                    }
                })
                .map_err(|e| Error::EventLoop(e.to_string()))?,
        )
    };

    vcpu::install_kick_handler()?;
    let io = Arc::new(io);
    let halt = if opts.irqchip {
        HaltPolicy::Continue
    } else {
        HaltPolicy::PowerOff
    };
    let mut handles = Vec::new();
    for (vcpu, m) in vcpu_objs.into_iter().zip(metrics.vcpus.iter()) {
        handles.push(VcpuHandle::spawn(
            vcpu,
            io.clone(),
            exit.clone(),
            m.clone(),
            halt,
        )?);
    }
    tracing::debug!(elapsed = ?started.elapsed(), "VM started");
    Ok(Arc::new(Vmm {
        vm,
        memory: mem,
        exit,
        metrics: Arc::new(metrics),
        vcpus: Mutex::new(Vcpus::new(handles)),
        paused: AtomicBool::new(false),
        event_stop,
        event_thread: Mutex::new(event_thread),
        started,
        devices,
        shape,
        cmdline,
        virtio_devices,
        listener_fds,
    }))
}
