//! Snapshots and forks (docs/sessions.md, "Snapshots and forks"): a snapshot of a session, a
//! fork into copies, a session opened from a snapshot; each answer checked against where this
//! client holds the session's chain. A copy's chain goes on from its parent's call at the
//! snapshot, and every record of a restored or forked session carries its origin.

use plimsoll_wire::{
    ForkAnswer, ForkRequest, PROTOCOL, SessionInfo, SessionOrigin, SessionStart, SnapshotInfo,
    SnapshotList, SnapshotOpenRequest, SnapshotRequest,
};

use super::{Session, session_answer};
use crate::{Client, ClientError, EXCHANGE_SLACK, new_request_id, refusal};

/// An answer's body, parsed, after the status and the echoed request id are checked.
fn parsed<T: serde::de::DeserializeOwned>(
    request_id: &str,
    status: u16,
    bytes: &[u8],
    what: &str,
    echoed: impl Fn(&T) -> Option<&str>,
) -> Result<T, ClientError> {
    if status != 200 {
        return Err(refusal(request_id, status, bytes));
    }
    let v: T = serde_json::from_slice(bytes).map_err(|e| ClientError::BadResponse {
        request_id: request_id.to_owned(),
        status,
        message: format!("not {what}: {e}"),
    })?;
    match echoed(&v) {
        Some(id) if id == request_id => Ok(v),
        other => Err(ClientError::RequestIdMismatch {
            sent: request_id.to_owned(),
            echoed: other.unwrap_or_default().to_owned(),
        }),
    }
}

fn body<T: serde::Serialize>(request_id: &str, value: &T) -> Result<Vec<u8>, ClientError> {
    serde_json::to_vec(value).map_err(|e| ClientError::InvalidRequest {
        request_id: request_id.to_owned(),
        message: format!("the request does not serialise: {e}"),
    })
}

impl Session {
    /// Takes a snapshot of the session (paused while it is saved; it goes on). The snapshot
    /// must be of this session where this client holds its chain.
    pub fn snapshot(&mut self) -> Result<SnapshotInfo, ClientError> {
        let request_id = new_request_id();
        self.chain_known(&request_id)?;
        let sent = body(
            &request_id,
            &SnapshotRequest {
                protocol: PROTOCOL,
                request_id: request_id.clone(),
            },
        )?;
        let path = format!("/v1/sessions/{}/snapshot", self.info.session_id);
        let (status, bytes) =
            self.client
                .exchange("POST", &path, Some(&sent), &[], EXCHANGE_SLACK, &request_id)?;
        let snap: SnapshotInfo = parsed(
            &request_id,
            status,
            &bytes,
            "a snapshot",
            |s: &SnapshotInfo| s.request_id.as_deref(),
        )?;
        self.check_snapshot(&request_id, &snap)?;
        Ok(snap)
    }

    /// Forks the session into `count` new sessions, each restored from one snapshot of it and
    /// given fresh randomness: the snapshot and the copies. Each copy must name this session
    /// as its parent at the snapshot; one that does not fails the fork (and every copy is
    /// closed again).
    pub fn fork(&mut self, count: u32) -> Result<(SnapshotInfo, Vec<Session>), ClientError> {
        let request_id = new_request_id();
        self.chain_known(&request_id)?;
        let sent = body(
            &request_id,
            &ForkRequest {
                protocol: PROTOCOL,
                request_id: request_id.clone(),
                count,
            },
        )?;
        let path = format!("/v1/sessions/{}/fork", self.info.session_id);
        let (status, bytes) =
            self.client
                .exchange("POST", &path, Some(&sent), &[], EXCHANGE_SLACK, &request_id)?;
        let answer: ForkAnswer = parsed(
            &request_id,
            status,
            &bytes,
            "a fork answer",
            |a: &ForkAnswer| Some(a.request_id.as_str()),
        )?;
        let copies: Vec<Session> = answer
            .sessions
            .iter()
            .map(|info| Session::resumed(&self.client, info.clone()))
            .collect();
        let checked = self
            .check_snapshot(&request_id, &answer.snapshot)
            .and_then(|()| {
                if copies.len() != count as usize {
                    return Err(ClientError::BadResponse {
                        request_id: request_id.clone(),
                        status,
                        message: format!("the fork answered {} copies, not {count}", copies.len()),
                    });
                }
                copies.iter().try_for_each(|c| {
                    check_copy(
                        &request_id,
                        &c.info,
                        &answer.snapshot,
                        SessionStart::Forked,
                        &self.info,
                    )
                })
            });
        if let Err(e) = checked {
            for c in copies {
                let _ = c.close();
            }
            return Err(e);
        }
        Ok((answer.snapshot, copies))
    }

    /// A session resumed from `info` where the daemon says its chain stands.
    pub(super) fn resumed(client: &Client, info: SessionInfo) -> Session {
        Session {
            client: client.clone(),
            last: (info.calls, info.last_record_sha256.clone()),
            info,
            last_request: None,
            doubt: None,
        }
    }

    /// A snapshot said to be of this session: of it, at its chain's place, at its provider.
    fn check_snapshot(&self, request_id: &str, snap: &SnapshotInfo) -> Result<(), ClientError> {
        let (calls, last) = &self.last;
        let mismatch = |field: &'static str, expected: String, got: String| {
            Err(ClientError::ChainMismatch {
                request_id: request_id.to_owned(),
                session_id: self.info.session_id.clone(),
                field,
                expected: Some(expected),
                got: Some(got),
            })
        };
        if snap.session_id != self.info.session_id {
            return mismatch(
                "session_id",
                self.info.session_id.clone(),
                snap.session_id.clone(),
            );
        }
        if snap.calls != *calls || snap.last_record_sha256 != *last {
            return mismatch(
                "sequence",
                format!("{calls} {last:?}"),
                format!("{} {:?}", snap.calls, snap.last_record_sha256),
            );
        }
        if snap.provider != self.info.provider {
            return mismatch(
                "provider",
                self.info.provider.clone(),
                snap.provider.clone(),
            );
        }
        Ok(())
    }
}

/// A copy (`start` forked) or a restored session (`start` restored) said to come from
/// `snap` of `parent`: its origin names them, its chain stands where the parent's did, and
/// it runs where the parent ran.
fn check_copy(
    request_id: &str,
    copy: &SessionInfo,
    snap: &SnapshotInfo,
    start: SessionStart,
    parent: &SessionInfo,
) -> Result<(), ClientError> {
    let expected = SessionOrigin {
        start,
        snapshot_sha256: snap.sha256.clone(),
        parent_session_id: snap.session_id.clone(),
        parent_record_sha256: snap.last_record_sha256.clone(),
        parent_calls: snap.calls,
    };
    let mismatch = |field: &'static str, expected: String, got: String| {
        Err(ClientError::ChainMismatch {
            request_id: request_id.to_owned(),
            session_id: copy.session_id.clone(),
            field,
            expected: Some(expected),
            got: Some(got),
        })
    };
    if copy.origin.as_ref() != Some(&expected) {
        return mismatch(
            "origin",
            format!("{expected:?}"),
            format!("{:?}", copy.origin),
        );
    }
    if copy.calls != snap.calls || copy.last_record_sha256 != snap.last_record_sha256 {
        return mismatch(
            "sequence",
            format!("{} {:?}", snap.calls, snap.last_record_sha256),
            format!("{} {:?}", copy.calls, copy.last_record_sha256),
        );
    }
    if copy.session_id == parent.session_id && start == SessionStart::Forked {
        return mismatch(
            "session_id",
            "a new session".into(),
            copy.session_id.clone(),
        );
    }
    for (field, want, got) in [
        ("provider", &parent.provider, &copy.provider),
        (
            "language",
            &parent.language.as_str().to_owned(),
            &copy.language.as_str().to_owned(),
        ),
        ("environment", &parent.environment, &copy.environment),
    ] {
        if want != got {
            return mismatch(field, want.clone(), got.clone());
        }
    }
    Ok(())
}

impl Client {
    /// Opens a new session restored from `snapshot` (as its snapshot answer or a list gave
    /// it): refused by the daemon unless the snapshot's files still hash to its digest; the
    /// session must say it was restored from exactly it.
    pub fn open_snapshot(&self, snapshot: &SnapshotInfo) -> Result<Session, ClientError> {
        let request_id = new_request_id();
        let sent = body(
            &request_id,
            &SnapshotOpenRequest {
                protocol: PROTOCOL,
                request_id: request_id.clone(),
                sha256: Some(snapshot.sha256.clone()),
            },
        )?;
        let path = format!("/v1/snapshots/{}/sessions", snapshot.snapshot_id);
        let (status, bytes) =
            self.exchange("POST", &path, Some(&sent), &[], EXCHANGE_SLACK, &request_id)?;
        let info = session_answer(&request_id, status, &bytes, true)?;
        let session = Session::resumed(self, info);
        // What the parent ran at, as far as the snapshot says it.
        let parent = SessionInfo {
            provider: snapshot.provider.clone(),
            language: snapshot.language,
            ..session.info.clone()
        };
        if let Err(e) = check_copy(
            &request_id,
            &session.info,
            snapshot,
            SessionStart::Restored,
            &parent,
        ) {
            let _ = session.close();
            return Err(e);
        }
        Ok(session)
    }

    /// This caller's snapshots, oldest first.
    pub fn list_snapshots(&self) -> Result<SnapshotList, ClientError> {
        let request_id = new_request_id();
        let (status, bytes) = self.exchange(
            "GET",
            "/v1/snapshots",
            None,
            &[],
            EXCHANGE_SLACK,
            &request_id,
        )?;
        if status != 200 {
            return Err(refusal(&request_id, status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::BadResponse {
            request_id,
            status,
            message: format!("not a snapshot list: {e}"),
        })
    }

    /// Deletes this caller's snapshot `id` (its files removed) and says what it was.
    pub fn delete_snapshot(&self, id: &str) -> Result<SnapshotInfo, ClientError> {
        let request_id = new_request_id();
        let path = format!("/v1/snapshots/{id}");
        let headers = [("plimsoll-request-id", request_id.as_str())];
        let (status, bytes) =
            self.exchange("DELETE", &path, None, &headers, EXCHANGE_SLACK, &request_id)?;
        let snap: SnapshotInfo = parsed(
            &request_id,
            status,
            &bytes,
            "a snapshot",
            |s: &SnapshotInfo| s.request_id.as_deref(),
        )?;
        if snap.snapshot_id != id {
            return Err(ClientError::BadResponse {
                request_id,
                status,
                message: format!(
                    "deleting snapshot {id} answered snapshot {}",
                    snap.snapshot_id
                ),
            });
        }
        Ok(snap)
    }
}

/// Whether `origin`, on a record at `sequence` of session `id` whose chain stood at
/// `previous`, is that session restored under its own id (a daemon restart saved and
/// restored it) right after its last saved call.
pub(super) fn restored_here(
    origin: Option<&SessionOrigin>,
    id: &str,
    sequence: u64,
    previous: Option<&str>,
) -> bool {
    origin.is_some_and(|o| {
        o.start == SessionStart::Restored
            && o.parent_session_id == id
            && o.parent_calls + 1 == sequence
            && o.parent_record_sha256.as_deref() == previous
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_restore_of_the_same_session_after_its_last_call_is_a_restore_boundary() {
        let o = SessionOrigin {
            start: SessionStart::Restored,
            snapshot_sha256: "a".repeat(64),
            parent_session_id: "s".into(),
            parent_record_sha256: Some("r".into()),
            parent_calls: 2,
        };
        assert!(restored_here(Some(&o), "s", 3, Some("r")));
        assert!(!restored_here(None, "s", 3, Some("r")));
        assert!(
            !restored_here(Some(&o), "t", 3, Some("r")),
            "another session"
        );
        assert!(
            !restored_here(Some(&o), "s", 4, Some("r")),
            "not right after"
        );
        assert!(
            !restored_here(Some(&o), "s", 3, Some("q")),
            "another record"
        );
        let forked = SessionOrigin {
            start: SessionStart::Forked,
            ..o
        };
        assert!(!restored_here(Some(&forked), "s", 3, Some("r")), "a fork");
    }
}
