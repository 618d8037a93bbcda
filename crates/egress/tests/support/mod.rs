//! Test builders shared by the unit tests (through `#[path]`) and tests/fuzz.rs: TLS records
//! and ClientHellos assembled byte by byte, and chunked bodies.

#![allow(
    dead_code,
    reason = "the unit tests and the fuzz tests each use a different part of this module"
)]

/// A TLS record: content type, record version, fragment.
pub fn record(content_type: u8, version: [u8; 2], fragment: &[u8]) -> Vec<u8> {
    let len = u16::try_from(fragment.len()).expect("a fragment fits a record");
    [
        &[content_type, version[0], version[1]][..],
        &len.to_be_bytes(),
        fragment,
    ]
    .concat()
}

/// The data of a `server_name` extension listing `(name_type, name)` entries.
pub fn server_name_ext(entries: &[(u8, &[u8])]) -> Vec<u8> {
    let list: Vec<u8> = entries
        .iter()
        .flat_map(|(ty, name)| {
            let len = u16::try_from(name.len()).unwrap();
            [&[*ty][..], &len.to_be_bytes(), name].concat()
        })
        .collect();
    let len = u16::try_from(list.len()).unwrap();
    [&len.to_be_bytes()[..], &list].concat()
}

/// A ClientHello, field by field.
#[derive(Debug, Clone)]
pub struct ClientHello {
    pub version: [u8; 2],
    pub random: [u8; 32],
    pub session_id: Vec<u8>,
    /// Cipher suites, as bytes (two a suite).
    pub suites: Vec<u8>,
    pub compression: Vec<u8>,
    /// `(type, data)`, in order.
    pub extensions: Vec<(u16, Vec<u8>)>,
    /// Leave out the extensions block, length and all (a TLS 1.0 hello may).
    pub no_extension_block: bool,
    /// Bytes after the extensions block.
    pub trailing: Vec<u8>,
}

impl Default for ClientHello {
    fn default() -> Self {
        ClientHello {
            version: [3, 3],
            random: [0x5a; 32],
            session_id: Vec::new(),
            suites: vec![0x13, 0x01, 0x13, 0x02],
            compression: vec![0],
            extensions: Vec::new(),
            no_extension_block: false,
            trailing: Vec::new(),
        }
    }
}

impl ClientHello {
    /// A hello whose first extension is server_name with `name`, then supported_versions.
    pub fn with_sni(name: &str) -> Self {
        ClientHello {
            extensions: vec![
                (0, server_name_ext(&[(0, name.as_bytes())])),
                (43, vec![2, 3, 4]),
            ],
            ..ClientHello::default()
        }
    }

    /// The ClientHello body (after the handshake header).
    pub fn body(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&self.version);
        b.extend_from_slice(&self.random);
        b.push(u8::try_from(self.session_id.len()).unwrap());
        b.extend_from_slice(&self.session_id);
        b.extend_from_slice(&u16::try_from(self.suites.len()).unwrap().to_be_bytes());
        b.extend_from_slice(&self.suites);
        b.push(u8::try_from(self.compression.len()).unwrap());
        b.extend_from_slice(&self.compression);
        if !self.no_extension_block {
            let exts: Vec<u8> = self
                .extensions
                .iter()
                .flat_map(|(ty, data)| {
                    let len = u16::try_from(data.len()).unwrap();
                    [&ty.to_be_bytes()[..], &len.to_be_bytes(), data].concat()
                })
                .collect();
            b.extend_from_slice(&u16::try_from(exts.len()).unwrap().to_be_bytes());
            b.extend_from_slice(&exts);
        }
        b.extend_from_slice(&self.trailing);
        b
    }

    /// The handshake message: type 1, a 24-bit length, the body.
    pub fn handshake(&self) -> Vec<u8> {
        let body = self.body();
        let len = u32::try_from(body.len()).unwrap().to_be_bytes();
        [&[1, len[1], len[2], len[3]][..], &body].concat()
    }

    /// The hello in one record of version 3.1, as most clients send it.
    pub fn record(&self) -> Vec<u8> {
        record(22, [3, 1], &self.handshake())
    }
}

/// A chunked body of chunks of these sizes (filled with `x`), chunk extensions on some, and
/// these trailer fields.
pub fn chunked_body(sizes: &[usize], trailers: &[&str]) -> Vec<u8> {
    let mut b = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let ext = if i % 2 == 1 {
            ";name=\"quoted value\""
        } else {
            ""
        };
        b.extend_from_slice(format!("{n:X}{ext}\r\n").as_bytes());
        b.extend(std::iter::repeat_n(b'x', n));
        b.extend_from_slice(b"\r\n");
    }
    b.extend_from_slice(b"0\r\n");
    for t in trailers {
        b.extend_from_slice(t.as_bytes());
        b.extend_from_slice(b"\r\n");
    }
    b.extend_from_slice(b"\r\n");
    b
}
