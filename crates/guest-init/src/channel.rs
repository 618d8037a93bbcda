//! The host–guest channel: length-prefixed frames over the VM's one virtio-serial port.
//!
//! A frame is one tag byte, a little-endian `u32` payload length, then the payload. Small
//! records (hello, limits, exit) are `key=value` lines of text; the job is the wire crate's
//! `AgentJob` as JSON and the agent's answer travels as raw chunks of its stdout (a
//! `RunResult` as JSON), so no type here is a serialisable IPC contract of its own.
//!
//! ```text
//! guest                                   host
//!   H hello (uptime, kernel, cpu)  ──────▶   the guest booted
//!                                  ◀──────   L limits (memory, pids, /work, /tmp sizes, trial, warm,
//!                                              session)
//!   W the agent's wall (JSON)      ──────▶   judged before anything of the job goes in
//!   R ready (a warm member only)   ──────▶   its interpreter waits: the member is idle
//!                                  ◀──────   J job (AgentJob JSON)
//!   O agent stdout chunk ...       ──────▶
//!   E agent stderr chunk ...       ──────▶
//!   X exit (status, timings)       ──────▶
//!                                  ◀──────   A ack: the guest powers off
//!   F fatal (one line), any time   ──────▶   the guest could not do its part
//! ```
//!
//! A session's VM (`session` named in the limits) has no job: after its wall, the agent
//! (`plimsoll-agent --wall-first --session LANGUAGE`) says it is ready, and from then on its
//! standard input and output are relayed both ways until the host ends the VM:
//!
//! ```text
//!   W the agent's wall (JSON)      ──────▶   judged before the session is offered
//!   R ready (the session's line)   ──────▶   its interpreter takes calls
//!                                  ◀──────   I a piece of the agent's stdin (call lines) ...
//!   O agent stdout chunk ...       ──────▶   chunk lines and answer lines
//!   E, X (the agent ended)         ──────▶   the session's sandbox failed
//!                                  ◀──────   A (or the end of the channel): stdin closed
//! ```
//!
//! Everything the guest sends is untrusted (code in the guest may own the guest kernel):
//! the host bounds every frame and the total, and parses strictly.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

/// Guest → host: the guest is up; `key=value` lines.
pub const HELLO: u8 = b'H';
/// Host → guest: the run's limits; `key=value` lines.
pub const LIMITS: u8 = b'L';
/// Host → guest: the `AgentJob`, JSON.
pub const JOB: u8 = b'J';
/// Guest → host: the started agent's own wall (`plimsoll-agent --wall-first`), JSON; the host
/// sends the job only once it has judged it (every job but a trial's).
pub const WALL: u8 = b'W';
/// Largest wall.
pub const WALL_MAX: usize = 64 * 1024;
/// Guest → host, a warm member only: the agent's interpreter has started and waits for its
/// code; the payload is the line the agent said (`plimsoll_sandbox::warm::READY_LINE`).
pub const READY: u8 = b'R';
/// Guest → host: a chunk of the agent's stdout.
pub const STDOUT: u8 = b'O';
/// Guest → host: a chunk of the agent's stderr.
pub const STDERR: u8 = b'E';
/// Guest → host: the agent ended; `key=value` lines.
pub const EXIT: u8 = b'X';
/// Host → guest: the answer arrived; power off. In a session: the session ends.
pub const ACK: u8 = b'A';
/// Host → guest, a session only: bytes for the agent's standard input (its call lines).
pub const INPUT: u8 = b'I';
/// Largest input frame (the host cuts a longer call line into pieces).
pub const INPUT_MAX: usize = 1024 * 1024;
/// Guest → host: the guest init failed; one line of text.
pub const FATAL: u8 = b'F';

/// Largest chunk the guest sends in one frame.
pub const CHUNK: usize = 64 * 1024;
/// Largest small record (hello, limits, exit, fatal).
pub const RECORD_MAX: usize = 16 * 1024;

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, tag: u8, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame over 4 GiB"))?;
    let mut head = [0u8; 5];
    head[0] = tag;
    head[1..].copy_from_slice(&len.to_le_bytes());
    w.write_all(&head)?;
    w.write_all(payload)?;
    w.flush()
}

/// Reads one frame's header: its tag and payload length. `Ok(None)` at a clean end of stream.
pub fn read_header(r: &mut impl Read) -> io::Result<Option<(u8, usize)>> {
    let mut head = [0u8; 5];
    let mut got = 0;
    while got < head.len() {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    Ok(Some((head[0], len as usize)))
}

/// Reads one whole frame whose payload may be at most `max` bytes.
pub fn read_frame(r: &mut impl Read, max: usize) -> io::Result<Option<(u8, Vec<u8>)>> {
    let Some((tag, len)) = read_header(r)? else {
        return Ok(None);
    };
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "frame `{}` of {len} bytes is over its limit of {max}",
                tag.escape_ascii()
            ),
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some((tag, payload)))
}

/// Encodes `key=value` lines (keys and values must hold no newline; values no `=` rule).
pub fn encode_record<'a>(pairs: impl IntoIterator<Item = (&'a str, String)>) -> Vec<u8> {
    let mut out = String::new();
    for (k, v) in pairs {
        out.push_str(k);
        out.push('=');
        out.push_str(&v.replace('\n', " "));
        out.push('\n');
    }
    out.into_bytes()
}

/// Decodes `key=value` lines; a line without `=`, a repeated key or non-UTF-8 is an error.
pub fn decode_record(bytes: &[u8]) -> Result<BTreeMap<String, String>, RecordError> {
    let text = std::str::from_utf8(bytes).map_err(|_| RecordError::NotUtf8)?;
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| RecordError::NoEquals(line.to_owned()))?;
        if out.insert(k.to_owned(), v.to_owned()).is_some() {
            return Err(RecordError::Repeated(k.to_owned()));
        }
    }
    Ok(out)
}

/// A `key=value` record that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Not UTF-8.
    #[error("record is not UTF-8")]
    NotUtf8,
    /// A line has no `=`.
    #[error("record line without `=`: {0:?}")]
    NoEquals(String),
    /// A key comes twice.
    #[error("record repeats key {0:?}")]
    Repeated(String),
    /// A key the record must have is missing.
    #[error("limits record lacks {0}")]
    Missing(&'static str),
    /// A value is not what the key takes.
    #[error("limits record: {key}: {why}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// What is wrong with its value.
        why: String,
    },
}

/// The run's limits, as the guest applies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestLimits {
    /// `memory.max` of the run's cgroup in the guest.
    pub memory_bytes: u64,
    /// `pids.max` of the run's cgroup.
    pub pids: u64,
    /// Size of the `/work` tmpfs.
    pub work_bytes: u64,
    /// Size of the `/tmp` tmpfs.
    pub tmp_bytes: u64,
    /// The job has a trial step: the agent starts as uid 0 with exactly CAP_SETUID and
    /// CAP_SETGID (docs/vm-tier.md, "Trial runs") instead of as the sandbox user.
    pub trial: bool,
    /// A warm member's VM (docs/warm-pools.md): the agent starts this language's
    /// interpreter waiting before the job is known, and says so (`READY`) before it is sent.
    pub warm: Option<plimsoll_wire::Language>,
    /// A session's VM (docs/sessions.md): the agent serves calls in this language
    /// (`--session`), relayed over [`INPUT`] and [`STDOUT`] frames, instead of one job.
    pub session: Option<plimsoll_wire::Language>,
}

/// The `warm` or `session` value of a limits record.
fn warm_name(warm: Option<plimsoll_wire::Language>) -> &'static str {
    match warm {
        None => "",
        Some(plimsoll_wire::Language::Javascript) => "javascript",
        Some(plimsoll_wire::Language::Python) => "python",
    }
}

impl GuestLimits {
    /// As a `key=value` record.
    pub fn encode(&self) -> Vec<u8> {
        encode_record([
            ("memory_bytes", self.memory_bytes.to_string()),
            ("pids", self.pids.to_string()),
            ("work_bytes", self.work_bytes.to_string()),
            ("tmp_bytes", self.tmp_bytes.to_string()),
            ("trial", u8::from(self.trial).to_string()),
            ("warm", warm_name(self.warm).to_owned()),
            ("session", warm_name(self.session).to_owned()),
        ])
    }

    /// From a `key=value` record; every key must be there and be a number.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let r = decode_record(bytes)?;
        let language = |k: &'static str| -> Result<Option<plimsoll_wire::Language>, RecordError> {
            let v = r.get(k).ok_or(RecordError::Missing(k))?;
            [
                None,
                Some(plimsoll_wire::Language::Javascript),
                Some(plimsoll_wire::Language::Python),
            ]
            .into_iter()
            .find(|w| warm_name(*w) == v)
            .ok_or_else(|| RecordError::Invalid {
                key: k,
                why: format!("{v:?}, not empty, javascript or python"),
            })
        };
        let num = |k: &'static str| -> Result<u64, RecordError> {
            r.get(k).ok_or(RecordError::Missing(k))?.parse().map_err(
                |e: std::num::ParseIntError| RecordError::Invalid {
                    key: k,
                    why: e.to_string(),
                },
            )
        };
        Ok(GuestLimits {
            memory_bytes: num("memory_bytes")?,
            pids: num("pids")?,
            work_bytes: num("work_bytes")?,
            tmp_bytes: num("tmp_bytes")?,
            trial: match num("trial")? {
                0 => false,
                1 => true,
                n => {
                    return Err(RecordError::Invalid {
                        key: "trial",
                        why: format!("{n}, not 0 or 1"),
                    });
                }
            },
            warm: language("warm")?,
            session: language("session")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_are_bounded() {
        let mut buf = Vec::new();
        write_frame(&mut buf, JOB, b"{\"a\":1}").unwrap();
        write_frame(&mut buf, ACK, b"").unwrap();
        let mut r = &buf[..];
        assert_eq!(
            read_frame(&mut r, 100).unwrap(),
            Some((JOB, b"{\"a\":1}".to_vec()))
        );
        assert_eq!(read_frame(&mut r, 100).unwrap(), Some((ACK, Vec::new())));
        assert_eq!(read_frame(&mut r, 100).unwrap(), None);

        let mut big = Vec::new();
        write_frame(&mut big, STDOUT, &[7u8; 200]).unwrap();
        let e = read_frame(&mut &big[..], 100).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // A stream cut inside a header is an error, not a clean end.
        let e = read_frame(&mut &big[..3], 1000).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn limits_round_trip_and_records_are_strict() {
        let l = GuestLimits {
            memory_bytes: 1 << 28,
            pids: 64,
            work_bytes: 48 << 20,
            tmp_bytes: 16 << 20,
            trial: false,
            warm: None,
            session: None,
        };
        assert_eq!(GuestLimits::decode(&l.encode()).unwrap(), l);
        let t = GuestLimits { trial: true, ..l };
        assert_eq!(GuestLimits::decode(&t.encode()).unwrap(), t);
        for language in [
            plimsoll_wire::Language::Javascript,
            plimsoll_wire::Language::Python,
        ] {
            let w = GuestLimits {
                warm: Some(language),
                ..l
            };
            assert_eq!(GuestLimits::decode(&w.encode()).unwrap(), w);
            let s = GuestLimits {
                session: Some(language),
                ..l
            };
            assert_eq!(GuestLimits::decode(&s.encode()).unwrap(), s);
        }
        let ruby = String::from_utf8(l.encode())
            .unwrap()
            .replace("warm=\n", "warm=ruby\n");
        assert!(GuestLimits::decode(ruby.as_bytes()).is_err());
        let ruby = String::from_utf8(l.encode())
            .unwrap()
            .replace("session=\n", "session=ruby\n");
        assert!(GuestLimits::decode(ruby.as_bytes()).is_err());
        let none = String::from_utf8(l.encode())
            .unwrap()
            .replace("session=\n", "");
        assert!(GuestLimits::decode(none.as_bytes()).is_err());
        let bad = String::from_utf8(l.encode())
            .unwrap()
            .replace("trial=0", "trial=2");
        assert!(GuestLimits::decode(bad.as_bytes()).is_err());
        assert!(GuestLimits::decode(b"pids=1\n").is_err());
        assert!(decode_record(b"a=1\na=2\n").is_err());
        assert!(decode_record(b"no equals sign\n").is_err());
        assert!(decode_record(&[0xff, b'=', b'1']).is_err());
        let r = decode_record(&encode_record([("k", "v=w\nx".to_owned())])).unwrap();
        assert_eq!(r["k"], "v=w x");
    }
}
