//! Sessions through the client (docs/sessions.md): open one, send cells, steps and files,
//! close it. Every call's answer is verified as a run's is (request id, the session's floor,
//! digests), and besides: its record names this session, the next sequence number and the
//! previous call's record digest, and its tier, provider, evidence and environment are the
//! session's (otherwise [`ClientError::ChainMismatch`]). After a call that may have run
//! without an answer the client could verify, where the chain stands is unknown: the session
//! sends nothing more ([`ClientError::ChainInDoubt`]) until [`Session::resync`]. A refusal of
//! a session call is believed only with the echoed request id, as any other.

use plimsoll_wire::{
    Bytes, EndReason, Language, Limits, NotDispatched as _, OutputChunk, PROTOCOL, Project,
    ProjectFile, RunRequest, RunResponse, RunSpec, SessionInfo, SessionList, SessionOpenRequest,
    Snippet, Step, Tier,
};

use crate::{Client, ClientError, EXCHANGE_SLACK, new_request_id, refusal, run_budget};

mod snapshot;

/// What to open a session with; the client adds the protocol and a fresh request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOptions {
    /// The interpreter's language.
    pub language: Language,
    /// The floor; the daemon's default when absent (learnt from `GET /v1/providers`, as for
    /// a run, and the session's stated floor must equal it).
    pub minimum_isolation: Option<Tier>,
    /// A provider that keeps sessions; the daemon chooses when absent.
    pub provider: Option<String>,
    /// A grant profile (an API grant or an egress grant) the session holds for its whole
    /// life: every call's result lists the broker calls and egress receipts since the call
    /// before. A call cannot name one of its own.
    pub grant: Option<String>,
    /// Limits: memory, pids and disk for the session's life; timeout and output caps per call.
    pub limits: Option<Limits>,
    /// The idle timeout, milliseconds.
    pub idle_timeout_ms: Option<u64>,
    /// The maximum lifetime, milliseconds.
    pub max_lifetime_ms: Option<u64>,
    /// The image the session runs in (a name or an identity); the daemon's default when
    /// `None`. The session's answers and every call's record must name it.
    pub image: Option<String>,
}

impl SessionOptions {
    /// A session of `language` with the daemon's defaults.
    pub fn new(language: Language) -> Self {
        SessionOptions {
            language,
            minimum_isolation: None,
            provider: None,
            grant: None,
            limits: None,
            idle_timeout_ms: None,
            max_lifetime_ms: None,
            image: None,
        }
    }

    /// The open request these options make, with this id.
    pub fn into_request(self, request_id: String) -> SessionOpenRequest {
        SessionOpenRequest {
            protocol: PROTOCOL,
            request_id,
            language: self.language,
            minimum_isolation: self.minimum_isolation,
            provider: self.provider,
            grant: self.grant,
            limits: self.limits,
            idle_timeout_ms: self.idle_timeout_ms,
            max_lifetime_ms: self.max_lifetime_ms,
            image: self.image,
        }
    }

    /// Names the image the session runs in.
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.image = Some(image.into());
        self
    }

    /// Sets the floor.
    pub fn min_isolation(mut self, floor: Tier) -> Self {
        self.minimum_isolation = Some(floor);
        self
    }

    /// Names the provider.
    pub fn provider(mut self, name: impl Into<String>) -> Self {
        self.provider = Some(name.into());
        self
    }

    /// Names the grant profile the session holds for its whole life.
    pub fn grant(mut self, name: impl Into<String>) -> Self {
        self.grant = Some(name.into());
        self
    }
}

/// An open session of this client's caller. Calls take `&mut self`: a session answers one
/// call at a time, in order, and the client follows its chain. After a call that may have
/// run without an answer it could verify, it sends nothing more
/// ([`ClientError::ChainInDoubt`]) until [`Session::resync`].
#[derive(Debug)]
pub struct Session {
    client: Client,
    info: SessionInfo,
    /// The sequence number and record digest of the last call answered.
    last: (u64, Option<String>),
    /// The last call's request exactly as sent (what a signer stores beside its answer).
    last_request: Option<RunRequest>,
    /// What put the chain in doubt: a call that may have run without an answer this client
    /// could verify. While set, no call is sent.
    doubt: Option<String>,
}

impl Client {
    /// Opens a session, checks the answer (echoed request id, the tier against the floor,
    /// the provider if named) and returns it.
    pub fn open_session(&self, options: SessionOptions) -> Result<Session, ClientError> {
        let request_id = new_request_id();
        let open = options.clone().into_request(request_id.clone());
        open.validate().map_err(|r| ClientError::InvalidRequest {
            request_id: request_id.clone(),
            message: r.message,
        })?;
        if open.grant.as_deref() == Some("") {
            return Err(ClientError::InvalidRequest {
                request_id,
                message: "grant must not be empty: omit it for a session without grants".into(),
            });
        }
        let body = serde_json::to_vec(&open).map_err(|e| ClientError::InvalidRequest {
            request_id: request_id.clone(),
            message: format!("the request does not serialise: {e}"),
        })?;
        // The floor the session is held to: the one asked for, or the daemon's default.
        let floor = match options.minimum_isolation {
            Some(floor) => floor,
            None => self.learnt_floor(&request_id)?,
        };
        let (status, bytes) = self.exchange(
            "POST",
            "/v1/sessions",
            Some(&body),
            &[],
            EXCHANGE_SLACK,
            &request_id,
        )?;
        let info = session_answer(&request_id, status, &bytes, true)?;
        let checked =
            check_open(&request_id, floor, options.provider.as_deref(), &info).and_then(|()| {
                match &options.image {
                    Some(asked) => crate::check_image(&request_id, asked, info.image.as_ref()),
                    None => Ok(()),
                }
            });
        if let Err(e) = checked {
            // A session this client will not use is not left open on the daemon: closed
            // again, as well as it can be (the error that matters is the check's).
            let _ = Session {
                client: self.clone(),
                info,
                last: (0, None),
                last_request: None,
                doubt: None,
            }
            .close();
            return Err(e);
        }
        Ok(Session {
            client: self.clone(),
            info,
            last: (0, None),
            last_request: None,
            doubt: None,
        })
    }

    /// This caller's open session `id`, resumed where the daemon says its chain stands (its
    /// last call's sequence and record digest): for a caller that did not open it in this
    /// process (the CLI between invocations). A client that opened it keeps its own chain.
    pub fn session(&self, id: &str) -> Result<Session, ClientError> {
        let request_id = new_request_id();
        let path = format!("/v1/sessions/{id}");
        let headers = [("plimsoll-request-id", request_id.as_str())];
        let (status, bytes) =
            self.exchange("GET", &path, None, &headers, EXCHANGE_SLACK, &request_id)?;
        let info = session_answer(&request_id, status, &bytes, false)?;
        let last = (info.calls, info.last_record_sha256.clone());
        Ok(Session {
            client: self.clone(),
            info,
            last,
            last_request: None,
            doubt: None,
        })
    }

    /// This caller's open sessions.
    pub fn list_sessions(&self) -> Result<SessionList, ClientError> {
        let request_id = new_request_id();
        let (status, bytes) = self.exchange(
            "GET",
            "/v1/sessions",
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
            message: format!("not a session list: {e}"),
        })
    }
}

impl Session {
    /// The session as it was opened (and as the last call left its chain).
    pub fn info(&self) -> &SessionInfo {
        &self.info
    }

    /// The request of the last call answered, exactly as it was sent: with the call's
    /// response, the exchange `plimsoll-attest sign` takes.
    pub fn last_request(&self) -> Option<&RunRequest> {
        self.last_request.as_ref()
    }

    /// Its id.
    pub fn id(&self) -> &str {
        &self.info.session_id
    }

    /// What put the session's chain in doubt (a call that may have run without an answer
    /// this client could verify), or `None`. While it is set every call but
    /// [`Session::close`] is refused here, unsent ([`ClientError::ChainInDoubt`]), until
    /// [`Session::resync`].
    pub fn doubt(&self) -> Option<&str> {
        self.doubt.as_deref()
    }

    /// Takes the chain up where the daemon says it stands now (its last call's sequence
    /// number and record digest), as [`Client::session`] does, and lifts the doubt a call
    /// that may have run put on it: the calls since the last one this client verified are
    /// taken on the daemon's word (a signer checks them from their records). The session must
    /// be the one this client holds: same id, language, provider, tier, floor, evidence and
    /// environment.
    pub fn resync(&mut self) -> Result<&SessionInfo, ClientError> {
        let request_id = new_request_id();
        let info = self.show(&request_id)?;
        let bad = |message: String| ClientError::BadResponse {
            request_id: request_id.clone(),
            status: 200,
            message,
        };
        let held = &self.info;
        // Restored under its own id by a daemon restart since: its tier and evidence are the
        // restoring daemon's (docs/sessions.md, "Across a restart").
        let restored = info.origin != held.origin
            && info.origin.as_ref().is_some_and(|o| {
                o.start == plimsoll_wire::SessionStart::Restored
                    && o.parent_session_id == held.session_id
                    && o.parent_calls >= self.last.0
            });
        if info.origin != held.origin && !restored {
            return Err(bad(format!(
                "the daemon shows session {} from {:?}, not {:?} as this client holds it: the answer was altered on the way or the daemon is faulty",
                held.session_id, info.origin, held.origin
            )));
        }
        for (field, shown, opened) in [
            (
                "session_id",
                info.session_id.clone(),
                held.session_id.clone(),
            ),
            (
                "language",
                info.language.as_str().to_owned(),
                held.language.as_str().to_owned(),
            ),
            ("provider", info.provider.clone(), held.provider.clone()),
            (
                "isolation",
                info.isolation.as_str().to_owned(),
                held.isolation.as_str().to_owned(),
            ),
            (
                "minimum_isolation",
                info.minimum_isolation.as_str().to_owned(),
                held.minimum_isolation.as_str().to_owned(),
            ),
            (
                "evidence_sha256",
                info.evidence_sha256.clone(),
                held.evidence_sha256.clone(),
            ),
            (
                "environment",
                info.environment.clone(),
                held.environment.clone(),
            ),
        ] {
            if shown != opened && !(restored && matches!(field, "isolation" | "evidence_sha256")) {
                return Err(bad(format!(
                    "the daemon shows session {} with {field} {shown}, not {opened} as this client holds it: the answer was altered on the way or the daemon is faulty",
                    held.session_id
                )));
            }
        }
        if (info.calls == 0) != info.last_record_sha256.is_none() {
            return Err(bad(format!(
                "the daemon shows session {} with {} calls and {} last record: a chain cannot stand so",
                info.session_id,
                info.calls,
                if info.last_record_sha256.is_some() {
                    "a"
                } else {
                    "no"
                }
            )));
        }
        self.last = (info.calls, info.last_record_sha256.clone());
        self.doubt = None;
        self.info = info;
        Ok(&self.info)
    }

    /// Runs `code` in the session's interpreter.
    pub fn cell(&mut self, code: impl Into<String>) -> Result<RunResponse, ClientError> {
        self.cell_with(code, false, None, None)
    }

    /// Runs `code`; with `restart`, in a fresh interpreter; `timeout_ms` for this cell;
    /// with `on_chunk`, the answer is streamed and each output chunk goes to it as it comes.
    pub fn cell_with(
        &mut self,
        code: impl Into<String>,
        restart: bool,
        timeout_ms: Option<u64>,
        on_chunk: Option<&mut dyn FnMut(&OutputChunk)>,
    ) -> Result<RunResponse, ClientError> {
        let request = self.request(
            RunSpec::Snippet(Snippet {
                language: self.info.language,
                code: code.into(),
            }),
            timeout_ms,
        );
        let path = format!(
            "/v1/sessions/{}/cells{}",
            self.info.session_id,
            if restart { "?restart=true" } else { "" }
        );
        self.streamed(&path, &request, on_chunk)
    }

    /// Runs shell `steps` in order in the session's /work (stopping at the first failure).
    pub fn steps(&mut self, steps: &[&str]) -> Result<RunResponse, ClientError> {
        self.steps_with(steps, None, None)
    }

    /// [`Session::steps`], with a timeout, and with `on_chunk` streamed: output chunks to it
    /// as they come.
    pub fn steps_with(
        &mut self,
        steps: &[&str],
        timeout_ms: Option<u64>,
        on_chunk: Option<&mut dyn FnMut(&OutputChunk)>,
    ) -> Result<RunResponse, ClientError> {
        let request = self.request(
            RunSpec::Project(Project {
                files: Vec::new(),
                steps: steps
                    .iter()
                    .map(|s| Step {
                        name: None,
                        run: (*s).to_owned(),
                    })
                    .collect(),
                artifacts: Vec::new(),
            }),
            timeout_ms,
        );
        let path = format!("/v1/sessions/{}/steps", self.info.session_id);
        self.streamed(&path, &request, on_chunk)
    }

    /// Writes `content` to /work/`path` in the session, bytes exact.
    pub fn put(&mut self, path: &str, content: &[u8]) -> Result<RunResponse, ClientError> {
        let request = self.request(
            RunSpec::Project(Project {
                files: vec![ProjectFile {
                    path: path.to_owned(),
                    content: Bytes::from(content.to_vec()),
                    executable: false,
                }],
                steps: Vec::new(),
                artifacts: Vec::new(),
            }),
            None,
        );
        self.file_call("PUT", path, &request, Some(content))
    }

    /// Reads /work/`path` from the session: its bytes (`None` when there is no such file),
    /// with the call's verified response.
    pub fn get(&mut self, path: &str) -> Result<(Option<Vec<u8>>, RunResponse), ClientError> {
        let request = self.request(
            RunSpec::Project(Project {
                files: Vec::new(),
                steps: Vec::new(),
                artifacts: vec![path.to_owned()],
            }),
            None,
        );
        let resp = self.file_call("GET", path, &request, None)?;
        let bytes = resp
            .result
            .artifacts
            .first()
            .filter(|a| a.found)
            .map(|a| a.content.as_slice().to_vec());
        Ok((bytes, resp))
    }

    /// The session as the daemon shows it now.
    pub fn refresh(&mut self) -> Result<&SessionInfo, ClientError> {
        let request_id = new_request_id();
        self.info = self.show(&request_id)?;
        Ok(&self.info)
    }

    /// `GET /v1/sessions/{id}` under `request_id`.
    fn show(&self, request_id: &str) -> Result<SessionInfo, ClientError> {
        let path = format!("/v1/sessions/{}", self.info.session_id);
        let headers = [("plimsoll-request-id", request_id)];
        let (status, bytes) =
            self.client
                .exchange("GET", &path, None, &headers, EXCHANGE_SLACK, request_id)?;
        session_answer(request_id, status, &bytes, false)
    }

    /// Closes the session: its sandbox is removed; the answer says it ended `closed`.
    pub fn close(self) -> Result<SessionInfo, ClientError> {
        let request_id = new_request_id();
        let path = format!("/v1/sessions/{}", self.info.session_id);
        let (status, bytes) = self.client.exchange(
            "DELETE",
            &path,
            None,
            &[("plimsoll-request-id", &request_id)],
            EXCHANGE_SLACK,
            &request_id,
        )?;
        let info = session_answer(&request_id, status, &bytes, true)?;
        if info.end_reason != Some(EndReason::Closed) {
            return Err(ClientError::BadResponse {
                request_id,
                status,
                message: format!(
                    "the close answered end reason {:?}, not closed",
                    info.end_reason
                ),
            });
        }
        Ok(info)
    }

    fn request(&self, run: RunSpec, timeout_ms: Option<u64>) -> RunRequest {
        RunRequest {
            image: None,
            protocol: PROTOCOL,
            request_id: new_request_id(),
            minimum_isolation: None,
            provider: None,
            limits: timeout_ms.map(|t| Limits {
                timeout_ms: Some(t),
                ..Limits::default()
            }),
            run,
            grant: None,
        }
    }

    /// The refusal, made here, of a call while the chain is in doubt.
    fn in_doubt(&self, request: &RunRequest) -> Result<(), ClientError> {
        self.chain_known(&request.request_id)
    }

    /// The refusal, made here, of anything sent as `request_id` while the chain is in doubt
    /// (a call, a snapshot, a fork: each answer is checked against the chain).
    fn chain_known(&self, request_id: &str) -> Result<(), ClientError> {
        match &self.doubt {
            Some(earlier) => Err(ClientError::ChainInDoubt {
                request_id: request_id.to_owned(),
                session_id: self.info.session_id.clone(),
                earlier: earlier.clone(),
            }),
            None => Ok(()),
        }
    }

    /// A call's outcome: one that may have run without a verified answer puts the chain in
    /// doubt.
    fn settle(
        &mut self,
        request: &RunRequest,
        outcome: Result<RunResponse, ClientError>,
    ) -> Result<RunResponse, ClientError> {
        if let Err(e) = &outcome
            && e.not_dispatched().is_none()
        {
            self.doubt = Some(format!(
                "request {} may have run without an answer this client could verify ({}: {e})",
                request.request_id,
                e.code()
            ));
        }
        outcome
    }

    fn file_call(
        &mut self,
        method: &str,
        path: &str,
        request: &RunRequest,
        content: Option<&[u8]>,
    ) -> Result<RunResponse, ClientError> {
        self.in_doubt(request)?;
        let outcome = self.send_file_call(method, path, request, content);
        self.settle(request, outcome)
    }

    fn send_file_call(
        &mut self,
        method: &str,
        path: &str,
        request: &RunRequest,
        content: Option<&[u8]>,
    ) -> Result<RunResponse, ClientError> {
        request
            .validate_session_call()
            .map_err(|r| ClientError::InvalidRequest {
                request_id: request.request_id.clone(),
                message: r.message,
            })?;
        let url_path = format!("/v1/sessions/{}/files/{path}", self.info.session_id);
        let headers = [
            ("plimsoll-request-id", request.request_id.as_str()),
            ("content-type", "application/octet-stream"),
        ];
        let (status, bytes) = self.client.exchange(
            method,
            &url_path,
            content,
            &headers,
            run_budget(request),
            &request.request_id,
        )?;
        let resp = self
            .client
            .verified(request, self.info.minimum_isolation, status, &bytes)?;
        self.follow(request, resp)
    }

    /// Sends a cell or steps, streamed when `on_chunk` is given, and verifies the answer.
    fn streamed(
        &mut self,
        path: &str,
        request: &RunRequest,
        on_chunk: Option<&mut dyn FnMut(&OutputChunk)>,
    ) -> Result<RunResponse, ClientError> {
        self.in_doubt(request)?;
        let outcome = self.send_streamed(path, request, on_chunk);
        self.settle(request, outcome)
    }

    fn send_streamed(
        &mut self,
        path: &str,
        request: &RunRequest,
        on_chunk: Option<&mut dyn FnMut(&OutputChunk)>,
    ) -> Result<RunResponse, ClientError> {
        request
            .validate_session_call()
            .map_err(|r| ClientError::InvalidRequest {
                request_id: request.request_id.clone(),
                message: r.message,
            })?;
        let (body, sent) = self.client.prepare(request, true)?;
        let floor = self.info.minimum_isolation;
        let resp = match on_chunk {
            Some(on_chunk) => self
                .client
                .post_streamed(path, &body, &sent, floor, on_chunk)?,
            None => {
                let (status, bytes) = self.client.exchange(
                    "POST",
                    path,
                    Some(&body),
                    &[],
                    run_budget(&sent),
                    &sent.request_id,
                )?;
                self.client.verified(&sent, floor, status, &bytes)?
            }
        };
        self.follow(&sent, resp)
    }

    /// Checks a verified call's place in the session's chain and moves the chain on.
    fn follow(&mut self, sent: &RunRequest, resp: RunResponse) -> Result<RunResponse, ClientError> {
        let broken = |field: &'static str, expected: Option<String>, got: Option<String>| {
            Err(ClientError::ChainMismatch {
                request_id: sent.request_id.clone(),
                session_id: self.info.session_id.clone(),
                field,
                expected,
                got,
            })
        };
        let Some(link) = &resp.record.session else {
            return broken("session", Some(self.info.session_id.clone()), None);
        };
        if link.session_id != self.info.session_id {
            return broken(
                "session_id",
                Some(self.info.session_id.clone()),
                Some(link.session_id.clone()),
            );
        }
        let (sequence, previous) = &self.last;
        if link.sequence != sequence + 1 {
            return broken(
                "sequence",
                Some((sequence + 1).to_string()),
                Some(link.sequence.to_string()),
            );
        }
        if link.previous_record_sha256 != *previous {
            return broken(
                "previous_record_sha256",
                previous.clone(),
                link.previous_record_sha256.clone(),
            );
        }
        // A restored or forked session's every record says where it came from; a session
        // restored under its own id after a daemon restart says so from the call after its
        // last saved one, and from there runs at the restoring daemon's tier and evidence.
        if link.origin != self.info.origin {
            let previous = previous.clone();
            if !snapshot::restored_here(
                link.origin.as_ref(),
                &self.info.session_id,
                link.sequence,
                previous.as_deref(),
            ) {
                return broken(
                    "origin",
                    self.info.origin.as_ref().map(|o| format!("{o:?}")),
                    link.origin.as_ref().map(|o| format!("{o:?}")),
                );
            }
            self.info.origin = link.origin.clone();
            self.info.isolation = resp.isolation;
            self.info.evidence_sha256 = resp.record.evidence_sha256.clone();
        }
        // Every call runs in the image the session opened in.
        if resp.record.image != self.info.image {
            let said = |i: &Option<plimsoll_wire::ImageRef>| {
                i.as_ref().map(|i| format!("{} ({})", i.name, i.identity))
            };
            return broken("image", said(&self.info.image), said(&resp.record.image));
        }
        for (field, session, answer) in [
            ("provider", &self.info.provider, &resp.provider),
            (
                "isolation",
                &self.info.isolation.as_str().to_owned(),
                &resp.isolation.as_str().to_owned(),
            ),
            (
                "evidence_sha256",
                &self.info.evidence_sha256,
                &resp.record.evidence_sha256,
            ),
            (
                "environment",
                &self.info.environment,
                &resp.record.environment,
            ),
        ] {
            if session != answer {
                return broken(field, Some(session.clone()), Some(answer.clone()));
            }
        }
        self.last = (link.sequence, Some(resp.record.record_sha256.clone()));
        self.last_request = Some(sent.clone());
        self.info.calls = link.sequence;
        self.info.last_record_sha256 = Some(resp.record.record_sha256.clone());
        Ok(resp)
    }
}

/// The checks on an opened session: its tier meets the floor this client holds it to (the
/// one asked for, or the daemon's default) and the floor it says it holds, that floor is
/// this one, and its provider is the one named.
fn check_open(
    request_id: &str,
    floor: Tier,
    provider: Option<&str>,
    info: &SessionInfo,
) -> Result<(), ClientError> {
    crate::check_tier(request_id, Some(floor), &info.provider, info.isolation)?;
    crate::check_tier(
        request_id,
        Some(info.minimum_isolation),
        &info.provider,
        info.isolation,
    )?;
    if info.minimum_isolation != floor {
        return Err(ClientError::RecordMismatch {
            request_id: request_id.to_owned(),
            field: "minimum_isolation",
            response: floor.as_str().to_owned(),
            record: info.minimum_isolation.as_str().to_owned(),
        });
    }
    if let Some(asked) = provider
        && asked != info.provider
    {
        return Err(ClientError::ProviderMismatch {
            request_id: request_id.to_owned(),
            asked: asked.to_owned(),
            provider: info.provider.clone(),
        });
    }
    Ok(())
}

/// The session a `200` answer to `request_id` describes, or the error another status says;
/// with `echoed` (an open or a close), the answer must echo `request_id`.
fn session_answer(
    request_id: &str,
    status: u16,
    bytes: &[u8],
    echoed: bool,
) -> Result<SessionInfo, ClientError> {
    if status != 200 {
        return Err(refusal(request_id, status, bytes));
    }
    let info: SessionInfo =
        serde_json::from_slice(bytes).map_err(|e| ClientError::BadResponse {
            request_id: request_id.to_owned(),
            status,
            message: format!("not a session: {e}"),
        })?;
    if echoed && info.request_id.as_deref() != Some(request_id) {
        return Err(ClientError::RequestIdMismatch {
            sent: request_id.to_owned(),
            echoed: info.request_id.unwrap_or_default(),
        });
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_request_carries_the_grant_the_options_name() {
        let open = SessionOptions::new(Language::Python)
            .min_isolation(Tier::Container)
            .grant("pkgs")
            .into_request("r-1".into());
        assert_eq!(open.grant.as_deref(), Some("pkgs"));
        assert_eq!(open.minimum_isolation, Some(Tier::Container));
        let sent: serde_json::Value = serde_json::to_value(&open).unwrap();
        assert_eq!(sent["grant"], "pkgs");
        // None named: the member is left out, as before.
        let plain = SessionOptions::new(Language::Python).into_request("r-2".into());
        let sent: serde_json::Value = serde_json::to_value(&plain).unwrap();
        assert!(sent.get("grant").is_none(), "{sent}");
    }

    #[test]
    fn an_empty_grant_is_refused_here_and_never_sent() {
        // Port 1 on loopback: a connection would fail as a transport error, not a refusal.
        let client = Client::new("http://127.0.0.1:1", crate::Token::new("plm_x"));
        let e = client
            .open_session(
                SessionOptions::new(Language::Python)
                    .min_isolation(Tier::Container)
                    .grant(""),
            )
            .unwrap_err();
        assert!(
            matches!(&e, ClientError::InvalidRequest { message, .. } if message.contains("grant must not be empty")),
            "{e:?}"
        );
        assert_eq!(
            plimsoll_wire::not_dispatched_reason(&e),
            Some(plimsoll_wire::Reason::Request)
        );
    }
}
