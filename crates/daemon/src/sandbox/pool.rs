//! The warm pool: sandboxes started ahead of demand, per image (`belljard --pool`) and per
//! template (its `pool`), so that a create that one can serve costs a handover instead of a
//! launch (mounts, cgroup, agent start, health check; a whole boot on the microVM backend).
//! A template's pooled sandboxes serve only creates from that template, which get its
//! defaults at claim like any other of its creates.
//!
//! The mechanism is backend-agnostic: a pooled sandbox is launched through the same
//! [`Sandboxes::boot`] as any other, so a pool of the microVM backend is a pool of booted VMs.
//!
//! Rules that keep users apart and the host clean:
//! - A pooled sandbox never ran a user command, is not in the store (so it is absent from
//!   list, get and events) until a create claims it, and a claimed sandbox never returns.
//! - Only what can be applied at claim differs between requests: name, tags, env (given to
//!   every command), timeout and lifecycle, and the network policy (swapped on the running
//!   stack). A request with files, a source, a snapshot, ports or other limits than the pool's
//!   is launched as usual.
//! - A pool refills in the background. A launch that admission refuses waits (backing off,
//!   and woken by a stop of the daemon or the removal of its template) and tries again; a
//!   create never waits for a pool.
//! - Removing a template drains its pool: ready sandboxes are destroyed, and launches under
//!   way are destroyed when they land.
//! - Each pooled sandbox's directory holds a [`MARKER`]. At start the daemon destroys every
//!   marked directory the store does not know (pooled sandboxes of a daemon that ended), so a
//!   `kill -9` leaks nothing; a claim writes the store before it removes the marker, and the
//!   store wins.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belljar_agent_proto::client::AgentClient;
use belljar_api::{Backend as BackendKind, CreateSandbox, LimitsReport, Sandbox};

use super::{SandboxError, Sandboxes};
use crate::util::{new_id, now_ms};

/// The file that marks a sandbox directory as the pool's (not yet claimed): empty while the
/// sandbox starts, `ready` once it waits for a claim.
pub const MARKER: &str = "pooled";

/// How long a claim waits for a pooled agent's health answer before it launches instead.
const CLAIM_HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest a claim's refill waits for the claimed sandbox's first command to end (a
/// launch is tens of milliseconds of CPU that the command the user waits for would share).
const REFILL_WAIT: Duration = Duration::from_millis(250);

/// The pool's wanted sizes, from the daemon's `--pool` (`image=N,...`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSizes(pub Vec<(String, usize)>);

impl std::str::FromStr for PoolSizes {
    type Err = String;

    /// `base=2,python3.13=1`; an empty string is no pool.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut sizes = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (image, n) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?}: expected IMAGE=N"))?;
            let n: usize = n
                .trim()
                .parse()
                .map_err(|_| format!("{item:?}: N must be a number"))?;
            if n > 64 {
                return Err(format!("{item:?}: at most 64 sandboxes per image"));
            }
            sizes.push((image.trim().to_owned(), n));
        }
        Ok(Self(sizes))
    }
}

/// The first wait of a pooled launch that admission refused, doubled up to [`ADMISSION_WAIT_MAX`].
const ADMISSION_WAIT: Duration = Duration::from_millis(500);
const ADMISSION_WAIT_MAX: Duration = Duration::from_secs(30);

/// What a pooled sandbox was launched with; a create must ask for exactly this.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Class {
    /// The template whose pool it is (`None`: the daemon's `--pool`).
    pub template: Option<String>,
    pub image: String,
    pub backend: BackendKind,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub disk_mib: u64,
}

/// A started sandbox waiting for its user.
struct Ready {
    id: String,
    limits: LimitsReport,
    agent: AgentClient,
    /// The id of the user's image it stands on: the class's name may name another since.
    image_id: Option<String>,
}

/// The pool's in-memory state: ready sandboxes and launches under way, per class.
#[derive(Default)]
pub(super) struct PoolState {
    ready: Mutex<HashMap<Class, VecDeque<Ready>>>,
    filling: Mutex<HashMap<Class, usize>>,
    /// Set when the daemon stops: launches that finish later are destroyed, not pooled.
    closed: AtomicBool,
    /// Told each time a launch ends, so that a stop can wait for those under way.
    landed: tokio::sync::Notify,
    /// Claimed sandboxes whose refill waits for their first command to end, by id.
    first_command: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
    /// The templates' pools: the class and wanted size of each template that has one.
    templates: Mutex<HashMap<String, (Class, usize)>>,
    /// Told when the daemon stops or a template goes, so that launches waiting for
    /// admission look again.
    changed: tokio::sync::Notify,
}

/// A sandbox taken from the pool for one create. Dropped unused (the create failed before
/// the sandbox was recorded), it is destroyed, never put back.
pub(super) struct Claimed {
    pub id: String,
    pub limits: LimitsReport,
    owner: Option<Sandboxes>,
}

impl Claimed {
    /// The sandbox is recorded in the store: it is the user's now. The pool is refilled once
    /// its first command has ended (or after [`REFILL_WAIT`]), so that the refill's launch
    /// does not share the CPU with the command its user is waiting for.
    pub fn keep(mut self) {
        if let Some(owner) = self.owner.take() {
            let _ = std::fs::remove_file(owner.inner.paths.sandbox_dir(&self.id).join(MARKER));
            let ended = Arc::new(tokio::sync::Notify::new());
            lock(&owner.inner.pool.first_command).insert(self.id.clone(), ended.clone());
            let id = self.id.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(REFILL_WAIT, ended.notified()).await;
                lock(&owner.inner.pool.first_command).remove(&id);
                owner.refill();
            });
        }
    }
}

impl Drop for Claimed {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            let id = self.id.clone();
            tokio::spawn(async move { owner.discard(&id).await });
            // A failed create still used up a pooled sandbox.
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Sandboxes {
    /// Every pool's class and wanted size: the daemon's `--pool`, then the templates'.
    fn wanted(&self) -> Vec<(Class, usize)> {
        let mut all: Vec<(Class, usize)> = (self.inner.settings.pool.0.iter())
            .map(|(image, n)| (self.pool_class(image), *n))
            .collect();
        all.extend(lock(&self.inner.pool.templates).values().cloned());
        all
    }

    /// The wanted size of the pool of `class` (0: no pool).
    fn pool_size(&self, class: &Class) -> usize {
        match &class.template {
            Some(t) => lock(&self.inner.pool.templates)
                .get(t)
                .filter(|(c, _)| c == class)
                .map_or(0, |(_, n)| *n),
            None => (self.inner.settings.pool.0.iter())
                .find(|(i, _)| *i == class.image)
                .map_or(0, |(_, n)| *n),
        }
    }

    fn pool_class(&self, image: &str) -> Class {
        let s = &self.inner.settings;
        Class {
            template: None,
            image: image.to_owned(),
            backend: self.inner.backends.default,
            vcpus: s.default_vcpus,
            memory_mib: s.default_memory_mib,
            disk_mib: s.default_disk_mib,
        }
    }

    /// The pool of template `name`: ready and starting sandboxes.
    pub(super) fn template_pool(&self, name: &str) -> (u32, u32) {
        // Filling, then ready, as in `fill`.
        let filling = lock(&self.inner.pool.filling);
        let ready = lock(&self.inner.pool.ready);
        let mine = |c: &&Class| c.template.as_deref() == Some(name);
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        (
            count(
                ready
                    .iter()
                    .filter(|(c, _)| mine(c))
                    .map(|(_, q)| q.len())
                    .sum(),
            ),
            count(
                filling
                    .iter()
                    .filter(|(c, _)| mine(c))
                    .map(|(_, n)| *n)
                    .sum(),
            ),
        )
    }

    /// Starts template `name`'s pool of `class` (none with `size` 0).
    pub(super) fn add_template_pool(&self, name: &str, class: Class, size: usize) {
        if size == 0 {
            return;
        }
        lock(&self.inner.pool.templates).insert(name.to_owned(), (class.clone(), size));
        self.fill(&class);
    }

    /// Removes template `name`'s pool: its ready sandboxes are destroyed now, those still
    /// starting when they land.
    pub(super) async fn drain_template_pool(&self, name: &str) {
        lock(&self.inner.pool.templates).remove(name);
        self.inner.pool.changed.notify_waiters();
        let mine: Vec<Ready> = {
            let mut ready = lock(&self.inner.pool.ready);
            let classes: Vec<Class> = (ready.keys())
                .filter(|c| c.template.as_deref() == Some(name))
                .cloned()
                .collect();
            classes
                .iter()
                .filter_map(|c| ready.remove(c))
                .flatten()
                .collect()
        };
        for ready in mine {
            self.discard(&ready.id).await;
        }
    }

    /// Pooled sandboxes ready to be claimed, over all pools.
    pub fn pool_ready(&self) -> usize {
        lock(&self.inner.pool.ready)
            .values()
            .map(VecDeque::len)
            .sum()
    }

    /// The pool's configured and current size per image, for `GET /v1/info`.
    pub fn pool_info(&self) -> Vec<belljar_api::PoolInfo> {
        // Filling, then ready, as in `fill`: the other order could deadlock with it.
        let filling = lock(&self.inner.pool.filling);
        let ready = lock(&self.inner.pool.ready);
        self.inner
            .settings
            .pool
            .0
            .iter()
            .map(|(image, n)| {
                let class = self.pool_class(image);
                let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
                belljar_api::PoolInfo {
                    image: image.clone(),
                    configured: count(*n),
                    ready: count(ready.get(&class).map_or(0, VecDeque::len)),
                    starting: count(filling.get(&class).copied().unwrap_or(0)),
                }
            })
            .collect()
    }

    /// Takes a pooled sandbox that can serve `req` (from its template's pool when it names
    /// one), if there is one and it still answers.
    pub(super) async fn claim_pooled(
        &self,
        req: &CreateSandbox,
        (image, image_id): (&str, Option<&str>),
        backend: BackendKind,
        (vcpus, memory_mib, disk_mib): (u32, u64, u64),
    ) -> Option<Claimed> {
        let servable = req.source.is_none()
            && req.mounts.as_deref().is_none_or(<[_]>::is_empty)
            && req.volumes.as_deref().is_none_or(<[_]>::is_empty)
            && req.ports.as_deref().is_none_or(<[u32]>::is_empty);
        let class = Class {
            template: req.template.clone(),
            image: image.to_owned(),
            backend,
            vcpus,
            memory_mib,
            disk_mib,
        };
        if !servable || self.pool_size(&class) == 0 {
            return None;
        }
        loop {
            let ready = lock(&self.inner.pool.ready)
                .get_mut(&class)
                .and_then(VecDeque::pop_front)?;
            let claimed = Claimed {
                id: ready.id.clone(),
                limits: ready.limits,
                owner: Some(self.clone()),
            };
            if ready.image_id.as_deref() != image_id {
                // Made before its image's name moved to another image: not what is asked.
                tracing::info!(sandbox = %ready.id, "a pooled sandbox of an image renamed since; discarded");
                drop(claimed);
                continue;
            }
            // A pooled sandbox may have ended while it waited (OOM, a host kill).
            let healthy = tokio::time::timeout(CLAIM_HEALTH_TIMEOUT, ready.agent.health()).await;
            if matches!(healthy, Ok(Ok(_))) {
                return Some(claimed);
            }
            tracing::warn!(sandbox = %ready.id, "a pooled sandbox stopped answering; discarded");
            drop(claimed);
        }
    }

    /// Starts the pools' sandboxes (at daemon start), the templates' included.
    pub fn start_pool(&self) {
        match self.inner.store.templates() {
            Ok(templates) => {
                for (spec, _) in templates.iter().filter(|(t, _)| t.pool.unwrap_or(0) > 0) {
                    match self.template_class(spec) {
                        Ok(class) => {
                            let size = spec.pool.unwrap_or(0) as usize;
                            lock(&self.inner.pool.templates)
                                .insert(spec.name.clone(), (class, size));
                        }
                        Err(e) => tracing::warn!(
                            template = %spec.name, error = %e, "cannot fill the template's pool"
                        ),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the templates"),
        }
        self.refill();
    }

    /// At a clean stop: destroys the pooled sandboxes, which have no user to outlive the
    /// daemon for (a `kill -9` leaves them to [`Sandboxes::discard_stale_pool`]).
    pub async fn drain_pool(&self) {
        self.inner.pool.closed.store(true, Ordering::SeqCst);
        self.inner.pool.changed.notify_waiters();
        // Launches under way end by themselves (and, closed, destroy what they made).
        let deadline = tokio::time::Instant::now() + self.inner.settings.ready_timeout * 2;
        loop {
            let landed = self.inner.pool.landed.notified();
            if lock(&self.inner.pool.filling).values().all(|n| *n == 0) {
                break;
            }
            if tokio::time::timeout_at(deadline, landed).await.is_err() {
                break;
            }
        }
        let all: Vec<Ready> = lock(&self.inner.pool.ready)
            .drain()
            .flat_map(|(_, q)| q)
            .collect();
        for ready in all {
            self.discard(&ready.id).await;
        }
    }

    /// Whether sandboxes of `class` are still wanted (the daemon runs, the template is there).
    fn still_wanted(&self, class: &Class) -> bool {
        !self.inner.pool.closed.load(Ordering::SeqCst) && self.pool_size(class) > 0
    }

    /// Launches `class`'s sandbox; one that admission refuses waits for room and tries
    /// again, as long as the pool is still wanted.
    async fn launch_when_admitted(&self, class: &Class) -> Result<Ready, SandboxError> {
        let mut wait = ADMISSION_WAIT;
        loop {
            match self.launch_pooled(class).await {
                Err(SandboxError::Admission(e)) if e.is_refusal() => {
                    tracing::info!(image = %class.image, template = ?class.template, error = %e,
                        "the pool waits for room");
                    let changed = self.inner.pool.changed.notified();
                    tokio::pin!(changed);
                    changed.as_mut().enable();
                    if !self.still_wanted(class) {
                        return Err(SandboxError::Admission(e));
                    }
                    let _ = tokio::time::timeout(wait, changed).await;
                    if !self.still_wanted(class) {
                        return Err(SandboxError::Admission(e));
                    }
                    wait = (wait * 2).min(ADMISSION_WAIT_MAX);
                }
                other => return other,
            }
        }
    }

    /// Launches, in the background, as many sandboxes as `class`'s pool lacks.
    fn fill(&self, class: &Class) {
        if self.inner.pool.closed.load(Ordering::SeqCst) {
            return;
        }
        let want = self.pool_size(class);
        let class = class.clone();
        let missing = {
            let mut filling = lock(&self.inner.pool.filling);
            let ready = lock(&self.inner.pool.ready)
                .get(&class)
                .map_or(0, VecDeque::len);
            let under_way = filling.entry(class.clone()).or_default();
            let missing = want.saturating_sub(ready + *under_way);
            *under_way += missing;
            missing
        };
        for _ in 0..missing {
            let this = self.clone();
            let class = class.clone();
            tokio::spawn(async move {
                let launched = this.launch_when_admitted(&class).await;
                match launched {
                    Ok(ready) if !this.still_wanted(&class) => {
                        this.discard(&ready.id).await;
                    }
                    Ok(ready) => {
                        tracing::info!(sandbox = %ready.id, image = %class.image, template = ?class.template, "pooled");
                        // Filling, then ready, as in `fill`: a sandbox is always counted once.
                        let mut filling = lock(&this.inner.pool.filling);
                        lock(&this.inner.pool.ready)
                            .entry(class.clone())
                            .or_default()
                            .push_back(ready);
                        *filling.entry(class).or_default() -= 1;
                        drop(filling);
                        this.inner.pool.landed.notify_waiters();
                        return;
                    }
                    // No retry for other failures: a failing launch would spin. The next
                    // claim tries again.
                    Err(e) => {
                        tracing::warn!(image = %class.image, error = %e, "cannot fill the pool")
                    }
                }
                *lock(&this.inner.pool.filling).entry(class).or_default() -= 1;
                this.inner.pool.landed.notify_waiters();
            });
        }
    }

    /// A command of sandbox `id` ended: a refill waiting for it goes ahead (the warm pool's,
    /// and the disk pool's when the sandbox took the last disk).
    pub(super) fn command_ended(&self, id: &str) {
        belljar_namespace::disk_pool::go_ahead(&self.new_state_dir(id, BackendKind::Namespace));
        if let Some(ended) = lock(&self.inner.pool.first_command).remove(id) {
            // A permit is kept when the refill's task does not wait yet.
            ended.notify_one();
        }
    }

    /// Refills every pool after a claim.
    fn refill(&self) {
        for (class, _) in self.wanted() {
            self.fill(&class);
        }
    }

    async fn launch_pooled(&self, class: &Class) -> Result<Ready, SandboxError> {
        let image = self.inner.images.resolve(&class.image)?;
        let agent = self.agent_binary(&image)?;
        {
            // Pooled sandboxes are not in the store, so admission counts them here.
            let _admission = self.inner.admission.lock().await;
            let pooled = (lock(&self.inner.pool.ready).iter())
                .map(|(c, q)| c.memory_mib * q.len() as u64)
                .sum();
            self.admit(class.memory_mib, pooled)?;
        }
        let id = new_id("sbx");
        self.prepare_network(&id, None, &[], None)?;
        std::fs::write(self.inner.paths.sandbox_dir(&id).join(MARKER), b"")?;
        let mut sandbox = Sandbox::pending(
            id.clone(),
            class.image.clone(),
            class.backend,
            (class.vcpus, class.memory_mib, class.disk_mib),
            now_ms(),
        );
        sandbox.image_id = image.id.clone();
        let booted = async {
            let agent = self
                .boot(&mut sandbox, image.dir.clone(), agent, Vec::new())
                .await?;
            self.install_ca(&sandbox, &agent).await?;
            // "ready" tells a reader of the data directory (tests, a curious user) that this
            // one waits for a claim; empty, it is still starting.
            std::fs::write(self.inner.paths.sandbox_dir(&id).join(MARKER), b"ready\n")?;
            Ok::<_, SandboxError>(agent)
        }
        .await;
        match booted {
            Ok(agent) => Ok(Ready {
                id,
                limits: sandbox.limits,
                agent,
                image_id: image.id.clone(),
            }),
            Err(e) => {
                self.discard(&id).await;
                Err(e)
            }
        }
    }

    /// Destroys a pooled sandbox that no user will get, and everything it held.
    async fn discard(&self, id: &str) {
        let dir = self.state_dir(id);
        let kind = backend_of_dir(&dir).unwrap_or(self.inner.backends.default);
        self.forget_agent(id);
        self.forget_network(id);
        let this = self.clone();
        let destroyed = tokio::task::spawn_blocking(move || {
            let b = this.inner.backends.get(kind).filter(|_| dir.is_dir());
            b.map(|b| b.destroy(&dir))
        })
        .await;
        if let Ok(Some(Err(e))) = destroyed {
            tracing::warn!(sandbox = %id, error = %e, "cannot destroy a pooled sandbox");
            return; // keep the marked directory: the next start tries again
        }
        let _ = tokio::fs::remove_dir_all(self.inner.paths.sandbox_dir(id)).await;
    }

    /// At start: destroys the pooled sandboxes of an earlier daemon (never claimed, so not in
    /// the store). Runs before the pool fills.
    pub async fn discard_stale_pool(&self) -> Result<(), SandboxError> {
        for (id, path) in self.marked_sandboxes(MARKER)? {
            if self.inner.store.sandbox(&id)?.is_some() {
                // Claimed just before the end: the store wins, only the marker was left.
                super::teardown::remove_marker(&path.join(MARKER));
                continue;
            }
            tracing::info!(sandbox = %id, "destroying a pooled sandbox of an earlier daemon");
            self.discard(&id).await;
        }
        Ok(())
    }
}

/// The backend whose state directory `dir` is (`<sandbox>/namespace`, `<sandbox>/microvm`).
pub(super) fn backend_of_dir(dir: &std::path::Path) -> Option<BackendKind> {
    match dir.file_name()?.to_str()? {
        "namespace" => Some(BackendKind::Namespace),
        "microvm" => Some(BackendKind::Microvm),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        let s: PoolSizes = "base=2, python3.13=1".parse().unwrap();
        assert_eq!(s.0, vec![("base".into(), 2), ("python3.13".into(), 1)]);
        assert_eq!("".parse::<PoolSizes>().unwrap().0, vec![]);
        assert!("base".parse::<PoolSizes>().is_err());
        assert!("base=x".parse::<PoolSizes>().is_err());
        assert!("base=65".parse::<PoolSizes>().is_err());
    }

    #[test]
    fn the_backend_is_read_from_the_state_dir() {
        assert_eq!(
            backend_of_dir(std::path::Path::new("/d/sbx_1/namespace")),
            Some(BackendKind::Namespace)
        );
        assert_eq!(
            backend_of_dir(std::path::Path::new("/d/sbx_1/microvm")),
            Some(BackendKind::Microvm)
        );
        assert_eq!(backend_of_dir(std::path::Path::new("/d/sbx_1/ns")), None);
    }
}
