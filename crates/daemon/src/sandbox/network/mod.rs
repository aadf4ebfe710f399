//! Each sandbox's network in the daemon: one `belljar-network` stack per running sandbox, fed
//! by the sandbox's `eth0` (namespace backend: the persistent tap the backend created in the
//! sandbox's network namespace, attached here through `setns`; microVM backend: the VMM's
//! frame socket), with its firewall, credential broker, exposed ports and flow log.
//!
//! What must outlive the daemon lives beside the sandbox's state, out of the sandbox's reach:
//! `network.json` (the policy with its secrets, the broker's CA key, the ports and their host
//! ports; mode 0600) and `flows.ndjson` (the bounded flow log). A restarted daemon attaches
//! again ([`Sandboxes::attach_network`] from adoption): the tap kept its addresses, so new
//! flows work as soon as the stack runs.
//!
//! Knobs for tests and unusual hosts, read once: `BELLJAR_DNS_SERVERS` (`addr:port,...`; the
//! host's resolver otherwise) and `BELLJAR_BROKER_CA` (a PEM file of extra roots the broker
//! trusts upstream, beside the public web's).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belljar_agent_proto::net::{NET_ENV, NetSetup};
use belljar_api as api;
use belljar_network::{Broker, Forward, Network};
use serde::{Deserialize, Serialize};

use super::{SandboxError, Sandboxes};

/// How long attaching to a sandbox's tap may wait for a descriptor that is still closing.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(5);

/// What is kept of a sandbox's network across restarts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Saved {
    policy: api::NetworkPolicy,
    #[serde(default)]
    ports: BTreeMap<u16, u16>,
    #[serde(default)]
    ca_key_pem: Option<String>,
    /// The CA's certificate as the sandbox trusts it, kept so that the same bytes are given
    /// at every start (the agent adds it to the bundle only when it is not there yet).
    #[serde(default)]
    ca_cert_pem: Option<String>,
    /// The next flow id: ids keep growing across restarts.
    #[serde(default)]
    next_flow_id: u64,
}

/// A running sandbox's network.
pub(super) struct Attached {
    network: Network,
    forwards: Mutex<BTreeMap<u16, Forward>>,
    pump: tokio::task::AbortHandle,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

/// The daemon's view of every sandbox network.
#[derive(Default)]
pub(crate) struct NetState {
    pub(super) attached: Mutex<HashMap<String, Arc<Attached>>>,
    /// Serialises writes of one sandbox's `network.json`.
    pub(super) files: Mutex<()>,
    /// Flow records of each sandbox, oldest first, as served (from disk on first use).
    pub(super) flows: Mutex<HashMap<String, std::collections::VecDeque<api::NetworkFlow>>>,
    pub(super) follow: Mutex<HashMap<String, tokio::sync::broadcast::Sender<api::NetworkFlow>>>,
}

/// The addresses the agent gives `eth0`, from the stack's fixed layout, and the MTU of the
/// backend's link.
pub fn net_setup(backend: api::Backend) -> NetSetup {
    use belljar_network::config as c;
    NetSetup {
        v4: c::GUEST_V4,
        prefix_v4: c::PREFIX_V4,
        gateway_v4: c::GATEWAY_V4,
        v6: c::GUEST_V6,
        prefix_v6: c::PREFIX_V6,
        gateway_v6: c::GATEWAY_V6,
        dns: c::GATEWAY_V4.into(),
        mtu: u32::try_from(link_mtu(backend)).unwrap_or(1500),
        mac: c::GUEST_MAC,
    }
}

/// The agent's environment entry that sets up the network.
pub fn agent_env(backend: api::Backend) -> (String, String) {
    (NET_ENV.to_owned(), net_setup(backend).to_string())
}

/// The IP MTU of a sandbox's `eth0`: a tap takes the largest frames (far fewer per byte for
/// the stack to handle); virtio-net stays at Ethernet's. A guest set up with a smaller MTU
/// than its stack (a sandbox started by an older daemon) still works: TCP keeps to the MSS
/// the guest announces.
fn link_mtu(backend: api::Backend) -> usize {
    match backend {
        api::Backend::Namespace => belljar_network::config::TAP_MTU,
        api::Backend::Microvm => belljar_network::config::MTU,
    }
}

fn dns_upstream() -> belljar_network::DnsUpstream {
    let servers: Vec<std::net::SocketAddr> = std::env::var("BELLJAR_DNS_SERVERS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    if servers.is_empty() {
        belljar_network::DnsUpstream::System
    } else {
        belljar_network::DnsUpstream::Servers(servers)
    }
}

fn broker_roots() -> Option<rustls::RootCertStore> {
    let path = std::env::var_os("BELLJAR_BROKER_CA")?;
    let pem = std::fs::read(&path).ok()?;
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    use rustls::pki_types::pem::PemObject;
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem).flatten() {
        let _ = roots.add(cert);
    }
    Some(roots)
}

/// Opens the sandbox's tap from inside its network namespace; the descriptor stays bound to
/// that namespace. Root joins it from a thread. A rootless daemon cannot (the namespace
/// belongs to the sandbox's user namespace, which a multithreaded process may not join), so
/// a child of `belljard` does and hands the tap back (`belljar_network::tap_attach`);
/// `BELLJAR_TAP_VIA_CHILD=1` takes that path as root too, so that it is tested there.
///
/// A tap its PID 1 handed over at launch comes first (`belljar_namespace::tap_handoff`),
/// unless `BELLJAR_TAP_VIA_CHILD=1` asks for the child's path.
fn open_tap(state_dir: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
    let handed = belljar_namespace::tap_handoff::take(state_dir);
    if let Some(tap) = handed
        && !child_asked()
    {
        return Ok(tap);
    }
    let running = belljar_namespace::adopt(state_dir)
        .map_err(std::io::Error::other)?
        .ok_or_else(|| std::io::Error::other("the sandbox is not running"))?;
    if via_child() {
        let exe = std::env::current_exe()?;
        return belljar_network::tap_attach::open_via_child(
            &exe,
            running.pid,
            belljar_agent_proto::net::INTERFACE,
        );
    }
    let netns = std::fs::File::open(format!("/proc/{}/ns/net", running.pid))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)?;
            belljar_network::tap::attach(belljar_agent_proto::net::INTERFACE, ATTACH_TIMEOUT)
        })
        .join()
        .map_err(|_| std::io::Error::other("the attaching thread panicked"))?
    })
}

/// Whether the tap is opened by an attaching child: always without root, or when asked.
fn via_child() -> bool {
    !nix::unistd::Uid::effective().is_root() || child_asked()
}

fn child_asked() -> bool {
    std::env::var_os("BELLJAR_TAP_VIA_CHILD").is_some_and(|v| v == "1")
}

fn url(host_port: u16) -> String {
    format!("http://127.0.0.1:{host_port}/")
}

impl Sandboxes {
    fn network_file(&self, id: &str) -> PathBuf {
        self.inner.paths.sandbox_dir(id).join("network.json")
    }

    fn load_saved(&self, id: &str) -> Saved {
        std::fs::read(self.network_file(id))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn store_saved(&self, id: &str, saved: &Saved) -> Result<(), SandboxError> {
        use std::os::unix::fs::OpenOptionsExt;
        let _guard = self
            .inner
            .network
            .files
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let path = self.network_file(id);
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&serde_json::to_vec(saved).map_err(std::io::Error::other)?)?;
        // Renamed over the old file, never synced: a reader sees the old file or the new one
        // whole, and a power cut may lose the last change, as it may the store's last
        // transactions (SQLite in WAL mode, `synchronous=NORMAL`). A sync here cost every
        // create, and every attach of a sandbox's network, an `fsync` of the data directory.
        drop(f);
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    /// Checks a new sandbox's network settings and keeps them before it starts, with a new
    /// broker CA, or the one of `ca_of` (a fork's source) when it has one: true then.
    pub(super) fn prepare_network(
        &self,
        id: &str,
        policy: Option<&api::NetworkPolicy>,
        ports: &[u32],
        ca_of: Option<&str>,
    ) -> Result<bool, SandboxError> {
        let policy = policy.cloned().unwrap_or_default();
        super::network::policy::firewall(&policy)?;
        let kept = ca_of
            .map(|source| self.load_saved(source))
            .and_then(|s| Some((s.ca_key_pem?, s.ca_cert_pem)));
        let ca_kept = kept.is_some();
        let (ca_key_pem, ca_cert_pem) = match kept {
            Some((key, Some(cert))) => (key, cert),
            Some((key, None)) => {
                let cert = Broker::from_key_pem(&key, None)
                    .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?
                    .ca_pem()
                    .to_owned();
                (key, cert)
            }
            None => {
                let broker = Broker::generate(None)
                    .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?;
                (broker.ca_key_pem(), broker.ca_pem().to_owned())
            }
        };
        let mut saved = Saved {
            policy,
            ca_key_pem: Some(ca_key_pem),
            ca_cert_pem: Some(ca_cert_pem),
            ..Saved::default()
        };
        for (i, p) in ports.iter().enumerate() {
            let port = u16::try_from(*p).ok().filter(|p| *p > 0).ok_or_else(|| {
                SandboxError::BadRequest(format!("ports[{i}]: must be 1..=65535"))
            })?;
            saved.ports.insert(port, 0);
        }
        std::fs::create_dir_all(self.inner.paths.sandbox_dir(id))?;
        self.store_saved(id, &saved)?;
        Ok(ca_kept)
    }

    /// Starts the stack of a running sandbox on its `eth0` (after launch, and again after a
    /// daemon restart), with its policy, broker, ports and flow log. Failing to attach leaves
    /// the sandbox running without network, which is logged.
    pub(super) async fn attach_network(&self, sandbox: &api::Sandbox, state_dir: &Path) {
        if let Err(e) = self.try_attach_network(sandbox, state_dir).await {
            tracing::warn!(sandbox = %sandbox.id, error = %e, "the sandbox has no network");
        }
    }

    async fn try_attach_network(
        &self,
        sandbox: &api::Sandbox,
        state_dir: &Path,
    ) -> Result<(), SandboxError> {
        let id = sandbox.id.clone();
        self.detach_network(&id);
        let mut saved = self.load_saved(&id);
        let firewall = super::network::policy::firewall(&saved.policy)?;
        let roots = broker_roots();
        let broker = match &saved.ca_key_pem {
            Some(pem) => Broker::from_key_pem(pem, roots),
            None => Broker::generate(roots),
        }
        .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?;
        if saved.ca_key_pem.is_none() {
            saved.ca_key_pem = Some(broker.ca_key_pem());
        }
        let options = belljar_network::Options {
            config: belljar_network::config::NetConfig {
                mtu: link_mtu(sandbox.backend),
                ..Default::default()
            },
            policy: firewall,
            dns: dns_upstream(),
            flow_capacity: super::network::flows::FLOWS_KEPT,
            broker: Some(Arc::new(broker)),
            limits: belljar_network::config::Limits::default(),
            // One budget for every sandbox: the process's descriptors less a reserve for the
            // API, the store and the agents.
            budget: belljar_network::Budget::process(),
        };
        let network = match sandbox.backend {
            api::Backend::Namespace => {
                let dir = state_dir.to_owned();
                let fd = tokio::task::spawn_blocking(move || open_tap(&dir))
                    .await
                    .map_err(|e| SandboxError::Io(std::io::Error::other(e)))??;
                let device = belljar_network::TapDevice::new(fd)?;
                Network::spawn(device, options)
            }
            api::Backend::Microvm => {
                let device = belljar_network::SeqpacketDevice::new(state_dir.join(NET_SOCKET));
                Network::spawn(device, options)
            }
        }
        .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?;
        // Flow ids go on from the last daemon's; leave room for what it numbered after the
        // last save.
        let id_base = saved.next_flow_id;
        saved.next_flow_id += 1 << 32;
        let pump = self.spawn_flow_pump(&id, network.flows().clone(), id_base);
        let attached = Arc::new(Attached {
            network,
            forwards: Mutex::new(BTreeMap::new()),
            pump,
        });
        // The same host port as before when it is free, else another.
        let mut ports = BTreeMap::new();
        for (port, host_port) in saved.ports.clone() {
            let forward = bind(&attached.network, port, host_port)
                .or_else(|_| bind(&attached.network, port, 0));
            match forward {
                Ok(f) => {
                    ports.insert(port, f.local_addr().port());
                    lock(&attached.forwards).insert(port, f);
                }
                Err(e) => tracing::warn!(sandbox = %id, port, error = %e, "cannot expose port"),
            }
        }
        saved.ports = ports;
        self.store_saved(&id, &saved)?;
        lock(&self.inner.network.attached).insert(id, attached);
        Ok(())
    }

    /// Stops a sandbox's stack and its ports (the sandbox stopped); followed flow logs end.
    pub(super) fn detach_network(&self, id: &str) {
        lock(&self.inner.network.attached).remove(id);
        lock(&self.inner.network.follow).remove(id);
    }

    pub(super) fn attached(&self, id: &str) -> Option<Arc<Attached>> {
        lock(&self.inner.network.attached).get(id).cloned()
    }

    /// The policy of a sandbox with its secrets (to carry into a fork).
    pub(super) fn network_policy_of(&self, id: &str) -> Option<api::NetworkPolicy> {
        Some(self.load_saved(id).policy)
    }

    /// Fills in the policy a client sees (secrets redacted).
    pub(super) fn with_network(&self, mut s: api::Sandbox) -> api::Sandbox {
        s.network_policy = Some(self.load_saved(&s.id).policy.redacted());
        s
    }

    /// Replaces a sandbox's policy; open flows it denies are cut at once.
    pub(super) fn replace_network_policy(
        &self,
        id: &str,
        policy: &api::NetworkPolicy,
    ) -> Result<(), SandboxError> {
        let mut saved = self.load_saved(id);
        let policy = policy.unredacted(&saved.policy);
        let firewall = super::network::policy::firewall(&policy)?;
        saved.policy = policy;
        self.store_saved(id, &saved)?;
        if let Some(a) = self.attached(id) {
            a.network.set_policy(firewall);
        }
        Ok(())
    }

    /// `PUT /v1/sandboxes/{id}/network/policy`: the policy replaced whole, under the sandbox's
    /// lock as `PATCH` takes it, so the two never interleave.
    pub async fn put_network_policy(
        &self,
        id: &str,
        policy: &api::NetworkPolicy,
    ) -> Result<api::NetworkInfo, SandboxError> {
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        self.get(id)?;
        self.replace_network_policy(id, policy)?;
        self.network_info(id)
    }

    /// `GET /v1/sandboxes/{id}/network`.
    pub fn network_info(&self, id: &str) -> Result<api::NetworkInfo, SandboxError> {
        self.get(id)?;
        let saved = self.load_saved(id);
        let attached = self.attached(id);
        let totals = attached
            .as_ref()
            .map(|a| a.network.flows().totals())
            .unwrap_or_default();
        let past = self.past_totals(id);
        Ok(api::NetworkInfo {
            policy: saved.policy.redacted(),
            ports: self.port_list(id, &saved),
            usage: api::NetworkUsage {
                ingress_bytes: past.ingress_bytes.max(totals.bytes_in),
                egress_bytes: past.egress_bytes.max(totals.bytes_out),
            },
            attached: attached.is_some(),
        })
    }

    /// Totals from the flow log kept across restarts.
    fn past_totals(&self, id: &str) -> api::NetworkUsage {
        let flows = self.flow_records(id);
        api::NetworkUsage {
            ingress_bytes: flows.iter().map(|f| f.bytes_in).sum(),
            egress_bytes: flows.iter().map(|f| f.bytes_out).sum(),
        }
    }

    fn port_list(&self, id: &str, saved: &Saved) -> Vec<api::Port> {
        let live: BTreeMap<u16, u16> = self
            .attached(id)
            .map(|a| {
                lock(&a.forwards)
                    .iter()
                    .map(|(p, f)| (*p, f.local_addr().port()))
                    .collect()
            })
            .unwrap_or_default();
        saved
            .ports
            .iter()
            .map(|(port, host)| {
                let host_port = live.get(port).copied().unwrap_or(*host);
                api::Port {
                    port: *port,
                    host_port,
                    url: url(host_port),
                }
            })
            .collect()
    }

    pub fn ports(&self, id: &str) -> Result<api::PortList, SandboxError> {
        self.get(id)?;
        let saved = self.load_saved(id);
        Ok(api::PortList {
            ports: self.port_list(id, &saved),
        })
    }

    /// Exposes a running sandbox's port on 127.0.0.1.
    pub async fn add_port(&self, id: &str, req: api::AddPort) -> Result<api::Port, SandboxError> {
        let bad = |field: &str, what: &str| SandboxError::BadRequest(format!("{field}: {what}"));
        let port = u16::try_from(req.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad("port", "must be 1..=65535"))?;
        let host_port = match req.host_port {
            None => 0,
            Some(h) => u16::try_from(h)
                .ok()
                .filter(|h| *h >= 1024)
                .ok_or_else(|| bad("host_port", "must be 1024..=65535"))?,
        };
        let lock_ = self.lock_for(id);
        let _guard = lock_.lock().await;
        self.running(id)?;
        let attached = self
            .attached(id)
            .ok_or_else(|| SandboxError::Conflict("The sandbox has no network".into()))?;
        let mut saved = self.load_saved(id);
        if saved.ports.contains_key(&port) {
            return Err(bad("port", "is already exposed"));
        }
        if saved.ports.len() >= api::MAX_PORTS {
            return Err(bad("port", "too many ports"));
        }
        let forward = bind(&attached.network, port, host_port).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                bad("host_port", "is taken")
            } else {
                SandboxError::Io(e)
            }
        })?;
        let host_port = forward.local_addr().port();
        lock(&attached.forwards).insert(port, forward);
        saved.ports.insert(port, host_port);
        self.store_saved(id, &saved)?;
        Ok(api::Port {
            port,
            host_port,
            url: url(host_port),
        })
    }

    /// Stops exposing a port.
    pub async fn remove_port(&self, id: &str, port: u32) -> Result<(), SandboxError> {
        let lock_ = self.lock_for(id);
        let _guard = lock_.lock().await;
        self.get(id)?;
        let mut saved = self.load_saved(id);
        let port = u16::try_from(port).unwrap_or(0);
        if saved.ports.remove(&port).is_none() {
            return Err(SandboxError::NotFound(format!("{id} port {port}")));
        }
        if let Some(a) = self.attached(id) {
            lock(&a.forwards).remove(&port);
        }
        self.store_saved(id, &saved)
    }

    /// Forgets a deleted sandbox's network state.
    pub(super) fn forget_network(&self, id: &str) {
        self.detach_network(id);
        lock(&self.inner.network.flows).remove(id);
        lock(&self.inner.network.follow).remove(id);
    }
}

/// The frame socket the VMM listens on for the daemon's stack, in the microVM's state dir.
pub const NET_SOCKET: &str = "net.sock";

fn bind(network: &Network, port: u16, host_port: u16) -> std::io::Result<Forward> {
    let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, host_port))?;
    network.forward(listener, port)
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

mod ca;
pub(super) mod flows;
pub(super) mod policy;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tap_gets_the_largest_mtu_and_virtio_net_ethernets() {
        // At 1500 on the tap, a download through the stack ran at a sixth of pasta's speed.
        let ns = net_setup(api::Backend::Namespace);
        assert_eq!(ns.mtu, 65520);
        assert!(agent_env(api::Backend::Namespace).1.contains("mtu=65520"));
        assert_eq!(net_setup(api::Backend::Microvm).mtu, 1500);
    }
}
