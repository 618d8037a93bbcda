//! One run's egress proxy. A connection on the run's channel whose first frame is the egress
//! hello (`{"egress":1}`) carries HTTP proxy traffic from then on, as the code's HTTP client
//! wrote it (the relay inside the sandbox only moves bytes):
//!
//! - `CONNECT host:port`: checked (budget, target, port, host, then the addresses the broker
//!   resolved itself), answered `200`, then the code's TLS ClientHello is read and its server
//!   name compared with the CONNECT host, and only then is the host connected and the bytes
//!   spliced, both ways, never decrypted.
//! - a plain-HTTP request in absolute form (`GET http://host/path`): the same checks on its
//!   target and Host header, for every request of a kept-alive connection; each is sent on a
//!   fresh connection to the host, in origin form, and the answer (a redirect too) goes back
//!   to the code as it came.
//!
//! Nothing is resolved or connected for a request refused before that step. Every attempt
//! leaves one [`EgressReceipt`]; budgets (attempts, open connections, bytes each way, time)
//! and the run's deadline end what is over them.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use plimsoll_egress::http1::{
    self, BodyLen, ChunkedScanner, Parsed, RequestHead, parse_request_head, parse_response_head,
};
use plimsoll_egress::rules::{AddressClass, classify};
use plimsoll_egress::sni::{Hello, client_hello_server_name};
use plimsoll_egress::target::{Host, Target, parse_absolute_uri, parse_authority};
use plimsoll_wire::EgressReceipt;

use super::profile::EgressProfile;

/// How long a request head (or a ClientHello) may take once its first byte arrived.
const HEAD_WITHIN: Duration = Duration::from_secs(10);
/// The largest ClientHello read, in bytes (records included).
const HELLO_MAX: usize = 64 * 1024 + 5;
/// How often a splice looks at the clock when neither side moves.
const TICK: Duration = Duration::from_millis(200);
/// A write to either side that makes no progress for this long ends the connection.
const WRITE_STALL: Duration = Duration::from_secs(10);
/// The longest host as a receipt keeps it.
const HOST_MAX: usize = 255;

/// Every code a receipt's `rule` may carry for a refusal, and every `ended` value;
/// docs/capability-grants.md explains each.
pub const EGRESS_CODES: &[&str] = &[
    "no_egress_grant",
    "bad_request",
    "https_in_plain_request",
    "ip_literal",
    "port_not_allowed",
    "host_not_allowed",
    "resolve_failed",
    "address_not_allowed",
    "not_tls",
    "sni_missing",
    "sni_mismatch",
    "budget_connections",
    "too_many_open",
    "deadline",
];

/// How an allowed connection ended.
pub const EGRESS_ENDS: &[&str] = &[
    "closed",
    "deadline",
    "budget_bytes",
    "budget_time",
    "connect_failed",
    "upstream_failed",
];

/// Resolves a host name to addresses. The broker's own resolver (the system's, after the
/// profile's pins); tests substitute one that counts.
pub(crate) trait Resolve: Send + Sync + std::fmt::Debug {
    fn resolve(&self, name: &str, port: u16) -> io::Result<Vec<IpAddr>>;
}

/// The system's resolver (`getaddrinfo`).
#[derive(Debug)]
pub(crate) struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, name: &str, port: u16) -> io::Result<Vec<IpAddr>> {
        Ok((name, port).to_socket_addrs()?.map(|a| a.ip()).collect())
    }
}

/// One run's egress: its profile (absent for a run whose grant is not an egress grant: every
/// attempt is then refused `no_egress_grant`, and still listed), budgets and receipts.
#[derive(Debug)]
pub(crate) struct Egress {
    profile: Option<Arc<EgressProfile>>,
    run_id: String,
    started: Instant,
    deadline: Instant,
    resolver: Box<dyn Resolve>,
    ledger: Mutex<Ledger>,
}

#[derive(Debug, Default)]
struct Ledger {
    asked: u32,
    open: u32,
    up: u64,
    down: u64,
    receipts: Vec<EgressReceipt>,
    over_listed: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why an attempt was refused: a receipt's `rule` and a message for the code.
#[derive(Debug)]
struct Refused {
    code: &'static str,
    message: String,
}

fn refused(code: &'static str, message: impl Into<String>) -> Refused {
    Refused {
        code,
        message: message.into(),
    }
}

/// The side of a splice a byte travels towards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Up,
    Down,
}

/// An open connection's count, released when dropped.
struct OpenSlot<'a>(&'a Egress);

impl Drop for OpenSlot<'_> {
    fn drop(&mut self) {
        let mut l = lock(&self.0.ledger);
        l.open = l.open.saturating_sub(1);
    }
}

/// A byte stream with what was read past the last parsed head.
struct Buffered<'a, S> {
    s: &'a S,
    buf: Vec<u8>,
}

impl Egress {
    /// The egress of run `run_id`, started now, ending at `deadline`.
    pub(crate) fn new(
        profile: Option<Arc<EgressProfile>>,
        run_id: &str,
        deadline: Instant,
    ) -> Egress {
        Egress::with_resolver(profile, run_id, deadline, Box::new(SystemResolver))
    }

    pub(crate) fn with_resolver(
        profile: Option<Arc<EgressProfile>>,
        run_id: &str,
        deadline: Instant,
        resolver: Box<dyn Resolve>,
    ) -> Egress {
        Egress {
            profile,
            run_id: run_id.to_owned(),
            started: Instant::now(),
            deadline,
            resolver,
            ledger: Mutex::new(Ledger::default()),
        }
    }

    /// Every receipt so far, in the order the attempts began (those that began in the same
    /// millisecond in the order they ended); empties the list.
    pub(crate) fn take_receipts(&self) -> Vec<EgressReceipt> {
        let mut receipts = std::mem::take(&mut lock(&self.ledger).receipts);
        receipts.sort_by_key(|r| r.start_ms);
        receipts
    }

    fn offset(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.started).as_millis() as u64
    }

    /// Serves one proxy connection (the hello already read) until it ends.
    pub(crate) fn serve(&self, stream: &UnixStream) {
        let _ = stream.set_write_timeout(Some(WRITE_STALL));
        let mut client = Buffered {
            s: stream,
            buf: Vec::new(),
        };
        loop {
            let head = match client.read_request_head(self.deadline) {
                Ok(Some(h)) => h,
                Ok(None) => return,
                Err(e) => {
                    // A head that never completes, or is not HTTP: an attempt as any other
                    // (counted, so such receipts stay bounded too), refused, then closed.
                    if let Some(r) = e {
                        let start = Instant::now();
                        let (r, list) = match self.admit() {
                            Ok(_slot) => (r, true),
                            Err(over) => over,
                        };
                        if list {
                            self.listed(self.refusal_receipt("", 0, "http", start, &r));
                        }
                        let _ = reply_refusal(stream, &r);
                    }
                    return;
                }
            };
            let go_on = if head.method.eq_ignore_ascii_case("CONNECT") {
                self.tunnel(&mut client, &head);
                false
            } else {
                self.plain(&mut client, &head)
            };
            if !go_on {
                let _ = stream.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
    }

    /// Counts an attempt against the budgets: `Err` when it is over one.
    fn admit(&self) -> Result<OpenSlot<'_>, (Refused, bool)> {
        let mut l = lock(&self.ledger);
        let Some(p) = &self.profile else {
            // Listed once: a run without an egress grant has no budget to bound the list.
            let first = !l.over_listed;
            l.over_listed = true;
            return Err((
                refused(
                    "no_egress_grant",
                    "this run holds no egress grant: ask for one (`grant` in the request) that lists the host",
                ),
                first,
            ));
        };
        if l.asked >= p.max_connections() {
            let first = !l.over_listed;
            l.over_listed = true;
            return Err((
                refused(
                    "budget_connections",
                    format!(
                        "this run has asked for all {} connections its egress grant allows",
                        p.max_connections()
                    ),
                ),
                first,
            ));
        }
        l.asked += 1;
        if l.open >= p.max_open() {
            return Err((
                refused(
                    "too_many_open",
                    format!(
                        "this run already holds the {} connections its egress grant allows at once: close one first",
                        p.max_open()
                    ),
                ),
                true,
            ));
        }
        if Instant::now() >= self.deadline {
            return Err((refused("deadline", "the run's time is up"), true));
        }
        l.open += 1;
        Ok(OpenSlot(self))
    }

    /// The checks every attempt passes before anything is resolved: the target parses and is
    /// a name, its port and host are allowed. Then the addresses: resolved by the broker
    /// (or pinned by the profile), each public or in a listed range. `Ok` gives the
    /// addresses to try and the rule that allowed it.
    fn check(&self, target: &Target) -> Result<(Vec<SocketAddr>, String), Refused> {
        let p = self.profile.as_ref().expect("admit checked the profile");
        let name = match &target.host {
            Host::Ip(ip) => {
                return Err(refused(
                    "ip_literal",
                    format!("{ip} is an address: name the host (egress grants list names)"),
                ));
            }
            Host::Name(n) => n,
        };
        if !p.ports().contains(&target.port) {
            return Err(refused(
                "port_not_allowed",
                format!(
                    "port {} is not one this egress grant allows ({})",
                    target.port,
                    list(p.ports())
                ),
            ));
        }
        let Some(host_rule) = p.host_rule(name) else {
            return Err(refused(
                "host_not_allowed",
                format!("{name} is not a host this egress grant allows"),
            ));
        };
        let resolved = match p.pinned(name) {
            Some(pinned) => Ok(pinned.to_vec()),
            None => self.resolver.resolve(name, target.port),
        };
        let resolved = match resolved {
            Ok(a) if !a.is_empty() => a,
            Ok(_) | Err(_) => {
                return Err(refused(
                    "resolve_failed",
                    format!("{name} could not be resolved"),
                ));
            }
        };
        let mut allowed = Vec::new();
        let mut ranges = Vec::new();
        let mut classes = Vec::new();
        for ip in resolved {
            let class = classify(ip);
            if class == AddressClass::Public {
                allowed.push(SocketAddr::new(ip, target.port));
            } else if let Some(range) = p.address_rule(ip) {
                allowed.push(SocketAddr::new(ip, target.port));
                ranges.push(range.to_string());
            } else {
                classes.push(class.code());
            }
        }
        if allowed.is_empty() {
            classes.dedup();
            return Err(refused(
                "address_not_allowed",
                format!(
                    "{name} resolves only to addresses this egress grant does not allow ({}): an operator lists such ranges in `addresses`",
                    classes.join(", ")
                ),
            ));
        }
        ranges.dedup();
        let mut rule = format!("host {host_rule} port {}", target.port);
        if !ranges.is_empty() {
            rule.push_str(&format!(" via {}", ranges.join(" ")));
        }
        Ok((allowed, rule))
    }

    /// A `CONNECT`: checked, answered, its ClientHello read and compared, then spliced.
    fn tunnel(&self, client: &mut Buffered<'_, UnixStream>, head: &RequestHead) {
        let start = Instant::now();
        let stream = client.s;
        let named = clip(&head.target);
        let slot = match self.admit() {
            Ok(slot) => slot,
            Err((r, list)) => {
                if list {
                    self.listed(self.refusal_receipt(&named, 0, "connect", start, &r));
                }
                let _ = reply_refusal(stream, &r);
                return;
            }
        };
        let target = match parse_authority(&head.target, None) {
            Ok(t) => t,
            Err(e) => {
                let code = if e.is_ip_literal() {
                    "ip_literal"
                } else {
                    "bad_request"
                };
                let r = refused(code, format!("CONNECT {named}: {e}"));
                self.listed(self.refusal_receipt(&named, 0, "connect", start, &r));
                let _ = reply_refusal(stream, &r);
                return;
            }
        };
        let host = clip(&target.host.to_string());
        let (addrs, rule) = match self.check(&target) {
            Ok(ok) => ok,
            Err(r) => {
                self.listed(self.refusal_receipt(&host, target.port, "connect", start, &r));
                let _ = reply_refusal(stream, &r);
                return;
            }
        };
        if (&*stream)
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .is_err()
        {
            return;
        }
        // The ClientHello, before anything is connected.
        let hello = client.read_hello(self.deadline);
        let checked = match hello {
            Err(()) => Err(refused(
                "not_tls",
                "no TLS ClientHello came within the time allowed",
            )),
            Ok((Hello::Sni(sni), _)) if sni == host => Ok(sni),
            Ok((Hello::Sni(sni), _)) => Err(refused(
                "sni_mismatch",
                format!("the TLS server name {} is not the CONNECT host", clip(&sni)),
            )),
            Ok((Hello::NoSni, _)) => Err(refused(
                "sni_missing",
                "the TLS ClientHello names no server: egress needs the host's name in it (SNI)",
            )),
            Ok((Hello::NotTls | Hello::Invalid(_) | Hello::NeedMore, _)) => Err(refused(
                "not_tls",
                "what followed the CONNECT is not a TLS ClientHello: egress carries TLS only",
            )),
        };
        let sni = match checked {
            Ok(sni) => sni,
            Err(r) => {
                let mut receipt = self.refusal_receipt(&host, target.port, "connect", start, &r);
                if r.code == "sni_mismatch" {
                    receipt.sni = hello_name(&client.buf);
                }
                self.listed(receipt);
                return;
            }
        };
        let mut receipt = EgressReceipt {
            host: host.clone(),
            port: target.port,
            kind: "connect".into(),
            address: None,
            sni: Some(sni),
            bytes_up: 0,
            bytes_down: 0,
            start_ms: self.offset(start),
            end_ms: 0,
            verdict: "allowed".into(),
            rule,
            ended: None,
        };
        let until = self.until(start);
        let upstream = match self.connect(&addrs, until) {
            Ok(u) => u,
            Err(()) => {
                receipt.ended = Some("connect_failed".into());
                receipt.end_ms = self.offset(Instant::now());
                self.listed(receipt);
                return;
            }
        };
        receipt.address = upstream.peer_addr().ok().map(|a| a.to_string());
        let hello = std::mem::take(&mut client.buf);
        let ended = self.splice(stream, &upstream, &hello, until, &mut receipt);
        receipt.ended = Some(ended.into());
        receipt.end_ms = self.offset(Instant::now());
        let _ = upstream.shutdown(std::net::Shutdown::Both);
        drop(slot);
        self.listed(receipt);
    }

    /// One plain-HTTP request; `true` when the client's connection may carry another.
    fn plain(&self, client: &mut Buffered<'_, UnixStream>, head: &RequestHead) -> bool {
        let start = Instant::now();
        let stream = client.s;
        let named = clip(&head.target);
        let slot = match self.admit() {
            Ok(slot) => slot,
            Err((r, list)) => {
                if list {
                    self.listed(self.refusal_receipt(&named, 0, "http", start, &r));
                }
                let _ = reply_refusal(stream, &r);
                return false;
            }
        };
        let parsed = parse_absolute_uri(&head.target)
            .map_err(|e| {
                let code = if head.target.len() >= 8
                    && head.target.is_char_boundary(8)
                    && head.target[..8].eq_ignore_ascii_case("https://")
                {
                    "https_in_plain_request"
                } else if e.is_ip_literal() {
                    "ip_literal"
                } else {
                    "bad_request"
                };
                refused(code, format!("{} {named}: {e}", head.method))
            })
            .and_then(|(target, path)| match http1::host_header(head) {
                Ok(Some(h)) if !same_authority(&h, &target) => Err(refused(
                    "bad_request",
                    format!(
                        "the Host header ({}) names another host than the request's target",
                        clip(&h)
                    ),
                )),
                Ok(Some(_)) => Ok((target, path)),
                Ok(None) => Err(refused(
                    "bad_request",
                    "the request has no Host header: send one naming the target's host",
                )),
                Err(e) => Err(refused("bad_request", e.to_string())),
            })
            .and_then(|(target, path)| {
                http1::request_body(head)
                    .map(|body| (target, path, body))
                    .map_err(|e| refused("bad_request", e.to_string()))
            });
        let (target, path, body) = match parsed {
            Ok(ok) => ok,
            Err(r) => {
                self.listed(self.refusal_receipt(&named, 0, "http", start, &r));
                let _ = reply_refusal(stream, &r);
                return false;
            }
        };
        let host = clip(&target.host.to_string());
        let (addrs, rule) = match self.check(&target) {
            Ok(ok) => ok,
            Err(r) => {
                self.listed(self.refusal_receipt(&host, target.port, "http", start, &r));
                let _ = reply_refusal(stream, &r);
                return false;
            }
        };
        let mut receipt = EgressReceipt {
            host,
            port: target.port,
            kind: "http".into(),
            address: None,
            sni: None,
            bytes_up: 0,
            bytes_down: 0,
            start_ms: self.offset(start),
            end_ms: 0,
            verdict: "allowed".into(),
            rule,
            ended: None,
        };
        let until = self.until(start);
        let (ended, keep) = match self.connect(&addrs, until) {
            Err(()) => {
                let _ = reply_status(stream, 502, "the host could not be connected");
                ("connect_failed", false)
            }
            Ok(upstream) => {
                receipt.address = upstream.peer_addr().ok().map(|a| a.to_string());
                let _ = upstream.set_write_timeout(Some(WRITE_STALL));
                let out = self.exchange(client, &upstream, head, &path, body, until, &mut receipt);
                let _ = upstream.shutdown(std::net::Shutdown::Both);
                out
            }
        };
        receipt.ended = Some(ended.into());
        receipt.end_ms = self.offset(Instant::now());
        drop(slot);
        self.listed(receipt);
        keep
    }

    /// Sends one request upstream and its answer back: how it ended, and whether the client's
    /// connection is still in step for another request.
    #[expect(clippy::too_many_arguments, reason = "one exchange's parts")]
    fn exchange(
        &self,
        client: &mut Buffered<'_, UnixStream>,
        upstream: &TcpStream,
        head: &RequestHead,
        path: &str,
        body: BodyLen,
        until: (Instant, &'static str),
        receipt: &mut EgressReceipt,
    ) -> (&'static str, bool) {
        let out = http1::origin_form_head(head, path);
        if let Err(end) = self.count(Dir::Up, out.len() as u64, receipt) {
            return (end, false);
        }
        if (&*upstream).write_all(&out).is_err() {
            return ("upstream_failed", false);
        }
        // The request's body, as framed.
        let sent = match body {
            BodyLen::None => Ok(()),
            BodyLen::Length(n) => self.forward_length(client, upstream, n, Dir::Up, until, receipt),
            BodyLen::Chunked => self.forward_chunked(client, upstream, Dir::Up, until, receipt),
            BodyLen::UntilClose => Err("upstream_failed"),
        };
        if let Err(end) = sent {
            return (end, false);
        }
        // The answer: its head as it came, then its body as framed.
        let mut from = Buffered {
            s: upstream,
            buf: Vec::new(),
        };
        let (rhead, raw) = match from.read_response_head(until.0) {
            Ok(h) => h,
            Err(end) => {
                let _ = reply_status(client.s, 502, "the host sent no valid HTTP answer");
                return (end, false);
            }
        };
        if let Err(end) = self.count(Dir::Down, raw.len() as u64, receipt) {
            return (end, false);
        }
        if client.s.write_all(&raw).is_err() {
            return ("closed", false);
        }
        let framing = match http1::response_body(&head.method, &rhead) {
            Ok(f) => f,
            Err(_) => return ("upstream_failed", false),
        };
        let done = match framing {
            BodyLen::None => Ok(true),
            BodyLen::Length(n) => self
                .forward_length(&mut from, client.s, n, Dir::Down, until, receipt)
                .map(|()| true),
            BodyLen::Chunked => self
                .forward_chunked(&mut from, client.s, Dir::Down, until, receipt)
                .map(|()| true),
            BodyLen::UntilClose => self
                .forward_until_close(&mut from, client.s, until, receipt)
                .map(|()| false),
        };
        match done {
            Ok(keep) => ("closed", keep),
            Err(end) => (end, false),
        }
    }

    /// When the connection must end, and why: the run's deadline, or the profile's cap on
    /// one connection's time if that comes first.
    fn until(&self, start: Instant) -> (Instant, &'static str) {
        let cap = self
            .profile
            .as_ref()
            .and_then(|p| p.max_connection_time())
            .map(|t| start + t);
        match cap {
            Some(c) if c < self.deadline => (c, "budget_time"),
            _ => (self.deadline, "deadline"),
        }
    }

    fn connect(
        &self,
        addrs: &[SocketAddr],
        until: (Instant, &'static str),
    ) -> Result<TcpStream, ()> {
        let p = self.profile.as_ref().expect("admit checked the profile");
        for a in addrs {
            let left = until.0.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(());
            }
            if let Ok(s) = TcpStream::connect_timeout(a, p.connect_timeout().min(left)) {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
        }
        Err(())
    }

    /// Counts bytes against the run's budgets and the receipt; `Err` when over a budget.
    fn count(&self, dir: Dir, n: u64, receipt: &mut EgressReceipt) -> Result<(), &'static str> {
        let p = self.profile.as_ref().expect("admit checked the profile");
        let mut l = lock(&self.ledger);
        let (used, cap, mine) = match dir {
            Dir::Up => (&mut l.up, p.max_bytes_up(), &mut receipt.bytes_up),
            Dir::Down => (&mut l.down, p.max_bytes_down(), &mut receipt.bytes_down),
        };
        if used.saturating_add(n) > cap {
            return Err("budget_bytes");
        }
        *used += n;
        *mine += n;
        Ok(())
    }

    /// Splices a tunnel until either side closes, a budget is spent, or time is up.
    fn splice(
        &self,
        client: &UnixStream,
        upstream: &TcpStream,
        first: &[u8],
        until: (Instant, &'static str),
        receipt: &mut EgressReceipt,
    ) -> &'static str {
        use rustix::event::{PollFd, PollFlags, poll};
        let _ = upstream.set_write_timeout(Some(WRITE_STALL));
        if let Err(end) = self.count(Dir::Up, first.len() as u64, receipt) {
            return end;
        }
        if (&*upstream).write_all(first).is_err() {
            return "upstream_failed";
        }
        let mut buf = vec![0u8; 64 * 1024];
        let (mut up_open, mut down_open) = (true, true);
        while up_open || down_open {
            let now = Instant::now();
            if now >= until.0 {
                return until.1;
            }
            let wait = until.0.saturating_duration_since(now).min(TICK);
            let mut fds = [
                PollFd::new(
                    client,
                    if up_open {
                        PollFlags::IN
                    } else {
                        PollFlags::empty()
                    },
                ),
                PollFd::new(
                    upstream,
                    if down_open {
                        PollFlags::IN
                    } else {
                        PollFlags::empty()
                    },
                ),
            ];
            let timeout = rustix::event::Timespec::try_from(wait).ok();
            match poll(&mut fds, timeout.as_ref()) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return "upstream_failed",
            }
            let (c_ready, u_ready) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
            if up_open && c_ready {
                match self.pump(client, upstream, Dir::Up, &mut buf, receipt) {
                    Ok(open) => up_open = open,
                    Err(end) => return end,
                }
            }
            if down_open && u_ready {
                match self.pump(upstream, client, Dir::Down, &mut buf, receipt) {
                    Ok(open) => down_open = open,
                    Err(end) => return end,
                }
            }
        }
        "closed"
    }

    /// Moves what one read brings from `from` to `to`: `Ok(false)` once `from` has ended (its
    /// direction then shut on `to`), `Err` with how the connection ends.
    fn pump(
        &self,
        from: &impl Conn,
        to: &impl Conn,
        dir: Dir,
        buf: &mut [u8],
        receipt: &mut EgressReceipt,
    ) -> Result<bool, &'static str> {
        match from.read_from(buf) {
            Ok(0) | Err(_) => {
                to.shut_write();
                Ok(false)
            }
            Ok(n) => {
                self.count(dir, n as u64, receipt)?;
                to.write_all_to(&buf[..n]).map_err(|_| match dir {
                    Dir::Up => "upstream_failed",
                    Dir::Down => "closed",
                })?;
                Ok(true)
            }
        }
    }

    /// Forwards exactly `n` body bytes.
    fn forward_length<S: Conn, W: Conn>(
        &self,
        from: &mut Buffered<'_, S>,
        to: &W,
        mut n: u64,
        dir: Dir,
        until: (Instant, &'static str),
        receipt: &mut EgressReceipt,
    ) -> Result<(), &'static str> {
        while n > 0 {
            let chunk = from.next_bytes(until, n as usize)?;
            self.count(dir, chunk.len() as u64, receipt)?;
            to.write_all_to(&chunk).map_err(|_| "closed")?;
            n -= chunk.len() as u64;
        }
        Ok(())
    }

    /// Forwards a chunked body to its end (trailers included), as it came.
    fn forward_chunked<S: Conn, W: Conn>(
        &self,
        from: &mut Buffered<'_, S>,
        to: &W,
        dir: Dir,
        until: (Instant, &'static str),
        receipt: &mut EgressReceipt,
    ) -> Result<(), &'static str> {
        let mut scanner = ChunkedScanner::new();
        while !scanner.done() {
            let chunk = from.next_bytes(until, 64 * 1024)?;
            let used = scanner.feed(&chunk).map_err(|_| "upstream_failed")?;
            // Bytes past the body's end belong to what follows it.
            from.unread(&chunk[used..]);
            self.count(dir, used as u64, receipt)?;
            to.write_all_to(&chunk[..used]).map_err(|_| "closed")?;
        }
        Ok(())
    }

    /// Forwards an answer framed by the host closing its connection.
    fn forward_until_close(
        &self,
        from: &mut Buffered<'_, TcpStream>,
        to: &UnixStream,
        until: (Instant, &'static str),
        receipt: &mut EgressReceipt,
    ) -> Result<(), &'static str> {
        loop {
            match from.next_bytes(until, 64 * 1024) {
                Ok(chunk) => {
                    self.count(Dir::Down, chunk.len() as u64, receipt)?;
                    to.write_all_to(&chunk).map_err(|_| "closed")?;
                }
                Err("eof") => return Ok(()),
                Err(end) => return Err(end),
            }
        }
    }

    fn refusal_receipt(
        &self,
        host: &str,
        port: u16,
        kind: &str,
        start: Instant,
        r: &Refused,
    ) -> EgressReceipt {
        EgressReceipt {
            host: host.to_owned(),
            port,
            kind: kind.to_owned(),
            address: None,
            sni: None,
            bytes_up: 0,
            bytes_down: 0,
            start_ms: self.offset(start),
            end_ms: self.offset(Instant::now()),
            verdict: "refused".into(),
            rule: r.code.to_owned(),
            ended: None,
        }
    }

    /// Lists a receipt, and logs it (hosts and counts only).
    fn listed(&self, r: EgressReceipt) {
        tracing::info!(
            run_id = %self.run_id,
            profile = self.profile.as_ref().map_or("-", |p| p.name()),
            host = %r.host, port = r.port, kind = %r.kind,
            address = r.address.as_deref().unwrap_or("-"),
            verdict = %r.verdict, rule = %r.rule, ended = r.ended.as_deref().unwrap_or("-"),
            bytes_up = r.bytes_up, bytes_down = r.bytes_down,
            "egress"
        );
        lock(&self.ledger).receipts.push(r);
    }
}

/// Either side of a connection the proxy moves bytes between: the channel (a Unix stream)
/// or the host (a TCP stream).
trait Conn {
    fn set_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    fn read_from(&self, buf: &mut [u8]) -> io::Result<usize>;
    fn write_all_to(&self, bytes: &[u8]) -> io::Result<()>;
    fn shut_write(&self);
}

macro_rules! conn {
    ($t:ty) => {
        impl Conn for $t {
            fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
                self.set_read_timeout(t)
            }
            fn read_from(&self, buf: &mut [u8]) -> io::Result<usize> {
                (&*self).read(buf)
            }
            fn write_all_to(&self, bytes: &[u8]) -> io::Result<()> {
                (&*self).write_all(bytes)
            }
            fn shut_write(&self) {
                let _ = self.shutdown(std::net::Shutdown::Write);
            }
        }
    };
}
conn!(UnixStream);
conn!(TcpStream);

impl<S: Conn> Buffered<'_, S> {
    /// Reads more into the buffer, waiting at most until `until`. `Ok(0)` at end of stream.
    fn fill(&mut self, until: Instant) -> io::Result<usize> {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.s.set_timeout(Some(left.min(TICK)))?;
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match self.s.read_from(&mut chunk) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) && Instant::now() < until =>
                {
                    let left = until.saturating_duration_since(Instant::now());
                    self.s
                        .set_timeout(Some(left.min(TICK).max(Duration::from_millis(1))))?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Up to `max` bytes: the buffered ones first, else what one read brings. `Err("eof")`
    /// when the stream ended, else the reason time ran out or the stream failed.
    fn next_bytes(
        &mut self,
        until: (Instant, &'static str),
        max: usize,
    ) -> Result<Vec<u8>, &'static str> {
        if self.buf.is_empty() {
            match self.fill(until.0) {
                Ok(0) => return Err("eof"),
                Ok(_) => {}
                Err(e)
                    if e.kind() == io::ErrorKind::TimedOut
                        || e.kind() == io::ErrorKind::WouldBlock =>
                {
                    return Err(until.1);
                }
                Err(_) => return Err("upstream_failed"),
            }
        }
        let n = self.buf.len().min(max);
        Ok(self.buf.drain(..n).collect())
    }

    /// Puts bytes back in front of the buffer.
    fn unread(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            let mut v = bytes.to_vec();
            v.extend_from_slice(&self.buf);
            self.buf = v;
        }
    }

    /// The response head of an answer, and its raw bytes.
    fn read_response_head(
        &mut self,
        until: Instant,
    ) -> Result<(http1::ResponseHead, Vec<u8>), &'static str> {
        loop {
            match parse_response_head(&self.buf) {
                Ok(Parsed::Complete(h, len)) => {
                    let raw: Vec<u8> = self.buf.drain(..len).collect();
                    return Ok((h, raw));
                }
                Ok(Parsed::Partial) => {}
                Err(_) => return Err("upstream_failed"),
            }
            match self.fill(until) {
                Ok(0) => return Err("upstream_failed"),
                Ok(_) => {}
                Err(_) => return Err("deadline"),
            }
        }
    }
}

impl Buffered<'_, UnixStream> {
    /// The next request head. `Ok(None)` when the client closed between requests; `Err` with
    /// a refusal to send when it sent something that is not a request head in time.
    fn read_request_head(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<RequestHead>, Option<Refused>> {
        // Waits for the first byte as long as the run lasts (the broker's end shuts the
        // stream), then gives the rest of the head HEAD_WITHIN.
        if self.buf.is_empty() {
            match self.fill(deadline) {
                Ok(0) => return Ok(None),
                Ok(_) => {}
                Err(_) => return Err(None),
            }
        }
        let within = (Instant::now() + HEAD_WITHIN).min(deadline);
        loop {
            match parse_request_head(&self.buf) {
                Ok(Parsed::Complete(h, len)) => {
                    self.buf.drain(..len);
                    return Ok(Some(h));
                }
                Ok(Parsed::Partial) => {}
                Err(e) => return Err(Some(refused("bad_request", e.to_string()))),
            }
            match self.fill(within) {
                Ok(0) => return Ok(None),
                Ok(_) => {}
                Err(_) => {
                    return Err(Some(refused(
                        "bad_request",
                        "the request head did not arrive whole in time",
                    )));
                }
            }
        }
    }

    /// Reads the code's TLS ClientHello after a `200`. `Err` when none came in time.
    fn read_hello(&mut self, deadline: Instant) -> Result<(Hello, usize), ()> {
        let within = (Instant::now() + HEAD_WITHIN).min(deadline);
        loop {
            match client_hello_server_name(&self.buf) {
                Hello::NeedMore if self.buf.len() < HELLO_MAX => {}
                Hello::NeedMore => return Ok((Hello::Invalid("too long"), self.buf.len())),
                other => return Ok((other, self.buf.len())),
            }
            match self.fill(within) {
                Ok(0) | Err(_) => return Err(()),
                Ok(_) => {}
            }
        }
    }
}

/// The server name in a ClientHello, for the receipt of a mismatch.
fn hello_name(buf: &[u8]) -> Option<String> {
    match client_hello_server_name(buf) {
        Hello::Sni(s) => Some(clip(&s)),
        _ => None,
    }
}

/// Whether a Host header names the request target's authority (the port may be left out
/// when it is the default).
fn same_authority(header: &str, target: &Target) -> bool {
    match parse_authority(header, Some(80)) {
        Ok(t) => t.host == target.host && t.port == target.port,
        Err(_) => false,
    }
}

fn clip(s: &str) -> String {
    let mut end = s.len().min(HOST_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn list(ports: &[u16]) -> String {
    ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Answers a refused request: `403` with the code and why, then the connection closes.
fn reply_refusal(s: &UnixStream, r: &Refused) -> io::Result<()> {
    let body = format!("plimsoll egress refused ({}): {}\n", r.code, r.message);
    let head = format!(
        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nX-Plimsoll-Egress: {}\r\n\r\n",
        body.len(),
        r.code
    );
    (&*s).write_all(head.as_bytes())?;
    (&*s).write_all(body.as_bytes())
}

fn reply_status(s: &UnixStream, status: u16, why: &str) -> io::Result<()> {
    let body = format!("plimsoll egress: {why}\n");
    let head = format!(
        "HTTP/1.1 {status} Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    (&*s).write_all(head.as_bytes())?;
    (&*s).write_all(body.as_bytes())
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::profile::{Grant, GrantProfiles};

    /// A resolver that counts its calls and answers fixed addresses.
    #[derive(Debug)]
    struct Counting {
        calls: Arc<AtomicUsize>,
        answer: Vec<IpAddr>,
    }

    impl Resolve for Counting {
        fn resolve(&self, _: &str, _: u16) -> io::Result<Vec<IpAddr>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(self.answer.clone())
        }
    }

    /// A listener that must see nothing: counts what it accepts.
    struct Watched {
        port: u16,
        accepted: Arc<AtomicUsize>,
    }

    fn watched() -> Watched {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&accepted);
        std::thread::spawn(move || {
            for c in l.incoming() {
                seen.fetch_add(1, Ordering::SeqCst);
                drop(c);
            }
        });
        Watched { port, accepted }
    }

    fn profile(extra: &str, port: u16) -> Arc<EgressProfile> {
        let text = format!(
            "[egress.t]\ncallers = [\"local\"]\nhosts = [\"ok.test\", \"*.suffix.test\", \"localhost\"]\nports = [{port}]\n{extra}"
        );
        let g = GrantProfiles::parse(&text, |_| None).unwrap();
        match g.authorize("t", "local").unwrap() {
            Grant::Egress(p) => p,
            Grant::Api(_) => unreachable!(),
        }
    }

    fn egress(p: Arc<EgressProfile>, answer: &[&str]) -> (Egress, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let resolver = Counting {
            calls: Arc::clone(&calls),
            answer: answer.iter().map(|a| a.parse().unwrap()).collect(),
        };
        let e = Egress::with_resolver(
            Some(p),
            "run-test",
            Instant::now() + Duration::from_secs(30),
            Box::new(resolver),
        );
        (e, calls)
    }

    /// Sends `request` on a fresh proxy connection; returns what came back.
    fn ask(e: &Egress, request: &[u8]) -> String {
        let (ours, theirs) = UnixStream::pair().unwrap();
        (&ours).write_all(request).unwrap();
        ours.shutdown(std::net::Shutdown::Write).unwrap();
        e.serve(&theirs);
        drop(theirs);
        let mut out = String::new();
        let _ = (&ours).read_to_string(&mut out);
        out
    }

    /// A minimal TLS 1.2-framed ClientHello, with a server name or none.
    fn hello(sni: Option<&str>) -> Vec<u8> {
        let mut ext = Vec::new();
        if let Some(name) = sni {
            let n = name.len() as u16;
            ext.extend_from_slice(&[0, 0]);
            ext.extend_from_slice(&(n + 5).to_be_bytes());
            ext.extend_from_slice(&(n + 3).to_be_bytes());
            ext.push(0);
            ext.extend_from_slice(&n.to_be_bytes());
            ext.extend_from_slice(name.as_bytes());
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0);
        body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![22, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    fn connect(host: &str, port: u16) -> Vec<u8> {
        format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").into_bytes()
    }

    #[track_caller]
    fn refused_with(e: &Egress, answer: &str, code: &str) {
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        assert!(
            answer.contains(&format!("X-Plimsoll-Egress: {code}")),
            "{answer}"
        );
        let receipts = e.take_receipts();
        let last = receipts.last().expect("a refusal leaves a receipt");
        assert_eq!(
            (last.verdict.as_str(), last.rule.as_str()),
            ("refused", code)
        );
        assert!(last.address.is_none() && last.ended.is_none(), "{last:?}");
    }

    #[test]
    fn refusals_before_the_resolver_neither_resolve_nor_connect() {
        let w = watched();
        let p = profile("", w.port);
        let (e, resolved) = egress(Arc::clone(&p), &["127.0.0.1"]);
        // An unlisted host, an IP literal in several spellings, another port, and a suffix
        // pattern's bare suffix.
        for (target, code) in [
            (format!("evil.test:{}", w.port), "host_not_allowed"),
            (format!("suffix.test:{}", w.port), "host_not_allowed"),
            (format!("127.0.0.1:{}", w.port), "ip_literal"),
            (format!("[::1]:{}", w.port), "ip_literal"),
            (format!("127.1:{}", w.port), "ip_literal"),
            (format!("2130706433:{}", w.port), "ip_literal"),
            ("ok.test:443".to_owned(), "port_not_allowed"),
        ] {
            let (host, port) = target.rsplit_once(':').unwrap();
            let answer = ask(&e, &connect(host, port.parse().unwrap()));
            refused_with(&e, &answer, code);
        }
        // The same for plain HTTP, and a Host header naming another host.
        let answer = ask(
            &e,
            format!(
                "GET http://evil.test:{0}/ HTTP/1.1\r\nHost: evil.test:{0}\r\n\r\n",
                w.port
            )
            .as_bytes(),
        );
        refused_with(&e, &answer, "host_not_allowed");
        let answer = ask(
            &e,
            format!(
                "GET http://ok.test:{0}/ HTTP/1.1\r\nHost: evil.test:{0}\r\n\r\n",
                w.port
            )
            .as_bytes(),
        );
        refused_with(&e, &answer, "bad_request");
        let answer = ask(
            &e,
            b"GET https://ok.test/ HTTP/1.1\r\nHost: ok.test\r\n\r\n",
        );
        refused_with(&e, &answer, "https_in_plain_request");
        assert_eq!(resolved.load(Ordering::SeqCst), 0, "nothing was resolved");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            w.accepted.load(Ordering::SeqCst),
            0,
            "nothing was connected"
        );
    }

    #[test]
    fn internal_addresses_are_refused_unless_listed_and_nothing_is_connected() {
        let w = watched();
        for answer in [
            &["127.0.0.1"][..],
            &["10.1.2.3"],
            &["::1"],
            &["169.254.169.254"],
            &["::ffff:127.0.0.1"],
        ] {
            let (e, resolved) = egress(profile("", w.port), answer);
            let out = ask(&e, &connect("ok.test", w.port));
            refused_with(&e, &out, "address_not_allowed");
            assert_eq!(resolved.load(Ordering::SeqCst), 1);
        }
        // A pin is resolved by the profile, and still checked.
        let (e, resolved) = egress(
            profile("resolve = { \"ok.test\" = [\"192.168.1.1\"] }", w.port),
            &["127.0.0.1"],
        );
        let out = ask(&e, &connect("ok.test", w.port));
        refused_with(&e, &out, "address_not_allowed");
        assert_eq!(
            resolved.load(Ordering::SeqCst),
            0,
            "a pinned name is not resolved"
        );
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            w.accepted.load(Ordering::SeqCst),
            0,
            "nothing was connected"
        );
    }

    #[test]
    fn a_connect_without_a_matching_client_hello_connects_nothing() {
        let w = watched();
        let (e, _) = egress(
            profile("addresses = [\"127.0.0.0/8\"]", w.port),
            &["127.0.0.1"],
        );
        // Not TLS at all.
        let mut req = connect("ok.test", w.port);
        req.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let out = ask(&e, &req);
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        let r = e.take_receipts();
        assert_eq!(r[0].rule, "not_tls", "{r:?}");
        // A ClientHello naming another server.
        let mut req = connect("ok.test", w.port);
        req.extend_from_slice(&hello(Some("evil.test")));
        ask(&e, &req);
        let r = e.take_receipts();
        assert_eq!(
            (r[0].rule.as_str(), r[0].sni.as_deref()),
            ("sni_mismatch", Some("evil.test"))
        );
        // One naming none.
        let mut req = connect("ok.test", w.port);
        req.extend_from_slice(&hello(None));
        ask(&e, &req);
        let r = e.take_receipts();
        assert_eq!(r[0].rule, "sni_missing", "{r:?}");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            w.accepted.load(Ordering::SeqCst),
            0,
            "nothing was connected"
        );
    }

    /// A host that sends one byte every 100 ms for ever.
    fn dripping() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                std::thread::spawn(move || {
                    while c.write_all(b".").is_ok() {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                });
            }
        });
        port
    }

    #[test]
    fn a_slow_drip_is_cut_at_the_deadline_and_at_its_time_budget() {
        let port = dripping();
        for (extra, deadline, end) in [
            (
                "addresses = [\"127.0.0.0/8\"]",
                Duration::from_millis(1500),
                "deadline",
            ),
            (
                "addresses = [\"127.0.0.0/8\"]\nmax_connection_secs = 1",
                Duration::from_secs(30),
                "budget_time",
            ),
        ] {
            let resolver = Counting {
                calls: Arc::new(AtomicUsize::new(0)),
                answer: vec!["127.0.0.1".parse().unwrap()],
            };
            let e = Egress::with_resolver(
                Some(profile(extra, port)),
                "run-test",
                Instant::now() + deadline,
                Box::new(resolver),
            );
            let (ours, theirs) = UnixStream::pair().unwrap();
            let mut req = connect("ok.test", port);
            req.extend_from_slice(&hello(Some("ok.test")));
            (&ours).write_all(&req).unwrap();
            let started = Instant::now();
            // The code keeps its side open and reads: only the broker can end it.
            let reader = std::thread::spawn(move || {
                let mut sink = Vec::new();
                let _ = (&ours).read_to_end(&mut sink);
                sink.len()
            });
            e.serve(&theirs);
            drop(theirs);
            let held = started.elapsed();
            assert!(held < Duration::from_secs(5), "held {held:?}");
            assert!(
                reader.join().unwrap() > 45,
                "the bytes before the cut went through"
            );
            let r = e.take_receipts();
            assert_eq!(
                (r[0].verdict.as_str(), r[0].ended.as_deref()),
                ("allowed", Some(end)),
                "{r:?}"
            );
            let address = format!("127.0.0.1:{port}");
            assert_eq!(r[0].address.as_deref(), Some(address.as_str()));
            assert!(r[0].bytes_down > 0 && r[0].bytes_up > 0, "{r:?}");
        }
    }

    #[test]
    fn a_plain_request_without_a_host_header_is_refused() {
        let w = watched();
        let (e, resolved) = egress(profile("", w.port), &["127.0.0.1"]);
        let out = ask(
            &e,
            format!("GET http://ok.test:{}/ HTTP/1.1\r\n\r\n", w.port).as_bytes(),
        );
        refused_with(&e, &out, "bad_request");
        let out = ask(
            &e,
            format!(
                "GET http://127.1:{0}/ HTTP/1.1\r\nHost: 127.1:{0}\r\n\r\n",
                w.port
            )
            .as_bytes(),
        );
        refused_with(&e, &out, "ip_literal");
        assert_eq!(resolved.load(Ordering::SeqCst), 0);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(w.accepted.load(Ordering::SeqCst), 0);
    }

    /// A plain-HTTP origin: answers every request `200 ok`, framed by its length, and counts
    /// the requests it read.
    fn origin() -> (u16, Arc<AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let served = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&served);
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && c.read(&mut b).is_ok_and(|n| n == 1) {
                    head.push(b[0]);
                }
                count.fetch_add(1, Ordering::SeqCst);
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
            }
        });
        (port, served)
    }

    #[test]
    fn every_request_of_a_kept_alive_plain_connection_is_checked() {
        let (port, served) = origin();
        let (e, _) = egress(
            profile("addresses = [\"127.0.0.0/8\"]", port),
            &["127.0.0.1"],
        );
        // Two requests on one connection: the first to a listed host, the second not.
        let two = format!(
            "GET http://ok.test:{port}/a HTTP/1.1\r\nHost: ok.test:{port}\r\n\r\n\
             GET http://evil.test:{port}/b HTTP/1.1\r\nHost: evil.test:{port}\r\n\r\n"
        );
        let out = ask(&e, two.as_bytes());
        assert!(
            out.starts_with("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
            "{out}"
        );
        assert!(out.contains("X-Plimsoll-Egress: host_not_allowed"), "{out}");
        let r = e.take_receipts();
        let rules: Vec<(&str, &str)> = r
            .iter()
            .map(|x| (x.verdict.as_str(), x.rule.as_str()))
            .collect();
        assert_eq!(
            rules,
            [
                (
                    "allowed",
                    format!("host ok.test port {port} via 127.0.0.0/8").as_str()
                ),
                ("refused", "host_not_allowed"),
            ],
            "{r:?}"
        );
        assert_eq!(
            (r[0].kind.as_str(), r[0].ended.as_deref()),
            ("http", Some("closed"))
        );
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            served.load(Ordering::SeqCst),
            1,
            "only the listed request went out"
        );
    }

    #[test]
    fn budgets_refuse_and_list_once() {
        let w = watched();
        let (e, _) = egress(profile("max_connections = 2", w.port), &["127.0.0.1"]);
        for _ in 0..2 {
            ask(&e, &connect("evil.test", w.port));
        }
        for _ in 0..3 {
            let out = ask(&e, &connect("ok.test", w.port));
            assert!(out.contains("budget_connections"), "{out}");
        }
        let rules: Vec<String> = e.take_receipts().into_iter().map(|r| r.rule).collect();
        assert_eq!(
            rules,
            ["host_not_allowed", "host_not_allowed", "budget_connections"]
        );
    }

    #[test]
    fn without_an_egress_grant_every_attempt_is_refused_and_the_first_listed() {
        let e = Egress::new(None, "run-test", Instant::now() + Duration::from_secs(5));
        let out = ask(&e, &connect("ok.test", 443));
        refused_with(&e, &out, "no_egress_grant");
        for _ in 0..3 {
            let out = ask(&e, &connect("ok.test", 443));
            assert!(out.contains("X-Plimsoll-Egress: no_egress_grant"), "{out}");
        }
        assert!(e.take_receipts().is_empty(), "listed once, not again");
    }

    #[test]
    fn garbage_counts_against_the_budget() {
        let w = watched();
        let (e, _) = egress(profile("max_connections = 2", w.port), &["127.0.0.1"]);
        for _ in 0..5 {
            let out = ask(&e, b"\x16\x03\x01 not a request\r\n\r\n");
            assert!(out.starts_with("HTTP/1.1 403"), "{out}");
        }
        let rules: Vec<String> = e.take_receipts().into_iter().map(|r| r.rule).collect();
        assert_eq!(rules, ["bad_request", "bad_request", "budget_connections"]);
    }

    #[test]
    fn every_code_is_listed_and_documented() {
        let source = include_str!("proxy.rs");
        let doc = include_str!("../../../../docs/capability-grants.md");
        let quoted: Vec<&str> = source.split('"').skip(1).step_by(2).collect();
        for code in EGRESS_CODES {
            assert!(
                quoted.iter().filter(|q| *q == code).count() >= 2,
                "{code} is listed but never used"
            );
            assert!(
                doc.contains(&format!("| `{code}` |")),
                "docs/capability-grants.md does not explain `{code}`"
            );
        }
        for end in EGRESS_ENDS {
            assert!(
                doc.contains(&format!("`{end}`")),
                "docs/capability-grants.md does not explain `{end}`"
            );
        }
        for chunk in source.split(concat!("refused", "(")).skip(1) {
            if let Some(rest) = chunk.trim_start().strip_prefix('"') {
                let code = &rest[..rest.find('"').unwrap()];
                assert!(
                    EGRESS_CODES.contains(&code),
                    "`{code}` is not in EGRESS_CODES"
                );
            }
        }
    }
}
