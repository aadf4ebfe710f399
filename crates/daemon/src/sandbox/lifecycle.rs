//! Starting, listing and changing sandboxes (making them: `create`; stopping and deleting
//! them: `teardown`).

use std::time::{Duration, Instant};

use belljar_api::{
    BackendChoice, ExtendSandbox, ListSandboxesQuery, Sandbox, SandboxList, UpdateSandbox, Validate,
};

use super::backend::{BackendError, LaunchSpec};
use super::create::invalid;
use super::{SandboxError, Sandboxes, connect};

/// The longest one readiness attempt (connect, handshake, health) may take before it is
/// abandoned and retried.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(20);

impl Sandboxes {
    /// The backend a sandbox of `image` runs on when `choice` is asked for: a user's image
    /// has no microVM disk yet, so it runs in a namespace sandbox, and so do host folders
    /// and volumes (microVMs need virtio-fs, which they do not have yet).
    pub(super) fn pick_backend(
        &self,
        image: &crate::images::ResolvedImage,
        choice: BackendChoice,
        has_volumes: bool,
    ) -> Result<(&dyn super::backend::BackendDriver, String), SandboxError> {
        Ok(match (&image.oci, choice) {
            (Some(_), BackendChoice::Microvm) => {
                return Err(BackendError::Unsupported {
                    backend: "microvm",
                    what: "run a pulled or imported image (use the namespace backend)",
                }
                .into());
            }
            (Some(_), BackendChoice::Auto) => {
                let (b, _) = self.inner.backends.choose(BackendChoice::Namespace)?;
                (
                    b,
                    "pulled and imported images run on the namespace backend".to_owned(),
                )
            }
            (None, BackendChoice::Auto) if has_volumes => {
                let (b, _) = self.inner.backends.choose(BackendChoice::Namespace)?;
                (
                    b,
                    "host folders and volumes are mounted on the namespace backend".to_owned(),
                )
            }
            _ => self.inner.backends.choose(choice)?,
        })
    }

    /// Launches `sandbox`'s processes in a new state directory, on `layers` (topmost first)
    /// over the image in `image_dir`, and waits for its agent to answer.
    pub(super) async fn boot(
        &self,
        sandbox: &mut Sandbox,
        image_dir: std::path::PathBuf,
        agent: std::path::PathBuf,
        layers: Vec<std::path::PathBuf>,
    ) -> Result<belljar_agent_proto::client::AgentClient, SandboxError> {
        let state_dir = self.new_state_dir(&sandbox.id, sandbox.backend);
        let spec = LaunchSpec {
            id: sandbox.id.clone(),
            state_dir: state_dir.clone(),
            image_dir,
            agent,
            vcpus: sandbox.vcpus,
            memory_mib: sandbox.memory_mib,
            disk_mib: sandbox.disk_mib,
            agent_env: self
                .inner
                .settings
                .command_output_limit
                .map(|l| ("BELLJAR_OUTPUT_LIMIT".to_owned(), l.to_string()))
                .into_iter()
                .chain([super::network::agent_env(sandbox.backend)])
                .chain(self.ca_agent_env(&sandbox.id, sandbox.backend)?)
                .collect(),
            layers,
            mounts: self.launch_mounts(&sandbox.id)?,
            binds: self.open_binds(sandbox)?,
            durable: sandbox.lifecycle.persistent,
        };
        std::fs::create_dir_all(&state_dir)?;
        let t = Instant::now();
        let launched = self
            .blocking_backend(sandbox, move |b| b.launch(&spec))
            .await?;
        sandbox.limits = launched.limits.clone();
        let launch = t.elapsed();
        // The agent starts while the daemon attaches the network: neither waits for the other
        // (the agent configures `eth0` itself; its first packets wait in the tap's queue).
        let sandbox = &*sandbox;
        let network = async {
            self.attach_network(sandbox, &state_dir).await;
            t.elapsed() - launch
        };
        let ready = async {
            let ready = self.wait_ready(sandbox, &state_dir, &launched.agent).await;
            (ready, t.elapsed() - launch)
        };
        // The log pumps' connection, which the first command would otherwise open (a second
        // handshake in its way); its failure is only that command's to retry.
        let pumps = async {
            match self.cached_agent(sandbox, &self.inner.pump_agents).await {
                Ok(pump) => {
                    let _ = pump.health().await;
                }
                Err(e) => {
                    tracing::debug!(sandbox = %sandbox.id, error = %e, "no log pumps' connection yet")
                }
            }
        };
        let (network, (ready, agent), ()) = tokio::join!(network, ready, pumps);
        // Where a start's time goes (`BELLJAR_LOG=belljard=debug`), for profiling: `network`
        // and `ready` both count from the end of `launch`.
        tracing::debug!(sandbox = %sandbox.id, ?launch, ?network, ready = ?agent, "booted");
        ready
    }

    /// The agent binary the namespace backend bind-mounts: `BELLJAR_AGENT`, else
    /// `belljar-agent` next to this executable, else the image's own.
    pub(super) fn agent_binary(
        &self,
        image: &crate::images::ResolvedImage,
    ) -> Result<std::path::PathBuf, SandboxError> {
        let chosen = if let Some(a) = &self.inner.settings.agent {
            a.clone()
        } else if let Some(next) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.join("belljar-agent")))
            .filter(|p| p.is_file())
        {
            next
        } else {
            image.rootfs.join("sbin/belljar-agent")
        };
        if image.oci.is_none() || crate::util::is_static_elf(&chosen) {
            return Ok(chosen);
        }
        // A user's image need not have a C library (busybox, distroless, musl): its agent
        // must be the static one, which every image Belljar builds carries.
        let built = self
            .inner
            .paths
            .image_dir("base")
            .join("rootfs/sbin/belljar-agent");
        if crate::util::is_static_elf(&built) {
            return Ok(built);
        }
        Err(SandboxError::Image(
            crate::images::ImageError::NoStaticAgent(chosen),
        ))
    }

    async fn wait_ready(
        &self,
        sandbox: &Sandbox,
        dir: &std::path::Path,
        addr: &super::backend::AgentAddress,
    ) -> Result<belljar_agent_proto::client::AgentClient, SandboxError> {
        let backend = self.inner.backends.get(sandbox.backend);
        let ended = || {
            let b = backend.as_ref()?;
            (!b.alive(dir)).then(|| BackendError::Ended {
                output: output_tail(dir),
            })
        };
        let client = wait_for_agent(addr, self.inner.settings.ready_timeout, ended).await?;
        self.inner
            .agents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sandbox.id.clone(), client.clone());
        Ok(client)
    }

    /// Runs a blocking backend call for `sandbox` off the async threads.
    pub(super) async fn blocking_backend<T: Send + 'static>(
        &self,
        sandbox: &Sandbox,
        f: impl FnOnce(&dyn super::backend::BackendDriver) -> Result<T, BackendError> + Send + 'static,
    ) -> Result<T, SandboxError> {
        let this = self.clone();
        let kind = sandbox.backend;
        tokio::task::spawn_blocking(move || {
            let b = this
                .inner
                .backends
                .get(kind)
                .ok_or_else(|| BackendError::Unavailable {
                    backend: kind.into(),
                    reason: "not built into this daemon".into(),
                })?;
            f(b)
        })
        .await
        .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?
        .map_err(SandboxError::from)
    }

    /// Writes the sandbox and tells subscribers.
    pub(super) fn save(&self, sandbox: &Sandbox) -> Result<(), SandboxError> {
        self.inner.store.put_sandbox(sandbox)?;
        self.track(sandbox);
        self.emit_sandbox(sandbox.clone());
        Ok(())
    }

    pub fn list(&self, query: &ListSandboxesQuery) -> Result<SandboxList, SandboxError> {
        if query.limit == Some(0) {
            return Err(SandboxError::BadRequest("limit: must be 1..=200".into()));
        }
        let page = self
            .inner
            .store
            .list_sandboxes(query)
            .map_err(|e| match e {
                crate::store::StoreError::BadCursor => {
                    SandboxError::BadRequest("cursor: not a cursor from this daemon".into())
                }
                e => e.into(),
            })?;
        Ok(SandboxList {
            sandboxes: page
                .sandboxes
                .into_iter()
                .map(|s| self.for_client(s))
                .collect(),
            next_cursor: page.next_cursor,
        })
    }

    /// Replaces tags and/or the name.
    pub async fn update(&self, id: &str, req: UpdateSandbox) -> Result<Sandbox, SandboxError> {
        req.validate().map_err(invalid)?;
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        self.record(id)?;
        // The policy first, so that the sandbox's event carries the new one.
        if let Some(policy) = &req.network_policy {
            self.replace_network_policy(id, policy)?;
        }
        let mut s = self.record(id)?;
        if let Some(tags) = req.tags {
            s.tags = tags;
        }
        if let Some(name) = req.name {
            s.name = (!name.is_empty()).then_some(name);
        }
        self.save(&s)?;
        Ok(self.for_client(s))
    }

    /// Adds time to a running sandbox.
    pub async fn extend(&self, id: &str, req: ExtendSandbox) -> Result<Sandbox, SandboxError> {
        if req.duration_ms <= 0 {
            return Err(SandboxError::BadRequest(
                "duration_ms: must be positive".into(),
            ));
        }
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let mut s = self.running(id)?;
        let max = self.inner.settings.max_timeout_ms;
        let total = s.timeout_ms.saturating_add(req.duration_ms);
        if total > max {
            return Err(SandboxError::BadRequest(format!(
                "duration_ms: the timeout would exceed the maximum of {max} ms"
            )));
        }
        s.timeout_ms = total;
        s.expires_at = s.expires_at.map(|e| e.saturating_add(req.duration_ms));
        self.save(&s)?;
        Ok(s)
    }

    /// Stops what a start that failed left running. The start's own error is the one the
    /// caller reports; a stop that fails too is logged, since its processes or cgroups may
    /// be left behind.
    pub(super) async fn stop_failed_start(&self, s: &Sandbox) {
        let dir = self.state_dir(&s.id);
        let grace = self.inner.settings.stop_grace;
        if let Err(e) = self.blocking_backend(s, move |b| b.stop(&dir, grace)).await {
            tracing::error!(
                sandbox = %s.id,
                error = %crate::util::error_chain(&e),
                "cannot stop a sandbox whose start failed"
            );
        }
    }
}

/// The last lines a dead sandbox left, for the reason of a failed start: its console (or the
/// namespace agent's log), then, for a microVM, the VMM's own log, which says why the VM ended
/// (a reset through the i8042, a triple fault). The host writes all three (the VMM, the
/// daemon's redirect), never the guest; they are read without following a link all the same,
/// and bounded.
fn output_tail(state_dir: &std::path::Path) -> Option<String> {
    let mut tail = ["console.log", "agent.log"]
        .iter()
        .find_map(|name| file_tail(&state_dir.join(name), 15))
        .unwrap_or_default();
    if let Some(vmm) = file_tail(&state_dir.join("vmm.log"), 5) {
        tail += &format!("\nvmm.log:\n{vmm}");
    }
    (!tail.trim().is_empty()).then_some(tail)
}

/// The last `lines` lines of the file at `path` (from its last 2 KiB; never through a
/// symlink), or None when it is missing or blank.
fn file_tail(path: &std::path::Path, lines: usize) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt;
    const TAIL: u64 = 2048;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(TAIL))).ok()?;
    let mut bytes = Vec::new();
    file.take(TAIL).read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    let tail = all[all.len().saturating_sub(lines)..].join("\n");
    (!tail.trim().is_empty()).then_some(tail)
}

/// Connects to a starting sandbox's agent, retrying until it answers its health check or
/// `timeout` has passed. `ended` says, when the sandbox's process is gone, why: then no
/// agent will ever answer, and the create fails at once with that error.
async fn wait_for_agent(
    addr: &super::backend::AgentAddress,
    timeout: Duration,
    ended: impl Fn() -> Option<BackendError>,
) -> Result<belljar_agent_proto::client::AgentClient, SandboxError> {
    let deadline = Instant::now() + timeout;
    let mut delay = Duration::from_millis(2);
    let mut checked = Instant::now();
    loop {
        // Each attempt is bounded: a VMM that accepts the connection but whose guest never
        // answers the vsock handshake (a request sent before the guest's driver was up) must
        // neither hold the create past its deadline nor stop the retries.
        let left = deadline
            .saturating_duration_since(Instant::now())
            .min(ATTEMPT_TIMEOUT);
        let attempt = async {
            let client = connect(addr).await.ok()?;
            client.health().await.ok()?;
            Some(client)
        };
        if let Ok(Some(client)) = tokio::time::timeout(left, attempt).await {
            return Ok(client);
        }
        if Instant::now() > deadline {
            return Err(SandboxError::AgentTimeout(timeout));
        }
        if checked.elapsed() >= Duration::from_millis(500) {
            checked = Instant::now();
            if let Some(e) = ended() {
                return Err(SandboxError::Backend(e));
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
