//! Creating a sandbox: the request checked and resolved, a pooled sandbox claimed or a
//! network prepared, the sandbox admitted and recorded, then started.

use std::time::Instant;

use belljar_api::{
    BackendChoice, CreateSandbox, Sandbox, SandboxLifecycle, SandboxStatus, Validate,
};

use super::volumes::MountAuthority;
use super::{SandboxError, Sandboxes};
use crate::store::EventBody;
use crate::util::{new_id, now_ms};

/// A create's request once checked, with what it resolved to.
struct ResolvedCreate<'a> {
    /// With the template's defaults and the source's volumes filled in.
    req: CreateSandbox,
    image_name: String,
    image: crate::images::ResolvedImage,
    backend: &'a dyn super::backend::BackendDriver,
    backend_reason: String,
    agent: std::path::PathBuf,
    /// `None` when it mounts none.
    volumes: Option<Vec<belljar_api::VolumeMount>>,
    timeout_ms: i64,
    /// vCPUs, memory and disk (MiB).
    resources: (u32, u64, u64),
}

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
    ///
    /// In four steps: the request is checked and resolved ([`Sandboxes::resolve_create`]),
    /// a pooled sandbox is claimed or a network prepared, the sandbox is admitted and
    /// recorded ([`Sandboxes::record_pending`]), and then it starts ([`Sandboxes::start_new`]).
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
        let r = self.resolve_create(req, who)?;
        let req = &r.req;

        // The warm pool's hook: a pooled sandbox (see `pool`) replaces the launch below.
        let claimed = self
            .claim_pooled(
                req,
                (&r.image_name, r.image.id.as_deref()),
                r.backend.kind(),
                r.resources,
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
        if let Some(image_id) = &r.image.id {
            self.inner.images.used(image_id);
        }
        let now = now_ms();
        let mut sandbox = Sandbox {
            name: r.req.name.clone(),
            backend_reason: r.backend_reason.clone(),
            env: r.req.env.clone().unwrap_or_default(),
            tags: r.req.tags.clone().unwrap_or_default(),
            source: r.req.source.clone(),
            timeout_ms: r.timeout_ms,
            volumes: r.volumes.clone(),
            lifecycle: SandboxLifecycle {
                persistent: req.persistent.unwrap_or(false),
                idle_timeout_ms: req.idle_timeout_ms,
                hard_ttl_ms: req.hard_ttl_ms,
                deletes_at: req.hard_ttl_ms.map(|ttl| now.saturating_add(ttl)),
                auto_resume: req.auto_resume.unwrap_or(true),
            },
            image_id: r.image.id.clone(),
            template: req.template.clone(),
            ..Sandbox::pending(
                id.clone(),
                r.image_name.clone(),
                r.backend.kind(),
                r.resources,
                now,
            )
        };
        let lock = self.lock_for(&id);
        let _guard = lock.lock().await;
        if let Some(winner) = self
            .record_pending(&sandbox, idempotency_key.as_deref(), who)
            .await?
        {
            return Ok(winner);
        }
        let from = match self.hold_layers(
            &sandbox,
            req.snapshot_expiration_ms,
            req.keep_last_snapshots.clone(),
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
        let started = match &claimed {
            Some(c) => {
                sandbox.limits = c.limits.clone();
                Ok(())
            }
            None => {
                let layers = from.map(|f| f.layers).unwrap_or_default();
                self.start_new(&mut sandbox, &r, layers, ca_kept).await
            }
        };
        if let Err(e) = started {
            tracing::warn!(sandbox = %id, error = %belljar_api::error_chain(&e), "sandbox failed to start");
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
        sandbox.expires_at = Some(now + r.timeout_ms);
        self.save(&sandbox)?;
        if let Some(c) = claimed {
            c.keep();
        }
        Ok(self.for_client(sandbox))
    }

    /// The checks and lookups of a create that change nothing: the template's defaults
    /// filled in, the API's bounds, the daemon's limits, the source, the image and its
    /// backend, the agent, the volumes the caller may mount.
    fn resolve_create(
        &self,
        req: CreateSandbox,
        who: MountAuthority,
    ) -> Result<ResolvedCreate<'_>, SandboxError> {
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
        let resources = (
            req.vcpus.unwrap_or(s.default_vcpus),
            req.memory_mib.unwrap_or(s.default_memory_mib),
            req.disk_mib.unwrap_or(s.default_disk_mib),
        );
        if let Some(source) = &req.source {
            super::source::validate(source)?;
        }
        let snapshot_image = self.snapshot_image(req.source.as_ref())?;
        if let (Some((theirs, _)), Some(asked)) = (&snapshot_image, &req.image)
            && theirs != asked
        {
            return Err(SandboxError::BadRequest(format!(
                "image: the snapshot is of image {theirs}, not {asked}"
            )));
        }
        // A snapshot's layers stand on the image it was taken on, whatever its name names now.
        let (image_name, pinned) = snapshot_image.unwrap_or_else(|| {
            let name = req.image.clone().unwrap_or_else(|| s.default_image.clone());
            (name, None)
        });
        let image = self
            .inner
            .images
            .resolve_pinned(&image_name, pinned.as_deref())?;
        let choice = req.backend.unwrap_or(BackendChoice::Auto);
        let volumes = req.volumes.clone().filter(|v| !v.is_empty());
        // Asked for by name, a microVM refuses mounts before its availability is looked at.
        if choice == BackendChoice::Microvm
            && let Some(v) = &volumes
        {
            self.check_volumes(v, belljar_api::Backend::Microvm, who)?;
        }
        let (backend, backend_reason) = self.pick_backend(&image, choice, volumes.is_some())?;
        let agent = self.agent_binary(&image)?;
        self.check_volumes(volumes.as_deref().unwrap_or_default(), backend.kind(), who)?;
        Ok(ResolvedCreate {
            req,
            image_name,
            image,
            backend,
            backend_reason,
            agent,
            volumes,
            timeout_ms,
            resources,
        })
    }

    /// Admits `sandbox` and records it (with who mounts its folders and the idempotency
    /// key). `Some(sandbox)` when a concurrent request with the same key recorded its own
    /// first: that one is the answer, and nothing of this one is kept.
    async fn record_pending(
        &self,
        sandbox: &Sandbox,
        idempotency_key: Option<&str>,
        who: MountAuthority,
    ) -> Result<Option<Sandbox>, SandboxError> {
        let _admission = self.inner.admission.lock().await;
        self.admit(sandbox.memory_mib, 0)?;
        self.save(sandbox)?;
        let id = &sandbox.id;
        if sandbox.volumes.is_some() {
            self.inner.store.set_mounts_as(id, who.uid())?;
        }
        if let Some(key) = idempotency_key
            && !self.inner.store.claim_sandbox_key(id, key)?
        {
            self.inner.store.delete_sandbox(id)?;
            self.inner
                .events
                .emit(EventBody::SandboxDeleted(id.clone()));
            let winner = self.inner.store.sandbox_by_key(key)?;
            return self.get(&winner.unwrap_or_default()).map(Some);
        }
        Ok(None)
    }

    /// Starts a recorded sandbox on `layers` (topmost first): boots it, then installs the
    /// broker's CA (unless its files trust a fork source's already) and its source.
    async fn start_new(
        &self,
        sandbox: &mut Sandbox,
        r: &ResolvedCreate<'_>,
        layers: Vec<std::path::PathBuf>,
        ca_kept: bool,
    ) -> Result<(), SandboxError> {
        let agent = self
            .boot(sandbox, r.image.dir.clone(), r.agent.clone(), layers)
            .await?;
        let t = Instant::now();
        if !ca_kept && self.install_ca(sandbox, &agent).await? {
            tracing::debug!(sandbox = %sandbox.id, took = ?t.elapsed(), "installed the broker's CA");
        }
        if let Some(source) = sandbox.source.clone() {
            super::source::install(&agent, &source, &sandbox.env).await?;
        }
        Ok(())
    }
}

/// A request out of the API's bounds, as the client's error naming the field.
pub(super) fn invalid(e: belljar_api::Invalid) -> SandboxError {
    SandboxError::BadRequest(e.to_string())
}
