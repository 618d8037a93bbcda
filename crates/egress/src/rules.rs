//! The operator's rules: which names a profile allows ([`HostPattern`]), which address ranges
//! beyond public ones it allows ([`Cidr`]), and what kind of address a resolved address is
//! ([`classify`], [`check_address`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::target::{Host, TargetError, clip, parse_host};

/// A host pattern of an egress profile: one name, or every name below a suffix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// `example.com`: that name alone.
    Exact(String),
    /// `*.example.com` (held as `example.com`): any name with at least one more label below
    /// the suffix (`a.example.com`, `a.b.example.com`), never `example.com` itself.
    Suffix(String),
}

/// Why a host pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostPatternError {
    /// A `*` anywhere but a leading `*.`.
    #[error(
        "pattern {pattern:?}: the only wildcard is a leading `*.`; write example.com or *.example.com"
    )]
    Wildcard {
        /// The pattern as written.
        pattern: String,
    },
    /// An address (or a spelling of one) where a name belongs.
    #[error("pattern {pattern:?} is an IP address, not a name: list address ranges as addresses")]
    IpLiteral {
        /// The pattern as written.
        pattern: String,
    },
    /// Not a valid DNS name.
    #[error(transparent)]
    Name(TargetError),
}

impl HostPattern {
    /// Parses `example.com` or `*.example.com`. The name (or suffix) is validated and
    /// normalized by [`parse_host`] (lowercased, one trailing dot removed); an IP address or
    /// any spelling of one is refused, and `*` is allowed only as a leading `*.`.
    pub fn parse(s: &str) -> Result<HostPattern, HostPatternError> {
        let (suffix, rest) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        if rest.contains('*') {
            return Err(HostPatternError::Wildcard { pattern: clip(s) });
        }
        let name = match parse_host(rest) {
            Ok(Host::Name(n)) => n,
            Ok(Host::Ip(_)) => return Err(HostPatternError::IpLiteral { pattern: clip(s) }),
            Err(e) if e.is_ip_literal() => {
                return Err(HostPatternError::IpLiteral { pattern: clip(s) });
            }
            Err(e) => return Err(HostPatternError::Name(e)),
        };
        Ok(if suffix {
            HostPattern::Suffix(name)
        } else {
            HostPattern::Exact(name)
        })
    }

    /// True when `name` (already normalized, as [`parse_host`] returns it) is allowed.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            HostPattern::Exact(n) => name == n,
            HostPattern::Suffix(s) => {
                name.len() > s.len() + 1
                    && name.ends_with(s.as_str())
                    && name.as_bytes()[name.len() - s.len() - 1] == b'.'
            }
        }
    }

    /// True when `host` is a name this pattern matches (an address never matches).
    pub fn matches_host(&self, host: &Host) -> bool {
        host.name().is_some_and(|n| self.matches(n))
    }
}

impl fmt::Display for HostPattern {
    /// The written form, normalized: `example.com` or `*.example.com`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(n) => f.write_str(n),
            HostPattern::Suffix(s) => write!(f, "*.{s}"),
        }
    }
}

/// An address range: an address and a prefix length.
///
/// An IPv4-mapped IPv6 range (`::ffff:10.0.0.0/104`) is held as the IPv4 range
/// (`10.0.0.0/8`). An IPv6 range never holds an IPv4 address, even one whose prefix covers
/// `::ffff:0:0/96` (`::/0` does not allow IPv4): write IPv4 ranges for IPv4 addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// Why an address range was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// Not an IPv4 dotted quad or an IPv6 address.
    #[error(
        "{text:?} is not an address range: write an address and a prefix length, e.g. 10.0.0.0/8 or fd00::/8"
    )]
    BadAddress {
        /// The range as written.
        text: String,
    },
    /// A prefix length that is not a decimal number up to 32 (IPv4) or 128 (IPv6).
    #[error("{text:?}: the prefix length must be a decimal number 0 to {max}")]
    BadPrefix {
        /// The range as written.
        text: String,
        /// The longest prefix for the address family.
        max: u8,
    },
    /// Bits set after the prefix (`10.0.0.1/8`): most likely a typo, so refused.
    #[error(
        "{text:?} has address bits set after its prefix: write {network} for the range, or a /32 or /128 for one address"
    )]
    HostBitsSet {
        /// The range as written.
        text: String,
        /// The range it would be with those bits cleared.
        network: Cidr,
    },
}

impl Cidr {
    /// Parses `10.0.0.0/8`, `127.0.0.1/32`, `::1/128`, `fd00::/8`, or a bare address
    /// (`/32` or `/128`). The IPv4 address is a plain dotted quad (no `127.1` or octal);
    /// the prefix is decimal without leading zeros. **A range with address bits set after its
    /// prefix (`10.0.0.1/8`) is refused** with [`CidrError::HostBitsSet`], naming the range
    /// the operator probably meant. IPv4-mapped ranges with a prefix of at least 96 become
    /// IPv4 ranges.
    pub fn parse(s: &str) -> Result<Cidr, CidrError> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = if addr.contains(':') {
            addr.parse::<Ipv6Addr>().map(IpAddr::V6)
        } else {
            addr.parse::<Ipv4Addr>().map(IpAddr::V4)
        }
        .map_err(|_| CidrError::BadAddress { text: clip(s) })?;
        let max = max_prefix(addr);
        let prefix = match prefix {
            None => max,
            Some(p) => {
                let ok = !p.is_empty()
                    && p.len() <= 3
                    && p.bytes().all(|b| b.is_ascii_digit())
                    && (p == "0" || !p.starts_with('0'));
                match p.parse::<u8>() {
                    Ok(n) if ok && n <= max => n,
                    _ => return Err(CidrError::BadPrefix { text: clip(s), max }),
                }
            }
        };
        let network = Cidr {
            addr: mask(addr, prefix),
            prefix,
        };
        if network.addr != addr {
            return Err(CidrError::HostBitsSet {
                text: clip(s),
                network: network.canonical(),
            });
        }
        Ok(network.canonical())
    }

    /// An IPv4-mapped range with a prefix of at least 96 as the IPv4 range.
    fn canonical(self) -> Cidr {
        match self.addr {
            IpAddr::V6(a) if self.prefix >= 96 => match a.to_ipv4_mapped() {
                Some(v4) => Cidr {
                    addr: IpAddr::V4(v4),
                    prefix: self.prefix - 96,
                },
                None => self,
            },
            _ => self,
        }
    }

    /// The first address of the range.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// True when `ip` is in the range. An IPv4-mapped IPv6 address is checked as its IPv4
    /// address; NAT64 and 6to4 addresses are checked as written (see [`classify`] for how
    /// their class is read).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let same_family = ip.is_ipv4() == self.addr.is_ipv4();
        same_family && mask(ip, self.prefix) == self.addr
    }
}

impl fmt::Display for Cidr {
    /// `address/prefix`, e.g. `10.0.0.0/8` or `fd00::/8`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn max_prefix(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

/// `addr` with every bit after the first `prefix` cleared.
fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
        }
    }
}

/// What kind of address an address is. Only [`AddressClass::Public`] may be reached without
/// an explicit allowed range ([`check_address`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddressClass {
    /// Globally routable unicast.
    Public,
    /// `0.0.0.0`, `::` (Linux connects them to the local host).
    Unspecified,
    /// `0.0.0.0/8` other than `0.0.0.0`.
    ThisNetwork,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`; unique-local `fc00::/7` and the
    /// deprecated site-local `fec0::/10`.
    Private,
    /// Carrier-grade NAT, `100.64.0.0/10`.
    SharedCgnat,
    /// `169.254.0.0/16` (where cloud metadata services live), `fe80::/10`.
    LinkLocal,
    /// IETF protocol assignments: `192.0.0.0/24`, `2001::/23` (Teredo, ORCHID...).
    IetfProtocol,
    /// `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// `198.18.0.0/15`, `2001:2::/48`.
    Benchmarking,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// The IPv6 discard prefix `100::/64`.
    Discard,
    /// Everything else that is not public: `240.0.0.0/4`, the old 6to4 relay
    /// `192.88.99.0/24`, and IPv6 outside `2000::/3` not named above (IPv4-compatible
    /// `::/96`, local-use NAT64 `64:ff9b:1::/48`, `5f00::/16`...).
    Reserved,
}

impl AddressClass {
    /// Every class.
    pub const ALL: [AddressClass; 14] = [
        AddressClass::Public,
        AddressClass::Unspecified,
        AddressClass::ThisNetwork,
        AddressClass::Loopback,
        AddressClass::Private,
        AddressClass::SharedCgnat,
        AddressClass::LinkLocal,
        AddressClass::IetfProtocol,
        AddressClass::Documentation,
        AddressClass::Benchmarking,
        AddressClass::Multicast,
        AddressClass::Broadcast,
        AddressClass::Discard,
        AddressClass::Reserved,
    ];

    /// A stable code for records and logs: `public`, `loopback`, `private`...
    pub fn code(self) -> &'static str {
        match self {
            AddressClass::Public => "public",
            AddressClass::Unspecified => "unspecified",
            AddressClass::ThisNetwork => "this-network",
            AddressClass::Loopback => "loopback",
            AddressClass::Private => "private",
            AddressClass::SharedCgnat => "shared-cgnat",
            AddressClass::LinkLocal => "link-local",
            AddressClass::IetfProtocol => "ietf-protocol",
            AddressClass::Documentation => "documentation",
            AddressClass::Benchmarking => "benchmarking",
            AddressClass::Multicast => "multicast",
            AddressClass::Broadcast => "broadcast",
            AddressClass::Discard => "discard",
            AddressClass::Reserved => "reserved",
        }
    }

    /// True for [`AddressClass::Public`].
    pub fn is_public(self) -> bool {
        self == AddressClass::Public
    }
}

impl fmt::Display for AddressClass {
    /// The [`code`](AddressClass::code).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// The class of an address.
///
/// IPv6 addresses that carry an IPv4 address are classed by it: IPv4-mapped
/// `::ffff:0:0/96`, NAT64 `64:ff9b::/96` and 6to4 `2002::/16` (so `64:ff9b::7f00:1` is
/// loopback, and `2002:0808:0808::1` public). Only IPv6 in `2000::/3` can be public.
pub fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(a) => classify_v4(a),
        IpAddr::V6(a) => classify_v6(a),
    }
}

fn classify_v4(a: Ipv4Addr) -> AddressClass {
    let n = u32::from(a);
    let within = |net: [u8; 4], len: u32| (n ^ u32::from(Ipv4Addr::from(net))) >> (32 - len) == 0;
    use AddressClass::*;
    match () {
        () if n == 0 => Unspecified,
        () if n == u32::MAX => Broadcast,
        () if within([0, 0, 0, 0], 8) => ThisNetwork,
        () if within([10, 0, 0, 0], 8) => Private,
        () if within([100, 64, 0, 0], 10) => SharedCgnat,
        () if within([127, 0, 0, 0], 8) => Loopback,
        () if within([169, 254, 0, 0], 16) => LinkLocal,
        () if within([172, 16, 0, 0], 12) => Private,
        () if within([192, 0, 0, 0], 24) => IetfProtocol,
        () if within([192, 0, 2, 0], 24) => Documentation,
        () if within([192, 88, 99, 0], 24) => Reserved,
        () if within([192, 168, 0, 0], 16) => Private,
        () if within([198, 18, 0, 0], 15) => Benchmarking,
        () if within([198, 51, 100, 0], 24) => Documentation,
        () if within([203, 0, 113, 0], 24) => Documentation,
        () if within([224, 0, 0, 0], 4) => Multicast,
        () if within([240, 0, 0, 0], 4) => Reserved,
        () => Public,
    }
}

fn classify_v6(a: Ipv6Addr) -> AddressClass {
    if let Some(v4) = a.to_ipv4_mapped() {
        return classify_v4(v4);
    }
    let n = u128::from(a);
    let within = |net: &str, len: u32| {
        let net: Ipv6Addr = net.parse().expect("a literal IPv6 network");
        (n ^ u128::from(net)) >> (128 - len) == 0
    };
    // The IPv4 address in the low 32 bits, or in bits 16 to 48 for 6to4.
    let low_v4 = Ipv4Addr::from((n & 0xffff_ffff) as u32);
    let six_to_four = Ipv4Addr::from((n >> 80) as u32);
    use AddressClass::*;
    match () {
        () if n == 0 => Unspecified,
        () if n == 1 => Loopback,
        () if within("64:ff9b::", 96) => classify_v4(low_v4),
        () if within("100::", 64) => Discard,
        () if within("fe80::", 10) => LinkLocal,
        () if within("fec0::", 10) => Private,
        () if within("fc00::", 7) => Private,
        () if within("ff00::", 8) => Multicast,
        () if within("2001:db8::", 32) => Documentation,
        () if within("3fff::", 20) => Documentation,
        () if within("2002::", 16) => classify_v4(six_to_four),
        () if within("2001:2::", 48) => Benchmarking,
        () if within("2001::", 23) => IetfProtocol,
        () if within("2000::", 3) => Public,
        () => Reserved,
    }
}

/// Why an address may not be reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{ip} is a {class} address and no address range of the profile allows it: list a range such as {ip}/{} in the profile's addresses to allow it",
    host_prefix(.ip)
)]
pub struct AddressRefused {
    /// The address (IPv4-mapped addresses as IPv4).
    pub ip: IpAddr,
    /// Its class, never [`AddressClass::Public`].
    pub class: AddressClass,
}

fn host_prefix(ip: &IpAddr) -> u8 {
    max_prefix(*ip)
}

/// Checks a resolved address against the rule "public, or in an allowed range": returns its
/// class when it may be reached. `ip` is read as [`Cidr::contains`] and [`classify`] read it
/// (an IPv4-mapped address as its IPv4 address).
pub fn check_address(ip: IpAddr, allowed: &[Cidr]) -> Result<AddressClass, AddressRefused> {
    let ip = ip.to_canonical();
    let class = classify(ip);
    if class.is_public() || allowed.iter().any(|c| c.contains(ip)) {
        Ok(class)
    } else {
        Err(AddressRefused { ip, class })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    #[test]
    fn exact_patterns_match_the_name_alone() {
        let p = HostPattern::parse("Example.COM.").unwrap();
        assert_eq!(p, HostPattern::Exact("example.com".into()));
        assert!(p.matches("example.com"));
        assert!(!p.matches("a.example.com"));
        assert!(!p.matches("example.co"));
        assert!(!p.matches("xexample.com"));
        assert_eq!(p.to_string(), "example.com");
    }

    #[test]
    fn suffix_patterns_match_names_below_never_the_suffix() {
        let p = HostPattern::parse("*.Example.com").unwrap();
        assert_eq!(p, HostPattern::Suffix("example.com".into()));
        assert!(p.matches("a.example.com"));
        assert!(p.matches("a.b.example.com"));
        assert!(!p.matches("example.com"));
        assert!(!p.matches("badexample.com"));
        assert!(!p.matches(".example.com"));
        assert!(!p.matches("example.com.evil"));
        assert!(!p.matches("com"));
        assert_eq!(p.to_string(), "*.example.com");
        assert_eq!(HostPattern::parse(&p.to_string()).unwrap(), p);
    }

    #[test]
    fn patterns_never_match_addresses() {
        let p = HostPattern::parse("*.0.0.1.example").unwrap();
        assert!(p.matches_host(&Host::Name("127.0.0.1.example".into())));
        assert!(!p.matches_host(&Host::Ip(ip("127.0.0.1"))));
    }

    #[test]
    fn other_wildcards_are_refused() {
        for s in [
            "*",
            "*.",
            "**.example.com",
            "a.*.example.com",
            "*example.com",
            "example.*",
            "*.*.com",
            ".*.com",
        ] {
            let e = HostPattern::parse(s).unwrap_err();
            assert!(
                matches!(
                    e,
                    HostPatternError::Wildcard { .. } | HostPatternError::Name(_)
                ),
                "{s}: {e:?}"
            );
        }
        assert!(matches!(
            HostPattern::parse("a.*.example.com"),
            Err(HostPatternError::Wildcard { .. })
        ));
        assert!(matches!(
            HostPattern::parse("*.*.example.com"),
            Err(HostPatternError::Wildcard { .. })
        ));
        assert!(matches!(
            HostPattern::parse("*"),
            Err(HostPatternError::Wildcard { .. })
        ));
        assert!(matches!(
            HostPattern::parse("*."),
            Err(HostPatternError::Name(TargetError::EmptyHost))
        ));
    }

    #[test]
    fn address_patterns_are_refused() {
        for s in [
            "127.0.0.1",
            "[::1]",
            "::1",
            "127.1",
            "*.0.0.1",
            "*.1",
            "2130706433",
            "*.example.0x10",
        ] {
            assert!(
                matches!(
                    HostPattern::parse(s),
                    Err(HostPatternError::IpLiteral { .. })
                ),
                "{s}"
            );
        }
        for s in ["exa_mple.com", "-a.com", "a..com", ""] {
            assert!(
                matches!(HostPattern::parse(s), Err(HostPatternError::Name(_))),
                "{s}"
            );
        }
    }

    #[test]
    fn cidrs_parse_and_display() {
        assert_eq!(cidr("10.0.0.0/8").to_string(), "10.0.0.0/8");
        assert_eq!(cidr("127.0.0.1").to_string(), "127.0.0.1/32");
        assert_eq!(cidr("::1").to_string(), "::1/128");
        assert_eq!(cidr("FD00::/8").to_string(), "fd00::/8");
        assert_eq!(cidr("0.0.0.0/0").to_string(), "0.0.0.0/0");
        assert_eq!(cidr("::/0").to_string(), "::/0");
        assert_eq!(cidr("::ffff:10.0.0.0/104").to_string(), "10.0.0.0/8");
        assert_eq!(cidr("::ffff:0:0/96").to_string(), "0.0.0.0/0");
        assert_eq!(cidr("::/80").to_string(), "::/80");
    }

    #[test]
    fn cidrs_refuse_bad_text() {
        for s in [
            "",
            "10.0.0.0/",
            "/8",
            "10.0.0/8",
            "127.1/32",
            "010.0.0.0/8",
            "10.0.0.0/8/8",
            "example.com/8",
            "[::1]/128",
        ] {
            assert!(Cidr::parse(s).is_err(), "{s}");
        }
        for s in [
            "10.0.0.0/33",
            "10.0.0.0/08",
            "10.0.0.0/+8",
            "::/129",
            "::/-1",
            "10.0.0.0/ 8",
            "::/0128",
        ] {
            assert!(
                matches!(Cidr::parse(s), Err(CidrError::BadPrefix { .. })),
                "{s}"
            );
        }
    }

    #[test]
    fn cidrs_with_host_bits_set_are_refused() {
        let e = Cidr::parse("10.0.0.1/8").unwrap_err();
        assert_eq!(
            e,
            CidrError::HostBitsSet {
                text: "10.0.0.1/8".into(),
                network: cidr("10.0.0.0/8")
            }
        );
        assert!(e.to_string().contains("10.0.0.0/8"));
        assert!(matches!(
            Cidr::parse("fd00::1/8"),
            Err(CidrError::HostBitsSet { .. })
        ));
        assert!(matches!(
            Cidr::parse("1.2.3.4/0"),
            Err(CidrError::HostBitsSet { .. })
        ));
    }

    #[test]
    fn cidr_contains() {
        let c = cidr("10.0.0.0/8");
        assert!(c.contains(ip("10.0.0.0")));
        assert!(c.contains(ip("10.255.255.255")));
        assert!(!c.contains(ip("11.0.0.0")));
        assert!(!c.contains(ip("9.255.255.255")));
        assert!(cidr("0.0.0.0/0").contains(ip("255.255.255.255")));
        assert!(!cidr("0.0.0.0/0").contains(ip("::1")));
        let one = cidr("127.0.0.1");
        assert!(one.contains(ip("127.0.0.1")));
        assert!(!one.contains(ip("127.0.0.2")));
        let v6 = cidr("fd00::/8");
        assert!(v6.contains(ip("fdff:ffff::1")));
        assert!(!v6.contains(ip("fe00::")));
        assert!(!v6.contains(ip("10.0.0.1")));
        assert!(cidr("::1/128").contains(ip("::1")));
    }

    #[test]
    fn ipv4_mapped_addresses_are_ipv4_in_ranges() {
        assert!(cidr("127.0.0.0/8").contains(ip("::ffff:127.0.0.1")));
        assert!(cidr("::ffff:127.0.0.0/104").contains(ip("127.0.0.1")));
        // An IPv6 range never holds an IPv4 address, mapped or not.
        assert!(!cidr("::/0").contains(ip("::ffff:127.0.0.1")));
        assert!(!cidr("::/0").contains(ip("127.0.0.1")));
        // NAT64 is checked as written.
        assert!(!cidr("127.0.0.0/8").contains(ip("64:ff9b::7f00:1")));
    }

    #[test]
    fn ipv4_classes() {
        use AddressClass::*;
        for (a, class) in [
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", ThisNetwork),
            ("0.255.255.255", ThisNetwork),
            ("1.0.0.0", Public),
            ("8.8.8.8", Public),
            ("9.255.255.255", Public),
            ("10.0.0.0", Private),
            ("10.255.255.255", Private),
            ("11.0.0.0", Public),
            ("100.63.255.255", Public),
            ("100.64.0.0", SharedCgnat),
            ("100.127.255.255", SharedCgnat),
            ("100.128.0.0", Public),
            ("126.255.255.255", Public),
            ("127.0.0.1", Loopback),
            ("127.255.255.255", Loopback),
            ("128.0.0.0", Public),
            ("169.253.255.255", Public),
            ("169.254.169.254", LinkLocal),
            ("169.255.0.0", Public),
            ("172.15.255.255", Public),
            ("172.16.0.0", Private),
            ("172.31.255.255", Private),
            ("172.32.0.0", Public),
            ("191.255.255.255", Public),
            ("192.0.0.0", IetfProtocol),
            ("192.0.0.255", IetfProtocol),
            ("192.0.1.0", Public),
            ("192.0.2.1", Documentation),
            ("192.0.3.0", Public),
            ("192.88.99.1", Reserved),
            ("192.167.255.255", Public),
            ("192.168.0.1", Private),
            ("192.169.0.0", Public),
            ("198.17.255.255", Public),
            ("198.18.0.0", Benchmarking),
            ("198.19.255.255", Benchmarking),
            ("198.20.0.0", Public),
            ("198.51.100.7", Documentation),
            ("203.0.113.9", Documentation),
            ("203.0.114.0", Public),
            ("223.255.255.255", Public),
            ("224.0.0.1", Multicast),
            ("239.255.255.255", Multicast),
            ("240.0.0.0", Reserved),
            ("255.255.255.254", Reserved),
            ("255.255.255.255", Broadcast),
        ] {
            assert_eq!(classify(ip(a)), class, "{a}");
        }
    }

    #[test]
    fn ipv6_classes() {
        use AddressClass::*;
        for (a, class) in [
            ("::", Unspecified),
            ("::1", Loopback),
            ("::2", Reserved),
            ("::127.0.0.1", Reserved),
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:8.8.8.8", Public),
            ("::ffff:10.1.2.3", Private),
            ("64:ff9b::7f00:1", Loopback),
            ("64:ff9b::a9fe:a9fe", LinkLocal),
            ("64:ff9b::808:808", Public),
            ("64:ff9b:1::808:808", Reserved),
            ("100::1", Discard),
            ("100:0:0:1::", Reserved),
            ("fe80::1", LinkLocal),
            ("febf::1", LinkLocal),
            ("fec0::1", Private),
            ("fc00::1", Private),
            ("fd12:3456::1", Private),
            ("ff02::1", Multicast),
            ("2001:db8::1", Documentation),
            ("3fff::1", Documentation),
            ("3fff:1000::", Public),
            ("2002:7f00:1::", Loopback),
            ("2002:c0a8:101::1", Private),
            ("2002:808:808::1", Public),
            ("2001::1", IetfProtocol),
            ("2001:1ff::1", IetfProtocol),
            ("2001:2::1", Benchmarking),
            ("2001:200::1", Public),
            ("2606:4700::1111", Public),
            ("2000::", Public),
            ("3fff:fff::", Documentation),
            ("4000::1", Reserved),
            ("1fff::1", Reserved),
        ] {
            assert_eq!(classify(ip(a)), class, "{a}");
        }
    }

    #[test]
    fn class_codes_are_stable_and_distinct() {
        let codes: Vec<_> = AddressClass::ALL.iter().map(|c| c.code()).collect();
        assert_eq!(
            codes,
            [
                "public",
                "unspecified",
                "this-network",
                "loopback",
                "private",
                "shared-cgnat",
                "link-local",
                "ietf-protocol",
                "documentation",
                "benchmarking",
                "multicast",
                "broadcast",
                "discard",
                "reserved"
            ]
        );
        assert_eq!(AddressClass::Loopback.to_string(), "loopback");
        assert!(AddressClass::ALL.iter().filter(|c| c.is_public()).count() == 1);
    }

    #[test]
    fn only_public_addresses_pass_without_a_range() {
        assert_eq!(check_address(ip("8.8.8.8"), &[]), Ok(AddressClass::Public));
        let e = check_address(ip("::ffff:127.0.0.1"), &[]).unwrap_err();
        assert_eq!(e.ip, ip("127.0.0.1"));
        assert_eq!(e.class, AddressClass::Loopback);
        assert!(e.to_string().contains("127.0.0.1/32"), "{e}");
        assert_eq!(
            check_address(ip("::ffff:127.0.0.1"), &[cidr("127.0.0.0/8")]),
            Ok(AddressClass::Loopback)
        );
        assert!(check_address(ip("10.0.0.1"), &[cidr("127.0.0.0/8")]).is_err());
        assert!(check_address(ip("169.254.169.254"), &[]).is_err());
        assert!(check_address(ip("64:ff9b::7f00:1"), &[cidr("127.0.0.0/8")]).is_err());
        for class in AddressClass::ALL {
            let sample = match class {
                AddressClass::Public => continue,
                _ => (0..=u32::MAX)
                    .step_by(65_521)
                    .map(|n| IpAddr::V4(Ipv4Addr::from(n)))
                    .find(|&a| classify(a) == class),
            };
            if let Some(a) = sample {
                assert!(check_address(a, &[]).is_err(), "{a} ({class})");
            }
        }
    }
}
