//! The sandbox's network, as the agent sets it up: `eth0` gets its address, MTU and default
//! routes from the daemon's [`NetSetup`], and `/etc/resolv.conf` names the gateway's DNS. The
//! same code runs in a microVM (virtio-net) and a namespace sandbox (the backend's tap), with
//! plain ioctls so no `ip` binary is needed. In a namespace sandbox the agent holds
//! `CAP_NET_ADMIN` only for this and drops it before it serves ([`drop_net_admin`]).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};

use belljar_agent_proto::net::{INTERFACE, NetSetup};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A system call failed.
    #[error("Cannot {what}")]
    Sys {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn check(rc: impl Into<i64>, what: &'static str) -> Result<(), NetError> {
    if rc.into() < 0 {
        return Err(NetError::Sys {
            what,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// `struct rtentry` as the kernel reads it (`<linux/route.h>`); libc has it for musl only.
#[repr(C)]
struct RtEntry {
    rt_pad1: libc::c_ulong,
    rt_dst: libc::sockaddr,
    rt_gateway: libc::sockaddr,
    rt_genmask: libc::sockaddr,
    rt_flags: libc::c_ushort,
    rt_pad2: libc::c_short,
    rt_pad3: libc::c_ulong,
    rt_pad4: *mut libc::c_void,
    rt_metric: libc::c_short,
    rt_dev: *mut libc::c_char,
    rt_mtu: libc::c_ulong,
    rt_window: libc::c_ulong,
    rt_irtt: libc::c_ushort,
}

/// `struct in6_rtmsg` (`<linux/ipv6_route.h>`); libc's keeps its fields private.
#[repr(C)]
struct In6RtMsg {
    rtmsg_dst: libc::in6_addr,
    rtmsg_src: libc::in6_addr,
    rtmsg_gateway: libc::in6_addr,
    rtmsg_type: u32,
    rtmsg_dst_len: u16,
    rtmsg_src_len: u16,
    rtmsg_metric: u32,
    rtmsg_info: libc::c_ulong,
    rtmsg_flags: u32,
    rtmsg_ifindex: libc::c_int,
}

const RTF_UP: u16 = 0x1;
const RTF_GATEWAY: u16 = 0x2;

fn sock(family: AddressFamily) -> Result<OwnedFd, NetError> {
    socket(family, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None).map_err(|e| NetError::Sys {
        what: "open a socket",
        source: e.into(),
    })
}

fn ifreq() -> libc::ifreq {
    // SAFETY: `ifreq` is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(INTERFACE.bytes()) {
        *dst = src as libc::c_char;
    }
    req
}

fn sockaddr_v4(ip: Ipv4Addr) -> libc::sockaddr {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "AF_INET is 2, a c_int constant of a u16 field"
    )]
    const AF_INET: libc::sa_family_t = libc::AF_INET as libc::sa_family_t;
    let sin = libc::sockaddr_in {
        sin_family: AF_INET,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `sockaddr_in` and `sockaddr` have the same size (16 bytes) and `sockaddr` is a
    // plain byte view of it, which is how the kernel reads the ioctl arguments.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn in6(ip: Ipv6Addr) -> libc::in6_addr {
    libc::in6_addr {
        s6_addr: ip.octets(),
    }
}

/// Configures `eth0` and `/etc/resolv.conf` from `setup`.
pub fn setup(setup: &NetSetup) -> Result<(), NetError> {
    let s4 = sock(AddressFamily::Inet)?;
    let fd = s4.as_raw_fd();
    // The MAC can only change while the device is down; it is down until we bring it up.
    let mut req = ifreq();
    req.ifr_ifru.ifru_hwaddr = libc::sockaddr {
        sa_family: libc::ARPHRD_ETHER,
        sa_data: [0; 14],
    };
    // SAFETY: writing the plain-data union member we just initialised.
    unsafe {
        for (dst, src) in req.ifr_ifru.ifru_hwaddr.sa_data.iter_mut().zip(setup.mac) {
            *dst = src as libc::c_char;
        }
    }
    // SAFETY: each ioctl reads (or fills) one valid `ifreq` for the duration of the call.
    // A virtio-net device already has its MAC from the VMM and may refuse the change.
    let _ = unsafe { libc::ioctl(fd, libc::SIOCSIFHWADDR, &req) };
    let mut req = ifreq();
    req.ifr_ifru.ifru_mtu = i32::try_from(setup.mtu).unwrap_or(1500);
    // SAFETY: as above.
    let r = unsafe { libc::ioctl(fd, libc::SIOCSIFMTU, &req) };
    check(r, "set the MTU of eth0")?;
    let mut req = ifreq();
    req.ifr_ifru.ifru_addr = sockaddr_v4(setup.v4);
    // SAFETY: as above.
    let r = unsafe { libc::ioctl(fd, libc::SIOCSIFADDR, &req) };
    check(r, "address eth0")?;
    let mask = u32::MAX
        .checked_shl(32 - u32::from(setup.prefix_v4))
        .unwrap_or(0);
    let mut req = ifreq();
    req.ifr_ifru.ifru_netmask = sockaddr_v4(Ipv4Addr::from(mask));
    // SAFETY: as above.
    let r = unsafe { libc::ioctl(fd, libc::SIOCSIFNETMASK, &req) };
    check(r, "set the netmask of eth0")?;
    // Duplicate address detection would hold the IPv6 address back for a second, and again
    // whenever the tap's carrier returns after a daemon restart; nothing else is on the link.
    let _ = std::fs::write(
        format!("/proc/sys/net/ipv6/conf/{INTERFACE}/accept_dad"),
        "0",
    );
    let mut req = ifreq();
    // SAFETY: as above.
    let r = unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) };
    check(r, "read the flags of eth0")?;
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the IFF_ flags are small c_int constants of a c_short field"
    )]
    const UP: libc::c_short = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: after SIOCGIFFLAGS the flags member is the initialised one.
    unsafe { req.ifr_ifru.ifru_flags |= UP };
    // SAFETY: as above.
    let r = unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) };
    check(r, "bring eth0 up")?;
    let mut req = ifreq();
    // SAFETY: as above.
    let r = unsafe { libc::ioctl(fd, libc::SIOCGIFINDEX, &mut req) };
    check(r, "find eth0")?;
    // SAFETY: after SIOCGIFINDEX the index member is the initialised one.
    let index = unsafe { req.ifr_ifru.ifru_ifindex };

    let mut route = RtEntry {
        rt_pad1: 0,
        rt_dst: sockaddr_v4(Ipv4Addr::UNSPECIFIED),
        rt_gateway: sockaddr_v4(setup.gateway_v4),
        rt_genmask: sockaddr_v4(Ipv4Addr::UNSPECIFIED),
        rt_flags: RTF_UP | RTF_GATEWAY,
        rt_pad2: 0,
        rt_pad3: 0,
        rt_pad4: std::ptr::null_mut(),
        rt_metric: 0,
        rt_dev: std::ptr::null_mut(),
        rt_mtu: 0,
        rt_window: 0,
        rt_irtt: 0,
    };
    // SAFETY: SIOCADDRT reads one `rtentry` (our layout is the kernel's) for the call.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCADDRT, &mut route as *mut RtEntry) };
    if rc < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
        check(rc, "add the IPv4 default route")?;
    }

    // IPv6 is best effort: a kernel without it still has IPv4.
    if let Err(e) = setup_v6(setup, index) {
        tracing::warn!("IPv6 on eth0: {e}: {}", source_of(&e));
    }
    write_resolv_conf(setup)
}

fn setup_v6(setup: &NetSetup, index: libc::c_int) -> Result<(), NetError> {
    let s6 = sock(AddressFamily::Inet6)?;
    let fd = s6.as_raw_fd();
    let req = libc::in6_ifreq {
        ifr6_addr: in6(setup.v6),
        ifr6_prefixlen: u32::from(setup.prefix_v6),
        ifr6_ifindex: index,
    };
    // SAFETY: SIOCSIFADDR on an AF_INET6 socket reads one `in6_ifreq` for the call.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCSIFADDR, &req) };
    if rc < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
        check(rc, "give eth0 its IPv6 address")?;
    }
    let route = In6RtMsg {
        rtmsg_dst: in6(Ipv6Addr::UNSPECIFIED),
        rtmsg_src: in6(Ipv6Addr::UNSPECIFIED),
        rtmsg_gateway: in6(setup.gateway_v6),
        rtmsg_type: 0,
        rtmsg_dst_len: 0,
        rtmsg_src_len: 0,
        rtmsg_metric: 1,
        rtmsg_info: 0,
        rtmsg_flags: u32::from(RTF_UP | RTF_GATEWAY),
        rtmsg_ifindex: index,
    };
    // SAFETY: SIOCADDRT on an AF_INET6 socket reads one `in6_rtmsg` (our layout is the
    // kernel's) for the call.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCADDRT, &route as *const In6RtMsg) };
    if rc < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
        check(rc, "add the IPv6 default route")?;
    }
    Ok(())
}

/// Points the resolver at the gateway. A link (systemd-resolved's) is replaced by a file.
fn write_resolv_conf(setup: &NetSetup) -> Result<(), NetError> {
    let path = "/etc/resolv.conf";
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        let _ = std::fs::remove_file(path);
    }
    std::fs::write(path, format!("nameserver {}\noptions edns0\n", setup.dns)).map_err(|source| {
        NetError::Sys {
            what: "write /etc/resolv.conf",
            source,
        }
    })
}

pub fn source_of(e: &NetError) -> String {
    std::error::Error::source(e)
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// `struct __user_cap_header_struct` and `__user_cap_data_struct` (`<linux/capability.h>`).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_NET_ADMIN: u32 = 12;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Takes `CAP_NET_ADMIN` out of the bounding set and out of the agent's own sets, so neither
/// the agent nor any command it starts can change the sandbox's network again.
pub fn drop_net_admin() -> Result<(), NetError> {
    // SAFETY: PR_CAPBSET_DROP takes the capability number by value.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAPBSET_DROP,
            libc::c_ulong::from(CAP_NET_ADMIN),
            0,
            0,
            0,
        )
    };
    check(r, "drop CAP_NET_ADMIN from the bounding set")?;
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget fills one header and two data structs (version 3), all valid for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    check(rc, "read the agent's capabilities")?;
    let bit = !(1u32 << CAP_NET_ADMIN);
    data[0].effective &= bit;
    data[0].permitted &= bit;
    data[0].inheritable &= bit;
    // SAFETY: capset reads one header and two data structs, all valid for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    };
    check(rc, "drop CAP_NET_ADMIN")
}
