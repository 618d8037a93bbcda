//! The client's errors, one enum per operation. Each says whether the code could have run.

use std::fmt;

use plimsoll_wire::{ErrorBody, ErrorResponse, NotDispatched, PROTOCOL, Reason, Tier};

/// Which digest a [`ClientError::DigestMismatch`] concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestKind {
    /// `request_sha256`: over the request as this client serialised it.
    Request,
    /// `result_sha256`: over the returned result.
    Result,
    /// `record.record_sha256`: over the returned run record.
    Record,
}

impl fmt::Display for DigestKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DigestKind::Request => "request",
            DigestKind::Result => "result",
            DigestKind::Record => "record",
        })
    }
}

/// [`Client::run`](crate::Client::run) gave no verified result.
///
/// Only five variants promise that nothing ran ([`not_dispatched_reason`] is `Some`):
/// [`InvalidRequest`](ClientError::InvalidRequest),
/// [`Unreachable`](ClientError::Unreachable), [`FloorUnknown`](ClientError::FloorUnknown)
/// and [`ChainInDoubt`](ClientError::ChainInDoubt) (nothing was sent), and
/// [`Refused`](ClientError::Refused) (the daemon said so, echoing this request's id). Every
/// other variant means the code may have run: never retry it blindly.
///
/// [`not_dispatched_reason`]: plimsoll_wire::not_dispatched_reason
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request is malformed; it was not sent.
    #[error("not dispatched (request): {message}")]
    InvalidRequest {
        /// The id the request would have carried.
        request_id: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// The daemon could not be reached, and nothing was sent (connection refused, name not
    /// resolved, connect timeout, bad URL).
    #[error(
        "not dispatched (environment): cannot reach the daemon at {url} ({message}): check that plimsolld is running and the URL is right"
    )]
    Unreachable {
        /// The URL tried.
        url: String,
        /// What failed.
        message: String,
    },
    /// No floor was set and the daemon's default floor could not be learnt
    /// (`GET /v1/providers` failed), so the answer could not be checked against it: nothing
    /// was sent.
    #[error(
        "not dispatched ({reason}): no floor was set and this client could not learn the daemon's default floor, so it sent nothing ({message}); set a floor (minimum_isolation), or fix what the message says"
    )]
    FloorUnknown {
        /// The id the request would have carried.
        request_id: String,
        /// The refusal's reason when the daemon refused the listing, else `environment`.
        reason: Reason,
        /// The daemon's error code when it refused the listing.
        code: Option<String>,
        /// Why the listing gave no floor.
        message: String,
    },
    /// A call of a session was not sent: an earlier call of it may have run without an
    /// answer this client could verify, so where the session's chain stands is unknown here
    /// until [`Session::resync`](crate::Session::resync) takes the daemon's word for it.
    #[error(
        "not dispatched (request): session {session_id}'s chain is in doubt since {earlier}, so this client sent nothing; call resync() to take the daemon's word for where it stands, or open a new session"
    )]
    ChainInDoubt {
        /// The id the call would have carried.
        request_id: String,
        /// The session.
        session_id: String,
        /// What put the chain in doubt: the earlier call and its error.
        earlier: String,
    },
    /// The daemon refused the request before anything ran, and its answer echoed this
    /// request's id.
    #[error("not dispatched ({reason}): {message}")]
    Refused {
        /// The request id sent and echoed.
        request_id: String,
        /// Why nothing ran.
        reason: Reason,
        /// The daemon's error code.
        code: String,
        /// The daemon's message: what to do.
        message: String,
        /// For a call to a session that has ended: why it ended.
        end_reason: Option<plimsoll_wire::EndReason>,
    },
    /// The daemon answered with an error that does not say nothing ran.
    #[error(
        "the code may have run (request {request_id}, HTTP {status}, {code}): {message}; do not retry blindly"
    )]
    Failed {
        /// The request id sent.
        request_id: String,
        /// The HTTP status.
        status: u16,
        /// The daemon's error code.
        code: String,
        /// The daemon's message.
        message: String,
    },
    /// An answer claimed that nothing ran, but it echoed another request's id (or none), so
    /// the claim cannot be about this request.
    #[error(
        "the code may have run: an answer claimed `not dispatched ({reason})` but echoed request id {}, not {sent}; something between this client and the daemon mixed up answers",
        echoed.as_deref().unwrap_or("(none)")
    )]
    UnverifiedRefusal {
        /// The request id sent.
        sent: String,
        /// The id the answer echoed.
        echoed: Option<String>,
        /// The reason the answer claimed.
        reason: Reason,
        /// The answer's message.
        message: String,
    },
    /// A result echoed another request's id: it is not this request's result.
    #[error(
        "the code may have run: the result echoes request id {echoed}, not {sent}; something between this client and the daemon mixed up answers, so this result is not yours"
    )]
    RequestIdMismatch {
        /// The request id sent.
        sent: String,
        /// The id the result echoed.
        echoed: String,
    },
    /// A digest recomputed here differs from the one in the answer.
    #[error(
        "{kind} digest mismatch for request {request_id}: computed {computed}, the answer says {claimed}; the answer was altered on the way or the daemon is faulty, and the code may have run"
    )]
    DigestMismatch {
        /// The request id sent.
        request_id: String,
        /// Which digest.
        kind: DigestKind,
        /// What this client computed.
        computed: String,
        /// What the answer stated.
        claimed: String,
    },
    /// The run record disagrees with the response around it.
    #[error(
        "the run record disagrees with the response on `{field}` for request {request_id}: response {response}, record {record}; the answer was altered or the daemon is faulty, and the code may have run"
    )]
    RecordMismatch {
        /// The request id sent.
        request_id: String,
        /// The field.
        field: &'static str,
        /// The value in the response (or computed here).
        response: String,
        /// The value in the record.
        record: String,
    },
    /// The result says the run used a tier below the floor it was held to (the one this
    /// request asked for, the daemon's default floor when it asked for none, or the floor the
    /// record states). The code ran: this is not a refusal.
    #[error(
        "evidence mismatch for request {request_id}: the run used `{isolation}` (provider {provider}), below the floor `{floor}` it was held to; the code ran, but not behind the wall you required"
    )]
    EvidenceMismatch {
        /// The request id sent.
        request_id: String,
        /// The provider the answer names.
        provider: String,
        /// The tier the answer states (the weaker of response and record).
        isolation: Tier,
        /// The floor: the one the request asked for, or the daemon's default, or the record's.
        floor: Tier,
    },
    /// The result says the run used another provider than the one this request named. The
    /// code ran: this is not a refusal.
    #[error(
        "evidence mismatch for request {request_id}: the run used provider `{provider}`, not `{asked}` as asked; the code ran, but not where you required"
    )]
    ProviderMismatch {
        /// The request id sent.
        request_id: String,
        /// The provider the request named.
        asked: String,
        /// The provider the answer (response or record) names.
        provider: String,
    },
    /// The record says the code ran in another image than the one this request (or its
    /// session) named, or names none. The code ran: this is not a refusal.
    #[error(
        "evidence mismatch for request {request_id}: the run's record names image {}, not `{asked}` as asked; the code ran, but not in the image you required",
        image.as_deref().map_or_else(|| "none".to_owned(), |i| format!("`{i}`"))
    )]
    ImageMismatch {
        /// The request id sent.
        request_id: String,
        /// The image the request named (a name or an identity).
        asked: String,
        /// The image the record names (`name (identity)`), if any.
        image: Option<String>,
    },
    /// A session call's answer verified as a run, but it is not the next link of the
    /// session's chain: its record names another session, or is not the call after the last
    /// one this client verified (a call missing, slipped in, repeated or reordered), or it
    /// ran elsewhere than the session (provider, tier, evidence, environment).
    #[error(
        "the code may have run: the answer to request {request_id} breaks session {session_id}'s chain on `{field}`: expected {}, the record says {}; a call of the session is missing, slipped in, repeated or reordered, or the answer is not this session's",
        expected.as_deref().unwrap_or("(none)"),
        got.as_deref().unwrap_or("(none)")
    )]
    ChainMismatch {
        /// The request id sent.
        request_id: String,
        /// The session the call was sent to.
        session_id: String,
        /// The member that breaks the chain: `session` (the record names none),
        /// `session_id`, `sequence`, `previous_record_sha256`, `provider`, `isolation`,
        /// `evidence_sha256`, `environment`.
        field: &'static str,
        /// What the session's chain says it must be (`None`: absent).
        expected: Option<String>,
        /// What the answer says (`None`: absent).
        got: Option<String>,
    },
    /// The exchange failed after the request may have been sent.
    #[error(
        "the code may have run: the exchange with {url} failed after the request may have been sent (request {request_id}): {message}"
    )]
    Transport {
        /// The request id sent.
        request_id: String,
        /// The URL.
        url: String,
        /// What failed.
        message: String,
    },
    /// The answer could not be read as a result or an error.
    #[error(
        "the code may have run: unreadable answer from the daemon (request {request_id}, HTTP {status}): {message}"
    )]
    BadResponse {
        /// The request id sent.
        request_id: String,
        /// The HTTP status.
        status: u16,
        /// What was wrong with it.
        message: String,
    },
}

impl NotDispatched for ClientError {
    fn not_dispatched(&self) -> Option<Reason> {
        match self {
            ClientError::InvalidRequest { .. } | ClientError::ChainInDoubt { .. } => {
                Some(Reason::Request)
            }
            ClientError::Unreachable { .. } => Some(Reason::Environment),
            ClientError::Refused { reason, .. } | ClientError::FloorUnknown { reason, .. } => {
                Some(*reason)
            }
            ClientError::Failed { .. }
            | ClientError::ChainMismatch { .. }
            | ClientError::UnverifiedRefusal { .. }
            | ClientError::RequestIdMismatch { .. }
            | ClientError::DigestMismatch { .. }
            | ClientError::RecordMismatch { .. }
            | ClientError::EvidenceMismatch { .. }
            | ClientError::ProviderMismatch { .. }
            | ClientError::ImageMismatch { .. }
            | ClientError::Transport { .. }
            | ClientError::BadResponse { .. } => None,
        }
    }
}

impl ClientError {
    /// The request id this client sent (or would have sent); `None` only for
    /// [`ClientError::Unreachable`].
    pub fn request_id(&self) -> Option<&str> {
        match self {
            ClientError::Unreachable { .. } => None,
            ClientError::InvalidRequest { request_id, .. }
            | ClientError::FloorUnknown { request_id, .. }
            | ClientError::ChainInDoubt { request_id, .. }
            | ClientError::ChainMismatch { request_id, .. }
            | ClientError::Refused { request_id, .. }
            | ClientError::Failed { request_id, .. }
            | ClientError::DigestMismatch { request_id, .. }
            | ClientError::RecordMismatch { request_id, .. }
            | ClientError::EvidenceMismatch { request_id, .. }
            | ClientError::ProviderMismatch { request_id, .. }
            | ClientError::ImageMismatch { request_id, .. }
            | ClientError::Transport { request_id, .. }
            | ClientError::BadResponse { request_id, .. } => Some(request_id),
            ClientError::UnverifiedRefusal { sent, .. }
            | ClientError::RequestIdMismatch { sent, .. } => Some(sent),
        }
    }

    /// A stable machine-readable code: the daemon's own code for its refusals and failures
    /// (`isolation`, `session_ended`, `interpreter_ended`, `sandbox_failed`, ...), otherwise
    /// the check that failed here (`chain_in_doubt`, `digest_mismatch`, ...), or the reason's
    /// name for a request refused here.
    pub fn code(&self) -> &str {
        match self {
            ClientError::InvalidRequest { .. } => Reason::Request.as_str(),
            ClientError::Unreachable { .. } => Reason::Environment.as_str(),
            ClientError::FloorUnknown { code, reason, .. } => {
                code.as_deref().unwrap_or(reason.as_str())
            }
            ClientError::ChainInDoubt { .. } => "chain_in_doubt",
            ClientError::Refused { code, .. } | ClientError::Failed { code, .. } => code,
            ClientError::ChainMismatch { .. } => "chain_mismatch",
            ClientError::UnverifiedRefusal { .. } => "unverified_refusal",
            ClientError::RequestIdMismatch { .. } => "request_id_mismatch",
            ClientError::DigestMismatch { .. } => "digest_mismatch",
            ClientError::RecordMismatch { .. } => "record_mismatch",
            ClientError::EvidenceMismatch { .. }
            | ClientError::ProviderMismatch { .. }
            | ClientError::ImageMismatch { .. } => "evidence_mismatch",
            ClientError::Transport { .. } => "transport",
            ClientError::BadResponse { .. } => "bad_response",
        }
    }

    /// The error as a wire [`ErrorResponse`], echoing the id this client sent, with the
    /// daemon's code and the session's end reason for the daemon's own refusals; its
    /// `not_dispatched` is set only when nothing ran.
    pub fn to_response(&self) -> ErrorResponse {
        // Not-dispatched errors carry the bare message: the mark is a field of its own.
        let message = match self {
            ClientError::Refused { message, .. } | ClientError::InvalidRequest { message, .. } => {
                message.clone()
            }
            ClientError::Unreachable { url, message } => format!(
                "cannot reach the daemon at {url} ({message}): check that plimsolld is running and the URL is right"
            ),
            other => {
                let text = other.to_string();
                match other.not_dispatched() {
                    Some(reason) => text
                        .strip_prefix(&format!("not dispatched ({reason}): "))
                        .map_or_else(|| text.clone(), str::to_owned),
                    None => text,
                }
            }
        };
        ErrorResponse {
            protocol: PROTOCOL,
            request_id: self.request_id().map(str::to_owned),
            error: ErrorBody {
                code: self.code().to_owned(),
                message,
                not_dispatched: self.not_dispatched(),
                end_reason: match self {
                    ClientError::Refused { end_reason, .. } => *end_reason,
                    _ => None,
                },
            },
        }
    }
}

/// [`Client::providers`](crate::Client::providers) gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum ProvidersError {
    /// The daemon could not be reached.
    #[error(
        "cannot reach the daemon at {url} ({message}): check that plimsolld is running and the URL is right"
    )]
    Unreachable {
        /// The URL tried.
        url: String,
        /// What failed.
        message: String,
    },
    /// The daemon answered with an error.
    #[error("the daemon at {url} answered HTTP {status} ({code}): {message}")]
    Refused {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The daemon's error code.
        code: String,
        /// The daemon's message.
        message: String,
        /// The refusal's reason (`permission` for a token it does not know), if it gave one.
        not_dispatched: Option<Reason>,
    },
    /// The exchange failed midway.
    #[error("the exchange with {url} failed: {message}")]
    Transport {
        /// The URL.
        url: String,
        /// What failed.
        message: String,
    },
    /// The answer could not be read.
    #[error("unreadable answer from {url} (HTTP {status}): {message}")]
    BadResponse {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// What was wrong.
        message: String,
    },
}
