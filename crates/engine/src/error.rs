//! The engine's errors: an engine that could not be built ([`BuildEngineError`]) and a run
//! (or a session's open or call) that gave no result ([`RunError`]).

use plimsoll_wire::{ErrorBody, ErrorResponse, NotDispatched, PROTOCOL, Reason};

/// The engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildEngineError {
    /// No provider was configured: nothing would run, so nothing starts.
    #[error("no provider is configured: configure at least one (for example `process`)")]
    NoProviders,
    /// Two providers share a name.
    #[error("two providers are named `{0}`")]
    DuplicateName(String),
    /// A limit setting makes no sense.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// A run that did not give a result.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Refused before anything ran.
    #[error("not dispatched ({reason}): {message}")]
    Refused {
        /// The caller's request id, when it could be read.
        request_id: Option<String>,
        /// Why.
        reason: Reason,
        /// What to do.
        message: String,
    },
    /// A session's open or call refused before anything of it ran, with a code of its own
    /// (`session_not_found`, `session_ended`, `sandbox_changed`, `interpreter_ended`).
    #[error("not dispatched ({reason}, {code}): {message}")]
    SessionRefused {
        /// The caller's request id, when it could be read.
        request_id: Option<String>,
        /// Why, as a refusal reason.
        reason: Reason,
        /// The code on the wire.
        code: &'static str,
        /// What to do.
        message: String,
        /// Why the session ended, when it has.
        end_reason: Option<plimsoll_wire::EndReason>,
    },
    /// Cancelled after it was dispatched: the client that asked went away
    /// ([`crate::Cancel`]) before its answer. Its code may have run; whatever the sandbox
    /// gave is not kept, and nothing of the provider is in doubt (it is not checked again).
    #[error("the run on `{provider}` was cancelled (its client went away); it may have run")]
    Cancelled {
        /// The caller's request id.
        request_id: String,
        /// The provider it was dispatched to.
        provider: String,
    },
    /// Failed after the code may have started.
    #[error("the run failed after it may have started on `{provider}`: {message}")]
    Failed {
        /// The caller's request id.
        request_id: String,
        /// The provider it was dispatched to.
        provider: String,
        /// What failed.
        message: String,
    },
}

impl NotDispatched for RunError {
    fn not_dispatched(&self) -> Option<Reason> {
        match self {
            RunError::Refused { reason, .. } | RunError::SessionRefused { reason, .. } => {
                Some(*reason)
            }
            RunError::Failed { .. } | RunError::Cancelled { .. } => None,
        }
    }
}

impl RunError {
    /// A refusal: nothing ran.
    pub fn refused(request_id: Option<&str>, reason: Reason, message: impl Into<String>) -> Self {
        RunError::Refused {
            request_id: request_id.map(str::to_owned),
            reason,
            message: message.into(),
        }
    }

    /// The caller's request id, if known.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            RunError::Refused { request_id, .. } | RunError::SessionRefused { request_id, .. } => {
                request_id.as_deref()
            }
            RunError::Failed { request_id, .. } | RunError::Cancelled { request_id, .. } => {
                Some(request_id)
            }
        }
    }

    /// The wire form.
    pub fn to_response(&self) -> ErrorResponse {
        let mut end_reason = None;
        let (code, message, nd) = match self {
            RunError::Refused {
                reason, message, ..
            } => (reason.as_str().to_owned(), message.clone(), Some(*reason)),
            RunError::SessionRefused {
                reason,
                code,
                message,
                end_reason: end,
                ..
            } => {
                end_reason = *end;
                ((*code).to_owned(), message.clone(), Some(*reason))
            }
            RunError::Failed { .. } => ("sandbox_failed".to_owned(), self.to_string(), None),
            RunError::Cancelled { .. } => ("cancelled".to_owned(), self.to_string(), None),
        };
        ErrorResponse {
            protocol: PROTOCOL,
            request_id: self.request_id().map(str::to_owned),
            error: ErrorBody {
                code,
                message,
                not_dispatched: nd,
                end_reason,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// #28 (4): a cancelled run says it may have run, with its own code, never
    /// `sandbox_failed`.
    #[test]
    fn a_cancelled_run_may_have_run_and_says_cancelled() {
        let e = RunError::Cancelled {
            request_id: "r-1".into(),
            provider: "crun".into(),
        };
        assert_eq!(e.not_dispatched(), None);
        assert_eq!(e.request_id(), Some("r-1"));
        let wire = e.to_response();
        assert_eq!(
            (wire.error.code.as_str(), wire.error.not_dispatched),
            ("cancelled", None)
        );
        assert_eq!(wire.request_id.as_deref(), Some("r-1"));
    }
}
