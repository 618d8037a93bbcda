//! Sessions (docs/sessions.md): one sandbox kept across calls, opened on a provider that
//! keeps them, its tier measured at open. Every call is checked against the session (the
//! caller owns it, its floor is met by the tier at open, its limits are the session's), the
//! sandbox's wall is read again and compared with the one at open, and the answer carries a
//! record chained to the session's previous one. Every end has a reason; none is silent.
//!
//! The engine decides here; a provider only opens, calls, re-reads the wall and closes
//! ([`plimsoll_sandbox::SessionSandbox`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use plimsoll_sandbox::{LaunchError, Provider as _, SessionSandbox, unix_ms_now};
use plimsoll_wire::digest::{record_sha256, request_sha256, result_sha256};
use plimsoll_wire::{
    AgentJob, EndReason, Language, OutputChunk, PROTOCOL, Reason, RunRecord, RunRequest,
    RunResponse, RunSpec, SessionCall, SessionCell, SessionInfo, SessionJob, SessionLink,
    SessionList, SessionOpenRequest, Snippet, Tier, Wall, validate_session_id,
};

use crate::engine::Engine;
use crate::error::RunError;
use crate::ids::new_run_id;

mod snapshot;
mod suspend;

/// Ended sessions remembered, so a call to one says why it ended (oldest forgotten first).
const ENDED_KEPT: usize = 4096;
/// How often idle timeouts and lifetimes are checked.
const REAP_EVERY: Duration = Duration::from_millis(250);
/// What a call's answer may take beyond its own timeout before the session is given up.
const CALL_GRACE: Duration = Duration::from_secs(10);
/// Where a session's calls run inside its sandbox.
const WORK_DIR: &str = "/work";

/// Every session of one engine.
#[derive(Debug)]
pub(crate) struct Sessions {
    /// This engine's instance, in every session id it gives: an id from another instance
    /// (the daemon restarted) is told apart from an unknown one.
    instance: String,
    inner: Mutex<Inner>,
    /// Snapshots kept, by id (docs/sessions.md, "Snapshots and forks").
    snapshots: Mutex<HashMap<String, Arc<snapshot::Snapshot>>>,
    /// Instances of earlier daemons whose saved sessions this one restored.
    adopted: Mutex<std::collections::BTreeSet<String>>,
    /// Saved sessions wait to be restored: the engine is not ready until they are, so no
    /// call to one is answered as if it had ended.
    resuming: std::sync::atomic::AtomicBool,
    /// Ends by reason (sessions' and interpreters'), for the metrics.
    ends: Mutex<BTreeMap<&'static str, u64>>,
    reaper: std::sync::Once,
}

#[derive(Debug, Default)]
struct Inner {
    open: HashMap<String, Arc<Session>>,
    /// Sessions being opened, per caller (they count against the limits).
    opening: HashMap<String, usize>,
    /// Recently ended: (id, caller, why).
    ended: VecDeque<(String, String, EndReason)>,
}

/// One open session.
#[derive(Debug)]
struct Session {
    id: String,
    caller: String,
    language: Language,
    provider: String,
    tier: Tier,
    floor: Tier,
    evidence_sha256: String,
    environment: String,
    /// The image it runs in, fixed at open.
    image: Option<plimsoll_wire::ImageRef>,
    limits: plimsoll_sandbox::ResolvedLimits,
    opened_unix_ms: u64,
    opened: Instant,
    lifetime: Duration,
    idle_timeout: Duration,
    wall: Wall,
    /// The broker of the grant it was opened with, for its whole life.
    broker: Option<plimsoll_broker::apart::RunBroker>,
    /// The uid and gid its code runs as (a restored copy's are its snapshot's).
    uid: u32,
    gid: u32,
    /// Where it came from, when it was restored or forked.
    origin: Option<plimsoll_wire::SessionOrigin>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// `None` once ended.
    sandbox: Option<Box<dyn SessionSandbox>>,
    /// Its uid slot, held for its life.
    permit: Option<crate::admission::Permit>,
    calls: u64,
    last_record: Option<String>,
    last_call: Instant,
    interpreter_alive: bool,
    ended: Option<EndReason>,
}

/// A call in a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// A cell for the interpreter; with `restart`, a fresh interpreter first.
    Cell {
        /// Start a fresh interpreter first.
        restart: bool,
    },
    /// Files, shell steps and artifacts in the session's /work.
    Job,
}

impl Sessions {
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// Counts `n` sessions of `caller` as being opened, or refuses (`capacity`) when they
    /// would take the sessions open over the policy's limits. [`Sessions::opened`] ends it.
    fn reserve(
        &self,
        caller: &str,
        n: usize,
        policy: &crate::config::SessionPolicy,
        request_id: Option<&str>,
    ) -> Result<(), RunError> {
        let refuse = |message: String| RunError::refused(request_id, Reason::Capacity, message);
        let mut inner = self.inner();
        let total = inner.open.len() + inner.opening.values().sum::<usize>();
        let mine = inner.open.values().filter(|s| s.caller == caller).count()
            + inner.opening.get(caller).copied().unwrap_or(0);
        if total + n > policy.max_total {
            return Err(refuse(format!(
                "{total} sessions are open and this server's limit is {}: close one, or retry later",
                policy.max_total
            )));
        }
        if mine + n > policy.max_per_caller {
            return Err(refuse(format!(
                "this caller has {mine} sessions open and its limit is {}: close one (DELETE /v1/sessions/ID)",
                policy.max_per_caller
            )));
        }
        *inner.opening.entry(caller.to_owned()).or_default() += n;
        Ok(())
    }

    /// Ends a [`Sessions::reserve`] of `n`; the session made, if one was, is open from now.
    fn opened(&self, caller: &str, n: usize, made: Option<&Arc<Session>>) {
        let mut inner = self.inner();
        if let Some(k) = inner.opening.get_mut(caller) {
            *k = k.saturating_sub(n);
            if *k == 0 {
                inner.opening.remove(caller);
            }
        }
        if let Some(s) = made {
            inner.open.insert(s.id.clone(), Arc::clone(s));
        }
    }

    pub(crate) fn new() -> Arc<Self> {
        let bytes: [u8; 8] = rand::random();
        Arc::new(Sessions {
            instance: hex::encode(bytes),
            inner: Mutex::new(Inner::default()),
            snapshots: Mutex::new(HashMap::new()),
            adopted: Mutex::new(std::collections::BTreeSet::new()),
            resuming: std::sync::atomic::AtomicBool::new(false),
            ends: Mutex::new(BTreeMap::new()),
            reaper: std::sync::Once::new(),
        })
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count_end(&self, reason: EndReason) {
        *self
            .ends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(reason.as_str())
            .or_default() += 1;
    }

    /// Starts the thread that ends idle and expired sessions, once; it stops when the
    /// sessions are dropped.
    fn start_reaper(self: &Arc<Self>) {
        let weak: Weak<Sessions> = Arc::downgrade(self);
        self.reaper.call_once(|| {
            let spawned = std::thread::Builder::new()
                .name("session-reaper".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(REAP_EVERY);
                        let Some(sessions) = weak.upgrade() else { break };
                        sessions.reap_expired();
                        sessions.reap_snapshots();
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start the session reaper: sessions end only at their next call");
            }
        });
    }

    /// Ends every session past its idle timeout or lifetime that no call holds, each on a
    /// thread of its own: one sandbox's removal (a VM's takes seconds) never delays another
    /// session's end. A session being ended holds its lock, so later passes skip it.
    fn reap_expired(self: &Arc<Self>) {
        let open: Vec<Arc<Session>> = self.inner().open.values().cloned().collect();
        for s in open {
            // A session in a call is not idle; its lifetime is enforced by the call's bounds.
            let Ok(st) = s.state.try_lock() else {
                continue;
            };
            let Some(reason) = s.expired(&st) else {
                continue;
            };
            drop(st);
            let sessions = Arc::clone(self);
            let ends = move || {
                let mut st = lock(&s);
                if s.expired(&st) == Some(reason) {
                    sessions.end(&s, &mut st, reason);
                }
            };
            if let Err(e) = std::thread::Builder::new()
                .name("session-end".into())
                .spawn(ends)
            {
                tracing::error!(error = %e, "cannot start a thread to end an expired session; the next pass tries again");
            }
        }
    }

    /// Ends `s` for `reason`: its sandbox closed and removed, its uid slot freed, its id
    /// remembered as ended.
    fn end(&self, s: &Session, st: &mut State, reason: EndReason) {
        if st.ended.is_some() {
            return;
        }
        st.ended = Some(reason);
        st.interpreter_alive = false;
        if let Some(sandbox) = st.sandbox.take()
            && let Err(e) = sandbox.close()
        {
            tracing::error!(session_id = %s.id, error = %plimsoll_sandbox::error_chain(&e), "a session's sandbox was not fully removed");
        }
        if let Some(b) = &s.broker {
            // What ended after the last call is in no result: said in the log.
            let left = b.finish();
            if !left.calls.is_empty() || !left.egress.is_empty() {
                tracing::info!(session_id = %s.id, calls = left.calls.len(), egress = left.egress.len(), "a session's grant saw calls or connections after its last call; they are on no result");
            }
        }
        drop(st.permit.take());
        self.count_end(reason);
        let mut inner = self.inner();
        inner.open.remove(&s.id);
        inner
            .ended
            .push_back((s.id.clone(), s.caller.clone(), reason));
        while inner.ended.len() > ENDED_KEPT {
            inner.ended.pop_front();
        }
        drop(inner);
        tracing::info!(session_id = %s.id, caller = %s.caller, reason = reason.as_str(), calls = st.calls, "session ended");
    }

    /// The caller's open session `id`, or the refusal a call to it gets: the same for an
    /// unknown id and another caller's.
    fn find(
        &self,
        caller: &str,
        id: &str,
        request_id: Option<&str>,
    ) -> Result<Arc<Session>, RunError> {
        let inner = self.inner();
        if let Some(s) = inner.open.get(id).filter(|s| s.caller == caller) {
            return Ok(Arc::clone(s));
        }
        let ended = inner
            .ended
            .iter()
            .rev()
            .find(|(i, c, _)| i == id && c == caller)
            .map(|(_, _, r)| *r);
        drop(inner);
        if let Some(reason) = ended {
            return Err(ended_refusal(request_id, id, reason));
        }
        let restarted = plimsoll_wire::session_instance(id).is_some_and(|i| i != self.instance);
        Err(RunError::SessionRefused {
            request_id: request_id.map(str::to_owned),
            reason: Reason::Request,
            code: "session_not_found",
            message: if restarted {
                "no such session: it was opened by an earlier run of this daemon, and sessions do not survive a restart; open a new one".into()
            } else {
                "no such session of this caller: open one with POST /v1/sessions".into()
            },
            end_reason: restarted.then_some(EndReason::DaemonRestarted),
        })
    }
}

fn ended_refusal(request_id: Option<&str>, id: &str, reason: EndReason) -> RunError {
    RunError::SessionRefused {
        request_id: request_id.map(str::to_owned),
        reason: Reason::Request,
        code: "session_ended",
        message: format!(
            "session {id} has ended ({reason}); nothing ran: open a new session (a dead session is never re-created)"
        ),
        end_reason: Some(reason),
    }
}

impl Session {
    /// Why it should end now, if it should.
    fn expired(&self, st: &State) -> Option<EndReason> {
        if st.ended.is_some() {
            return None;
        }
        if self.opened.elapsed() >= self.lifetime {
            Some(EndReason::MaxLifetime)
        } else if st.last_call.elapsed() >= self.idle_timeout {
            Some(EndReason::IdleTimeout)
        } else {
            None
        }
    }

    fn info(&self, st: &State, request_id: Option<&str>) -> SessionInfo {
        SessionInfo {
            image: self.image.clone(),
            protocol: PROTOCOL,
            request_id: request_id.map(str::to_owned),
            session_id: self.id.clone(),
            language: self.language,
            provider: self.provider.clone(),
            isolation: self.tier,
            minimum_isolation: self.floor,
            evidence_sha256: self.evidence_sha256.clone(),
            environment: self.environment.clone(),
            wall: self.wall.clone(),
            opened_unix_ms: self.opened_unix_ms,
            expires_unix_ms: self
                .opened_unix_ms
                .saturating_add(u64::try_from(self.lifetime.as_millis()).unwrap_or(u64::MAX)),
            idle_timeout_ms: u64::try_from(self.idle_timeout.as_millis()).unwrap_or(u64::MAX),
            calls: st.calls,
            last_record_sha256: st.last_record.clone(),
            interpreter_alive: st.interpreter_alive,
            end_reason: st.ended,
            origin: self.origin.clone(),
        }
    }
}

fn lock(s: &Session) -> std::sync::MutexGuard<'_, State> {
    s.state.lock().unwrap_or_else(|p| p.into_inner())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `asked` (milliseconds) or `default`, refused above `max`.
fn pick(
    name: &str,
    asked: Option<u64>,
    default: Duration,
    max: Duration,
) -> Result<Duration, String> {
    match asked {
        None => Ok(default.min(max)),
        Some(ms) if Duration::from_millis(ms) <= max => Ok(Duration::from_millis(ms)),
        Some(ms) => Err(format!(
            "{name} = {ms} is above this server's maximum {}",
            millis(max)
        )),
    }
}

impl Engine {
    /// Opens a session for `caller`: refused (nothing started) when the request is
    /// malformed, names a grant, is over the session limits, or no available provider that
    /// keeps sessions meets its floor. Blocks until the sandbox's interpreter is ready.
    pub fn open_session(
        &self,
        caller: &str,
        req: &SessionOpenRequest,
    ) -> Result<SessionInfo, RunError> {
        req.validate()
            .map_err(|r| RunError::refused(r.request_id.as_deref(), r.reason, r.message))?;
        let id = Some(req.request_id.as_str());
        let refuse = |reason, message: String| RunError::refused(id, reason, message);
        let policy = self.config.sessions;
        let idle = pick(
            "idle_timeout_ms",
            req.idle_timeout_ms,
            policy.idle_timeout,
            policy.max_idle_timeout,
        )
        .map_err(|m| refuse(Reason::Request, m))?;
        let lifetime = pick(
            "max_lifetime_ms",
            req.max_lifetime_ms,
            policy.lifetime,
            policy.max_lifetime,
        )
        .map_err(|m| refuse(Reason::Request, m))?;
        // What a run of this session's kind would be: routed, limited and checked as one.
        let as_run = RunRequest {
            image: req.image.clone(),
            protocol: req.protocol,
            request_id: req.request_id.clone(),
            minimum_isolation: req.minimum_isolation,
            provider: req.provider.clone(),
            limits: req.limits.clone(),
            run: RunSpec::Snippet(Snippet {
                language: req.language,
                code: "session".into(),
            }),
            grant: req.grant.clone(),
        };
        let (decided, state, index) = self.decide(caller, &as_run, true)?;
        // Counted before the sandbox is made, so two opens at once cannot both pass.
        self.sessions.reserve(caller, 1, &policy, id)?;
        let opened =
            self.open_sandbox(caller, req, &as_run, decided, &state, index, idle, lifetime);
        self.sessions.opened(caller, 1, opened.as_ref().ok());
        let s = opened?;
        self.sessions.start_reaper();
        tracing::info!(session_id = %s.id, request_id = %req.request_id, caller, provider = %s.provider, tier = %s.tier, "session opened");
        let st = lock(&s);
        Ok(s.info(&st, id))
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one open's decided parts, passed once"
    )]
    fn open_sandbox(
        &self,
        caller: &str,
        req: &SessionOpenRequest,
        as_run: &RunRequest,
        decided: crate::plan::Plan,
        state: &crate::engine::ProbedState,
        index: usize,
        idle: Duration,
        lifetime: Duration,
    ) -> Result<Arc<Session>, RunError> {
        let id = Some(req.request_id.as_str());
        let slot = &self.slots[index];
        let chosen = slot.provider.name();
        // The session holds a uid slot for its life, not a place among the caller's runs.
        let permit = self
            .admission
            .try_admit(caller)
            .map_err(|m| RunError::refused(id, Reason::Capacity, m))?
            .answered();
        let run_id = new_run_id();
        // The grant's broker lives as long as the session may.
        let broker = decided
            .grant
            .clone()
            .map(|g| self.brokers.start(g, caller, &run_id, lifetime))
            .transpose()
            .map_err(|e| {
                RunError::refused(
                    id,
                    Reason::Environment,
                    crate::engine::broker_unavailable(&e),
                )
            })?;
        let channel = broker.as_ref().map(|b| b.channel());
        let plan = decided.launch(as_run, &self.config, permit.slot(), &run_id, channel);
        let opened = slot.provider.open_session(&plan, lifetime);
        if opened.is_err()
            && let Some(b) = &broker
        {
            b.finish();
        }
        let sandbox = opened.map_err(|e| {
            let message = e.message();
            match e.not_dispatched() {
                Some(reason) => {
                    if reason == Reason::Environment {
                        self.recheck_in_background(index);
                    }
                    RunError::refused(id, reason, message)
                }
                None => {
                    self.recheck_in_background(index);
                    RunError::Failed {
                        request_id: req.request_id.clone(),
                        provider: chosen.to_owned(),
                        message,
                    }
                }
            }
        })?;
        let session_bytes: [u8; 16] = rand::random();
        let session_id = format!(
            "ses_{}_{}",
            self.sessions.instance,
            hex::encode(session_bytes)
        );
        debug_assert!(validate_session_id(&session_id).is_ok());
        Ok(Arc::new(Session {
            id: session_id,
            caller: caller.to_owned(),
            language: req.language,
            provider: chosen.to_owned(),
            tier: state.probed.tier,
            floor: decided.floor,
            evidence_sha256: state.evidence_sha256.clone(),
            environment: crate::engine::environment_of(
                decided.image.as_ref(),
                &state.probed.evidence,
            ),
            image: decided
                .image
                .as_ref()
                .map(plimsoll_sandbox::RunImage::reference),
            limits: decided.limits,
            opened_unix_ms: unix_ms_now(),
            opened: Instant::now(),
            lifetime,
            idle_timeout: idle,
            wall: sandbox.wall_at_open().clone(),
            broker,
            uid: plan.uid,
            gid: plan.gid,
            origin: None,
            state: Mutex::new(State {
                sandbox: Some(sandbox),
                permit: Some(permit),
                calls: 0,
                last_record: None,
                last_call: Instant::now(),
                interpreter_alive: true,
                ended: None,
            }),
        }))
    }

    /// One call in `caller`'s session `id`: a cell (`req.run` a snippet of the session's
    /// language) or a job (`req.run` a project: files, steps, artifacts; steps may be
    /// none). Output chunks go to `on_chunk` as they come. Refused (nothing ran) when the
    /// session is not the caller's, has ended, its sandbox changed, or the call does not fit
    /// it; an error without a mark ends the session (`sandbox_failed`): the call may have run.
    pub fn session_call(
        &self,
        caller: &str,
        id: &str,
        req: &RunRequest,
        kind: CallKind,
        on_chunk: &mut dyn FnMut(OutputChunk),
    ) -> Result<RunResponse, RunError> {
        self.session_call_with(caller, id, req, kind, on_chunk, None)
    }

    /// [`Engine::session_call`], a cell of which `cancel` ends early (its client went
    /// away): the agent ends the cell's interpreter as its deadline would, without
    /// `timed_out` (`interpreter_crash`, killed by a signal), and the call is answered and
    /// recorded as any is; the session goes on. A job's steps run to their deadline.
    pub fn session_call_with(
        &self,
        caller: &str,
        id: &str,
        req: &RunRequest,
        kind: CallKind,
        on_chunk: &mut dyn FnMut(OutputChunk),
        cancel: Option<Arc<crate::Cancel>>,
    ) -> Result<RunResponse, RunError> {
        let request_id = Some(req.request_id.as_str());
        let s = self.sessions.find(caller, id, request_id)?;
        let mut st = lock(&s);
        if let Some(reason) = st.ended {
            return Err(ended_refusal(request_id, id, reason));
        }
        if let Some(reason) = s.expired(&st) {
            self.sessions.end(&s, &mut st, reason);
            return Err(ended_refusal(request_id, id, reason));
        }
        // The image was fixed at open: a call may name it again, never another.
        if let Some(asked) = &req.image
            && !s.image.as_ref().is_some_and(|i| i.answers(asked))
        {
            return Err(RunError::refused(
                request_id,
                Reason::Environment,
                format!(
                    "this session runs in image {}; a call cannot name another (`{asked}`): open a session in that image",
                    s.image.as_ref().map_or_else(
                        || "(none)".to_owned(),
                        |i| format!("`{}` ({})", i.name, i.identity)
                    )
                ),
            ));
        }
        let mut limits = self.call_limits(&s, req)?;
        // A call runs at most until the session's lifetime ends (then the session ends
        // `max_lifetime` once the call is answered, before the watchdog's grace is out).
        limits.timeout = limits
            .timeout
            .min(s.lifetime.saturating_sub(s.opened.elapsed()));
        let call = match (kind, &req.run) {
            (CallKind::Cell { restart }, RunSpec::Snippet(snippet)) => {
                if snippet.language != s.language {
                    return Err(RunError::refused(
                        request_id,
                        Reason::Request,
                        format!(
                            "this session's interpreter is {}, not {}: open a {} session",
                            s.language.as_str(),
                            snippet.language.as_str(),
                            snippet.language.as_str()
                        ),
                    ));
                }
                if !st.interpreter_alive && !restart {
                    return Err(RunError::SessionRefused {
                        request_id: request_id.map(str::to_owned),
                        reason: Reason::Request,
                        code: "interpreter_ended",
                        message: "the session's interpreter has ended and its state is lost; send the cell with restart (?restart=true) to start a fresh one".into(),
                        end_reason: None,
                    });
                }
                SessionCall::Cell(SessionCell {
                    code: snippet.code.clone(),
                    restart,
                    deadline_ms: millis(limits.timeout),
                    output_bytes: limits.output_bytes,
                    stream: true,
                })
            }
            (CallKind::Job, RunSpec::Project(project)) => {
                if project
                    .steps
                    .iter()
                    .any(|step| plimsoll_wire::trial_step::trial_step(step).is_some())
                {
                    return Err(RunError::refused(
                        request_id,
                        Reason::Unsupported,
                        "a session runs no trial step: send trials as single runs",
                    ));
                }
                SessionCall::Job(SessionJob {
                    job: AgentJob {
                        spec: req.run.clone(),
                        work_dir: WORK_DIR.into(),
                        output_bytes: limits.output_bytes,
                        artifact_bytes: limits.artifact_bytes,
                        deadline_ms: millis(limits.timeout),
                        trial: None,
                    },
                    stream: true,
                })
            }
            (CallKind::Cell { .. }, _) => {
                return Err(RunError::refused(
                    request_id,
                    Reason::Request,
                    "a cell's run is a snippet (kind, language, code)",
                ));
            }
            (CallKind::Job, _) => {
                return Err(RunError::refused(
                    request_id,
                    Reason::Request,
                    "a step's run is a project (files, steps, artifacts)",
                ));
            }
        };
        let sandbox = st
            .sandbox
            .as_mut()
            .expect("an open session has its sandbox");
        // The sandbox now against the sandbox at open: any difference ends the session.
        let wall = match sandbox.wall_now() {
            Ok(w) if w == s.wall => w,
            other => {
                let why = match other {
                    Ok(w) => describe_change(&s.wall, &w),
                    Err(e) => e.message(),
                };
                tracing::warn!(session_id = %s.id, why = %why, "a session's sandbox changed; ending it");
                self.sessions.end(&s, &mut st, EndReason::SandboxChanged);
                return Err(RunError::SessionRefused {
                    request_id: request_id.map(str::to_owned),
                    reason: Reason::Environment,
                    code: "sandbox_changed",
                    message: format!(
                        "the session's sandbox is no longer what it was at open ({why}); the session has ended and nothing ran: open a new one"
                    ),
                    end_reason: Some(EndReason::SandboxChanged),
                });
            }
        };
        let started_unix_ms = unix_ms_now();
        let within = limits.timeout + CALL_GRACE;
        // The agent is not trusted beyond what it reports: a chunk past the call's caps or
        // out of place is not passed on, and fails the call once it is answered.
        let mut chunks = ChunkBounds::for_call(&call);
        let cancel = cancel.filter(|_| matches!(call, SessionCall::Cell(_)));
        if let Some(c) = &cancel
            && let Some(kill) = sandbox.canceller()
        {
            c.arm(kill);
            // Cancelled before it was armed: at once.
            if c.is_cancelled() {
                c.cancel();
            }
        }
        let answered = sandbox.call(&call, within, &mut |c| {
            if chunks.admit(&c) {
                on_chunk(c);
            }
        });
        if let Some(c) = &cancel {
            c.disarm();
        }
        st.last_call = Instant::now();
        let answer = match answered.and_then(|a| {
            chunks
                .broken
                .take()
                .map_or(Ok(a), |why| Err(LaunchError::may_have_run(why)))
        }) {
            Ok(a) => a,
            Err(e) => return Err(self.failed_call(&s, &mut st, req, e)),
        };
        let mut result = match (answer.result, answer.error) {
            (Some(r), None) => r,
            // The agent refused the call before any of it ran: the session goes on.
            (None, Some(error)) if answer.nothing_ran => {
                let CallKind::Cell { .. } = kind else {
                    return Err(RunError::refused(
                        request_id,
                        Reason::Request,
                        format!("the session's agent refused the call: {error}"),
                    ));
                };
                // A cell is refused only when there is no interpreter to run it: it ended
                // between calls (a thread, a timer or a step ended it), or a restart failed.
                st.interpreter_alive = false;
                if let Some(end) = answer.interpreter_ended {
                    self.sessions.count_end(end);
                }
                return Err(RunError::SessionRefused {
                    request_id: request_id.map(str::to_owned),
                    reason: Reason::Request,
                    code: "interpreter_ended",
                    message: format!("{error} (?restart=true)"),
                    end_reason: answer.interpreter_ended,
                });
            }
            (_, error) => {
                let e = LaunchError::may_have_run(format!(
                    "the session's agent could not do the call: {}",
                    error.unwrap_or_else(|| "it answered no result".into())
                ));
                return Err(self.failed_call(&s, &mut st, req, e));
            }
        };
        if let Err(why) = within_caps(&result, &call) {
            let e = LaunchError::may_have_run(format!(
                "the session's agent answered more than the call allows ({why})"
            ));
            return Err(self.failed_call(&s, &mut st, req, e));
        }
        // What only the host knows: the wall it read; the broker's calls and the egress
        // receipts of connections that ended since the last call; no start.
        result.start = None;
        result.member_age_ms = None;
        let seen = s.broker.as_ref().map(|b| b.drain()).unwrap_or_default();
        result.calls = seen.calls;
        result.egress = seen.egress;
        result.wall = Some(wall);
        match kind {
            CallKind::Cell { .. } => {
                if let Some(end) = result.interpreter_end {
                    st.interpreter_alive = false;
                    self.sessions.count_end(end);
                } else {
                    st.interpreter_alive = true;
                }
                result.state_kept.get_or_insert(false);
            }
            CallKind::Job => {
                result.state_kept = None;
                result.interpreter_end = None;
            }
        }
        let ended_unix_ms = unix_ms_now();
        let request_sha = request_sha256(req);
        let result_sha = result_sha256(&result);
        st.calls += 1;
        let mut record = RunRecord {
            image: s.image.clone(),
            trials: Vec::new(),
            request_id: req.request_id.clone(),
            request_sha256: request_sha.clone(),
            result_sha256: result_sha.clone(),
            provider: s.provider.clone(),
            isolation: s.tier,
            minimum_isolation: Some(req.minimum_isolation.unwrap_or(s.floor)),
            evidence_sha256: s.evidence_sha256.clone(),
            environment: s.environment.clone(),
            started_unix_ms,
            ended_unix_ms,
            session: Some(SessionLink {
                session_id: s.id.clone(),
                sequence: st.calls,
                previous_record_sha256: st.last_record.clone(),
                origin: s.origin.clone(),
            }),
            record_sha256: String::new(),
        };
        record.record_sha256 = record_sha256(&record);
        st.last_record = Some(record.record_sha256.clone());
        tracing::info!(session_id = %s.id, request_id = %req.request_id, sequence = st.calls, exit_code = ?result.exit_code, "session call answered");
        // A call the lifetime cut short ends the session once answered.
        if s.opened.elapsed() >= s.lifetime {
            self.sessions.end(&s, &mut st, EndReason::MaxLifetime);
        }
        Ok(RunResponse {
            protocol: PROTOCOL,
            request_id: req.request_id.clone(),
            provider: s.provider.clone(),
            isolation: s.tier,
            duration_ms: ended_unix_ms.saturating_sub(started_unix_ms),
            request_sha256: request_sha,
            result_sha256: result_sha,
            result,
            record,
        })
    }

    /// A call that failed after it may have started: the session ends (`sandbox_failed`).
    fn failed_call(
        &self,
        s: &Session,
        st: &mut State,
        req: &RunRequest,
        e: LaunchError,
    ) -> RunError {
        let message = e.message();
        tracing::error!(session_id = %s.id, request_id = %req.request_id, %message, "a session call failed; ending the session");
        self.sessions.end(s, st, EndReason::SandboxFailed);
        RunError::Failed {
            request_id: req.request_id.clone(),
            provider: s.provider.clone(),
            message: format!("{message}; the session has ended (sandbox_failed)"),
        }
    }

    /// A call's limits: its timeout, output and artifact caps (at most the server's
    /// maximums; the session's by default); the session's memory, pids and disk, which a
    /// call may only repeat. Also its floor against the tier measured at open.
    fn call_limits(
        &self,
        s: &Session,
        req: &RunRequest,
    ) -> Result<plimsoll_sandbox::ResolvedLimits, RunError> {
        let id = Some(req.request_id.as_str());
        req.validate_session_call()
            .map_err(|r| RunError::refused(r.request_id.as_deref().or(id), r.reason, r.message))?;
        if req.grant.is_some() {
            return Err(RunError::refused(
                id,
                Reason::Unsupported,
                "a session call takes no grant: the grant the session was opened with applies to every call",
            ));
        }
        if let Some(p) = &req.provider
            && *p != s.provider
        {
            return Err(RunError::refused(
                id,
                Reason::Request,
                format!("this session runs at {}, not {p}", s.provider),
            ));
        }
        if let Some(floor) = req.minimum_isolation
            && s.tier < floor
        {
            return Err(RunError::refused(
                id,
                Reason::Isolation,
                format!(
                    "the session's tier, measured at open, is {}, below this call's floor {floor}: open a session that meets it",
                    s.tier
                ),
            ));
        }
        let asked = req.limits.clone().unwrap_or_default();
        let fixed = [
            ("memory_bytes", asked.memory_bytes, s.limits.memory_bytes),
            ("pids", asked.pids, s.limits.pids),
            ("disk_bytes", asked.disk_bytes, s.limits.disk_bytes),
        ];
        for (name, ask, held) in fixed {
            if let Some(v) = ask
                && v != held
            {
                return Err(RunError::refused(
                    id,
                    Reason::Request,
                    format!(
                        "limits.{name} is the session's ({held}) for its whole life: leave it out of the call"
                    ),
                ));
            }
        }
        let resolved = crate::config::LimitPolicy {
            defaults: s.limits,
            maximums: self.config.limits.maximums,
        }
        .resolve(Some(&plimsoll_wire::Limits {
            memory_bytes: None,
            pids: None,
            disk_bytes: None,
            ..asked
        }))
        .map_err(|m| RunError::refused(id, Reason::Request, m))?;
        Ok(resolved)
    }

    /// `caller`'s session `id` as it is now.
    pub fn session_info(&self, caller: &str, id: &str) -> Result<SessionInfo, RunError> {
        let s = self.sessions.find(caller, id, None)?;
        let st = lock(&s);
        Ok(s.info(&st, None))
    }

    /// Closes `caller`'s session `id` (`closed`) and says what it was.
    pub fn close_session(
        &self,
        caller: &str,
        id: &str,
        request_id: Option<&str>,
    ) -> Result<SessionInfo, RunError> {
        let s = self.sessions.find(caller, id, request_id)?;
        let mut st = lock(&s);
        if let Some(reason) = st.ended {
            return Err(ended_refusal(request_id, id, reason));
        }
        self.sessions.end(&s, &mut st, EndReason::Closed);
        Ok(s.info(&st, request_id))
    }

    /// `caller`'s open sessions, oldest first.
    pub fn list_sessions(&self, caller: &str) -> SessionList {
        let mut mine: Vec<Arc<Session>> = self
            .sessions
            .inner()
            .open
            .values()
            .filter(|s| s.caller == caller)
            .cloned()
            .collect();
        mine.sort_by_key(|s| s.opened);
        SessionList {
            protocol: PROTOCOL,
            sessions: mine
                .iter()
                .map(|s| {
                    let st = lock(s);
                    s.info(&st, None)
                })
                .collect(),
        }
    }

    /// Ends every open session (the daemon is stopping: `daemon_restarted`).
    pub fn end_all_sessions(&self) {
        let open: Vec<Arc<Session>> = self.sessions.inner().open.values().cloned().collect();
        for s in open {
            let mut st = lock(&s);
            self.sessions.end(&s, &mut st, EndReason::DaemonRestarted);
        }
    }

    /// Sessions open now.
    pub fn sessions_open(&self) -> usize {
        self.sessions.inner().open.len()
    }

    /// Ends so far, by reason (sessions' and interpreters').
    pub fn session_ends(&self) -> Vec<(&'static str, u64)> {
        self.sessions
            .ends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(r, n)| (*r, *n))
            .collect()
    }
}

/// What a call's output chunks may be: per stream, one after the other from offset 0 (no
/// gap, no overlap), never past what the call's answer may keep of that stream.
#[derive(Debug)]
struct ChunkBounds {
    /// Bytes a stream may keep in all: `output_bytes` of a cell, of each step of a job.
    cap: u64,
    /// The offset the next chunk of stdout and of stderr must start at.
    next: [u64; 2],
    /// Why a chunk was refused, once one was.
    broken: Option<String>,
}

impl ChunkBounds {
    fn for_call(call: &SessionCall) -> Self {
        let cap = match call {
            SessionCall::Cell(cell) => cell.output_bytes,
            SessionCall::Job(SessionJob { job, .. }) => match &job.spec {
                RunSpec::Project(p) => job.output_bytes.saturating_mul(p.steps.len() as u64),
                RunSpec::Snippet(_) => job.output_bytes,
            },
            SessionCall::Wall => 0,
        };
        ChunkBounds {
            cap,
            next: [0, 0],
            broken: None,
        }
    }

    /// Whether `c` may be passed on; once one may not, none may.
    fn admit(&mut self, c: &OutputChunk) -> bool {
        if self.broken.is_some() {
            return false;
        }
        let (i, name) = match c.stream {
            plimsoll_wire::OutputStream::Stdout => (0, "stdout"),
            plimsoll_wire::OutputStream::Stderr => (1, "stderr"),
        };
        let len = c.bytes.as_slice().len() as u64;
        let end = c.offset.saturating_add(len);
        if c.offset != self.next[i] || end > self.cap {
            self.broken = Some(format!(
                "its agent sent {len} bytes of {name} at offset {} where the next may start only at {} and the stream keeps at most {} bytes",
                c.offset, self.next[i], self.cap
            ));
            return false;
        }
        self.next[i] = end;
        true
    }
}

/// Whether an agent's answer keeps no more than `call` lets it keep: `output_bytes` per
/// stream (of the cell, of every step and of the job, which mirrors its last step), no more
/// steps than were sent, no more artifacts than were asked for, each within `artifact_bytes`.
/// The agent caps all of these itself; the host checks rather than trusts it.
fn within_caps(result: &plimsoll_wire::RunResult, call: &SessionCall) -> Result<(), String> {
    let (output, artifact, steps, artifacts) = match call {
        SessionCall::Cell(cell) => (cell.output_bytes, 0, 0, 0),
        SessionCall::Job(SessionJob { job, .. }) => match &job.spec {
            RunSpec::Project(p) => (
                job.output_bytes,
                job.artifact_bytes,
                p.steps.len(),
                p.artifacts.len(),
            ),
            RunSpec::Snippet(_) => (job.output_bytes, 0, 0, 0),
        },
        SessionCall::Wall => (0, 0, 0, 0),
    };
    let streams = std::iter::once(("the call", &result.stdout, &result.stderr)).chain(
        result
            .steps
            .iter()
            .map(|step| ("a step", &step.stdout, &step.stderr)),
    );
    for (whose, stdout, stderr) in streams {
        for (name, bytes) in [("stdout", stdout), ("stderr", stderr)] {
            let len = bytes.as_slice().len() as u64;
            if len > output {
                return Err(format!(
                    "{len} bytes of {whose}'s {name} where output_bytes is {output}"
                ));
            }
        }
    }
    if result.steps.len() > steps {
        return Err(format!(
            "{} step results for {steps} steps",
            result.steps.len()
        ));
    }
    if result.artifacts.len() > artifacts {
        return Err(format!(
            "{} artifacts where {artifacts} were asked for",
            result.artifacts.len()
        ));
    }
    if let Some(a) = result
        .artifacts
        .iter()
        .find(|a| a.content.as_slice().len() as u64 > artifact)
    {
        return Err(format!(
            "{} bytes of an artifact where artifact_bytes is {artifact}",
            a.content.as_slice().len()
        ));
    }
    Ok(())
}

/// What differs between the wall at open and the wall now, briefly.
fn describe_change(open: &Wall, now: &Wall) -> String {
    let mut diffs = Vec::new();
    if (open.uid, open.euid, open.gid) != (now.uid, now.euid, now.gid) {
        diffs.push("its uid or gid".to_owned());
    }
    if (
        &open.cap_prm,
        &open.cap_eff,
        &open.cap_bnd,
        &open.cap_amb,
        &open.cap_inh,
    ) != (
        &now.cap_prm,
        &now.cap_eff,
        &now.cap_bnd,
        &now.cap_amb,
        &now.cap_inh,
    ) {
        diffs.push("its capabilities".into());
    }
    if open.namespaces != now.namespaces {
        diffs.push("its namespaces".into());
    }
    if open.memory_limit_bytes != now.memory_limit_bytes {
        diffs.push(format!(
            "its memory limit ({:?} at open, {:?} now)",
            open.memory_limit_bytes, now.memory_limit_bytes
        ));
    }
    if open.pids_limit != now.pids_limit {
        diffs.push(format!(
            "its pids limit ({:?} at open, {:?} now)",
            open.pids_limit, now.pids_limit
        ));
    }
    if open.root_read_only != now.root_read_only
        || open.network_interfaces != now.network_interfaces
    {
        diffs.push("its root or network".into());
    }
    if diffs.is_empty() {
        "its wall".into()
    } else {
        diffs.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use plimsoll_wire::{Artifact, Bytes, OutputStream, RunResult, StepResult};

    use super::*;

    /// A session's sandbox whose close waits until the test lets it go (a VM's slow
    /// removal), and says when it was asked to close.
    #[derive(Debug)]
    struct SlowToClose {
        wall: Wall,
        closing: mpsc::Sender<&'static str>,
        release: Arc<Mutex<mpsc::Receiver<()>>>,
        name: &'static str,
    }

    impl SessionSandbox for SlowToClose {
        fn uid(&self) -> u32 {
            1
        }
        fn wall_at_open(&self) -> &Wall {
            &self.wall
        }
        fn wall_now(&mut self) -> Result<Wall, LaunchError> {
            Ok(self.wall.clone())
        }
        fn call(
            &mut self,
            _: &SessionCall,
            _: Duration,
            _: &mut dyn FnMut(OutputChunk),
        ) -> Result<plimsoll_wire::SessionAnswer, LaunchError> {
            Err(LaunchError::may_have_run("not for this test"))
        }
        fn alive(&mut self) -> bool {
            true
        }
        fn close(self: Box<Self>) -> Result<(), plimsoll_sandbox::CloseSessionError> {
            let _ = self.closing.send(self.name);
            let _ = self
                .release
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30));
            Ok(())
        }
    }

    fn idle_session(id: &str, sandbox: SlowToClose) -> Arc<Session> {
        let past = Instant::now() - Duration::from_secs(5);
        Arc::new(Session {
            image: None,
            id: id.into(),
            caller: "c".into(),
            language: Language::Python,
            provider: "crun".into(),
            tier: Tier::Container,
            floor: Tier::Container,
            evidence_sha256: String::new(),
            environment: String::new(),
            limits: plimsoll_sandbox::ResolvedLimits {
                timeout: Duration::from_secs(1),
                memory_bytes: 1,
                output_bytes: 1,
                pids: 1,
                disk_bytes: 1,
                artifact_bytes: 1,
            },
            opened_unix_ms: 0,
            opened: past,
            lifetime: Duration::from_secs(3600),
            idle_timeout: Duration::from_secs(1),
            wall: Wall::default(),
            broker: None,
            uid: 0,
            gid: 0,
            origin: None,
            state: Mutex::new(State {
                sandbox: Some(Box::new(sandbox)),
                permit: None,
                calls: 0,
                last_record: None,
                last_call: past,
                interpreter_alive: true,
                ended: None,
            }),
        })
    }

    /// #28.12: the reaper ends each expired session on a thread of its own: while one
    /// sandbox's removal has not finished, another expired session still ends.
    #[test]
    fn one_slow_removal_does_not_hold_back_another_sessions_end() {
        let sessions = Sessions::new();
        let (closing, closed) = mpsc::channel();
        let (release, hold) = mpsc::channel();
        let hold = Arc::new(Mutex::new(hold));
        for name in ["a", "b"] {
            let s = idle_session(
                name,
                SlowToClose {
                    wall: Wall::default(),
                    closing: closing.clone(),
                    release: Arc::clone(&hold),
                    name,
                },
            );
            sessions.inner().open.insert(name.into(), s);
        }
        sessions.reap_expired();
        let mut started = vec![
            closed.recv_timeout(Duration::from_secs(10)).unwrap(),
            closed
                .recv_timeout(Duration::from_secs(10))
                .expect("the second session's removal starts while the first's waits"),
        ];
        started.sort_unstable();
        assert_eq!(started, ["a", "b"]);
        release.send(()).unwrap();
        release.send(()).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while !sessions.inner().open.is_empty() {
            assert!(Instant::now() < until, "both sessions ended within 10 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        let ends = sessions.ends.lock().unwrap().get("idle_timeout").copied();
        assert_eq!(ends, Some(2));
    }

    fn cell(output_bytes: u64) -> SessionCall {
        SessionCall::Cell(SessionCell {
            code: String::new(),
            restart: false,
            deadline_ms: 1,
            output_bytes,
            stream: true,
        })
    }

    fn job(output_bytes: u64, steps: usize, artifacts: &[&str]) -> SessionCall {
        SessionCall::Job(SessionJob {
            job: AgentJob {
                spec: RunSpec::Project(plimsoll_wire::Project {
                    files: Vec::new(),
                    steps: (0..steps)
                        .map(|_| plimsoll_wire::Step {
                            name: None,
                            run: "true".into(),
                        })
                        .collect(),
                    artifacts: artifacts.iter().map(|a| (*a).to_owned()).collect(),
                }),
                work_dir: WORK_DIR.into(),
                output_bytes,
                artifact_bytes: 10,
                deadline_ms: 1,
                trial: None,
            },
            stream: true,
        })
    }

    fn chunk(stream: OutputStream, offset: u64, len: usize) -> OutputChunk {
        OutputChunk {
            stream,
            offset,
            bytes: Bytes(vec![b'x'; len]),
        }
    }

    /// #28.3: chunks are held to the call's cap and to their places: a gap, an overlap, or
    /// a byte past `output_bytes` is not passed on, and nothing after it is.
    #[test]
    fn chunks_are_held_to_their_caps_and_places() {
        let mut b = ChunkBounds::for_call(&cell(10));
        assert!(b.admit(&chunk(OutputStream::Stdout, 0, 6)));
        assert!(b.admit(&chunk(OutputStream::Stderr, 0, 10)));
        assert!(b.admit(&chunk(OutputStream::Stdout, 6, 4)));
        assert!(
            !b.admit(&chunk(OutputStream::Stdout, 10, 1)),
            "past the cap"
        );
        assert!(b.broken.is_some());
        assert!(!b.admit(&chunk(OutputStream::Stderr, 10, 0)), "none after");

        for bad in [
            chunk(OutputStream::Stdout, 1, 1),
            chunk(OutputStream::Stdout, 0, 11),
        ] {
            let mut b = ChunkBounds::for_call(&cell(10));
            assert!(!b.admit(&bad), "{bad:?}");
        }
        let mut b = ChunkBounds::for_call(&cell(10));
        assert!(b.admit(&chunk(OutputStream::Stdout, 0, 5)));
        assert!(!b.admit(&chunk(OutputStream::Stdout, 3, 2)), "an overlap");

        // A job's stream runs on across its steps, each keeping output_bytes.
        let mut b = ChunkBounds::for_call(&job(10, 3, &[]));
        assert!(b.admit(&chunk(OutputStream::Stdout, 0, 10)));
        assert!(b.admit(&chunk(OutputStream::Stdout, 10, 20)));
        assert!(!b.admit(&chunk(OutputStream::Stdout, 30, 1)));
    }

    /// #28.1: an answer keeping more than its call allows is caught by the host, whatever
    /// the agent's truncation flags say.
    #[test]
    fn an_answer_over_its_calls_caps_is_refused() {
        let ok = RunResult {
            stdout: Bytes(vec![b'x'; 4096]),
            ..RunResult::default()
        };
        assert_eq!(within_caps(&ok, &cell(4096)), Ok(()));
        let forged = RunResult {
            stdout: Bytes(vec![b'F'; 40_000]),
            stdout_truncated: false,
            ..RunResult::default()
        };
        let why = within_caps(&forged, &cell(4096)).unwrap_err();
        assert!(why.contains("40000 bytes"), "{why}");
        let step = StepResult {
            stderr: Bytes(vec![b'x'; 11]),
            ..StepResult::default()
        };
        let many_steps = RunResult {
            steps: vec![step.clone()],
            ..RunResult::default()
        };
        assert!(within_caps(&many_steps, &job(10, 1, &[])).is_err());
        let two = RunResult {
            steps: vec![StepResult::default(), StepResult::default()],
            ..RunResult::default()
        };
        assert!(within_caps(&two, &job(10, 1, &[])).is_err());
        let artifact = |len| Artifact {
            path: "a".into(),
            found: true,
            size: len as u64,
            content: Bytes(vec![b'x'; len]),
            truncated: false,
        };
        let big = RunResult {
            artifacts: vec![artifact(11)],
            ..RunResult::default()
        };
        assert!(within_caps(&big, &job(10, 0, &["a"])).is_err());
        let fine = RunResult {
            artifacts: vec![artifact(10)],
            ..RunResult::default()
        };
        assert_eq!(within_caps(&fine, &job(10, 0, &["a"])), Ok(()));
        assert!(within_caps(&fine, &job(10, 0, &[])).is_err());
    }
}
