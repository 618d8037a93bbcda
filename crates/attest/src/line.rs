//! One bundle line: its JSON form, and the checks of one line on its own (parse, canonical form,
//! signature, statement, stored exchange against the signed statement). The chain checks that
//! span lines live in `verify`.

use plimsoll_wire::digest::sha256_hex;
use serde::{Deserialize, Serialize};

use crate::dsse::{self, Envelope, OpenEnvelopeError};
use crate::exchange::{CheckExchangeError, Exchange, check_exchange};
use crate::keys::PublicKey;
use crate::statement::{
    AnyStatement, CLOSE_SUBJECT, ClosePredicate, ParseStatementError, RunPredicate, Statement,
    parse_statement,
};

/// One line of a bundle: an entry (exchange and envelope) or the close (envelope only).
/// Stored as its canonical JSON (serde's field order, no whitespace) and a newline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleLine {
    /// The request as sent and the full response; absent on the close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exchange: Option<Exchange>,
    /// The signed statement.
    pub envelope: Envelope,
}

impl BundleLine {
    /// The line's bytes, without the newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a bundle line serialises")
    }
}

/// SHA-256 (lowercase hex) of an envelope's canonical JSON: what the next line names as its
/// predecessor.
pub fn envelope_sha256(envelope: &Envelope) -> String {
    sha256_hex(&serde_json::to_vec(envelope).expect("an envelope serialises"))
}

/// What is wrong with one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineProblem {
    /// An empty line.
    #[error("empty line: a bundle has one JSON object per line")]
    Empty,
    /// The file does not end with a newline.
    #[error("does not end with a newline: the bundle was cut short while being written")]
    Unterminated,
    /// Not a bundle line at all.
    #[error("not a bundle line: {0}")]
    NotJson(String),
    /// Parses, but is not the exact bytes the writer produces for what it holds.
    #[error(
        "not in canonical form (whitespace, key order or escapes differ from what plimsoll-attest writes): the line was edited"
    )]
    NotCanonical,
    /// The envelope does not open.
    #[error(transparent)]
    Envelope(#[from] OpenEnvelopeError),
    /// The payload is not a statement of ours.
    #[error(transparent)]
    Statement(#[from] ParseStatementError),
    /// A sequence number out of line.
    #[error("{}", sequence_message(*expected, *found))]
    Sequence {
        /// The number this line must carry.
        expected: u64,
        /// The number it carries.
        found: u64,
    },
    /// Names another predecessor.
    #[error(
        "names {found} as its predecessor, but the line before it has digest {expected}: an entry was removed, replaced or moved"
    )]
    Previous {
        /// The previous line's envelope digest (or the genesis value).
        expected: String,
        /// The digest the statement names.
        found: String,
    },
    /// An entry without its exchange.
    #[error("a signed run without its stored exchange: the request and response were removed")]
    MissingExchange,
    /// A close with an exchange.
    #[error("the close carries an exchange; a close holds only its envelope")]
    ExchangeOnClose,
    /// The stored exchange does not check.
    #[error("the stored exchange does not check: {0}")]
    Exchange(Box<CheckExchangeError>),
    /// The subject is not the one the exchange gives.
    #[error("the signed subject is {found}, but the stored exchange gives {expected}")]
    Subject {
        /// What the exchange gives, `name sha256:digest`.
        expected: String,
        /// What was signed.
        found: String,
    },
    /// A predicate field is not the one the exchange gives.
    #[error("the signed {field} is `{signed}`, but the stored exchange gives `{stored}`")]
    Predicate {
        /// Which field.
        field: &'static str,
        /// The signed value.
        signed: String,
        /// The value from the exchange.
        stored: String,
    },
    /// The close counts another number of entries.
    #[error("the close counts {signed} entries, but the bundle holds {counted} before it")]
    CloseCount {
        /// The signed count.
        signed: u64,
        /// The lines before it.
        counted: u64,
    },
    /// The close names another last entry.
    #[error("the close names {signed} as the last entry, but the last entry has digest {actual}")]
    CloseLast {
        /// The signed digest.
        signed: String,
        /// The actual last envelope digest.
        actual: String,
    },
    /// A line after the close.
    #[error("follows the close at line {close_line}: nothing may follow a close")]
    AfterClose {
        /// The close's line number.
        close_line: usize,
    },
}

impl From<CheckExchangeError> for LineProblem {
    fn from(e: CheckExchangeError) -> Self {
        LineProblem::Exchange(Box::new(e))
    }
}

fn sequence_message(expected: u64, found: u64) -> String {
    if found < expected {
        format!(
            "sequence {found} where {expected} was expected: an entry is repeated or out of order"
        )
    } else {
        let missing = found - expected;
        let noun = if missing == 1 { "entry" } else { "entries" };
        format!(
            "sequence {found} where {expected} was expected: {missing} {noun} missing before it, or out of order"
        )
    }
}

/// Parses a line (without its newline), checks that it is canonical and its signature, and
/// returns it with its statement.
pub fn open_line(raw: &[u8], key: &PublicKey) -> Result<(BundleLine, AnyStatement), LineProblem> {
    if raw.is_empty() {
        return Err(LineProblem::Empty);
    }
    let line: BundleLine =
        serde_json::from_slice(raw).map_err(|e| LineProblem::NotJson(e.to_string()))?;
    if line.to_bytes() != raw {
        return Err(LineProblem::NotCanonical);
    }
    let payload = dsse::open(&line.envelope, key)?;
    let statement = parse_statement(&payload)?;
    Ok((line, statement))
}

fn field(field: &'static str, signed: &str, stored: &str) -> Result<(), LineProblem> {
    if signed == stored {
        return Ok(());
    }
    Err(LineProblem::Predicate {
        field,
        signed: signed.to_owned(),
        stored: stored.to_owned(),
    })
}

/// Checks an entry's stored exchange (every digest recomputed) against its signed statement.
pub fn check_entry(
    exchange: Option<&Exchange>,
    st: &Statement<RunPredicate>,
) -> Result<(), LineProblem> {
    let ex = exchange.ok_or(LineProblem::MissingExchange)?;
    let d = check_exchange(ex)?;
    let rec = &ex.response.record;
    let subject = &st.subject[0];
    let expected_name = format!("run:{}", ex.request.request_id);
    if subject.name != expected_name || subject.digest.sha256 != d.record_sha256 {
        return Err(LineProblem::Subject {
            expected: format!("{expected_name} sha256:{}", d.record_sha256),
            found: format!("{} sha256:{}", subject.name, subject.digest.sha256),
        });
    }
    let p = &st.predicate;
    field("request_id", &p.request_id, &ex.request.request_id)?;
    field("request_sha256", &p.request_sha256, &d.request_sha256)?;
    field("result_sha256", &p.result_sha256, &d.result_sha256)?;
    field("provider", &p.provider, &rec.provider)?;
    field("isolation", p.isolation.as_str(), rec.isolation.as_str())?;
    field("evidence_sha256", &p.evidence_sha256, &rec.evidence_sha256)?;
    field("environment", &p.environment, &rec.environment)?;
    field("exchange_sha256", &p.exchange_sha256, &d.exchange_sha256)?;
    Ok(())
}

/// Checks a close against the entries before it.
pub fn check_close(
    line: &BundleLine,
    st: &Statement<ClosePredicate>,
    entries: u64,
    last_entry: &str,
) -> Result<(), LineProblem> {
    if line.exchange.is_some() {
        return Err(LineProblem::ExchangeOnClose);
    }
    let p = &st.predicate;
    if p.entries != entries {
        return Err(LineProblem::CloseCount {
            signed: p.entries,
            counted: entries,
        });
    }
    if p.last_entry_sha256 != last_entry {
        return Err(LineProblem::CloseLast {
            signed: p.last_entry_sha256.clone(),
            actual: last_entry.to_owned(),
        });
    }
    let subject = &st.subject[0];
    if subject.name != CLOSE_SUBJECT || subject.digest.sha256 != last_entry {
        return Err(LineProblem::Subject {
            expected: format!("{CLOSE_SUBJECT} sha256:{last_entry}"),
            found: format!("{} sha256:{}", subject.name, subject.digest.sha256),
        });
    }
    Ok(())
}

/// The sequence and predecessor checks every line shares.
pub fn check_position(
    st: &AnyStatement,
    expected_sequence: u64,
    previous: &str,
) -> Result<(), LineProblem> {
    if st.sequence() != expected_sequence {
        return Err(LineProblem::Sequence {
            expected: expected_sequence,
            found: st.sequence(),
        });
    }
    if st.previous() != previous {
        return Err(LineProblem::Previous {
            expected: previous.to_owned(),
            found: st.previous().to_owned(),
        });
    }
    Ok(())
}
