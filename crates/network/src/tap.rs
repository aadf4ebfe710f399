//! Creating a tap device, for whoever sets up a namespace sandbox's `eth0` (the namespace
//! backend, inside the sandbox's network namespace) and for this crate's tests. The
//! descriptor stays bound to the namespace it was created in, wherever it is used.
//!
//! A daemon restart, even `kill -9`, must not take a sandbox's network away: make the device
//! persistent ([`set_persistent`]) so that it, its addresses and its routes outlive the
//! descriptor, and after the restart call [`create`] with the same name inside the sandbox's
//! namespace to attach to it again.

#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

/// `_IOW('T', 202, int)` from `<linux/if_tun.h>`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// `_IOW('T', 203, int)` from `<linux/if_tun.h>`.
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
/// `_IOW('T', 208, unsigned int)` from `<linux/if_tun.h>`.
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
/// `_IOR('T', 210, unsigned int)` from `<linux/if_tun.h>`.
const TUNGETIFF: libc::c_ulong = 0x8004_54d2;
/// `TUN_F_CSUM`: the reader takes frames whose checksum is left partial.
const TUN_F_CSUM: libc::c_ulong = 0x01;

/// Makes the device behind `fd` outlive its last descriptor (or not, so that closing it
/// removes the device).
pub fn set_persistent(fd: &OwnedFd, persistent: bool) -> io::Result<()> {
    // SAFETY: TUNSETPERSIST takes its argument by value; `fd` is an open tun descriptor for
    // the duration of the call.
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            TUNSETPERSIST,
            libc::c_ulong::from(persistent),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Creates (or attaches to) the tap device `name` in the calling thread's network namespace,
/// in Ethernet mode without packet information and with a virtio-net header before each
/// frame (`crate::vnet`: checksums offloaded), and returns its non-blocking descriptor.
/// Attaching sets the header on a device created without it (the flag is the device's, set
/// by the last attach).
pub fn create(name: &str) -> io::Result<OwnedFd> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an interface name has 1 to 15 bytes",
        ));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")?;
    // SAFETY: `ifreq` is plain old data for which all-zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the IFF_ flags are small c_int constants of a c_short field"
    )]
    const FLAGS: libc::c_short =
        (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
    req.ifr_ifru.ifru_flags = FLAGS;
    // SAFETY: TUNSETIFF reads one `ifreq` through the pointer, which points at a live,
    // initialised `ifreq` (NUL-terminated name: it is shorter than IFNAMSIZ) for the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut req as *mut libc::ifreq) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file.into())
}

/// Whether each frame read from or written to `fd` has a virtio-net header.
pub fn has_vnet_header(fd: &OwnedFd) -> io::Result<bool> {
    // SAFETY: `ifreq` is plain old data for which all-zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    // SAFETY: TUNGETIFF writes one `ifreq` through the pointer, which points at a live
    // `ifreq` for the call; `fd` is open for the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), TUNGETIFF, &mut req as *mut libc::ifreq) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: TUNGETIFF filled the flags member of the union.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    Ok(i32::from(flags) & libc::IFF_VNET_HDR != 0)
}

/// Lets the sandbox's kernel send frames with their TCP/UDP checksum left partial (marked in
/// the virtio-net header), as to a NIC that completes it: nothing does, as nothing needs to
/// (the frames end in the stack, which does not verify them). Needs the header.
pub fn offload_checksums(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: TUNSETOFFLOAD takes its argument by value; `fd` is an open tun descriptor for
    // the duration of the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETOFFLOAD, TUN_F_CSUM) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Attaches to the persistent tap `name` again (after a daemon restart), waiting up to
/// `timeout` while it is busy: a closed descriptor keeps the device attached while a child
/// forked before the close still holds a copy, until that child's `exec` (`O_CLOEXEC`) drops
/// it. The kernel gives no event for that moment, so this retries.
pub fn attach(name: &str, timeout: std::time::Duration) -> io::Result<OwnedFd> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match create(name) {
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other,
        }
    }
}
