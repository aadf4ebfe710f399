//! The entry point of the `guest_frames` fuzz target (`crates/fuzz-harness`): every parser in
//! this crate that bytes from the guest reach — frame classification, DNS questions (and the
//! refusal built from their bytes past the rate limit), the TLS
//! SNI / HTTP `Host` sniffer — must take anything without panicking.

use crate::config::NetConfig;
use crate::dns::Dns;
use crate::sniff::sniff;
use crate::stack::frames::{Incoming, classify};

/// Feeds `data` to the guest-facing parsers as a frame, as a UDP payload and as the first
/// bytes of a TCP connection.
#[doc(hidden)]
pub fn guest_bytes(data: &[u8]) {
    let config = NetConfig::default();
    if let Incoming::Udp { payload, .. } = classify(data, &config) {
        assert!(payload.start <= payload.end && payload.end <= data.len());
        dns_question(&data[payload]);
    }
    dns_question(data);
    let _ = sniff(data);
}

fn dns_question(data: &[u8]) {
    // The refusal past the rate limit, built from the raw bytes.
    if let Some(refused) = crate::dns::refuse_raw(data) {
        let m = hickory_proto::op::Message::from_vec(&refused).expect("a refusal that parses");
        assert_eq!(m.response_code(), hickory_proto::op::ResponseCode::Refused);
    }
    if let Some(q) = Dns::parse(data) {
        let refused = Dns::refuse(&q);
        assert!(hickory_proto::op::Message::from_vec(&refused).is_ok());
        let fitted = Dns::fit_udp(&q, vec![0; 4096], 1472);
        assert!(fitted.len() <= 1472);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(name: &str) -> Vec<u8> {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/corpus/guest_frames/"
        );
        std::fs::read(format!("{dir}{name}")).expect("a committed seed")
    }

    #[test]
    fn the_seeds_reach_the_parsers_they_are_for() {
        let config = NetConfig::default();
        assert_eq!(classify(&seed("arp_gateway"), &config), Incoming::Stack);
        assert!(matches!(
            classify(&seed("tcp_syn"), &config),
            Incoming::Syn { .. }
        ));
        let frame = seed("dns_query");
        let Incoming::Udp { payload, dst, .. } = classify(&frame, &config) else {
            panic!("a UDP frame");
        };
        assert_eq!(dst.port(), 53);
        let q = Dns::parse(&frame[payload]).expect("a DNS question");
        assert_eq!(q.name, "pypi.example.test");
        for hello in ["tls_client_hello", "tls_client_hello_split"] {
            assert!(matches!(
                sniff(&seed(hello)),
                crate::sniff::Sniffed::Done(Some(n)) if n == "api.example.test"
            ));
        }
        assert_eq!(
            seed("tls_client_hello_split"),
            crate::sniff::refragment(&seed("tls_client_hello"), 40),
            "the split seed is the whole one in 40-byte records"
        );
        for name in [
            "arp_gateway",
            "tcp_syn",
            "dns_query",
            "http_request",
            "tls_client_hello",
            "tls_client_hello_split",
        ] {
            guest_bytes(&seed(name));
        }
    }
}
