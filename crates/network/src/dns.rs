//! The DNS server on the gateway. The sandbox's `/etc/resolv.conf` points here; questions the
//! policy allows are resolved on the host (hickory, from the host's resolver configuration or
//! given servers) and answered, others get REFUSED. The addresses answered are remembered so
//! that a TLS SNI is only trusted for an address the daemon itself gave out for that name.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_resolver::TokioResolver;
use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;

/// Where the daemon resolves the sandbox's questions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DnsUpstream {
    /// The host's resolver configuration (`/etc/resolv.conf`, `/etc/hosts`).
    #[default]
    System,
    /// These servers, over UDP and TCP.
    Servers(Vec<SocketAddr>),
}

/// Why the DNS server could not start.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The host's resolver configuration could not be read.
    #[error("Cannot read the host's resolver configuration")]
    SystemConfig(#[source] hickory_resolver::ResolveError),
}

/// How long an answered address stays trusted for its name after its TTL, so a client that
/// caches a little longer than it should still gets through.
const ANSWER_GRACE: Duration = Duration::from_secs(60);
/// Most (address, name) pairs remembered per sandbox.
const MAX_ANSWERS: usize = 4096;

pub(crate) struct Dns {
    resolver: TokioResolver,
    /// Address → names it was an answer for, until when.
    answers: Mutex<HashMap<IpAddr, Vec<(String, Instant)>>>,
}

/// One parsed question.
pub(crate) struct Question {
    pub message: Message,
    /// Lower case, without the trailing dot.
    pub name: String,
}

impl Dns {
    pub fn new(upstream: &DnsUpstream) -> Result<Self, DnsError> {
        let mut builder = match upstream {
            DnsUpstream::System => {
                TokioResolver::builder_tokio().map_err(DnsError::SystemConfig)?
            }
            DnsUpstream::Servers(servers) => {
                let mut group = NameServerConfigGroup::new();
                for s in servers {
                    group.merge(NameServerConfigGroup::from_ips_clear(
                        &[s.ip()],
                        s.port(),
                        true,
                    ));
                }
                TokioResolver::builder_with_config(
                    ResolverConfig::from_parts(None, vec![], group),
                    TokioConnectionProvider::default(),
                )
            }
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        // Ask upstream for answers up to 1232 bytes over UDP, not 512: fewer TCP retries.
        opts.edns0 = true;
        opts.attempts = 2;
        opts.timeout = Duration::from_secs(3);
        Ok(Self {
            resolver: builder.build(),
            answers: Mutex::new(HashMap::new()),
        })
    }

    /// Parses a query datagram; `None` for anything that is not one standard question.
    pub fn parse(datagram: &[u8]) -> Option<Question> {
        let message = Message::from_vec(datagram).ok()?;
        if message.message_type() != MessageType::Query
            || message.op_code() != OpCode::Query
            || message.queries().len() != 1
        {
            return None;
        }
        let name = message.queries()[0].name().to_ascii();
        let name = name.strip_suffix('.').unwrap_or(&name).to_ascii_lowercase();
        Some(Question { message, name })
    }

    /// The answer to a question the policy refuses.
    pub fn refuse(q: &Question) -> Vec<u8> {
        reply(&q.message, ResponseCode::Refused, Vec::new())
    }

    /// `reply` if it fits a UDP answer to `q` (the client's advertised size, 512 bytes
    /// without EDNS, and the link), else the truncated answer that sends the client to TCP.
    pub fn fit_udp(q: &Question, reply: Vec<u8>, link_max: usize) -> Vec<u8> {
        let limit = usize::from(q.message.max_payload().max(512)).min(link_max);
        if reply.len() <= limit {
            return reply;
        }
        let mut m = Message::new();
        m.set_id(q.message.id())
            .set_message_type(MessageType::Response)
            .set_op_code(OpCode::Query)
            .set_recursion_desired(q.message.recursion_desired())
            .set_recursion_available(true)
            .set_truncated(true);
        m.add_queries(q.message.queries().to_vec());
        m.to_vec().unwrap_or_default()
    }

    /// The answer when the daemon cannot take the question now.
    pub fn fail(q: &Question) -> Vec<u8> {
        reply(&q.message, ResponseCode::ServFail, Vec::new())
    }

    /// Resolves an allowed question on the host and builds the answer.
    pub async fn resolve(&self, q: &Question) -> Vec<u8> {
        let query = &q.message.queries()[0];
        match self
            .resolver
            .lookup(query.name().clone(), query.query_type())
            .await
        {
            Ok(lookup) => {
                let records = lookup.records().to_vec();
                self.remember(&q.name, &records);
                reply(&q.message, ResponseCode::NoError, records)
            }
            Err(e) if e.is_nx_domain() => reply(&q.message, ResponseCode::NXDomain, Vec::new()),
            Err(e) if e.is_no_records_found() => {
                reply(&q.message, ResponseCode::NoError, Vec::new())
            }
            Err(e) => {
                tracing::debug!(name = %q.name, error = %e, "DNS resolution failed");
                reply(&q.message, ResponseCode::ServFail, Vec::new())
            }
        }
    }

    fn remember(&self, name: &str, records: &[hickory_proto::rr::Record]) {
        let now = Instant::now();
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        if answers.len() >= MAX_ANSWERS {
            answers.retain(|_, names| {
                names.retain(|(_, until)| *until > now);
                !names.is_empty()
            });
        }
        for r in records {
            let Some(ip) = r.data().ip_addr() else {
                continue;
            };
            let until = now + Duration::from_secs(u64::from(r.ttl())) + ANSWER_GRACE;
            let names = answers.entry(ip).or_default();
            names.retain(|(n, _)| n != name);
            names.push((name.to_string(), until));
        }
    }

    /// Whether the daemon answered `name` with `ip` (and the answer has not expired).
    pub fn answered(&self, name: &str, ip: IpAddr) -> bool {
        let now = Instant::now();
        let answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        answers
            .get(&ip)
            .is_some_and(|names| names.iter().any(|(n, until)| n == name && *until > now))
    }
}

/// REFUSED for a raw query, built from its bytes without parsing it whole: the cheap answer
/// to a question past the rate limit. `None` for what is not a standard query with one
/// question (it is dropped).
pub(crate) fn refuse_raw(query: &[u8]) -> Option<Vec<u8>> {
    let header = query.get(..12)?;
    let (flags, qdcount) = (header[2], u16::from_be_bytes([header[4], header[5]]));
    // A response (QR), or an opcode other than QUERY, or not one question.
    if flags & 0xf8 != 0 || qdcount != 1 {
        return None;
    }
    let mut i = 12;
    loop {
        let len = usize::from(*query.get(i)?);
        i += 1;
        match len {
            0 => break,
            1..=63 => i += len,
            _ => return None, // a compression pointer or a reserved label type
        }
        if i > 12 + 255 {
            return None;
        }
    }
    let question = query.get(12..i + 4)?;
    let mut r = Vec::with_capacity(12 + question.len());
    r.extend_from_slice(&header[..2]);
    // QR, the client's RD; RA, REFUSED: as `Dns::refuse` answers.
    r.extend_from_slice(&[0x80 | (flags & 0x01), 0x80 | 5, 0, 1, 0, 0, 0, 0, 0, 0]);
    r.extend_from_slice(question);
    Some(r)
}

/// A token bucket: `rate` a second, at most `burst` saved up.
pub(crate) struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    pub fn new(rate: u32, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate: f64::from(rate),
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Takes a token if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

fn reply(
    request: &Message,
    code: ResponseCode,
    answers: Vec<hickory_proto::rr::Record>,
) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(true)
        .set_response_code(code);
    m.add_queries(request.queries().to_vec());
    m.insert_answers(answers);
    m.to_vec().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(0x1234).set_recursion_desired(true);
        m.add_query(hickory_proto::op::Query::query(
            hickory_proto::rr::Name::from_ascii(name).unwrap(),
            hickory_proto::rr::RecordType::AAAA,
        ));
        m.to_vec().unwrap()
    }

    #[test]
    fn a_raw_refusal_is_the_parsed_one() {
        let q = query("pypi.example.test.");
        let parsed = Dns::parse(&q).unwrap();
        assert_eq!(refuse_raw(&q), Some(Dns::refuse(&parsed)));
        let m = Message::from_vec(&refuse_raw(&q).unwrap()).unwrap();
        assert_eq!(m.response_code(), ResponseCode::Refused);
        assert_eq!((m.id(), m.queries().len()), (0x1234, 1));
    }

    #[test]
    fn a_raw_refusal_drops_what_is_not_one_question() {
        let q = query("example.test.");
        let mut response = q.clone();
        response[2] |= 0x80;
        let mut two = q.clone();
        two[5] = 2;
        let mut pointer = q.clone();
        pointer[12] = 0xc0;
        for bad in [
            &response[..],
            &two,
            &pointer,
            &q[..q.len() - 1],
            &q[..11],
            &[],
        ] {
            assert_eq!(refuse_raw(bad), None);
        }
    }

    #[test]
    fn a_raw_refusal_of_any_well_formed_question_parses() {
        // Labels of any bytes, any type and class: what the guest may send.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let byte = |x: u64| x.to_le_bytes()[0];
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let mut q = vec![0x12, 0x34, byte(next()) & 0x07, byte(next()), 0, 1];
            q.extend((0..6).map(|_| byte(next())));
            for _ in 0..next() % 4 {
                let len = 1 + (next() % 20) as usize;
                q.push(u8::try_from(len).unwrap());
                q.extend((0..len).map(|_| byte(next())));
            }
            q.push(0);
            q.extend((0..4 + next() % 3).map(|_| byte(next())));
            let r = refuse_raw(&q).expect("a well-formed question");
            let m = Message::from_vec(&r).expect("a refusal that parses");
            assert_eq!(m.response_code(), ResponseCode::Refused);
        }
    }

    #[test]
    fn the_bucket_gives_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, 5, t0);
        assert_eq!((0..8).filter(|_| b.take(t0)).count(), 5);
        assert!(!b.take(t0 + Duration::from_millis(50)));
        assert!(b.take(t0 + Duration::from_millis(110)));
        let later = t0 + Duration::from_secs(60);
        assert_eq!(
            (0..8).filter(|_| b.take(later)).count(),
            5,
            "no more than the burst saved"
        );
    }
}
