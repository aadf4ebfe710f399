//! DNS for the bench: the test internet's name server (every name under `bench.test` is the
//! server's address) and the lookup the sandbox makes, a plain UDP question to the resolver
//! address its stack gives it, timed to the answer. Each lookup asks a new name, so no cache on
//! the way (the daemon's resolver has one) answers it: the figure is the whole path, sandbox
//! to stack to name server and back.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// The zone the server answers.
pub const ZONE: &str = "bench.test";
/// How long one lookup may take before the run fails.
const LOOKUP_DEADLINE: Duration = Duration::from_secs(5);

/// Serves A questions for `*.bench.test` with `addr` on `socket` (NXDOMAIN for anything else),
/// on its own thread.
pub fn serve(socket: UdpSocket, addr: Ipv4Addr) {
    std::thread::spawn(move || {
        let mut buf = [0; 512];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            if let Some(answer) = answer(&buf[..n], addr) {
                let _ = socket.send_to(&answer, from);
            }
        }
    });
}

/// The server's answer: every name in the zone is `addr`; anything else is NXDOMAIN.
fn answer(q: &[u8], addr: Ipv4Addr) -> Option<Vec<u8>> {
    belljar_network::testing::dns_answer(q, |name| {
        (name == ZONE || name.ends_with(&format!(".{ZONE}"))).then_some(addr)
    })
}

/// An A question for `name` with the id `id`, recursion desired.
fn question(id: u16, name: &str) -> Vec<u8> {
    let mut q = Vec::with_capacity(name.len() + 18);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        q.push(u8::try_from(label.len()).unwrap_or(63));
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// Times `n` lookups of fresh names through `resolver`, each checked to answer `want`.
pub fn lookups(
    resolver: SocketAddr,
    tag: &str,
    n: usize,
    want: Ipv4Addr,
) -> std::io::Result<Vec<Duration>> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    socket.connect(resolver)?;
    socket.set_read_timeout(Some(LOOKUP_DEADLINE))?;
    let mut times = Vec::with_capacity(n);
    let mut buf = [0; 512];
    for i in 0..n {
        let id = u16::try_from(i % 65536).unwrap_or(0);
        let q = question(id, &format!("{tag}{i}.{ZONE}"));
        let t = Instant::now();
        socket.send(&q)?;
        loop {
            let got = socket.recv(&mut buf)?;
            let r = &buf[..got];
            // A late answer to an earlier question is skipped; ours ends in the address.
            if r.len() >= 12 && r[..2] == id.to_be_bytes() {
                if !r.ends_with(&want.octets()) {
                    return Err(std::io::Error::other(format!(
                        "{resolver} answered {tag}{i}.{ZONE} without {want}"
                    )));
                }
                break;
            }
        }
        times.push(t.elapsed());
    }
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_answers_the_zone_and_refuses_the_rest() {
        let addr = Ipv4Addr::new(203, 0, 113, 2);
        let r = answer(&question(7, "x1.bench.test"), addr).unwrap();
        assert_eq!(&r[..2], &7u16.to_be_bytes());
        assert_eq!(r[3] & 0x0f, 0, "NOERROR");
        assert!(r.ends_with(&addr.octets()));
        let r = answer(&question(8, "elsewhere.test"), addr).unwrap();
        assert_eq!(r[3] & 0x0f, 3, "NXDOMAIN");
    }
}
