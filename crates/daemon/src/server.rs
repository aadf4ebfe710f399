//! Starting and stopping the daemon: directories, the pid file, the store, adoption of
//! running sandboxes, then the Unix socket, the TCP listener and the Modal layer's own port
//! (gRPC; `<runtime>/modal-port`), until SIGTERM or SIGINT.
//!
//! Stopping the daemon never stops sandboxes: they keep running and are adopted at the next
//! start. Readiness: once `<runtime>/belljard.sock` exists (and `<runtime>/port` holds the TCP
//! port), the daemon answers requests.

use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::middleware;
use belljar_api::Backend as BackendKind;
use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{SignalKind, signal};

use crate::config::Config;
use crate::events::Events;
use crate::http::auth::{self, Auth};
use crate::http::{AppState, router};
use crate::images::Images;
use crate::paths::{Paths, PathsError};
use crate::sandbox::backend::{BackendDriver, Backends};
use crate::sandbox::microvm::Microvm;
use crate::sandbox::namespace::Namespace;
use crate::sandbox::{SandboxError, Sandboxes, Settings};
use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The directories could not be set up.
    #[error(transparent)]
    Paths(#[from] PathsError),
    /// The database could not be opened.
    #[error("Cannot open the database")]
    Store(#[from] StoreError),
    /// Another daemon uses this home.
    #[error("Another belljard (pid {0}) is running with this home")]
    AlreadyRunning(i32),
    /// A file or socket operation failed.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// The TCP port cannot be bound (taken, or not allowed).
    #[error("Cannot listen on 127.0.0.1:{port}: {source}")]
    Listen {
        port: u16,
        #[source]
        source: io::Error,
    },
    /// Adopting the sandboxes found at start failed.
    #[error("Cannot adopt running sandboxes")]
    Adopt(#[from] SandboxError),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ServerError {
    let what = what.into();
    move |source| ServerError::Io { what, source }
}

/// A running daemon's addresses, for tests and the binary's log line.
#[derive(Debug, Clone)]
pub struct Bound {
    pub socket: PathBuf,
    pub port: u16,
}

/// Runs the daemon until a termination signal.
pub async fn run(config: Config) -> Result<(), ServerError> {
    let paths = Paths::resolve(config.home.as_deref(), config.cache.as_deref())?;
    paths.create()?;
    let pid_file = claim_pid_file(&paths.dirs.pid_file())?;
    record_settings(&config, &paths.dirs);
    let result = serve(config, &paths).await;
    for f in [
        paths.dirs.socket(),
        paths.dirs.port_file(),
        paths.dirs.modal_port_file(),
        pid_file.path.clone(),
    ] {
        let _ = std::fs::remove_file(f);
    }
    drop(pid_file);
    result
}

async fn serve(config: Config, paths: &Paths) -> Result<(), ServerError> {
    // Before anything can tell a client that the daemon is ready, so that a SIGTERM sent right
    // after readiness is a clean stop and not a kill.
    let mut term = signal(SignalKind::terminate()).map_err(io_err("Cannot watch SIGTERM"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(io_err("Cannot watch SIGINT"))?;
    let token = auth::load_or_create_token(&paths.dirs.token_file())
        .map_err(io_err("Cannot read or create the token"))?;
    let auth = Arc::new(Auth::new(token, config.allowed_origins.clone()));
    let store = Store::open(&paths.database())?;
    let events = Arc::new(Events::new(store.clone()));
    let vmm = config
        .vmm
        .clone()
        .or_else(|| belljar_client::paths::beside_exe("belljar-vmm"));
    let kernel = config
        .kernel
        .clone()
        .or_else(|| crate::sandbox::microvm::vmm::find_kernel(&paths.cache));
    let backends: Vec<Box<dyn BackendDriver>> = vec![
        Box::new(Microvm::new(vmm, kernel).force_for_testing(config.testing_force_microvm)),
        Box::new(Namespace::default()),
    ];
    let backends = Backends::new(backends);
    tracing::info!(backend = ?backends.default, reason = %backends.default_reason, "default backend");
    let images = Images::new(paths.clone(), config.guest_images(), store.clone());
    let settings = Settings {
        default_timeout_ms: config.default_timeout,
        max_timeout_ms: config.max_timeout.max(config.default_timeout),
        memory_reserve_mib: config.memory_reserve_mib,
        memory_overcommit: config.memory_overcommit,
        agent: config.agent.clone(),
        command_output_limit: config.command_output_limit,
        squash_depth: usize::from(config.squash_depth),
        ready_timeout: std::time::Duration::from_millis(config.ready_timeout.unsigned_abs()),
        pool: config.pool.clone(),
        allow_mount_roots: config
            .allow_mount_roots
            .iter()
            .map(|r| std::fs::canonicalize(r).unwrap_or_else(|_| r.clone()))
            .collect(),
        ..Settings::default()
    };
    let sandboxes = Sandboxes::new(
        store,
        events.clone(),
        paths.clone(),
        backends,
        images.clone(),
        settings,
    );
    let stopping = sandboxes.clone();
    sandboxes.finish_deletions().await?;
    sandboxes.discard_stale_pool().await?;
    sandboxes.recover_snapshots().await?;
    sandboxes.adopt_all().await?;
    sandboxes.finish_stopping_snapshots().await?;
    let disk_pool = sandboxes
        .backends()
        .get(BackendKind::Namespace)
        .and_then(|ns| {
            crate::sandbox::namespace::start_disk_pool(
                &paths.dirs.data.join("disk-pool"),
                sandboxes.settings().default_disk_mib,
                config.disk_pool,
                ns,
            )
        });
    sandboxes.start_pool();
    sandboxes.watch_lifetimes()?;
    let monitor = sandboxes.spawn_monitor();
    let reaper = sandboxes.spawn_snapshot_reaper();
    let squasher = sandboxes.spawn_squasher();

    let pool = sandboxes.clone();
    let state = AppState {
        sandboxes,
        images,
        events,
        auth: auth.clone(),
        ui_dir: config.ui_dir(),
        dirs: paths.dirs.clone(),
        probe_exe: std::env::current_exe().map_err(io_err("Cannot find belljard's own binary"))?,
        vercel_token_lifetime: (config.testing_vercel_token_lifetime / 1000).max(1),
    };
    let tcp = listen_tcp(config.port).await?;
    let port = tcp.local_addr().map_err(io_err("No local address"))?.port();
    auth.set_port(port);
    write_private(&paths.dirs.port_file(), &format!("{port}\n"))?;
    // The Modal layer's own port (gRPC over HTTP/2), always a free one: `belljar modal` reads
    // it from its file.
    let modal = TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|source| ServerError::Listen { port: 0, source })?;
    let modal_port = modal
        .local_addr()
        .map_err(io_err("No local address"))?
        .port();
    write_private(&paths.dirs.modal_port_file(), &format!("{modal_port}\n"))?;
    let modal_layer = crate::compat::modal::Modal::new(state.clone(), modal_port);
    let socket = paths.dirs.socket();
    let _ = std::fs::remove_file(&socket);
    let unix = UnixListener::bind(&socket)
        .map_err(io_err(format!("Cannot listen on {}", socket.display())))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err("Cannot make the socket private"))?;
    tracing::info!(socket = %socket.display(), port, "belljard is ready");
    if let Err(e) = belljar_client::ready::notify_ready() {
        tracing::warn!(error = %e, "could not tell the starter that belljard is ready");
    }

    let tcp_app = auth::tcp_layers(router(state.clone()), auth);
    let unix_app = router(state).layer(middleware::from_fn(auth::unix_caller));
    // As a make-service: `axum::serve` given a bare `Router` runs `with_state` on it for every
    // connection, which copies the whole route table (each client request of the CLI and the
    // SDKs is its own connection; it was a tenth of the daemon's time under many commands).
    // The routers already have their state, so a cheap clone per connection is all they need
    // (the TCP loop in `http::tcp` clones its router the same way).
    let limits = crate::http::tcp::TcpLimits {
        header_read_timeout: std::time::Duration::from_millis(
            config.header_read_timeout.unsigned_abs(),
        ),
        max_unauthenticated: usize::from(config.max_unauthenticated_connections),
    };
    let result = tokio::select! {
        r = axum::serve(unix, unix_app.into_make_service_with_connect_info::<auth::UnixPeer>()) => {
            r.map_err(io_err("The server failed"))
        }
        never = crate::http::tcp::serve(tcp, tcp_app, limits) => match never {},
        never = crate::compat::modal::serve(modal, modal_layer, limits) => match never {},
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
    };
    pool.drain_pool().await;
    pool.finish_teardowns(std::time::Duration::from_secs(30))
        .await;
    // Its thread may be making a disk: joined off the runtime's threads.
    let _ = tokio::task::spawn_blocking(move || drop(disk_pool)).await;
    monitor.abort();
    reaper.abort();
    squasher.abort();
    // Sandboxes keep running, and with them the volumes they mount; the others' disks are
    // mounted again by the next start that needs them.
    let _ = tokio::task::spawn_blocking(move || stopping.release_idle_volumes()).await;
    tracing::info!("belljard stopped; sandboxes keep running");
    result
}

/// Writes down the settings of this start for the next one that the CLI makes
/// (`belljar_client::settings`), and logs which differ from the last start's: a daemon the CLI
/// started with another environment says so. A failure costs only that record.
fn record_settings(config: &Config, dirs: &belljar_client::Paths) {
    let path = belljar_client::settings::path(dirs);
    if let Some(before) = belljar_client::settings::DaemonSettings::load(&path) {
        let changed = config.settings.changed_since(&before);
        if !changed.is_empty() {
            tracing::warn!(
                settings = %changed.join(","),
                "settings differ from the last start's"
            );
        }
    }
    if let Err(e) = config.settings.save(&path) {
        tracing::warn!(error = %e, "cannot record the daemon's settings");
    }
}

/// The TCP listener on 127.0.0.1: the port asked for, or else the default port and, when
/// another program holds that, any free one (clients read the port file, not the default).
async fn listen_tcp(asked: Option<u16>) -> Result<TcpListener, ServerError> {
    if let Some(port) = asked {
        return TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|source| ServerError::Listen { port, source });
    }
    let default = belljar_api::routes::DEFAULT_PORT;
    match TcpListener::bind(("127.0.0.1", default)).await {
        Ok(tcp) => Ok(tcp),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            tracing::warn!(
                port = default,
                "the default port is taken; using a free one"
            );
            TcpListener::bind(("127.0.0.1", 0))
                .await
                .map_err(|source| ServerError::Listen { port: 0, source })
        }
        Err(source) => Err(ServerError::Listen {
            port: default,
            source,
        }),
    }
}

/// Writes a file readable only by the user.
fn write_private(path: &Path, text: &str) -> Result<(), ServerError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(io_err(format!("Cannot write {}", path.display())))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err(format!("Cannot write {}", path.display())))?;
    std::fs::rename(&tmp, path).map_err(io_err(format!("Cannot write {}", path.display())))
}

/// The pid file, locked for the daemon's whole life: the kernel drops the lock when the
/// process dies, even by `kill -9`, so a stale file never blocks a restart.
pub struct PidFile {
    path: PathBuf,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// How long a start waits for the pid file's lock.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Takes the pid file, refusing when another live daemon holds it.
fn claim_pid_file(path: &Path) -> Result<PidFile, ServerError> {
    use std::io::{Seek, Write};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(io_err(format!("Cannot open {}", path.display())))?;
    // A daemon that was just killed may hold the lock a moment longer (it is still exiting,
    // or a child it forked has not reached exec yet), so a restart waits a little.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    let mut file = file;
    let mut lock = loop {
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => break lock,
            Err((f, _)) if std::time::Instant::now() < deadline => {
                file = f;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(_) => {
                let pid = std::fs::read_to_string(path)
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0);
                return Err(ServerError::AlreadyRunning(pid));
            }
        }
    };
    let write = |f: &mut std::fs::File| -> io::Result<()> {
        f.set_len(0)?;
        f.rewind()?;
        writeln!(f, "{}", std::process::id())?;
        f.flush()
    };
    write(&mut lock).map_err(io_err(format!("Cannot write {}", path.display())))?;
    Ok(PidFile {
        path: path.to_path_buf(),
        _lock: lock,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_pid_file_is_taken_over_and_a_held_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("belljard.pid");
        std::fs::write(&p, "999999999\n").unwrap();
        let held = claim_pid_file(&p).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap().trim(),
            std::process::id().to_string()
        );
        assert!(
            matches!(claim_pid_file(&p), Err(ServerError::AlreadyRunning(pid)) if pid == std::process::id() as i32)
        );
        drop(held);
        claim_pid_file(&p).unwrap();
    }
}
