//! Routes and canonical paths: the only paths the broker forwards are canonical ones that
//! match a granted route exactly (`METHOD /path/segments`, `*` = one whole segment).

use std::fmt;

/// The methods a route may name (and the in-sandbox clients can send).
pub const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE"];

/// The longest path (with its query) the broker forwards.
pub const MAX_PATH_BYTES: usize = 2048;

/// One granted route: a method, a path template, and whether a query may follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    method: &'static str,
    segments: Vec<Segment>,
    query: bool,
    template: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Any,
}

/// A route in the grants file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseRouteError {
    /// Not `METHOD /path`.
    #[error(
        "route `{0}` is not `METHOD /path` (e.g. `GET /orders/*`, or `GET /search?` to allow a query)"
    )]
    Shape(String),
    /// The method is not one the clients can send.
    #[error("route `{route}`: method `{method}` is not one of GET, POST, PUT, PATCH, DELETE")]
    Method {
        /// The route as written.
        route: String,
        /// The method as written.
        method: String,
    },
    /// The path template is not canonical.
    #[error("route `{route}`: {why}")]
    Path {
        /// The route as written.
        route: String,
        /// Which rule it breaks.
        why: PathRefused,
    },
    /// `*` inside a segment.
    #[error("route `{0}`: `*` must be a whole segment (`/orders/*`, not `/orders/a*`)")]
    PartialWildcard(String),
}

/// Why a path is not canonical. Each variant is one rule; the sandbox sees its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathRefused {
    /// Empty, or not starting with `/`.
    #[error("the path must start with `/`")]
    NotAbsolute,
    /// Longer than [`MAX_PATH_BYTES`].
    #[error("the path is longer than {MAX_PATH_BYTES} bytes")]
    TooLong,
    /// A `.` or `..` segment.
    #[error("the path has a `.` or `..` segment")]
    DotSegment,
    /// `//`, or a trailing `/`.
    #[error("the path has an empty segment (`//` or a trailing `/`)")]
    EmptySegment,
    /// A backslash.
    #[error("the path has a backslash")]
    Backslash,
    /// A `;` (path parameters).
    #[error("the path has a `;`")]
    Semicolon,
    /// A control character.
    #[error("the path has a control character")]
    Control,
    /// A space, a non-ASCII byte, `#`, or another character that must be percent-encoded.
    #[error(
        "the path has a character that must be percent-encoded (space, non-ASCII, `#`, quotes, brackets)"
    )]
    Unencoded,
    /// `%` not followed by two hex digits.
    #[error("the path has a `%` not followed by two hex digits")]
    BadPercent,
    /// `%2F`, `%5C`, `%2E`, `%25`, `%3B` or an encoded control character.
    #[error(
        "the path percent-encodes a slash, backslash, dot, percent sign, `;` or control character"
    )]
    EncodedSeparator,
}

/// Characters allowed unencoded in a path segment (RFC 3986 `pchar` without `;`).
fn allowed_in_segment(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b'='
                | b':'
                | b'@'
        )
}

/// Decoded bytes that must never arrive percent-encoded: they would change the path's
/// meaning after a server decodes it.
fn forbidden_encoded(b: u8) -> bool {
    matches!(b, b'/' | b'\\' | b'.' | b'%' | b';') || b < 0x20 || b == 0x7f
}

fn hex_value(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        b'a'..=b'f' => digit - b'a' + 10,
        _ => digit - b'A' + 10,
    }
}

fn check_chars(text: &str, extra: &[u8]) -> Result<(), PathRefused> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .ok_or(PathRefused::BadPercent)?;
                let v = hex_value(hex[0]) << 4 | hex_value(hex[1]);
                if forbidden_encoded(v) {
                    return Err(PathRefused::EncodedSeparator);
                }
                i += 3;
                continue;
            }
            b'\\' => return Err(PathRefused::Backslash),
            b';' => return Err(PathRefused::Semicolon),
            _ if b < 0x20 || b == 0x7f => return Err(PathRefused::Control),
            _ if allowed_in_segment(b) || extra.contains(&b) => {}
            _ => return Err(PathRefused::Unencoded),
        }
        i += 1;
    }
    Ok(())
}

/// A canonical path split into its segments, and its query if it had one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalPath<'a> {
    /// The segments between slashes (none for `/`).
    pub segments: Vec<&'a str>,
    /// What followed the first `?`, if anything did.
    pub query: Option<&'a str>,
}

/// Checks that `path` (with an optional `?query`) is canonical: it starts with `/`; has no
/// `.`, `..` or empty segment; no backslash, `;` or control character, raw or
/// percent-encoded; no encoded slash, dot or percent sign; nothing that needs encoding.
pub fn canonical(path: &str) -> Result<CanonicalPath<'_>, PathRefused> {
    if path.len() > MAX_PATH_BYTES {
        return Err(PathRefused::TooLong);
    }
    if !path.starts_with('/') {
        return Err(PathRefused::NotAbsolute);
    }
    let (path, query) = match path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path, None),
    };
    check_chars(path, b"/")?;
    if let Some(q) = query {
        check_chars(q, b"/?")?;
    }
    let segments: Vec<&str> = if path == "/" {
        Vec::new()
    } else {
        path[1..].split('/').collect()
    };
    for s in &segments {
        match *s {
            "" => return Err(PathRefused::EmptySegment),
            "." | ".." => return Err(PathRefused::DotSegment),
            _ => {}
        }
    }
    Ok(CanonicalPath { segments, query })
}

impl Route {
    /// Reads `METHOD /path` (a trailing `?` allows a query).
    pub fn parse(text: &str) -> Result<Route, ParseRouteError> {
        let shape = || ParseRouteError::Shape(text.to_owned());
        let (method, template) = text.trim().split_once(' ').ok_or_else(shape)?;
        let template = template.trim();
        if template.contains(' ') {
            return Err(shape());
        }
        let method =
            METHODS
                .iter()
                .find(|m| **m == method)
                .ok_or_else(|| ParseRouteError::Method {
                    route: text.to_owned(),
                    method: method.to_owned(),
                })?;
        let (path, query) = match template.strip_suffix('?') {
            Some(p) => (p, true),
            None => (template, false),
        };
        let canon = canonical(path).map_err(|why| ParseRouteError::Path {
            route: text.to_owned(),
            why,
        })?;
        if canon.query.is_some() {
            return Err(shape());
        }
        let segments = canon
            .segments
            .iter()
            .map(|s| match *s {
                "*" => Ok(Segment::Any),
                s if s.contains('*') => Err(ParseRouteError::PartialWildcard(text.to_owned())),
                s => Ok(Segment::Literal(s.to_owned())),
            })
            .collect::<Result<_, _>>()?;
        Ok(Route {
            method,
            segments,
            query,
            template: template.to_owned(),
        })
    }

    /// The method.
    pub fn method(&self) -> &'static str {
        self.method
    }

    /// The path template as written (`/orders/*`, `/search?`): what results and logs show.
    pub fn template(&self) -> &str {
        &self.template
    }

    /// True when `method` and the canonical `path` match this route exactly: the same
    /// method, as many segments, each literal equal byte for byte, and a query only where
    /// the route allows one.
    pub fn matches(&self, method: &str, path: &CanonicalPath<'_>) -> bool {
        self.method == method
            && (self.query || path.query.is_none())
            && self.segments.len() == path.segments.len()
            && self
                .segments
                .iter()
                .zip(&path.segments)
                .all(|(t, s)| match t {
                    Segment::Any => true,
                    Segment::Literal(l) => l == s,
                })
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.template)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(path: &str) -> PathRefused {
        canonical(path).expect_err(path)
    }

    #[test]
    fn canonical_paths_pass() {
        for p in [
            "/",
            "/orders",
            "/orders/42",
            "/a/b-c_d~e/f.json",
            "/caf%C3%A9",
            "/x/a%20b",
            "/search?q=tea&n=2",
        ] {
            canonical(p).unwrap_or_else(|e| panic!("{p}: {e}"));
        }
        assert_eq!(canonical("/a/b").unwrap().segments, ["a", "b"]);
        assert_eq!(canonical("/a?x=1").unwrap().query, Some("x=1"));
    }

    #[test]
    fn every_rule_refuses_its_trick() {
        assert_eq!(refused("orders"), PathRefused::NotAbsolute);
        assert_eq!(refused(""), PathRefused::NotAbsolute);
        assert_eq!(refused("/orders/../admin"), PathRefused::DotSegment);
        assert_eq!(refused("/orders/./1"), PathRefused::DotSegment);
        assert_eq!(refused("/orders/.."), PathRefused::DotSegment);
        assert_eq!(refused("/orders//1"), PathRefused::EmptySegment);
        assert_eq!(refused("/orders/"), PathRefused::EmptySegment);
        assert_eq!(refused("/orders\\..\\admin"), PathRefused::Backslash);
        assert_eq!(refused("/orders/1;x=y"), PathRefused::Semicolon);
        assert_eq!(refused("/orders/..;/admin"), PathRefused::Semicolon);
        assert_eq!(refused("/orders/1\n"), PathRefused::Control);
        assert_eq!(refused("/orders/\u{0}"), PathRefused::Control);
        assert_eq!(refused("/orders/a b"), PathRefused::Unencoded);
        assert_eq!(refused("/orders/é"), PathRefused::Unencoded);
        assert_eq!(refused("/orders/1#x"), PathRefused::Unencoded);
        assert_eq!(refused("/orders/%"), PathRefused::BadPercent);
        assert_eq!(refused("/orders/%zz"), PathRefused::BadPercent);
        assert_eq!(refused("/orders/%+1"), PathRefused::BadPercent);
        for enc in [
            "%2F", "%2f", "%5C", "%5c", "%2E", "%2e", "%25", "%3B", "%00", "%0a", "%7F",
        ] {
            assert_eq!(
                refused(&format!("/orders/{enc}admin")),
                PathRefused::EncodedSeparator,
                "{enc}"
            );
        }
        assert_eq!(refused("/search?q=%2F"), PathRefused::EncodedSeparator);
        assert_eq!(refused("/search?q=a b"), PathRefused::Unencoded);
        assert_eq!(
            refused(&format!("/{}", "a".repeat(MAX_PATH_BYTES))),
            PathRefused::TooLong
        );
    }

    #[test]
    fn routes_match_exactly() {
        let r = Route::parse("GET /orders/*").unwrap();
        assert_eq!(r.template(), "/orders/*");
        let m = |method: &str, p: &str| r.matches(method, &canonical(p).unwrap());
        assert!(m("GET", "/orders/42"));
        assert!(!m("POST", "/orders/42"), "wrong method");
        assert!(!m("GET", "/orders"), "too few segments");
        assert!(!m("GET", "/orders/42/items"), "too many segments");
        assert!(!m("GET", "/Orders/42"), "literals are case-sensitive");
        assert!(!m("GET", "/orders/42?x=1"), "no query unless allowed");
        let q = Route::parse("GET /search?").unwrap();
        assert!(q.matches("GET", &canonical("/search?q=1").unwrap()));
        assert!(q.matches("GET", &canonical("/search").unwrap()));
        let root = Route::parse("GET /").unwrap();
        assert!(root.matches("GET", &canonical("/").unwrap()));
        assert!(!root.matches("GET", &canonical("/x").unwrap()));
    }

    #[test]
    fn bad_routes_are_refused() {
        for bad in [
            "GET",
            "/orders",
            "get /orders",
            "OPTIONS /orders",
            "GET orders",
            "GET /orders/../x",
            "GET /orders/a*",
            "GET /orders /x",
            "GET /orders?x=1",
            "GET /a;b",
        ] {
            assert!(Route::parse(bad).is_err(), "{bad}");
        }
    }
}
