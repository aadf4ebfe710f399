//! Ethernet frames and connection bytes from the guest into the daemon's userspace network:
//! frame classification (ARP, IPv4/IPv6, TCP, UDP, ICMPv6 neighbour discovery), DNS questions
//! to the gateway, and the TLS SNI / HTTP `Host` sniffer that domain allow-lists rely on.
//! None may panic, and a UDP payload's range must lie inside its frame.

/// One input: a frame, a datagram and a connection's first bytes at once.
pub fn run(data: &[u8]) {
    belljar_network::fuzz::guest_bytes(data);
}
