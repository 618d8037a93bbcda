//! A real HTTP API on a loopback port for tests and benchmarks: it demands the credential a
//! grant profile mints (a static token, or an HS256 JWT it verifies itself: signature,
//! subject, audience, expiry), and records every request it sees.
//!
//! Paths: `/status/N` answers status N; `/redirect` answers 302 to another path; `/big`
//! answers 2 MiB; `/echo-auth` echoes the credential header (an API the broker must not
//! trust), and `/echo-auth/ENCODING` echoes it re-encoded ([`ECHO_ENCODINGS`]); `/gzip`
//! answers a clean JSON body gzipped, without `Content-Encoding`; `/slow` answers after 3 s;
//! anything else answers 200 with `{"method", "path", "body"}`.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac as _};
use serde_json::{Value, json};
use sha2::Sha256;

/// The encodings `/echo-auth/ENCODING` writes the credential header in, as APIs do by
/// default: JSON with `/` as `\/`, JSON with `&`, `<`, `>` as `\u0026`…, JSON with every
/// character but letters and digits as `\u00XX`, a JSON string holding JSON, a JSON key,
/// percent-encoding (upper and lower case), base64 (both alphabets, and in MIME's 76-character
/// lines), hex, plain text, base32 (RFC 4648: padded, lower case, unpadded, and base32hex), and
/// the JSON gzipped, with `Content-Encoding: gzip` and without it.
pub const ECHO_ENCODINGS: &[&str] = &[
    "json-slashes",
    "json-html",
    "json-every",
    "json-nested",
    "json-key",
    "percent",
    "percent-lower",
    "base64",
    "base64url",
    "hex",
    "text",
    "base32",
    "base32-lower",
    "base32-nopad",
    "base32hex",
    "base64-mime",
    "gzip",
    "gzip-encoded",
];

/// `data` in base32 (RFC 4648) with `alphabet`, padded to a multiple of 8 when `pad`.
fn base32(alphabet: &[u8; 32], data: &[u8], pad: bool) -> String {
    let mut out = String::new();
    for group in data.chunks(5) {
        let mut five = [0u8; 5];
        five[..group.len()].copy_from_slice(group);
        let bits = five.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b));
        // 8 bits a byte, 5 a character, rounded up.
        let chars = (group.len() * 8).div_ceil(5);
        for i in 0..8 {
            if i < chars {
                out.push(char::from(alphabet[(bits >> (35 - i * 5) & 31) as usize]));
            } else if pad {
                out.push('=');
            }
        }
    }
    out
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(data).expect("gzip in memory");
    z.finish().expect("gzip in memory")
}

/// `text` written in `encoding` (one of [`ECHO_ENCODINGS`]), as a body, with the headers it
/// takes.
fn echo_as(encoding: &str, text: &str) -> Option<(&'static str, Vec<u8>)> {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};
    const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    const BASE32_HEX: &[u8; 32] = b"0123456789ABCDEFGHIJKLMNOPQRSTUV";
    let json = || json!({"saw": text}).to_string();
    // Said three times, so that deflate codes it rather than storing it as it is.
    let thrice = || json!({"saw": text, "again": text, "and": text}).to_string();
    match encoding {
        "gzip" => return Some(("", gzip(thrice().as_bytes()))),
        "gzip-encoded" => {
            return Some(("content-encoding: gzip\r\n", gzip(thrice().as_bytes())));
        }
        _ => {}
    }
    let body = match encoding {
        "json-slashes" => json().replace('/', "\\/"),
        "json-html" => json()
            .replace('&', "\\u0026")
            .replace('<', "\\u003c")
            .replace('>', "\\u003e"),
        "json-every" => {
            let escaped: String = text
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_string()
                    } else {
                        format!("\\u{:04x}", u32::from(c))
                    }
                })
                .collect();
            format!("{{\"saw\":\"{escaped}\"}}")
        }
        "json-nested" => json!({"headers": json()}).to_string(),
        "json-key" => json!({ text: true }).to_string(),
        "percent" => {
            let p: String = text.bytes().map(|b| format!("%{b:02X}")).collect();
            json!({"query": format!("saw={p}")}).to_string()
        }
        "percent-lower" => {
            let p: String = text
                .bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() {
                        char::from(b).to_string()
                    } else {
                        format!("%{b:02x}")
                    }
                })
                .collect();
            json!({"query": format!("saw={p}")}).to_string()
        }
        "base64" => json!({"saw": STANDARD.encode(text)}).to_string(),
        "base64url" => json!({"saw": URL_SAFE.encode(text)}).to_string(),
        "hex" => json!({"saw": hex::encode(text)}).to_string(),
        "text" => format!("you sent: {text}"),
        "base32" => json!({"saw": base32(BASE32, text.as_bytes(), true)}).to_string(),
        "base32-lower" => {
            json!({"saw": base32(BASE32, text.as_bytes(), true).to_ascii_lowercase()}).to_string()
        }
        "base32-nopad" => json!({"saw": base32(BASE32, text.as_bytes(), false)}).to_string(),
        "base32hex" => json!({"saw": base32(BASE32_HEX, text.as_bytes(), true)}).to_string(),
        "base64-mime" => {
            let b = STANDARD.encode(text);
            let lines: Vec<&str> = b
                .as_bytes()
                .chunks(76)
                .map(|l| std::str::from_utf8(l).expect("base64 is ASCII"))
                .collect();
            json!({"saw": lines.join("\r\n")}).to_string()
        }
        _ => return None,
    };
    Some(("", body.into_bytes()))
}

/// What the API demands in its credential header.
#[derive(Debug, Clone)]
pub enum Expect {
    /// This exact header value (e.g. `Bearer tok-123`).
    Static {
        /// Header name, lowercase.
        header: String,
        /// The whole value.
        value: String,
    },
    /// `Authorization: Bearer <jwt>`, HS256 under `key`, with this audience and subject,
    /// not expired.
    Jwt {
        /// The HMAC key.
        key: Vec<u8>,
        /// `aud`.
        audience: String,
        /// `sub`.
        subject: String,
    },
}

/// One request the API saw.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The method.
    pub method: String,
    /// The request target (path and query), as received.
    pub target: String,
    /// Whether the credential checked.
    pub authorized: bool,
    /// A JWT's claims, when one checked.
    pub claims: Option<Value>,
    /// Every header, lowercase names.
    pub headers: BTreeMap<String, String>,
}

/// The API, serving until dropped.
#[derive(Debug)]
pub struct TestApi {
    /// Its address.
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestApi {
    /// Starts the API on an ephemeral loopback port.
    pub fn start(expect: Expect) -> TestApi {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = listener.local_addr().expect("its address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let expect = Arc::new(expect);
        let (seen2, stop2) = (Arc::clone(&seen), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (seen, expect) = (Arc::clone(&seen2), Arc::clone(&expect));
                std::thread::spawn(move || serve(conn, &expect, &seen));
            }
        });
        TestApi {
            addr,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for TestApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(conn: TcpStream, expect: &Expect, seen: &Mutex<Vec<Seen>>) {
    let _ = conn.set_nodelay(true);
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut out = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
            return;
        };
        let (method, target) = (method.to_owned(), target.to_owned());
        let mut headers = BTreeMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
            }
        }
        let len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let (authorized, claims) = check(expect, &headers);
        seen.lock().unwrap_or_else(|p| p.into_inner()).push(Seen {
            method: method.clone(),
            target: target.clone(),
            authorized,
            claims: claims.clone(),
            headers: headers.clone(),
        });
        let (status, extra, reply) = if !authorized {
            (
                401,
                "",
                json!({"error": "unauthorized"}).to_string().into_bytes(),
            )
        } else {
            answer(&method, &target, &body, expect, &headers)
        };
        let head = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n",
            reply.len()
        );
        if out.write_all(head.as_bytes()).is_err() || out.write_all(&reply).is_err() {
            return;
        }
        if headers.get("connection").is_some_and(|c| c == "close") {
            return;
        }
    }
}

fn answer(
    method: &str,
    target: &str,
    body: &[u8],
    expect: &Expect,
    headers: &BTreeMap<String, String>,
) -> (u16, &'static str, Vec<u8>) {
    if let Some(code) = target.strip_prefix("/status/") {
        let code = code.parse().unwrap_or(500);
        return (code, "", json!({"status": code}).to_string().into_bytes());
    }
    let (status, extra, reply) = match target {
        "/redirect" => (
            302,
            "location: /elsewhere\r\n",
            json!({"redirect": true}).to_string(),
        ),
        "/big" => (200, "", json!({"big": "x".repeat(2 << 20)}).to_string()),
        "/echo-auth" => {
            let name = match expect {
                Expect::Static { header, .. } => header.as_str(),
                Expect::Jwt { .. } => "authorization",
            };
            (200, "", json!({"saw": headers.get(name)}).to_string())
        }
        echo if echo.starts_with("/echo-auth/") => {
            let name = match expect {
                Expect::Static { header, .. } => header.as_str(),
                Expect::Jwt { .. } => "authorization",
            };
            let saw = headers.get(name).map_or("", String::as_str);
            return match echo_as(&echo["/echo-auth/".len()..], saw) {
                Some((extra, body)) => (200, extra, body),
                None => (
                    404,
                    "",
                    json!({"error": "no such encoding"})
                        .to_string()
                        .into_bytes(),
                ),
            };
        }
        "/gzip" => return (200, "", gzip(json!({"gzip": true}).to_string().as_bytes())),
        "/slow" => {
            std::thread::sleep(Duration::from_secs(3));
            (200, "", json!({"slow": true}).to_string())
        }
        _ => {
            let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            (
                200,
                "",
                json!({"method": method, "path": target, "body": body}).to_string(),
            )
        }
    };
    (status, extra, reply.into_bytes())
}

/// Checks the credential; for a JWT, its claims when they verify.
fn check(expect: &Expect, headers: &BTreeMap<String, String>) -> (bool, Option<Value>) {
    match expect {
        Expect::Static { header, value } => (headers.get(header) == Some(value), None),
        Expect::Jwt {
            key,
            audience,
            subject,
        } => match headers
            .get("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .and_then(|t| verify_jwt(t, key))
        {
            Some(claims) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs();
                let ok = claims["aud"] == audience.as_str()
                    && claims["sub"] == subject.as_str()
                    && claims["exp"].as_u64().is_some_and(|exp| now < exp + 1)
                    && claims["nbf"].as_u64().is_some_and(|nbf| nbf <= now);
                (ok, ok.then_some(claims))
            }
            None => (false, None),
        },
    }
}

/// Verifies an HS256 JWT and returns its claims.
pub fn verify_jwt(token: &str, key: &[u8]) -> Option<Value> {
    let mut parts = token.split('.');
    let (h, p, s) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(h).ok()?).ok()?;
    if header["alg"] != "HS256" {
        return None;
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(key).ok()?;
    mac.update(format!("{h}.{p}").as_bytes());
    mac.verify_slice(&URL_SAFE_NO_PAD.decode(s).ok()?).ok()?;
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(p).ok()?).ok()
}
