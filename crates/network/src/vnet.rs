//! The virtio-net header a tap opened with `IFF_VNET_HDR` puts before every frame, so that
//! checksums are left to the kernels that already know the data is good.
//!
//! A frame into the sandbox crosses no wire: checksumming its TCP payload in smoltcp and
//! verifying it again in the sandbox's kernel were two passes over every byte of a download.
//! With the header, a TCP frame from the stack carries only its pseudo-header sum and the
//! mark `VIRTIO_NET_HDR_F_NEEDS_CSUM` (what a NIC with checksum offload is given): the
//! sandbox's kernel delivers it locally without verifying (a partial checksum is a trusted
//! one), and completes the checksum itself if the frame leaves the sandbox again (forwarded to
//! a container inside it), so no frame ever goes on with a wrong checksum. In the other
//! direction (`TUNSETOFFLOAD` with `TUN_F_CSUM`) the sandbox's kernel may send frames marked
//! the same way; the stack does not verify TCP/UDP checksums on a tap with the header.
//! `VIRTIO_NET_HDR_F_DATA_VALID` is not used: a frame so marked is forwarded with whatever its
//! checksum field holds.

/// `sizeof(struct virtio_net_hdr)`: the tap's default header size.
pub const LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`.
const F_NEEDS_CSUM: u8 = 1;
/// The TCP checksum's offset in the TCP header.
const TCP_CHECKSUM: u16 = 16;
const ETH_LEN: usize = 14;

/// The header to send `frame` with, after writing the pseudo-header sum into the checksum
/// field of a TCP segment (whatever the field held: a full checksum, or smoltcp's zero when it
/// was told to leave it). Any other frame gets an empty header and is sent as it is, with the
/// checksums it carries.
pub fn prepare(frame: &mut [u8]) -> [u8; LEN] {
    let mut hdr = [0; LEN];
    let Some((start, sum)) = tcp_pseudo_sum(frame) else {
        return hdr;
    };
    let at = start + usize::from(TCP_CHECKSUM);
    frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    let tcp_header = usize::from(frame[start + 12] >> 4) * 4;
    hdr[0] = F_NEEDS_CSUM;
    // hdr_len: the headers, which the kernel keeps linear (the payload may go in pages).
    let hdr_len = u16::try_from(start + tcp_header).unwrap_or(0);
    hdr[2..4].copy_from_slice(&hdr_len.to_le_bytes());
    // csum_start and csum_offset, in the host's order (a legacy header on x86 and arm).
    let start = u16::try_from(start).unwrap_or(0);
    hdr[6..8].copy_from_slice(&start.to_ne_bytes());
    hdr[8..10].copy_from_slice(&TCP_CHECKSUM.to_ne_bytes());
    hdr
}

/// Where the TCP header of an unfragmented IPv4 or IPv6 (no extension header) segment starts,
/// and its pseudo-header sum (folded, not complemented); `None` for anything else or a frame
/// too short to be what its headers say.
fn tcp_pseudo_sum(frame: &[u8]) -> Option<(usize, u16)> {
    const TCP: u8 = 6;
    let ethertype = u16::from_be_bytes(frame.get(12..14)?.try_into().ok()?);
    let (start, sum) = match ethertype {
        0x0800 => {
            let ip = frame.get(ETH_LEN..ETH_LEN + 20)?;
            let ihl = u16::from(ip[0] & 0x0f) * 4;
            let total = u16::from_be_bytes([ip[2], ip[3]]);
            let fragmented = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0;
            if ip[0] >> 4 != 4 || ip[9] != TCP || fragmented || ihl < 20 || total < ihl {
                return None;
            }
            let tcp_len = total - ihl;
            let sum = add(&ip[12..20], u32::from(TCP) + u32::from(tcp_len));
            (ETH_LEN + usize::from(ihl), sum)
        }
        0x86dd => {
            let ip = frame.get(ETH_LEN..ETH_LEN + 40)?;
            if ip[0] >> 4 != 6 || ip[6] != TCP {
                return None;
            }
            let tcp_len = u16::from_be_bytes([ip[4], ip[5]]);
            let sum = add(&ip[8..40], u32::from(TCP) + u32::from(tcp_len));
            (ETH_LEN + 40, sum)
        }
        _ => return None,
    };
    // The checksum field and the data offset must be inside the frame.
    (frame.len() >= start + 20).then_some((start, sum))
}

/// The ones' complement sum of `words` (big-endian 16-bit) and `extra`, folded to 16 bits.
fn add(words: &[u8], extra: u32) -> u16 {
    let mut sum = words
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .fold(extra, |a, w| a + w);
    loop {
        match u16::try_from(sum) {
            Ok(folded) => return folded,
            Err(_) => sum = (sum & 0xffff) + (sum >> 16),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::{
        EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpAddress, IpProtocol,
        Ipv4Address, Ipv4Packet, Ipv4Repr, Ipv6Address, Ipv6Packet, Ipv6Repr, TcpControl,
        TcpPacket, TcpRepr, TcpSeqNumber,
    };

    /// An Ethernet frame with a TCP segment carrying `payload`, checksummed by smoltcp.
    fn tcp_frame(v6: bool, payload: &[u8]) -> Vec<u8> {
        let tcp = TcpRepr {
            src_port: 443,
            dst_port: 51000,
            control: TcpControl::Psh,
            seq_number: TcpSeqNumber(7),
            ack_number: Some(TcpSeqNumber(9)),
            window_len: 1000,
            window_scale: None,
            max_seg_size: None,
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload,
        };
        let caps = ChecksumCapabilities::default();
        let (ip_len, ethertype) = if v6 {
            (40, EthernetProtocol::Ipv6)
        } else {
            (20, EthernetProtocol::Ipv4)
        };
        let mut frame = vec![0; ETH_LEN + ip_len + tcp.buffer_len()];
        let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
        EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype,
        }
        .emit(&mut eth);
        if v6 {
            let (s, d) = (
                Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
                Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 15),
            );
            let mut ip = Ipv6Packet::new_unchecked(eth.payload_mut());
            Ipv6Repr {
                src_addr: s,
                dst_addr: d,
                next_header: IpProtocol::Tcp,
                payload_len: tcp.buffer_len(),
                hop_limit: 64,
            }
            .emit(&mut ip);
            let mut t = TcpPacket::new_unchecked(ip.payload_mut());
            tcp.emit(&mut t, &s.into(), &d.into(), &caps);
        } else {
            let (s, d) = (
                Ipv4Address::new(10, 0, 2, 2),
                Ipv4Address::new(10, 0, 2, 15),
            );
            let mut ip = Ipv4Packet::new_unchecked(eth.payload_mut());
            Ipv4Repr {
                src_addr: s,
                dst_addr: d,
                next_header: IpProtocol::Tcp,
                payload_len: tcp.buffer_len(),
                hop_limit: 64,
            }
            .emit(&mut ip, &caps);
            let mut t = TcpPacket::new_unchecked(ip.payload_mut());
            tcp.emit(&mut t, &s.into(), &d.into(), &caps);
        }
        frame
    }

    /// What the kernel does with a partial checksum: sum from `csum_start` to the end and
    /// store the complement at `csum_start + csum_offset`.
    fn complete(frame: &mut [u8], hdr: &[u8; LEN]) {
        let start = usize::from(u16::from_ne_bytes([hdr[6], hdr[7]]));
        let offset = usize::from(u16::from_ne_bytes([hdr[8], hdr[9]]));
        let sum = !add(&frame[start..], 0);
        frame[start + offset..start + offset + 2].copy_from_slice(&sum.to_be_bytes());
    }

    fn verified(frame: &[u8], v6: bool) -> bool {
        let eth = EthernetFrame::new_checked(frame).unwrap();
        if v6 {
            let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
            let (s, d) = (
                IpAddress::Ipv6(ip.src_addr()),
                IpAddress::Ipv6(ip.dst_addr()),
            );
            TcpPacket::new_checked(ip.payload())
                .unwrap()
                .verify_checksum(&s, &d)
        } else {
            let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
            let (s, d) = (
                IpAddress::Ipv4(ip.src_addr()),
                IpAddress::Ipv4(ip.dst_addr()),
            );
            TcpPacket::new_checked(ip.payload())
                .unwrap()
                .verify_checksum(&s, &d)
        }
    }

    #[test]
    fn a_tcp_segment_completed_by_the_kernel_has_the_right_checksum() {
        for v6 in [false, true] {
            // Odd and even payload lengths: the last byte is padded when summed.
            for payload in [&b"hello, sandbox"[..], b"odd", b""] {
                let mut frame = tcp_frame(v6, payload);
                // smoltcp's field when told to leave the checksum (zero), or a stale one.
                for stale in [[0, 0], [0xde, 0xad]] {
                    let at = ETH_LEN + if v6 { 40 } else { 20 } + usize::from(TCP_CHECKSUM);
                    frame[at..at + 2].copy_from_slice(&stale);
                    let hdr = prepare(&mut frame);
                    assert_eq!(hdr[0], F_NEEDS_CSUM, "v6={v6}");
                    let start = usize::from(u16::from_ne_bytes([hdr[6], hdr[7]]));
                    assert_eq!(start, ETH_LEN + if v6 { 40 } else { 20 });
                    assert_eq!(
                        usize::from(u16::from_le_bytes([hdr[2], hdr[3]])),
                        start + 20,
                        "hdr_len covers the headers"
                    );
                    assert!(!verified(&frame, v6), "only the pseudo-header sum is there");
                    complete(&mut frame, &hdr);
                    assert!(verified(&frame, v6), "v6={v6} payload={payload:?}");
                }
            }
        }
    }

    #[test]
    fn other_frames_go_as_they_are() {
        let arp = {
            let mut f = vec![0; 42];
            f[12..14].copy_from_slice(&[0x08, 0x06]);
            f
        };
        // A UDP datagram: IPv4 with protocol 17.
        let mut udp = tcp_frame(false, b"x");
        udp[ETH_LEN + 9] = 17;
        // A fragment, and frames cut short.
        let mut fragment = tcp_frame(false, b"x");
        fragment[ETH_LEN + 6] = 0x20;
        let short = tcp_frame(false, b"")[..ETH_LEN + 30].to_vec();
        for frame in [arp, udp, fragment, short, vec![0; 5]] {
            let mut f = frame.clone();
            assert_eq!(prepare(&mut f), [0; LEN]);
            assert_eq!(f, frame, "left untouched");
        }
    }
}
