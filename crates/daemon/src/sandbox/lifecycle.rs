//! Creating and changing sandboxes (stopping and deleting them: `teardown`).

use std::time::{Duration, Instant};

use belljar_api::{
    BackendChoice, CreateSandbox, ExtendSandbox, LimitsReport, ListSandboxesQuery, Sandbox,
    SandboxLifecycle, SandboxList, SandboxStatus, UpdateSandbox, Validate,
};

use super::backend::{BackendError, LaunchSpec};
use super::volumes::MountAuthority;
use super::{SandboxError, Sandboxes, connect};
use crate::store::EventBody;
use crate::util::{new_id, now_ms};

/// The longest one readiness attempt (connect, handshake, health) may take before it is
/// abandoned and retried.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(20);

impl Sandboxes {
    /// Creates a sandbox and returns it running, or the reason it could not start.
    pub async fn create(&self, req: CreateSandbox) -> Result<Sandbox, SandboxError> {
        self.create_with_key(req, None).await
    }

    /// [`Sandboxes::create`] with a client's idempotency key: when a sandbox was already
    /// created with that key, it is returned (in whatever state it is now) instead.
    pub async fn create_with_key(
        &self,
        req: CreateSandbox,
        idempotency_key: Option<String>,
    ) -> Result<Sandbox, SandboxError> {
        self.create_with(req, idempotency_key, None, MountAuthority::Tcp)
            .await
    }

    /// [`Sandboxes::create_with_key`] by a caller whose permissions decide which host
    /// folders it may mount (see `volumes`).
    pub async fn create_as(
        &self,
        req: CreateSandbox,
        idempotency_key: Option<String>,
        who: MountAuthority,
    ) -> Result<Sandbox, SandboxError> {
        self.create_with(req, idempotency_key, None, who).await
    }

    /// [`Sandboxes::create_with_key`]; `ca_of`: a fork's source, whose broker CA the new
    /// sandbox keeps (its files, the source's, trust that CA already).
    pub(super) async fn create_with(
        &self,
        req: CreateSandbox,
        idempotency_key: Option<String>,
        ca_of: Option<&str>,
        who: MountAuthority,
    ) -> Result<Sandbox, SandboxError> {
        if let Some(key) = &idempotency_key {
            if !belljar_api::valid_idempotency_key(key) {
                return Err(SandboxError::BadRequest(
                    "Idempotency-Key: must be 1 to 255 visible ASCII characters".into(),
                ));
            }
            if let Some(id) = self.inner.store.sandbox_by_key(key)? {
                return self.get(&id);
            }
        }
        // A template's defaults fill what the request leaves out.
        let req = match &req.template {
            Some(name) => self.template_spec(name)?.apply(req),
            None => req,
        };
        // The API's bounds, for every caller (the HTTP layer checked them already; the
        // compatibility layers, forks and the pool build their requests themselves).
        req.validate().map_err(invalid)?;
        let req = self.inherit_volumes(req)?;
        let s = &self.inner.settings;
        let timeout_ms = req.timeout_ms.unwrap_or(s.default_timeout_ms);
        if timeout_ms > s.max_timeout_ms {
            return Err(SandboxError::BadRequest(format!(
                "timeout_ms: exceeds the maximum of {} ms",
                s.max_timeout_ms
            )));
        }
        let vcpus = req.vcpus.unwrap_or(s.default_vcpus);
        let memory_mib = req.memory_mib.unwrap_or(s.default_memory_mib);
        let disk_mib = req.disk_mib.unwrap_or(s.default_disk_mib);
        if let Some(source) = &req.source {
            super::source::validate(source)?;
        }
        let snapshot_image = self.snapshot_image(req.source.as_ref())?;
        if let (Some(theirs), Some(asked)) = (&snapshot_image, &req.image)
            && theirs != asked
        {
            return Err(SandboxError::BadRequest(format!(
                "image: the snapshot is of image {theirs}, not {asked}"
            )));
        }
        let image_name = snapshot_image
            .or_else(|| req.image.clone())
            .unwrap_or_else(|| s.default_image.clone());
        let image = self.inner.images.resolve(&image_name)?;
        let choice = req.backend.unwrap_or(BackendChoice::Auto);
        // Asked for by name, a microVM refuses mounts before its availability is looked at.
        if choice == BackendChoice::Microvm && req.volumes.as_deref().is_some_and(|v| !v.is_empty())
        {
            self.check_volumes(
                req.volumes.as_deref().unwrap_or_default(),
                belljar_api::Backend::Microvm,
                who,
            )?;
        }
        let has_volumes = req.volumes.as_deref().is_some_and(|v| !v.is_empty());
        let (backend, backend_reason) = self.pick_backend(&image, choice, has_volumes)?;
        let agent = self.agent_binary(&image)?;
        let volumes = req.volumes.clone().filter(|v| !v.is_empty());
        self.check_volumes(volumes.as_deref().unwrap_or_default(), backend.kind(), who)?;

        // The warm pool's hook: a pooled sandbox (see `pool`) replaces the launch below.
        let claimed = self
            .claim_pooled(
                &req,
                &image_name,
                backend.kind(),
                (vcpus, memory_mib, disk_mib),
            )
            .await;
        let id = claimed
            .as_ref()
            .map_or_else(|| new_id("sbx"), |c| c.id.clone());
        let ca_kept = match (&claimed, &req.network_policy) {
            (None, policy) => self.prepare_network(
                &id,
                policy.as_ref(),
                req.ports.as_deref().unwrap_or_default(),
                ca_of,
            )?,
            (Some(_), Some(policy)) => {
                self.replace_network_policy(&id, policy)?;
                false
            }
            (Some(_), None) => false,
        };
        let now = now_ms();
        let mut sandbox = Sandbox {
            id: id.clone(),
            name: req.name,
            status: SandboxStatus::Pending,
            status_reason: None,
            image: image_name,
            backend: backend.kind(),
            backend_reason,
            vcpus,
            memory_mib,
            disk_mib,
            env: req.env.unwrap_or_default(),
            tags: req.tags.unwrap_or_default(),
            source: req.source,
            created_at: now,
            started_at: None,
            stopped_at: None,
            timeout_ms,
            expires_at: None,
            limits: LimitsReport::default(),
            network_policy: None,
            mounts: None,
            volumes,
            lifecycle: SandboxLifecycle {
                persistent: req.persistent.unwrap_or(false),
                idle_timeout_ms: req.idle_timeout_ms,
                hard_ttl_ms: req.hard_ttl_ms,
                deletes_at: req.hard_ttl_ms.map(|ttl| now.saturating_add(ttl)),
                auto_resume: req.auto_resume.unwrap_or(true),
            },
        };
        let lock = self.lock_for(&id);
        let _guard = lock.lock().await;
        {
            let _admission = self.inner.admission.lock().await;
            self.admit(memory_mib, 0)?;
            self.save(&sandbox)?;
            if sandbox.volumes.is_some() {
                self.inner.store.set_mounts_as(&id, who.uid())?;
            }
            if let Some(key) = &idempotency_key
                && !self.inner.store.claim_sandbox_key(&id, key)?
            {
                // A concurrent request with the same key recorded its sandbox first.
                self.inner.store.delete_sandbox(&id)?;
                self.inner
                    .events
                    .emit(EventBody::SandboxDeleted(id.clone()));
                let winner = self.inner.store.sandbox_by_key(key)?;
                return self.get(&winner.unwrap_or_default());
            }
        }

        let from = match self.hold_layers(
            &sandbox,
            req.snapshot_expiration_ms,
            req.keep_last_snapshots,
            req.mounts.as_deref().unwrap_or_default(),
        ) {
            Ok(from) => from,
            Err(e) => {
                // The snapshot went between the check and now: no sandbox was made.
                self.inner.store.delete_sandbox(&id)?;
                self.inner
                    .events
                    .emit(EventBody::SandboxDeleted(id.clone()));
                return Err(e);
            }
        };
        let layers = from.map(|f| f.layers).unwrap_or_default();
        let started = async {
            if let Some(c) = &claimed {
                sandbox.limits = c.limits.clone();
                return Ok(());
            }
            let agent = self
                .boot(&mut sandbox, image.dir.clone(), agent, layers)
                .await?;
            let t = Instant::now();
            if !ca_kept && self.install_ca(&sandbox, &agent).await? {
                tracing::debug!(sandbox = %id, took = ?t.elapsed(), "installed the broker's CA");
            }
            if let Some(source) = sandbox.source.clone() {
                super::source::install(&agent, &source, &sandbox.env).await?;
            }
            Ok::<_, SandboxError>(())
        }
        .await;
        if let Err(e) = started {
            tracing::warn!(sandbox = %id, error = %e, "sandbox failed to start");
            self.stop_failed_start(&sandbox).await;
            self.forget_agent(&id);
            self.detach_network(&id);
            sandbox.status = SandboxStatus::Failed;
            sandbox.status_reason = Some(match &e {
                SandboxError::Backend(b) => crate::util::error_chain(b),
                e => e.to_string(),
            });
            sandbox.stopped_at = Some(now_ms());
            self.save(&sandbox)?;
            return Err(e);
        }
        let now = now_ms();
        sandbox.status = SandboxStatus::Running;
        sandbox.started_at = Some(now);
        sandbox.expires_at = Some(now + timeout_ms);
        self.save(&sandbox)?;
        if let Some(c) = claimed {
            c.keep();
        }
        Ok(self.for_client(sandbox))
    }

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

/// A request out of the API's bounds, as the client's error naming the field.
fn invalid(e: belljar_api::Invalid) -> SandboxError {
    SandboxError::BadRequest(e.to_string())
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
