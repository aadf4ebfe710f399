//! The daemon's monitor, driven in process so that its store use can be counted: idle running
//! sandboxes cost no database reads, an expiring sandbox still stops on time, and a sandbox
//! whose PID 1 is killed from outside is noticed as failed at once (from its pidfd, not a poll).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use belljar_api::{BackendChoice, CreateSandbox, Event, Sandbox, SandboxStatus};
use belljar_e2e::{bin_dir, cache_dir, require_image};
use belljard::events::Events;
use belljard::images::Images;
use belljard::paths::Paths;
use belljard::sandbox::backend::{BackendDriver, Backends, ExitWatch};
use belljard::sandbox::namespace::Namespace;
use belljard::sandbox::{Sandboxes, Settings};
use belljard::store::Store;
use futures::{Stream, StreamExt};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Idle sandboxes the monitor looks after while its store use is counted.
const IDLE: usize = 10;

struct Manager {
    sandboxes: Sandboxes,
    events: Arc<Events>,
    paths: Paths,
    _home: tempfile::TempDir,
}

impl Manager {
    fn new() -> Self {
        require_image("base");
        let home = tempfile::Builder::new()
            .prefix("belljar-monitor-")
            .tempdir()
            .unwrap();
        let paths = Paths::resolve(Some(home.path()), Some(&cache_dir())).unwrap();
        paths.create().unwrap();
        let store = Store::open(&paths.database()).unwrap();
        let events = Arc::new(Events::new(store.clone()));
        let backends: Vec<Box<dyn BackendDriver>> = vec![Box::new(Namespace::default())];
        let guest_images = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../guest-images");
        let images = Images::new(paths.clone(), guest_images, store.clone());
        let settings = Settings {
            agent: Some(bin_dir().join("belljar-agent")),
            memory_reserve_mib: 0,
            ..Settings::default()
        };
        let sandboxes = Sandboxes::new(
            store,
            events.clone(),
            paths.clone(),
            Backends::new(backends),
            images,
            settings,
        );
        Self {
            sandboxes,
            events,
            paths,
            _home: home,
        }
    }

    async fn create(&self, timeout_ms: Option<i64>) -> Sandbox {
        self.sandboxes
            .create(CreateSandbox {
                backend: Some(BackendChoice::Namespace),
                memory_mib: Some(64),
                vcpus: Some(1),
                timeout_ms,
                ..Default::default()
            })
            .await
            .expect("create a namespace sandbox")
    }

    /// The next change of sandbox `id` that `pred` accepts, within `deadline`.
    async fn wait_for(
        events: &mut (impl Stream<Item = Event> + Unpin),
        id: &str,
        deadline: Duration,
        pred: impl Fn(&Sandbox) -> bool,
    ) -> Sandbox {
        tokio::time::timeout(deadline, async {
            while let Some(e) = events.next().await {
                if let Event::Sandbox { sandbox, .. } = e
                    && sandbox.id == id
                    && pred(&sandbox)
                {
                    return *sandbox;
                }
            }
            panic!("the event stream ended");
        })
        .await
        .unwrap_or_else(|_| panic!("no matching change of {id} within {deadline:?}"))
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let sandboxes = self.sandboxes.clone();
        belljar_e2e::block_on(async move {
            if let Ok(list) = sandboxes.list(&Default::default()) {
                for s in list.sandboxes {
                    let _ = sandboxes.delete(&s.id).await;
                }
            }
            // A delete answers before its teardown (unmounting the disk, removing the
            // files) ends: wait for them, or the home directory's removal leaves the mounts.
            sandboxes
                .finish_teardowns(std::time::Duration::from_secs(30))
                .await;
        });
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_monitor_waits_on_events_instead_of_reading_the_store() {
    let m = Manager::new();
    let _monitor = m.sandboxes.spawn_monitor();
    let mut idle = Vec::new();
    for _ in 0..IDLE {
        idle.push(m.create(None).await);
    }

    // Idle: no reads, however long. (The window is a measurement, not a wait for an event.)
    let store = m.sandboxes.store().clone();
    let before = store.statements();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = store.statements() - before;
    assert_eq!(
        during, 0,
        "the monitor used the store {during} times in 2 s with {IDLE} idle sandboxes"
    );

    // A timeout still stops its sandbox, on time.
    let mut events = Box::pin(m.events.stream(None).unwrap());
    let short = m.create(Some(1500)).await;
    let expires_at = short.expires_at.unwrap();
    let stopped = Manager::wait_for(&mut events, &short.id, Duration::from_secs(10), |s| {
        s.status.is_final()
    })
    .await;
    assert_eq!(stopped.status, SandboxStatus::Stopped, "{stopped:?}");
    assert_eq!(stopped.status_reason.as_deref(), Some("timeout"));
    let late = stopped.stopped_at.unwrap() - expires_at;
    assert!(
        (0..3000).contains(&late),
        "stopped {late} ms after its deadline"
    );

    // PID 1 killed from outside: failed, noticed from the pidfd within a second.
    let victim = &idle[0];
    let dir = m.paths.sandbox_dir(&victim.id).join("namespace");
    let pid1 = ExitWatch::for_sandbox(&dir)
        .unwrap()
        .expect("PID 1 runs")
        .pid();
    let killed = Instant::now();
    kill(Pid::from_raw(pid1 as i32), Signal::SIGKILL).unwrap();
    let failed = Manager::wait_for(&mut events, &victim.id, Duration::from_secs(10), |s| {
        s.status.is_final()
    })
    .await;
    let noticed = killed.elapsed();
    eprintln!(
        "{IDLE} idle sandboxes: {during} store uses in 2 s; timeout stop {late} ms after the \
         deadline; PID 1 death noticed after {noticed:?}"
    );
    assert_eq!(failed.status, SandboxStatus::Failed, "{failed:?}");
    assert!(
        noticed < Duration::from_secs(1),
        "the death of PID 1 was noticed after {noticed:?}"
    );
    // The others are untouched.
    for s in &idle[1..] {
        assert_eq!(
            m.sandboxes.get(&s.id).unwrap().status,
            SandboxStatus::Running
        );
    }
}
