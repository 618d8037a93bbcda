//! The launcher's side: the real providers, served to one uid.

use std::fmt;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;

use plimsoll_sandbox::{BrokerChannel, BrokerPort, OutputTap, Provider, RunningIn, error_chain};
use plimsoll_wire::Bytes;
use plimsoll_wire::launch::{
    Admitted, DescribedProvider, LaunchAnswer, LaunchEvent, LaunchRequest, MemberPlan,
    OpenedSession, Ran,
};

use super::conn::{Receiver, Sender, split};
use super::{
    Bounds, failure_to_wire, image_from_wire, member_from_wire, plan_from_wire, probed_to_wire,
};
use crate::providers::AnyProvider;

/// The providers, hosted for one peer uid.
pub struct Launcher {
    providers: Vec<AnyProvider>,
    bounds: Bounds,
    peer_uid: u32,
    /// The uids and ids of the sandboxes it has made and not yet removed: no plan may name
    /// one.
    held: std::sync::Mutex<HeldSet>,
    /// The cancellers of open sessions, by the token each was named by.
    cancellers: std::sync::Mutex<std::collections::HashMap<String, Arc<Canceller>>>,
    /// The evidence each provider was last probed or adopted on, by digest: an
    /// [`LaunchRequest::Admit`] names it by its SHA-256 instead of sending it whole.
    evidence: KnownEvidence,
    /// The grants file and the broker process, when there is a grants file.
    grants: Option<LauncherGrants>,
}

/// The split daemon's grants (docs/privileges.md, "The split daemon"): the launcher reads the
/// grants file and the secrets it names (from its own environment), starts the broker process
/// and keeps it running, and sends it each load. The serving process gets the file's text
/// (to authorize by) and a copy of the broker process's control socket (to start each run's
/// broker there), never a secret.
pub struct LauncherGrants {
    path: std::path::PathBuf,
    /// The values of the variables the grants file named when the daemon started, given
    /// by the daemon: what each load reads them from.
    secrets: Vec<(String, plimsoll_secret::Secret)>,
    apart: Arc<plimsoll_broker::apart::Apart>,
    /// The loads sent to the broker process, the newest last, a few kept: a broker process
    /// started again is sent the one a run starts under.
    loads: std::sync::Mutex<std::collections::VecDeque<Arc<plimsoll_broker::GrantsSource>>>,
    /// The newest load's generation and text (0 and nothing when it has no profile).
    current: std::sync::Mutex<(u64, String)>,
}

/// How many loads of the grants file the launcher keeps to send again.
const LOADS_KEPT: usize = 8;

impl fmt::Debug for LauncherGrants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LauncherGrants")
            .field("path", &self.path)
            .field("broker_pid", &self.apart.pid())
            .finish_non_exhaustive()
    }
}

impl LauncherGrants {
    /// Starts the broker process as `user` (it is started again whenever it ends) and sends
    /// it the grants file at `path`, its variables read from `secrets` (a file read again
    /// later may name only those). Fails, saying why, when the file does not load or the
    /// process cannot start.
    pub fn start(
        path: &std::path::Path,
        user: plimsoll_broker::apart::ProcessUser,
        secrets: Vec<(String, plimsoll_secret::Secret)>,
    ) -> Result<Self, String> {
        let apart = plimsoll_broker::apart::Apart::start(
            std::path::Path::new(plimsoll_broker::apart::OWN_PROGRAM),
            user,
        )
        .map_err(|e| format!("cannot start the broker process: {e}"))?;
        let grants = LauncherGrants {
            path: path.to_owned(),
            secrets,
            apart,
            loads: Default::default(),
            current: Default::default(),
        };
        grants.reload()?;
        Ok(grants)
    }

    /// The broker process's pid now (0 while it is being started again).
    pub fn broker_pid(&self) -> u32 {
        self.apart.pid()
    }

    /// Reads the file again, sends the load to the broker process, and makes it the newest.
    fn reload(&self) -> Result<(u64, String), String> {
        let profiles = plimsoll_broker::GrantProfiles::load(&self.path, |name| {
            self.secrets
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, value)| value.expose().clone())
        })
        .map_err(|e| error_chain(&e))?;
        let now = match profiles.source() {
            Some(source) => {
                self.apart
                    .load(source)
                    .map_err(|e| format!("the broker process did not take the load: {e}"))?;
                let mut loads = self.loads.lock().unwrap_or_else(|p| p.into_inner());
                loads.push_back(Arc::clone(source));
                if loads.len() > LOADS_KEPT {
                    loads.pop_front();
                }
                (source.generation(), source.text().to_owned())
            }
            None => (0, String::new()),
        };
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = now.clone();
        Ok(now)
    }

    /// Sends load `generation` again.
    fn load_again(&self, generation: u64) -> Result<(), String> {
        let source = self
            .loads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|s| s.generation() == generation)
            .cloned()
            .ok_or_else(|| {
                format!("no recent load of the grants file is generation {generation}")
            })?;
        self.apart
            .load(&source)
            .map_err(|e| format!("the broker process did not take the load: {e}"))
    }
}

impl fmt::Debug for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launcher")
            .field("providers", &self.providers)
            .field("bounds", &self.bounds)
            .field("peer_uid", &self.peer_uid)
            .finish_non_exhaustive()
    }
}

impl Launcher {
    /// Hosts `providers` for the process running as `peer_uid`, within `bounds`.
    pub fn new(providers: Vec<AnyProvider>, bounds: Bounds, peer_uid: u32) -> Self {
        Launcher {
            providers,
            bounds,
            peer_uid,
            held: Default::default(),
            cancellers: Default::default(),
            evidence: KnownEvidence::default(),
            grants: None,
        }
    }

    /// The launcher with the grants file and the broker process of `grants`.
    pub fn with_grants(self, grants: LauncherGrants) -> Self {
        Launcher {
            grants: Some(grants),
            ..self
        }
    }

    /// Serves every connection on `listener`, each on a thread of its own, until accepting
    /// fails.
    pub fn serve(self: Arc<Self>, listener: UnixListener) -> io::Result<()> {
        loop {
            let stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    continue;
                }
                // Out of descriptors or memory for now: the sandboxes it holds are still its
                // own to end, so it keeps serving once there is room again.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    ) =>
                {
                    tracing::error!(error = %e, "the launcher cannot accept a connection now");
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let me = Arc::clone(&self);
            let started = std::thread::Builder::new()
                .name("launch".into())
                .spawn(move || {
                    if let Err(e) = me.connection(stream) {
                        tracing::warn!(error = %e, "a launcher connection failed");
                    }
                });
            // No thread for it: that connection is dropped (its caller sees the launcher
            // gone), the launcher goes on.
            if let Err(e) = started {
                tracing::error!(error = %e, "the launcher cannot start a thread for a connection");
            }
        }
    }

    /// Answers `request` when it is a question (nothing is held for it after the answer):
    /// `Ok(false)` when it is not one.
    fn question(&self, request: &LaunchRequest, tx: &Sender) -> io::Result<bool> {
        let name = match request {
            LaunchRequest::Describe => {
                let described = self.providers.iter().map(describe).collect();
                answer(tx, LaunchAnswer::Described(described))?;
                return Ok(true);
            }
            LaunchRequest::CancelCell { token } => {
                let canceller = self
                    .cancellers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(token)
                    .cloned();
                match canceller {
                    Some(cancel) => {
                        cancel();
                        answer(tx, LaunchAnswer::Done(Ok(())))?;
                    }
                    None => refuse(tx, "no open session has that canceller".into())?,
                }
                return Ok(true);
            }
            LaunchRequest::Admit {
                spec,
                image,
                evidence_sha256,
            } => {
                let image = image.clone().map(image_from_wire);
                let admitted = self
                    .providers
                    .iter()
                    .map(|p| Admitted {
                        provider: p.name().to_owned(),
                        supports: p.supports(spec).map_err(|e| e.to_string()),
                        takes_image: image
                            .as_ref()
                            .map_or(Ok(()), |i| p.takes_image(i))
                            .map_err(|e| e.to_string()),
                        memory_floor: p.memory_floor(spec),
                        holds: evidence_sha256
                            .get(p.name())
                            .and_then(|sha| self.evidence.find(p.name(), sha))
                            .map(|e| p.environment_holds(&e).map_err(|e| e.to_string())),
                    })
                    .collect();
                answer(tx, LaunchAnswer::Admitted(admitted))?;
                return Ok(true);
            }
            LaunchRequest::Grants { .. }
            | LaunchRequest::LoadGrants { .. }
            | LaunchRequest::BrokerControl => {
                self.grants_question(request, tx)?;
                return Ok(true);
            }
            LaunchRequest::Supports { provider, .. }
            | LaunchRequest::TakesImage { provider, .. }
            | LaunchRequest::MemoryFloor { provider, .. }
            | LaunchRequest::Probe { provider }
            | LaunchRequest::Adopt { provider, .. }
            | LaunchRequest::EnvironmentHolds { provider, .. }
            | LaunchRequest::Cancel { provider, .. } => provider,
            _ => return Ok(false),
        };
        let Some(provider) = self.providers.iter().find(|p| p.name() == name) else {
            refuse(tx, format!("no provider `{name}` here"))?;
            return Ok(true);
        };
        let said = |r: Result<(), String>| LaunchAnswer::Done(r);
        let a = match request {
            LaunchRequest::Supports { spec, .. } => {
                said(provider.supports(spec).map_err(|e| e.to_string()))
            }
            LaunchRequest::TakesImage { image, .. } => said(
                provider
                    .takes_image(&image_from_wire(image.clone()))
                    .map_err(|e| e.to_string()),
            ),
            LaunchRequest::MemoryFloor { spec, .. } => {
                LaunchAnswer::Floor(provider.memory_floor(spec))
            }
            LaunchRequest::Probe { .. } => {
                let probed = provider.probe();
                self.evidence.keep(name, &probed.evidence);
                LaunchAnswer::Probed(probed_to_wire(probed))
            }
            LaunchRequest::Adopt { evidence, .. } => {
                let adopted = provider.adopt(evidence);
                if adopted.is_ok() {
                    self.evidence.keep(name, evidence);
                }
                said(adopted.map_err(|e| e.to_string()))
            }
            LaunchRequest::EnvironmentHolds { evidence, .. } => {
                self.evidence.keep(name, evidence);
                said(
                    provider
                        .environment_holds(evidence)
                        .map_err(|e| e.to_string()),
                )
            }
            LaunchRequest::Cancel { id, uid, .. } => match self.bounds.check_sandbox(id, *uid) {
                Err(why) => LaunchAnswer::Refused(format!("a cancel outside the settings: {why}")),
                Ok(()) => said(
                    provider
                        .cancel(&RunningIn {
                            id: id.clone(),
                            uid: *uid,
                        })
                        .map_err(|e| error_chain(&e)),
                ),
            },
            _ => unreachable!("only questions reach here"),
        };
        answer(tx, a)?;
        Ok(true)
    }

    /// A question about the grants: refused when the launcher has no grants file.
    fn grants_question(&self, request: &LaunchRequest, tx: &Sender) -> io::Result<()> {
        let Some(grants) = &self.grants else {
            return refuse(
                tx,
                "the launcher has no grants file (give plimsolld --grants or set grants_file)"
                    .into(),
            );
        };
        match request {
            LaunchRequest::Grants { reload } => {
                let now = if *reload {
                    grants.reload()
                } else {
                    Ok(grants
                        .current
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone())
                };
                match now {
                    Ok((generation, text)) => answer(tx, LaunchAnswer::Grants { generation, text }),
                    Err(why) => answer(tx, LaunchAnswer::Done(Err(why))),
                }
            }
            LaunchRequest::LoadGrants { generation } => {
                answer(tx, LaunchAnswer::Done(grants.load_again(*generation)))
            }
            LaunchRequest::BrokerControl => match grants.apart.control_copy() {
                Ok(fd) => tx.send(
                    &LaunchEvent::Answer(Box::new(LaunchAnswer::Done(Ok(())))),
                    Some(fd.as_fd()),
                ),
                Err(e) => answer(
                    tx,
                    LaunchAnswer::Done(Err(format!("the broker process is not running: {e}"))),
                ),
            },
            _ => unreachable!("only the grants' questions reach here"),
        }
    }

    fn connection(&self, stream: UnixStream) -> io::Result<()> {
        let peer = rustix::net::sockopt::socket_peercred(stream.as_fd())?;
        let (tx, mut rx) = split(stream)?;
        let uid = peer.uid.as_raw();
        if uid != self.peer_uid {
            return refuse(
                &tx,
                format!(
                    "uid {uid} (pid {}) is not the serving process's uid {}: the launcher takes requests from it alone",
                    peer.pid.as_raw_nonzero(),
                    self.peer_uid
                ),
            );
        }
        // Questions are answered one after another on one connection, for as long as the
        // caller keeps it; a run, a member or a session takes the connection for itself.
        let request = loop {
            let request: LaunchRequest = match rx.recv() {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(()),
                Err(e) => return refuse(&tx, format!("a request the launcher cannot read: {e}")),
            };
            if !self.question(&request, &tx)? {
                break request;
            }
        };
        let name = match &request {
            LaunchRequest::Run { provider, .. }
            | LaunchRequest::Warm { provider, .. }
            | LaunchRequest::OpenSession { provider, .. } => provider.clone(),
            _ => {
                return refuse(
                    &tx,
                    "a request for a sandbox this connection does not hold".into(),
                );
            }
        };
        let Some(provider) = self.providers.iter().find(|p| p.name() == name) else {
            return refuse(&tx, format!("no provider `{name}` here"));
        };
        match request {
            LaunchRequest::Run { plan, .. } => {
                if let Err(why) = self.bounds.check(&plan) {
                    return refuse(&tx, format!("a plan outside the settings: {why}"));
                }
                let Some(held) = self.hold(&plan.run_id, &[plan.uid, plan.controller_uid]) else {
                    return refuse(
                        &tx,
                        held_by_another(&plan.run_id, plan.uid, plan.controller_uid),
                    );
                };
                self.run(provider, plan, held, tx, rx)
            }
            LaunchRequest::Warm { plan, .. } => {
                if let Err(why) = self.bounds.check_member(&plan) {
                    return refuse(&tx, format!("a member plan outside the settings: {why}"));
                }
                let Some(held) = self.hold(&plan.member_id, &[plan.uid]) else {
                    return refuse(&tx, held_by_another(&plan.member_id, plan.uid, plan.uid));
                };
                self.member(provider, plan, held, tx, rx)
            }
            LaunchRequest::OpenSession {
                plan, lifetime_ms, ..
            } => {
                if let Err(why) = self.bounds.check(&plan) {
                    return refuse(&tx, format!("a session plan outside the settings: {why}"));
                }
                let Some(held) = self.hold(&plan.run_id, &[plan.uid, plan.controller_uid]) else {
                    return refuse(
                        &tx,
                        held_by_another(&plan.run_id, plan.uid, plan.controller_uid),
                    );
                };
                self.session(provider, plan, lifetime_ms, held, tx, rx)
            }
            _ => unreachable!("answered or refused above"),
        }
    }

    /// Holds sandbox `id` and its `uids` until the guard drops (after its removal); `None`
    /// when another sandbox of this launcher holds the id or one of the uids.
    ///
    /// When its peer is not root, the launcher also takes the host-wide lease on each uid
    /// (`plimsoll_sandbox::uidlease`, in the directory only root may write) that a root
    /// engine takes itself, so that no other engine on the host runs as one of them.
    fn hold(&self, id: &str, uids: &[u32]) -> Option<Held<'_>> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.ids.contains(id) || uids.iter().any(|u| held.uids.contains(u)) {
            return None;
        }
        let mut leases = Vec::new();
        if self.peer_uid != 0 {
            let dir = std::path::Path::new(plimsoll_sandbox::uidlease::ROOT_LEASE_DIR);
            for &uid in uids {
                match plimsoll_sandbox::try_lease(dir, uid) {
                    Ok(Some(lease)) => leases.push(lease),
                    Ok(None) => return None,
                    Err(e) => {
                        tracing::warn!(uid, error = %e, "the launcher cannot lease a uid");
                        return None;
                    }
                }
            }
        }
        held.ids.insert(id.to_owned());
        held.uids.extend(uids);
        Some(Held {
            launcher: self,
            id: id.to_owned(),
            uids: uids.to_vec(),
            _leases: leases,
        })
    }

    fn run(
        &self,
        provider: &AnyProvider,
        plan: plimsoll_wire::launch::Plan,
        held: Held<'_>,
        tx: Sender,
        rx: Receiver,
    ) -> io::Result<()> {
        let tx = Arc::new(tx);
        let plan = with_ends(plan, &tx);
        let ran = provider.run_then_tear_down(&plan);
        answer_ran(ran, held, &tx, rx)
    }

    /// Makes a member and holds it for as long as the connection asks nothing else: its one
    /// run, or its discard; the connection closing discards it.
    fn member(
        &self,
        provider: &AnyProvider,
        plan: MemberPlan,
        held: Held<'_>,
        tx: Sender,
        mut rx: Receiver,
    ) -> io::Result<()> {
        let member = match provider.warm(&member_from_wire(plan)) {
            Ok(member) => member,
            Err(e) => {
                drop(held);
                return answer(&tx, LaunchAnswer::Warmed(Err(failure_to_wire(&e))));
            }
        };
        let sent = answer(&tx, LaunchAnswer::Warmed(Ok(member.uid())));
        let next = match sent {
            Ok(()) => rx.recv::<LaunchRequest>(),
            Err(e) => Err(e),
        };
        match next {
            Ok(Some(LaunchRequest::Run { plan, .. })) => {
                if let Err(why) = self.bounds.check(&plan) {
                    let gone = member.discard().map_err(|e| error_chain(&*e));
                    drop(held);
                    return refuse(
                        &tx,
                        format!(
                            "a plan outside the settings: {why} (the member is discarded{})",
                            gone.err()
                                .map(|e| format!(", and that failed: {e}"))
                                .unwrap_or_default()
                        ),
                    );
                }
                let tx = Arc::new(tx);
                let plan = with_ends(plan, &tx);
                let ran = member.run(&plan).map(|(o, t)| (o, Some(t)));
                answer_ran(ran, held, &tx, rx)
            }
            Ok(Some(LaunchRequest::Discard)) => {
                let done = member.discard().map_err(|e| error_chain(&*e));
                drop(held);
                answer(&tx, LaunchAnswer::Done(done))
            }
            other => {
                // The caller is gone, or asked what a member does not do: it is destroyed.
                let done = member.discard();
                drop(held);
                if let Ok(Some(_)) = other {
                    refuse(&tx, "a member takes one run or a discard".into())?;
                }
                done.map_err(|e| io::Error::other(error_chain(&*e)))
            }
        }
    }
}

impl Launcher {
    /// Opens a session's sandbox and serves its calls until the caller closes it or goes
    /// away; either way its processes end and everything of it is removed.
    fn session(
        &self,
        provider: &AnyProvider,
        plan: plimsoll_wire::launch::Plan,
        lifetime_ms: u64,
        held: Held<'_>,
        tx: Sender,
        mut rx: Receiver,
    ) -> io::Result<()> {
        let tx = Arc::new(tx);
        let plan = with_ends(plan, &tx);
        let lifetime = std::time::Duration::from_millis(lifetime_ms);
        let mut sandbox = match provider.open_session(&plan, lifetime) {
            Ok(s) => s,
            Err(e) => {
                drop(held);
                return answer(&tx, LaunchAnswer::Opened(Err(failure_to_wire(&e))));
            }
        };
        let token = sandbox.canceller().map(|cancel| {
            let token = hex::encode(rand::random::<[u8; 16]>());
            self.cancellers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(token.clone(), Arc::new(cancel));
            token
        });
        let opened = OpenedSession {
            uid: sandbox.uid(),
            wall: sandbox.wall_at_open().clone(),
            cancel_token: token.clone(),
        };
        let mut served = answer(&tx, LaunchAnswer::Opened(Ok(opened)));
        let mut closed = None;
        while served.is_ok() {
            let said = match rx.recv::<LaunchRequest>() {
                Ok(Some(LaunchRequest::Call { call, within_ms })) => {
                    let within = std::time::Duration::from_millis(within_ms);
                    let called = sandbox.call(&call, within, &mut |chunk| {
                        let _ = tx.send(&LaunchEvent::Chunk(chunk), None);
                    });
                    LaunchAnswer::Called(called.map_err(|e| failure_to_wire(&e)))
                }
                Ok(Some(LaunchRequest::WallNow)) => {
                    LaunchAnswer::Walled(sandbox.wall_now().map_err(|e| failure_to_wire(&e)))
                }
                Ok(Some(LaunchRequest::Alive)) => LaunchAnswer::Done(if sandbox.alive() {
                    Ok(())
                } else {
                    Err("the session's sandbox is gone".into())
                }),
                Ok(Some(LaunchRequest::Close)) => {
                    closed = Some(());
                    break;
                }
                Ok(Some(_)) => LaunchAnswer::Refused(
                    "a session takes calls, its wall, whether it is alive, and its close".into(),
                ),
                // The caller is gone: the session ends with it.
                Ok(None) | Err(_) => break,
            };
            served = answer(&tx, said);
        }
        if let Some(token) = token {
            self.cancellers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&token);
        }
        let removed = sandbox.close().map_err(|e| error_chain(&e));
        drop(held);
        if closed.is_some() {
            return answer(&tx, LaunchAnswer::Done(removed));
        }
        removed.map_err(io::Error::other).and(served)
    }
}

/// What a session's sandbox gives to cancel its cell.
type Canceller = plimsoll_sandbox::session::Canceller;

/// The provider's plan with the launcher's own ends: the broker channel's, whose streams and
/// listeners go back to the caller, and the tap's, whose output does.
fn with_ends(plan: plimsoll_wire::launch::Plan, tx: &Arc<Sender>) -> plimsoll_sandbox::LaunchPlan {
    let broker = plan.broker.map(|b| {
        BrokerChannel::new(Arc::new(Relay {
            tx: Arc::clone(tx),
            egress: b.egress,
        }))
    });
    let tap = plan.tap.then(|| {
        let tx = Arc::clone(tx);
        OutputTap::new(move |stream, offset, bytes| {
            let _ = tx.send(
                &LaunchEvent::Output {
                    stream,
                    offset,
                    bytes: Bytes(bytes.to_vec()),
                },
                None,
            );
        })
    });
    plan_from_wire(plan, broker, tap)
}

/// Answers a run; when its removal was deferred, waits for the caller to ask for it (or to
/// go away) and removes it. What the sandbox held is given back before the last answer, so
/// the caller may use its uids again as soon as it has that answer.
fn answer_ran(
    ran: Result<
        (
            plimsoll_sandbox::Outcome,
            Option<plimsoll_sandbox::Teardown>,
        ),
        plimsoll_sandbox::LaunchError,
    >,
    held: Held<'_>,
    tx: &Sender,
    mut rx: Receiver,
) -> io::Result<()> {
    let (outcome, teardown) = match ran {
        Ok(done) => done,
        Err(e) => {
            drop(held);
            return answer(tx, LaunchAnswer::Ran(Err(failure_to_wire(&e))));
        }
    };
    let ran = Ran {
        result: outcome.result,
        started_unix_ms: outcome.started_unix_ms,
        ended_unix_ms: outcome.ended_unix_ms,
        teardown: teardown.is_some(),
    };
    let Some(teardown) = teardown else {
        drop(held);
        return answer(tx, LaunchAnswer::Ran(Ok(ran)));
    };
    let sent = answer(tx, LaunchAnswer::Ran(Ok(ran)));
    // Whatever comes next (the teardown asked for, or the caller gone), the sandbox is
    // removed: nothing of it is left behind.
    let _ = rx.recv::<LaunchRequest>();
    let done = teardown.run().map_err(|e| error_chain(&*e));
    drop(held);
    answer(tx, LaunchAnswer::Done(done))?;
    sent
}

/// What the launcher's live sandboxes hold.
#[derive(Debug, Default)]
struct HeldSet {
    ids: std::collections::HashSet<String>,
    uids: std::collections::HashSet<u32>,
}

/// The id and uids one sandbox of the launcher holds, given back when it is removed.
struct Held<'a> {
    launcher: &'a Launcher,
    id: String,
    uids: Vec<u32>,
    /// The host-wide leases taken for a peer that is not root.
    _leases: Vec<plimsoll_sandbox::UidLease>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut held = self.launcher.held.lock().unwrap_or_else(|p| p.into_inner());
        held.ids.remove(&self.id);
        for u in &self.uids {
            held.uids.remove(u);
        }
    }
}

fn held_by_another(id: &str, uid: u32, controller_uid: u32) -> String {
    format!(
        "a plan outside the settings: sandbox {id}, uid {uid} or uid {controller_uid} is held by another sandbox of this launcher (not yet removed) or another engine on this host"
    )
}

fn describe(p: &AnyProvider) -> DescribedProvider {
    DescribedProvider {
        name: p.name().to_owned(),
        nominal_tier: p.nominal_tier(),
        cost: p.cost(),
        uses_image: p.uses_image(),
        supports_broker: p.supports_broker(),
        supports_egress: p.supports_egress(),
        warms: p.warms(),
        opens_sessions: p.opens_sessions(),
    }
}

fn answer(tx: &Sender, a: LaunchAnswer) -> io::Result<()> {
    tx.send(&LaunchEvent::Answer(Box::new(a)), None)
}

fn refuse(tx: &Sender, why: String) -> io::Result<()> {
    tracing::warn!(%why, "the launcher refused a request");
    answer(tx, LaunchAnswer::Refused(why))
}

/// The run's broker channel as the launcher's provider sees it: every end it makes is sent
/// back to the caller, whose broker serves it.
struct Relay {
    tx: Arc<Sender>,
    egress: bool,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("egress", &self.egress)
            .finish()
    }
}

impl BrokerPort for Relay {
    fn serve_stream(&self, stream: UnixStream) -> io::Result<()> {
        self.tx
            .send(&LaunchEvent::BrokerStream, Some(stream.as_fd()))
    }
    fn serve_listener(&self, listener: UnixListener) -> io::Result<()> {
        self.tx
            .send(&LaunchEvent::BrokerListener, Some(listener.as_fd()))
    }
    fn egress(&self) -> bool {
        self.egress
    }
}

/// Evidence the launcher has seen per provider (from its probes, adoptions and checks), the
/// newest few, found by SHA-256; shared, so an admission's check copies none of it.
#[derive(Default)]
struct KnownEvidence(std::sync::Mutex<std::collections::HashMap<String, Vec<Known>>>);

/// One evidence kept: its SHA-256, and it.
type Known = (String, Arc<plimsoll_wire::Evidence>);

impl KnownEvidence {
    /// Kept per provider; an engine offers each provider on one evidence at a time.
    const PER_PROVIDER: usize = 4;

    fn keep(&self, provider: &str, evidence: &plimsoll_wire::Evidence) {
        let sha = plimsoll_wire::digest::evidence_sha256(evidence);
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let list = known.entry(provider.to_owned()).or_default();
        list.retain(|(s, _)| *s != sha);
        list.push((sha, Arc::new(evidence.clone())));
        if list.len() > Self::PER_PROVIDER {
            list.remove(0);
        }
    }

    fn find(&self, provider: &str, sha: &str) -> Option<Arc<plimsoll_wire::Evidence>> {
        let known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        known
            .get(provider)?
            .iter()
            .find(|(s, _)| s == sha)
            .map(|(_, e)| Arc::clone(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(environment: &str) -> plimsoll_wire::Evidence {
        plimsoll_wire::Evidence {
            provider: "crun".into(),
            isolation: plimsoll_wire::Tier::Container,
            config: Default::default(),
            binaries: Vec::new(),
            probe: None,
            checks: Default::default(),
            environment: environment.into(),
            checked_unix_ms: 1,
        }
    }

    /// Evidence is found by its digest and provider; the newest four per provider are kept,
    /// the oldest dropped first, and keeping one again makes it the newest.
    #[test]
    fn known_evidence_keeps_the_newest_few_per_provider() {
        let known = KnownEvidence::default();
        let sha = |e: &plimsoll_wire::Evidence| plimsoll_wire::digest::evidence_sha256(e);
        let all: Vec<_> = (0..6).map(|i| evidence(&format!("image {i}"))).collect();
        for e in &all[..4] {
            known.keep("crun", e);
        }
        assert_eq!(known.find("crun", &sha(&all[0])).as_deref(), Some(&all[0]));
        assert_eq!(
            known.find("runc", &sha(&all[0])),
            None,
            "another provider's"
        );
        known.keep("crun", &all[0]);
        known.keep("crun", &all[4]);
        known.keep("crun", &all[5]);
        let kept: Vec<bool> = all
            .iter()
            .map(|e| known.find("crun", &sha(e)).is_some())
            .collect();
        assert_eq!(kept, [true, false, false, true, true, true]);
    }
}
