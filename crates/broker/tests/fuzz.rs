//! Property-based fuzzing of the broker's path canonicalisation and route matching
//! (`plimsoll_broker::route`): no input panics; an accepted path has no dot, empty or
//! encoded-separator segment, reassembles to exactly what was sent, and is read the same
//! by two URL parsers no one here wrote (`http::Uri`, which sends it, and the WHATWG `url`,
//! which normalises the way many servers do); a route matches exactly the paths its template
//! describes, with its own method, and parses back from its display.
//!
//! Cases per property are bounded (`PROPTEST_CASES` raises them; DEVELOPERS.md). Failures are
//! kept in `tests/fuzz.proptest-regressions` and replayed first: commit that file.

use plimsoll_broker::Route;
use plimsoll_broker::route::{METHODS, canonical};
use proptest::prelude::*;

#[path = "../../../tests/fuzz/common.rs"]
mod common;
use common::config;

/// Pieces a hostile path is made of: dots, slashes, encodings of both (in either case),
/// double encodings, backslashes, `;`, controls, non-ASCII, `?` and `#`.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9]{1,4}",
        6 => prop_oneof![
            Just("/"), Just("."), Just(".."), Just("%2e"), Just("%2E"), Just("%2f"), Just("%2F"),
            Just("%252e"), Just("%25"), Just("%5c"), Just("\\"), Just(";"), Just("%3b"), Just("%00"),
            Just("%"), Just("%zz"), Just("%c3%a9"), Just("é"), Just("?"), Just("#"), Just(" "),
            Just("*"), Just("~"), Just("%7e"), Just("\u{0}"), Just("\t"), Just("%2"), Just("&"),
            Just("="), Just("@"), Just(":"), Just("%u002e"), Just("．"), Just("%C0%AE"),
        ].prop_map(str::to_owned),
        1 => any::<String>(),
    ]
}

fn hostile_path() -> impl Strategy<Value = String> {
    (
        prop_oneof![4 => Just("/"), 1 => Just(""), 1 => Just("//")],
        proptest::collection::vec(piece(), 0..10),
    )
        .prop_map(|(lead, pieces)| format!("{lead}{}", pieces.concat()))
}

/// Percent-decodes a segment (the path checked is the one a server would decode).
fn decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let h = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(h, 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn check_accepted(path: &str) -> Result<(), TestCaseError> {
    let Ok(c) = canonical(path) else {
        return Ok(());
    };
    // Reassembles to exactly what was sent: nothing was dropped or rewritten.
    let mut again = format!("/{}", c.segments.join("/"));
    if let Some(q) = c.query {
        again.push('?');
        again.push_str(q);
    }
    prop_assert_eq!(&again, path);
    for s in &c.segments {
        prop_assert!(
            !s.is_empty() && *s != "." && *s != "..",
            "segment {s:?} of {path:?}"
        );
        let d = decode(s);
        prop_assert!(
            d != b"." && d != b"..",
            "segment {s:?} decodes to a dot segment"
        );
        prop_assert!(
            !d.iter()
                .any(|&b| matches!(b, b'/' | b'\\' | b';' | b'%') || b < 0x20 || b == 0x7f),
            "segment {s:?} of {path:?} decodes to a separator or control byte"
        );
        prop_assert!(s.is_ascii() && !s.contains(['#', ' ', '?']), "{s:?}");
    }
    // The client that sends it reads the same path and query.
    let uri: http::Uri = format!("http://api.test{path}")
        .parse()
        .map_err(|e| TestCaseError::fail(format!("http::Uri refuses accepted {path:?}: {e}")))?;
    prop_assert_eq!(uri.path_and_query().map(|pq| pq.as_str()), Some(path));
    // A WHATWG parser (which resolves dot segments, `%2e` among them, and re-encodes) leaves
    // the path as it is: a server normalising that way sees the path the route matched.
    let url = url::Url::parse(&format!("http://api.test{path}"))
        .map_err(|e| TestCaseError::fail(format!("url refuses accepted {path:?}: {e}")))?;
    let (p, q) = path
        .split_once('?')
        .map_or((path, None), |(p, q)| (p, Some(q)));
    prop_assert_eq!(url.path(), p, "url normalises {:?}", path);
    prop_assert_eq!(url.query(), q);
    Ok(())
}

fn segment() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_~-]{1,6}"
}

/// A route: a method and a template of literal and `*` segments, maybe allowing a query.
fn route() -> impl Strategy<Value = (&'static str, Vec<Option<String>>, bool)> {
    (
        proptest::sample::select(METHODS),
        proptest::collection::vec(proptest::option::weighted(0.7, segment()), 0..5),
        any::<bool>(),
    )
}

fn template(segments: &[Option<String>]) -> String {
    let parts: Vec<&str> = segments
        .iter()
        .map(|s| s.as_deref().unwrap_or("*"))
        .collect();
    format!("/{}", parts.join("/"))
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn canonical_never_panics_and_what_it_accepts_is_canonical(path in hostile_path()) {
        check_accepted(&path)?;
    }

    #[test]
    fn route_parsing_never_panics_and_round_trips(
        method in prop_oneof![proptest::sample::select(METHODS).prop_map(str::to_owned), "[A-Za-z]{0,7}"],
        sep in prop_oneof![Just(" "), Just("  "), Just("\t"), Just("")],
        path in hostile_path(),
        q in prop_oneof![Just(""), Just("?")],
    ) {
        let text = format!("{method}{sep}{path}{q}");
        if let Ok(r) = Route::parse(&text) {
            prop_assert!(METHODS.contains(&r.method()));
            let back = Route::parse(&r.to_string()).map_err(|e| TestCaseError::fail(format!("{r} does not parse back: {e}")))?;
            prop_assert_eq!(&back, &r);
            // The template itself is canonical (with `*` for a segment).
            let t = r.template();
            let t = t.strip_suffix('?').unwrap_or(t);
            prop_assert!(canonical(t).is_ok(), "template {t:?}");
        }
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn a_route_matches_exactly_the_paths_its_template_describes(
        (method, segments, query) in route(),
        fill in proptest::collection::vec(segment(), 5),
        other in proptest::sample::select(METHODS),
        q in "[a-z]=[0-9]{1,3}",
        which in any::<prop::sample::Index>(),
        extra in segment(),
    ) {
        let text = format!("{method} {}{}", template(&segments), if query { "?" } else { "" });
        let r = Route::parse(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        let filled: Vec<String> = segments
            .iter()
            .zip(&fill)
            .map(|(s, f)| s.clone().unwrap_or_else(|| f.clone()))
            .collect();
        let path = format!("/{}", filled.join("/"));
        let c = canonical(&path).unwrap();
        prop_assert!(r.matches(method, &c), "{text} should match {path}");
        prop_assert_eq!(r.matches(other, &c), other == method);
        prop_assert!(!r.matches(&method.to_lowercase(), &c));
        // A query only where the route allows one.
        let with_q = format!("{path}?{q}");
        prop_assert_eq!(r.matches(method, &canonical(&with_q).unwrap()), query);
        // One segment more or fewer never matches.
        let longer = format!("{}/{extra}", if path == "/" { "" } else { &path });
        prop_assert!(!r.matches(method, &canonical(&longer).unwrap()), "{text} matched {longer}");
        if !filled.is_empty() {
            let shorter = format!("/{}", filled[..filled.len() - 1].join("/"));
            prop_assert!(!r.matches(method, &canonical(&shorter).unwrap()), "{text} matched {shorter}");
            // A literal segment changed (by case, or a byte more) never matches.
            let i = which.index(filled.len());
            if segments[i].is_some() {
                for changed in [format!("{}x", filled[i]), filled[i].to_uppercase(), filled[i].to_lowercase()] {
                    if changed == filled[i] {
                        continue;
                    }
                    let mut f = filled.clone();
                    f[i] = changed;
                    let p = format!("/{}", f.join("/"));
                    prop_assert!(!r.matches(method, &canonical(&p).unwrap()), "{text} matched {p}");
                }
            }
        }
    }
}
