//! Property-based fuzzing of the egress checks: no input panics any parser; a valid
//! ClientHello, however it is split into records, gives its name and every prefix of it
//! asks for more; every spelling of an IPv4 address is read as that address or refused as an
//! IP literal, never as a name; accepted names, patterns, ranges and targets are normalized
//! and parse back from their display; a chunked body is scanned the same at every split,
//! ends exactly at its last byte, and nothing after it is consumed; a rewritten request head
//! parses back without hop-by-hop fields.
//!
//! Cases per property are bounded (`PROPTEST_CASES` raises them; DEVELOPERS.md). Failures are
//! kept in `tests/fuzz.proptest-regressions` and replayed first: commit that file.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use plimsoll_egress::http1::{
    self, BodyLen, ChunkedScanner, HOP_BY_HOP, MAX_HEAD, Parsed, RequestHead,
};
use plimsoll_egress::rules::{self, AddressClass, Cidr, HostPattern, HostPatternError};
use plimsoll_egress::sni::{self, Hello};
use plimsoll_egress::target::{self, Host, Target, TargetError};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

mod support;
use support::{ClientHello, chunked_body, record, server_name_ext};

/// Cases per property: `PROPTEST_CASES` or `default`; failures kept beside this file.
fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

/// A valid DNS name (lowercase; its last label alphabetic, so never an IP literal).
fn dns_name() -> impl Strategy<Value = String> {
    (
        proptest::collection::vec("[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", 0..4),
        "[a-z]{1,6}",
    )
        .prop_map(|(mut labels, tld)| {
            labels.push(tld);
            labels.join(".")
        })
}

/// A ClientHello with random fields, extensions in random order (server_name among them,
/// written in mixed case and maybe with a trailing dot), and the name it must give.
fn valid_hello() -> impl Strategy<Value = (ClientHello, String)> {
    (
        dns_name(),
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec(any::<u8>(), 0..=32),
        proptest::collection::vec(any::<u16>(), 1..40),
        proptest::collection::vec(any::<u8>(), 1..4),
        proptest::collection::btree_map(
            1u16..,
            proptest::collection::vec(any::<u8>(), 0..60),
            0..8,
        ),
        any::<prop::sample::Index>(),
        any::<[u8; 32]>(),
    )
        .prop_map(|(name, upper, dot, sid, suites, comp, exts, at, random)| {
            let mut sent = if upper {
                name.to_ascii_uppercase()
            } else {
                name.clone()
            };
            if dot {
                sent.push('.');
            }
            let mut extensions: Vec<(u16, Vec<u8>)> = exts.into_iter().collect();
            let sni = (0, server_name_ext(&[(0, sent.as_bytes())]));
            extensions.insert(at.index(extensions.len() + 1), sni);
            let hello = ClientHello {
                version: [3, 3],
                random,
                session_id: sid,
                suites: suites.iter().flat_map(|s| s.to_be_bytes()).collect(),
                compression: comp,
                extensions,
                ..ClientHello::default()
            };
            (hello, name)
        })
}

/// The handshake bytes of `hello` cut into records at `cuts` (positions, any order).
fn in_records(hello: &ClientHello, cuts: &[prop::sample::Index], versions: &[u8]) -> Vec<u8> {
    let hs = hello.handshake();
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|c| c.index(hs.len()))
        .filter(|&c| c > 0)
        .collect();
    at.push(0);
    at.push(hs.len());
    at.sort_unstable();
    at.dedup();
    at.windows(2)
        .enumerate()
        .flat_map(|(i, w)| {
            let minor = versions.get(i).map_or(1, |v| v % 5);
            record(22, [3, minor], &hs[w[0]..w[1]])
        })
        .collect()
}

/// Bytes that look like TLS records of every content type, with plausible and odd lengths.
fn record_soup() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        (
            prop_oneof![4 => Just(22u8), 1 => any::<u8>()],
            prop_oneof![4 => Just(3u8), 1 => any::<u8>()],
            0u8..6,
            proptest::collection::vec(any::<u8>(), 0..80),
            prop_oneof![4 => Just(None), 1 => any::<u16>().prop_map(Some)],
        ),
        1..6,
    )
    .prop_map(|records| {
        records
            .into_iter()
            .flat_map(|(ty, major, minor, frag, len)| {
                let len = len.unwrap_or(frag.len() as u16);
                [&[ty, major, minor][..], &len.to_be_bytes(), &frag].concat()
            })
            .collect()
    })
}

/// One to five edits for [`mutate`]: where, which (replace, insert, remove), what byte.
fn edits() -> impl Strategy<Value = Vec<(prop::sample::Index, u8, u8)>> {
    proptest::collection::vec(
        (any::<prop::sample::Index>(), any::<u8>(), any::<u8>()),
        1..6,
    )
}

/// `valid` with one to five bytes replaced, inserted or removed.
fn mutate(valid: Vec<u8>, edits: Vec<(prop::sample::Index, u8, u8)>) -> Vec<u8> {
    let mut b = valid;
    for (at, op, byte) in edits {
        let i = at.index(b.len() + 1);
        match op % 3 {
            0 if i < b.len() => b[i] = byte,
            1 => b.insert(i, byte),
            _ if i < b.len() => {
                b.remove(i);
            }
            _ => {}
        }
    }
    b
}

/// An IPv4 address spelt with one to four parts, each decimal, octal or hex, and whether
/// that is the plain dotted quad.
fn ipv4_spelling() -> impl Strategy<Value = (Ipv4Addr, String, bool)> {
    (
        any::<u32>(),
        1usize..=4,
        proptest::collection::vec(0u8..4, 4),
        any::<bool>(),
    )
        .prop_map(|(n, parts, radixes, upper)| {
            let bytes = n.to_be_bytes();
            // The last part holds the remaining bytes.
            let mut values: Vec<u32> = bytes[..parts - 1].iter().map(|&b| u32::from(b)).collect();
            let rest = bytes[parts - 1..]
                .iter()
                .fold(0u32, |acc, &b| acc << 8 | u32::from(b));
            values.push(rest);
            let mut canonical = parts == 4;
            let text: Vec<String> = values
                .iter()
                .zip(&radixes)
                .map(|(&v, &r)| match r {
                    0 | 1 => {
                        format!("{v}")
                    }
                    2 => {
                        canonical = false;
                        let x = format!("0x{v:x}");
                        if upper { x.to_ascii_uppercase() } else { x }
                    }
                    _ => {
                        // Octal, with its leading zero (`00` for 0).
                        canonical = false;
                        format!("0{v:o}")
                    }
                })
                .collect();
            (Ipv4Addr::from(n), text.join("."), canonical)
        })
}

/// Request heads built from pieces: methods, targets, fields that frame bodies or only
/// concern one hop, in any case, with odd values.
fn request_head_bytes() -> impl Strategy<Value = Vec<u8>> {
    let field = prop_oneof![
        Just("Host: example.com".to_owned()),
        Just("host: EXAMPLE.com:80".to_owned()),
        Just("Content-Length: 5".to_owned()),
        Just("content-length: 05".to_owned()),
        Just("Transfer-Encoding: chunked".to_owned()),
        Just("Transfer-Encoding: gzip, chunked".to_owned()),
        Just("Connection: keep-alive, X-A, content-length".to_owned()),
        Just("Proxy-Connection: keep-alive".to_owned()),
        Just("Proxy-Authorization: Basic eA==".to_owned()),
        Just("Upgrade: h2c".to_owned()),
        Just("TE: trailers".to_owned()),
        Just("Keep-Alive: 5".to_owned()),
        Just("X-A: 1".to_owned()),
        "[A-Za-z-]{1,12}: [ -~]{0,20}",
    ];
    (
        prop_oneof![
            Just("GET"),
            Just("POST"),
            Just("HEAD"),
            Just("CONNECT"),
            Just("get")
        ],
        prop_oneof![
            Just("http://example.com/a?b".to_owned()),
            Just("http://example.com".to_owned()),
            Just("https://example.com/".to_owned()),
            Just("/origin".to_owned()),
            Just("example.com:443".to_owned()),
            "http://[a-z0-9.:\\[\\]@%_-]{0,20}/[!-~]{0,10}",
        ],
        prop_oneof![Just("1.1"), Just("1.0")],
        proptest::collection::vec(field, 0..8),
    )
        .prop_map(|(m, t, v, fields)| {
            let mut s = format!("{m} {t} HTTP/{v}\r\n");
            for f in fields {
                s.push_str(&f);
                s.push_str("\r\n");
            }
            s.push_str("\r\n");
            s.into_bytes()
        })
}

/// Feeds `data` to a fresh scanner in pieces cut at `cuts`; the bytes consumed in all and
/// whether it is done, or the first error.
fn scan_split(
    data: &[u8],
    cuts: &[prop::sample::Index],
) -> Result<(usize, bool), http1::HttpError> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c.index(data.len() + 1)).collect();
    at.push(0);
    at.push(data.len());
    at.sort_unstable();
    let mut s = ChunkedScanner::new();
    let mut consumed = 0;
    for w in at.windows(2) {
        let piece = &data[w[0]..w[1]];
        let n = s.feed(piece)?;
        assert!(n <= piece.len());
        consumed += n;
        if n < piece.len() {
            assert!(s.done(), "stopped short of a piece without being done");
        }
    }
    Ok((consumed, s.done()))
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn sni_arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = sni::client_hello_server_name(&b);
    }

    #[test]
    fn sni_record_soup_never_panics(b in record_soup()) {
        if let Hello::Sni(n) = sni::client_hello_server_name(&b) {
            prop_assert_eq!(target::parse_host(&n), Ok(Host::Name(n.clone())));
        }
    }

    #[test]
    fn sni_valid_hellos_split_anywhere(
        (hello, name) in valid_hello(),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
        versions in proptest::collection::vec(any::<u8>(), 0..8),
        after in proptest::collection::vec(any::<u8>(), 0..20),
    ) {
        let b = in_records(&hello, &cuts, &versions);
        prop_assert_eq!(sni::client_hello_server_name(&b), Hello::Sni(name.clone()));
        for n in 0..b.len() {
            let verdict = sni::client_hello_server_name(&b[..n]);
            prop_assert_eq!(verdict, Hello::NeedMore, "prefix {}", n);
        }
        // What follows the hello's last record is the server's business.
        let more = [b, after].concat();
        prop_assert_eq!(sni::client_hello_server_name(&more), Hello::Sni(name));
    }

    #[test]
    fn sni_mutated_hellos_never_panic(
        (hello, _) in valid_hello(),
        edits in edits(),
    ) {
        let b = mutate(hello.record(), edits);
        if let Hello::Sni(n) = sni::client_hello_server_name(&b) {
            prop_assert_eq!(target::parse_host(&n), Ok(Host::Name(n.clone())));
        }
    }

    #[test]
    fn sni_mutated_bodies_with_agreeing_outer_lengths(
        (hello, _) in valid_hello(),
        edits in edits(),
    ) {
        let body = mutate(hello.body(), edits);
        let len = u32::try_from(body.len()).unwrap().to_be_bytes();
        let hs = [&[1, len[1], len[2], len[3]][..], &body].concat();
        let verdict = sni::client_hello_server_name(&record(22, [3, 1], &hs));
        prop_assert!(verdict != Hello::NeedMore && verdict != Hello::NotTls, "{:?}", verdict);
        if let Hello::Sni(n) = verdict {
            prop_assert_eq!(target::parse_host(&n), Ok(Host::Name(n.clone())));
        }
    }

    #[test]
    fn hosts_arbitrary_text(s in "\\PC{0,70}|[a-zA-Z0-9.xX:\\[\\]%@_-]{0,40}") {
        match target::parse_host(&s) {
            Ok(Host::Name(n)) => {
                prop_assert!(n.len() <= 253);
                let name_byte =
                    |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.');
                prop_assert!(n.bytes().all(name_byte));
                prop_assert!(!n.ends_with('.'));
                let last = n.rsplit('.').next().unwrap();
                prop_assert!(!last.bytes().all(|b| b.is_ascii_digit()));
                let hex = last
                    .strip_prefix("0x")
                    .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
                prop_assert!(!hex);
                prop_assert!(n.parse::<IpAddr>().is_err());
                prop_assert_eq!(target::parse_host(&n), Ok(Host::Name(n.clone())));
            }
            Ok(h @ Host::Ip(ip)) => {
                prop_assert!(!matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some()));
                prop_assert_eq!(target::parse_host(&h.to_string()), Ok(h));
            }
            Err(_) => {}
        }
        let _ = target::parse_authority(&s, Some(80));
        let _ = target::parse_authority(&s, None);
        let _ = HostPattern::parse(&s);
        let _ = Cidr::parse(&s);
    }

    #[test]
    fn ipv4_spellings_are_addresses_or_ip_literals(
        (addr, text, canonical) in ipv4_spelling(),
        dot in any::<bool>(),
    ) {
        let text = if dot { format!("{text}.") } else { text };
        match target::parse_host(&text) {
            Ok(Host::Ip(ip)) => {
                prop_assert!(canonical, "{} read as {} though not a dotted quad", text, ip);
                prop_assert_eq!(ip, IpAddr::V4(addr));
            }
            Err(TargetError::NonCanonicalIpv4 { reads_as, .. }) => {
                prop_assert!(!canonical, "{} refused", text);
                prop_assert_eq!(reads_as, Some(addr));
            }
            other => prop_assert!(false, "{} gave {:?}", text, other),
        }
        let literal =
            |p: &str| matches!(HostPattern::parse(p), Err(HostPatternError::IpLiteral { .. }));
        prop_assert!(literal(&text), "pattern {}", text);
        prop_assert!(literal(&format!("*.{text}")), "pattern *.{}", text);
    }

    #[test]
    fn authorities_parse_back_from_display(
        name in dns_name(),
        ip in any::<IpAddr>(),
        port in 1u16..,
        use_ip in any::<bool>(),
    ) {
        let host = if use_ip { Host::Ip(ip.to_canonical()) } else { Host::Name(name) };
        let t = Target { host, port };
        prop_assert_eq!(target::parse_authority(&t.to_string(), None), Ok(t.clone()));
        let (u, path) = target::parse_absolute_uri(&format!("http://{t}")).unwrap();
        prop_assert_eq!(u, t);
        prop_assert_eq!(path, "/");
    }

    #[test]
    fn absolute_uris_arbitrary(s in "[hH][tT][tT][pP][sS]?://[!-~ ]{0,40}|\\PC{0,40}") {
        if let Ok((t, path)) = target::parse_absolute_uri(&s) {
            prop_assert!(path.starts_with('/'));
            prop_assert!(path.bytes().all(|b| b.is_ascii_graphic() && b != b'#'));
            prop_assert!(t.port != 0);
            prop_assert!(s.to_ascii_lowercase().starts_with("http://"));
        }
    }

    #[test]
    fn host_patterns_match_what_they_say(
        suffix in dns_name(),
        below in proptest::collection::vec("[a-z0-9]([a-z0-9-]{0,5}[a-z0-9])?", 1..3),
        other in dns_name(),
    ) {
        let exact = HostPattern::parse(&suffix.to_ascii_uppercase()).unwrap();
        let wild = HostPattern::parse(&format!("*.{suffix}")).unwrap();
        let deeper = format!("{}.{suffix}", below.join("."));
        prop_assert!(exact.matches(&suffix));
        prop_assert!(!exact.matches(&deeper));
        prop_assert!(wild.matches(&deeper));
        prop_assert!(!wild.matches(&suffix));
        let glued = format!("{}{suffix}", below.join("."));
        prop_assert!(!wild.matches(&glued));
        prop_assert_eq!(exact.matches(&other), other == suffix);
        prop_assert_eq!(wild.matches(&other), other.ends_with(&format!(".{suffix}")));
        prop_assert_eq!(HostPattern::parse(&exact.to_string()), Ok(exact));
        prop_assert_eq!(HostPattern::parse(&wild.to_string()), Ok(wild));
    }

    #[test]
    fn cidrs_contain_what_their_prefix_says(
        net in any::<u32>(),
        prefix in 0u8..=32,
        probe in any::<u32>(),
    ) {
        let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
        let text = format!("{}/{prefix}", Ipv4Addr::from(net & mask));
        let c = Cidr::parse(&text).unwrap();
        prop_assert_eq!(c.to_string(), text.clone());
        prop_assert_eq!(Cidr::parse(&c.to_string()), Ok(c));
        let inside = probe & mask == net & mask;
        prop_assert_eq!(c.contains(IpAddr::V4(Ipv4Addr::from(probe))), inside);
        let mapped = IpAddr::V6(Ipv4Addr::from(probe).to_ipv6_mapped());
        prop_assert_eq!(c.contains(mapped), inside);
        let network = Ipv4Addr::from(net & mask);
        let mapped_text = format!("::ffff:{network}/{}", u32::from(prefix) + 96);
        let as_mapped = Cidr::parse(&mapped_text).unwrap();
        prop_assert_eq!(as_mapped, c);
        if net & !mask != 0 {
            let set = format!("{}/{prefix}", Ipv4Addr::from(net));
            let refused = matches!(Cidr::parse(&set), Err(rules::CidrError::HostBitsSet { .. }));
            prop_assert!(refused, "{}", set);
        }
    }

    #[test]
    fn ipv6_cidrs(net in any::<u128>(), prefix in 0u8..=128, probe in any::<u128>()) {
        let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
        let c = Cidr::parse(&format!("{}/{prefix}", Ipv6Addr::from(net & mask))).unwrap();
        prop_assert_eq!(Cidr::parse(&c.to_string()), Ok(c));
        let probe6 = Ipv6Addr::from(probe);
        if c.addr().is_ipv6() && probe6.to_ipv4_mapped().is_none() {
            prop_assert_eq!(c.contains(IpAddr::V6(probe6)), probe & mask == net & mask);
        }
    }

    #[test]
    fn embedded_ipv4_is_classified_as_ipv4(v4 in any::<u32>()) {
        let a = Ipv4Addr::from(v4);
        let class = rules::classify(IpAddr::V4(a));
        prop_assert_eq!(rules::classify(IpAddr::V6(a.to_ipv6_mapped())), class);
        let nat64 = Ipv6Addr::from(0x0064_ff9b_0000_0000_0000_0000_0000_0000u128 | u128::from(v4));
        prop_assert_eq!(rules::classify(IpAddr::V6(nat64)), class);
        let six_to_four = Ipv6Addr::from(0x2002u128 << 112 | u128::from(v4) << 80 | 1);
        prop_assert_eq!(rules::classify(IpAddr::V6(six_to_four)), class);
        let passes = rules::check_address(IpAddr::V6(a.to_ipv6_mapped()), &[]).is_ok();
        prop_assert_eq!(passes, class == AddressClass::Public);
    }

    #[test]
    fn only_public_passes_without_a_range(ip in any::<IpAddr>()) {
        let class = rules::classify(ip);
        prop_assert_eq!(rules::check_address(ip, &[]).is_ok(), class.is_public());
        let everything = [Cidr::parse("0.0.0.0/0").unwrap(), Cidr::parse("::/0").unwrap()];
        prop_assert!(rules::check_address(ip, &everything).is_ok());
    }

    #[test]
    fn request_heads_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(Parsed::Complete(_, n)) = http1::parse_request_head(&b) {
            prop_assert!(n <= b.len() && n <= MAX_HEAD);
        }
        let _ = http1::parse_response_head(&b);
    }

    #[test]
    fn request_heads_built_from_pieces(
        head in request_head_bytes(),
        body in proptest::collection::vec(any::<u8>(), 0..30),
    ) {
        let b = [head.clone(), body].concat();
        let Ok(Parsed::Complete(h, n)) = http1::parse_request_head(&b) else {
            return Ok(());
        };
        prop_assert_eq!(n, head.len());
        for k in 0..n {
            prop_assert_eq!(http1::parse_request_head(&head[..k]), Ok(Parsed::Partial));
        }
        let framing = http1::request_body(&h);
        if let Ok(BodyLen::UntilClose) = framing {
            prop_assert!(false, "a request read until close");
        }
        let _ = http1::host_header(&h);
        let _ = http1::connect_target(&h);
        if let Ok((_, path)) = http1::absolute_target(&h) {
            check_origin_form(&h, &path)?;
        }
    }

    #[test]
    fn chunked_bodies_split_anywhere(
        sizes in proptest::collection::vec(0usize..300, 0..6),
        trailers in proptest::collection::vec("[A-Za-z-]{1,8}:[ -~]{0,12}", 0..3),
        after in proptest::collection::vec(any::<u8>(), 0..40),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let sizes: Vec<usize> = sizes.into_iter().filter(|&s| s > 0).collect();
        let trailers: Vec<&str> = trailers.iter().map(String::as_str).collect();
        let body = chunked_body(&sizes, &trailers);
        let data = [body.clone(), after].concat();
        prop_assert_eq!(scan_split(&data, &cuts), Ok((body.len(), true)));
        // Done exactly at the last byte, and not before.
        let mut s = ChunkedScanner::new();
        prop_assert_eq!(s.feed(&body[..body.len() - 1]), Ok(body.len() - 1));
        prop_assert!(!s.done());
        prop_assert_eq!(s.feed(&data[body.len() - 1..]), Ok(1));
        prop_assert!(s.done());
    }

    #[test]
    fn chunked_arbitrary_bytes_scan_the_same_at_every_split(
        data in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..120),
            proptest::collection::vec(prop_oneof![
                Just(b'0'), Just(b'1'), Just(b'a'), Just(b'\r'), Just(b'\n'), Just(b';'),
                Just(b' '), Just(b':'), Just(b'x'), Just(b'F'),
            ], 0..120),
        ],
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let whole = scan_split(&data, &[]);
        let split = scan_split(&data, &cuts);
        prop_assert_eq!(whole.is_ok(), split.is_ok(), "{:?} vs {:?}", whole, split);
        if let (Ok(a), Ok(b)) = (whole, split) {
            prop_assert_eq!(a, b);
        }
    }
}

/// The origin-form head parses back: the same method, the path as target, HTTP/1.1, no
/// hop-by-hop field, `Connection: close` last, and the same framing.
fn check_origin_form(h: &RequestHead, path: &str) -> Result<(), TestCaseError> {
    let out = http1::origin_form_head(h, path);
    let Ok(Parsed::Complete(back, n)) = http1::parse_request_head(&out) else {
        return Err(TestCaseError::fail(format!(
            "{:?} does not parse",
            String::from_utf8_lossy(&out)
        )));
    };
    prop_assert_eq!(n, out.len());
    prop_assert_eq!(&back.method, &h.method);
    prop_assert_eq!(back.target.as_str(), path);
    prop_assert_eq!(back.version_minor, 1);
    let (last, rest) = back.headers.split_last().unwrap();
    prop_assert_eq!(last, &("Connection".to_owned(), b"close".to_vec()));
    for (name, _) in rest {
        prop_assert!(
            !HOP_BY_HOP.contains(&name.to_ascii_lowercase().as_str()),
            "{}",
            name
        );
    }
    // The same framing (HTTP/1.0 with Transfer-Encoding is refused before this point).
    if let Ok(framing) = http1::request_body(h) {
        prop_assert_eq!(http1::request_body(&back), Ok(framing));
    }
    prop_assert_eq!(http1::host_header(&back), http1::host_header(h));
    Ok(())
}
