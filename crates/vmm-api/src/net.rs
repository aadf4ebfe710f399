//! The guest's network: the virtio-net device's settings and the **frame socket** that
//! carries its Ethernet frames between `belljar-vmm` and the daemon's userspace network
//! stack. The VMM opens no network socket of its own; this Unix socket is the guest's wire.
//!
//! # The frame socket
//!
//! - **Who listens.** The VMM binds a `SOCK_SEQPACKET` Unix socket at [`NetConfig::socket`]
//!   while it starts, before its seccomp filter is installed (a stale socket file at that
//!   path is replaced). The daemon connects to it.
//! - **One peer at a time.** The VMM accepts whenever someone connects; a newly accepted peer
//!   replaces the old one, whose connection is closed. So a restarted (even `kill -9`ed)
//!   daemon simply connects again and frames flow on; the guest sees at worst lost frames.
//! - **Framing.** One packet is one Ethernet frame: destination MAC, source MAC, EtherType,
//!   payload; no virtio-net header, no length prefix, no FCS. A frame is at least
//!   [`ETHERNET_HEADER_LEN`] (14) bytes and at most [`NetConfig::max_frame_len`]
//!   (`mtu + 14`) bytes; zero-length packets are never sent (on `SOCK_SEQPACKET` a
//!   zero-length read means the peer hung up).
//! - **Guest → daemon.** Each frame the guest transmits is sent as one packet. While no
//!   peer is connected, frames are dropped, as on an unplugged cable. While the peer does
//!   not read and the socket buffer is full, the VMM stops taking frames from the guest's
//!   transmit queue (back-pressure, no loss) until the socket drains.
//! - **Daemon → guest.** Each packet the VMM reads is one frame for the guest, copied into
//!   the guest's next receive buffer. A packet shorter than 14 bytes or longer than
//!   `mtu + 14` is dropped and counted as an error in the device's metrics. While the guest
//!   has posted no receive buffers, the VMM stops reading (the daemon sees a full socket).
//! - **Addresses.** [`NetConfig::mac`] is the guest's MAC (the device reports it to the
//!   guest driver); [`NetConfig::mtu`] is the IP MTU the device reports and the largest
//!   payload either side may put in a frame. IP configuration (address, gateway, DNS) is
//!   not the VMM's business: the daemon's stack and the guest agent agree on it.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Destination and source MAC plus EtherType.
pub const ETHERNET_HEADER_LEN: usize = 14;
/// The MTU unless the config says otherwise (Ethernet's).
pub const DEFAULT_MTU: u16 = 1500;
/// Smallest MTU (IPv4's minimum datagram every link must carry).
pub const MIN_MTU: u16 = 68;
/// Largest MTU: a frame (`mtu + 14`) must fit a 64 KiB buffer.
#[expect(clippy::cast_possible_truncation, reason = "the header is 14 bytes")]
pub const MAX_MTU: u16 = 65535 - ETHERNET_HEADER_LEN as u16;

/// Errors in the network settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// MTU must be between 68 and 65521 (got {0})
    Mtu(u16),
    /// MAC address {0} is not a unicast address
    NotUnicast(MacAddr),
    /// Invalid MAC address {0:?}: expected six hex pairs like 02:00:00:00:00:01
    MacSyntax(String),
}

/// A MAC address, written `02:62:6a:00:00:02`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// A unicast address: not multicast/broadcast (bit 0 of the first byte) and not zero.
    pub fn is_unicast(&self) -> bool {
        self.0[0] & 1 == 0 && self.0 != [0; 6]
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddr({self})")
    }
}

impl FromStr for MacAddr {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::MacSyntax(s.to_owned());
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let p = parts.next().ok_or_else(bad)?;
            // from_str_radix alone would take "+2".
            if p.len() != 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            *byte = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(out))
    }
}

impl Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The virtio-net device and its frame socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetConfig {
    /// Where the VMM listens for the daemon (`SOCK_SEQPACKET`, see the module docs).
    pub socket: PathBuf,
    /// The guest's MAC address.
    pub mac: MacAddr,
    /// The guest's IP MTU.
    #[serde(default = "default_mtu")]
    pub mtu: u16,
}

fn default_mtu() -> u16 {
    DEFAULT_MTU
}

impl NetConfig {
    /// The longest frame either side may send: `mtu + 14`.
    pub fn max_frame_len(&self) -> usize {
        usize::from(self.mtu) + ETHERNET_HEADER_LEN
    }

    /// Checks the MTU's range and that the MAC is unicast.
    pub fn validate(&self) -> Result<(), Error> {
        if !(MIN_MTU..=MAX_MTU).contains(&self.mtu) {
            return Err(Error::Mtu(self.mtu));
        }
        if !self.mac.is_unicast() {
            return Err(Error::NotUnicast(self.mac));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_round_trip_as_text() {
        let mac: MacAddr = "02:62:6A:00:00:02".parse().unwrap();
        assert_eq!(mac.0, [0x02, 0x62, 0x6a, 0, 0, 2]);
        assert_eq!(mac.to_string(), "02:62:6a:00:00:02");
        assert_eq!(
            serde_json::to_string(&mac).unwrap(),
            "\"02:62:6a:00:00:02\""
        );
        assert_eq!(
            serde_json::from_str::<MacAddr>("\"02:62:6a:00:00:02\"").unwrap(),
            mac
        );
        for bad in [
            "",
            "02:62:6a:00:00",
            "02:62:6a:00:00:02:03",
            "2:62:6a:00:00:02",
            "02:62:6a:00:00:zz",
            "02-62-6a-00-00-02",
            "+2:62:6a:00:00:02",
        ] {
            let e = bad.parse::<MacAddr>().unwrap_err();
            assert_eq!(e, Error::MacSyntax(bad.into()));
            assert!(e.to_string().contains("six hex pairs"), "{e}");
        }
    }

    #[test]
    fn a_net_config_round_trips_and_checks_its_values() {
        let c = NetConfig {
            socket: "/s/net.sock".into(),
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            mtu: 9000,
        };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<NetConfig>(&json).unwrap(), c);
        c.validate().unwrap();
        assert_eq!(c.max_frame_len(), 9014);
        let d: NetConfig =
            serde_json::from_str(r#"{"socket":"/n","mac":"02:00:00:00:00:01"}"#).unwrap();
        assert_eq!(d.mtu, DEFAULT_MTU);
        assert!(
            serde_json::from_str::<NetConfig>(
                r#"{"socket":"/n","mac":"02:00:00:00:00:01","tap":"eth0"}"#
            )
            .is_err()
        );
        let e = NetConfig {
            mtu: 67,
            ..c.clone()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.to_string(), "MTU must be between 68 and 65521 (got 67)");
        let multicast = NetConfig {
            mac: MacAddr([1, 0, 0x5e, 0, 0, 1]),
            ..c.clone()
        };
        assert_eq!(
            multicast.validate().unwrap_err().to_string(),
            "MAC address 01:00:5e:00:00:01 is not a unicast address"
        );
        // The message's numbers are the constants'.
        assert_eq!((MIN_MTU, MAX_MTU), (68, 65521));
        assert!(
            NetConfig {
                mac: MacAddr([0; 6]),
                ..c
            }
            .validate()
            .is_err()
        );
    }
}
