//! vCPU threads: one per vCPU, running the guest until it exits, pauses or is stopped.
//!
//! A vCPU blocked inside the hypervisor (guest `hlt`, long guest run) is kicked out with a
//! real-time signal; the run call then returns `Interrupted` and the thread looks at its
//! requested state. Kicks are repeated until the thread acknowledges, so a signal that
//! lands just before the thread enters the hypervisor is not lost.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::signal::{Killable, SIGRTMIN, register_signal_handler};

use crate::bus::IoBus;
use crate::exit::{ExitLatch, ExitReason};
use crate::hypervisor::{Vcpu, VcpuExit, VcpuSnapshot};
use crate::metrics::VcpuMetrics;

/// Errors managing vCPU threads.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot install the vCPU kick signal handler
    Signal(#[source] vmm_sys_util::errno::Error),
    /// Cannot start a vCPU thread
    Spawn(#[source] std::io::Error),
    /// vCPUs did not acknowledge the request within {0:?}
    Timeout(Duration),
    /// vCPUs must be paused before they are saved
    NotPaused,
    /// Cannot save a vCPU
    Save(#[source] crate::hypervisor::Error),
}

/// What a vCPU thread is asked to do / is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    Running,
    PauseRequested,
    Paused,
    /// Paused, and asked to save its state into `Shared::saved` (the thread owns the vCPU).
    SaveRequested,
    Stop,
}

struct Shared {
    state: Mutex<RunState>,
    cond: Condvar,
    saved: Mutex<Option<crate::hypervisor::Result<VcpuSnapshot>>>,
}

/// The signal used to kick vCPUs out of the hypervisor.
pub fn kick_signal() -> i32 {
    SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// Installs the (empty) kick handler; its only effect is to interrupt `KVM_RUN`.
pub fn install_kick_handler() -> Result<(), Error> {
    register_signal_handler(kick_signal(), on_kick).map_err(Error::Signal)
}

/// A running vCPU thread.
pub struct VcpuHandle {
    id: u8,
    join: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

/// Whether a halted vCPU means the guest is done (no interrupt controller to wake it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HaltPolicy {
    /// `hlt` exits mean power-off (tiny guests without an irqchip).
    PowerOff,
    /// `hlt` is handled in the kernel; a `Halt` exit is just a wake-up.
    Continue,
}

impl VcpuHandle {
    /// Starts the thread; the vCPU runs at once.
    pub fn spawn(
        mut vcpu: Box<dyn Vcpu>,
        io: Arc<IoBus>,
        exit: Arc<ExitLatch>,
        metrics: Arc<VcpuMetrics>,
        halt: HaltPolicy,
    ) -> Result<Self, Error> {
        let id = vcpu.id();
        let shared = Arc::new(Shared {
            state: Mutex::new(RunState::Running),
            cond: Condvar::new(),
            saved: Mutex::new(None),
        });
        let s = shared.clone();
        let join = std::thread::Builder::new()
            .name(format!("vcpu{id}"))
            .spawn(move || run_loop(vcpu.as_mut(), &io, &exit, &metrics, &s, halt))
            .map_err(Error::Spawn)?;
        Ok(VcpuHandle {
            id,
            join: Some(join),
            shared,
        })
    }

    pub fn id(&self) -> u8 {
        self.id
    }

    /// The thread's current state.
    pub fn state(&self) -> RunState {
        *lock(&self.shared.state)
    }

    fn set(&self, state: RunState) {
        let mut s = lock(&self.shared.state);
        if *s != RunState::Stop {
            *s = state;
        }
        self.shared.cond.notify_all();
    }

    fn kick(&self) {
        if let Some(j) = &self.join
            && !j.is_finished()
        {
            let _ = j.kill(kick_signal());
        }
    }

    fn finished(&self) -> bool {
        self.join.as_ref().is_none_or(|j| j.is_finished())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn run_loop(
    vcpu: &mut dyn Vcpu,
    io: &IoBus,
    exit: &ExitLatch,
    metrics: &VcpuMetrics,
    shared: &Shared,
    halt: HaltPolicy,
) {
    loop {
        {
            let mut s = lock(&shared.state);
            loop {
                match *s {
                    RunState::Stop => return,
                    RunState::Running => break,
                    RunState::SaveRequested => {
                        *lock(&shared.saved) = Some(vcpu.save_state());
                        *s = RunState::Paused;
                        shared.cond.notify_all();
                    }
                    RunState::PauseRequested | RunState::Paused => {
                        *s = RunState::Paused;
                        shared.cond.notify_all();
                        s = shared.cond.wait(s).unwrap_or_else(|e| e.into_inner());
                    }
                }
            }
        }
        if exit.get().is_some() {
            return;
        }
        let result = vcpu.run(io);
        metrics.exits.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(VcpuExit::Io) => {
                metrics.io_exits.fetch_add(1, Ordering::Relaxed);
            }
            Ok(VcpuExit::Interrupted) => {
                metrics.interrupted_exits.fetch_add(1, Ordering::Relaxed);
            }
            Ok(VcpuExit::Halt) => {
                metrics.halt_exits.fetch_add(1, Ordering::Relaxed);
                if halt == HaltPolicy::PowerOff {
                    tracing::info!(vcpu = vcpu.id(), "guest halted");
                    exit.set(ExitReason::PowerOff);
                    return;
                }
            }
            Ok(VcpuExit::Reset) => {
                tracing::info!(vcpu = vcpu.id(), "guest reset");
                exit.set(ExitReason::Reset);
                return;
            }
            Ok(VcpuExit::Shutdown) => {
                tracing::info!(vcpu = vcpu.id(), "guest powered off");
                exit.set(ExitReason::PowerOff);
                return;
            }
            Ok(VcpuExit::Failed(msg)) => {
                tracing::error!(vcpu = vcpu.id(), "vCPU failed: {msg}");
                exit.set(ExitReason::Failed);
                return;
            }
            Err(e) => {
                tracing::error!(vcpu = vcpu.id(), error = %e, "vCPU run failed");
                exit.set(ExitReason::Failed);
                return;
            }
        }
    }
}

/// All vCPU threads of a VM.
pub struct Vcpus {
    handles: Vec<VcpuHandle>,
}

const KICK_INTERVAL: Duration = Duration::from_millis(1);

impl Vcpus {
    pub fn new(handles: Vec<VcpuHandle>) -> Self {
        Vcpus { handles }
    }

    pub fn states(&self) -> Vec<RunState> {
        self.handles.iter().map(|h| h.state()).collect()
    }

    /// Pauses every vCPU and waits until all are parked (or finished).
    pub fn pause(&self, timeout: Duration) -> Result<(), Error> {
        for h in &self.handles {
            h.set(RunState::PauseRequested);
        }
        self.wait_for(timeout, |h| h.state() == RunState::Paused || h.finished())
    }

    /// Saves every paused vCPU (each on its own thread, which owns it).
    pub fn save(&self, timeout: Duration) -> Result<Vec<VcpuSnapshot>, Error> {
        if self.handles.iter().any(|h| h.state() != RunState::Paused) {
            return Err(Error::NotPaused);
        }
        for h in &self.handles {
            *lock(&h.shared.saved) = None;
            h.set(RunState::SaveRequested);
        }
        let deadline = Instant::now() + timeout;
        let mut out = Vec::with_capacity(self.handles.len());
        for h in &self.handles {
            let mut s = lock(&h.shared.state);
            while *s == RunState::SaveRequested {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::Timeout(timeout));
                }
                s = h
                    .shared
                    .cond
                    .wait_timeout(s, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            drop(s);
            match lock(&h.shared.saved).take() {
                Some(r) => out.push(r.map_err(Error::Save)?),
                None => return Err(Error::NotPaused),
            }
        }
        Ok(out)
    }

    /// Lets paused vCPUs run again.
    pub fn resume(&self) {
        for h in &self.handles {
            h.set(RunState::Running);
        }
    }

    /// Stops and joins every vCPU thread.
    pub fn stop(&mut self, timeout: Duration) -> Result<(), Error> {
        for h in &self.handles {
            let mut s = lock(&h.shared.state);
            *s = RunState::Stop;
            h.shared.cond.notify_all();
        }
        let r = self.wait_for(timeout, |h| h.finished());
        for h in &mut self.handles {
            if h.finished()
                && let Some(j) = h.join.take()
            {
                let _ = j.join();
            }
        }
        r
    }

    fn wait_for(&self, timeout: Duration, done: impl Fn(&VcpuHandle) -> bool) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            let mut all = true;
            for h in &self.handles {
                if !done(h) {
                    all = false;
                    h.kick();
                }
            }
            if all {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(Error::Timeout(timeout));
            }
            std::thread::sleep(KICK_INTERVAL);
        }
    }
}
