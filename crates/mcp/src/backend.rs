//! Where the tools' runs and sessions go: the embedded engine or a daemon through the Rust
//! client, behind one small blocking trait.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Once};

use plimsoll_client::{Client, ClientError, RunOptions, Session, SessionOptions, new_request_id};
use plimsoll_engine::{Engine, RunError, SessionCallKind};
use plimsoll_wire::{
    Bytes, EndReason, ForkRequest, Language, Limits, NotDispatched, PROTOCOL, Project, ProjectFile,
    ProvidersResponse, Reason, RunRequest, RunResponse, RunSpec, SessionInfo, SessionList,
    SnapshotInfo, SnapshotList, SnapshotOpenRequest, SnapshotRequest, Snippet, Step, Tier,
};

/// A run, a session operation or a listing that gave no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// Refused before anything ran.
    #[error("not dispatched ({reason}): {message}")]
    NotDispatched {
        /// Why.
        reason: Reason,
        /// The error code on the wire (`isolation`, `session_ended`, `interpreter_ended`,
        /// ...), when the refusal came with one that could be checked.
        code: Option<String>,
        /// For a call to a session that has ended: why it ended.
        end_reason: Option<EndReason>,
        /// What to do.
        message: String,
    },
    /// Failed after the code may have started, or no verified answer came back.
    #[error("{message}")]
    MayHaveRun {
        /// What failed.
        message: String,
    },
}

impl NotDispatched for BackendError {
    fn not_dispatched(&self) -> Option<Reason> {
        match self {
            BackendError::NotDispatched { reason, .. } => Some(*reason),
            BackendError::MayHaveRun { .. } => None,
        }
    }
}

impl BackendError {
    /// A refusal with no wire code of its own (nothing ran).
    pub fn refused(reason: Reason, message: impl Into<String>) -> Self {
        BackendError::NotDispatched {
            reason,
            code: None,
            end_reason: None,
            message: message.into(),
        }
    }

    /// Sorts any error by its not-dispatched mark: the mark is the only thing that says
    /// nothing ran, never the message text.
    pub fn from_marked<E: NotDispatched + std::fmt::Display>(e: &E) -> Self {
        match plimsoll_wire::not_dispatched_reason(e) {
            Some(reason) => BackendError::NotDispatched {
                reason,
                code: None,
                end_reason: None,
                // The engine's and client's messages already begin `not dispatched (R): `.
                message: strip_mark(&e.to_string(), reason),
            },
            None => BackendError::MayHaveRun {
                message: e.to_string(),
            },
        }
    }

    /// The engine's error, sorted by its mark, with its wire code and a session's end reason.
    pub fn from_engine(e: &RunError) -> Self {
        let mut sorted = Self::from_marked(e);
        if let BackendError::NotDispatched {
            code,
            end_reason,
            message,
            ..
        } = &mut sorted
        {
            // The wire form's message is the one without the `not dispatched (...)` head.
            let wire = e.to_response().error;
            *code = Some(wire.code);
            *end_reason = wire.end_reason;
            *message = wire.message;
        }
        sorted
    }

    /// The client's error, sorted by its mark; a refusal whose echoed request id the client
    /// checked keeps its wire code and end reason.
    pub fn from_client(e: &ClientError) -> Self {
        let mut sorted = Self::from_marked(e);
        if let (
            BackendError::NotDispatched {
                code, end_reason, ..
            },
            ClientError::Refused {
                code: wire,
                end_reason: end,
                ..
            },
        ) = (&mut sorted, e)
        {
            *code = Some(wire.clone());
            *end_reason = *end;
        }
        sorted
    }

    /// The wire code of a refusal, if it has one.
    pub fn code(&self) -> Option<&str> {
        match self {
            BackendError::NotDispatched { code, .. } => code.as_deref(),
            BackendError::MayHaveRun { .. } => None,
        }
    }
}

fn strip_mark(message: &str, reason: Reason) -> String {
    let prefix = format!("not dispatched ({reason}): ");
    message.strip_prefix(&prefix).unwrap_or(message).to_owned()
}

/// One call in an open session, as the tools ask for it. Each stands for the run request
/// docs/sessions.md gives it, whose digest its record carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionCall {
    /// Code for the session's interpreter; with `restart`, a fresh interpreter first.
    Cell {
        /// The code, in the session's language.
        code: String,
        /// Start a fresh interpreter first (its state is then empty).
        restart: bool,
        /// This cell's timeout; the session's own when absent.
        timeout_ms: Option<u64>,
    },
    /// Shell commands run in order by `/bin/sh -c` in the session's /work.
    Steps {
        /// The commands.
        steps: Vec<String>,
        /// The call's timeout; the session's own when absent.
        timeout_ms: Option<u64>,
    },
    /// Bytes written, exactly, to /work/`path`.
    Put {
        /// Relative to /work.
        path: String,
        /// The file's bytes.
        content: Vec<u8>,
    },
    /// The file at /work/`path` read back.
    Get {
        /// Relative to /work.
        path: String,
    },
}

impl SessionCall {
    /// The run request this call stands for, and how the engine takes it; `language` is the
    /// session's (a cell's snippet names it).
    pub fn request(&self, language: Language) -> (RunRequest, SessionCallKind) {
        let limits = |timeout_ms: &Option<u64>| {
            timeout_ms.map(|t| Limits {
                timeout_ms: Some(t),
                ..Limits::default()
            })
        };
        let project = |files, steps, artifacts| {
            RunSpec::Project(Project {
                files,
                steps,
                artifacts,
            })
        };
        let (run, limits, kind) = match self {
            SessionCall::Cell {
                code,
                restart,
                timeout_ms,
            } => (
                RunSpec::Snippet(Snippet {
                    language,
                    code: code.clone(),
                }),
                limits(timeout_ms),
                SessionCallKind::Cell { restart: *restart },
            ),
            SessionCall::Steps { steps, timeout_ms } => (
                project(
                    Vec::new(),
                    steps
                        .iter()
                        .map(|run| Step {
                            name: None,
                            run: run.clone(),
                        })
                        .collect(),
                    Vec::new(),
                ),
                limits(timeout_ms),
                SessionCallKind::Job,
            ),
            SessionCall::Put { path, content } => (
                project(
                    vec![ProjectFile {
                        path: path.clone(),
                        content: Bytes::from(content.clone()),
                        executable: false,
                    }],
                    Vec::new(),
                    Vec::new(),
                ),
                None,
                SessionCallKind::Job,
            ),
            SessionCall::Get { path } => (
                project(Vec::new(), Vec::new(), vec![path.clone()]),
                None,
                SessionCallKind::Job,
            ),
        };
        let request = RunRequest {
            image: None,
            protocol: PROTOCOL,
            request_id: new_request_id(),
            minimum_isolation: None,
            provider: None,
            limits,
            run,
            grant: None,
        };
        (request, kind)
    }
}

/// What the tools need from plimsoll. Blocking: the server calls it off the async threads.
/// `caller` is the authenticated caller a transport named, if any; sessions are that
/// caller's (another caller's session id is not found).
pub trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// Runs `options` for `caller` and returns the verified response.
    fn run(&self, caller: Option<&str>, options: RunOptions) -> Result<RunResponse, BackendError>;
    /// Every provider, its tier, availability and evidence.
    fn providers(&self, caller: Option<&str>) -> Result<ProvidersResponse, BackendError>;
    /// Opens a session for `caller`, its sandbox ready, its tier measured.
    fn open_session(
        &self,
        caller: Option<&str>,
        options: SessionOptions,
    ) -> Result<SessionInfo, BackendError>;
    /// One call in `caller`'s session `session_id`; the answer's record is chained to the
    /// session's previous call.
    fn session_call(
        &self,
        caller: Option<&str>,
        session_id: &str,
        call: &SessionCall,
    ) -> Result<RunResponse, BackendError>;
    /// Closes `caller`'s session `session_id` (its sandbox removed) and says what it was.
    fn close_session(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<SessionInfo, BackendError>;
    /// `caller`'s open sessions.
    fn sessions(&self, caller: Option<&str>) -> Result<SessionList, BackendError>;
    /// Takes a snapshot of `caller`'s session `session_id`; the session goes on.
    fn snapshot_session(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<SnapshotInfo, BackendError>;
    /// Forks `caller`'s session `session_id` into `count` new sessions, each restored from
    /// one snapshot of it: that snapshot and the copies (each saying it was forked from the
    /// session, at the snapshot).
    fn fork_session(
        &self,
        caller: Option<&str>,
        session_id: &str,
        count: u32,
    ) -> Result<(SnapshotInfo, Vec<SessionInfo>), BackendError>;
    /// Opens a new session of `caller` restored from `caller`'s snapshot `snapshot_id` (it
    /// says it was restored, and from which session).
    fn open_snapshot(
        &self,
        caller: Option<&str>,
        snapshot_id: &str,
    ) -> Result<SessionInfo, BackendError>;
    /// `caller`'s snapshots, oldest first.
    fn snapshots(&self, caller: Option<&str>) -> Result<SnapshotList, BackendError>;
    /// Deletes `caller`'s snapshot `snapshot_id` and says what it was.
    fn delete_snapshot(
        &self,
        caller: Option<&str>,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, BackendError>;
}

/// Session operations on an engine, by caller: what the embedded backend and the daemon's
/// `/mcp` backend both do. They return the engine's own errors, so each backend can count
/// and log them before sorting them by their mark.
pub mod on_engine {
    use super::*;

    /// Opens a session of `caller` with `options`.
    pub fn open(
        engine: &Engine,
        caller: &str,
        options: SessionOptions,
    ) -> Result<SessionInfo, RunError> {
        // The grant, if named, is the session's for its whole life: every call's result
        // lists the broker calls and egress receipts since the call before.
        let request = options.into_request(new_request_id());
        engine.open_session(caller, &request)
    }

    /// `call` in `caller`'s session `id` (a refusal before the call's request was made,
    /// such as an unknown id, carries no request id).
    pub fn call(
        engine: &Engine,
        caller: &str,
        id: &str,
        call: &SessionCall,
    ) -> Result<RunResponse, RunError> {
        // A cell's snippet names the session's language; nothing else needs it.
        let language = match call {
            SessionCall::Cell { .. } => engine.session_info(caller, id)?.language,
            _ => Language::Python,
        };
        let (request, kind) = call.request(language);
        engine.session_call(caller, id, &request, kind, &mut |_| {})
    }

    /// Closes `caller`'s session `id`.
    pub fn close(engine: &Engine, caller: &str, id: &str) -> Result<SessionInfo, RunError> {
        engine.close_session(caller, id, Some(&new_request_id()))
    }

    /// Takes a snapshot of `caller`'s session `id`.
    pub fn snapshot(engine: &Engine, caller: &str, id: &str) -> Result<SnapshotInfo, RunError> {
        let request = SnapshotRequest {
            protocol: PROTOCOL,
            request_id: new_request_id(),
        };
        engine.snapshot_session(caller, id, &request)
    }

    /// Forks `caller`'s session `id` into `count` copies: the snapshot and the copies.
    pub fn fork(
        engine: &Engine,
        caller: &str,
        id: &str,
        count: u32,
    ) -> Result<(SnapshotInfo, Vec<SessionInfo>), RunError> {
        let request = ForkRequest {
            protocol: PROTOCOL,
            request_id: new_request_id(),
            count,
        };
        let answer = engine.fork_session(caller, id, &request)?;
        Ok((answer.snapshot, answer.sessions))
    }

    /// Opens a session of `caller` restored from `caller`'s snapshot `snapshot_id`.
    pub fn open_snapshot(
        engine: &Engine,
        caller: &str,
        snapshot_id: &str,
    ) -> Result<SessionInfo, RunError> {
        // No digest to hold it to: the engine restores what it keeps under this id, and the
        // session it opens names that snapshot's digest in its origin.
        let request = SnapshotOpenRequest {
            protocol: PROTOCOL,
            request_id: new_request_id(),
            sha256: None,
        };
        engine.open_snapshot(caller, snapshot_id, &request)
    }

    /// Deletes `caller`'s snapshot `snapshot_id`.
    pub fn delete_snapshot(
        engine: &Engine,
        caller: &str,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, RunError> {
        engine.delete_snapshot(caller, snapshot_id, Some(&new_request_id()))
    }
}

/// The embedded engine, in this process, not probed yet (the CLI's): each run probes only
/// what it needs, once, and `list_providers` probes every provider the first time.
#[derive(Debug)]
pub struct EngineBackend {
    engine: Arc<Engine>,
    /// Who runs: the transport (stdio) names no caller.
    caller: String,
    /// The (floor, provider, kind) combinations probed for with a provider found, so a
    /// long-lived server probes each once rather than before every call; one that found
    /// none is probed again at its next call (this server has no periodic re-check).
    probed_for: Mutex<HashSet<(Tier, Option<String>, &'static str)>>,
    probed_all: Once,
}

impl EngineBackend {
    /// Runs by `caller` on `engine`, probed as runs need it.
    pub fn lazy(engine: Arc<Engine>, caller: impl Into<String>) -> Self {
        EngineBackend {
            engine,
            caller: caller.into(),
            probed_for: Mutex::new(HashSet::new()),
            probed_all: Once::new(),
        }
    }

    /// Probes what a run (or a session) with this floor, provider and kind needs, once
    /// while it finds a provider; then `act`, and when that found none, forgets the probe.
    fn probed<T>(
        &self,
        floor: Option<Tier>,
        provider: Option<&str>,
        spec: &RunSpec,
        kind: &'static str,
        act: impl FnOnce() -> Result<T, RunError>,
    ) -> Result<T, RunError> {
        let key = (
            floor.unwrap_or(self.engine.config().default_floor),
            provider.map(str::to_owned),
            kind,
        );
        {
            let mut done = self.probed_for.lock().unwrap_or_else(|p| p.into_inner());
            if done.insert(key.clone()) {
                self.engine.probe_for(floor, provider, spec);
            }
        }
        let result = act();
        if matches!(
            &result,
            Err(RunError::Refused {
                reason: Reason::Isolation | Reason::Environment,
                ..
            })
        ) {
            // No provider was found for it: probe again next time.
            self.probed_for
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
        }
        result
    }
}

impl Backend for EngineBackend {
    fn run(&self, caller: Option<&str>, options: RunOptions) -> Result<RunResponse, BackendError> {
        let caller = caller.unwrap_or(&self.caller);
        let request = options.into_request(new_request_id());
        self.probed(
            request.minimum_isolation,
            request.provider.as_deref(),
            &request.run,
            request.run.kind(),
            || self.engine.run(caller, &request),
        )
        .map_err(|e| BackendError::from_engine(&e))
    }

    fn providers(&self, _caller: Option<&str>) -> Result<ProvidersResponse, BackendError> {
        self.probed_all.call_once(|| self.engine.probe_all());
        Ok(self.engine.providers_response())
    }

    fn open_session(
        &self,
        caller: Option<&str>,
        options: SessionOptions,
    ) -> Result<SessionInfo, BackendError> {
        let caller = caller.unwrap_or(&self.caller);
        // The providers that keep sessions are those that run projects (not the process
        // tier): probe as for a project at this floor.
        let like = RunSpec::Project(Project {
            files: Vec::new(),
            steps: Vec::new(),
            artifacts: Vec::new(),
        });
        let floor = options.minimum_isolation;
        let provider = options.provider.clone();
        self.probed(floor, provider.as_deref(), &like, "session", || {
            on_engine::open(&self.engine, caller, options)
        })
        .map_err(|e| BackendError::from_engine(&e))
    }

    fn session_call(
        &self,
        caller: Option<&str>,
        session_id: &str,
        call: &SessionCall,
    ) -> Result<RunResponse, BackendError> {
        let caller = caller.unwrap_or(&self.caller);
        on_engine::call(&self.engine, caller, session_id, call)
            .map_err(|e| BackendError::from_engine(&e))
    }

    fn close_session(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<SessionInfo, BackendError> {
        let caller = caller.unwrap_or(&self.caller);
        on_engine::close(&self.engine, caller, session_id)
            .map_err(|e| BackendError::from_engine(&e))
    }

    fn sessions(&self, caller: Option<&str>) -> Result<SessionList, BackendError> {
        Ok(self.engine.list_sessions(caller.unwrap_or(&self.caller)))
    }

    fn snapshot_session(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<SnapshotInfo, BackendError> {
        let caller = caller.unwrap_or(&self.caller);
        on_engine::snapshot(&self.engine, caller, session_id)
            .map_err(|e| BackendError::from_engine(&e))
    }

    fn fork_session(
        &self,
        caller: Option<&str>,
        session_id: &str,
        count: u32,
    ) -> Result<(SnapshotInfo, Vec<SessionInfo>), BackendError> {
        let caller = caller.unwrap_or(&self.caller);
        on_engine::fork(&self.engine, caller, session_id, count)
            .map_err(|e| BackendError::from_engine(&e))
    }

    fn open_snapshot(
        &self,
        caller: Option<&str>,
        snapshot_id: &str,
    ) -> Result<SessionInfo, BackendError> {
        // The snapshot's provider was probed when its session opened: nothing to probe.
        let caller = caller.unwrap_or(&self.caller);
        on_engine::open_snapshot(&self.engine, caller, snapshot_id)
            .map_err(|e| BackendError::from_engine(&e))
    }

    fn snapshots(&self, caller: Option<&str>) -> Result<SnapshotList, BackendError> {
        Ok(self.engine.list_snapshots(caller.unwrap_or(&self.caller)))
    }

    fn delete_snapshot(
        &self,
        caller: Option<&str>,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, BackendError> {
        let caller = caller.unwrap_or(&self.caller);
        on_engine::delete_snapshot(&self.engine, caller, snapshot_id)
            .map_err(|e| BackendError::from_engine(&e))
    }
}

/// A daemon, through the Rust client (which checks request ids, digests, the tier and each
/// session call's place in its session's chain). The caller is whoever the client's token
/// names; a transport's caller is not used.
#[derive(Debug)]
pub struct ClientBackend {
    client: Client,
}

impl ClientBackend {
    /// Runs go to this client's daemon.
    pub fn new(client: Client) -> Self {
        ClientBackend { client }
    }

    /// The session `id` resumed where the daemon says its chain stands: every call resumes,
    /// since the caller may use the session through the REST API or another MCP server in
    /// between. Looking a session up runs nothing, so any failure here is not dispatched.
    fn resume(&self, id: &str) -> Result<Session, BackendError> {
        self.client.session(id).map_err(|e| match e {
            // The client checked the echoed request id: its code and end reason hold.
            ClientError::Refused { .. } => BackendError::from_client(&e),
            // A daemon that does not echo the look-up's request id (one from before it
            // did): the client cannot tie a code to this request, so the reason and
            // message are kept and no code is claimed.
            ClientError::UnverifiedRefusal {
                reason, message, ..
            } => BackendError::refused(
                reason,
                format!("session {id} cannot be used, so nothing was sent to it; looking it up, the daemon said: {message}. Call list_sessions to see your open sessions, or open a new one with open_session"),
            ),
            other => BackendError::refused(
                Reason::Environment,
                format!("cannot look session {id} up on the daemon ({other}), so nothing was sent to it"),
            ),
        })
    }

    /// The caller's snapshot `id` as the daemon lists it: what the client holds a session
    /// opened from it to (its digest, its session, its place in that session's chain).
    /// Looking it up runs nothing, so any failure here is not dispatched.
    fn snapshot_of_caller(&self, id: &str) -> Result<SnapshotInfo, BackendError> {
        let listed = self.client.list_snapshots().map_err(|e| {
            BackendError::refused(
                Reason::Environment,
                format!(
                    "cannot look snapshot {id} up on the daemon ({e}), so nothing was restored"
                ),
            )
        })?;
        listed
            .snapshots
            .into_iter()
            .find(|s| s.snapshot_id == id)
            .ok_or_else(|| BackendError::NotDispatched {
                reason: Reason::Request,
                // What the daemon answers for it: its list of this caller's snapshots has none
                // by this id (unknown, another caller's, expired or deleted alike).
                code: Some("snapshot_not_found".into()),
                end_reason: None,
                message: format!(
                    "the daemon lists no snapshot {id} of this caller, so nothing was restored"
                ),
            })
    }
}

/// A path under /work that goes into the daemon's URL as it is: the client does not escape
/// a path segment, so a character the URL would change (`?`, `#`, `%`, a space) would name
/// another file than the request's (which the digests would then catch, after the fact).
fn url_safe_path(path: &str) -> Result<(), BackendError> {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-._~/+,=@".contains(c);
    match path.chars().find(|c| !safe(*c)) {
        None => Ok(()),
        Some(c) => Err(BackendError::refused(
            Reason::Request,
            format!(
                "through a daemon, a session file's path may hold only ASCII letters, digits and `-._~/+,=@`, not {c:?}: write it under another name, then rename it with run_session_steps"
            ),
        )),
    }
}

impl Backend for ClientBackend {
    fn run(&self, _caller: Option<&str>, options: RunOptions) -> Result<RunResponse, BackendError> {
        self.client
            .run(options)
            .map_err(|e| BackendError::from_client(&e))
    }

    fn providers(&self, _caller: Option<&str>) -> Result<ProvidersResponse, BackendError> {
        // Listing runs nothing, so any failure here is safe to retry: mark it as a request
        // that was not served.
        self.client.providers().map_err(|e| {
            BackendError::refused(
                Reason::Environment,
                format!("cannot list the daemon's providers: {e}"),
            )
        })
    }

    fn open_session(
        &self,
        _caller: Option<&str>,
        options: SessionOptions,
    ) -> Result<SessionInfo, BackendError> {
        self.client
            .open_session(options)
            .map(|s| s.info().clone())
            .map_err(|e| BackendError::from_client(&e))
    }

    fn session_call(
        &self,
        _caller: Option<&str>,
        session_id: &str,
        call: &SessionCall,
    ) -> Result<RunResponse, BackendError> {
        if let SessionCall::Put { path, .. } | SessionCall::Get { path } = call {
            url_safe_path(path)?;
        }
        let mut session = self.resume(session_id)?;
        let answered = match call {
            SessionCall::Cell {
                code,
                restart,
                timeout_ms,
            } => session.cell_with(code.clone(), *restart, *timeout_ms, None),
            SessionCall::Steps { steps, timeout_ms } => {
                let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
                session.steps_with(&steps, *timeout_ms, None)
            }
            SessionCall::Put { path, content } => session.put(path, content),
            SessionCall::Get { path } => session.get(path).map(|(_, resp)| resp),
        };
        answered.map_err(|e| BackendError::from_client(&e))
    }

    fn close_session(
        &self,
        _caller: Option<&str>,
        session_id: &str,
    ) -> Result<SessionInfo, BackendError> {
        self.resume(session_id)?
            .close()
            .map_err(|e| BackendError::from_client(&e))
    }

    fn sessions(&self, _caller: Option<&str>) -> Result<SessionList, BackendError> {
        // Listing runs nothing, as above.
        self.client.list_sessions().map_err(|e| {
            BackendError::refused(
                Reason::Environment,
                format!("cannot list the daemon's sessions: {e}"),
            )
        })
    }

    fn snapshot_session(
        &self,
        _caller: Option<&str>,
        session_id: &str,
    ) -> Result<SnapshotInfo, BackendError> {
        // The client checks that the snapshot is of this session where the daemon said its
        // chain stands.
        self.resume(session_id)?
            .snapshot()
            .map_err(|e| BackendError::from_client(&e))
    }

    fn fork_session(
        &self,
        _caller: Option<&str>,
        session_id: &str,
        count: u32,
    ) -> Result<(SnapshotInfo, Vec<SessionInfo>), BackendError> {
        // The client checks each copy's origin against the snapshot and the session (and
        // closes every copy again when one does not hold).
        let (snapshot, copies) = self
            .resume(session_id)?
            .fork(count)
            .map_err(|e| BackendError::from_client(&e))?;
        Ok((snapshot, copies.iter().map(|c| c.info().clone()).collect()))
    }

    fn open_snapshot(
        &self,
        _caller: Option<&str>,
        snapshot_id: &str,
    ) -> Result<SessionInfo, BackendError> {
        let snapshot = self.snapshot_of_caller(snapshot_id)?;
        // The client sends the snapshot's digest (the daemon refuses a snapshot whose files no
        // longer hash to it) and checks that the session says it was restored from it.
        self.client
            .open_snapshot(&snapshot)
            .map(|s| s.info().clone())
            .map_err(|e| BackendError::from_client(&e))
    }

    fn snapshots(&self, _caller: Option<&str>) -> Result<SnapshotList, BackendError> {
        // Listing runs nothing, as above.
        self.client.list_snapshots().map_err(|e| {
            BackendError::refused(
                Reason::Environment,
                format!("cannot list the daemon's snapshots: {e}"),
            )
        })
    }

    fn delete_snapshot(
        &self,
        _caller: Option<&str>,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, BackendError> {
        self.client
            .delete_snapshot(snapshot_id)
            .map_err(|e| BackendError::from_client(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_decides_never_the_text() {
        let refused = plimsoll_engine::RunError::refused(Some("r"), Reason::Isolation, "no vm");
        let e = BackendError::from_marked(&refused);
        assert_eq!(e, BackendError::refused(Reason::Isolation, "no vm"));
        assert_eq!(
            BackendError::from_engine(&refused).code(),
            Some("isolation")
        );
        // A failure after dispatch whose text looks like a refusal is still "may have run".
        let failed = plimsoll_engine::RunError::Failed {
            request_id: "r".into(),
            provider: "process".into(),
            message: "not dispatched (isolation): a lie".into(),
        };
        let e = BackendError::from_marked(&failed);
        assert!(matches!(e, BackendError::MayHaveRun { .. }), "{e:?}");
        assert_eq!(plimsoll_wire::not_dispatched_reason(&e), None);
    }

    #[test]
    fn a_session_refusal_keeps_its_code_and_end_reason() {
        let ended = RunError::SessionRefused {
            request_id: Some("r".into()),
            reason: Reason::Request,
            code: "session_ended",
            message: "session ses_1 has ended (closed)".into(),
            end_reason: Some(EndReason::Closed),
        };
        assert_eq!(
            BackendError::from_engine(&ended),
            BackendError::NotDispatched {
                reason: Reason::Request,
                code: Some("session_ended".into()),
                end_reason: Some(EndReason::Closed),
                message: "session ses_1 has ended (closed)".into(),
            }
        );
        // Through the client: a refusal it verified (its echoed request id) keeps its code...
        let verified = ClientError::Refused {
            request_id: "r".into(),
            reason: Reason::Request,
            code: "interpreter_ended".into(),
            message: "send restart".into(),
            end_reason: None,
        };
        let e = BackendError::from_client(&verified);
        assert_eq!(e.code(), Some("interpreter_ended"));
        assert_eq!(
            plimsoll_wire::not_dispatched_reason(&e),
            Some(Reason::Request)
        );
        // ...one it could not verify is not a refusal of this call.
        let unverified = ClientError::UnverifiedRefusal {
            sent: "r".into(),
            echoed: None,
            reason: Reason::Request,
            message: "session ses_1 has ended".into(),
        };
        assert!(matches!(
            BackendError::from_client(&unverified),
            BackendError::MayHaveRun { .. }
        ));
        // A session call that failed after it started may have run, whatever it says.
        let failed = RunError::Failed {
            request_id: "r".into(),
            provider: "crun".into(),
            message: "not dispatched (request): the session has ended (sandbox_failed)".into(),
        };
        assert!(matches!(
            BackendError::from_engine(&failed),
            BackendError::MayHaveRun { .. }
        ));
    }

    #[test]
    fn session_calls_stand_for_the_requests_the_sessions_doc_gives() {
        let (cell, kind) = SessionCall::Cell {
            code: "x = 1".into(),
            restart: true,
            timeout_ms: Some(500),
        }
        .request(Language::Python);
        assert_eq!(kind, SessionCallKind::Cell { restart: true });
        assert_eq!(
            cell.run,
            RunSpec::Snippet(Snippet {
                language: Language::Python,
                code: "x = 1".into()
            })
        );
        assert_eq!(cell.limits.as_ref().unwrap().timeout_ms, Some(500));
        assert!(cell.validate_session_call().is_ok());

        let (put, kind) = SessionCall::Put {
            path: "a/b".into(),
            content: vec![0xff],
        }
        .request(Language::Python);
        assert_eq!(kind, SessionCallKind::Job);
        // `{"run": {"kind": "project", "files": [{"path", "content"}], "steps": []}}`.
        let RunSpec::Project(p) = &put.run else {
            panic!("not a project")
        };
        assert_eq!((p.files.len(), p.steps.len(), p.artifacts.len()), (1, 0, 0));
        assert_eq!(p.files[0].content.as_slice(), &[0xff]);
        assert!(!p.files[0].executable);
        assert_eq!((put.limits, put.grant, put.provider), (None, None, None));

        let (get, _) = SessionCall::Get { path: "a/b".into() }.request(Language::Python);
        let RunSpec::Project(p) = &get.run else {
            panic!("not a project")
        };
        assert_eq!(p.artifacts, vec!["a/b".to_owned()]);
        assert!(p.files.is_empty() && p.steps.is_empty());

        let (steps, _) = SessionCall::Steps {
            steps: vec!["true".into()],
            timeout_ms: None,
        }
        .request(Language::Python);
        let RunSpec::Project(p) = &steps.run else {
            panic!("not a project")
        };
        assert_eq!(
            (p.steps[0].run.as_str(), p.steps[0].name.as_ref()),
            ("true", None)
        );
        assert_ne!(put.request_id, get.request_id);
    }

    #[test]
    fn a_path_the_url_would_change_is_refused_before_it_is_sent() {
        assert_eq!(url_safe_path("src/main.py"), Ok(()));
        assert_eq!(url_safe_path("a-b_c~d+e,f=g@h.txt"), Ok(()));
        for bad in ["a?b", "a#b", "a%20b", "a b", "é"] {
            let e = url_safe_path(bad).unwrap_err();
            assert_eq!(
                plimsoll_wire::not_dispatched_reason(&e),
                Some(Reason::Request),
                "{bad}"
            );
        }
    }
}
