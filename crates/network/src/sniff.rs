//! Reads the name a connection is for from its first bytes: the server name (SNI) of a TLS
//! ClientHello, or the `Host` header of a plain HTTP request. Domain allow-lists are matched
//! on it. The bytes come from the sandbox, so every length is checked and nothing panics.
//!
//! TLS lets a client split its ClientHello over several handshake records (some do, to dodge
//! middleboxes, and large post-quantum key shares can outgrow one record's 16 KiB), so the
//! records are joined before the hello is read. Anything that a real first flight cannot be
//! (another record type before the hello is whole, an empty or oversized record, a hello
//! beyond [`MAX_CLIENT_HELLO`]) carries no name, and a flow without a name gets no domain rule.

/// The largest ClientHello (handshake header included) that is reassembled and read.
pub const MAX_CLIENT_HELLO: usize = 64 * 1024;

/// The most bytes held back from the server while looking for a name: a ClientHello of
/// [`MAX_CLIENT_HELLO`] with room for the headers of the records it came in. (A hello cut
/// into tiny records, 5 bytes of header each, meets this limit first and carries no name.)
pub const SNIFF_LIMIT: usize = MAX_CLIENT_HELLO + 16 * 1024;

/// The largest plaintext record TLS allows (2^14 bytes).
const MAX_RECORD: usize = 16 * 1024;
/// TLS record content type `handshake`.
const HANDSHAKE: u8 = 0x16;
/// TLS handshake message type `client_hello`.
const CLIENT_HELLO: u8 = 1;

/// What the first bytes of a connection tell.
#[derive(Debug, PartialEq, Eq)]
pub enum Sniffed {
    /// Not enough bytes yet.
    NeedMore,
    /// The name, or `None` when the protocol carries none (or it is malformed).
    Done(Option<String>),
}

/// Looks for a TLS SNI or an HTTP `Host` in `buf`, the bytes the client sent so far.
pub fn sniff(buf: &[u8]) -> Sniffed {
    if buf.is_empty() {
        return Sniffed::NeedMore;
    }
    let result = if buf[0] == HANDSHAKE {
        tls_sni(buf)
    } else if buf[0].is_ascii_uppercase() {
        http_host(buf)
    } else {
        Sniffed::Done(None)
    };
    match result {
        Sniffed::NeedMore if buf.len() >= SNIFF_LIMIT => Sniffed::Done(None),
        r => r,
    }
}

/// A cursor that fails instead of panicking on short input.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
}

fn tls_sni(buf: &[u8]) -> Sniffed {
    match first_handshake_message(buf) {
        Ok(hello) => Sniffed::Done(client_hello_sni(&hello)),
        Err(Unjoined::NeedMore) => Sniffed::NeedMore,
        Err(Unjoined::Refused) => Sniffed::Done(None),
    }
}

/// Why the records in a buffer do not (yet) give a ClientHello.
enum Unjoined {
    NeedMore,
    /// Not a first flight a client would send.
    Refused,
}

/// Joins the fragments of the first handshake message from the leading handshake records of
/// `buf` and returns that message, header included, once it is whole. It must be a
/// ClientHello of at most [`MAX_CLIENT_HELLO`]; each record must be a non-empty TLS handshake
/// record of at most [`MAX_RECORD`] (TLS forbids empty handshake fragments and other record
/// types between the fragments of one message). Bytes after the message are not looked at.
fn first_handshake_message(buf: &[u8]) -> Result<Vec<u8>, Unjoined> {
    let mut rest = buf;
    let mut message = Vec::new();
    loop {
        if let Some(len) = hello_len(&message, &[])?
            && message.len() >= len
        {
            message.truncate(len);
            return Ok(message);
        }
        let Some(&content_type) = rest.first() else {
            return Err(Unjoined::NeedMore);
        };
        if content_type != HANDSHAKE {
            return Err(Unjoined::Refused);
        }
        // The record's major version is 3 in every TLS (and SSL 3.0).
        if rest.get(1).is_some_and(|&major| major != 3) {
            return Err(Unjoined::Refused);
        }
        let Some(header) = rest.get(..5) else {
            return Err(Unjoined::NeedMore);
        };
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > MAX_RECORD {
            return Err(Unjoined::Refused);
        }
        let Some(fragment) = rest.get(5..5 + len) else {
            // Refuse a hello that is none, or too large, without waiting for its record.
            hello_len(&message, &rest[5..])?;
            return Err(Unjoined::NeedMore);
        };
        message.extend_from_slice(fragment);
        rest = &rest[5 + len..];
    }
}

/// The length (header included) of the handshake message that starts `joined` followed by
/// `more`, once its 4-byte header is in; refused unless it is a ClientHello of at most
/// [`MAX_CLIENT_HELLO`].
fn hello_len(joined: &[u8], more: &[u8]) -> Result<Option<usize>, Unjoined> {
    let mut header = [0; 4];
    let mut have = 0;
    for (slot, &b) in header.iter_mut().zip(joined.iter().chain(more)) {
        *slot = b;
        have += 1;
    }
    if have > 0 && header[0] != CLIENT_HELLO {
        return Err(Unjoined::Refused);
    }
    if have < 4 {
        return Ok(None);
    }
    let len =
        4 + (usize::from(header[1]) << 16 | usize::from(header[2]) << 8 | usize::from(header[3]));
    if len > MAX_CLIENT_HELLO {
        return Err(Unjoined::Refused);
    }
    Ok(Some(len))
}

/// The SNI of `message`, a whole ClientHello handshake message.
fn client_hello_sni(message: &[u8]) -> Option<String> {
    let mut r = Reader(message);
    if r.u8()? != usize::from(CLIENT_HELLO) {
        return None;
    }
    let len = r.take(3)?;
    let len = usize::from(len[0]) << 16 | usize::from(len[1]) << 8 | usize::from(len[2]);
    let mut r = Reader(r.take(len)?);
    r.take(2 + 32)?; // version, random
    let n = r.u8()?;
    r.take(n)?; // session id
    let n = r.u16()?;
    r.take(n)?; // cipher suites
    let n = r.u8()?;
    r.take(n)?; // compression methods
    let n = r.u16()?;
    let mut exts = Reader(r.take(n)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let n = exts.u16()?;
        let body = exts.take(n)?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader(body);
        let n = list.u16()?;
        let mut list = Reader(list.take(n)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let n = list.u16()?;
            let name = list.take(n)?;
            if name_type == 0 {
                return valid_name(name);
            }
        }
    }
    None
}

fn http_host(buf: &[u8]) -> Sniffed {
    // A first line that is not `METHOD target HTTP/x` is some other protocol: do not wait.
    if let Some(eol) = buf.windows(2).position(|w| w == b"\r\n")
        && !buf[..eol].windows(6).any(|w| w == b" HTTP/")
    {
        return Sniffed::Done(None);
    }
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Sniffed::NeedMore;
    };
    let head = &buf[..end];
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let request = lines.next().unwrap_or_default();
    let method_ok = request
        .iter()
        .position(|&b| b == b' ')
        .is_some_and(|sp| sp > 0 && request[..sp].iter().all(u8::is_ascii_uppercase));
    if !method_ok {
        return Sniffed::Done(None);
    }
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if line[..colon].eq_ignore_ascii_case(b"host") {
            let value = line[colon + 1..].trim_ascii();
            // Strip a port; an IPv6 literal has no name to match anyway.
            let host = match value.iter().rposition(|&b| b == b':') {
                Some(i) if value[i + 1..].iter().all(u8::is_ascii_digit) => &value[..i],
                _ => value,
            };
            return Sniffed::Done(valid_name(host));
        }
    }
    Sniffed::Done(None)
}

fn valid_name(raw: &[u8]) -> Option<String> {
    let ok = !raw.is_empty()
        && raw.len() <= 253
        && raw
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
    ok.then(|| String::from_utf8_lossy(raw).to_ascii_lowercase())
}

/// A minimal TLS 1.2/1.3 ClientHello carrying `sni`, as a client's first flight looks. Tests
/// and benchmarks use it to speak to the stack without a TLS library.
pub fn client_hello(sni: &str) -> Vec<u8> {
    let name = sni.as_bytes();
    let mut sni_ext = Vec::new();
    sni_ext.extend_from_slice(&u16::try_from(name.len() + 3).unwrap_or(0).to_be_bytes());
    sni_ext.push(0);
    sni_ext.extend_from_slice(&u16::try_from(name.len()).unwrap_or(0).to_be_bytes());
    sni_ext.extend_from_slice(name);
    let mut exts = vec![0, 0];
    exts.extend_from_slice(&u16::try_from(sni_ext.len()).unwrap_or(0).to_be_bytes());
    exts.extend_from_slice(&sni_ext);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(0); // session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
    body.extend_from_slice(&[1, 0]); // null compression
    body.extend_from_slice(&u16::try_from(exts.len()).unwrap_or(0).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![1];
    hs.extend_from_slice(&u32::try_from(body.len()).unwrap_or(0).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 3, 1];
    rec.extend_from_slice(&u16::try_from(hs.len()).unwrap_or(0).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

/// `flight` with each TLS record cut into records of at most `size` payload bytes (at least
/// one), as a client that fragments its handshake sends it. Bytes after the last whole record
/// are kept as they are. Tests use it to split real ClientHellos.
pub fn refragment(flight: &[u8], size: usize) -> Vec<u8> {
    let size = size.clamp(1, MAX_RECORD);
    let mut out = Vec::with_capacity(flight.len());
    let mut rest = flight;
    while let Some(header) = rest.get(..5) {
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        let Some(payload) = rest.get(5..5 + len) else {
            break;
        };
        for piece in payload.chunks(size) {
            out.extend_from_slice(&header[..3]);
            out.extend_from_slice(&u16::try_from(piece.len()).unwrap_or(0).to_be_bytes());
            out.extend_from_slice(piece);
        }
        rest = &rest[5 + len..];
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_sni_is_read_and_needs_the_whole_record() {
        let hello = client_hello("Api.Example.com");
        assert_eq!(sniff(&hello), Sniffed::Done(Some("api.example.com".into())));
        for cut in [1, 4, 5, hello.len() - 1] {
            assert_eq!(sniff(&hello[..cut]), Sniffed::NeedMore, "cut at {cut}");
        }
    }

    /// The first flight of a real TLS client (rustls: TLS 1.3 and 1.2, key shares, ALPN)
    /// for `name`.
    #[allow(
        deprecated,
        reason = "ring's provider, deprecated from rustls 0.23.48 for lacking post-quantum key exchange; no lockfile is committed, so builds take either version"
    )]
    fn rustls_hello(name: &str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let mut client = rustls::ClientConnection::new(
            std::sync::Arc::new(config),
            name.to_string().try_into().unwrap(),
        )
        .unwrap();
        let mut flight = Vec::new();
        client.write_tls(&mut flight).unwrap();
        flight
    }

    fn record(content_type: u8, payload: &[u8]) -> Vec<u8> {
        let mut r = vec![content_type, 3, 1];
        r.extend_from_slice(&u16::try_from(payload.len()).unwrap().to_be_bytes());
        r.extend_from_slice(payload);
        r
    }

    #[test]
    fn a_client_hello_split_over_records_gives_the_same_name() {
        let name = Sniffed::Done(Some("api.example.test".into()));
        for hello in [
            client_hello("api.example.test"),
            rustls_hello("api.example.test"),
        ] {
            assert_eq!(sniff(&hello), name);
            let half = (hello.len() - 5) / 2;
            for size in [half, 40, 7, 1] {
                let split = refragment(&hello, size);
                assert!(split.len() > hello.len(), "{size}-byte records");
                assert_eq!(sniff(&split), name, "{size}-byte records");
                // Until the last fragment is in, the name is not known yet.
                assert_eq!(sniff(&split[..split.len() - 1]), Sniffed::NeedMore);
                let last = match (hello.len() - 5) % size {
                    0 => size,
                    r => r,
                };
                let before_last = split.len() - 5 - last;
                assert_eq!(sniff(&split[..before_last]), Sniffed::NeedMore, "{size}");
            }
        }
    }

    #[test]
    fn a_client_hello_of_the_largest_size_is_joined_and_a_larger_one_refused() {
        // A hello padded (as the padding extension does) to the limit, in full records.
        let padded = |total: usize| {
            let mut hello = client_hello("api.example.test");
            let pad = total - (hello.len() - 5) - 4;
            let mut message = hello.split_off(5);
            let ext_at = 4 + 2 + 32 + 1 + 4 + 2;
            let exts_len = usize::from(u16::from_be_bytes([message[ext_at], message[ext_at + 1]]));
            message[ext_at..ext_at + 2]
                .copy_from_slice(&u16::try_from(exts_len + 4 + pad).unwrap().to_be_bytes());
            message.extend_from_slice(&[0, 21]); // padding
            message.extend_from_slice(&u16::try_from(pad).unwrap().to_be_bytes());
            message.resize(message.len() + pad, 0);
            let body = u32::try_from(message.len() - 4).unwrap().to_be_bytes();
            message[1..4].copy_from_slice(&body[1..]);
            let mut flight = Vec::new();
            for piece in message.chunks(MAX_RECORD) {
                flight.extend(record(HANDSHAKE, piece));
            }
            flight
        };
        let largest = padded(MAX_CLIENT_HELLO);
        assert!(largest.len() <= SNIFF_LIMIT);
        assert_eq!(
            sniff(&largest),
            Sniffed::Done(Some("api.example.test".into()))
        );
        let larger = padded(MAX_CLIENT_HELLO + 1);
        // Refused as soon as its header is in, without waiting for the rest.
        assert_eq!(sniff(&larger[..9]), Sniffed::Done(None));
    }

    #[test]
    fn records_a_first_flight_cannot_hold_carry_no_name() {
        let hello = client_hello("api.example.test");
        let split = refragment(&hello, 10);
        // Another record type between two fragments of the hello.
        let mut interleaved = split[..15].to_vec();
        interleaved.extend(record(0x14, &[1])); // change_cipher_spec
        interleaved.extend_from_slice(&split[15..]);
        assert_eq!(sniff(&interleaved), Sniffed::Done(None));
        let mut interleaved = split[..15].to_vec();
        interleaved.extend(record(0x17, b"early")); // application data
        interleaved.extend_from_slice(&split[15..]);
        assert_eq!(sniff(&interleaved), Sniffed::Done(None));
        // An empty handshake record, and one longer than TLS allows.
        let mut empty = split[..15].to_vec();
        empty.extend(record(HANDSHAKE, &[]));
        empty.extend_from_slice(&split[15..]);
        assert_eq!(sniff(&empty), Sniffed::Done(None));
        let mut oversized = hello.clone();
        oversized[3..5].copy_from_slice(&u16::try_from(MAX_RECORD + 1).unwrap().to_be_bytes());
        assert_eq!(sniff(&oversized[..5]), Sniffed::Done(None));
        // Not TLS's record version, and a first handshake message that is not a hello.
        let mut version = split.clone();
        version[15 + 1] = 2;
        assert_eq!(sniff(&version), Sniffed::Done(None));
        let mut not_hello = split.clone();
        not_hello[5] = 2; // server_hello
        assert_eq!(sniff(&not_hello[..6]), Sniffed::Done(None));
        // A hello whose inside lies about its lengths, split or not.
        let mut lying = hello.clone();
        lying[5 + 4 + 2 + 32] = 0xff; // a session id longer than the hello
        assert_eq!(sniff(&lying), Sniffed::Done(None));
        assert_eq!(sniff(&refragment(&lying, 3)), Sniffed::Done(None));
        // Endless tiny records that never finish the hello stop at the limit.
        let endless = refragment(&padded_prefix(), 1);
        assert!(endless.len() >= SNIFF_LIMIT);
        assert_eq!(sniff(&endless[..SNIFF_LIMIT]), Sniffed::Done(None));
    }

    /// The start of a hello announcing 60 KiB, far more than its 1-byte records reach
    /// within [`SNIFF_LIMIT`].
    fn padded_prefix() -> Vec<u8> {
        let mut message = vec![CLIENT_HELLO, 0, 0xf0, 0];
        message.resize(SNIFF_LIMIT / 6 + 1, 0);
        record(HANDSHAKE, &message)
    }

    #[test]
    fn http_host_is_read_without_its_port() {
        let req = b"GET / HTTP/1.1\r\nUser-Agent: x\r\nhost: www.Example.com:8080\r\n\r\n";
        assert_eq!(sniff(req), Sniffed::Done(Some("www.example.com".into())));
        assert_eq!(sniff(&req[..20]), Sniffed::NeedMore);
        assert_eq!(sniff(b"GET / HTTP/1.1\r\n\r\n"), Sniffed::Done(None));
    }

    #[test]
    fn other_protocols_and_garbage_carry_no_name() {
        assert_eq!(sniff(b"SSH-2.0-OpenSSH\r\n"), Sniffed::Done(None));
        assert_eq!(sniff(b"\x00\x01binary"), Sniffed::Done(None));
        let mut bad = client_hello("a.example.com");
        bad[6] = 0xff; // an absurd handshake length
        assert_eq!(sniff(&bad), Sniffed::Done(None));
        assert_eq!(sniff(&vec![b'A'; SNIFF_LIMIT]), Sniffed::Done(None));
    }
}
