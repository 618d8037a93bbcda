//! Plain HTTP/1 through the proxy: request and response heads, body framing that refuses
//! anything two parsers could frame differently (request smuggling), a chunked-body scanner
//! that finds where a body ends without buffering it, the Host check, and the request head
//! rewritten for the upstream server.

use crate::target::{Target, TargetError, clip, parse_absolute_uri, parse_authority};

/// The most bytes a request or response head may take, its final empty line included.
pub const MAX_HEAD: usize = 16 * 1024;
/// The most header fields a head may have.
pub const MAX_HEADERS: usize = 100;
/// The most bytes of a chunk-size line (size, extensions and CRLF).
pub const MAX_CHUNK_LINE: usize = 1024;
/// The most bytes of a chunked body's trailer section (its final empty line included).
pub const MAX_TRAILERS: usize = 16 * 1024;

/// The result of parsing a head from the bytes received so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<T> {
    /// No complete head yet (and no error so far): read more.
    Partial,
    /// A head, and its length in bytes: the body (or the next message) starts there.
    Complete(T, usize),
}

/// A request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// The method, case as sent (methods are case-sensitive).
    pub method: String,
    /// The request target as sent: `http://host/path` in absolute form, `host:port` for
    /// CONNECT.
    pub target: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version_minor: u8,
    /// The header fields in order: names as sent, values without surrounding whitespace.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// A response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code, 100 to 999.
    pub status: u16,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version_minor: u8,
    /// The header fields in order: names as sent, values without surrounding whitespace.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// How the body after a head is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLen {
    /// No body: the next message starts right after the head.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// A chunked body: feed it to a [`ChunkedScanner`] to find its end.
    Chunked,
    /// Everything until the server closes the connection (responses only).
    UntilClose,
}

/// Why an HTTP/1 message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// The head is longer than [`MAX_HEAD`].
    #[error("the message head is longer than {limit} bytes: send fewer or shorter header fields")]
    HeadTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// More header fields than [`MAX_HEADERS`].
    #[error("the message head has more than {limit} header fields: send fewer")]
    TooManyHeaders {
        /// The limit.
        limit: usize,
    },
    /// Not an HTTP/1.0 or HTTP/1.1 head.
    #[error("malformed HTTP/1 head ({what}): send an HTTP/1.1 request line and header fields")]
    Malformed {
        /// What is wrong.
        what: &'static str,
    },
    /// A line that ends in LF without CR.
    #[error("a line of the head ends in a bare LF: end every line with CRLF")]
    BareLf,
    /// A status code under 100.
    #[error("status {status} is not an HTTP status code (100 to 999)")]
    BadStatus {
        /// The status as sent.
        status: u16,
    },
    /// A transfer coding other than `chunked` alone.
    #[error(
        "Transfer-Encoding {value:?} is not served: send `Transfer-Encoding: chunked` alone, or Content-Length"
    )]
    TransferEncoding {
        /// The value as sent.
        value: String,
    },
    /// More than one Transfer-Encoding field.
    #[error("more than one Transfer-Encoding field: send one, `chunked`")]
    MultipleTransferEncoding,
    /// Transfer-Encoding in an HTTP/1.0 message, which HTTP/1.0 does not have.
    #[error("Transfer-Encoding in an HTTP/1.0 message: send HTTP/1.1, or Content-Length")]
    TransferEncodingHttp10,
    /// Both Transfer-Encoding and Content-Length.
    #[error("both Transfer-Encoding and Content-Length: send one of them")]
    LengthAndChunked,
    /// A Content-Length that is not a plain decimal number.
    #[error("Content-Length {value:?} is not a decimal number: send the body's length in bytes")]
    BadContentLength {
        /// The value as sent.
        value: String,
    },
    /// Content-Length values that differ.
    #[error("Content-Length values differ: send one Content-Length")]
    ConflictingContentLength,
    /// A `101 Switching Protocols` the proxy never asked for (it drops Upgrade).
    #[error("101 Switching Protocols, but the proxy forwards no Upgrade")]
    UnexpectedSwitchingProtocols,
    /// More than one Host field.
    #[error("more than one Host field: send one")]
    MultipleHost,
    /// No Host field.
    #[error("no Host field: send `Host: host[:port]` with the host of the request target")]
    MissingHost,
    /// A Host field that is not an authority.
    #[error("the Host field is not host[:port]: {why}")]
    BadHost {
        /// Why.
        why: TargetError,
    },
    /// A Host field with bytes outside ASCII.
    #[error("the Host field {host:?} is not ASCII: send the name in punycode")]
    HostNotAscii {
        /// The field, lossily decoded.
        host: String,
    },
    /// A Host field naming another host or port than the request target.
    #[error(
        "the Host field names {host} but the request target names {target}: send the same host and port in both"
    )]
    HostMismatch {
        /// The Host field, read.
        host: String,
        /// The request target's host and port.
        target: String,
    },
    /// A request target that is not what the method needs.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// CONNECT where an absolute-form request belongs.
    #[error("CONNECT has no absolute URI: read its target as host:port")]
    UnexpectedConnect,
    /// Another method where CONNECT belongs.
    #[error("method {method:?} is not CONNECT: send CONNECT host:port HTTP/1.1")]
    NotConnect {
        /// The method as sent.
        method: String,
    },
    /// A malformed chunked body.
    #[error(
        "malformed chunked body ({what}): send chunks as `hex-size CRLF data CRLF`, ending with `0 CRLF CRLF`"
    )]
    BadChunked {
        /// What is wrong.
        what: &'static str,
    },
    /// A chunk-size line longer than [`MAX_CHUNK_LINE`].
    #[error("a chunk-size line is longer than {limit} bytes: send shorter chunk extensions")]
    ChunkLineTooLong {
        /// The limit, in bytes.
        limit: usize,
    },
    /// Trailers longer than [`MAX_TRAILERS`].
    #[error("the chunked body's trailer fields are longer than {limit} bytes: send fewer")]
    TrailersTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
}

fn malformed(e: httparse::Error) -> HttpError {
    match e {
        httparse::Error::TooManyHeaders => HttpError::TooManyHeaders { limit: MAX_HEADERS },
        httparse::Error::HeaderName => HttpError::Malformed {
            what: "a header field name",
        },
        httparse::Error::HeaderValue => HttpError::Malformed {
            what: "a header field value",
        },
        httparse::Error::NewLine => HttpError::Malformed {
            what: "a line ending",
        },
        httparse::Error::Status => HttpError::Malformed {
            what: "the status line",
        },
        httparse::Error::Token => HttpError::Malformed {
            what: "the method or request target",
        },
        httparse::Error::Version => HttpError::Malformed {
            what: "the HTTP version",
        },
    }
}

/// Refuses a LF not preceded by CR (which httparse accepts).
fn check_line_endings(head: &[u8]) -> Result<(), HttpError> {
    let bare = head
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || head[i - 1] != b'\r'));
    if bare { Err(HttpError::BareLf) } else { Ok(()) }
}

fn owned_headers(headers: &[httparse::Header<'_>]) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|h| (h.name.to_owned(), h.value.to_vec()))
        .collect()
}

/// Parses a request head from the bytes received so far (`buf` may hold body bytes after
/// it).
///
/// HTTP/1.0 and HTTP/1.1 only; every line must end in CRLF; no obsolete line folding; at
/// most [`MAX_HEADERS`] fields and [`MAX_HEAD`] bytes ([`HttpError::HeadTooLarge`] as soon as
/// `buf` holds that many bytes without a complete head). Empty lines before the request line
/// are skipped (RFC 9112, 2.2) and counted in the head's length.
pub fn parse_request_head(buf: &[u8]) -> Result<Parsed<RequestHead>, HttpError> {
    let window = &buf[..buf.len().min(MAX_HEAD)];
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(window).map_err(malformed)? {
        httparse::Status::Partial => {
            check_line_endings(window)?;
            if buf.len() >= MAX_HEAD {
                Err(HttpError::HeadTooLarge { limit: MAX_HEAD })
            } else {
                Ok(Parsed::Partial)
            }
        }
        httparse::Status::Complete(n) => {
            check_line_endings(&window[..n])?;
            let head = RequestHead {
                method: req.method.unwrap_or_default().to_owned(),
                target: req.path.unwrap_or_default().to_owned(),
                version_minor: req.version.unwrap_or_default(),
                headers: owned_headers(req.headers),
            };
            Ok(Parsed::Complete(head, n))
        }
    }
}

/// Parses a response head from the bytes received so far, with the limits of
/// [`parse_request_head`]. A status under 100 is refused.
pub fn parse_response_head(buf: &[u8]) -> Result<Parsed<ResponseHead>, HttpError> {
    let window = &buf[..buf.len().min(MAX_HEAD)];
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    match res.parse(window).map_err(malformed)? {
        httparse::Status::Partial => {
            check_line_endings(window)?;
            if buf.len() >= MAX_HEAD {
                Err(HttpError::HeadTooLarge { limit: MAX_HEAD })
            } else {
                Ok(Parsed::Partial)
            }
        }
        httparse::Status::Complete(n) => {
            check_line_endings(&window[..n])?;
            let status = res.code.unwrap_or_default();
            if status < 100 {
                return Err(HttpError::BadStatus { status });
            }
            let head = ResponseHead {
                status,
                version_minor: res.version.unwrap_or_default(),
                headers: owned_headers(res.headers),
            };
            Ok(Parsed::Complete(head, n))
        }
    }
}

/// The values of the fields named `name` (ASCII case-insensitive), in order.
fn values<'a>(
    headers: &'a [(String, Vec<u8>)],
    name: &'a str,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .iter()
        .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    &v[start..end]
}

fn lossy(v: &[u8]) -> String {
    clip(&String::from_utf8_lossy(v))
}

/// The framing the headers declare, if any: Transfer-Encoding exactly `chunked` (one field,
/// HTTP/1.1, no Content-Length), or Content-Length values that are all the same plain
/// decimal number.
fn declared_framing(
    headers: &[(String, Vec<u8>)],
    version_minor: u8,
) -> Result<Option<BodyLen>, HttpError> {
    let te: Vec<&[u8]> = values(headers, "transfer-encoding").collect();
    let cl: Vec<&[u8]> = values(headers, "content-length").collect();
    if let Some(first) = te.first() {
        if !cl.is_empty() {
            return Err(HttpError::LengthAndChunked);
        }
        if version_minor == 0 {
            return Err(HttpError::TransferEncodingHttp10);
        }
        if te.len() > 1 {
            return Err(HttpError::MultipleTransferEncoding);
        }
        if !trim_ows(first).eq_ignore_ascii_case(b"chunked") {
            return Err(HttpError::TransferEncoding {
                value: lossy(first),
            });
        }
        return Ok(Some(BodyLen::Chunked));
    }
    if cl.is_empty() {
        return Ok(None);
    }
    let mut length: Option<(&[u8], u64)> = None;
    for field in &cl {
        for v in field.split(|&b| b == b',').map(trim_ows) {
            let n = std::str::from_utf8(v)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| HttpError::BadContentLength {
                    value: lossy(field),
                })?;
            match length {
                Some((text, _)) if text != v => return Err(HttpError::ConflictingContentLength),
                _ => length = Some((v, n)),
            }
        }
    }
    Ok(length.map(|(_, n)| BodyLen::Length(n)))
}

/// How a request's body is framed, strict against request smuggling:
///
/// - `Transfer-Encoding` must be exactly `chunked` (any case, one field): `gzip, chunked`,
///   `chunked, chunked`, two fields, or Transfer-Encoding in HTTP/1.0 are errors;
/// - Transfer-Encoding and Content-Length together are an error;
/// - Content-Length values (several fields, or a comma-separated list) must be plain decimal
///   numbers below 2^64, all written the same (`5` and `05` differ);
/// - neither field: no body ([`BodyLen::None`]); a request never reads until close.
pub fn request_body(h: &RequestHead) -> Result<BodyLen, HttpError> {
    Ok(declared_framing(&h.headers, h.version_minor)?.unwrap_or(BodyLen::None))
}

/// How a response's body is framed, given the method of the request it answers (RFC 9112,
/// 6.3): none for `HEAD` (exactly that method), 1xx (other than 101, an error since the proxy
/// forwards no Upgrade), 204 and 304; otherwise as [`request_body`] reads the fields, and
/// [`BodyLen::UntilClose`] when there is neither. After a 1xx response the final response head
/// follows on the same connection.
pub fn response_body(request_method: &str, h: &ResponseHead) -> Result<BodyLen, HttpError> {
    if request_method == "HEAD" {
        return Ok(BodyLen::None);
    }
    match h.status {
        101 => return Err(HttpError::UnexpectedSwitchingProtocols),
        100..=199 | 204 | 304 => return Ok(BodyLen::None),
        _ => {}
    }
    Ok(declared_framing(&h.headers, h.version_minor)?.unwrap_or(BodyLen::UntilClose))
}

/// The Host field: `None` without one, an error for more than one, or a value that is not
/// ASCII.
pub fn host_header(h: &RequestHead) -> Result<Option<String>, HttpError> {
    let mut hosts = values(&h.headers, "host");
    let Some(first) = hosts.next() else {
        return Ok(None);
    };
    if hosts.next().is_some() {
        return Err(HttpError::MultipleHost);
    }
    match std::str::from_utf8(first) {
        Ok(s) if s.is_ascii() => Ok(Some(s.to_owned())),
        _ => Err(HttpError::HostNotAscii { host: lossy(first) }),
    }
}

/// The target and origin-form path of an absolute-form request (`GET http://host/path`),
/// with its Host field checked: there must be exactly one, naming the same host and port
/// as the request target (port 80 when it names none). CONNECT is refused here; read it with
/// [`connect_target`].
pub fn absolute_target(h: &RequestHead) -> Result<(Target, String), HttpError> {
    if h.method == "CONNECT" {
        return Err(HttpError::UnexpectedConnect);
    }
    let (target, path) = parse_absolute_uri(&h.target)?;
    let host = host_header(h)?.ok_or(HttpError::MissingHost)?;
    let named = parse_authority(&host, Some(80)).map_err(|why| HttpError::BadHost { why })?;
    if named != target {
        return Err(HttpError::HostMismatch {
            host: named.to_string(),
            target: target.to_string(),
        });
    }
    Ok((target, path))
}

/// The target of a `CONNECT host:port` request: the port is required. The Host field is not
/// read (the request target is what the tunnel goes to).
pub fn connect_target(h: &RequestHead) -> Result<Target, HttpError> {
    if h.method != "CONNECT" {
        return Err(HttpError::NotConnect {
            method: clip(&h.method),
        });
    }
    Ok(parse_authority(&h.target, None)?)
}

/// Fields that only concern one hop, never forwarded (RFC 9110, 7.6.1), lowercase.
pub const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "upgrade",
];

/// Fields kept even when `Connection` names them: dropping them would change how the
/// upstream frames the body or which host it serves.
const NEVER_DROPPED: [&str; 3] = ["content-length", "host", "transfer-encoding"];

/// The request head to send upstream for an absolute-form request, in origin form:
///
/// - the request line `METHOD path HTTP/1.1` (`path` as returned by
///   [`crate::target::parse_absolute_uri`], which admits only visible ASCII);
/// - every field in order, names and values as received, except [`HOP_BY_HOP`] fields and
///   fields that `Connection` names (comma-separated, any case), though `Host`,
///   `Content-Length` and `Transfer-Encoding` are kept even when named there;
/// - `Connection: close` and the empty line.
///
/// Everything else passes unchanged (Host, Content-Length, Transfer-Encoding, Expect, cookies,
/// Authorization meant for the server...). A request without a Host field gets none here:
/// [`absolute_target`] refuses those.
pub fn origin_form_head(h: &RequestHead, path: &str) -> Vec<u8> {
    debug_assert!(
        path.bytes().all(|b| b.is_ascii_graphic()),
        "the path comes from parse_absolute_uri"
    );
    let nominated: Vec<String> = values(&h.headers, "connection")
        .flat_map(|v| v.split(|&b| b == b','))
        .map(|t| String::from_utf8_lossy(trim_ows(t)).to_ascii_lowercase())
        .collect();
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(h.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &h.headers {
        let lower = name.to_ascii_lowercase();
        let hop = HOP_BY_HOP.contains(&lower.as_str());
        let named = nominated.contains(&lower) && !NEVER_DROPPED.contains(&lower.as_str());
        if hop || named {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// Where a [`ChunkedScanner`] is in a chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Before the first hex digit of a chunk size.
    SizeStart,
    /// In the hex digits.
    Size,
    /// In whitespace after the size, before a `;`.
    SizeSpace,
    /// In a chunk extension, after a `;`.
    Extension,
    /// After the CR that ends the size line.
    SizeLf,
    /// In chunk data.
    Data,
    /// After chunk data, expecting CR.
    DataCr,
    /// After chunk data and CR, expecting LF.
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// In a trailer field name.
    TrailerName,
    /// In a trailer field value.
    TrailerValue,
    /// After the CR that ends a trailer line.
    TrailerLf,
    /// After the CR of the final empty line.
    EndLf,
    /// Past the end of the body.
    Done,
    /// After an error.
    Failed,
}

/// Finds the end of a chunked body fed in pieces of any size, without keeping its payload:
/// a state machine over chunk-size lines (hex size, optional `;` extensions after optional
/// whitespace, CRLF; at most [`MAX_CHUNK_LINE`] bytes), chunk data followed by CRLF, the last
/// chunk `0`, trailer fields (`name: value` lines, at most [`MAX_TRAILERS`] bytes in all) and
/// the final CRLF. Bare LF, bare CR, whitespace before the size, a `0x` prefix, a size over
/// 2^64 - 1 and control bytes in extensions or trailers are errors.
#[derive(Debug, Clone)]
pub struct ChunkedScanner {
    state: Chunk,
    /// The size being read, then the data bytes left in the chunk.
    remaining: u64,
    /// Bytes of the current size line so far.
    line: usize,
    /// Bytes of the trailer section so far.
    trailers: usize,
}

impl Default for ChunkedScanner {
    fn default() -> Self {
        ChunkedScanner::new()
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A byte of a field value or chunk extension: visible ASCII, space, tab or obs-text.
fn is_field_byte(b: u8) -> bool {
    matches!(b, b'\t' | b' '..=b'~' | 0x80..=0xff)
}

impl ChunkedScanner {
    /// A scanner at the start of a chunked body.
    pub fn new() -> Self {
        ChunkedScanner {
            state: Chunk::SizeStart,
            remaining: 0,
            line: 0,
            trailers: 0,
        }
    }

    /// True once the whole body, trailers and final CRLF included, has been fed.
    pub fn done(&self) -> bool {
        self.state == Chunk::Done
    }

    /// Feeds the next bytes of the body; returns how many belong to it: all of `data`, or
    /// fewer when the body ends inside it (the rest is the next message). Once done, feeding
    /// consumes nothing; once an error was returned, every feed returns an error.
    pub fn feed(&mut self, data: &[u8]) -> Result<usize, HttpError> {
        let r = self.scan(data);
        if r.is_err() {
            self.state = Chunk::Failed;
        }
        r
    }

    fn scan(&mut self, data: &[u8]) -> Result<usize, HttpError> {
        let bad = |what| Err(HttpError::BadChunked { what });
        let mut i = 0;
        while i < data.len() {
            let b = data[i];
            match self.state {
                Chunk::Done => return Ok(i),
                Chunk::Failed => return bad("fed after an error"),
                Chunk::Data => {
                    let left = (data.len() - i) as u64;
                    let n = self.remaining.min(left);
                    self.remaining -= n;
                    // n <= data.len() - i, so it fits a usize.
                    i += n as usize;
                    if self.remaining == 0 {
                        self.state = Chunk::DataCr;
                    }
                    continue;
                }
                Chunk::SizeStart
                | Chunk::Size
                | Chunk::SizeSpace
                | Chunk::Extension
                | Chunk::SizeLf => {
                    self.line += 1;
                    if self.line > MAX_CHUNK_LINE {
                        return Err(HttpError::ChunkLineTooLong {
                            limit: MAX_CHUNK_LINE,
                        });
                    }
                    self.size_line(b)?;
                }
                Chunk::DataCr => match b {
                    b'\r' => self.state = Chunk::DataLf,
                    _ => return bad("chunk data longer than its size, or not followed by CRLF"),
                },
                Chunk::DataLf => match b {
                    b'\n' => self.start_size_line(),
                    _ => return bad("a CR without LF after chunk data"),
                },
                Chunk::TrailerStart
                | Chunk::TrailerName
                | Chunk::TrailerValue
                | Chunk::TrailerLf
                | Chunk::EndLf => {
                    self.trailers += 1;
                    if self.trailers > MAX_TRAILERS {
                        return Err(HttpError::TrailersTooLarge {
                            limit: MAX_TRAILERS,
                        });
                    }
                    self.trailer(b)?;
                }
            }
            i += 1;
        }
        if self.state == Chunk::Failed {
            return bad("fed after an error");
        }
        Ok(i)
    }

    fn start_size_line(&mut self) {
        self.state = Chunk::SizeStart;
        self.remaining = 0;
        self.line = 0;
    }

    fn size_line(&mut self, b: u8) -> Result<(), HttpError> {
        let bad = |what| Err(HttpError::BadChunked { what });
        let hex = (b as char).to_digit(16);
        match (self.state, b, hex) {
            (Chunk::SizeStart | Chunk::Size, _, Some(d)) => {
                self.remaining = match self
                    .remaining
                    .checked_mul(16)
                    .and_then(|v| v.checked_add(u64::from(d)))
                {
                    Some(v) => v,
                    None => return bad("a chunk size over 2^64 - 1"),
                };
                self.state = Chunk::Size;
            }
            (Chunk::SizeStart, _, None) => {
                return bad("a chunk-size line that does not start with a hex digit");
            }
            (Chunk::Size | Chunk::SizeSpace, b' ' | b'\t', _) => self.state = Chunk::SizeSpace,
            (Chunk::Size | Chunk::SizeSpace, b';', _) => self.state = Chunk::Extension,
            (Chunk::Size | Chunk::Extension, b'\r', _) => self.state = Chunk::SizeLf,
            (Chunk::Size | Chunk::SizeSpace, _, _) => {
                return bad("a chunk size followed by something other than `;` or CRLF");
            }
            (Chunk::Extension, _, _) if is_field_byte(b) => {}
            (Chunk::Extension, _, _) => return bad("a control byte in a chunk extension"),
            (Chunk::SizeLf, b'\n', _) => {
                if self.remaining == 0 {
                    self.state = Chunk::TrailerStart;
                } else {
                    self.state = Chunk::Data;
                }
            }
            (Chunk::SizeLf, _, _) => return bad("a CR without LF in a chunk-size line"),
            _ => return bad("an unexpected byte in a chunk-size line"),
        }
        Ok(())
    }

    fn trailer(&mut self, b: u8) -> Result<(), HttpError> {
        let bad = |what| Err(HttpError::BadChunked { what });
        self.state = match (self.state, b) {
            (Chunk::TrailerStart, b'\r') => Chunk::EndLf,
            (Chunk::TrailerStart | Chunk::TrailerName, _) if is_tchar(b) => Chunk::TrailerName,
            (Chunk::TrailerStart, _) => {
                return bad("a trailer line that does not start with a field name");
            }
            (Chunk::TrailerName, b':') => Chunk::TrailerValue,
            (Chunk::TrailerName, _) => {
                return bad("a trailer field name with a byte outside a token");
            }
            (Chunk::TrailerValue, b'\r') => Chunk::TrailerLf,
            (Chunk::TrailerValue, _) if is_field_byte(b) => Chunk::TrailerValue,
            (Chunk::TrailerValue, _) => return bad("a control byte in a trailer field value"),
            (Chunk::TrailerLf, b'\n') => Chunk::TrailerStart,
            (Chunk::TrailerLf, _) => return bad("a CR without LF in the trailers"),
            (Chunk::EndLf, b'\n') => Chunk::Done,
            (Chunk::EndLf, _) => return bad("a CR without LF at the end of the body"),
            _ => return bad("an unexpected byte in the trailers"),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Host;

    use crate::test_support::chunked_body;

    fn req(s: &str) -> RequestHead {
        match parse_request_head(s.as_bytes()).unwrap() {
            Parsed::Complete(h, n) => {
                assert_eq!(n, s.len());
                h
            }
            Parsed::Partial => panic!("partial: {s:?}"),
        }
    }

    fn res(s: &str) -> ResponseHead {
        match parse_response_head(s.as_bytes()).unwrap() {
            Parsed::Complete(h, _) => h,
            Parsed::Partial => panic!("partial: {s:?}"),
        }
    }

    fn with_headers(fields: &[(&str, &str)]) -> RequestHead {
        RequestHead {
            method: "POST".into(),
            target: "http://example.com/".into(),
            version_minor: 1,
            headers: fields
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
                .collect(),
        }
    }

    #[test]
    fn a_request_head() {
        let s = "GET http://example.com/a?b HTTP/1.1\r\nHost: example.com\r\nX-A:  1 \r\n\r\nBODY";
        let Parsed::Complete(h, n) = parse_request_head(s.as_bytes()).unwrap() else {
            panic!()
        };
        assert_eq!(&s[n..], "BODY");
        assert_eq!(h.method, "GET");
        assert_eq!(h.target, "http://example.com/a?b");
        assert_eq!(h.version_minor, 1);
        assert_eq!(
            h.headers,
            vec![
                ("Host".into(), b"example.com".to_vec()),
                ("X-A".into(), b"1".to_vec())
            ]
        );
        assert_eq!(req("CONNECT a:443 HTTP/1.0\r\n\r\n").version_minor, 0);
    }

    #[test]
    fn every_prefix_of_a_head_is_partial() {
        let s = b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n";
        for n in 0..s.len() {
            assert_eq!(parse_request_head(&s[..n]).unwrap(), Parsed::Partial, "{n}");
        }
        let s = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        for n in 0..s.len() {
            assert_eq!(
                parse_response_head(&s[..n]).unwrap(),
                Parsed::Partial,
                "{n}"
            );
        }
    }

    #[test]
    fn head_size_is_limited() {
        let filler = |n: usize| format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(n));
        let base = filler(0).len();
        let exact = filler(MAX_HEAD - base);
        assert_eq!(exact.len(), MAX_HEAD);
        assert!(matches!(
            parse_request_head(exact.as_bytes()),
            Ok(Parsed::Complete(_, MAX_HEAD))
        ));
        let over = filler(MAX_HEAD - base + 1);
        assert_eq!(
            parse_request_head(over.as_bytes()),
            Err(HttpError::HeadTooLarge { limit: MAX_HEAD })
        );
        // Already too long without a complete head.
        let partial = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD));
        assert_eq!(
            parse_request_head(&partial.as_bytes()[..MAX_HEAD - 1]),
            Ok(Parsed::Partial)
        );
        assert_eq!(
            parse_request_head(&partial.as_bytes()[..MAX_HEAD]),
            Err(HttpError::HeadTooLarge { limit: MAX_HEAD })
        );
        let big_response = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(
            parse_response_head(big_response.as_bytes()),
            Err(HttpError::HeadTooLarge { limit: MAX_HEAD })
        );
        // A complete head within the limit, followed by a long body, is fine.
        let body = format!("GET / HTTP/1.1\r\n\r\n{}", "b".repeat(2 * MAX_HEAD));
        assert!(matches!(
            parse_request_head(body.as_bytes()),
            Ok(Parsed::Complete(_, 18))
        ));
    }

    #[test]
    fn header_count_is_limited() {
        let head = |n: usize| {
            let fields: String = (0..n).map(|i| format!("X-{i}: v\r\n")).collect();
            format!("GET / HTTP/1.1\r\n{fields}\r\n")
        };
        assert_eq!(req(&head(MAX_HEADERS)).headers.len(), MAX_HEADERS);
        assert_eq!(
            parse_request_head(head(MAX_HEADERS + 1).as_bytes()),
            Err(HttpError::TooManyHeaders { limit: MAX_HEADERS })
        );
        let res = format!(
            "HTTP/1.1 200 OK\r\n{}\r\n",
            "X: v\r\n".repeat(MAX_HEADERS + 1)
        );
        assert_eq!(
            parse_response_head(res.as_bytes()),
            Err(HttpError::TooManyHeaders { limit: MAX_HEADERS })
        );
    }

    #[test]
    fn malformed_heads() {
        for s in [
            "GET / HTTP/2.0\r\n\r\n",
            "GET  / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nX : v\r\n\r\n",
            "GET / HTTP/1.1\r\nX: v\r\n continued\r\n\r\n",
            "GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",
            "GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
            "G(T / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\n: v\r\n\r\n",
        ] {
            assert!(
                matches!(
                    parse_request_head(s.as_bytes()),
                    Err(HttpError::Malformed { .. })
                ),
                "{s:?}"
            );
        }
    }

    #[test]
    fn bare_lf_is_refused() {
        for s in [
            "GET / HTTP/1.1\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\n\n",
            "\nGET / HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(
                parse_request_head(s.as_bytes()),
                Err(HttpError::BareLf),
                "{s:?}"
            );
        }
        assert_eq!(
            parse_request_head(b"GET / HTTP/1.1\n"),
            Err(HttpError::BareLf)
        );
        assert_eq!(
            parse_response_head(b"HTTP/1.1 200 OK\nContent-Length: 0\n\n"),
            Err(HttpError::BareLf)
        );
        // Body bytes after the head are not looked at.
        assert!(matches!(
            parse_request_head(b"GET / HTTP/1.1\r\n\r\n\n\n"),
            Ok(Parsed::Complete(_, 18))
        ));
    }

    #[test]
    fn a_response_head() {
        let h = res("HTTP/1.0 404 Not Found\r\nContent-Length: 3\r\n\r\n");
        assert_eq!(h.status, 404);
        assert_eq!(h.version_minor, 0);
        assert_eq!(h.headers, vec![("Content-Length".into(), b"3".to_vec())]);
        assert_eq!(
            parse_response_head(b"HTTP/1.1 099 Odd\r\n\r\n"),
            Err(HttpError::BadStatus { status: 99 })
        );
        assert!(parse_response_head(b"HTTP/1.1 20 OK\r\n\r\n").is_err());
    }

    #[test]
    fn request_framing() {
        assert_eq!(request_body(&with_headers(&[])), Ok(BodyLen::None));
        assert_eq!(
            request_body(&with_headers(&[("Content-Length", "12")])),
            Ok(BodyLen::Length(12))
        );
        assert_eq!(
            request_body(&with_headers(&[("Transfer-Encoding", "Chunked")])),
            Ok(BodyLen::Chunked)
        );
        assert_eq!(
            request_body(&with_headers(&[
                ("content-length", "5"),
                ("Content-Length", "5")
            ])),
            Ok(BodyLen::Length(5))
        );
        assert_eq!(
            request_body(&with_headers(&[("Content-Length", "5, 5")])),
            Ok(BodyLen::Length(5))
        );
        assert_eq!(
            request_body(&with_headers(&[("Content-Length", "18446744073709551615")])),
            Ok(BodyLen::Length(u64::MAX))
        );
    }

    #[test]
    fn smuggling_framings_are_refused() {
        use HttpError::*;
        for (fields, err) in [
            (
                &[("Transfer-Encoding", "chunked"), ("Content-Length", "5")][..],
                LengthAndChunked,
            ),
            (
                &[("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
                LengthAndChunked,
            ),
            (
                &[("Transfer-Encoding", "gzip, chunked")],
                TransferEncoding {
                    value: "gzip, chunked".into(),
                },
            ),
            (
                &[("Transfer-Encoding", "chunked, chunked")],
                TransferEncoding {
                    value: "chunked, chunked".into(),
                },
            ),
            (
                &[("Transfer-Encoding", "identity")],
                TransferEncoding {
                    value: "identity".into(),
                },
            ),
            (
                &[("Transfer-Encoding", "xchunked")],
                TransferEncoding {
                    value: "xchunked".into(),
                },
            ),
            (
                &[("Transfer-Encoding", "")],
                TransferEncoding { value: "".into() },
            ),
            (
                &[
                    ("Transfer-Encoding", "chunked"),
                    ("Transfer-Encoding", "chunked"),
                ],
                MultipleTransferEncoding,
            ),
            (
                &[("Content-Length", "5"), ("Content-Length", "6")],
                ConflictingContentLength,
            ),
            (&[("Content-Length", "5, 6")], ConflictingContentLength),
            (
                &[("Content-Length", "5"), ("Content-Length", "05")],
                ConflictingContentLength,
            ),
            (
                &[("Content-Length", "+5")],
                BadContentLength { value: "+5".into() },
            ),
            (
                &[("Content-Length", "-1")],
                BadContentLength { value: "-1".into() },
            ),
            (
                &[("Content-Length", "0x5")],
                BadContentLength {
                    value: "0x5".into(),
                },
            ),
            (
                &[("Content-Length", "5 5")],
                BadContentLength {
                    value: "5 5".into(),
                },
            ),
            (
                &[("Content-Length", "")],
                BadContentLength { value: "".into() },
            ),
            (
                &[("Content-Length", "5,")],
                BadContentLength { value: "5,".into() },
            ),
            (
                &[("Content-Length", "1e3")],
                BadContentLength {
                    value: "1e3".into(),
                },
            ),
            (
                &[("Content-Length", "18446744073709551616")],
                BadContentLength {
                    value: "18446744073709551616".into(),
                },
            ),
        ] {
            assert_eq!(request_body(&with_headers(fields)), Err(err), "{fields:?}");
        }
        let mut h10 = with_headers(&[("Transfer-Encoding", "chunked")]);
        h10.version_minor = 0;
        assert_eq!(request_body(&h10), Err(TransferEncodingHttp10));
    }

    #[test]
    fn framing_read_from_a_parsed_head() {
        // httparse trims the value; a tab-padded `chunked` is still chunked alone.
        let h = req("POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tchunked \r\n\r\n");
        assert_eq!(request_body(&h), Ok(BodyLen::Chunked));
        let h = req(
            "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
        );
        assert_eq!(request_body(&h), Err(HttpError::LengthAndChunked));
    }

    #[test]
    fn response_framing() {
        let r = |status: u16, fields: &[(&str, &str)]| ResponseHead {
            status,
            version_minor: 1,
            headers: fields
                .iter()
                .map(|(n, v)| ((*n).into(), v.as_bytes().to_vec()))
                .collect(),
        };
        let chunked = [("Transfer-Encoding", "chunked")];
        let cl = [("Content-Length", "7")];
        assert_eq!(response_body("HEAD", &r(200, &cl)), Ok(BodyLen::None));
        assert_eq!(response_body("HEAD", &r(200, &chunked)), Ok(BodyLen::None));
        assert_eq!(response_body("head", &r(200, &cl)), Ok(BodyLen::Length(7)));
        assert_eq!(response_body("GET", &r(100, &[])), Ok(BodyLen::None));
        assert_eq!(response_body("GET", &r(103, &cl)), Ok(BodyLen::None));
        assert_eq!(response_body("GET", &r(204, &cl)), Ok(BodyLen::None));
        assert_eq!(response_body("GET", &r(304, &chunked)), Ok(BodyLen::None));
        assert_eq!(
            response_body("GET", &r(200, &chunked)),
            Ok(BodyLen::Chunked)
        );
        assert_eq!(response_body("GET", &r(200, &cl)), Ok(BodyLen::Length(7)));
        assert_eq!(response_body("GET", &r(200, &[])), Ok(BodyLen::UntilClose));
        assert_eq!(response_body("POST", &r(500, &[])), Ok(BodyLen::UntilClose));
        assert_eq!(
            response_body("GET", &r(101, &[])),
            Err(HttpError::UnexpectedSwitchingProtocols)
        );
        assert_eq!(
            response_body(
                "GET",
                &r(
                    200,
                    &[("Transfer-Encoding", "chunked"), ("Content-Length", "7")]
                )
            ),
            Err(HttpError::LengthAndChunked)
        );
        assert_eq!(
            response_body(
                "GET",
                &r(200, &[("Content-Length", "7"), ("Content-Length", "8")])
            ),
            Err(HttpError::ConflictingContentLength)
        );
        let mut h10 = r(200, &chunked);
        h10.version_minor = 0;
        assert_eq!(
            response_body("GET", &h10),
            Err(HttpError::TransferEncodingHttp10)
        );
    }

    #[test]
    fn host_fields() {
        assert_eq!(host_header(&with_headers(&[])), Ok(None));
        assert_eq!(
            host_header(&with_headers(&[("HOST", "Example.com:80")])),
            Ok(Some("Example.com:80".into()))
        );
        assert_eq!(
            host_header(&with_headers(&[("Host", "a"), ("host", "a")])),
            Err(HttpError::MultipleHost)
        );
        let h = RequestHead {
            headers: vec![("Host".into(), b"b\xc3\xbccher.example".to_vec())],
            ..with_headers(&[])
        };
        assert!(matches!(
            host_header(&h),
            Err(HttpError::HostNotAscii { .. })
        ));
    }

    #[test]
    fn absolute_targets_check_the_host_field() {
        let mut h = with_headers(&[("Host", "Example.com")]);
        h.target = "http://example.com/x".into();
        let (t, p) = absolute_target(&h).unwrap();
        assert_eq!(
            t,
            Target {
                host: Host::Name("example.com".into()),
                port: 80
            }
        );
        assert_eq!(p, "/x");
        for host in ["example.com:80", "example.com.", "EXAMPLE.COM:80"] {
            h.headers = vec![("Host".into(), host.as_bytes().to_vec())];
            assert!(absolute_target(&h).is_ok(), "{host}");
        }
        for host in ["example.com:8080", "other.example", "a.example.com"] {
            h.headers = vec![("Host".into(), host.as_bytes().to_vec())];
            assert!(
                matches!(absolute_target(&h), Err(HttpError::HostMismatch { .. })),
                "{host}"
            );
        }
        h.headers = vec![("Host".into(), b"exa_mple.com".to_vec())];
        assert!(matches!(
            absolute_target(&h),
            Err(HttpError::BadHost { .. })
        ));
        h.headers = vec![];
        assert_eq!(absolute_target(&h), Err(HttpError::MissingHost));
        h.headers = vec![
            ("Host".into(), b"example.com".to_vec()),
            ("Host".into(), b"example.com".to_vec()),
        ];
        assert_eq!(absolute_target(&h), Err(HttpError::MultipleHost));
        h.headers = vec![("Host".into(), b"example.com".to_vec())];
        h.target = "/x".into();
        assert!(matches!(
            absolute_target(&h),
            Err(HttpError::Target(TargetError::NotAbsoluteUri { .. }))
        ));
        h.target = "https://example.com/".into();
        assert!(matches!(
            absolute_target(&h),
            Err(HttpError::Target(TargetError::HttpsAbsoluteForm { .. }))
        ));
        h.method = "CONNECT".into();
        h.target = "example.com:443".into();
        assert_eq!(absolute_target(&h), Err(HttpError::UnexpectedConnect));
    }

    #[test]
    fn connect_targets() {
        let h = req("CONNECT Example.com:443 HTTP/1.1\r\nHost: other\r\n\r\n");
        assert_eq!(
            connect_target(&h),
            Ok(Target {
                host: Host::Name("example.com".into()),
                port: 443
            })
        );
        let h = req("CONNECT example.com HTTP/1.1\r\n\r\n");
        assert!(matches!(
            connect_target(&h),
            Err(HttpError::Target(TargetError::MissingPort { .. }))
        ));
        let h = req("GET example.com:443 HTTP/1.1\r\n\r\n");
        assert!(matches!(
            connect_target(&h),
            Err(HttpError::NotConnect { .. })
        ));
        let h = req("connect example.com:443 HTTP/1.1\r\n\r\n");
        assert!(matches!(
            connect_target(&h),
            Err(HttpError::NotConnect { .. })
        ));
    }

    #[test]
    fn origin_form_drops_hop_by_hop_fields() {
        let h = req(concat!(
            "POST http://example.com/p?q HTTP/1.1\r\n",
            "Host: example.com\r\n",
            "Proxy-Connection: keep-alive\r\n",
            "Proxy-Authorization: Basic c2VjcmV0\r\n",
            "Connection: keep-alive, X-Secret , content-length, Transfer-Encoding, HOST\r\n",
            "Keep-Alive: timeout=5\r\n",
            "TE: trailers\r\n",
            "Upgrade: websocket\r\n",
            "Proxy-Authenticate: Basic\r\n",
            "x-secret: 1\r\n",
            "X-Kept: a b\r\n",
            "Transfer-Encoding: chunked\r\n",
            "Authorization: Bearer for-the-server\r\n",
            "\r\n"
        ));
        let out = String::from_utf8(origin_form_head(&h, "/p?q")).unwrap();
        assert_eq!(
            out,
            concat!(
                "POST /p?q HTTP/1.1\r\n",
                "Host: example.com\r\n",
                "X-Kept: a b\r\n",
                "Transfer-Encoding: chunked\r\n",
                "Authorization: Bearer for-the-server\r\n",
                "Connection: close\r\n",
                "\r\n"
            )
        );
        let again = req(&out);
        assert_eq!(again.target, "/p?q");
        assert_eq!(request_body(&again), Ok(BodyLen::Chunked));
    }

    #[test]
    fn origin_form_keeps_content_length_named_in_connection() {
        let h = with_headers(&[
            ("Host", "example.com"),
            ("Connection", "Content-Length"),
            ("Content-Length", "4"),
        ]);
        let out = String::from_utf8(origin_form_head(&h, "/")).unwrap();
        assert_eq!(
            out,
            "POST / HTTP/1.1\r\nHost: example.com\r\nContent-Length: 4\r\nConnection: close\r\n\r\n"
        );
    }

    fn scan_all(body: &[u8]) -> Result<(usize, bool), HttpError> {
        let mut s = ChunkedScanner::new();
        let n = s.feed(body)?;
        Ok((n, s.done()))
    }

    #[test]
    fn chunked_bodies() {
        let b = b"5\r\nhello\r\n0\r\n\r\nNEXT";
        assert_eq!(scan_all(b), Ok((b.len() - 4, true)));
        let b = b"a;ext=1;q=\"x y\"\r\n0123456789\r\n0\r\nX-T: v\r\nY:\r\n\r\n";
        assert_eq!(scan_all(b), Ok((b.len(), true)));
        let b = b"A \t;ext\r\n0123456789\r\n000\r\n\r\n";
        assert_eq!(scan_all(b), Ok((b.len(), true)));
        let b = b"0\r\n\r\n";
        assert_eq!(scan_all(b), Ok((5, true)));
        assert_eq!(scan_all(b"5\r\nhel"), Ok((6, false)));
        assert_eq!(scan_all(b"0\r\n\r"), Ok((4, false)));
        let b = chunked_body(&[1, 300, 0x10000], &["A: b"]);
        assert_eq!(scan_all(&b), Ok((b.len(), true)));
    }

    #[test]
    fn chunked_byte_by_byte() {
        let b = chunked_body(&[3, 17, 1], &["X-Digest: abc", "Y: z"]);
        let mut s = ChunkedScanner::new();
        for (i, byte) in b.iter().enumerate() {
            assert!(!s.done(), "done early at {i}");
            assert_eq!(s.feed(std::slice::from_ref(byte)), Ok(1));
        }
        assert!(s.done());
        assert_eq!(s.feed(b"more"), Ok(0));
        assert_eq!(s.feed(b""), Ok(0));
    }

    #[test]
    fn malformed_chunked_bodies() {
        for b in [
            &b" 5\r\nhello\r\n0\r\n\r\n"[..],
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\rhello\r\n0\r\n\r\n",
            b"5 \r\nhello\r\n0\r\n\r\n",
            b"5 x\r\nhello\r\n0\r\n\r\n",
            b"g\r\n",
            b"-1\r\n",
            b"\r\n",
            b"5\r\nhelloX\r\n0\r\n\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhello\r\r\n",
            b"5;a\x00b\r\nhello\r\n0\r\n\r\n",
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            b"0\r\n\n",
            b"0\r\n\r\r",
            b"0\r\nX: v\n\r\n",
            b"0\r\nX v\r\n\r\n",
            b"0\r\n: v\r\n\r\n",
            b"0\r\n X: v\r\n\r\n",
            b"0\r\nX: a\x01\r\n\r\n",
            b"0\r\nX: a\r\r\n",
            b"10000000000000000\r\n",
        ] {
            assert!(
                matches!(scan_all(b), Err(HttpError::BadChunked { .. })),
                "{:?}: {:?}",
                String::from_utf8_lossy(b),
                scan_all(b)
            );
        }
        // The largest size is read (its data is just never fed).
        assert_eq!(scan_all(b"ffffffffffffffff\r\nab"), Ok((20, false)));
    }

    #[test]
    fn a_failed_scanner_stays_failed() {
        let mut s = ChunkedScanner::new();
        assert!(s.feed(b"z").is_err());
        assert!(s.feed(b"0\r\n\r\n").is_err());
        assert!(!s.done());
    }

    #[test]
    fn chunk_lines_are_limited() {
        let line = |ext: usize| format!("1;{}\r\nx\r\n0\r\n\r\n", "e".repeat(ext));
        // "1;" + ext + CRLF = ext + 4 bytes.
        let ok = line(MAX_CHUNK_LINE - 4);
        assert_eq!(scan_all(ok.as_bytes()), Ok((ok.len(), true)));
        assert_eq!(
            scan_all(line(MAX_CHUNK_LINE - 3).as_bytes()),
            Err(HttpError::ChunkLineTooLong {
                limit: MAX_CHUNK_LINE
            })
        );
        // Leading zeros count too.
        let zeros = format!("{}1\r\nx\r\n0\r\n\r\n", "0".repeat(MAX_CHUNK_LINE));
        assert!(scan_all(zeros.as_bytes()).is_err());
        // The limit is per line, not per body.
        let many = format!(
            "{}0\r\n\r\n",
            format!("1;{}\r\nx\r\n", "e".repeat(1000)).repeat(20)
        );
        assert_eq!(scan_all(many.as_bytes()), Ok((many.len(), true)));
    }

    #[test]
    fn trailers_are_limited() {
        let with = |n: usize| format!("0\r\nX: {}\r\n\r\n", "v".repeat(n));
        // "X: " + n + CRLF + CRLF = n + 7 bytes of trailers.
        let ok = with(MAX_TRAILERS - 7);
        assert_eq!(scan_all(ok.as_bytes()), Ok((ok.len(), true)));
        assert_eq!(
            scan_all(with(MAX_TRAILERS - 6).as_bytes()),
            Err(HttpError::TrailersTooLarge {
                limit: MAX_TRAILERS
            })
        );
    }

    #[test]
    fn errors_say_what_to_send() {
        let e = HttpError::TransferEncoding {
            value: "gzip".into(),
        }
        .to_string();
        assert!(e.contains("chunked"), "{e}");
        let e = HttpError::BadChunked { what: "x" }.to_string();
        assert!(e.contains("0 CRLF CRLF"), "{e}");
    }
}
