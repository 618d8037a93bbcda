//! Whether an API's answer would hand the sandbox its run's credential: the exact bytes, or
//! any of the re-encodings an API commonly applies when it echoes a header (JSON escapes such
//! as `\/` and `\u0026`, percent-encoding, base64 in both alphabets, base32 in both RFC 4648
//! alphabets, hex, any of them broken by whitespace), searched in the raw body, in every key
//! and string the sandbox would receive once the body is decoded, and in what a gzip or zlib
//! body inflates to.
//!
//! A match withholds the answer. A false match only withholds an answer; a missed one leaks
//! the credential, so the search errs towards matching. It is a list, and a list misses the
//! encoding it does not name (split, reversed, encrypted): docs/capability-grants.md says
//! exactly what is searched, and recommends a minted credential that is not worth stealing.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use plimsoll_secret::Secret;
use serde_json::Value;

/// The forms of one credential to look for: secret material itself, so each list is a
/// [`Secret`] (never printed, zeroed when dropped).
#[derive(Debug)]
pub(crate) struct Needles {
    /// Searched as they are.
    exact: Secret<Vec<Vec<u8>>>,
    /// Searched in a lowercased copy (hex).
    folded: Secret<Vec<Vec<u8>>>,
}

impl Needles {
    /// The forms of `secret`.
    pub(crate) fn new(secret: &[u8]) -> Needles {
        let mut exact = vec![secret.to_vec()];
        // Base64 of a longer text holding the secret at any offset: for each of the three
        // alignments, the characters fixed by whole 3-byte groups of the secret alone.
        for skip in 0..3 {
            let rest = secret.get(skip..).unwrap_or_default();
            let whole = &rest[..rest.len() - rest.len() % 3];
            if whole.len() >= 6 {
                exact.push(STANDARD_NO_PAD.encode(whole).into_bytes());
                exact.push(URL_SAFE_NO_PAD.encode(whole).into_bytes());
            }
        }
        exact.sort();
        exact.dedup();
        let mut folded = vec![hex::encode(secret).into_bytes()];
        // Base32 (RFC 4648 §6 and the base32hex alphabet of §7), the same way: 5-byte groups,
        // each written as 8 characters, at each of the five alignments. Upper or lower case,
        // with or without `=` padding: searched in a lowercased copy, without the padding.
        for skip in 0..5 {
            let rest = secret.get(skip..).unwrap_or_default();
            let whole = &rest[..rest.len() - rest.len() % 5];
            if whole.len() >= 5 {
                for alphabet in [BASE32, BASE32_HEX] {
                    folded.push(base32_lower(alphabet, whole));
                }
            }
        }
        folded.sort();
        folded.dedup();
        Needles {
            exact: Secret::new(exact),
            folded: Secret::new(folded),
        }
    }

    /// Whether `text` holds a form of the secret, as it is or with its ASCII whitespace
    /// removed (an encoder that wraps its lines, as MIME base64 does every 76 characters,
    /// breaks an encoded credential; the credential itself holds no whitespace, so removing
    /// it can only find more).
    fn in_text(&self, text: &[u8]) -> bool {
        if self.in_text_as_is(text) {
            return true;
        }
        if text.iter().any(u8::is_ascii_whitespace) {
            let joined: Vec<u8> = text
                .iter()
                .copied()
                .filter(|b| !b.is_ascii_whitespace())
                .collect();
            return self.in_text_as_is(&joined);
        }
        false
    }

    fn in_text_as_is(&self, text: &[u8]) -> bool {
        if self.exact.expose().iter().any(|n| contains(text, n)) {
            return true;
        }
        let lower = text.to_ascii_lowercase();
        self.folded.expose().iter().any(|n| contains(&lower, n))
    }

    /// Whether `text`, or what it reads as once its JSON escapes or its percent-encoding are
    /// undone (in either order), holds the secret in any of its forms. A reading that would
    /// change nothing (no `\`, or no `%` and `+`) is not made.
    fn in_any_reading(&self, text: &[u8]) -> bool {
        if self.in_text(text) {
            return true;
        }
        let escaped = memchr::memchr(b'\\', text).is_some();
        let encoded = memchr::memchr2(b'%', b'+', text).is_some();
        if escaped {
            let unescaped = json_unescape(text);
            if self.in_text(&unescaped)
                || (encoded || memchr::memchr2(b'%', b'+', &unescaped).is_some())
                    && self.in_text(&percent_decode(&unescaped))
            {
                return true;
            }
        }
        if encoded {
            let decoded = percent_decode(text);
            if self.in_text(&decoded)
                || memchr::memchr(b'\\', &decoded).is_some()
                    && self.in_text(&json_unescape(&decoded))
            {
                return true;
            }
        }
        false
    }

    /// Whether an answer whose raw body is `body`, and which reaches the sandbox as `value`,
    /// carries the secret. The raw body is searched as bytes, whatever its encoding, besides
    /// the value the sandbox gets (where a body that is not UTF-8 arrives lossy). A body that
    /// starts as gzip or zlib does (whatever its `Content-Encoding` said) is also inflated, to
    /// at most `max_inflated` bytes, and what it inflates to is searched the same way (up to
    /// where it stops inflating, for one that is broken); one that inflates to more counts as
    /// carrying the secret, since it cannot be searched whole.
    pub(crate) fn found(&self, body: &[u8], value: &Value, max_inflated: u64) -> bool {
        if self.in_any_reading(body) || self.in_value(value) {
            return true;
        }
        match inflate(body, max_inflated) {
            Inflated::NotCompressed => false,
            Inflated::Whole(inner) | Inflated::Broken(inner) => {
                self.in_any_reading(&inner)
                    || serde_json::from_slice::<Value>(&inner).is_ok_and(|v| self.in_value(&v))
            }
            Inflated::TooLarge => true,
        }
    }

    fn in_value(&self, v: &Value) -> bool {
        match v {
            Value::String(s) => self.in_any_reading(s.as_bytes()),
            Value::Array(items) => items.iter().any(|i| self.in_value(i)),
            Value::Object(map) => map
                .iter()
                .any(|(k, v)| self.in_any_reading(k.as_bytes()) || self.in_value(v)),
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
        }
    }
}

/// RFC 4648 §6's alphabet.
const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
/// RFC 4648 §7's (base32hex).
const BASE32_HEX: &[u8; 32] = b"0123456789ABCDEFGHIJKLMNOPQRSTUV";

/// `data` (whole 5-byte groups) in base32 with `alphabet`, lowercased, without padding.
fn base32_lower(alphabet: &[u8; 32], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() / 5 * 8);
    for group in data.chunks_exact(5) {
        let bits = group.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b));
        for i in (0..8).rev() {
            let c = alphabet[(bits >> (i * 5) & 31) as usize];
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// What a body that may be compressed inflates to.
enum Inflated {
    /// It does not start as gzip (`1f 8b 08`) or zlib (deflate, a header whose check holds).
    NotCompressed,
    /// All of it, within the cap.
    Whole(Vec<u8>),
    /// More than the cap.
    TooLarge,
    /// It starts as one but does not inflate to the end: what it inflated to until then.
    Broken(Vec<u8>),
}

/// Inflates a gzip (every member) or zlib body to at most `max` bytes.
fn inflate(body: &[u8], max: u64) -> Inflated {
    use std::io::Read as _;
    let reader: Box<dyn std::io::Read + '_> = match body {
        [0x1f, 0x8b, 0x08, ..] => Box::new(flate2::read::MultiGzDecoder::new(body)),
        // RFC 1950: deflate (CM 8) with a window of at most 32 KiB, no preset dictionary, and
        // the header's check. A text can start so too (`x^`...): it then fails to inflate at
        // once, and only what it inflated to (nothing) is searched.
        [cmf, flg, ..]
            if cmf & 0x0f == 8
                && cmf >> 4 <= 7
                && flg & 0x20 == 0
                && (u16::from(*cmf) << 8 | u16::from(*flg)) % 31 == 0 =>
        {
            Box::new(flate2::read::ZlibDecoder::new(body))
        }
        _ => return Inflated::NotCompressed,
    };
    let mut out = Vec::new();
    match reader.take(max.saturating_add(1)).read_to_end(&mut out) {
        Ok(_) if out.len() as u64 > max => Inflated::TooLarge,
        Ok(_) => Inflated::Whole(out),
        Err(_) => Inflated::Broken(out),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && memchr::memmem::find(haystack, needle).is_some()
}

/// `%XX` sequences (either case) as the bytes they stand for, and `+` as a space; anything
/// else as it is.
fn percent_decode(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] == b'%'
            && let Some(b) = text.get(i + 1..i + 3).and_then(hex_byte)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(if text[i] == b'+' { b' ' } else { text[i] });
        i += 1;
    }
    out
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    u8::from_str_radix(std::str::from_utf8(two).ok()?, 16).ok()
}

/// JSON string escapes (`\/`, `\"`, `\\`, `\n`…, `\uXXXX` with surrogate pairs) undone
/// wherever they appear, leniently: a text that is not JSON still reads as the code would
/// read it after unescaping it by hand.
fn json_unescape(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] != b'\\' || i + 1 >= text.len() {
            out.push(text[i]);
            i += 1;
            continue;
        }
        let simple = match text[i + 1] {
            b'/' => Some(b'/'),
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'b' => Some(8),
            b'f' => Some(12),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            _ => None,
        };
        if let Some(b) = simple {
            out.push(b);
            i += 2;
            continue;
        }
        if let Some((c, used)) = unicode_escape(&text[i..]) {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            i += used;
            continue;
        }
        out.push(text[i]);
        i += 1;
    }
    out
}

/// `\uXXXX`, or a surrogate pair `\uD8XX\uDCXX`, at the start of `text`: the character and
/// the bytes it took.
fn unicode_escape(text: &[u8]) -> Option<(char, usize)> {
    let unit = |t: &[u8]| -> Option<u32> {
        let digits = t.strip_prefix(b"\\u")?.get(..4)?;
        u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    };
    let first = unit(text)?;
    if (0xD800..0xDC00).contains(&first) {
        let second = unit(text.get(6..)?)?;
        if (0xDC00..0xE000).contains(&second) {
            let c = 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
            return Some((char::from_u32(c)?, 12));
        }
        return None;
    }
    Some((char::from_u32(first)?, 6))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};
    use serde_json::json;

    const SECRETS: &[&str] = &[
        "tok-3f9a1c7e5b2d4a6c8e0f",
        "tok/3f9a&1c7e+5b2d=4a6c<8e>0f",
        // A JWT's shape.
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLWJ5dGVz",
    ];

    /// Every way an echoing API in the tests writes `text` (the header it saw).
    fn echoes(text: &str) -> Vec<(&'static str, Vec<u8>)> {
        let php = serde_json::to_string(&json!({"saw": text}))
            .unwrap()
            .replace('/', "\\/");
        let go = serde_json::to_string(&json!({"saw": text}))
            .unwrap()
            .replace('&', "\\u0026")
            .replace('<', "\\u003c")
            .replace('>', "\\u003e");
        let every: String = text
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_string()
                } else {
                    format!("\\u{:04x}", c as u32)
                }
            })
            .collect();
        let percent: String = text.bytes().map(|b| format!("%{b:02X}")).collect();
        let percent_lower: String = text
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02x}")
                }
            })
            .collect();
        let nested = serde_json::to_string(&json!({
            "outer": serde_json::to_string(&json!({"inner": text})).unwrap()
        }))
        .unwrap();
        vec![
            ("raw", format!("{{\"saw\":\"{text}\"}}").into_bytes()),
            ("php slashes", php.into_bytes()),
            ("go html escapes", go.into_bytes()),
            (
                "every char escaped",
                format!("{{\"saw\":\"{every}\"}}").into_bytes(),
            ),
            ("percent", format!("saw={percent}").into_bytes()),
            ("percent lower", format!("saw={percent_lower}").into_bytes()),
            (
                "percent in json",
                format!("{{\"q\":\"saw={percent}\"}}").into_bytes(),
            ),
            (
                "base64",
                format!("{{\"b\":\"{}\"}}", STANDARD.encode(text)).into_bytes(),
            ),
            (
                "base64url",
                format!("{{\"b\":\"{}\"}}", URL_SAFE.encode(text)).into_bytes(),
            ),
            (
                "base64 escaped",
                format!(
                    "{{\"b\":\"{}\"}}",
                    STANDARD.encode(text).replace('/', "\\/")
                )
                .into_bytes(),
            ),
            (
                "hex",
                format!("{{\"h\":\"{}\"}}", hex::encode(text)).into_bytes(),
            ),
            (
                "HEX",
                format!("{{\"h\":\"{}\"}}", hex::encode_upper(text)).into_bytes(),
            ),
            ("nested json", nested.into_bytes()),
            ("key", format!("{{\"{text}\":1}}").into_bytes()),
            ("not json", format!("you sent <{text}>").into_bytes()),
            (
                "base32",
                format!("{{\"b\":\"{}\"}}", base32_reference(BASE32, text, true)).into_bytes(),
            ),
            (
                "base32 unpadded",
                format!("{{\"b\":\"{}\"}}", base32_reference(BASE32, text, false)).into_bytes(),
            ),
            (
                "base32 lower",
                format!(
                    "{{\"b\":\"{}\"}}",
                    base32_reference(BASE32, text, true).to_ascii_lowercase()
                )
                .into_bytes(),
            ),
            (
                "base32hex",
                format!("{{\"b\":\"{}\"}}", base32_reference(BASE32_HEX, text, true)).into_bytes(),
            ),
            (
                "base32hex lower unpadded",
                format!(
                    "{{\"b\":\"{}\"}}",
                    base32_reference(BASE32_HEX, text, false).to_ascii_lowercase()
                )
                .into_bytes(),
            ),
            (
                "base64 in MIME lines",
                format!(
                    "{{\"b\":{}}}",
                    json!(wrapped(&STANDARD.encode(text), 76, "\r\n"))
                )
                .into_bytes(),
            ),
            (
                "base32 in lines of 16",
                format!(
                    "saw:\n{}",
                    wrapped(&base32_reference(BASE32, text, true), 16, "\n")
                )
                .into_bytes(),
            ),
            (
                "hex in pairs",
                format!("{{\"h\":\"{}\"}}", wrapped(&hex::encode(text), 2, " ")).into_bytes(),
            ),
            // Said three times, so that deflate codes it rather than storing it as it is.
            (
                "gzip",
                gzip(
                    format!("{{\"saw\":\"{text}\",\"again\":\"{text}\",\"and\":\"{text}\"}}")
                        .as_bytes(),
                ),
            ),
            (
                "zlib",
                zlib(format!("you sent <{text}>, <{text}> and <{text}>").as_bytes()),
            ),
            (
                "gzip of base32",
                gzip(base32_reference(BASE32, text, true).repeat(3).as_bytes()),
            ),
        ]
    }

    /// Base32 written bit by bit, the way RFC 4648 §6 describes it, as a check on the
    /// broker's own.
    fn base32_reference(alphabet: &[u8; 32], text: &str, pad: bool) -> String {
        let bits: String = text.bytes().map(|b| format!("{b:08b}")).collect();
        let mut out: String = bits
            .as_bytes()
            .chunks(5)
            .map(|c| {
                let mut five = String::from_utf8(c.to_vec()).unwrap();
                while five.len() < 5 {
                    five.push('0');
                }
                char::from(alphabet[usize::from_str_radix(&five, 2).unwrap()])
            })
            .collect();
        while pad && !out.len().is_multiple_of(8) {
            out.push('=');
        }
        out
    }

    fn wrapped(text: &str, width: usize, newline: &str) -> String {
        text.as_bytes()
            .chunks(width)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect::<Vec<_>>()
            .join(newline)
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        use std::io::Write as _;
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(data).unwrap();
        z.finish().unwrap()
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        use std::io::Write as _;
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(data).unwrap();
        z.finish().unwrap()
    }

    /// The inflate cap of these tests.
    const CAP: u64 = 1 << 20;

    fn as_sent(body: &[u8]) -> Value {
        serde_json::from_slice(body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
    }

    #[test]
    fn every_common_echo_of_the_credential_is_found() {
        let mut missed = Vec::new();
        for secret in SECRETS {
            let needles = Needles::new(secret.as_bytes());
            // With and without a scheme before it, so the secret sits at every base64 and
            // base32 alignment.
            for prefix in ["", "Bearer ", "Bearer  ", "x", "xyz", "Token "] {
                for (how, body) in echoes(&format!("{prefix}{secret}")) {
                    if !needles.found(&body, &as_sent(&body), CAP) {
                        missed.push(format!(
                            "{secret:?} behind {prefix:?}, written {how}: {}",
                            String::from_utf8_lossy(&body)
                        ));
                    }
                }
            }
        }
        assert!(missed.is_empty(), "missed:\n{}", missed.join("\n"));
    }

    /// A deflated echo does not hold the credential's bytes as they are: only inflating it
    /// finds it.
    #[test]
    fn the_compressed_echoes_hide_the_exact_bytes() {
        for secret in SECRETS {
            for (how, body) in echoes(&format!("Bearer {secret}")) {
                if how.starts_with("gzip") || how == "zlib" {
                    assert!(
                        !body
                            .windows(8)
                            .any(|w| secret.as_bytes().windows(8).any(|s| s == w)),
                        "{how} of {secret:?} stores it as it is"
                    );
                }
            }
        }
    }

    #[test]
    fn answers_without_the_credential_pass() {
        for secret in SECRETS {
            let needles = Needles::new(secret.as_bytes());
            for body in [
                br#"{"orders":[1,2,3],"note":"tok-","path":"\/orders\/1"}"#.as_slice(),
                br#"{"b":"aGVsbG8gd29ybGQ=","h":"68656c6c6f","q":"a%20b+c"}"#,
                b"",
                b"plain text answer",
                // Starts as a zlib header would, but is text.
                b"x^2 + y^2",
                br#"{"b":"MZXW6YTBOI======","c":"CPNMUOJ1E8","words":"tok 3f9a 1c7e"}"#,
                &gzip(br#"{"orders":[1,2,3]}"#),
            ] {
                assert!(
                    !needles.found(body, &as_sent(body), CAP),
                    "{secret:?} found in {}",
                    String::from_utf8_lossy(body)
                );
            }
        }
    }

    #[test]
    fn base32_is_rfc_4648s() {
        // RFC 4648 §10's test vectors.
        assert_eq!(base32_lower(BASE32, b"fooba"), b"mzxw6ytb");
        assert_eq!(base32_lower(BASE32_HEX, b"fooba"), b"cpnmuoj1");
        for text in ["fooba", "foobarbaz!", "tok-3f9a1c7e5b2d4a6c8e0f"] {
            let whole = &text.as_bytes()[..text.len() / 5 * 5];
            for alphabet in [BASE32, BASE32_HEX] {
                let reference = base32_reference(alphabet, text, false).to_ascii_lowercase();
                let ours = String::from_utf8(base32_lower(alphabet, whole)).unwrap();
                assert!(
                    reference.starts_with(&ours),
                    "{text}: {reference} vs {ours}"
                );
            }
        }
    }

    /// A compressed body that inflates past the cap cannot be searched whole, so it is
    /// withheld; one within it is searched and passes when clean.
    #[test]
    fn a_compressed_body_past_the_cap_is_withheld() {
        let needles = Needles::new(SECRETS[0].as_bytes());
        let bomb = gzip(&vec![b'a'; 4 << 20]);
        assert!(bomb.len() < 64 << 10);
        assert!(needles.found(&bomb, &as_sent(&bomb), CAP));
        assert!(!needles.found(&bomb, &as_sent(&bomb), 8 << 20));
        // A broken stream is searched as far as it inflates.
        let mut cut = gzip(
            format!("{{\"saw\":\"{}\"}}", SECRETS[0])
                .repeat(50)
                .as_bytes(),
        );
        cut.truncate(cut.len() - 12);
        assert!(needles.found(&cut, &as_sent(&cut), CAP));
    }

    #[test]
    fn escapes_are_undone_leniently() {
        assert_eq!(
            json_unescape(br"a\/b\u0026c\ud83d\ude00\q"),
            "a/b&c😀\\q".as_bytes()
        );
        assert_eq!(percent_decode(b"a%2Fb%2fc+d%zz%4"), b"a/b/c d%zz%4");
    }
}
