//! The host's own addresses, as they are when a flow is decided. A destination that is one of
//! them reaches the host's services (any bound to `0.0.0.0`), so only a policy that names it
//! allows it. The list was read again every 2 s: a guest connecting in a loop reached a service
//! on an address added to the host 101 times before the list knew it.
//!
//! Reading the list at each decision (`getifaddrs`, a netlink dump) costs tens of
//! microseconds; instead a netlink socket subscribed to address changes is looked at, without
//! waiting, before each decision. The kernel queues the notice as it adds the address, before
//! `ip addr add` returns, so a flow decided afterwards sees the new list. A notice lost to a
//! full socket (`ENOBUFS`), any other error, or no socket at all means reading the list again:
//! what is not known to be outside is not trusted.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, socket,
};

pub(crate) struct HostAddrs {
    /// Address notices of the namespace the stack was started in.
    notices: Option<OwnedFd>,
    addrs: Vec<IpAddr>,
    /// The last read failed: read again at the next decision.
    stale: bool,
}

impl HostAddrs {
    /// Subscribes, then reads the list (in that order: a change in between is noticed).
    pub fn new() -> Self {
        let notices = subscribe()
            .inspect_err(|e| {
                tracing::warn!(error = %e, "no address notices: the host's addresses are read at each connection")
            })
            .ok();
        let mut this = Self {
            notices,
            addrs: Vec::new(),
            stale: true,
        };
        this.current();
        this
    }

    /// The host's addresses now. If they cannot be read, the last ones read (and they are
    /// read again at the next call).
    pub fn current(&mut self) -> &[IpAddr] {
        if self.changed() || self.stale {
            match read() {
                Ok(addrs) => (self.addrs, self.stale) = (addrs, false),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the host's addresses");
                    self.stale = true;
                }
            }
        }
        &self.addrs
    }

    /// Whether the list may have changed since it was read; takes every notice queued.
    fn changed(&mut self) -> bool {
        let Some(fd) = &self.notices else {
            return true;
        };
        let mut buf = [0u8; 8192];
        let mut changed = false;
        loop {
            match recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
                Ok(0) => return true,
                Ok(_) => changed = true,
                Err(Errno::EAGAIN) => return changed,
                Err(Errno::EINTR) => {}
                // ENOBUFS: notices were lost. Anything else: not to be trusted either.
                Err(_) => changed = true,
            }
        }
    }
}

fn subscribe() -> nix::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )?;
    let groups = (libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups))?;
    Ok(fd)
}

/// The addresses of every interface of the calling thread's namespace.
fn read() -> nix::Result<Vec<IpAddr>> {
    let addrs = nix::ifaddrs::getifaddrs()?
        .filter_map(|a| a.address)
        .filter_map(|s| {
            s.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .collect();
    Ok(addrs)
}
