//! The bench's private network: namespaces it makes and deletes, and the test internet's
//! servers (a sink, a source, an echo and a name server) behind a veth.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, ensure};
use nix::sched::{CloneFlags, setns};

use super::{ECHO_PORT, HOST_IP, SERVER_IP, SINK_PORT, SOURCE_PORT, dns};

pub(crate) fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("run ip")?;
    ensure!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A network namespace the bench made; deleted on drop.
pub(crate) struct Netns {
    pub(crate) name: String,
}

impl Netns {
    pub(crate) fn new(role: &str) -> Result<Self> {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "bjb-{role}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        ip(&["netns", "add", &name])?;
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub(crate) fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    pub(crate) fn ip(&self, args: &[&str]) -> Result<()> {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Runs `f` on a thread inside this namespace and waits for it.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        let path = self.path();
        std::thread::spawn(move || {
            let ns = std::fs::File::open(path)?;
            setns(ns, CloneFlags::CLONE_NEWNET)?;
            Ok::<_, anyhow::Error>(f())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("a thread in {} panicked", self.name))?
    }

    /// A command inside this namespace.
    pub(crate) fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Whether `dev` has an IPv4 address yet.
    pub(crate) fn has_v4(&self, dev: &str) -> bool {
        Command::new("ip")
            .args(["-n", &self.name, "-4", "-o", "addr", "show", "dev", dev])
            .output()
            .is_ok_and(|o| o.status.success() && !o.stdout.is_empty())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.name));
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// The host namespace, the server's namespace behind a veth, and the servers.
pub(crate) struct World {
    pub(crate) host: Netns,
    _server: Netns,
}

impl World {
    pub(crate) fn new(mib: usize) -> Result<Self> {
        let host = Netns::new("h")?;
        let server = Netns::new("s")?;
        ip(&[
            "link",
            "add",
            "h0",
            "netns",
            &host.name,
            "type",
            "veth",
            "peer",
            "name",
            "s0",
            "netns",
            &server.name,
        ])?;
        host.ip(&["addr", "add", &format!("{HOST_IP}/24"), "dev", "h0"])?;
        host.ip(&["link", "set", "h0", "up"])?;
        // pasta and slirp4netns leave by the default route; it stays inside the bench's link.
        host.ip(&["route", "add", "default", "via", &SERVER_IP.to_string()])?;
        // The host's resolver, for the peers' DNS forwarders (`ip netns exec` mounts it).
        let etc = format!("/etc/netns/{}", host.name);
        std::fs::create_dir_all(&etc)?;
        std::fs::write(
            format!("{etc}/resolv.conf"),
            format!("nameserver {SERVER_IP}\n"),
        )?;
        server.ip(&["addr", "add", &format!("{SERVER_IP}/24"), "dev", "s0"])?;
        server.ip(&["link", "set", "s0", "up"])?;
        let bind = |port| server.run(move || TcpListener::bind((SERVER_IP, port)));
        let sink = bind(SINK_PORT)??;
        let source = bind(SOURCE_PORT)??;
        let echo = bind(ECHO_PORT)??;
        let names = server.run(|| UdpSocket::bind((SERVER_IP, 53)))??;
        dns::serve(names, SERVER_IP);
        serve(sink, |mut c| {
            std::io::copy(&mut c, &mut std::io::sink())?;
            c.write_all(b"k")
        });
        serve(source, move |mut c| {
            let buf = vec![0x5a; 1 << 20];
            for _ in 0..mib {
                c.write_all(&buf)?;
            }
            Ok(())
        });
        serve(echo, |mut c| {
            c.set_nodelay(true)?;
            let mut buf = [0; 4096];
            loop {
                match c.read(&mut buf)? {
                    0 => return Ok(()),
                    n => c.write_all(&buf[..n])?,
                }
            }
        });
        Ok(Self {
            host,
            _server: server,
        })
    }
}

/// Serves each connection on its own thread.
pub(crate) fn serve(
    listener: TcpListener,
    f: impl Fn(TcpStream) -> std::io::Result<()> + Send + Sync + Copy + 'static,
) {
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || f(conn));
        }
    });
}
