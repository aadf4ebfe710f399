//! Fork: a new running sandbox from another's current files, without stopping it. Underneath
//! it is a live snapshot of the source (which stays on the source's snapshot timeline, with
//! the source's snapshot expiration) and a sandbox made from that snapshot with the source's
//! configuration (its policy and exposed ports included, the ports on new host ports) and the
//! request's overrides. Its snapshot mounts come along with what the source wrote under them
//! (see `live_mounts`). It keeps the source's broker CA: the files it starts with trust that
//! one already, so nothing is written into them before its first command.
//!
//! A paused source is resumed first when it has `auto_resume`, as for any use of it; without,
//! it is forked as it stands (its processes already frozen) and stays paused, while the fork
//! runs.

use belljar_api::{CreateSandbox, CreateSnapshot, ForkSandbox, Sandbox, Source};

use super::{SandboxError, Sandboxes};

impl Sandboxes {
    /// Forks a running or paused sandbox.
    pub async fn fork(&self, id: &str, req: ForkSandbox) -> Result<Sandbox, SandboxError> {
        let source = self.get(id)?;
        // The fork exposes the same sandbox ports, each on a free host port: the source keeps
        // its own mapping, and a running copy of a server is expected to be reachable too.
        let ports: Vec<u32> = self
            .ports(id)?
            .ports
            .iter()
            .map(|p| u32::from(p.port))
            .collect();
        let started = std::time::Instant::now();
        let snapshot = self
            .snapshot(
                id,
                CreateSnapshot {
                    keep_running: Some(true),
                    expiration_ms: None,
                    path: None,
                },
            )
            .await?;
        let mounts = self.fork_mounts(&source).await?;
        let snapshotted = started.elapsed();
        let snapshot_frozen = snapshot.frozen_ms;
        let held = self.inner.store.sandbox_layers(id)?.unwrap_or_default();
        // The fork mounts the same host folders and volumes, as whoever mounted them first.
        let who = self.mount_authority(id)?;
        let forked = self
            .create_with(
                CreateSandbox {
                    template: None,
                    image: Some(source.image),
                    backend: Some(backend_choice(source.backend)),
                    vcpus: Some(source.vcpus),
                    memory_mib: Some(source.memory_mib),
                    disk_mib: Some(source.disk_mib),
                    timeout_ms: req.timeout_ms.or(Some(source.timeout_ms)),
                    env: req.env.or(Some(source.env)),
                    tags: req.tags.or(Some(source.tags)),
                    name: req.name,
                    source: Some(Source::Snapshot {
                        snapshot_id: snapshot.id,
                    }),
                    snapshot_expiration_ms: held.snapshot_expiration_ms,
                    keep_last_snapshots: held.keep_last,
                    network_policy: self.network_policy_of(id),
                    mounts: (!mounts.is_empty()).then_some(mounts),
                    volumes: source.volumes.clone(),
                    ports: (!ports.is_empty()).then_some(ports),
                    persistent: Some(source.lifecycle.persistent),
                    idle_timeout_ms: source.lifecycle.idle_timeout_ms,
                    hard_ttl_ms: source.lifecycle.hard_ttl_ms,
                    auto_resume: Some(source.lifecycle.auto_resume),
                },
                None,
                // The source's files trust its broker CA: the fork's broker signs with it.
                Some(id),
                who,
            )
            .await;
        // Where a fork's time goes (`BELLJAR_LOG=belljard=debug`): its live snapshot (the
        // frozen part is the snapshot's `frozen_ms`), then the new sandbox's create.
        tracing::debug!(sandbox = %id, ?snapshotted, frozen_ms = ?snapshot_frozen, create = ?(started.elapsed() - snapshotted), "forked");
        forked
    }
}

fn backend_choice(kind: belljar_api::Backend) -> belljar_api::BackendChoice {
    match kind {
        belljar_api::Backend::Microvm => belljar_api::BackendChoice::Microvm,
        belljar_api::Backend::Namespace => belljar_api::BackendChoice::Namespace,
    }
}
