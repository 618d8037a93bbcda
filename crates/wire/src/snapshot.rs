//! Snapshots and forks of sessions (docs/sessions.md, "Snapshots and forks"): a session's
//! sandbox saved with its interpreter's memory, a new session opened from it, several at
//! once (a fork), and what every record of such a session says of where it came from.

use serde::{Deserialize, Serialize};

use crate::{Language, RequestRejection, SessionInfo, Tier, validate_request_id};

/// How a session that did not open fresh began: from a snapshot, restored (as itself after
/// a daemon restart, or as a new session opened from a snapshot) or forked (one of the
/// copies of a fork).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStart {
    /// Opened from a snapshot: `POST /v1/snapshots/{id}/sessions`, or the same session
    /// brought back by the next daemon after a restart.
    Restored,
    /// One copy of `POST /v1/sessions/{id}/fork`.
    Forked,
}

impl SessionStart {
    /// The snake_case wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStart::Restored => "restored",
            SessionStart::Forked => "forked",
        }
    }
}

/// Where a restored or forked session came from: on its `SessionInfo`, and on every one of
/// its calls' records, inside the record digest (record field 14).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionOrigin {
    /// `restored` or `forked`.
    pub start: SessionStart,
    /// The snapshot's digest, recomputed over its files when it was restored.
    pub snapshot_sha256: String,
    /// The session the snapshot was taken of (the session itself, restored after a restart).
    pub parent_session_id: String,
    /// The parent's last record digest when the snapshot was taken: the record this
    /// session's chain hangs from (its first call's `previous_record_sha256`). Absent when
    /// the parent had answered no call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_record_sha256: Option<String>,
    /// The parent's call count then: this session's first call is sequence one more.
    pub parent_calls: u64,
}

/// The body of `POST /v1/sessions/{id}/snapshot`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// Protocol number; must be [`crate::PROTOCOL`].
    pub protocol: u32,
    /// The caller's id for this request, echoed on the answer.
    pub request_id: String,
}

/// The body of `POST /v1/sessions/{id}/fork`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// Protocol number; must be [`crate::PROTOCOL`].
    pub protocol: u32,
    /// The caller's id for this request, echoed on the answer.
    pub request_id: String,
    /// How many copies: at least 1, at most the server's `[sessions] max_fork`.
    pub count: u32,
}

/// The body of `POST /v1/snapshots/{id}/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotOpenRequest {
    /// Protocol number; must be [`crate::PROTOCOL`].
    pub protocol: u32,
    /// The caller's id for this request, echoed on the answer.
    pub request_id: String,
    /// The snapshot's digest as its snapshot answer gave it: when set, a snapshot whose
    /// files no longer hash to it is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// A snapshot: the answer to `POST /v1/sessions/{id}/snapshot`, an entry of
/// `GET /v1/snapshots`, and the answer to `DELETE /v1/snapshots/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotInfo {
    /// Protocol number of the answer.
    pub protocol: u32,
    /// The request id of the request this answers; absent in a list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Its id (`snp_...`).
    pub snapshot_id: String,
    /// The session it was taken of.
    pub session_id: String,
    /// SHA-256 over its files (docs/sessions.md, "The snapshot digest").
    pub sha256: String,
    /// Its size on disk, bytes: what counts against the snapshot quotas.
    pub bytes: u64,
    /// The provider whose sandbox it holds.
    pub provider: String,
    /// That provider's tier.
    pub isolation: Tier,
    /// The session's interpreter.
    pub language: Language,
    /// The session's call count when it was taken.
    pub calls: u64,
    /// The session's last record digest when it was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_record_sha256: Option<String>,
    /// How long the checkpoint took, milliseconds (the session was paused that long, plus
    /// its restore).
    pub checkpoint_ms: u64,
    /// When it was taken, Unix milliseconds.
    pub created_unix_ms: u64,
    /// When it is removed, Unix milliseconds.
    pub expires_unix_ms: u64,
}

/// The answer to `GET /v1/snapshots`: the caller's own snapshots, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotList {
    /// Protocol number of the answer.
    pub protocol: u32,
    /// The snapshots.
    pub snapshots: Vec<SnapshotInfo>,
}

/// The answer to `POST /v1/sessions/{id}/fork`: the snapshot the copies were restored from
/// (kept, counted against the quotas, until it expires or is deleted) and the copies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkAnswer {
    /// Protocol number of the answer.
    pub protocol: u32,
    /// The request id this answers.
    pub request_id: String,
    /// The snapshot taken of the parent.
    pub snapshot: SnapshotInfo,
    /// The copies, each a new session (`origin.start` is `forked`).
    pub sessions: Vec<SessionInfo>,
}

/// A snapshot id: `snp_`, 16 lowercase hex digits naming the daemon instance that took it,
/// `_`, 32 naming the snapshot.
pub fn validate_snapshot_id(id: &str) -> Result<(), String> {
    let ok = id
        .strip_prefix("snp_")
        .is_some_and(|rest| crate::session::validate_session_id(&format!("ses_{rest}")).is_ok());
    if ok {
        Ok(())
    } else {
        Err("a snapshot id is `snp_` then 16 and 32 lowercase hex digits joined by `_`".into())
    }
}

/// Parses one of the small bodies of this module: an object, the typed parse, the protocol
/// and request id checked. The request id is echoed on a refusal whenever it can be read.
pub fn parse_small_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
    what: &str,
) -> Result<T, RequestRejection> {
    let refuse = |request_id: Option<String>, reason, message: String| RequestRejection {
        request_id,
        reason,
        message,
    };
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        refuse(
            None,
            crate::Reason::Request,
            format!("the body is not valid JSON ({e}): send a {what} (docs/sessions.md)"),
        )
    })?;
    let request_id = value
        .get("request_id")
        .and_then(|v| v.as_str())
        .filter(|id| validate_request_id(id).is_ok())
        .map(str::to_owned);
    if !value.is_object() {
        return Err(refuse(
            request_id,
            crate::Reason::Request,
            "the body must be a JSON object".into(),
        ));
    }
    let protocol = value.get("protocol").and_then(serde_json::Value::as_u64);
    if protocol.is_some_and(|p| p != u64::from(crate::PROTOCOL)) {
        return Err(refuse(
            request_id,
            crate::Reason::Protocol,
            format!(
                "protocol {} is not served: this server speaks protocol {}",
                protocol.unwrap_or_default(),
                crate::PROTOCOL
            ),
        ));
    }
    let Some(id) = value.get("request_id").and_then(|v| v.as_str()) else {
        return Err(refuse(
            None,
            crate::Reason::Request,
            format!("a {what} needs a request_id"),
        ));
    };
    validate_request_id(id).map_err(|m| refuse(None, crate::Reason::Request, m))?;
    serde_json::from_slice(body).map_err(|e| {
        refuse(
            request_id,
            crate::Reason::Request,
            format!("the body is not a {what} ({e}): see docs/sessions.md"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_ids_have_one_shape() {
        let good = format!("snp_{}_{}", "0123456789abcdef", "a".repeat(32));
        assert_eq!(validate_snapshot_id(&good), Ok(()));
        for bad in [
            good.replace("snp_", "ses_"),
            format!("{good}x"),
            "snp_../../etc".into(),
            String::new(),
        ] {
            assert!(validate_snapshot_id(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn small_bodies_are_refused_with_their_request_id() {
        let ok: ForkRequest =
            parse_small_body(br#"{"protocol":1,"request_id":"f-1","count":4}"#, "fork").unwrap();
        assert_eq!(ok.count, 4);
        let e = parse_small_body::<ForkRequest>(
            br#"{"protocol":1,"request_id":"f-2","count":"4"}"#,
            "fork",
        )
        .unwrap_err();
        assert_eq!(e.request_id.as_deref(), Some("f-2"));
        assert_eq!(e.reason, crate::Reason::Request);
        let e = parse_small_body::<ForkRequest>(
            br#"{"protocol":9,"request_id":"f-3","count":1}"#,
            "fork",
        )
        .unwrap_err();
        assert_eq!(e.reason, crate::Reason::Protocol);
        assert_eq!(e.request_id.as_deref(), Some("f-3"));
        for bad in [&b"[]"[..], b"{", br#"{"protocol":1,"count":1}"#] {
            assert_eq!(
                parse_small_body::<ForkRequest>(bad, "fork")
                    .unwrap_err()
                    .reason,
                crate::Reason::Request
            );
        }
    }
}
