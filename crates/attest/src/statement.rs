//! The in-toto Statement v1 that plimsoll-attest signs: one per checked run (subject: the run
//! record's digest) and one to close a bundle (subject: the last entry's digest).

use plimsoll_wire::Tier;
use serde::{Deserialize, Serialize};

/// `_type` of an in-toto Statement v1.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// `predicateType` of a signed run.
pub const RUN_PREDICATE_TYPE: &str = "urn:plimsoll:attest:run:v1";
/// `predicateType` of a bundle's close.
pub const CLOSE_PREDICATE_TYPE: &str = "urn:plimsoll:attest:close:v1";
/// The `previous_sha256` of a bundle's first statement.
pub const GENESIS_SHA256: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// The subject name of a close statement.
pub const CLOSE_SUBJECT: &str = "bundle-close";

/// An in-toto Statement v1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement<P> {
    /// Always [`STATEMENT_TYPE`].
    #[serde(rename = "_type")]
    pub type_: String,
    /// What the statement is about; exactly one subject here.
    pub subject: Vec<Subject>,
    /// [`RUN_PREDICATE_TYPE`] or [`CLOSE_PREDICATE_TYPE`].
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    /// The predicate.
    pub predicate: P,
}

/// A subject: a name and its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subject {
    /// `run:<request_id>` for a run, [`CLOSE_SUBJECT`] for a close.
    pub name: String,
    /// The digest set; SHA-256 only.
    pub digest: DigestSet,
}

/// An in-toto digest set holding one SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DigestSet {
    /// Lowercase hex.
    pub sha256: String,
}

/// The predicate of a signed run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunPredicate {
    /// Position in the bundle, 0-based: the first entry is 0.
    pub sequence: u64,
    /// SHA-256 of the previous line's envelope, or [`GENESIS_SHA256`] for the first.
    pub previous_sha256: String,
    /// The request id the run was sent with.
    pub request_id: String,
    /// Digest of the request (protocol digest encoding).
    pub request_sha256: String,
    /// Digest of the result (protocol digest encoding).
    pub result_sha256: String,
    /// The provider that ran it.
    pub provider: String,
    /// Its tier.
    pub isolation: Tier,
    /// Digest of the provider's evidence.
    pub evidence_sha256: String,
    /// What the code ran on.
    pub environment: String,
    /// SHA-256 of the stored exchange's canonical JSON: covers what no protocol digest does
    /// (durations, the echoed fields), so no byte of a bundle line goes unsigned.
    pub exchange_sha256: String,
}

/// The predicate of a bundle's close.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClosePredicate {
    /// Position in the bundle: equal to the number of entries.
    pub sequence: u64,
    /// SHA-256 of the previous line's envelope (the last entry's), or [`GENESIS_SHA256`].
    pub previous_sha256: String,
    /// How many entries the bundle holds.
    pub entries: u64,
    /// SHA-256 of the last entry's envelope, or [`GENESIS_SHA256`] when there are none.
    pub last_entry_sha256: String,
}

/// A statement of one of the two kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnyStatement {
    /// A signed run.
    Run(Statement<RunPredicate>),
    /// A close.
    Close(Statement<ClosePredicate>),
}

impl AnyStatement {
    /// The statement's sequence number.
    pub fn sequence(&self) -> u64 {
        match self {
            AnyStatement::Run(s) => s.predicate.sequence,
            AnyStatement::Close(s) => s.predicate.sequence,
        }
    }

    /// The digest of the entry it names as its predecessor.
    pub fn previous(&self) -> &str {
        match self {
            AnyStatement::Run(s) => &s.predicate.previous_sha256,
            AnyStatement::Close(s) => &s.predicate.previous_sha256,
        }
    }

    /// `entry` or `close`.
    pub fn kind(&self) -> &'static str {
        match self {
            AnyStatement::Run(_) => "entry",
            AnyStatement::Close(_) => "close",
        }
    }
}

/// Why a payload is not a statement of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseStatementError {
    /// Not JSON of the statement's shape.
    #[error("the signed payload is not an in-toto statement: {0}")]
    Shape(String),
    /// Another `_type`.
    #[error("the statement's _type is `{0}`, expected `{STATEMENT_TYPE}`")]
    Type(String),
    /// A predicate type this version does not know.
    #[error(
        "unknown predicateType `{0}`: expected `{RUN_PREDICATE_TYPE}` or `{CLOSE_PREDICATE_TYPE}`"
    )]
    PredicateType(String),
    /// The predicate does not have its type's shape.
    #[error("the {kind} predicate does not match its type: {why}")]
    Predicate {
        /// `entry` or `close`.
        kind: &'static str,
        /// The parser's complaint.
        why: String,
    },
    /// Not exactly one subject.
    #[error("the statement has {0} subjects; a plimsoll statement has exactly one")]
    SubjectCount(usize),
}

/// Parses a signed payload into one of the two statement kinds.
pub fn parse_statement(payload: &[u8]) -> Result<AnyStatement, ParseStatementError> {
    let raw: Statement<serde_json::Value> =
        serde_json::from_slice(payload).map_err(|e| ParseStatementError::Shape(e.to_string()))?;
    if raw.type_ != STATEMENT_TYPE {
        return Err(ParseStatementError::Type(raw.type_));
    }
    if raw.subject.len() != 1 {
        return Err(ParseStatementError::SubjectCount(raw.subject.len()));
    }
    fn typed<P: serde::de::DeserializeOwned>(
        raw: Statement<serde_json::Value>,
        kind: &'static str,
    ) -> Result<Statement<P>, ParseStatementError> {
        let predicate =
            serde_json::from_value(raw.predicate).map_err(|e| ParseStatementError::Predicate {
                kind,
                why: e.to_string(),
            })?;
        Ok(Statement {
            type_: raw.type_,
            subject: raw.subject,
            predicate_type: raw.predicate_type,
            predicate,
        })
    }
    match raw.predicate_type.as_str() {
        RUN_PREDICATE_TYPE => typed(raw, "entry").map(AnyStatement::Run),
        CLOSE_PREDICATE_TYPE => typed(raw, "close").map(AnyStatement::Close),
        other => Err(ParseStatementError::PredicateType(other.to_owned())),
    }
}

/// The statement's JSON bytes, as signed: keys in declaration order, no whitespace.
pub fn to_payload<P: Serialize>(statement: &Statement<P>) -> Vec<u8> {
    serde_json::to_vec(statement).expect("a statement serialises")
}
