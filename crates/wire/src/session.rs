//! Sessions: one sandbox kept across calls (cells in an interpreter that keeps its state,
//! shell steps, files), its chained records, and how it ends (docs/sessions.md).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Language, Limits, RequestRejection, Tier, Wall, validate_request_id};

/// The body of `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionOpenRequest {
    /// Protocol number; must be [`crate::PROTOCOL`].
    pub protocol: u32,
    /// The caller's id for this request, echoed on the answer.
    pub request_id: String,
    /// The language of the session's interpreter (its cells).
    pub language: Language,
    /// The weakest tier the session may run at; the operator's default floor when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_isolation: Option<Tier>,
    /// Names the provider to run at; the server chooses when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// A grant profile (an API or an egress grant) the session holds for its whole life: every
    /// call may use it, and a call names none of its own (docs/sessions.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// The session's limits: `memory_bytes`, `pids`, `disk_bytes` hold for its whole life;
    /// `timeout_ms` and `output_bytes` are each call's defaults (a call may lower them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// The session ends after this long without a call, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// The session ends this long after it opened, milliseconds, whatever it is doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lifetime_ms: Option<u64>,
    /// The image the session runs in, fixed at open: a name or an identity; the operator's
    /// default image when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// Parses a session open request's body (`POST /v1/sessions`): JSON, an object, no array
/// (an open request holds no list; serde would read one as the members in order), then the
/// typed parse. The request id is echoed on a refusal whenever it can be read. Nothing ran
/// on any error; [`SessionOpenRequest::validate`] checks the rest.
pub fn parse_session_open(body: &[u8]) -> Result<SessionOpenRequest, RequestRejection> {
    let refuse = |request_id: Option<String>, message: String| RequestRejection {
        request_id,
        reason: crate::Reason::Request,
        message,
    };
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        refuse(
            None,
            format!(
                "the body is not valid JSON ({e}): send a session open request (docs/sessions.md)"
            ),
        )
    })?;
    let request_id = value
        .get("request_id")
        .and_then(|v| v.as_str())
        .filter(|id| validate_request_id(id).is_ok())
        .map(str::to_owned);
    if !value.is_object() {
        return Err(refuse(request_id, "the body must be a JSON object".into()));
    }
    if let Some(message) = crate::shape::array_outside(&value, &[], "session open request") {
        return Err(refuse(request_id, message));
    }
    // From the bytes, not `value`: the derived type refuses a duplicated member name.
    serde_json::from_slice(body).map_err(|e| {
        refuse(
            request_id,
            format!("the body is not a session open request ({e}): see docs/sessions.md"),
        )
    })
}

impl SessionOpenRequest {
    /// Structural checks that need no operator settings.
    pub fn validate(&self) -> Result<(), RequestRejection> {
        let reject = |reason, message: String| RequestRejection {
            request_id: validate_request_id(&self.request_id)
                .ok()
                .map(|()| self.request_id.clone()),
            reason,
            message,
        };
        if self.protocol != crate::PROTOCOL {
            return Err(reject(
                crate::Reason::Protocol,
                format!(
                    "protocol {} is not served: this server speaks protocol {}",
                    self.protocol,
                    crate::PROTOCOL
                ),
            ));
        }
        validate_request_id(&self.request_id).map_err(|m| reject(crate::Reason::Request, m))?;
        if self.provider.as_deref() == Some("") {
            return Err(reject(
                crate::Reason::Request,
                "provider must not be empty: omit it to let the server choose".into(),
            ));
        }
        for (name, value) in [
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("max_lifetime_ms", self.max_lifetime_ms),
        ] {
            if value == Some(0) {
                return Err(reject(
                    crate::Reason::Request,
                    format!("{name} must be greater than 0"),
                ));
            }
        }
        if let Some(m) = self.limits.as_ref().and_then(Limits::below_minimum_message) {
            return Err(reject(crate::Reason::Request, m));
        }
        if let Some(image) = &self.image {
            crate::validate_image_selector(image).map_err(|m| reject(crate::Reason::Request, m))?;
        }
        Ok(())
    }
}

/// Why a session, or its interpreter, ended. Every end has one; none is silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// The caller closed it (`DELETE /v1/sessions/{id}`).
    Closed,
    /// No call came within its idle timeout.
    IdleTimeout,
    /// Its maximum lifetime passed.
    MaxLifetime,
    /// Its interpreter exited or was killed by something other than the memory limit or a
    /// cell's timeout (ends the interpreter; the session's sandbox stays).
    InterpreterCrash,
    /// The memory limit killed its interpreter (ends the interpreter).
    OutOfMemory,
    /// A cell ran past its timeout and its interpreter was killed (ends the interpreter).
    CellTimeout,
    /// Its sandbox, re-checked before a call, no longer matched what it was at open.
    SandboxChanged,
    /// The daemon that held it restarted (sessions do not survive one).
    DaemonRestarted,
    /// Its sandbox failed under a call (the call may have run).
    SandboxFailed,
}

impl EndReason {
    /// Every reason, in the order docs/sessions.md lists them.
    pub const ALL: [EndReason; 9] = [
        EndReason::Closed,
        EndReason::IdleTimeout,
        EndReason::MaxLifetime,
        EndReason::InterpreterCrash,
        EndReason::OutOfMemory,
        EndReason::CellTimeout,
        EndReason::SandboxChanged,
        EndReason::DaemonRestarted,
        EndReason::SandboxFailed,
    ];

    /// The snake_case wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Closed => "closed",
            EndReason::IdleTimeout => "idle_timeout",
            EndReason::MaxLifetime => "max_lifetime",
            EndReason::InterpreterCrash => "interpreter_crash",
            EndReason::OutOfMemory => "out_of_memory",
            EndReason::CellTimeout => "cell_timeout",
            EndReason::SandboxChanged => "sandbox_changed",
            EndReason::DaemonRestarted => "daemon_restarted",
            EndReason::SandboxFailed => "sandbox_failed",
        }
    }

    /// Whether this reason ends only the interpreter (its state), not the session.
    pub fn ends_interpreter_only(self) -> bool {
        matches!(
            self,
            EndReason::InterpreterCrash | EndReason::OutOfMemory | EndReason::CellTimeout
        )
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A session as `POST /v1/sessions`, `GET /v1/sessions[/{id}]` and `DELETE` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionInfo {
    /// Protocol number of the answer.
    pub protocol: u32,
    /// The request id of the request this answers (`POST` and `DELETE`); absent on `GET`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The session's id (`ses_...`), the path segment of its calls.
    pub session_id: String,
    /// Its interpreter's language.
    pub language: Language,
    /// The provider it runs at.
    pub provider: String,
    /// That provider's tier, measured at open; every call's floor is checked against it.
    pub isolation: Tier,
    /// The floor it was opened with (the request's, or the operator's default).
    pub minimum_isolation: Tier,
    /// Digest of the provider's evidence at open.
    pub evidence_sha256: String,
    /// What it runs on: the sandbox image identity.
    pub environment: String,
    /// The image it runs in, fixed at open (on every call's record too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<crate::ImageRef>,
    /// Its sandbox at open, read from /proc (the host's, or said from inside at runsc):
    /// what every call's re-check compares with.
    pub wall: Wall,
    /// When it opened, Unix milliseconds.
    pub opened_unix_ms: u64,
    /// When its maximum lifetime ends, Unix milliseconds.
    pub expires_unix_ms: u64,
    /// Its idle timeout, milliseconds.
    pub idle_timeout_ms: u64,
    /// How many calls it has answered (the sequence number of the last record).
    pub calls: u64,
    /// The record digest of its last call; absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_record_sha256: Option<String>,
    /// Whether its interpreter is alive with its state (false after it ended, until a cell
    /// asks for a restart).
    pub interpreter_alive: bool,
    /// Why it ended; absent while it is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<EndReason>,
    /// Where it came from when it was restored or forked from a snapshot (also on every
    /// call's record); absent for a session opened fresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<crate::SessionOrigin>,
}

/// The answer to `GET /v1/sessions`: the caller's own open sessions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionList {
    /// Protocol number of the answer.
    pub protocol: u32,
    /// The caller's open sessions, oldest first.
    pub sessions: Vec<SessionInfo>,
}

/// A session id: `ses_`, 16 lowercase hex digits naming the daemon instance, `_`, 32 naming
/// the session.
pub fn validate_session_id(id: &str) -> Result<(), String> {
    let ok = id.strip_prefix("ses_").is_some_and(|rest| {
        let mut parts = rest.split('_');
        let (Some(daemon), Some(session), None) = (parts.next(), parts.next(), parts.next()) else {
            return false;
        };
        let hex =
            |s: &str, n| s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        hex(daemon, 16) && hex(session, 32)
    });
    if ok {
        Ok(())
    } else {
        Err("a session id is `ses_` then 16 and 32 lowercase hex digits joined by `_`".into())
    }
}

/// The daemon-instance part of a valid session id.
pub fn session_instance(id: &str) -> Option<&str> {
    validate_session_id(id).ok()?;
    id.get(4..20)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `"limits": [100]` opened a session with a 100 ms call timeout (issue 28, finding 17).
    #[test]
    fn a_session_open_request_with_an_array_for_an_object_is_refused() {
        let ok =
            r#"{"protocol":1,"request_id":"o-1","language":"python","limits":{"timeout_ms":100}}"#;
        let open = parse_session_open(ok.as_bytes()).unwrap();
        assert_eq!(open.limits.unwrap().timeout_ms, Some(100));
        let bad = ok.replace(r#"{"timeout_ms":100}"#, "[100]");
        let e = parse_session_open(bad.as_bytes()).unwrap_err();
        assert_eq!(e.reason, crate::Reason::Request);
        assert_eq!(e.request_id.as_deref(), Some("o-1"));
        assert!(e.message.contains("`limits`"), "{}", e.message);
        for bad in [
            r#"[1,"o-2","python"]"#,
            "{nope",
            r#"{"request_id":"o-3","x":1}"#,
        ] {
            assert_eq!(
                parse_session_open(bad.as_bytes()).unwrap_err().reason,
                crate::Reason::Request,
                "{bad}"
            );
        }
        let e = parse_session_open(br#"{"request_id":"o-3","protocol":1,"x":1}"#).unwrap_err();
        assert_eq!(e.request_id.as_deref(), Some("o-3"));
    }

    #[test]
    fn session_ids_have_one_shape() {
        let good = format!("ses_{}_{}", "0123456789abcdef", "f".repeat(32));
        assert_eq!(validate_session_id(&good), Ok(()));
        assert_eq!(session_instance(&good), Some("0123456789abcdef"));
        for bad in [
            String::new(),
            "ses_".into(),
            good.to_uppercase(),
            format!("{good}_"),
            good.replace("ses_", "run_"),
            format!("ses_{}_{}", "0123456789abcdef", "f".repeat(31)),
            format!("ses_{}_{}", "0123456789abcdeg", "f".repeat(32)),
            "../etc/passwd".into(),
        ] {
            assert!(validate_session_id(&bad).is_err(), "{bad}");
            assert_eq!(session_instance(&bad), None);
        }
    }

    #[test]
    fn end_reasons_are_snake_case_on_the_wire() {
        for r in EndReason::ALL {
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{}\"", r.as_str()));
            assert_eq!(serde_json::from_str::<EndReason>(&json).unwrap(), r);
        }
        assert!(EndReason::OutOfMemory.ends_interpreter_only());
        assert!(!EndReason::IdleTimeout.ends_interpreter_only());
    }

    #[test]
    fn an_open_request_with_zero_limits_or_another_protocol_is_refused() {
        let ok = SessionOpenRequest {
            protocol: crate::PROTOCOL,
            request_id: "r1".into(),
            language: Language::Python,
            minimum_isolation: None,
            provider: None,
            grant: None,
            limits: None,
            idle_timeout_ms: Some(1000),
            max_lifetime_ms: None,
            image: None,
        };
        assert!(ok.validate().is_ok());
        let bad = SessionOpenRequest {
            idle_timeout_ms: Some(0),
            ..ok.clone()
        };
        assert_eq!(bad.validate().unwrap_err().reason, crate::Reason::Request);
        let bad = SessionOpenRequest { protocol: 9, ..ok };
        assert_eq!(bad.validate().unwrap_err().reason, crate::Reason::Protocol);
    }
}

/// Which stream a chunk of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// A chunk of a run's or call's output as it came: a preview, covered by no digest (the
/// final result, with its digests, is what counts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputChunk {
    /// Its stream.
    pub stream: OutputStream,
    /// Where its first byte sits in the stream (bytes before it, in this stream).
    pub offset: u64,
    /// The bytes.
    pub bytes: crate::Bytes,
}

/// One line of a streamed answer (`Accept: application/x-ndjson`): chunks of output as they
/// came, then exactly one response or error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum StreamLine {
    /// Output as it came: a preview, covered by no digest.
    Chunk(StreamChunk),
    /// The final answer, with its digests (exactly what the answer without streaming is).
    Response(Box<crate::RunResponse>),
    /// The final answer when there was no result.
    Error(Box<crate::ErrorResponse>),
}

/// A streamed chunk: says it is a preview.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamChunk {
    /// Always true: a chunk is a preview; the final response is what its digests cover.
    pub preview: bool,
    /// The output.
    #[serde(flatten)]
    pub chunk: OutputChunk,
}

impl StreamLine {
    /// A chunk line for `chunk`.
    pub fn chunk(chunk: OutputChunk) -> Self {
        StreamLine::Chunk(StreamChunk {
            preview: true,
            chunk,
        })
    }
}
