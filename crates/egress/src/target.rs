//! Where a request wants to go: a host (a DNS name or an IP address) and a port, read from a
//! CONNECT authority, an absolute-form `http://` URI, a Host header or a TLS server name.
//!
//! The parsers are strict on purpose: anything two resolvers or URL parsers might read
//! differently is refused rather than guessed at, so the name a rule is checked against is the
//! name that gets resolved.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest DNS name, in bytes, without its trailing dot.
pub const MAX_NAME_LEN: usize = 253;
/// The longest label of a DNS name, in bytes.
pub const MAX_LABEL_LEN: usize = 63;

/// A host: a normalized DNS name or an IP address.
///
/// A name is lowercase ASCII without a trailing dot and is never a spelling of an IPv4
/// address (see [`parse_host`]). An address is canonical: an IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`) is held as the IPv4 address `a.b.c.d`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name, e.g. `example.com`.
    Name(String),
    /// An IP address.
    Ip(IpAddr),
}

impl Host {
    /// The name, when this is a name.
    pub fn name(&self) -> Option<&str> {
        match self {
            Host::Name(n) => Some(n),
            Host::Ip(_) => None,
        }
    }

    /// The address, when this is an address.
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Host::Name(_) => None,
            Host::Ip(ip) => Some(*ip),
        }
    }
}

impl fmt::Display for Host {
    /// The name, the dotted IPv4 address, or the IPv6 address in brackets (`[::1]`), so the
    /// text can be followed by `:port` and parse back with [`parse_authority`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
        }
    }
}

/// A host and a port: where a connection goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// The host.
    pub host: Host,
    /// The port, never 0.
    pub port: u16,
}

impl fmt::Display for Target {
    /// `host:port`, with an IPv6 address in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Why a host, an authority or a request URI was refused. Every message says what to send
/// instead. Texts from the request are quoted with escapes and cut to 256 bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// No host at all.
    #[error("no host: send a DNS name such as example.com")]
    EmptyHost,
    /// A `%` in the host.
    #[error(
        "host {host:?} is percent-encoded: send the name itself in ASCII (punycode for international names)"
    )]
    PercentEncoded {
        /// The host as sent.
        host: String,
    },
    /// `user@` before the host.
    #[error(
        "{authority:?} carries user information (`user@`): send the host and port alone, and credentials in a header"
    )]
    Userinfo {
        /// The authority as sent.
        authority: String,
    },
    /// A byte no DNS name has (an underscore, a space, a control byte, non-ASCII...).
    #[error(
        "host {host:?} has {found:?}, which no DNS name has: send ASCII letters, digits, hyphens and dots (punycode for international names)"
    )]
    BadCharacter {
        /// The host as sent.
        host: String,
        /// The first character refused.
        found: char,
    },
    /// An empty label: `..`, or a leading dot, or two trailing dots.
    #[error("host {host:?} has an empty label: send the name without `..` or a leading dot")]
    EmptyLabel {
        /// The host as sent.
        host: String,
    },
    /// A label longer than 63 bytes.
    #[error("host {host:?} has a label of {len} bytes: DNS labels are 1 to 63 bytes")]
    LabelTooLong {
        /// The host as sent.
        host: String,
        /// The label's length.
        len: usize,
    },
    /// A name longer than 253 bytes.
    #[error("host {host:?} is {len} bytes long: DNS names are at most 253 bytes")]
    NameTooLong {
        /// The host as sent.
        host: String,
        /// The name's length, without a trailing dot.
        len: usize,
    },
    /// A label that starts or ends with `-`.
    #[error("host {host:?} has a label that starts or ends with a hyphen: no DNS name does")]
    HyphenAtLabelEdge {
        /// The host as sent.
        host: String,
    },
    /// A name that resolvers read as an IPv4 address but that is not the plain dotted-quad
    /// spelling (`127.1`, `0x7f.0.0.1`, `017700000001`, `2130706433`, `010.0.0.1`,
    /// `1.2.3.4.5`...). See [`parse_host`] for the rule.
    #[error(
        "host {host:?} is an IPv4 address in an unusual spelling{}: write an address as four decimal numbers 0 to 255 without leading zeros, e.g. 192.0.2.1",
        reads_as_note(.reads_as)
    )]
    NonCanonicalIpv4 {
        /// The host as sent.
        host: String,
        /// The address a C resolver (`inet_aton`) reads it as, if any.
        reads_as: Option<Ipv4Addr>,
    },
    /// Brackets around something that is not an IPv6 address, or a zone id.
    #[error(
        "{host:?} is not an IPv6 address: write one in brackets without a zone, e.g. [2001:db8::1]"
    )]
    BadIpv6 {
        /// The host as sent.
        host: String,
    },
    /// An IPv6 address without brackets before a port.
    #[error("{authority:?} has an IPv6 address without brackets: write it as [2001:db8::1]:443")]
    UnbracketedIpv6 {
        /// The authority as sent.
        authority: String,
    },
    /// No port where one is needed.
    #[error("{authority:?} has no port: send host:port, e.g. example.com:443")]
    MissingPort {
        /// The authority as sent.
        authority: String,
    },
    /// A port that is not a decimal number 1 to 65535.
    #[error(
        "the port of {authority:?} is not a decimal number 1 to 65535 without leading zeros: send host:port, e.g. example.com:443"
    )]
    BadPort {
        /// The authority as sent.
        authority: String,
    },
    /// Port 0.
    #[error("{authority:?} names port 0, which no server listens on: send a port 1 to 65535")]
    PortZero {
        /// The authority as sent.
        authority: String,
    },
    /// A request target that is not an absolute URI (`/path`, `*`, `example.com/`...).
    #[error(
        "{uri:?} is not an absolute http:// URI: a request to a proxy names its host, e.g. GET http://example.com/ HTTP/1.1"
    )]
    NotAbsoluteUri {
        /// The URI as sent.
        uri: String,
    },
    /// An `https://` URI in a plain request.
    #[error(
        "{uri:?} asks the proxy to speak TLS for you: send CONNECT host:443 and speak TLS through the tunnel"
    )]
    HttpsAbsoluteForm {
        /// The URI as sent.
        uri: String,
    },
    /// A scheme other than `http` or `https`.
    #[error("scheme {scheme:?} is not served: send http:// requests, or CONNECT for TLS")]
    UnsupportedScheme {
        /// The scheme as sent.
        scheme: String,
    },
    /// A `#fragment` in a request target.
    #[error("{uri:?} has a #fragment, which never goes in a request: drop it")]
    Fragment {
        /// The URI as sent.
        uri: String,
    },
    /// A path or query byte outside visible ASCII.
    #[error(
        "the path of {uri:?} has a byte outside visible ASCII: percent-encode spaces, controls and non-ASCII"
    )]
    BadPath {
        /// The URI as sent.
        uri: String,
    },
}

impl TargetError {
    /// True when the host was refused because it is a spelling of an IP address (the caller
    /// refuses it where only names are allowed, as in a TLS server name). A canonical address
    /// is not an error: [`parse_host`] returns it as [`Host::Ip`].
    pub fn is_ip_literal(&self) -> bool {
        matches!(self, TargetError::NonCanonicalIpv4 { .. })
    }
}

fn reads_as_note(reads_as: &Option<Ipv4Addr>) -> String {
    match reads_as {
        Some(a) => format!(" (a resolver reads it as {a})"),
        None => String::new(),
    }
}

/// Request text kept in an error: at most 256 bytes, cut at a character boundary.
pub(crate) fn clip(s: &str) -> String {
    const MAX: usize = 256;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Parses a host: a DNS name or an IP address.
///
/// - `[v6]` (and a bare IPv6 address) is [`Host::Ip`]; a zone id (`%eth0`) is refused.
///   An IPv4-mapped address `[::ffff:a.b.c.d]` becomes the IPv4 address.
/// - A name is ASCII letters, digits, hyphens and dots: one trailing dot is removed, the
///   rest lowercased; labels are 1 to 63 bytes and neither start nor end with `-`; the name
///   is at most 253 bytes. Anything else (`%`, `@`, `_`, spaces, controls, non-ASCII) is an
///   error.
/// - **IP-literal rule**: a name whose last label is all decimal digits, or `0x` followed by
///   hex digits, is a spelling of an IPv4 address (that is how `inet_aton`, browsers and the
///   WHATWG URL standard read it, and no real top-level domain looks like that; it covers
///   every name whose labels are all numeric or hex-numeric). The plain dotted quad
///   (`192.0.2.1`: four decimal numbers 0 to 255 without leading zeros) is [`Host::Ip`];
///   every other such spelling (`127.1`, `0x7f.0.0.1`, `017700000001`, `2130706433`,
///   `010.0.0.1`, `1.2.3.4.5`) is [`TargetError::NonCanonicalIpv4`], since resolvers
///   disagree on what some of them mean.
pub fn parse_host(s: &str) -> Result<Host, TargetError> {
    if s.is_empty() {
        return Err(TargetError::EmptyHost);
    }
    if let Some(inner) = s.strip_prefix('[') {
        return inner
            .strip_suffix(']')
            .and_then(|a| a.parse::<Ipv6Addr>().ok())
            .map(|a| Host::Ip(IpAddr::V6(a).to_canonical()))
            .ok_or_else(|| TargetError::BadIpv6 { host: clip(s) });
    }
    if let Ok(a) = s.parse::<Ipv6Addr>() {
        return Ok(Host::Ip(IpAddr::V6(a).to_canonical()));
    }
    if let Some(found) = s
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || c == '-' || c == '.'))
    {
        let host = clip(s);
        return Err(match found {
            '%' => TargetError::PercentEncoded { host },
            '@' => TargetError::Userinfo { authority: host },
            _ => TargetError::BadCharacter { host, found },
        });
    }
    let lower = s.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if name.is_empty() {
        return Err(TargetError::EmptyLabel { host: clip(s) });
    }
    if name.len() > MAX_NAME_LEN {
        return Err(TargetError::NameTooLong {
            host: clip(s),
            len: name.len(),
        });
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(TargetError::EmptyLabel { host: clip(s) });
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(TargetError::LabelTooLong {
                host: clip(s),
                len: label.len(),
            });
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(TargetError::HyphenAtLabelEdge { host: clip(s) });
        }
    }
    let last = name.rsplit('.').next().unwrap_or(name);
    if is_numeric_label(last) {
        return match name.parse::<Ipv4Addr>() {
            Ok(a) => Ok(Host::Ip(IpAddr::V4(a))),
            Err(_) => Err(TargetError::NonCanonicalIpv4 {
                host: clip(s),
                reads_as: inet_aton(name),
            }),
        };
    }
    Ok(Host::Name(name.to_owned()))
}

/// All decimal digits, or `0x` and hex digits (lowercase input).
fn is_numeric_label(label: &str) -> bool {
    match label.strip_prefix("0x") {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// The address the C library's `inet_aton` reads `s` as: one to four parts, each decimal,
/// octal (a leading `0`) or hex (`0x`); the last part fills the remaining bytes.
fn inet_aton(s: &str) -> Option<Ipv4Addr> {
    let parts = s
        .split('.')
        .map(|p| {
            let (digits, radix) = if let Some(h) = p.strip_prefix("0x") {
                (h, 16)
            } else if p.len() > 1 && p.starts_with('0') {
                (&p[1..], 8)
            } else {
                (p, 10)
            };
            if digits.is_empty() {
                // `0x` alone is 0 to inet_aton; an empty part is an error.
                return (radix == 16).then_some(0);
            }
            if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            u64::from_str_radix(digits, radix).ok()
        })
        .collect::<Option<Vec<u64>>>()?;
    let (last, init) = parts.split_last()?;
    if init.len() > 3 || init.iter().any(|&p| p > 255) {
        return None;
    }
    let bits = 32 - 8 * init.len() as u32;
    if *last >= 1u64 << bits {
        return None;
    }
    let high = init
        .iter()
        .enumerate()
        .fold(0u64, |acc, (i, &p)| acc | p << (24 - 8 * i as u32));
    u32::try_from(high | last).ok().map(Ipv4Addr::from)
}

/// Parses an authority, `host:port` or `[v6]:port` (as in `CONNECT host:port` or a Host
/// header), with the host read by [`parse_host`].
///
/// Without a port, `default_port` is used, or [`TargetError::MissingPort`] when it is `None`.
/// The port is a decimal number 1 to 65535 without leading zeros; `host:` (an empty port) is
/// refused. User information (`user@host`) is refused.
pub fn parse_authority(s: &str, default_port: Option<u16>) -> Result<Target, TargetError> {
    if s.is_empty() {
        return Err(TargetError::EmptyHost);
    }
    if s.contains('@') {
        return Err(TargetError::Userinfo { authority: clip(s) });
    }
    let (host, port) = if s.starts_with('[') {
        let close = s
            .find(']')
            .ok_or_else(|| TargetError::BadIpv6 { host: clip(s) })?;
        let (host, rest) = s.split_at(close + 1);
        match rest {
            "" => (host, None),
            _ => match rest.strip_prefix(':') {
                Some(p) => (host, Some(p)),
                None => return Err(TargetError::BadPort { authority: clip(s) }),
            },
        }
    } else {
        match s.split_once(':') {
            None => (s, None),
            Some((_, p)) if p.contains(':') => {
                return Err(TargetError::UnbracketedIpv6 { authority: clip(s) });
            }
            Some((h, p)) => (h, Some(p)),
        }
    };
    let port = match port {
        Some(p) => parse_port(p, s)?,
        None => default_port.ok_or_else(|| TargetError::MissingPort { authority: clip(s) })?,
    };
    Ok(Target {
        host: parse_host(host)?,
        port,
    })
}

fn parse_port(p: &str, authority: &str) -> Result<u16, TargetError> {
    let bad = || TargetError::BadPort {
        authority: clip(authority),
    };
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    if p == "0" {
        return Err(TargetError::PortZero {
            authority: clip(authority),
        });
    }
    if p.starts_with('0') {
        return Err(bad());
    }
    p.parse::<u16>().map_err(|_| bad())
}

/// Parses an absolute-form request target, `http://authority/path?query`, into its target
/// (port 80 unless the authority names one) and the origin-form path to send upstream: the
/// path and query, `/` when the path is empty (`http://h?q` gives `/?q`).
///
/// The scheme is `http` in any case. `https://` is [`TargetError::HttpsAbsoluteForm`]
/// (TLS goes through CONNECT); other schemes, a `#fragment`, and path bytes outside visible
/// ASCII (`!` to `~`) are refused. The authority is read by [`parse_authority`].
pub fn parse_absolute_uri(s: &str) -> Result<(Target, String), TargetError> {
    let not_absolute = || TargetError::NotAbsoluteUri { uri: clip(s) };
    let (scheme, rest) = s.split_once("://").ok_or_else(not_absolute)?;
    let scheme_ok = scheme
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !scheme_ok {
        return Err(not_absolute());
    }
    if scheme.eq_ignore_ascii_case("https") {
        return Err(TargetError::HttpsAbsoluteForm { uri: clip(s) });
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(TargetError::UnsupportedScheme {
            scheme: clip(scheme),
        });
    }
    if s.contains('#') {
        return Err(TargetError::Fragment { uri: clip(s) });
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let target = parse_authority(authority, Some(80))?;
    if !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(TargetError::BadPath { uri: clip(s) });
    }
    let path = match path.as_bytes().first() {
        None => "/".to_owned(),
        Some(b'?') => format!("/{path}"),
        Some(_) => path.to_owned(),
    };
    Ok((target, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Host {
        Host::Name(s.to_owned())
    }

    fn v4(s: &str) -> Host {
        Host::Ip(IpAddr::V4(s.parse().unwrap()))
    }

    fn v6(s: &str) -> Host {
        Host::Ip(IpAddr::V6(s.parse().unwrap()))
    }

    #[test]
    fn names_are_lowercased_and_lose_one_trailing_dot() {
        assert_eq!(parse_host("Example.COM").unwrap(), name("example.com"));
        assert_eq!(parse_host("example.com.").unwrap(), name("example.com"));
        assert_eq!(parse_host("localhost").unwrap(), name("localhost"));
        assert_eq!(parse_host("a-b.c0.x").unwrap(), name("a-b.c0.x"));
        assert_eq!(
            parse_host("xn--bcher-kva.example").unwrap(),
            name("xn--bcher-kva.example")
        );
        assert!(matches!(
            parse_host("example.com.."),
            Err(TargetError::EmptyLabel { .. })
        ));
        assert!(matches!(
            parse_host("."),
            Err(TargetError::EmptyLabel { .. })
        ));
    }

    #[test]
    fn empty_labels_are_refused() {
        for s in [".example.com", "example..com", "a..b"] {
            assert!(
                matches!(parse_host(s), Err(TargetError::EmptyLabel { .. })),
                "{s}"
            );
        }
        assert_eq!(parse_host(""), Err(TargetError::EmptyHost));
    }

    #[test]
    fn label_and_name_lengths_are_limited() {
        let l63 = "a".repeat(63);
        assert!(parse_host(&format!("{l63}.com")).is_ok());
        let l64 = "a".repeat(64);
        assert!(matches!(
            parse_host(&format!("{l64}.com")),
            Err(TargetError::LabelTooLong { len: 64, .. })
        ));
        // 4 labels of 63 with dots: 255 bytes; 3 of 63 and one of 61: 253.
        let n253 = format!("{l63}.{l63}.{l63}.{}", "a".repeat(61));
        assert_eq!(n253.len(), 253);
        assert!(parse_host(&n253).is_ok());
        assert!(
            parse_host(&format!("{n253}.")).is_ok(),
            "the trailing dot is not counted"
        );
        let n254 = format!("{l63}.{l63}.{l63}.{}", "a".repeat(62));
        assert!(matches!(
            parse_host(&n254),
            Err(TargetError::NameTooLong { len: 254, .. })
        ));
        let n255 = format!("{l63}.{l63}.{l63}.{l63}");
        assert!(matches!(
            parse_host(&n255),
            Err(TargetError::NameTooLong { len: 255, .. })
        ));
    }

    #[test]
    fn hyphens_at_label_edges_are_refused() {
        for s in ["-a.com", "a-.com", "a.-com", "a.com-"] {
            assert!(
                matches!(parse_host(s), Err(TargetError::HyphenAtLabelEdge { .. })),
                "{s}"
            );
        }
    }

    #[test]
    fn bytes_outside_names_are_refused() {
        assert!(matches!(
            parse_host("ex%61mple.com"),
            Err(TargetError::PercentEncoded { .. })
        ));
        assert!(matches!(
            parse_host("user@example.com"),
            Err(TargetError::Userinfo { .. })
        ));
        for (s, c) in [
            ("under_score.com", '_'),
            ("a b.com", ' '),
            ("a\tb.com", '\t'),
            ("a\0b", '\0'),
            ("a\r\nb", '\r'),
            ("bücher.de", 'ü'),
            ("a/b", '/'),
            ("a\\b", '\\'),
            ("a*.com", '*'),
            ("example.com:80", ':'),
        ] {
            assert_eq!(
                parse_host(s),
                Err(TargetError::BadCharacter {
                    host: s.to_owned(),
                    found: c
                }),
                "{s:?}"
            );
        }
    }

    #[test]
    fn dotted_quads_are_addresses() {
        assert_eq!(parse_host("192.0.2.1").unwrap(), v4("192.0.2.1"));
        assert_eq!(parse_host("127.0.0.1.").unwrap(), v4("127.0.0.1"));
        assert_eq!(parse_host("0.0.0.0").unwrap(), v4("0.0.0.0"));
    }

    #[test]
    fn odd_ipv4_spellings_are_ip_literals() {
        let lo = Some(Ipv4Addr::LOCALHOST);
        for (s, reads_as) in [
            ("127.1", lo),
            ("0x7f.0.0.1", lo),
            ("0X7F.0.0.1", lo),
            ("017700000001", lo),
            ("2130706433", lo),
            ("0x7f000001", lo),
            ("127.0.1", lo),
            ("0177.0.0.1", lo),
            ("010.0.0.1", Some(Ipv4Addr::new(8, 0, 0, 1))),
            ("1.2.3.4.5", None),
            ("256.0.0.1", None),
            ("4294967296", None),
            ("09.0.0.1", None),
            ("foo.123", None),
            ("foo.0x1", None),
            ("0x", Some(Ipv4Addr::UNSPECIFIED)),
            ("1-2.3", None),
        ] {
            let e = parse_host(s).unwrap_err();
            assert!(e.is_ip_literal(), "{s}: {e}");
            assert_eq!(
                e,
                TargetError::NonCanonicalIpv4 {
                    host: s.to_owned(),
                    reads_as
                },
                "{s}"
            );
        }
        // Hex-looking labels without `0x`, and a numeric label that is not the last, are
        // names: no resolver reads them as addresses.
        assert_eq!(parse_host("deadbeef").unwrap(), name("deadbeef"));
        assert_eq!(parse_host("1.example.com").unwrap(), name("1.example.com"));
        assert_eq!(parse_host("123.7f").unwrap(), name("123.7f"));
        assert_eq!(parse_host("0xg").unwrap(), name("0xg"));
    }

    #[test]
    fn the_ip_literal_message_says_what_it_reads_as() {
        let msg = parse_host("127.1").unwrap_err().to_string();
        assert!(msg.contains("127.0.0.1"), "{msg}");
        assert!(msg.contains("192.0.2.1"), "{msg}");
    }

    #[test]
    fn ipv6_in_brackets_or_bare() {
        assert_eq!(parse_host("[::1]").unwrap(), v6("::1"));
        assert_eq!(parse_host("[2001:DB8::1]").unwrap(), v6("2001:db8::1"));
        assert_eq!(parse_host("2001:db8::1").unwrap(), v6("2001:db8::1"));
        for s in [
            "[::1",
            "[]",
            "[example.com]",
            "[fe80::1%eth0]",
            "[::1]x",
            "[1.2.3.4]",
        ] {
            assert!(
                matches!(parse_host(s), Err(TargetError::BadIpv6 { .. })),
                "{s}"
            );
        }
    }

    #[test]
    fn ipv4_mapped_ipv6_is_the_ipv4_address() {
        assert_eq!(parse_host("[::ffff:127.0.0.1]").unwrap(), v4("127.0.0.1"));
        assert_eq!(parse_host("::ffff:7f00:1").unwrap(), v4("127.0.0.1"));
        // IPv4-compatible (deprecated) is not mapped: it stays IPv6.
        assert_eq!(parse_host("[::127.0.0.1]").unwrap(), v6("::127.0.0.1"));
    }

    #[test]
    fn host_display_brackets_ipv6() {
        assert_eq!(v6("::1").to_string(), "[::1]");
        assert_eq!(v4("10.0.0.1").to_string(), "10.0.0.1");
        assert_eq!(name("example.com").to_string(), "example.com");
        let t = Target {
            host: v6("2001:db8::1"),
            port: 443,
        };
        assert_eq!(t.to_string(), "[2001:db8::1]:443");
        assert_eq!(parse_authority(&t.to_string(), None).unwrap(), t);
    }

    #[test]
    fn authorities() {
        let t = parse_authority("Example.com:443", None).unwrap();
        assert_eq!(t.host, name("example.com"));
        assert_eq!(t.port, 443);
        assert_eq!(parse_authority("example.com", Some(80)).unwrap().port, 80);
        assert_eq!(parse_authority("[::1]:8080", None).unwrap().host, v6("::1"));
        assert_eq!(parse_authority("[::1]", Some(80)).unwrap().port, 80);
        assert_eq!(
            parse_authority("example.com:65535", None).unwrap().port,
            65535
        );
        assert_eq!(
            parse_authority("example.com.:1", None).unwrap().host,
            name("example.com")
        );
    }

    #[test]
    fn a_missing_port_needs_a_default() {
        assert!(matches!(
            parse_authority("example.com", None),
            Err(TargetError::MissingPort { .. })
        ));
        assert!(matches!(
            parse_authority("[::1]", None),
            Err(TargetError::MissingPort { .. })
        ));
    }

    #[test]
    fn bad_ports_are_refused() {
        for s in [
            "example.com:",
            "example.com:65536",
            "example.com:+443",
            "example.com:-1",
            "example.com:0443",
            "example.com:443 ",
            "example.com:4a",
            "example.com:999999",
            "[::1]:",
            "[::1]x",
            "[::1]:80:",
        ] {
            assert!(
                matches!(
                    parse_authority(s, Some(80)),
                    Err(TargetError::BadPort { .. })
                ),
                "{s}"
            );
        }
        assert!(matches!(
            parse_authority("example.com:0", None),
            Err(TargetError::PortZero { .. })
        ));
        assert!(matches!(
            parse_authority("[::1]:0", None),
            Err(TargetError::PortZero { .. })
        ));
    }

    #[test]
    fn authorities_refuse_userinfo_and_bare_ipv6() {
        for s in ["user@example.com:443", "user:pw@example.com:443", "a@b"] {
            assert!(
                matches!(
                    parse_authority(s, Some(1)),
                    Err(TargetError::Userinfo { .. })
                ),
                "{s}"
            );
        }
        assert!(matches!(
            parse_authority("::1:443", None),
            Err(TargetError::UnbracketedIpv6 { .. })
        ));
        assert!(matches!(
            parse_authority("", Some(1)),
            Err(TargetError::EmptyHost)
        ));
        assert!(matches!(
            parse_authority(":443", None),
            Err(TargetError::EmptyHost)
        ));
        assert!(matches!(
            parse_authority("127.1:80", None),
            Err(TargetError::NonCanonicalIpv4 { .. })
        ));
    }

    #[test]
    fn absolute_uris() {
        let (t, p) = parse_absolute_uri("http://Example.com/a/b?c=d").unwrap();
        assert_eq!(t.host, name("example.com"));
        assert_eq!(t.port, 80);
        assert_eq!(p, "/a/b?c=d");
        let (t, p) = parse_absolute_uri("HTTP://example.com:8080").unwrap();
        assert_eq!(t.port, 8080);
        assert_eq!(p, "/");
        let (_, p) = parse_absolute_uri("http://example.com?q").unwrap();
        assert_eq!(p, "/?q");
        let (t, p) = parse_absolute_uri("http://[::1]:81/x").unwrap();
        assert_eq!(
            t,
            Target {
                host: v6("::1"),
                port: 81
            }
        );
        assert_eq!(p, "/x");
    }

    #[test]
    fn absolute_uris_refuse_other_forms() {
        for s in [
            "/path",
            "*",
            "example.com:80",
            "http:/x",
            "http:example.com",
            "://x",
            "1http://x",
        ] {
            assert!(
                matches!(
                    parse_absolute_uri(s),
                    Err(TargetError::NotAbsoluteUri { .. })
                ),
                "{s}"
            );
        }
        for s in ["https://example.com/", "HTTPS://example.com"] {
            assert!(
                matches!(
                    parse_absolute_uri(s),
                    Err(TargetError::HttpsAbsoluteForm { .. })
                ),
                "{s}"
            );
        }
        assert!(matches!(
            parse_absolute_uri("ftp://example.com/"),
            Err(TargetError::UnsupportedScheme { .. })
        ));
        assert!(matches!(
            parse_absolute_uri("http://example.com/#x"),
            Err(TargetError::Fragment { .. })
        ));
        assert!(matches!(
            parse_absolute_uri("http://example.com#x"),
            Err(TargetError::Fragment { .. })
        ));
        for s in [
            "http://example.com/a b",
            "http://example.com/\u{7f}",
            "http://example.com/é",
        ] {
            assert!(
                matches!(parse_absolute_uri(s), Err(TargetError::BadPath { .. })),
                "{s}"
            );
        }
        assert!(matches!(
            parse_absolute_uri("http://user@example.com/"),
            Err(TargetError::Userinfo { .. })
        ));
        // A backslash never ends the authority here (WHATWG reads it as `/`): it is refused.
        assert!(matches!(
            parse_absolute_uri("http://evil.example\\@good.example/"),
            Err(TargetError::Userinfo { .. })
        ));
        assert!(matches!(
            parse_absolute_uri("http://evil.example\\.good.example/"),
            Err(TargetError::BadCharacter { found: '\\', .. })
        ));
        assert!(matches!(
            parse_absolute_uri("http:///x"),
            Err(TargetError::EmptyHost)
        ));
        assert!(matches!(
            parse_absolute_uri("http://0x7f.1/"),
            Err(TargetError::NonCanonicalIpv4 { .. })
        ));
    }

    #[test]
    fn long_request_text_is_clipped_in_errors() {
        let long = format!("{}é{}", "a".repeat(255), "_".repeat(10_000));
        let msg = parse_host(&long).unwrap_err().to_string();
        assert!(msg.len() < 600, "{}", msg.len());
    }
}
