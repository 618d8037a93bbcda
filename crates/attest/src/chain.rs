//! Signing several exchanges as one chain and closing the bundle: a whole session (its calls in
//! order), or any stored exchanges (`plimsoll-attest sign`). Every check, the session chains
//! included, passes before anything is signed, and the lines are written with one write.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use plimsoll_wire::RunRecord;

use crate::bundle::{AppendError, Appended, open_locked, sign_close, sign_exchange, write_locked};
use crate::exchange::{CheckExchangeError, Exchange, check_exchange};
use crate::keys::AttestKey;
use crate::line::envelope_sha256;
use crate::session::{SessionChainError, check_session_chains};
use crate::verify::{VerifiedEntry, VerifyBundleError, read_lines, verify_bundle_bytes};

/// What signing a chain wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedChain {
    /// The entries, in order.
    pub entries: Vec<Appended>,
    /// The close.
    pub close: Appended,
}

/// Why nothing of a chain was signed or written.
#[derive(Debug, thiserror::Error)]
pub enum SignChainError {
    /// No exchanges were given.
    #[error("no exchanges to sign")]
    Empty,
    /// An exchange does not check.
    #[error("refusing to sign: exchange {number} (request `{request_id}`) does not check: {error}")]
    Check {
        /// Its place in the list, from 1.
        number: usize,
        /// Its request id.
        request_id: String,
        /// Why.
        error: Box<CheckExchangeError>,
    },
    /// Signing a session: an exchange that is not a session call.
    #[error(
        "refusing to sign: exchange {number} (request `{request_id}`) is not a session call (its record has no session link)"
    )]
    NotSessionCall {
        /// Its place in the list, from 1.
        number: usize,
        /// Its request id.
        request_id: String,
    },
    /// Signing a session: a call of another session.
    #[error(
        "refusing to sign: exchange {number} (request `{request_id}`) is a call of session `{session_id}`, not of `{expected}`"
    )]
    OtherSession {
        /// Its place in the list, from 1.
        number: usize,
        /// Its request id.
        request_id: String,
        /// Its session.
        session_id: String,
        /// The session of the first exchange.
        expected: String,
    },
    /// With these entries the bundle's session chains would break.
    #[error(
        "refusing to sign: the bundle would not verify at entry {sequence} (request `{request_id}`): {problem}"
    )]
    Session {
        /// The entry's sequence in the bundle (already there, or as it would be signed).
        sequence: u64,
        /// Its request id.
        request_id: String,
        /// Where and how the session's chain breaks.
        problem: Box<SessionChainError>,
    },
    /// The bundle there does not verify as far as it goes; nothing is chained onto it.
    #[error(
        "the bundle {} does not verify ({error}); run `plimsoll-attest verify` and sign into a new bundle",
        path.display()
    )]
    Bundle {
        /// The bundle.
        path: PathBuf,
        /// Why.
        error: Box<VerifyBundleError>,
    },
    /// The signed bundle, read back, did not verify (a bug: nothing was written).
    #[error(
        "the signed chain did not verify when read back ({0}); nothing was written: report this"
    )]
    SelfCheck(Box<VerifyBundleError>),
    /// Opening, locking, signing or writing failed, or the bundle is closed.
    #[error(transparent)]
    Append(#[from] AppendError),
}

/// Signs the calls of one session, in order, into the bundle at `path` (created if missing)
/// and closes it. Every exchange must carry a session link naming the first one's session;
/// otherwise as [`sign_chain`].
pub fn sign_session(
    path: &Path,
    key: &AttestKey,
    calls: &[Exchange],
) -> Result<SignedChain, SignChainError> {
    let first = calls.first().ok_or(SignChainError::Empty)?;
    let session_of = |number: usize, ex: &Exchange| {
        ex.response
            .record
            .session
            .as_ref()
            .map(|l| l.session_id.clone())
            .ok_or_else(|| SignChainError::NotSessionCall {
                number,
                request_id: ex.request.request_id.clone(),
            })
    };
    let expected = session_of(1, first)?;
    for (i, ex) in calls.iter().enumerate() {
        let session_id = session_of(i + 1, ex)?;
        if session_id != expected {
            return Err(SignChainError::OtherSession {
                number: i + 1,
                request_id: ex.request.request_id.clone(),
                session_id,
                expected,
            });
        }
    }
    sign_chain(path, key, calls)
}

/// Signs `exchanges`, in order, as the next entries of the bundle at `path` (created if
/// missing), then closes it. Before anything is signed: every exchange checks
/// ([`check_exchange`]), the bundle there verifies as far as it goes and is not closed, and the
/// session chains of its entries and these exchanges together are whole (`verify`'s rules). The
/// entries and the close are then signed, the whole bundle verified from its bytes, and the
/// lines written with one write under the bundle's lock. Nothing is written on any refusal.
pub fn sign_chain(
    path: &Path,
    key: &AttestKey,
    exchanges: &[Exchange],
) -> Result<SignedChain, SignChainError> {
    if exchanges.is_empty() {
        return Err(SignChainError::Empty);
    }
    for (i, ex) in exchanges.iter().enumerate() {
        check_exchange(ex).map_err(|error| SignChainError::Check {
            number: i + 1,
            request_id: ex.request.request_id.clone(),
            error: Box::new(error),
        })?;
    }
    // A bundle that is not there yet is not created for a chain that cannot be signed.
    if !path.try_exists().unwrap_or(true) {
        check_chain(&[], exchanges)?;
    }
    let file = open_locked(path, true)?;
    let mut existing = Vec::new();
    (&file)
        .read_to_end(&mut existing)
        .map_err(|source| AppendError::Io {
            action: "read",
            path: path.to_owned(),
            source,
        })?;
    let bundle_error = |error| SignChainError::Bundle {
        path: path.to_owned(),
        error: Box::new(error),
    };
    let read = read_lines(&existing, key.public()).map_err(bundle_error)?;
    if read.close.is_some() {
        return Err(AppendError::Closed {
            path: path.to_owned(),
            sequence: read.entries.len() as u64,
        }
        .into());
    }
    check_chain(&read.entries, exchanges)?;

    let mut sequence = read.entries.len() as u64;
    let mut previous = read.previous;
    let mut bytes = Vec::new();
    let mut entries = Vec::new();
    for ex in exchanges {
        let line = sign_exchange(key, ex, sequence, &previous).map_err(AppendError::from)?;
        let mut raw = line.to_bytes();
        raw.push(b'\n');
        previous = envelope_sha256(&line.envelope);
        entries.push(Appended {
            sequence,
            line: sequence + 1,
            envelope_sha256: previous.clone(),
            bytes: raw.len(),
        });
        bytes.extend_from_slice(&raw);
        sequence += 1;
    }
    let close = sign_close(key, sequence, &previous);
    let mut raw = close.to_bytes();
    raw.push(b'\n');
    let close = Appended {
        sequence,
        line: sequence + 1,
        envelope_sha256: envelope_sha256(&close.envelope),
        bytes: raw.len(),
    };
    bytes.extend_from_slice(&raw);

    // The bundle as it will be, verified exactly as `verify` will.
    let mut whole = existing;
    whole.extend_from_slice(&bytes);
    verify_bundle_bytes(&whole, key.public())
        .map_err(|e| SignChainError::SelfCheck(Box::new(e)))?;
    write_locked(&file, path, &bytes)?;
    Ok(SignedChain { entries, close })
}

/// The session chains of a bundle's `entries` followed by `exchanges`.
fn check_chain(entries: &[VerifiedEntry], exchanges: &[Exchange]) -> Result<(), SignChainError> {
    let records: Vec<&RunRecord> = entries
        .iter()
        .map(|e| &e.exchange)
        .chain(exchanges)
        .map(|ex| &ex.response.record)
        .collect();
    check_session_chains(&records).map_err(|(index, problem)| SignChainError::Session {
        sequence: index as u64,
        request_id: records[index].request_id.clone(),
        problem: Box::new(problem),
    })
}
