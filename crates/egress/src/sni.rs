//! The server name a TLS client asks for: the `server_name` extension (SNI) of the
//! ClientHello a client sends first through a CONNECT tunnel, read from the bytes it has sent
//! so far, so the broker can refuse a name other than the CONNECT host (domain fronting).

use std::collections::BTreeSet;

use crate::target::{Host, parse_host};

/// The most bytes a ClientHello (its handshake header included) may take, however many
/// records carry it.
pub const MAX_CLIENT_HELLO: usize = 64 * 1024;

/// The most bytes of one TLS record's fragment (RFC 8446, 5.1).
pub const MAX_RECORD: usize = 1 << 14;

const HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
const SERVER_NAME: u16 = 0;
const HOST_NAME: u8 = 0;

/// What the bytes a client sent so far say about its server name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A valid beginning of a ClientHello: read more bytes and ask again.
    NeedMore,
    /// Not TLS: the first record is not a handshake record of TLS 1.0 to 1.3 (or SSL 3).
    NotTls,
    /// The server name, lowercased, without a trailing dot; a valid DNS name, never an
    /// address.
    Sni(String),
    /// A complete ClientHello without a `server_name` extension.
    NoSni,
    /// A malformed ClientHello, or one this check refuses; the reason is for logs.
    Invalid(&'static str),
}

/// Reads the server name from the bytes a client has sent so far (`buf` starts at the
/// first byte it sent).
///
/// The bytes must be TLS records of content type 22 (handshake), record version 3.0 to 3.4,
/// each 1 to 16384 bytes long, whose fragments together start with one ClientHello
/// (handshake type 1) of at most [`MAX_CLIENT_HELLO`] bytes and hold nothing else: the
/// ClientHello may be split across records at any byte. Bytes after the record that ends the
/// ClientHello are not looked at (they are for the server).
///
/// The ClientHello is parsed in full: legacy version 3.x, random, session id (at most 32
/// bytes), cipher suites (a non-empty even length), compression methods (non-empty) and the
/// extensions, whose lengths must add up exactly. An extension type may appear once. The
/// `server_name` extension must hold exactly one entry, of type host_name, that
/// [`parse_host`] reads as a name: an address or any spelling of one is refused, as
/// RFC 6066 forbids literal addresses there.
///
/// Encrypted Client Hello (extension `0xfe0d`) is not refused here: its inner, real server
/// name cannot be read, and only the outer name is returned.
///
/// Never panics, whatever the input.
pub fn client_hello_server_name(buf: &[u8]) -> Hello {
    let mut handshake: Vec<u8> = Vec::new();
    let mut at = 0;
    loop {
        let first = at == 0;
        let rest = &buf[at..];
        let refuse = |why| {
            if first {
                Hello::NotTls
            } else {
                Hello::Invalid(why)
            }
        };
        match rest.first() {
            None => return Hello::NeedMore,
            Some(&HANDSHAKE) => {}
            Some(_) => {
                return refuse("a record other than a handshake before the ClientHello ended");
            }
        }
        match rest.get(1) {
            None => return Hello::NeedMore,
            Some(3) => {}
            Some(_) => return refuse("a record version other than 3.x"),
        }
        match rest.get(2) {
            None => return Hello::NeedMore,
            Some(0..=4) => {}
            Some(_) => return refuse("a record version above 3.4"),
        }
        let Some(len) = rest.get(3..5) else {
            return Hello::NeedMore;
        };
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        if len == 0 {
            return Hello::Invalid("an empty handshake record");
        }
        if len > MAX_RECORD {
            return Hello::Invalid("a record longer than 16384 bytes");
        }
        let fragment = &rest[5..rest.len().min(5 + len)];
        let declared = handshake.len() + len;
        handshake.extend_from_slice(fragment);
        if handshake.first().is_some_and(|&t| t != CLIENT_HELLO) {
            return Hello::Invalid("the first handshake message is not a ClientHello");
        }
        if let Some(h) = handshake.get(1..4) {
            let total = 4 + (usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]));
            if total > MAX_CLIENT_HELLO {
                return Hello::Invalid("a ClientHello longer than 64 KiB");
            }
            if declared > total {
                return Hello::Invalid("handshake bytes after the ClientHello");
            }
            if handshake.len() == total {
                return parse_client_hello(&handshake[4..]);
            }
        }
        if fragment.len() < len {
            return Hello::NeedMore;
        }
        at += 5 + len;
    }
}

/// A cursor over a complete message; running out of bytes is a malformed length.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if n > self.rest.len() {
            return Err("a length runs past the end of the ClientHello");
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, &'static str> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one-byte length.
    fn vec8(&mut self) -> Result<&'a [u8], &'static str> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    /// A vector with a two-byte length.
    fn vec16(&mut self) -> Result<&'a [u8], &'static str> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

fn parse_client_hello(body: &[u8]) -> Hello {
    match server_name(body) {
        Ok(Some(name)) => Hello::Sni(name),
        Ok(None) => Hello::NoSni,
        Err(why) => Hello::Invalid(why),
    }
}

/// The server name of a complete ClientHello body (after its handshake header).
fn server_name(body: &[u8]) -> Result<Option<String>, &'static str> {
    let mut r = Reader { rest: body };
    if r.take(2)?[0] != 3 {
        return Err("a ClientHello version other than 3.x");
    }
    r.take(32)?;
    if r.vec8()?.len() > 32 {
        return Err("a session id longer than 32 bytes");
    }
    let suites = r.vec16()?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err("a cipher suite list that is empty or of odd length");
    }
    if r.vec8()?.is_empty() {
        return Err("an empty compression method list");
    }
    if r.is_empty() {
        // A ClientHello without extensions (TLS 1.0 allows it).
        return Ok(None);
    }
    let mut extensions = Reader { rest: r.vec16()? };
    if !r.is_empty() {
        return Err("bytes after the extensions");
    }
    let mut seen = BTreeSet::new();
    let mut name = None;
    while !extensions.is_empty() {
        let ty = extensions.u16()?;
        let data = extensions.vec16()?;
        if !seen.insert(ty) {
            return Err(if ty == SERVER_NAME {
                "a second server_name extension"
            } else {
                "an extension that appears twice"
            });
        }
        if ty == SERVER_NAME {
            name = Some(host_name(data)?);
        }
    }
    Ok(name)
}

/// The one host_name of a `server_name` extension's data (RFC 6066, 3).
fn host_name(data: &[u8]) -> Result<String, &'static str> {
    let mut r = Reader { rest: data };
    let mut list = Reader { rest: r.vec16()? };
    if !r.is_empty() {
        return Err("bytes after the server name list");
    }
    if list.is_empty() {
        return Err("an empty server name list");
    }
    let mut found = None;
    while !list.is_empty() {
        if list.u8()? != HOST_NAME {
            return Err("a server name of a type other than host_name");
        }
        let name = list.vec16()?;
        if found.is_some() {
            return Err("two host names in server_name");
        }
        found = Some(name);
    }
    let name = found.unwrap_or_default();
    let name = std::str::from_utf8(name).map_err(|_| "a server name that is not ASCII")?;
    match parse_host(name) {
        Ok(Host::Name(n)) => Ok(n),
        Ok(Host::Ip(_)) => Err("an IP address as server name (RFC 6066 allows names only)"),
        Err(e) if e.is_ip_literal() => {
            Err("an IP address as server name (RFC 6066 allows names only)")
        }
        Err(_) => Err("a server name that is not a valid DNS name"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_support::{ClientHello, record, server_name_ext};

    /// Captured from CPython 3's `ssl` module (OpenSSL 3.0.19) with a memory BIO, never on
    /// a network:
    ///
    /// ```text
    /// ctx = ssl.create_default_context(); inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    /// obj = ctx.wrap_bio(inc, out, server_hostname="Example.COM.")
    /// obj.do_handshake()   # raises SSLWantReadError
    /// open("python-clienthello.bin", "wb").write(out.read())
    /// ```
    ///
    /// Its server_name is `Example.COM.` as given (mixed case, a trailing dot).
    const PYTHON_HELLO: &[u8] = include_bytes!("../tests/fixtures/python-clienthello.bin");

    /// Captured from `openssl s_client -connect 127.0.0.1:PORT -servername api.example.org`
    /// (OpenSSL 3.0.19) against a local Python socket that saved the first record it read.
    const OPENSSL_HELLO: &[u8] =
        include_bytes!("../tests/fixtures/openssl-s_client-clienthello.bin");

    #[test]
    fn real_client_hellos() {
        assert_eq!(
            client_hello_server_name(PYTHON_HELLO),
            Hello::Sni("example.com".into())
        );
        assert_eq!(
            client_hello_server_name(OPENSSL_HELLO),
            Hello::Sni("api.example.org".into())
        );
    }

    #[test]
    fn real_hello_prefixes_need_more() {
        for hello in [PYTHON_HELLO, OPENSSL_HELLO] {
            for n in 0..hello.len() {
                assert_eq!(
                    client_hello_server_name(&hello[..n]),
                    Hello::NeedMore,
                    "{n}"
                );
            }
        }
    }

    #[test]
    fn bytes_after_the_hello_record_are_ignored() {
        let mut b = OPENSSL_HELLO.to_vec();
        b.extend_from_slice(&[23, 3, 3, 0, 1, 0xff]);
        assert_eq!(
            client_hello_server_name(&b),
            Hello::Sni("api.example.org".into())
        );
    }

    #[test]
    fn a_hello_split_across_records() {
        let h = ClientHello::with_sni("Split.Example.");
        let handshake = h.handshake();
        for at in 1..handshake.len() {
            let b = [
                record(22, [3, 1], &handshake[..at]),
                record(22, [3, 3], &handshake[at..]),
            ]
            .concat();
            assert_eq!(
                client_hello_server_name(&b),
                Hello::Sni("split.example".into()),
                "split at {at}"
            );
            for n in 0..b.len() {
                assert_eq!(client_hello_server_name(&b[..n]), Hello::NeedMore);
            }
        }
        let one_byte_records: Vec<u8> = handshake
            .iter()
            .flat_map(|&b| record(22, [3, 1], &[b]))
            .collect();
        assert_eq!(
            client_hello_server_name(&one_byte_records),
            Hello::Sni("split.example".into())
        );
    }

    #[test]
    fn not_tls() {
        for b in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"CONNECT x:1 HTTP/1.1\r\n",
            &[0x80, 0x2e, 0x01, 0x03, 0x01],
            &[23, 3, 3, 0, 5],
            &[22, 2, 0, 0, 5],
            &[22, 3, 5],
            &[22, 0],
            &[0],
        ] {
            assert_eq!(client_hello_server_name(b), Hello::NotTls, "{b:?}");
        }
        assert_eq!(client_hello_server_name(&[]), Hello::NeedMore);
        assert_eq!(client_hello_server_name(&[22]), Hello::NeedMore);
        assert_eq!(client_hello_server_name(&[22, 3, 0]), Hello::NeedMore);
        assert_eq!(client_hello_server_name(&[22, 3, 4, 0]), Hello::NeedMore);
    }

    #[test]
    fn bad_later_records_are_invalid() {
        let handshake = ClientHello::with_sni("a.example").handshake();
        let first = record(22, [3, 1], &handshake[..10]);
        for second in [
            record(21, [3, 1], &handshake[10..]),
            record(22, [2, 0], &handshake[10..]),
            record(22, [3, 9], &handshake[10..]),
        ] {
            assert!(matches!(
                client_hello_server_name(&[first.clone(), second].concat()),
                Hello::Invalid(_)
            ));
        }
    }

    #[test]
    fn record_lengths() {
        assert_eq!(
            client_hello_server_name(&[22, 3, 1, 0, 0]),
            Hello::Invalid("an empty handshake record")
        );
        assert_eq!(
            client_hello_server_name(&[22, 3, 1, 0x40, 0x01]),
            Hello::Invalid("a record longer than 16384 bytes")
        );
        assert_eq!(
            client_hello_server_name(&[22, 3, 1, 0x40, 0x00]),
            Hello::NeedMore
        );
    }

    #[test]
    fn only_a_client_hello_is_read() {
        // A ServerHello (type 2) where a ClientHello belongs.
        assert!(matches!(
            client_hello_server_name(&record(22, [3, 3], &[2, 0, 0, 4, 3, 3, 0, 0])),
            Hello::Invalid("the first handshake message is not a ClientHello")
        ));
        // Another handshake message after the ClientHello, in the same record.
        let mut hs = ClientHello::with_sni("a.example").handshake();
        hs.extend_from_slice(&[20, 0, 0, 0]);
        assert_eq!(
            client_hello_server_name(&record(22, [3, 1], &hs)),
            Hello::Invalid("handshake bytes after the ClientHello")
        );
        // Known as soon as the record header says so.
        let hs = ClientHello::with_sni("a.example").handshake();
        let mut r = record(22, [3, 1], &hs);
        r[4] += 1;
        assert!(matches!(
            client_hello_server_name(&r[..10]),
            Hello::Invalid(_)
        ));
    }

    #[test]
    fn the_hello_size_is_capped() {
        // A handshake header claiming 64 KiB of body.
        let b = record(22, [3, 1], &[1, 0x01, 0x00, 0x00]);
        assert_eq!(
            client_hello_server_name(&b),
            Hello::Invalid("a ClientHello longer than 64 KiB")
        );
        // A real one just under the cap, padded with an extension, in several records.
        let mut h = ClientHello::with_sni("big.example");
        let base = h.handshake().len();
        h.extensions
            .push((21, vec![0; MAX_CLIENT_HELLO - base - 4]));
        let hs = h.handshake();
        assert_eq!(hs.len(), MAX_CLIENT_HELLO);
        let recs: Vec<u8> = hs
            .chunks(MAX_RECORD)
            .flat_map(|c| record(22, [3, 1], c))
            .collect();
        assert_eq!(
            client_hello_server_name(&recs),
            Hello::Sni("big.example".into())
        );
        let mut h = ClientHello::with_sni("big.example");
        h.extensions
            .push((21, vec![0; MAX_CLIENT_HELLO - base - 3]));
        let recs: Vec<u8> = h
            .handshake()
            .chunks(MAX_RECORD)
            .flat_map(|c| record(22, [3, 1], c))
            .collect();
        assert_eq!(
            client_hello_server_name(&recs),
            Hello::Invalid("a ClientHello longer than 64 KiB")
        );
    }

    #[test]
    fn no_sni() {
        let mut h = ClientHello::default();
        assert_eq!(client_hello_server_name(&h.record()), Hello::NoSni);
        h.extensions.push((10, vec![0, 2, 0, 29]));
        assert_eq!(client_hello_server_name(&h.record()), Hello::NoSni);
        h.extensions = Vec::new();
        h.no_extension_block = true;
        assert_eq!(client_hello_server_name(&h.record()), Hello::NoSni);
    }

    #[test]
    fn sni_is_normalized() {
        for (sent, got) in [("Example.COM", "example.com"), ("a.example.", "a.example")] {
            assert_eq!(
                client_hello_server_name(&ClientHello::with_sni(sent).record()),
                Hello::Sni(got.into())
            );
        }
    }

    #[test]
    fn fixed_fields_are_checked() {
        let check = |f: &dyn Fn(&mut ClientHello), why: &'static str| {
            let mut h = ClientHello::with_sni("a.example");
            f(&mut h);
            assert_eq!(client_hello_server_name(&h.record()), Hello::Invalid(why));
        };
        check(
            &|h| h.version = [2, 0],
            "a ClientHello version other than 3.x",
        );
        check(
            &|h| h.session_id = vec![0; 33],
            "a session id longer than 32 bytes",
        );
        check(
            &|h| h.suites = vec![],
            "a cipher suite list that is empty or of odd length",
        );
        check(
            &|h| h.suites = vec![0x13],
            "a cipher suite list that is empty or of odd length",
        );
        check(
            &|h| h.compression = vec![],
            "an empty compression method list",
        );
        check(&|h| h.trailing = vec![0], "bytes after the extensions");
        // A session id of 32 bytes is fine.
        let mut h = ClientHello::with_sni("a.example");
        h.session_id = vec![7; 32];
        assert_eq!(
            client_hello_server_name(&h.record()),
            Hello::Sni("a.example".into())
        );
    }

    #[test]
    fn truncated_lengths_are_invalid() {
        // Every length field made one too large, in a hello whose outer lengths still agree.
        let h = ClientHello::with_sni("a.example");
        let body = h.body();
        // The extensions block length is at a fixed place for this builder's hello.
        let ext_at = 2 + 32 + 1 + h.session_id.len() + 2 + h.suites.len() + 1 + h.compression.len();
        for at in [ext_at, ext_at + 2 + 2, ext_at + 2 + 4, ext_at + 2 + 4 + 3] {
            let mut b = body.clone();
            let n = u16::from_be_bytes([b[at], b[at + 1]]);
            b[at..at + 2].copy_from_slice(&(n + 1).to_be_bytes());
            let hs = [&[1, 0][..], &(b.len() as u16).to_be_bytes(), &b].concat();
            assert!(
                matches!(
                    client_hello_server_name(&record(22, [3, 1], &hs)),
                    Hello::Invalid(_)
                ),
                "length at {at}"
            );
        }
    }

    #[test]
    fn server_name_extension_rules() {
        let with = |data: Vec<u8>| {
            let mut h = ClientHello::default();
            h.extensions.push((0, data));
            client_hello_server_name(&h.record())
        };
        assert_eq!(
            with(server_name_ext(&[(0, b"ok.example")])),
            Hello::Sni("ok.example".into())
        );
        assert_eq!(
            with(vec![]),
            Hello::Invalid("a length runs past the end of the ClientHello")
        );
        assert_eq!(
            with(vec![0, 0]),
            Hello::Invalid("an empty server name list")
        );
        assert_eq!(
            with([server_name_ext(&[(0, b"a.example")]), vec![0]].concat()),
            Hello::Invalid("bytes after the server name list")
        );
        assert_eq!(
            with(server_name_ext(&[(0, b"a.example"), (0, b"b.example")])),
            Hello::Invalid("two host names in server_name")
        );
        assert_eq!(
            with(server_name_ext(&[(1, b"a.example")])),
            Hello::Invalid("a server name of a type other than host_name")
        );
        assert_eq!(
            with(server_name_ext(&[(0, b"")])),
            Hello::Invalid("a server name that is not a valid DNS name")
        );
        for bad in [
            &b"a_b.example"[..],
            b"a..example",
            b"-a.example",
            b"a b",
            b"a.example\0",
            b"a:443",
        ] {
            assert_eq!(
                with(server_name_ext(&[(0, bad)])),
                Hello::Invalid("a server name that is not a valid DNS name"),
                "{bad:?}"
            );
        }
        assert_eq!(
            with(server_name_ext(&[(0, "bücher.example".as_bytes())])),
            Hello::Invalid("a server name that is not a valid DNS name")
        );
        assert_eq!(
            with(server_name_ext(&[(0, b"\xff")])),
            Hello::Invalid("a server name that is not ASCII")
        );
        for ip in [
            &b"127.0.0.1"[..],
            b"127.1",
            b"2130706433",
            b"::1",
            b"[::1]",
            b"0x7f.0.0.1",
        ] {
            assert_eq!(
                with(server_name_ext(&[(0, ip)])),
                Hello::Invalid("an IP address as server name (RFC 6066 allows names only)"),
                "{ip:?}"
            );
        }
    }

    #[test]
    fn duplicate_extensions_are_invalid() {
        let mut h = ClientHello::with_sni("a.example");
        h.extensions
            .push((0, server_name_ext(&[(0, b"b.example")])));
        assert_eq!(
            client_hello_server_name(&h.record()),
            Hello::Invalid("a second server_name extension")
        );
        let mut h = ClientHello::with_sni("a.example");
        h.extensions.push((43, vec![2, 3, 4]));
        h.extensions.push((43, vec![2, 3, 4]));
        assert_eq!(
            client_hello_server_name(&h.record()),
            Hello::Invalid("an extension that appears twice")
        );
    }
}
