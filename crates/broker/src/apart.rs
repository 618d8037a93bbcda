//! The broker in a process of its own (docs/privileges.md).
//!
//! The broker makes outbound calls with an operator's credentials and parses every byte a
//! sandbox sends it (API frames, HTTP heads, TLS ClientHellos). In the daemon it runs in a
//! process apart: an unprivileged uid of its own, no capability, `no_new_privs`, not
//! dumpable, under the seccomp allowlist of [`crate::apart::filter`], holding nothing of the
//! daemon's but one socket. A bug there reaches the network the grants name and the runs'
//! channels, not root, the launcher or another process's memory.
//!
//! Both sides are here. The daemon's side is [`Apart`] (the process, started and kept
//! running by a keeper thread) and [`RemoteBroker`] (one run's broker there, a
//! [`BrokerPort`] the providers serve as they would the broker itself). The process's side
//! is [`child_main`].
//!
//! The control socket (a `SOCK_SEQPACKET` pair, the process's end at [`CONTROL_FD`]) carries
//! one message per operation: a byte and, as `SCM_RIGHTS`, a fresh stream for the operation
//! and what it hands over (a run's connected channel or its listener). The request and its
//! answer are frames on that stream, so the control socket is never held for an answer and
//! operations on many runs go on at once.
//!
//! Operations: `grants` (a load of the grants file: its text and the variables it named, so
//! the process loads the same profiles the daemon authorized against, whatever the file says
//! now), `start` (a run's broker under a grant; answered `unknown_generation` when that load
//! was never sent, and the daemon sends it and asks again), `stream` and `listener` (serve a
//! channel), `drain` and `finish` (the calls and receipts so far; `finish` ends the broker).

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use plimsoll_sandbox::BrokerPort;
use plimsoll_wire::{EgressReceipt, GrantCall};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType, recvmsg, sendmsg, socketpair,
};
use serde_json::{Value, json};

use crate::frame::{read_frame, write_frame};
use crate::profile::GrantsSource;
use crate::{Broker, Finished, Grant, GrantProfiles};

pub mod filter;

/// The descriptor number at which the broker process holds its control socket.
pub const CONTROL_FD: RawFd = 3;

/// The first argument that makes plimsolld the broker process instead of the daemon.
pub const BROKER_PROCESS_ARG: &str = "broker-process";

/// Largest frame on an operation's stream (a grants file's text is the largest).
const MAX_FRAME: u32 = 4 * 1024 * 1024;

/// How long the daemon waits for an answer to an operation that does not wait for a run
/// (`finish` waits for the run's connections, each bounded by the run's deadline).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The user the broker process runs as unless the daemon's settings name another
/// (`[daemon] broker_user`).
pub const DEFAULT_USER: &str = "plimsoll-broker";

/// Who the broker process runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessUser {
    /// Its uid, never 0.
    pub uid: u32,
    /// Its gid, never 0.
    pub gid: u32,
}

impl ProcessUser {
    /// The uid and gid of system user `name`, from /etc/passwd (not a directory service);
    /// what is wrong otherwise: absent, unreadable, or root.
    pub fn lookup(name: &str) -> Result<ProcessUser, String> {
        let passwd = std::fs::read_to_string("/etc/passwd")
            .map_err(|e| format!("and /etc/passwd cannot be read ({e})"))?;
        let (uid, gid) = passwd
            .lines()
            .filter_map(|l| {
                let mut f = l.split(':');
                let (user, _, uid, gid) = (f.next()?, f.next()?, f.next()?, f.next()?);
                (user == name).then(|| Some((uid.parse::<u32>().ok()?, gid.parse::<u32>().ok()?)))
            })
            .next()
            .ok_or("which this host does not have")?
            .ok_or("whose /etc/passwd line cannot be read")?;
        if uid == 0 || gid == 0 {
            return Err("which is root (uid or gid 0)".into());
        }
        Ok(ProcessUser { uid, gid })
    }
}

/// The broker process, as the daemon holds it: started at once, and started again by its
/// keeper thread whenever it ends (runs whose broker was in the ended process lose their
/// calls and receipts, and say so in the daemon's log).
#[derive(Debug)]
pub struct Apart {
    shared: Arc<Shared>,
}

/// Where an [`Apart`] that did not start the broker process gets its control socket and has
/// a load of the grants file sent: the split daemon's serving process asks its launcher, which
/// started the process, keeps it running and holds the secrets ([`Apart::remote`]).
pub trait ControlSource: std::fmt::Debug + Send + Sync {
    /// A copy of the control socket of the broker process running now.
    fn control(&self) -> io::Result<OwnedFd>;
    /// Has load `generation` of the grants file sent to the broker process.
    fn load(&self, generation: u64) -> io::Result<()>;
}

#[derive(Debug)]
struct Shared {
    /// The control socket of the process running now, and how many processes came before.
    control: Mutex<Option<(OwnedFd, u64)>>,
    /// Where the control socket comes from when another process keeps the broker process.
    source: Option<Arc<dyn ControlSource>>,
    changed: Condvar,
    /// Its pid, for tests and the log.
    pid: AtomicU64,
    next_id: AtomicU64,
    stopping: std::sync::atomic::AtomicBool,
}

impl Apart {
    /// Starts `program` (plimsolld itself, given [`BROKER_PROCESS_ARG`]) as `user`, and a
    /// thread that keeps it running. Returns once the first process is up, or why it could
    /// not start.
    pub fn start(program: &Path, user: ProcessUser) -> io::Result<Arc<Apart>> {
        if user.uid == 0 || user.gid == 0 {
            return Err(io::Error::other(
                "the broker process may not run as root: name an unprivileged user",
            ));
        }
        let shared = Arc::new(Shared {
            control: Mutex::new(None),
            source: None,
            changed: Condvar::new(),
            pid: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            stopping: std::sync::atomic::AtomicBool::new(false),
        });
        let (first_tx, first_rx) = std::sync::mpsc::channel::<io::Result<()>>();
        let keeper = Arc::clone(&shared);
        let program = program.to_owned();
        std::thread::Builder::new()
            .name("broker-keeper".into())
            .spawn(move || keep(&keeper, &program, user, first_tx))?;
        match first_rx.recv() {
            Ok(Ok(())) => Ok(Arc::new(Apart { shared })),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::other("the broker keeper thread ended")),
        }
    }

    /// The broker process another process started and keeps running, reached through the
    /// control socket `source` gives (asked again whenever the one held fails: the process was
    /// started again). Loads of the grants file are that process's to send: this side never
    /// holds a secret.
    pub fn remote(source: Arc<dyn ControlSource>) -> Arc<Apart> {
        Arc::new(Apart {
            shared: Arc::new(Shared {
                control: Mutex::new(None),
                source: Some(source),
                changed: Condvar::new(),
                pid: AtomicU64::new(0),
                next_id: AtomicU64::new(1),
                stopping: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// A copy of the control socket of the broker process running now, for a process that
    /// reaches it through [`Apart::remote`].
    pub fn control_copy(&self) -> io::Result<OwnedFd> {
        let control = self.control_now()?;
        let (fd, _) = control.as_ref().expect("control_now waits for one");
        fd.try_clone()
    }

    /// Sends `source`, a load of the grants file, to the broker process (which keeps the
    /// last few), so runs can start under it.
    pub fn load(&self, source: &GrantsSource) -> io::Result<()> {
        self.send_grants(source)
    }

    /// The pid of the broker process running now (0 while none is, and for a process this
    /// one did not start).
    pub fn pid(&self) -> u32 {
        self.shared.pid.load(Ordering::SeqCst) as u32
    }

    /// The broker of run `run_id` by `caller` under `grant`, in the broker process.
    pub fn start_broker(
        self: &Arc<Self>,
        grant: Grant,
        caller: &str,
        run_id: &str,
        budget: Duration,
    ) -> io::Result<RemoteBroker> {
        let source = grant.source().cloned().ok_or_else(|| {
            io::Error::other("this grant was not loaded from a grants file, so the broker process cannot load it")
        })?;
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let start = json!({
            "op": "start",
            "id": id,
            "generation": source.generation(),
            "grant": grant.name(),
            "caller": caller,
            "run_id": run_id,
            "budget_ms": u64::try_from(budget.as_millis()).unwrap_or(u64::MAX),
        });
        let answer = match self.call(&start, None) {
            Err(e) if e.to_string() == "unknown_generation" => {
                match &self.shared.source {
                    Some(keeper) => keeper.load(source.generation())?,
                    None => self.send_grants(&source)?,
                }
                self.call(&start, None)?
            }
            other => other?,
        };
        let egress = answer["egress"].as_bool().unwrap_or(false);
        Ok(RemoteBroker {
            apart: Arc::clone(self),
            id,
            grant,
            egress,
            finished: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn send_grants(&self, source: &GrantsSource) -> io::Result<()> {
        let env: serde_json::Map<String, Value> = source
            .env()
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.expose().clone())))
            .collect();
        self.call(
            &json!({
                "op": "grants",
                "generation": source.generation(),
                "text": source.text(),
                "env": env,
            }),
            None,
        )
        .map(drop)
    }

    /// One operation: its stream (and `handed`) over the control socket, the request on the
    /// stream, the answer read back. An answer `{"error": ...}` is an error of that text.
    fn call(&self, request: &Value, handed: Option<BorrowedFd<'_>>) -> io::Result<Value> {
        let (mine, theirs) = socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )?;
        {
            let mut control = self.control_now()?;
            let (fd, _) = control.as_ref().expect("control_now waits for one");
            let sent = send_fds(fd, theirs.as_fd(), handed);
            match (sent, &self.shared.source) {
                (Ok(()), _) => {}
                // The process it reached has ended; the keeper started another: its socket,
                // once.
                (Err(_), Some(source)) => {
                    let fresh = source.control()?;
                    send_fds(&fresh, theirs.as_fd(), handed)?;
                    *control = Some((fresh, 0));
                }
                (Err(e), None) => return Err(e),
            }
        }
        drop(theirs);
        let mut stream = UnixStream::from(mine);
        let finishing = request["op"] == "finish";
        stream.set_read_timeout((!finishing).then_some(ANSWER_TIMEOUT))?;
        write_frame(&mut stream, request)?;
        let answer = read_frame(&mut stream, MAX_FRAME)
            .map_err(|e| io::Error::other(format!("reading the broker process's answer: {e:?}")))?
            .ok_or_else(|| {
                io::Error::other("the broker process closed the operation unanswered")
            })?;
        let answer: Value = serde_json::from_slice(&answer).map_err(|e| {
            io::Error::other(format!("the broker process's answer is not JSON: {e}"))
        })?;
        match answer.get("error").and_then(Value::as_str) {
            Some(e) => Err(io::Error::other(e.to_owned())),
            None => Ok(answer),
        }
    }

    /// The control socket, waiting up to a few seconds for the keeper to start a process
    /// (asked of the source, for a process another keeps).
    fn control_now(&self) -> io::Result<MutexGuard<'_, Option<(OwnedFd, u64)>>> {
        let mut guard = lock(&self.shared.control);
        if let Some(source) = &self.shared.source {
            if guard.is_none() {
                *guard = Some((source.control()?, 0));
            }
            return Ok(guard);
        }
        let (guard, _) = self
            .shared
            .changed
            .wait_timeout_while(guard, Duration::from_secs(5), |c| c.is_none())
            .unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            return Err(io::Error::other(
                "the broker process is not running (see the daemon's log for why it ended)",
            ));
        }
        Ok(guard)
    }
}

impl Drop for Apart {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Closing the control socket ends the process; the keeper sees it and stops.
        lock(&self.shared.control).take();
    }
}

/// The keeper: starts the process, forwards its log lines, waits for it, and starts it again
/// (after a pause that grows while it keeps dying young) until the daemon drops [`Apart`].
fn keep(
    shared: &Arc<Shared>,
    program: &Path,
    user: ProcessUser,
    first: std::sync::mpsc::Sender<io::Result<()>>,
) {
    let mut first = Some(first);
    let mut pause = Duration::from_millis(100);
    let mut incarnation = 0u64;
    loop {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let started = std::time::Instant::now();
        match spawn_process(program, user) {
            Ok((running, control)) => {
                incarnation += 1;
                shared
                    .pid
                    .store(u64::from(running.child.id()), Ordering::SeqCst);
                *lock(&shared.control) = Some((control, incarnation));
                shared.changed.notify_all();
                if let Some(f) = first.take() {
                    let _ = f.send(Ok(()));
                }
                tracing::info!(
                    pid = running.child.id(),
                    uid = user.uid,
                    "broker process started"
                );
                let status = forward_log_and_wait(running);
                shared.pid.store(0, Ordering::SeqCst);
                lock(&shared.control).take();
                if shared.stopping.load(Ordering::SeqCst) {
                    return;
                }
                tracing::error!(status = %status, "the broker process ended: runs whose broker it held lose their calls and receipts; starting it again");
            }
            Err(e) => {
                if let Some(f) = first.take() {
                    let _ = f.send(Err(e));
                    return;
                }
                tracing::error!(error = %e, "cannot start the broker process again");
            }
        }
        pause = if started.elapsed() > Duration::from_secs(10) {
            Duration::from_millis(100)
        } else {
            (pause * 2).min(Duration::from_secs(5))
        };
        std::thread::sleep(pause);
    }
}

fn spawn_process(
    program: &Path,
    user: ProcessUser,
) -> io::Result<(plimsoll_sandbox::spawn::Running, OwnedFd)> {
    use plimsoll_sys::exec::{PreExec, Step};
    let (mine, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let steps = PreExec::new()
        .become_user(user.uid, user.gid)
        .step("no capabilities", Step::SetCapabilities(0))
        .step("no core dumps", Step::no_core_dumps())
        .step(
            "die with the keeper",
            Step::ParentDeathSignal(rustix::process::Signal::KILL),
        )
        .step(
            "the keeper is still there",
            Step::RequireParent(rustix::process::getpid()),
        )
        .step(
            "control socket",
            Step::PlaceFd {
                fd: theirs,
                at: CONTROL_FD,
            },
        );
    let running = plimsoll_sandbox::spawn::Spawn::new(program, Path::new("/"))
        .arg(BROKER_PROCESS_ARG)
        .before_exec(steps)
        .spawn()
        .map_err(|e| io::Error::other(plimsoll_sandbox::error_chain(&e)))?;
    Ok((running, mine))
}

/// Copies the process's log lines (standard error; it writes nothing else) to the daemon's
/// standard error, then reaps it.
fn forward_log_and_wait(mut running: plimsoll_sandbox::spawn::Running) -> String {
    use std::io::{BufRead, Write};
    let stderr = io::BufReader::new(&mut running.stderr);
    for line in stderr.split(b'\n') {
        let Ok(line) = line else { break };
        let mut err = io::stderr().lock();
        let _ = err.write_all(&line);
        let _ = err.write_all(b"\n");
    }
    match running.child.wait() {
        Ok(s) => s.to_string(),
        Err(e) => e.to_string(),
    }
}

/// One run's broker in the broker process: the providers serve its channel through
/// [`BrokerPort`]; [`RemoteBroker::finish`] ends it.
#[derive(Debug)]
pub struct RemoteBroker {
    apart: Arc<Apart>,
    id: u64,
    grant: Grant,
    egress: bool,
    finished: std::sync::atomic::AtomicBool,
}

impl RemoteBroker {
    /// The grant.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// As [`Broker::finish`]. When the broker process cannot answer (it ended), the daemon's
    /// log says so and nothing is listed.
    pub fn finish(&self) -> Finished {
        self.finished.store(true, Ordering::SeqCst);
        self.collect("finish")
    }

    /// As [`Broker::drain`].
    pub fn drain(&self) -> Finished {
        self.collect("drain")
    }

    fn collect(&self, op: &str) -> Finished {
        match self
            .apart
            .call(&json!({"op": op, "id": self.id}), None)
            .and_then(|a| finished_from_value(&a))
        {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(broker = self.id, grant = self.grant.name(), error = %e, "the broker process did not list this run's calls and receipts: they are lost");
                Finished::default()
            }
        }
    }
}

impl Drop for RemoteBroker {
    fn drop(&mut self) {
        if !self.finished.load(Ordering::SeqCst) {
            // A broker dropped unfinished (its run failed before the end) still ends there.
            let _ = self
                .apart
                .call(&json!({"op": "finish", "id": self.id}), None);
        }
    }
}

impl BrokerPort for RemoteBroker {
    fn serve_stream(&self, stream: UnixStream) -> io::Result<()> {
        self.apart
            .call(
                &json!({"op": "stream", "id": self.id}),
                Some(stream.as_fd()),
            )
            .map(drop)
    }

    fn serve_listener(&self, listener: UnixListener) -> io::Result<()> {
        self.apart
            .call(
                &json!({"op": "listener", "id": self.id}),
                Some(listener.as_fd()),
            )
            .map(drop)
    }

    fn egress(&self) -> bool {
        self.egress
    }
}

fn finished_to_value(f: &Finished) -> Value {
    json!({"calls": f.calls, "egress": f.egress})
}

fn finished_from_value(v: &Value) -> io::Result<Finished> {
    let bad = |e: serde_json::Error| {
        io::Error::other(format!(
            "the broker process listed something unreadable: {e}"
        ))
    };
    Ok(Finished {
        calls: serde_json::from_value::<Vec<GrantCall>>(v["calls"].clone()).map_err(bad)?,
        egress: serde_json::from_value::<Vec<EgressReceipt>>(v["egress"].clone()).map_err(bad)?,
    })
}

fn send_fds(
    control: &OwnedFd,
    stream: BorrowedFd<'_>,
    handed: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let fds: Vec<BorrowedFd<'_>> = std::iter::once(stream).chain(handed).collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    if !ancillary.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for the descriptors"));
    }
    sendmsg(
        control,
        &[IoSlice::new(b"o")],
        &mut ancillary,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// The broker process: adopts its control socket, makes itself undumpable, installs its
/// seccomp allowlist, and serves operations until the daemon closes the socket. Call first
/// thing in `main`, before any other thread starts (the filter is the main thread's, and
/// every thread started after it inherits it).
pub fn child_main() -> io::Result<()> {
    let control = plimsoll_sys::fds::adopt_inherited(CONTROL_FD)?;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    filter::install()?;
    serve(&control)
}

#[derive(Default)]
struct State {
    generations: Mutex<Vec<(u64, Arc<GrantProfiles>)>>,
    brokers: Mutex<HashMap<u64, Broker>>,
}

/// How many loads of the grants file the process keeps (a run starts under the newest or one
/// just before it).
const GENERATIONS_KEPT: usize = 8;

fn serve(control: &OwnedFd) -> io::Result<()> {
    let state = Arc::new(State::default());
    loop {
        let mut byte = [0u8; 1];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut ancillary = RecvAncillaryBuffer::new(&mut space);
        let got = match recvmsg(
            control,
            &mut [IoSliceMut::new(&mut byte)],
            &mut ancillary,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(got) => got,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut fds: Vec<OwnedFd> = Vec::new();
        for message in ancillary.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = message {
                fds.extend(rights);
            }
        }
        if got.bytes == 0 && fds.is_empty() {
            // The daemon closed the socket: it is gone or stopping.
            return Ok(());
        }
        let mut fds = fds.into_iter();
        let Some(stream) = fds.next() else { continue };
        let handed = fds.next();
        let state = Arc::clone(&state);
        std::thread::Builder::new()
            .name("broker-op".into())
            .spawn(move || operation(&state, UnixStream::from(stream), handed))?;
    }
}

fn operation(state: &State, mut stream: UnixStream, handed: Option<OwnedFd>) {
    let answer = match read_frame(&mut stream, MAX_FRAME) {
        Ok(Some(frame)) => match serde_json::from_slice::<Value>(&frame) {
            Ok(request) => answer(state, &request, handed).unwrap_or_else(|e| json!({"error": e})),
            Err(e) => json!({"error": format!("not JSON: {e}")}),
        },
        _ => return,
    };
    let _ = write_frame(&mut stream, &answer);
}

fn answer(state: &State, request: &Value, handed: Option<OwnedFd>) -> Result<Value, String> {
    let id = request["id"].as_u64();
    let broker = |id: Option<u64>| -> Result<Broker, String> {
        id.and_then(|id| lock(&state.brokers).get(&id).cloned())
            .ok_or_else(|| "unknown broker".to_owned())
    };
    match request["op"].as_str().unwrap_or_default() {
        "grants" => {
            let generation = request["generation"].as_u64().ok_or("no generation")?;
            let text = request["text"].as_str().ok_or("no text")?;
            let env = request["env"].as_object().ok_or("no env")?;
            let profiles = GrantProfiles::parse(text, |name| {
                env.get(name).and_then(Value::as_str).map(str::to_owned)
            })
            .map_err(|e| e.to_string())?;
            let mut generations = lock(&state.generations);
            generations.retain(|(g, _)| *g != generation);
            generations.push((generation, Arc::new(profiles)));
            let excess = generations.len().saturating_sub(GENERATIONS_KEPT);
            generations.drain(..excess);
            Ok(json!({}))
        }
        "start" => {
            let id = id.ok_or("no id")?;
            let generation = request["generation"].as_u64().ok_or("no generation")?;
            let profiles = lock(&state.generations)
                .iter()
                .find(|(g, _)| *g == generation)
                .map(|(_, p)| Arc::clone(p))
                .ok_or("unknown_generation")?;
            let caller = request["caller"].as_str().ok_or("no caller")?;
            let grant = profiles
                .authorize(request["grant"].as_str().ok_or("no grant")?, caller)
                .map_err(|e| e.to_string())?;
            let run_id = request["run_id"].as_str().ok_or("no run_id")?;
            let budget = Duration::from_millis(request["budget_ms"].as_u64().ok_or("no budget")?);
            let broker = Broker::start(grant, caller, run_id, budget);
            let egress = broker.egress();
            lock(&state.brokers).insert(id, broker);
            Ok(json!({"egress": egress}))
        }
        "stream" => {
            let fd = handed.ok_or("no stream handed over")?;
            broker(id)?
                .serve_stream(UnixStream::from(fd))
                .map_err(|e| e.to_string())?;
            Ok(json!({}))
        }
        "listener" => {
            let fd = handed.ok_or("no listener handed over")?;
            broker(id)?
                .serve_listener(UnixListener::from(fd))
                .map_err(|e| e.to_string())?;
            Ok(json!({}))
        }
        "drain" => Ok(finished_to_value(&broker(id)?.drain())),
        "finish" => {
            let b = id
                .and_then(|id| lock(&state.brokers).remove(&id))
                .ok_or("unknown broker")?;
            Ok(finished_to_value(&b.finish()))
        }
        other => Err(format!("unknown operation {other:?}")),
    }
}

/// This process's own executable, even when its file was replaced since it started: what
/// plimsolld starts as its broker process.
pub const OWN_PROGRAM: &str = "/proc/self/exe";

/// Where runs' brokers run: in this process (the embedded engine, the CLI, tests of the
/// engine) or in the broker process (the daemon).
#[derive(Debug, Clone, Default)]
pub enum Brokers {
    /// In this process.
    #[default]
    Here,
    /// In the broker process.
    Apart(Arc<Apart>),
}

impl Brokers {
    /// The broker of run `run_id` by `caller` under `grant`, which may last `budget` (see
    /// [`Broker::start`]). Fails only when the broker process cannot take it.
    pub fn start(
        &self,
        grant: Grant,
        caller: &str,
        run_id: &str,
        budget: Duration,
    ) -> io::Result<RunBroker> {
        match self {
            Brokers::Here => Ok(RunBroker::Here(Broker::start(
                grant, caller, run_id, budget,
            ))),
            Brokers::Apart(a) => a
                .start_broker(grant, caller, run_id, budget)
                .map(|b| RunBroker::Apart(Arc::new(b))),
        }
    }
}

/// One run's broker, wherever it runs. Cheap to clone.
#[derive(Debug, Clone)]
pub enum RunBroker {
    /// In this process.
    Here(Broker),
    /// In the broker process.
    Apart(Arc<RemoteBroker>),
}

impl RunBroker {
    /// The channel the providers serve.
    pub fn channel(&self) -> plimsoll_sandbox::BrokerChannel {
        match self {
            RunBroker::Here(b) => plimsoll_sandbox::BrokerChannel::new(Arc::new(b.clone())),
            RunBroker::Apart(b) => {
                plimsoll_sandbox::BrokerChannel::new(Arc::clone(b) as Arc<dyn BrokerPort>)
            }
        }
    }
    /// See [`Broker::finish`].
    pub fn finish(&self) -> Finished {
        match self {
            RunBroker::Here(b) => b.finish(),
            RunBroker::Apart(b) => b.finish(),
        }
    }
    /// See [`Broker::drain`].
    pub fn drain(&self) -> Finished {
        match self {
            RunBroker::Here(b) => b.drain(),
            RunBroker::Apart(b) => b.drain(),
        }
    }
    /// The grant.
    pub fn grant(&self) -> &Grant {
        match self {
            RunBroker::Here(b) => b.grant(),
            RunBroker::Apart(b) => b.grant(),
        }
    }
}
