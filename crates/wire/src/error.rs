//! Refusals and errors as they cross the wire, and the not-dispatched mark.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a request was refused before anything ran. A refusal carrying one of these is a
/// promise: no code of the request started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reason {
    /// Malformed or out of bounds.
    Request,
    /// Caller unknown, or not allowed what it asked for.
    Permission,
    /// Protocol number not served.
    Protocol,
    /// No provider can do this kind of run.
    Unsupported,
    /// No available provider meets the floor.
    Isolation,
    /// A provider's environment failed its check, or the software asked for is missing.
    Environment,
    /// Admission limits: concurrency, queue, rate.
    Capacity,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 7] = [
        Reason::Request,
        Reason::Permission,
        Reason::Protocol,
        Reason::Unsupported,
        Reason::Isolation,
        Reason::Environment,
        Reason::Capacity,
    ];

    /// The lowercase wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Request => "request",
            Reason::Permission => "permission",
            Reason::Protocol => "protocol",
            Reason::Unsupported => "unsupported",
            Reason::Isolation => "isolation",
            Reason::Environment => "environment",
            Reason::Capacity => "capacity",
        }
    }

    /// The HTTP status a refusal for this reason is answered with (docs/daemon.md), by
    /// plimsolld and plimsoll-router alike.
    pub fn http_status(self) -> u16 {
        match self {
            Reason::Request | Reason::Protocol => 400,
            Reason::Permission => 403,
            Reason::Unsupported | Reason::Isolation => 422,
            Reason::Environment => 503,
            Reason::Capacity => 429,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors that can say whether the code they concern could have started.
pub trait NotDispatched {
    /// `Some(reason)` only when it is certain that nothing ran.
    fn not_dispatched(&self) -> Option<Reason>;
}

/// The reason an error says nothing ran, or `None` when the code may have run.
/// Works the same for the in-process engine's errors and the remote client's.
pub fn not_dispatched_reason<E: NotDispatched + ?Sized>(err: &E) -> Option<Reason> {
    err.not_dispatched()
}

/// The error half of an answer: `{"protocol":1,"request_id":..,"error":{..}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorResponse {
    /// The protocol number of the answer.
    pub protocol: u32,
    /// The caller's request id, echoed; `None` when the request carried none that could be read.
    pub request_id: Option<String>,
    /// What went wrong.
    pub error: ErrorBody,
}

/// What went wrong, and whether anything ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// A stable machine-readable code: the reason's name for refusals, otherwise e.g.
    /// `sandbox_failed`, `internal`, `unauthenticated`.
    pub code: String,
    /// A message for people, saying what to do next. Never holds a secret.
    pub message: String,
    /// Set only when nothing ran. `null` means the code may have run: never retry blindly.
    pub not_dispatched: Option<Reason>,
    /// For a call to a session that has ended: why it ended (docs/sessions.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<crate::EndReason>,
}

/// A request body that could not be accepted. Nothing ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RequestRejection {
    /// The request id, if one could be read from the body.
    pub request_id: Option<String>,
    /// `Request` or `Protocol`.
    pub reason: Reason,
    /// What is wrong and what to do.
    pub message: String,
}

impl NotDispatched for RequestRejection {
    fn not_dispatched(&self) -> Option<Reason> {
        Some(self.reason)
    }
}

impl RequestRejection {
    /// The wire form of this rejection.
    pub fn to_response(&self) -> ErrorResponse {
        ErrorResponse {
            protocol: crate::PROTOCOL,
            request_id: self.request_id.clone(),
            error: ErrorBody {
                code: self.reason.as_str().to_owned(),
                message: self.message.clone(),
                not_dispatched: Some(self.reason),
                end_reason: None,
            },
        }
    }
}
