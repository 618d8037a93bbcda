//! Whether an API's answer would hand the sandbox its run's credential: the exact bytes, or
//! any of the re-encodings an API commonly applies when it echoes a header (JSON escapes such
//! as `\/` and `\u0026`, percent-encoding, base64 in both alphabets, hex), searched in the raw
//! body and in every key and string the sandbox would receive once the body is decoded.
//!
//! A match withholds the answer. A false match only withholds an answer; a missed one leaks
//! the credential, so the search errs towards matching.

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
        let folded = vec![hex::encode(secret).into_bytes()];
        Needles {
            exact: Secret::new(exact),
            folded: Secret::new(folded),
        }
    }

    fn in_text(&self, text: &[u8]) -> bool {
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
    /// carries the secret.
    pub(crate) fn found(&self, body: &[u8], value: &Value) -> bool {
        self.in_any_reading(body) || self.in_value(value)
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
        ]
    }

    fn as_sent(body: &[u8]) -> Value {
        serde_json::from_slice(body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
    }

    #[test]
    fn every_common_echo_of_the_credential_is_found() {
        for secret in SECRETS {
            let needles = Needles::new(secret.as_bytes());
            // With and without a scheme before it, so the secret sits at every base64
            // alignment.
            for prefix in ["", "Bearer ", "Bearer  ", "x"] {
                for (how, body) in echoes(&format!("{prefix}{secret}")) {
                    assert!(
                        needles.found(&body, &as_sent(&body)),
                        "{secret:?} behind {prefix:?}, written {how}: {}",
                        String::from_utf8_lossy(&body)
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
            ] {
                assert!(
                    !needles.found(body, &as_sent(body)),
                    "{secret:?} found in {}",
                    String::from_utf8_lossy(body)
                );
            }
        }
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
