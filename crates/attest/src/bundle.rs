//! Signing into a bundle: the statement of a checked exchange, the close, and appending a line
//! under an exclusive lock so that concurrent signers take turns and the chain stays whole.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};

use crate::dsse::{self, PAYLOAD_TYPE};
use crate::exchange::{CheckExchangeError, CheckedDigests, Exchange, check_exchange};
use crate::keys::AttestKey;
use crate::line::{
    BundleLine, LineProblem, check_entry, check_position, envelope_sha256, open_line,
};
use crate::statement::{
    AnyStatement, CLOSE_PREDICATE_TYPE, CLOSE_SUBJECT, ClosePredicate, DigestSet, GENESIS_SHA256,
    RUN_PREDICATE_TYPE, RunPredicate, STATEMENT_TYPE, Statement, Subject, to_payload,
};

/// The statement for a checked exchange at a position in a bundle.
pub fn entry_statement(
    ex: &Exchange,
    d: &CheckedDigests,
    sequence: u64,
    previous_sha256: &str,
) -> Statement<RunPredicate> {
    let rec = &ex.response.record;
    Statement {
        type_: STATEMENT_TYPE.into(),
        subject: vec![Subject {
            name: format!("run:{}", ex.request.request_id),
            digest: DigestSet {
                sha256: d.record_sha256.clone(),
            },
        }],
        predicate_type: RUN_PREDICATE_TYPE.into(),
        predicate: RunPredicate {
            sequence,
            previous_sha256: previous_sha256.to_owned(),
            request_id: ex.request.request_id.clone(),
            request_sha256: d.request_sha256.clone(),
            result_sha256: d.result_sha256.clone(),
            provider: rec.provider.clone(),
            isolation: rec.isolation,
            evidence_sha256: rec.evidence_sha256.clone(),
            environment: rec.environment.clone(),
            exchange_sha256: d.exchange_sha256.clone(),
        },
    }
}

/// The close statement of a bundle holding `entries` entries, the last with envelope digest
/// `last_entry_sha256` ([`GENESIS_SHA256`] when there are none).
pub fn close_statement(entries: u64, last_entry_sha256: &str) -> Statement<ClosePredicate> {
    Statement {
        type_: STATEMENT_TYPE.into(),
        subject: vec![Subject {
            name: CLOSE_SUBJECT.into(),
            digest: DigestSet {
                sha256: last_entry_sha256.to_owned(),
            },
        }],
        predicate_type: CLOSE_PREDICATE_TYPE.into(),
        predicate: ClosePredicate {
            sequence: entries,
            previous_sha256: last_entry_sha256.to_owned(),
            entries,
            last_entry_sha256: last_entry_sha256.to_owned(),
        },
    }
}

/// Why an exchange was not signed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignExchangeError {
    /// The exchange does not check; it is never signed.
    #[error("refusing to sign: {0}")]
    Check(CheckExchangeError),
    /// The signed line, read back, did not verify (a bug: nothing was written).
    #[error(
        "the signed line did not verify when read back ({0}); nothing was written: report this"
    )]
    SelfCheck(LineProblem),
}

impl From<CheckExchangeError> for SignExchangeError {
    fn from(e: CheckExchangeError) -> Self {
        SignExchangeError::Check(e)
    }
}

/// Checks an exchange, signs its statement at `sequence` after `previous_sha256`, and returns
/// the bundle line, itself verified from its serialised bytes as `verify` would.
pub fn sign_exchange(
    key: &AttestKey,
    ex: &Exchange,
    sequence: u64,
    previous_sha256: &str,
) -> Result<BundleLine, SignExchangeError> {
    let digests = check_exchange(ex)?;
    let statement = entry_statement(ex, &digests, sequence, previous_sha256);
    let envelope = dsse::sign(key, PAYLOAD_TYPE, &to_payload(&statement));
    let line = BundleLine {
        exchange: Some(ex.clone()),
        envelope,
    };
    // Check again from the stored bytes: recompute every digest from the exchange as it will be
    // on disk, and the statement as signed.
    let stored = line.to_bytes();
    let reread = (|| {
        let (reread, st) = open_line(&stored, key.public())?;
        check_position(&st, sequence, previous_sha256)?;
        match &st {
            AnyStatement::Run(st) => check_entry(reread.exchange.as_ref(), st),
            AnyStatement::Close(_) => Err(LineProblem::MissingExchange),
        }
    })();
    reread.map_err(SignExchangeError::SelfCheck)?;
    Ok(line)
}

/// Signs the close of a bundle holding `entries` entries.
pub fn sign_close(key: &AttestKey, entries: u64, last_entry_sha256: &str) -> BundleLine {
    let statement = close_statement(entries, last_entry_sha256);
    BundleLine {
        exchange: None,
        envelope: dsse::sign(key, PAYLOAD_TYPE, &to_payload(&statement)),
    }
}

/// What was appended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The line's sequence number (0-based; the close's equals the number of entries).
    pub sequence: u64,
    /// Its line number in the file, 1-based (sequence + 1).
    pub line: u64,
    /// SHA-256 of its envelope: what the next line names.
    pub envelope_sha256: String,
    /// Bytes written, newline included.
    pub bytes: usize,
}

/// Why nothing was appended to a bundle.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The exchange did not check, so it was not signed.
    #[error(transparent)]
    Sign(#[from] SignExchangeError),
    /// An I/O step failed.
    #[error("cannot {action} bundle {}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The bundle.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A write failed and cutting the partial line off failed too.
    #[error("cannot write bundle {}, and cannot cut the partial line off ({truncate}): the last line is damaged", path.display())]
    WriteAndTruncate {
        /// The bundle.
        path: PathBuf,
        /// Why cutting off failed.
        truncate: std::io::Error,
        /// Why writing failed.
        #[source]
        source: std::io::Error,
    },
    /// The last line does not check; nothing is chained onto it.
    #[error("the last line of {} does not check: {problem}; run `plimsoll-attest verify` and start a new bundle", path.display())]
    Tail {
        /// The bundle.
        path: PathBuf,
        /// What is wrong.
        problem: LineProblem,
    },
    /// There is no bundle to close.
    #[error("there is no bundle at {}: check the path (close never creates a bundle)", path.display())]
    Missing {
        /// The path given.
        path: PathBuf,
    },
    /// The bundle is closed.
    #[error("bundle {} is closed (its close is sequence {sequence}): nothing may follow a close; sign into a new bundle", path.display())]
    Closed {
        /// The bundle.
        path: PathBuf,
        /// The close's sequence.
        sequence: u64,
    },
}

/// Where the next line goes.
#[derive(Debug)]
struct Tail {
    next_sequence: u64,
    previous: String,
}

/// The bytes of the last line (without its newline) of a file of `len > 0` bytes ending in a
/// newline, read backwards in chunks so appending does not read the whole bundle.
fn read_last_line(file: &File, len: u64) -> std::io::Result<Vec<u8>> {
    const CHUNK: u64 = 64 * 1024;
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut pos = len - 1; // the final newline
    while pos > 0 {
        let size = CHUNK.min(pos);
        pos -= size;
        let mut buf = vec![0; size as usize];
        file.read_exact_at(&mut buf, pos)?;
        if let Some(i) = buf.iter().rposition(|&b| b == b'\n') {
            chunks.push(buf.split_off(i + 1));
            break;
        }
        chunks.push(buf);
    }
    Ok(chunks.into_iter().rev().flatten().collect())
}

fn read_tail(file: &File, path: &Path, key: &AttestKey) -> Result<Tail, AppendError> {
    let io = |action, source| AppendError::Io {
        action,
        path: path.to_owned(),
        source,
    };
    let len = file.metadata().map_err(|e| io("stat", e))?.len();
    if len == 0 {
        return Ok(Tail {
            next_sequence: 0,
            previous: GENESIS_SHA256.into(),
        });
    }
    let tail_err = |problem| AppendError::Tail {
        path: path.to_owned(),
        problem,
    };
    let mut last = [0u8];
    file.read_exact_at(&mut last, len - 1)
        .map_err(|e| io("read", e))?;
    if last[0] != b'\n' {
        return Err(tail_err(LineProblem::Unterminated));
    }
    let raw = read_last_line(file, len).map_err(|e| io("read", e))?;
    let (line, st) = open_line(&raw, key.public()).map_err(tail_err)?;
    match st {
        AnyStatement::Close(st) => Err(AppendError::Closed {
            path: path.to_owned(),
            sequence: st.predicate.sequence,
        }),
        AnyStatement::Run(st) => {
            check_entry(line.exchange.as_ref(), &st).map_err(tail_err)?;
            Ok(Tail {
                next_sequence: st.predicate.sequence + 1,
                previous: envelope_sha256(&line.envelope),
            })
        }
    }
}

/// Opens the bundle at `path` for appending (creating it if `create`) and takes its exclusive
/// lock, held until the file is dropped: signers in other processes take turns on it.
pub(crate) fn open_locked(path: &Path, create: bool) -> Result<File, AppendError> {
    let io = |action, source| AppendError::Io {
        action,
        path: path.to_owned(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(create)
        .mode(0o644)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound if !create => AppendError::Missing {
                path: path.to_owned(),
            },
            _ => io("open", e),
        })?;
    flock(&file, FlockOperation::LockExclusive).map_err(|e| io("lock", e.into()))?;
    Ok(file)
}

/// Appends the line `make` builds for the tail, holding an exclusive lock on the bundle from
/// reading the tail to the end of the fsync.
fn append_line<F>(
    path: &Path,
    key: &AttestKey,
    create: bool,
    make: F,
) -> Result<Appended, AppendError>
where
    F: FnOnce(&Tail) -> Result<BundleLine, AppendError>,
{
    // Locked until `file` is dropped at the end of this function.
    let file = open_locked(path, create)?;
    let tail = read_tail(&file, path, key)?;
    let line = make(&tail)?;
    let mut bytes = line.to_bytes();
    bytes.push(b'\n');
    write_locked(&file, path, &bytes)?;
    Ok(Appended {
        sequence: tail.next_sequence,
        line: tail.next_sequence + 1,
        envelope_sha256: envelope_sha256(&line.envelope),
        bytes: bytes.len(),
    })
}

/// Appends `bytes` (whole lines) to the bundle `file` at `path`, whose exclusive lock the
/// caller holds, with one write, then makes them durable. A failed write is cut off again.
pub(crate) fn write_locked(file: &File, path: &Path, bytes: &[u8]) -> Result<(), AppendError> {
    let io = |action, source| AppendError::Io {
        action,
        path: path.to_owned(),
        source,
    };
    let before = file.metadata().map_err(|e| io("stat", e))?.len();
    let mut writer = file;
    if let Err(source) = writer.write_all(bytes) {
        return Err(match file.set_len(before) {
            Ok(()) => io("write", source),
            Err(truncate) => AppendError::WriteAndTruncate {
                path: path.to_owned(),
                truncate,
                source,
            },
        });
    }
    file.sync_data().map_err(|e| io("fsync", e))?;
    if before == 0 {
        // A new file: make its directory entry durable too.
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("fsync the directory of", e))?;
    }
    Ok(())
}

/// Checks, without writing, that the bundle at `path` can take another entry: missing (it will
/// be created), or ending in an entry this key signed that still checks. Returns the next
/// sequence number. `run` calls this before sending anything.
pub fn preflight(path: &Path, key: &AttestKey) -> Result<u64, AppendError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(source) => {
            return Err(AppendError::Io {
                action: "open",
                path: path.to_owned(),
                source,
            });
        }
    };
    flock(&file, FlockOperation::LockShared).map_err(|e| AppendError::Io {
        action: "lock",
        path: path.to_owned(),
        source: e.into(),
    })?;
    Ok(read_tail(&file, path, key)?.next_sequence)
}

/// Checks an exchange, then signs it into the bundle at `path` (created if missing) as the next
/// entry. This is what `plimsoll-attest run` does after its request came back; other programs
/// sign through it too. Nothing is signed or written unless the exchange checks.
pub fn append_entry(path: &Path, key: &AttestKey, ex: &Exchange) -> Result<Appended, AppendError> {
    check_exchange(ex).map_err(SignExchangeError::from)?;
    append_line(path, key, true, |tail| {
        Ok(sign_exchange(key, ex, tail.next_sequence, &tail.previous)?)
    })
}

/// Appends a signed close (count of entries, last entry's digest) to an existing bundle.
/// Nothing may follow it.
pub fn close_bundle(path: &Path, key: &AttestKey) -> Result<Appended, AppendError> {
    append_line(path, key, false, |tail| {
        Ok(sign_close(key, tail.next_sequence, &tail.previous))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_line_is_found_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let long = vec![b'x'; 200_000];
        let mut content = b"first\n".to_vec();
        content.extend_from_slice(&long);
        content.push(b'\n');
        std::fs::write(&p, &content).unwrap();
        let f = File::open(&p).unwrap();
        assert_eq!(read_last_line(&f, content.len() as u64).unwrap(), long);
        std::fs::write(&p, b"only\n").unwrap();
        let f = File::open(&p).unwrap();
        assert_eq!(read_last_line(&f, 5).unwrap(), b"only");
    }
}
