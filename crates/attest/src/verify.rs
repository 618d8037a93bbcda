//! Verifying a bundle: every line opened and checked on its own, then the chain (contiguous
//! sequences from 0, each line naming its predecessor), the session chains the entries' records
//! carry (`session`), and the close (present, last, agreeing).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::exchange::Exchange;
use crate::keys::PublicKey;
use crate::line::{
    LineProblem, check_close, check_entry, check_position, envelope_sha256, open_line,
};
use crate::session::{SessionChainError, check_session_chains};
use crate::statement::{AnyStatement, GENESIS_SHA256, RunPredicate};

/// One verified entry.
#[derive(Debug, Clone)]
pub struct VerifiedEntry {
    /// Line number, 1-based.
    pub line: usize,
    /// The stored exchange, every digest recomputed.
    pub exchange: Exchange,
    /// The signed predicate.
    pub predicate: RunPredicate,
}

/// A bundle that verified.
#[derive(Debug, Clone)]
pub struct VerifiedBundle {
    /// The entries, in order.
    pub entries: Vec<VerifiedEntry>,
    /// The signer's key id.
    pub key_id: String,
    /// The close's line number.
    pub close_line: usize,
    /// The last entry's envelope digest (the genesis value when there are none).
    pub last_entry_sha256: String,
    /// The close's envelope digest: the one value that pins the whole bundle (publish it).
    pub close_sha256: String,
}

impl VerifiedBundle {
    /// A one-paragraph summary for people.
    pub fn summary(&self) -> String {
        let mut tiers: BTreeMap<String, u64> = BTreeMap::new();
        for e in &self.entries {
            *tiers
                .entry(format!(
                    "{} ({})",
                    e.predicate.provider,
                    e.predicate.isolation.as_str()
                ))
                .or_default() += 1;
        }
        let ran: Vec<String> = tiers.iter().map(|(k, n)| format!("{n} on {k}")).collect();
        let entries = match self.entries.len() {
            0 => "no entries".to_owned(),
            1 => "1 entry (sequence 0)".to_owned(),
            n => format!("{n} entries (sequences 0 to {})", n - 1),
        };
        format!(
            "bundle OK: {entries}, closed at line {}, all signed by key {}\n\
             ran: {}\nlast entry: sha256:{}\nclose: sha256:{}\n",
            self.close_line,
            self.key_id,
            if ran.is_empty() {
                "nothing".into()
            } else {
                ran.join(", ")
            },
            self.last_entry_sha256,
            self.close_sha256,
        )
    }
}

/// Why a bundle was refused.
#[derive(Debug, thiserror::Error)]
pub enum VerifyBundleError {
    /// The file could not be read.
    #[error("cannot read bundle {}", path.display())]
    Read {
        /// The bundle.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No lines at all.
    #[error("the bundle is empty: it holds no entry and no close")]
    Empty,
    /// One line is wrong.
    #[error("line {line} ({}): {problem}", sequence_label(*sequence, *expected))]
    Line {
        /// Line number, 1-based.
        line: usize,
        /// The sequence the line's statement carries, when it could be read.
        sequence: Option<u64>,
        /// The sequence the line should carry.
        expected: u64,
        /// What is wrong.
        problem: LineProblem,
    },
    /// The entries' session calls do not form whole chains: a call missing, repeated, out of
    /// order, replaced, or run elsewhere. Named by the entry where the chain breaks.
    #[error("line {line} (sequence {sequence}): {problem}")]
    Session {
        /// The entry's line number, 1-based.
        line: usize,
        /// The entry's sequence in the bundle.
        sequence: u64,
        /// Where and how the session's chain breaks.
        problem: SessionChainError,
    },
    /// The last line is an entry: the close is missing.
    #[error(
        "no close: the bundle ends at line {last_line} (sequence {last_sequence}) after {entries} entries; it was cut short, or never closed (`plimsoll-attest close`)"
    )]
    NoClose {
        /// Entries seen.
        entries: u64,
        /// The last line's number.
        last_line: usize,
        /// The last line's sequence.
        last_sequence: u64,
    },
}

fn sequence_label(sequence: Option<u64>, expected: u64) -> String {
    match sequence {
        Some(s) => format!("sequence {s}"),
        None => format!("expected sequence {expected}"),
    }
}

/// Reads and verifies the bundle at `path`.
pub fn verify_bundle(path: &Path, key: &PublicKey) -> Result<VerifiedBundle, VerifyBundleError> {
    let bytes = std::fs::read(path).map_err(|source| VerifyBundleError::Read {
        path: path.to_owned(),
        source,
    })?;
    verify_bundle_bytes(&bytes, key)
}

/// Verifies a bundle held in memory. Stops at the first line that is wrong; once every line
/// checks, the session chains, then the close.
pub fn verify_bundle_bytes(
    bytes: &[u8],
    key: &PublicKey,
) -> Result<VerifiedBundle, VerifyBundleError> {
    if bytes.is_empty() {
        return Err(VerifyBundleError::Empty);
    }
    let read = read_lines(bytes, key)?;
    check_sessions(&read.entries)?;
    let Some((close_line, close_sha256)) = read.close else {
        let entries = read.entries.len() as u64;
        return Err(VerifyBundleError::NoClose {
            entries,
            last_line: read.lines,
            last_sequence: entries.saturating_sub(1),
        });
    };
    Ok(VerifiedBundle {
        entries: read.entries,
        key_id: key.key_id().to_owned(),
        close_line,
        last_entry_sha256: read.previous,
        close_sha256,
    })
}

/// A bundle's lines read as far as they go, each checked on its own and in the chain.
pub(crate) struct ReadLines {
    /// The entries, in order.
    pub entries: Vec<VerifiedEntry>,
    /// The last entry's envelope digest (the genesis value when there are none).
    pub previous: String,
    /// The close's line number and envelope digest, if there is one.
    pub close: Option<(usize, String)>,
    /// How many lines were read.
    pub lines: usize,
}

/// Reads and checks every line of `bytes` (each line, its place in the chain, the close if
/// any), without asking for a close and without the session chains.
pub(crate) fn read_lines(bytes: &[u8], key: &PublicKey) -> Result<ReadLines, VerifyBundleError> {
    let parts: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    // A file ending in a newline splits into the lines and one empty tail.
    let (tail, lines) = parts.split_last().expect("split yields at least one part");
    let mut expected: u64 = 0;
    let mut previous = GENESIS_SHA256.to_owned();
    let mut entries = Vec::new();
    let mut close: Option<(usize, String)> = None;
    let unterminated = (!tail.is_empty()).then_some(*tail);
    let all = lines
        .iter()
        .map(|l| (*l, false))
        .chain(unterminated.map(|l| (l, true)));
    for (index, (raw, cut)) in all.enumerate() {
        let line_no = index + 1;
        let refuse = |sequence, problem| VerifyBundleError::Line {
            line: line_no,
            sequence,
            expected,
            problem,
        };
        if let Some((close_line, _)) = close {
            return Err(refuse(None, LineProblem::AfterClose { close_line }));
        }
        if cut {
            return Err(refuse(None, LineProblem::Unterminated));
        }
        let (line, st) = open_line(raw, key).map_err(|p| refuse(None, p))?;
        let seq = Some(st.sequence());
        check_position(&st, expected, &previous).map_err(|p| refuse(seq, p))?;
        match st {
            AnyStatement::Run(st) => {
                check_entry(line.exchange.as_ref(), &st).map_err(|p| refuse(seq, p))?;
                previous = envelope_sha256(&line.envelope);
                entries.push(VerifiedEntry {
                    line: line_no,
                    exchange: line.exchange.expect("check_entry found the exchange"),
                    predicate: st.predicate,
                });
                expected += 1;
            }
            AnyStatement::Close(st) => {
                check_close(&line, &st, expected, &previous).map_err(|p| refuse(seq, p))?;
                close = Some((line_no, envelope_sha256(&line.envelope)));
            }
        }
    }
    Ok(ReadLines {
        entries,
        previous,
        close,
        lines: lines.len(),
    })
}

/// The session chains of verified entries, a break named by its entry's line and sequence.
pub(crate) fn check_sessions(entries: &[VerifiedEntry]) -> Result<(), VerifyBundleError> {
    let records: Vec<_> = entries
        .iter()
        .map(|e| &e.exchange.response.record)
        .collect();
    check_session_chains(&records).map_err(|(index, problem)| VerifyBundleError::Session {
        line: entries[index].line,
        sequence: entries[index].predicate.sequence,
        problem,
    })
}
