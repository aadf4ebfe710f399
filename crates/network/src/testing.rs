//! The test "internet"'s name server, shared by the end-to-end tests (which give the daemon a
//! resolver of their own, `BELLJAR_DNS_SERVERS`, so that no lookup leaves the machine) and
//! `net_bench` (whose peers resolve through it too): the answer to one DNS query over UDP.
//! Not used by the stack itself.

use std::net::Ipv4Addr;

/// The response to query `q`: an A question for a name `lookup` knows is answered with its
/// address (TTL 60); any question for a name it does not know is NXDOMAIN; another question
/// type for a known name has no answer and no error. `None` for a query too short to parse.
pub fn dns_answer(q: &[u8], lookup: impl Fn(&str) -> Option<Ipv4Addr>) -> Option<Vec<u8>> {
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*q.get(i)?);
        i += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(q.get(i..i + len)?).to_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*q.get(i)?, *q.get(i + 1)?]);
    let question = q.get(12..i + 4)?;
    let addr = lookup(&labels.join("."));
    let answer = addr.filter(|_| qtype == 1);
    let mut r = Vec::new();
    r.extend_from_slice(&q[..2]);
    r.extend_from_slice(&[0x81, if addr.is_some() { 0x80 } else { 0x83 }]);
    r.extend_from_slice(&[0, 1, 0, u8::from(answer.is_some()), 0, 0, 0, 0]);
    r.extend_from_slice(question);
    if let Some(a) = answer {
        r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        r.extend_from_slice(&a.octets());
    }
    Some(r)
}
