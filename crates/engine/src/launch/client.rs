//! The serving side: a provider whose every call is a request to the launcher.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use plimsoll_sandbox::session::Canceller;
use plimsoll_sandbox::{
    CancelRunError, CloseSessionError, LaunchError, LaunchPlan, Outcome, Probed, Provider,
    RunImage, RunningIn, SessionSandbox, Stale, Teardown, Unsupported, WarmMember, WarmPlan,
    Withdrawn,
};
use plimsoll_wire::launch::{
    Admitted, DescribedProvider, LaunchAnswer, LaunchEvent, LaunchRequest,
};
use plimsoll_wire::{Evidence, Reason, RunSpec, Tier};
use plimsoll_wire::{OutputChunk, SessionAnswer, SessionCall, Wall};

use super::conn::{Receiver, Sender, split};
use super::{failure_from_wire, image_to_wire, member_to_wire, plan_to_wire, probed_from_wire};

/// One provider the launcher at `socket` hosts.
#[derive(Debug)]
pub struct Remote {
    socket: PathBuf,
    described: DescribedProvider,
    /// Connections kept for questions (the launcher answers them one after another on each),
    /// so that a question costs a round trip, not a connection; shared by every provider of
    /// one launcher.
    kept: Arc<Kept>,
}

/// Question connections to one launcher, kept between questions.
#[derive(Debug, Default)]
struct Kept(std::sync::Mutex<Vec<(Sender, Receiver)>>);

impl Kept {
    /// At most this many are kept; a question finding none free opens another.
    const MAX: usize = 4;

    fn take(&self) -> Option<(Sender, Receiver)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    fn give_back(&self, conn: (Sender, Receiver)) {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < Self::MAX {
            kept.push(conn);
        }
    }
}

/// The launcher did not answer as it should.
fn broken(e: impl std::fmt::Display) -> String {
    format!("the launcher did not answer: {e}; check that it runs (plimsolld launcher)")
}

impl Remote {
    /// Every provider the launcher at `socket` hosts, in its settings' order.
    pub fn all(socket: &Path) -> io::Result<Vec<Remote>> {
        match ask(socket, &LaunchRequest::Describe)? {
            LaunchAnswer::Described(list) => {
                let kept = Arc::new(Kept::default());
                Ok(list
                    .into_iter()
                    .map(|described| Remote {
                        socket: socket.to_owned(),
                        described,
                        kept: Arc::clone(&kept),
                    })
                    .collect())
            }
            other => Err(unexpected(&other)),
        }
    }

    /// A question, on the kept connection when it is free (a fresh one otherwise, kept
    /// afterwards when none is); a kept connection that fails is dropped and the question
    /// asked once more on a fresh one.
    fn ask(&self, request: &LaunchRequest) -> Result<LaunchAnswer, String> {
        let kept = self.kept.take();
        let reused = kept.is_some();
        let mut conn = match kept {
            Some(c) => c,
            None => connect(&self.socket).map_err(broken)?,
        };
        let mut asked = question(&mut conn, request);
        if asked.is_err() && reused {
            conn = connect(&self.socket).map_err(broken)?;
            asked = question(&mut conn, request);
        }
        let answer = asked.map_err(broken)?;
        self.kept.give_back(conn);
        match answer {
            LaunchAnswer::Refused(why) => Err(format!("the launcher refused: {why}")),
            a => Ok(a),
        }
    }

    /// A yes-or-why-not question.
    fn done(&self, request: &LaunchRequest) -> Result<(), String> {
        match self.ask(request)? {
            LaunchAnswer::Done(r) => r,
            other => Err(broken(unexpected(&other))),
        }
    }

    fn name_owned(&self) -> String {
        self.described.name.clone()
    }

    /// What routing asks of every provider of this launcher for one run (whether each
    /// supports `spec`, takes `image`, and its memory floor), in one round trip; in the
    /// launcher's order.
    /// With `evidence_sha256` (per provider, the digest of the evidence it is offered on),
    /// each also says whether that environment still holds, when the launcher knows it.
    pub fn admit_all(
        &self,
        spec: &RunSpec,
        image: Option<&RunImage>,
        evidence_sha256: std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<Admitted>, String> {
        let request = LaunchRequest::Admit {
            spec: spec.clone(),
            image: image.map(image_to_wire),
            evidence_sha256,
        };
        match self.ask(&request)? {
            LaunchAnswer::Admitted(all) => Ok(all),
            other => Err(broken(unexpected(&other))),
        }
    }
}

fn connect(socket: &Path) -> io::Result<(Sender, Receiver)> {
    split(UnixStream::connect(socket)?)
}

/// A question on `conn`, and its answer as it came (a refusal too).
fn question(conn: &mut (Sender, Receiver), request: &LaunchRequest) -> io::Result<LaunchAnswer> {
    conn.0.send(request, None)?;
    match conn.1.expect::<LaunchEvent>()? {
        LaunchEvent::Answer(a) => Ok(*a),
        other => Err(io::Error::other(format!(
            "an event with no run under way: {other:?}"
        ))),
    }
}

/// One request on a connection of its own, one answer (no events).
fn ask(socket: &Path, request: &LaunchRequest) -> io::Result<LaunchAnswer> {
    let (tx, mut rx) = connect(socket)?;
    tx.send(request, None)?;
    match rx.expect::<LaunchEvent>()? {
        LaunchEvent::Answer(a) => match *a {
            LaunchAnswer::Refused(why) => Err(io::Error::other(format!("it refused: {why}"))),
            a => Ok(a),
        },
        other => Err(io::Error::other(format!(
            "an event with no run under way: {other:?}"
        ))),
    }
}

/// The split daemon's grants as the serving process reaches them: the launcher's loads of the
/// grants file (their text, never a secret) and the broker process it keeps (a copy of its
/// control socket), for [`plimsoll_broker::apart::Apart::remote`].
#[derive(Debug)]
pub struct LauncherBrokers {
    socket: PathBuf,
}

impl LauncherBrokers {
    /// The grants of the launcher at `socket`.
    pub fn new(socket: &Path) -> Self {
        LauncherBrokers {
            socket: socket.to_owned(),
        }
    }

    /// The launcher's newest load of the grants file (with `reload`, read again first): its
    /// generation and text; the profiles authorize by it
    /// ([`plimsoll_broker::GrantProfiles::parse_held_apart`]).
    pub fn grants(
        &self,
        reload: bool,
    ) -> Result<plimsoll_broker::GrantProfiles, plimsoll_broker::LoadGrantsError> {
        let elsewhere = plimsoll_broker::LoadGrantsError::Elsewhere;
        match ask(&self.socket, &LaunchRequest::Grants { reload }) {
            Ok(LaunchAnswer::Grants { generation, text }) => {
                plimsoll_broker::GrantProfiles::parse_held_apart(&text, generation)
            }
            Ok(LaunchAnswer::Done(Err(why))) => Err(elsewhere(why)),
            Ok(other) => Err(elsewhere(broken(unexpected(&other)))),
            Err(e) => Err(elsewhere(broken(e))),
        }
    }
}

impl plimsoll_broker::apart::ControlSource for LauncherBrokers {
    fn control(&self) -> io::Result<std::os::fd::OwnedFd> {
        let (tx, mut rx) = connect(&self.socket)?;
        tx.send(&LaunchRequest::BrokerControl, None)?;
        match rx.expect::<LaunchEvent>()? {
            LaunchEvent::Answer(a) => match *a {
                LaunchAnswer::Done(Ok(())) => rx.take_fd(),
                LaunchAnswer::Done(Err(why)) | LaunchAnswer::Refused(why) => {
                    Err(io::Error::other(why))
                }
                other => Err(unexpected(&other)),
            },
            other => Err(io::Error::other(format!("{other:?}"))),
        }
    }

    fn load(&self, generation: u64) -> io::Result<()> {
        match ask(&self.socket, &LaunchRequest::LoadGrants { generation })? {
            LaunchAnswer::Done(r) => r.map_err(io::Error::other),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(a: &LaunchAnswer) -> io::Error {
    io::Error::other(format!("an answer to another question: {a:?}"))
}

impl Provider for Remote {
    fn name(&self) -> &str {
        &self.described.name
    }
    fn nominal_tier(&self) -> Tier {
        self.described.nominal_tier
    }
    fn cost(&self) -> u32 {
        self.described.cost
    }
    fn uses_image(&self) -> bool {
        self.described.uses_image
    }
    fn supports_broker(&self) -> bool {
        self.described.supports_broker
    }
    fn supports_egress(&self) -> bool {
        self.described.supports_egress
    }
    fn warms(&self) -> bool {
        self.described.warms
    }
    fn warm(&self, plan: &WarmPlan) -> Result<Box<dyn WarmMember>, LaunchError> {
        let not_started = |e: String| LaunchError::not_started(Reason::Environment, e);
        let (tx, mut rx) = connect(&self.socket).map_err(|e| not_started(broken(e)))?;
        tx.send(
            &LaunchRequest::Warm {
                provider: self.name_owned(),
                plan: member_to_wire(plan),
            },
            None,
        )
        .map_err(|e| not_started(broken(e)))?;
        let answer = match rx.expect::<LaunchEvent>() {
            Ok(LaunchEvent::Answer(a)) => *a,
            Ok(other) => return Err(not_started(broken(format!("{other:?}")))),
            Err(e) => return Err(not_started(broken(e))),
        };
        match answer {
            LaunchAnswer::Warmed(Ok(uid)) => Ok(Box::new(RemoteMember {
                provider: self.name_owned(),
                uid,
                tx,
                rx,
            })),
            LaunchAnswer::Warmed(Err(f)) => Err(failure_from_wire(f)),
            LaunchAnswer::Refused(why) => Err(not_started(format!(
                "the launcher refused the member: {why}"
            ))),
            other => Err(not_started(broken(unexpected(&other)))),
        }
    }
    fn supports(&self, spec: &RunSpec) -> Result<(), Unsupported> {
        self.done(&LaunchRequest::Supports {
            provider: self.name_owned(),
            spec: spec.clone(),
        })
        .map_err(Unsupported::Said)
    }
    fn takes_image(&self, image: &RunImage) -> Result<(), Unsupported> {
        self.done(&LaunchRequest::TakesImage {
            provider: self.name_owned(),
            image: image_to_wire(image),
        })
        .map_err(Unsupported::Said)
    }
    fn memory_floor(&self, spec: &RunSpec) -> Option<u64> {
        match self.ask(&LaunchRequest::MemoryFloor {
            provider: self.name_owned(),
            spec: spec.clone(),
        }) {
            Ok(LaunchAnswer::Floor(floor)) => floor,
            // No answer: the run goes on to the launcher, whose answer to it says why.
            _ => None,
        }
    }
    fn probe(&self) -> Probed {
        match self.ask(&LaunchRequest::Probe {
            provider: self.name_owned(),
        }) {
            Ok(LaunchAnswer::Probed(p)) => probed_from_wire(p),
            Ok(other) => self.not_probed(broken(unexpected(&other))),
            Err(why) => self.not_probed(why),
        }
    }
    fn adopt(&self, evidence: &Evidence) -> Result<(), Stale> {
        self.done(&LaunchRequest::Adopt {
            provider: self.name_owned(),
            evidence: evidence.clone(),
        })
        .map_err(Stale::Said)
    }
    fn environment_holds(&self, evidence: &Evidence) -> Result<(), Stale> {
        self.done(&LaunchRequest::EnvironmentHolds {
            provider: self.name_owned(),
            evidence: evidence.clone(),
        })
        .map_err(Stale::Said)
    }
    fn run(&self, plan: &LaunchPlan) -> Result<Outcome, LaunchError> {
        let (outcome, teardown) = self.run_then_tear_down(plan)?;
        if let Some(t) = teardown {
            t.run()
                .map_err(|e| LaunchError::may_have_run(e.to_string()))?;
        }
        Ok(outcome)
    }
    fn run_then_tear_down(
        &self,
        plan: &LaunchPlan,
    ) -> Result<(Outcome, Option<Teardown>), LaunchError> {
        let not_started = |e: String| LaunchError::not_started(Reason::Environment, e);
        let (tx, rx) = connect(&self.socket).map_err(|e| not_started(broken(e)))?;
        tx.send(
            &LaunchRequest::Run {
                provider: self.name_owned(),
                plan: plan_to_wire(plan),
            },
            None,
        )
        .map_err(|e| not_started(broken(e)))?;
        follow(plan, tx, rx)
    }
    fn opens_sessions(&self) -> bool {
        self.described.opens_sessions
    }
    fn open_session(
        &self,
        plan: &LaunchPlan,
        lifetime: Duration,
    ) -> Result<Box<dyn SessionSandbox>, LaunchError> {
        let not_started = |e: String| LaunchError::not_started(Reason::Environment, e);
        let (tx, mut rx) = connect(&self.socket).map_err(|e| not_started(broken(e)))?;
        tx.send(
            &LaunchRequest::OpenSession {
                provider: self.name_owned(),
                plan: plan_to_wire(plan),
                lifetime_ms: lifetime.as_millis() as u64,
            },
            None,
        )
        .map_err(|e| not_started(broken(e)))?;
        // Until it answers, the broker channel's ends may come (and none of the session's
        // code has run: a launcher lost now leaves nothing dispatched).
        let opened = loop {
            let event = rx
                .expect::<LaunchEvent>()
                .map_err(|e| not_started(broken(e)))?;
            if serve_broker_end(&event, &mut rx, plan.broker.as_ref())
                .map_err(|e| not_started(broken(e)))?
            {
                continue;
            }
            let LaunchEvent::Answer(a) = event else {
                return Err(not_started(broken(format!("{event:?}"))));
            };
            match *a {
                LaunchAnswer::Opened(Ok(o)) => break o,
                LaunchAnswer::Opened(Err(f)) => return Err(failure_from_wire(f)),
                LaunchAnswer::Refused(why) => {
                    return Err(not_started(format!(
                        "the launcher refused the session: {why}"
                    )));
                }
                other => return Err(not_started(broken(unexpected(&other)))),
            }
        };
        // From now on one thread reads: the broker channel's ends are served as they come
        // (a cell's background work may open them between calls); chunks and answers go
        // to whichever call waits.
        let (to_call, from_reader) = std::sync::mpsc::channel();
        let broker = plan.broker.clone();
        std::thread::Builder::new()
            .name("launch-session".into())
            .spawn(move || {
                loop {
                    let event = match rx.recv::<LaunchEvent>() {
                        Ok(Some(e)) => e,
                        Ok(None) => break,
                        Err(e) => {
                            let _ = to_call.send(Err(broken(e)));
                            break;
                        }
                    };
                    match serve_broker_end(&event, &mut rx, broker.as_ref()) {
                        Ok(true) => continue,
                        Ok(false) => {}
                        Err(e) => {
                            let _ = to_call.send(Err(broken(e)));
                            break;
                        }
                    }
                    if to_call.send(Ok(event)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| not_started(broken(e)))?;
        Ok(Box::new(RemoteSession {
            uid: opened.uid,
            wall: opened.wall,
            run_id: plan.run_id.clone(),
            tx,
            events: from_reader,
            cancel: opened
                .cancel_token
                .map(|token| (self.socket.clone(), token)),
        }))
    }
    fn cancel(&self, sandbox: &RunningIn) -> Result<(), CancelRunError> {
        self.done(&LaunchRequest::Cancel {
            provider: self.name_owned(),
            id: sandbox.id.clone(),
            uid: sandbox.uid,
        })
        .map_err(|why| CancelRunError::End {
            sandbox: sandbox.id.clone(),
            uid: sandbox.uid,
            cause: why.into(),
        })
    }
}

impl Remote {
    fn not_probed(&self, why: String) -> Probed {
        let mut checks = std::collections::BTreeMap::new();
        checks.insert("launcher".to_owned(), why.clone());
        Probed {
            tier: self.described.nominal_tier,
            evidence: Evidence {
                provider: self.name_owned(),
                isolation: self.described.nominal_tier,
                config: Default::default(),
                binaries: Vec::new(),
                probe: None,
                checks,
                environment: String::new(),
                checked_unix_ms: plimsoll_sandbox::unix_ms_now(),
            },
            available: Err(Withdrawn::NotProbed(why)),
        }
    }
}

impl Remote {
    /// A run's answer as the engine takes it; `tx` and `rx` stay open for the teardown.
    fn ran(
        answer: LaunchAnswer,
        tx: Sender,
        mut rx: Receiver,
    ) -> Result<(Outcome, Option<Teardown>), LaunchError> {
        let ran = match answer {
            LaunchAnswer::Refused(why) => {
                return Err(LaunchError::not_started(
                    Reason::Environment,
                    format!("the launcher refused the plan: {why}"),
                ));
            }
            LaunchAnswer::Ran(Err(f)) => return Err(failure_from_wire(f)),
            LaunchAnswer::Ran(Ok(ran)) => ran,
            other => return Err(LaunchError::may_have_run(broken(unexpected(&other)))),
        };
        let outcome = Outcome {
            result: ran.result,
            started_unix_ms: ran.started_unix_ms,
            ended_unix_ms: ran.ended_unix_ms,
        };
        let teardown = ran.teardown.then(|| {
            Teardown::new(move || {
                tx.send(&LaunchRequest::TearDown, None)
                    .map_err(|e| broken(e).into())
                    .and_then(|()| match rx.expect::<LaunchEvent>() {
                        Ok(LaunchEvent::Answer(a)) => match *a {
                            LaunchAnswer::Done(r) => r.map_err(Into::into),
                            other => Err(broken(format!("{other:?}")).into()),
                        },
                        Ok(other) => Err(broken(format!("{other:?}")).into()),
                        Err(e) => Err(broken(e).into()),
                    })
            })
        });
        Ok((outcome, teardown))
    }
}

/// Follows a run sent on `tx`: its events, then its answer.
fn follow(
    plan: &LaunchPlan,
    tx: Sender,
    mut rx: Receiver,
) -> Result<(Outcome, Option<Teardown>), LaunchError> {
    // Once the plan is sent, the code may run: a launcher gone after it is not "nothing ran".
    let lost = |e: io::Error| LaunchError::may_have_run(broken(e));
    loop {
        match rx.expect::<LaunchEvent>().map_err(lost)? {
            LaunchEvent::Output {
                stream,
                offset,
                bytes,
            } => {
                if let Some(tap) = &plan.tap {
                    tap.send(stream, offset, bytes.as_slice());
                }
            }
            event @ (LaunchEvent::BrokerStream | LaunchEvent::BrokerListener) => {
                serve_broker_end(&event, &mut rx, plan.broker.as_ref()).map_err(lost)?;
            }
            LaunchEvent::Answer(answer) => return Remote::ran(*answer, tx, rx),
            LaunchEvent::Chunk(_) => {
                return Err(lost(io::Error::other("a session's chunk during a run")));
            }
        }
    }
}

/// A warm member the launcher holds, on a connection of its own.
#[derive(Debug)]
struct RemoteMember {
    provider: String,
    uid: u32,
    tx: Sender,
    rx: Receiver,
}

impl WarmMember for RemoteMember {
    fn uid(&self) -> u32 {
        self.uid
    }
    fn run(self: Box<Self>, plan: &LaunchPlan) -> Result<(Outcome, Teardown), LaunchError> {
        let RemoteMember {
            provider, tx, rx, ..
        } = *self;
        tx.send(
            &LaunchRequest::Run {
                provider,
                plan: plan_to_wire(plan),
            },
            None,
        )
        .map_err(|e| LaunchError::not_started(Reason::Environment, broken(e)))?;
        let (outcome, teardown) = follow(plan, tx, rx)?;
        Ok((
            outcome,
            teardown.unwrap_or_else(|| Teardown::new(|| Ok(()))),
        ))
    }
    fn discard(self: Box<Self>) -> Result<(), plimsoll_sandbox::Cause> {
        let RemoteMember { tx, mut rx, .. } = *self;
        tx.send(&LaunchRequest::Discard, None).map_err(broken)?;
        match rx.expect::<LaunchEvent>().map_err(broken)? {
            LaunchEvent::Answer(a) => match *a {
                LaunchAnswer::Done(r) => r.map_err(Into::into),
                other => Err(broken(unexpected(&other)).into()),
            },
            other => Err(broken(format!("{other:?}")).into()),
        }
    }
}

/// Serves a broker channel's end the event carries: `Ok(true)` when it was one.
fn serve_broker_end(
    event: &LaunchEvent,
    rx: &mut Receiver,
    broker: Option<&plimsoll_sandbox::BrokerChannel>,
) -> io::Result<bool> {
    match event {
        LaunchEvent::BrokerStream => {
            let fd = rx.take_fd()?;
            if let Some(b) = broker {
                b.serve_stream(UnixStream::from(fd))?;
            }
            Ok(true)
        }
        LaunchEvent::BrokerListener => {
            let fd = rx.take_fd()?;
            if let Some(b) = broker {
                b.serve_listener(UnixListener::from(fd))?;
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// How much longer than a call's own bound the caller waits for the launcher's answer.
const ANSWER_GRACE: Duration = Duration::from_secs(30);

/// A session's sandbox the launcher holds, on a connection of its own.
#[derive(Debug)]
struct RemoteSession {
    uid: u32,
    wall: Wall,
    run_id: String,
    tx: Sender,
    events: std::sync::mpsc::Receiver<Result<LaunchEvent, String>>,
    /// The launcher's socket and the token naming this session's canceller.
    cancel: Option<(PathBuf, String)>,
}

impl RemoteSession {
    /// Sends `request` and waits up to `within` (and a grace) for its answer; chunks before
    /// it go to `on_chunk`.
    fn ask(
        &mut self,
        request: &LaunchRequest,
        within: Duration,
        on_chunk: &mut dyn FnMut(OutputChunk),
    ) -> Result<LaunchAnswer, String> {
        self.tx.send(request, None).map_err(broken)?;
        let deadline = std::time::Instant::now() + within + ANSWER_GRACE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Ok(LaunchEvent::Chunk(chunk))) => on_chunk(chunk),
                Ok(Ok(LaunchEvent::Answer(a))) => {
                    return match *a {
                        LaunchAnswer::Refused(why) => Err(format!("the launcher refused: {why}")),
                        a => Ok(a),
                    };
                }
                Ok(Ok(other)) => return Err(broken(format!("{other:?}"))),
                Ok(Err(why)) => return Err(why),
                Err(_) => return Err(broken("no answer in time, or the connection ended")),
            }
        }
    }
}

impl SessionSandbox for RemoteSession {
    fn uid(&self) -> u32 {
        self.uid
    }
    fn wall_at_open(&self) -> &Wall {
        &self.wall
    }
    fn wall_now(&mut self) -> Result<Wall, LaunchError> {
        match self.ask(&LaunchRequest::WallNow, Duration::ZERO, &mut |_| {}) {
            Ok(LaunchAnswer::Walled(r)) => r.map_err(failure_from_wire),
            Ok(other) => Err(LaunchError::environment(broken(unexpected(&other)))),
            Err(why) => Err(LaunchError::environment(why)),
        }
    }
    fn call(
        &mut self,
        call: &SessionCall,
        within: Duration,
        on_chunk: &mut dyn FnMut(OutputChunk),
    ) -> Result<SessionAnswer, LaunchError> {
        let request = LaunchRequest::Call {
            call: call.clone(),
            within_ms: within.as_millis() as u64,
        };
        match self.ask(&request, within, on_chunk) {
            Ok(LaunchAnswer::Called(r)) => r.map_err(failure_from_wire),
            Ok(other) => Err(LaunchError::may_have_run(broken(unexpected(&other)))),
            Err(why) => Err(LaunchError::may_have_run(why)),
        }
    }
    fn canceller(&self) -> Option<Canceller> {
        let (socket, token) = self.cancel.clone()?;
        Some(Box::new(move || {
            let request = LaunchRequest::CancelCell {
                token: token.clone(),
            };
            if let Err(e) = ask(&socket, &request) {
                tracing::warn!(error = %e, "the launcher did not cancel the session's cell");
            }
        }))
    }
    fn checkpoint(&mut self, image: &std::path::Path, go_on: bool) -> Result<(), LaunchError> {
        let _ = (image, go_on);
        Err(LaunchError::not_started(
            Reason::Unsupported,
            "this daemon runs its providers in a separate launcher (serving_user is set), which does not snapshot sessions yet: snapshots need a daemon without serving_user",
        ))
    }

    fn alive(&mut self) -> bool {
        matches!(
            self.ask(&LaunchRequest::Alive, Duration::ZERO, &mut |_| {}),
            Ok(LaunchAnswer::Done(Ok(())))
        )
    }
    fn close(mut self: Box<Self>) -> Result<(), CloseSessionError> {
        let closed = match self.ask(&LaunchRequest::Close, Duration::ZERO, &mut |_| {}) {
            Ok(LaunchAnswer::Done(r)) => r,
            Ok(other) => Err(broken(unexpected(&other))),
            Err(why) => Err(why),
        };
        closed.map_err(|why| CloseSessionError::Remove {
            run_id: self.run_id.clone(),
            cause: why.into(),
        })
    }
}

impl Drop for RemoteSession {
    /// The launcher ends the session when its connection ends (after a close it is gone
    /// already); the reader thread ends with it.
    fn drop(&mut self) {
        self.tx.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections given back are kept up to [`Kept::MAX`], the rest closed; taking gives
    /// the kept ones back until none is left.
    #[test]
    fn at_most_a_few_question_connections_are_kept() {
        let kept = Kept::default();
        let mut peers = Vec::new();
        for _ in 0..Kept::MAX + 2 {
            let (ours, theirs) = UnixStream::pair().unwrap();
            peers.push(theirs);
            kept.give_back(split(ours).unwrap());
        }
        let mut taken = 0;
        while kept.take().is_some() {
            taken += 1;
        }
        assert_eq!(taken, Kept::MAX);
    }
}
