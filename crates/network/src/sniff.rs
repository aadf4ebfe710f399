//! Reads the name a connection is for from its first bytes: the server name (SNI) of a TLS
//! ClientHello, or the `Host` header of a plain HTTP request. Domain allow-lists are matched
//! on it. The bytes come from the sandbox, so every length is checked and nothing panics.

/// The most bytes held back from the server while looking for a name.
pub const SNIFF_LIMIT: usize = 16 * 1024;

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
    let result = if buf[0] == 0x16 {
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
    if buf.len() < 5 {
        return Sniffed::NeedMore;
    }
    let record_len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    let Some(record) = buf.get(5..5 + record_len) else {
        return Sniffed::NeedMore;
    };
    Sniffed::Done(client_hello_sni(record))
}

fn client_hello_sni(record: &[u8]) -> Option<String> {
    let mut r = Reader(record);
    if r.u8()? != 1 {
        return None; // not a ClientHello
    }
    let len = r.take(3)?;
    let len = usize::from(len[0]) << 16 | usize::from(len[1]) << 8 | usize::from(len[2]);
    // A ClientHello split over several records is not followed: real clients fit one.
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
