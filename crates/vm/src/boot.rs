//! One VM's whole life: its run directory, the jailed QEMU process, the conversation over the
//! channel (hello, limits and job, the agent's answer, ack), and the teardown that leaves
//! nothing behind (no QEMU, no process of the uid, no run directory).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead as _, Read, Write as _};
use std::os::fd::AsFd as _;
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plimsoll_sandbox::deadline::DeadlineReader;
use plimsoll_sandbox::judge::{Expectations, HostView};
use plimsoll_sandbox::{BrokerChannel, Spawn, end_processes_of_uid, unix_ms_now};

use crate::channel::{self, GuestLimits};
use crate::jail::{self, Jail, JailSpec, inside};
use crate::qemu::{self, QemuShape};
use crate::tier::AccelEvidence;

/// `MALLOC_ARENA_MAX` of QEMU: its address space stays near what `RLIMIT_AS` allows for.
pub const QEMU_MALLOC_ARENAS: &str = "2";
/// The lock file a live run holds; [`crate::VmProvider::reap`] removes run directories whose
/// lock is free and that hold this file.
pub const LOCK_FILE: &str = "qemu.lock";
/// Bytes kept of QEMU's console (the guest's serial port) and of QEMU's stderr: the tail.
const CONSOLE_KEPT: usize = 64 * 1024;
/// How long QEMU gets to exit by itself after the ack before it is killed.
const POWER_OFF_WAIT: Duration = Duration::from_secs(3);
/// How long processes of the run's uid get to die after SIGKILL.
const KILL_PATIENCE: Duration = Duration::from_secs(5);
/// Largest agent stderr accepted.
const STDERR_MAX: usize = 64 * 1024;

/// What to boot, fully decided.
#[derive(Debug)]
pub struct BootPlan<'a> {
    /// The QEMU binary.
    pub qemu: &'a Path,
    /// The kernel on the host.
    pub kernel: &'a Path,
    /// The run initramfs on the host.
    pub initrd: &'a Path,
    /// The image disk on the host.
    pub disk: &'a Path,
    /// The run directory (created here, removed here).
    pub run_dir: &'a Path,
    /// QEMU's uid and gid.
    pub uid: u32,
    /// The gid.
    pub gid: u32,
    /// The command line's shape.
    pub shape: QemuShape,
    /// `/dev/kvm`'s device number (KVM only).
    pub kvm_device: Option<u64>,
    /// `RLIMIT_AS` of QEMU.
    pub address_space: u64,
    /// QEMU start to the guest's hello.
    pub boot_timeout: Duration,
    /// The job, or `None` to boot and power off (the KVM check).
    pub job: Option<Job>,
    /// The run's broker, served on the host end of the `plimsoll.broker` port (the shape's
    /// `broker` must be set with it).
    pub broker: Option<&'a BrokerChannel>,
}

/// A job for the guest.
#[derive(Debug)]
pub struct Job {
    /// Limits the guest applies.
    pub limits: GuestLimits,
    /// The `AgentJob`, JSON.
    pub json: Vec<u8>,
    /// Hello to the agent's exit record.
    pub answer_timeout: Duration,
    /// Most bytes of agent stdout accepted.
    pub answer_max: usize,
    /// What the agent's wall must show before the job is sent (a trial's: uid 0 holding
    /// exactly its two capabilities): the guest starts the agent, the agent says its wall,
    /// and the job goes only if it matches.
    pub wall: Expectations,
}

/// How the conversation ended.
#[derive(Debug)]
pub enum Answer {
    /// No hello: the guest never booted, nothing of the job was sent.
    NotBooted(String),
    /// No hello within the boot budget (QEMU was killed): nothing of the job was sent, so the
    /// run may boot again.
    BootTimedOut(Duration),
    /// The guest booted and no job was given.
    BootedOnly,
    /// The agent exited.
    Exited {
        /// Its exit status.
        code: Option<i32>,
        /// The signal that ended it.
        signal: Option<i32>,
        /// Its stdout (the `RunResult` JSON when it exited 0).
        stdout: Vec<u8>,
        /// Its stderr (one line when it failed).
        stderr: Vec<u8>,
        /// The exit record (timings).
        record: BTreeMap<String, String>,
    },
    /// The agent did not answer in time; the VM was killed.
    TimedOut,
    /// The job was sent, then the conversation broke (the guest died, lied or failed).
    Lost(String),
    /// The agent's wall did not match (or it said none): the job was not sent.
    WallRefused(String),
    /// The agent's wall did not come in time (the guest hung before it): the job was not
    /// sent.
    WallTimedOut(String),
    /// A warm member's interpreter did not say it waits: no job was sent.
    NotWaiting(String),
}

/// What one boot gave.
#[derive(Debug)]
pub struct BootReport {
    /// When QEMU was started, Unix ms.
    pub started_unix_ms: u64,
    /// The guest's hello record.
    pub hello: Option<BTreeMap<String, String>>,
    /// QEMU start to hello, ms.
    pub boot_ms: Option<u64>,
    /// QEMU's own account of the accelerator (when a QMP monitor was asked for).
    pub accel: Option<Result<AccelEvidence, QmpError>>,
    /// How it ended.
    pub answer: Answer,
    /// The tail of the guest's console.
    pub console: Vec<u8>,
    /// The tail of QEMU's stderr.
    pub qemu_stderr: Vec<u8>,
    /// QEMU's peak resident memory (VmHWM), KiB.
    pub peak_rss_kib: Option<u64>,
    /// Teardown: `Err` when something of the run could not be removed.
    pub cleanup: Result<(), TeardownError>,
    /// The agent's wall, judged, when the job was sent after it.
    pub wall: Option<plimsoll_wire::Wall>,
}

impl BootReport {
    /// The last lines of QEMU's stderr and the console, for error messages.
    pub fn diagnostics(&self) -> String {
        let tail = |b: &[u8], n: usize| {
            let text = String::from_utf8_lossy(b);
            let lines: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            lines[lines.len().saturating_sub(n)..].join(" / ")
        };
        let mut parts = Vec::new();
        let q = tail(&self.qemu_stderr, 3);
        if !q.is_empty() {
            parts.push(format!("qemu: {q}"));
        }
        let c = tail(&self.console, 4);
        if !c.is_empty() {
            parts.push(format!("console: {c}"));
        }
        if parts.is_empty() {
            "no output from QEMU or the guest".into()
        } else {
            parts.join("; ")
        }
    }
}

/// QEMU's monitor did not say which accelerator runs the guest.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// Reading or writing the monitor's socket.
    #[error("QMP: {what}")]
    Io {
        /// What was being read or written.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The monitor closed its socket early.
    #[error("QMP: the monitor closed before {0}")]
    Closed(&'static str),
    /// A line that is not JSON.
    #[error("QMP: {what} is not JSON ({error})")]
    NotJson {
        /// What the line should have been.
        what: &'static str,
        /// The parser's complaint.
        error: String,
    },
    /// An answer other than the one the protocol gives.
    #[error("QMP: unexpected {what}: {answer}")]
    Unexpected {
        /// What was expected.
        what: &'static str,
        /// What came.
        answer: String,
    },
    /// `query-kvm` answered, but not usably.
    #[error(transparent)]
    QueryKvm(#[from] crate::tier::QueryKvmError),
    /// The monitor was asked for but gave no answer at all.
    #[error("QEMU's monitor gave no answer")]
    NoAnswer,
}

/// Something of a run was left behind by its teardown.
#[derive(Debug, thiserror::Error)]
pub enum TeardownError {
    /// A process of the run's uid would not end.
    #[error(transparent)]
    Processes(#[from] plimsoll_sandbox::EndProcessesError),
    /// The run directory could not be removed.
    #[error("cannot remove {path}")]
    RunDir {
        /// Which.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Both of the above.
    #[error(
        "{}; and {}",
        plimsoll_sandbox::error_chain(.0.as_ref()),
        plimsoll_sandbox::error_chain(.1.as_ref())
    )]
    Both(Box<TeardownError>, Box<TeardownError>),
}

/// The VM could not be started (nothing ran).
#[derive(Debug, thiserror::Error)]
pub enum StartVmError {
    /// The run directory.
    #[error("cannot prepare the run directory {path}")]
    RunDir {
        /// Which.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The jail.
    #[error(transparent)]
    Jail(#[from] jail::PrepareJailError),
    /// QEMU did not start (or its jail failed in the hook).
    #[error(transparent)]
    Spawn(#[from] plimsoll_sandbox::SpawnError),
    /// A socket pair for the channel.
    #[error("cannot create the channel")]
    Channel(#[source] io::Error),
    /// The broker would not serve the run's channel.
    #[error("cannot hand the broker channel to the run's broker")]
    Broker(#[source] io::Error),
}

/// A run directory, locked while this value lives.
#[derive(Debug)]
struct RunDir {
    path: PathBuf,
    lock: File,
}

impl RunDir {
    /// Removes the directory, its lock file included, while the lock is still held: a reap
    /// of another daemon skips a directory whose lock is held or gone, so it never races the
    /// removal.
    fn remove(self) -> io::Result<()> {
        let done = remove_run_dir(&self.path);
        drop(self.lock);
        done
    }

    fn create(path: &Path) -> Result<RunDir, StartVmError> {
        let err = |p: &Path| {
            let p = p.to_owned();
            move |source| StartVmError::RunDir { path: p, source }
        };
        let parent = path
            .parent()
            .ok_or_else(|| err(path)(io::Error::other("no parent directory")))?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(parent)
            .map_err(err(parent))?;
        let meta = fs::metadata(parent).map_err(err(parent))?;
        if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
            return Err(err(parent)(io::Error::other(format!(
                "the runs root must be owned by root and writable by nobody else (uid {}, mode {:o}): chown root {p} && chmod 0711 {p}",
                meta.uid(),
                meta.mode() & 0o7777,
                p = parent.display()
            ))));
        }
        fs::DirBuilder::new()
            .mode(0o700)
            .create(path)
            .map_err(err(path))?;
        fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(err(path))?;
        let lock_path = path.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&lock_path)
            .map_err(err(&lock_path))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| err(&lock_path)(e.into()))?;
        let jail = path.join("jail");
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&jail)
            .map_err(err(&jail))?;
        Ok(RunDir {
            path: path.to_owned(),
            lock,
        })
    }
}

/// Removes a run directory without crossing into another file system.
pub fn remove_run_dir(path: &Path) -> io::Result<()> {
    plimsoll_sandbox::reap::remove_tree_one_fs(path)
}

/// Keeps the last `keep` bytes of a stream until its end.
fn drain_tail(mut r: impl Read, keep: usize) -> Vec<u8> {
    let mut kept: Vec<u8> = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * keep {
                    kept.drain(..kept.len() - keep);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if kept.len() > keep {
        kept.drain(..kept.len() - keep);
    }
    kept
}

/// VmHWM of a live process, KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix("VmHWM:")?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    })
}

/// Boots one VM for `plan`, talks to it, tears everything down.
pub fn boot(plan: BootPlan<'_>) -> Result<BootReport, StartVmError> {
    let vm = Vm::start(&plan, false)?;
    let mut report = BootReport::new(vm.started_unix_ms);
    let acked = converse(&plan, &vm.sock, vm.qmp.as_ref(), vm.t0, &mut report);
    report.peak_rss_kib = peak_rss_kib(vm.pid);
    vm.stop(acked).into_report(&mut report);
    Ok(report)
}

impl BootReport {
    fn new(started_unix_ms: u64) -> Self {
        BootReport {
            started_unix_ms,
            hello: None,
            boot_ms: None,
            accel: None,
            answer: Answer::BootedOnly,
            console: Vec::new(),
            qemu_stderr: Vec::new(),
            peak_rss_kib: None,
            cleanup: Ok(()),
            wall: None,
        }
    }
}

/// A VM started: QEMU running in its jail as the run's uid, the host end of its channel,
/// its run directory locked.
#[derive(Debug)]
struct Vm {
    run_dir: RunDir,
    child: std::process::Child,
    pid: u32,
    uid: u32,
    sock: UnixStream,
    qmp: Option<UnixStream>,
    console: std::thread::JoinHandle<Vec<u8>>,
    qemu_err: std::thread::JoinHandle<Vec<u8>>,
    t0: Instant,
    started_unix_ms: u64,
    /// A warm member's: the thread QEMU was forked from, which waits until this is dropped
    /// (QEMU's parent-death signal follows the thread that forked it; the thread that makes a
    /// member ends long before its run does).
    _holder: Option<std::sync::mpsc::Sender<()>>,
}

/// What a VM's teardown gave.
struct Stopped {
    console: Vec<u8>,
    qemu_stderr: Vec<u8>,
    cleanup: Result<(), TeardownError>,
}

impl Stopped {
    fn into_report(self, report: &mut BootReport) {
        report.console = self.console;
        report.qemu_stderr = self.qemu_stderr;
        report.cleanup = self.cleanup;
    }
}

/// Forks QEMU from a thread of its own that lives until the returned sender is dropped.
fn spawn_held(
    spawn: Spawn,
) -> Result<(plimsoll_sandbox::Running, std::sync::mpsc::Sender<()>), StartVmError> {
    let (give, took) = std::sync::mpsc::channel();
    let (hold, held) = std::sync::mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("qemu-member".into())
        .spawn(move || {
            let _ = give.send(spawn.spawn());
            // Until the member is gone: a closed channel ends the wait.
            let _ = held.recv();
        })
        .map_err(StartVmError::Channel)?;
    let running = took.recv().map_err(|_| {
        StartVmError::Channel(io::Error::other("the thread that forks QEMU died"))
    })??;
    Ok((running, hold))
}

impl Vm {
    /// Makes the run directory and starts QEMU in its jail. On `Err` nothing is left (no
    /// process of the uid, no run directory). `held`: fork QEMU from a thread of its own
    /// that lives as long as the VM (a warm member's).
    fn start(plan: &BootPlan<'_>, held: bool) -> Result<Vm, StartVmError> {
        let run_dir = RunDir::create(plan.run_dir)?;
        match Self::start_in(plan, run_dir, held) {
            Ok(vm) => Ok(vm),
            Err((e, run_dir)) => {
                let _ = end_processes_of_uid(plan.uid, KILL_PATIENCE);
                let _ = run_dir.remove();
                Err(e)
            }
        }
    }

    fn start_in(
        plan: &BootPlan<'_>,
        run_dir: RunDir,
        held: bool,
    ) -> Result<Vm, (StartVmError, RunDir)> {
        macro_rules! tried {
            ($e:expr) => {
                match $e {
                    Ok(v) => v,
                    Err(e) => return Err((e.into(), run_dir)),
                }
            };
        }
        let (host_end, guest_end) = tried!(UnixStream::pair().map_err(StartVmError::Channel));
        let qmp = if plan.shape.qmp {
            Some(tried!(UnixStream::pair().map_err(StartVmError::Channel)))
        } else {
            None
        };
        // The broker's channel: a socketpair, QEMU's end a chardev on the `plimsoll.broker` port.
        let broker = match plan.broker {
            Some(b) if plan.shape.broker => {
                Some((b, tried!(UnixStream::pair().map_err(StartVmError::Channel))))
            }
            _ => None,
        };
        // The egress port: a socketpair, QEMU's end a chardev on the `plimsoll.egress` port.
        let egress = match plan.broker {
            Some(b) if plan.shape.egress => {
                Some((b, tried!(UnixStream::pair().map_err(StartVmError::Channel))))
            }
            _ => None,
        };
        let mut fds = vec![(guest_end.as_fd(), inside::CHANNEL_FD)];
        if let Some((_, (_, q))) = &egress {
            fds.push((q.as_fd(), inside::EGRESS_FD));
        }
        if let Some((_, q)) = &qmp {
            fds.push((q.as_fd(), inside::QMP_FD));
        }
        if let Some((_, (_, q))) = &broker {
            fds.push((q.as_fd(), inside::BROKER_FD));
        }
        let jail = tried!(Jail::prepare(&JailSpec {
            root: &run_dir.path.join("jail"),
            kernel: plan.kernel,
            initrd: plan.initrd,
            disk: plan.disk,
            kvm_device: plan.kvm_device,
            uid: plan.uid,
            gid: plan.gid,
            address_space: plan.address_space,
            fds,
        }));
        // A daemon that crashed mid-run could have left processes of this uid behind.
        let _ = plimsoll_sandbox::reap::signal_all_as(plan.uid);
        // The broker reads its end until QEMU's closes (QEMU exits) or the run ends.
        let broker_guest = match broker {
            Some((channel, (ours, theirs))) => {
                tried!(channel.serve_stream(ours).map_err(StartVmError::Broker));
                Some(theirs)
            }
            None => None,
        };
        // The egress streams go to the broker until QEMU's end closes (QEMU exits).
        let egress_guest = match egress {
            Some((channel, (ours, theirs))) => {
                tried!(serve_egress(channel.clone(), ours).map_err(StartVmError::Broker));
                Some(theirs)
            }
            None => None,
        };
        let started_unix_ms = unix_ms_now();
        let t0 = Instant::now();
        // Two malloc arenas at most: glibc reserves 64 MiB of address space per arena, up to 8
        // per CPU, and QEMU's I/O worker threads (more of them under load) would otherwise take
        // new ones until thread stacks no longer fit under RLIMIT_AS ("failed to allocate memory
        // for stack").
        let spawn = Spawn::new(plan.qemu, "/")
            .args(qemu::args(&plan.shape))
            .env("MALLOC_ARENA_MAX", QEMU_MALLOC_ARENAS)
            .before_exec(jail.into_pre_exec());
        let (running, holder) = if held {
            let (r, h) = tried!(spawn_held(spawn));
            (r, Some(h))
        } else {
            (tried!(spawn.spawn()), None)
        };
        // QEMU holds its ends now; ours must go, or the channel never reaches end of file.
        drop(guest_end);
        let (qmp_host, qmp_guest) = match qmp {
            Some((h, g)) => (Some(h), Some(g)),
            None => (None, None),
        };
        drop(qmp_guest);
        drop(broker_guest);
        drop(egress_guest);
        let plimsoll_sandbox::Running {
            child,
            stdout,
            stderr,
            ..
        } = running;
        let console = std::thread::spawn(move || drain_tail(stdout, CONSOLE_KEPT));
        let qemu_err = std::thread::spawn(move || drain_tail(stderr, CONSOLE_KEPT));
        let pid = child.id();
        Ok(Vm {
            run_dir,
            child,
            pid,
            uid: plan.uid,
            sock: host_end,
            qmp: qmp_host,
            console,
            qemu_err,
            t0,
            started_unix_ms,
            _holder: holder,
        })
    }

    /// Ends the VM: after an ack the guest powers off (QEMU exits by itself); otherwise, or
    /// if it lingers, QEMU's whole process group is killed. Then no process of the uid
    /// outlives it, nor its run directory.
    fn stop(mut self, acked: bool) -> Stopped {
        if acked {
            let until = Instant::now() + POWER_OFF_WAIT;
            while Instant::now() < until {
                if matches!(self.child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if let Some(p) = rustix::process::Pid::from_raw(self.pid as i32)
            && matches!(self.child.try_wait(), Ok(None))
        {
            let _ = rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
        }
        let _ = self.child.wait();
        drop(self.sock);
        drop(self.qmp);
        let console = self.console.join().unwrap_or_default();
        let qemu_stderr = self.qemu_err.join().unwrap_or_default();
        let processes = end_processes_of_uid(self.uid, KILL_PATIENCE).map_err(TeardownError::from);
        let path = self.run_dir.path.clone();
        let dir = self
            .run_dir
            .remove()
            .map_err(|source| TeardownError::RunDir { path, source });
        Stopped {
            console,
            qemu_stderr,
            cleanup: match (processes, dir) {
                (Ok(()), Ok(())) => Ok(()),
                (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
                (Err(a), Err(b)) => Err(TeardownError::Both(Box::new(a), Box::new(b))),
            },
        }
    }
}

/// The conversation. Returns whether the guest got its ack (and will power off by itself).
fn converse(
    plan: &BootPlan<'_>,
    sock: &UnixStream,
    qmp: Option<&UnixStream>,
    t0: Instant,
    report: &mut BootReport,
) -> bool {
    if !hello(plan, sock, qmp, t0, report) {
        return false;
    }
    let Some(job) = &plan.job else {
        report.answer = Answer::BootedOnly;
        return false;
    };
    limits_and_wall(sock, plan.boot_timeout, &job.limits, &job.wall, report)
        && answer(sock, plan.boot_timeout, job, report)
}

/// Sends one frame, waiting at most `within` to write it.
fn send(sock: &UnixStream, within: Duration, tag: u8, payload: &[u8]) -> io::Result<()> {
    sock.set_write_timeout(Some(within))?;
    let mut w = sock;
    channel::write_frame(&mut w, tag, payload)
}

/// The guest's hello (and QEMU's accelerator, with a monitor). False, with the answer set,
/// when it did not come.
fn hello(
    plan: &BootPlan<'_>,
    sock: &UnixStream,
    qmp: Option<&UnixStream>,
    t0: Instant,
    report: &mut BootReport,
) -> bool {
    let mut hello_reader = DeadlineReader::new(sock, t0 + plan.boot_timeout);
    match channel::read_frame(&mut hello_reader, channel::RECORD_MAX) {
        Ok(Some((channel::HELLO, payload))) => match channel::decode_record(&payload) {
            Ok(h) => {
                report.hello = Some(h);
                report.boot_ms = Some(t0.elapsed().as_millis() as u64);
            }
            Err(e) => {
                report.answer = Answer::NotBooted(format!("the guest's hello is malformed: {e}"));
                return false;
            }
        },
        Ok(Some((channel::FATAL, payload))) => {
            report.answer = Answer::NotBooted(format!(
                "the guest init failed: {}",
                String::from_utf8_lossy(&payload)
            ));
            return false;
        }
        Ok(Some((tag, _))) => {
            report.answer = Answer::NotBooted(format!(
                "the guest sent `{}` before its hello",
                tag.escape_ascii()
            ));
            return false;
        }
        Ok(None) => {
            report.answer = Answer::NotBooted("QEMU exited before the guest booted".into());
            return false;
        }
        Err(e) if e.kind() == io::ErrorKind::TimedOut => {
            report.answer = Answer::BootTimedOut(plan.boot_timeout);
            return false;
        }
        Err(e) => {
            report.answer = Answer::NotBooted(format!("reading the guest's hello: {e}"));
            return false;
        }
    }
    if let Some(q) = qmp {
        report.accel = Some(query_kvm(
            q,
            plan.shape.accelerator,
            Instant::now() + Duration::from_secs(10),
        ));
    }
    true
}

/// Sends the limits; the guest starts the agent, which says its wall: judged here, by the
/// probe's table, before anything of the job goes into the guest. False, with the answer
/// set, when it does not match (or did not come within `within`).
fn limits_and_wall(
    sock: &UnixStream,
    within: Duration,
    limits: &GuestLimits,
    expected: &Expectations,
    report: &mut BootReport,
) -> bool {
    if let Err(e) = send(sock, within, channel::LIMITS, &limits.encode()) {
        report.answer = Answer::Lost(format!("sending the limits to the guest: {e}"));
        return false;
    }
    let asked = Instant::now();
    let mut reader = DeadlineReader::new(sock, asked + within);
    let judged = match channel::read_frame(&mut reader, channel::WALL_MAX) {
        Ok(Some((channel::WALL, payload))) => {
            serde_json::from_slice::<plimsoll_wire::Wall>(&payload)
                .map_err(|e| format!("the agent's wall is not a wall ({e})"))
                .and_then(|wall| judge_wall(wall, expected))
        }
        Ok(Some((channel::FATAL, payload))) => Err(format!(
            "the guest init failed before the agent said its wall: {}",
            String::from_utf8_lossy(&payload)
        )),
        Ok(Some((tag, _))) => Err(format!(
            "the guest sent `{}` instead of the agent's wall",
            tag.escape_ascii()
        )),
        Ok(None) => Err("the VM ended before the agent said its wall".into()),
        Err(e) if e.kind() == io::ErrorKind::TimedOut => {
            report.answer = Answer::WallTimedOut(format!(
                "the agent's wall did not come within {} ms of the limits (it normally comes \
                 within a second, even under TCG)",
                asked.elapsed().as_millis()
            ));
            return false;
        }
        Err(e) => Err(format!("reading the agent's wall: {e}")),
    };
    match judged {
        Ok(wall) => report.wall = Some(wall),
        Err(why) => {
            report.answer = Answer::WallRefused(why);
            return false;
        }
    }
    true
}

/// The agent's wall, said from inside the guest, judged by the probe's table (its
/// namespaces compared with the host's view): the wall, marked, or why it does not pass.
pub fn judge_wall(
    mut wall: plimsoll_wire::Wall,
    expected: &Expectations,
) -> Result<plimsoll_wire::Wall, String> {
    let host = HostView::read();
    plimsoll_sandbox::wall::mark(&mut wall, expected, &host);
    plimsoll_sandbox::wall::check(&wall, expected, &host)
        .map(|()| wall)
        .map_err(|e| e.to_string())
}

/// The ready frame of a warm member (its interpreter waits) or of a session (its
/// interpreter takes calls): it must carry `line`. False, with the answer set, when it did
/// not say so within `within`.
fn ready(sock: &UnixStream, within: Duration, line: &[u8], report: &mut BootReport) -> bool {
    let mut reader = DeadlineReader::new(sock, Instant::now() + within);
    let why = match channel::read_frame(&mut reader, channel::RECORD_MAX) {
        Ok(Some((channel::READY, said))) if said == line => {
            return true;
        }
        Ok(Some((channel::READY, said))) => format!(
            "it said {:?}, not {:?}",
            String::from_utf8_lossy(&said),
            String::from_utf8_lossy(line)
        ),
        Ok(Some((channel::FATAL, payload))) => format!(
            "the guest init failed: {}",
            String::from_utf8_lossy(&payload)
        ),
        Ok(Some((channel::STDERR, payload))) => format!(
            "the agent said: {}",
            String::from_utf8_lossy(&payload).trim()
        ),
        Ok(Some((tag, _))) => format!("the guest sent `{}` instead", tag.escape_ascii()),
        Ok(None) => "the VM ended first".into(),
        Err(e) => format!("reading its ready frame: {e}"),
    };
    report.answer = Answer::NotWaiting(why);
    false
}

/// Sends the job and reads the agent's answer to its exit record, then acks it. Returns
/// whether the guest got its ack (and will power off by itself).
fn answer(sock: &UnixStream, within: Duration, job: &Job, report: &mut BootReport) -> bool {
    if let Err(e) = send(sock, within, channel::JOB, &job.json) {
        report.answer = Answer::Lost(format!("sending the job to the guest: {e}"));
        return false;
    }
    let mut reader = DeadlineReader::new(sock, Instant::now() + job.answer_timeout);
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    loop {
        let frame = match channel::read_frame(&mut reader, channel::CHUNK.max(channel::RECORD_MAX))
        {
            Ok(Some(f)) => f,
            Ok(None) => {
                report.answer = Answer::Lost("the VM ended before the agent answered".into());
                return false;
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                report.answer = Answer::TimedOut;
                return false;
            }
            Err(e) => {
                report.answer = Answer::Lost(format!("reading the agent's answer: {e}"));
                return false;
            }
        };
        match frame {
            (channel::STDOUT, p) => {
                if stdout.len() + p.len() > job.answer_max {
                    report.answer = Answer::Lost(format!(
                        "the agent's answer is over {} bytes",
                        job.answer_max
                    ));
                    return false;
                }
                stdout.extend_from_slice(&p);
            }
            (channel::STDERR, p) => {
                if stderr.len() + p.len() > STDERR_MAX {
                    report.answer = Answer::Lost("the agent's stderr is too long".into());
                    return false;
                }
                stderr.extend_from_slice(&p);
            }
            (channel::EXIT, p) => {
                let record = match channel::decode_record(&p) {
                    Ok(r) => r,
                    Err(e) => {
                        report.answer = Answer::Lost(format!("the exit record is malformed: {e}"));
                        return false;
                    }
                };
                let num = |k: &str| record.get(k).and_then(|v| v.parse::<i32>().ok());
                report.answer = Answer::Exited {
                    code: num("code"),
                    signal: num("signal"),
                    stdout,
                    stderr,
                    record,
                };
                let mut w = sock;
                return channel::write_frame(&mut w, channel::ACK, b"").is_ok();
            }
            (channel::FATAL, p) => {
                report.answer = Answer::Lost(format!(
                    "the guest init failed: {}",
                    String::from_utf8_lossy(&p)
                ));
                return false;
            }
            (tag, _) => {
                report.answer = Answer::Lost(format!(
                    "the guest sent an unexpected frame `{}`",
                    tag.escape_ascii()
                ));
                return false;
            }
        }
    }
}

/// A warm member's VM: booted, its agent's wall judged, its interpreter waiting for the
/// job (docs/warm-pools.md). Dropping it kills QEMU (its forking thread ends); use
/// [`WaitingVm::discard`] to remove everything.
#[derive(Debug)]
pub struct WaitingVm {
    vm: Vm,
    report: BootReport,
    within: Duration,
}

/// Boots a warm member's VM for `plan` (whose `job` is not used): `limits` (with `warm`
/// set) go to the guest, the agent's wall is judged against `wall`, and this returns once
/// the guest says the interpreter waits. `Ok(Err(report))`: the VM was booted and is gone
/// again, and the report says why it is not a member.
pub fn make_member(
    plan: &BootPlan<'_>,
    limits: &GuestLimits,
    wall: &Expectations,
) -> Result<Result<WaitingVm, BootReport>, StartVmError> {
    let vm = Vm::start(plan, true)?;
    let mut report = BootReport::new(vm.started_unix_ms);
    let made = hello(plan, &vm.sock, None, vm.t0, &mut report)
        && limits_and_wall(&vm.sock, plan.boot_timeout, limits, wall, &mut report)
        && ready(
            &vm.sock,
            plan.boot_timeout,
            plimsoll_sandbox::warm::READY_LINE,
            &mut report,
        );
    if made {
        return Ok(Ok(WaitingVm {
            vm,
            report,
            within: plan.boot_timeout,
        }));
    }
    report.peak_rss_kib = peak_rss_kib(vm.pid);
    vm.stop(false).into_report(&mut report);
    Ok(Err(report))
}

/// A used member's VM, after its answer: [`Ending::finish`] removes it.
#[derive(Debug)]
pub struct Ending {
    vm: Vm,
    acked: bool,
}

impl Ending {
    /// Powers the VM off (or kills it) and removes everything of it.
    pub fn finish(self) -> Result<(), TeardownError> {
        self.vm.stop(self.acked).cleanup
    }

    /// [`Ending::finish`], with QEMU's and the console's tails kept in `report`.
    pub fn finish_into(self, report: &mut BootReport) {
        self.vm.stop(self.acked).into_report(report);
    }
}

impl WaitingVm {
    /// QEMU's pid.
    pub fn pid(&self) -> u32 {
        self.vm.pid
    }

    /// The agent's wall, judged when the member was made.
    pub fn wall(&self) -> Option<&plimsoll_wire::Wall> {
        self.report.wall.as_ref()
    }

    /// Gives the member its one job (its JSON and answer bounds; the limits and wall are
    /// the ones it was made with) and reads the answer. The VM is still there: the returned
    /// [`Ending`] removes it.
    pub fn run(self, job: &Job) -> (BootReport, Ending) {
        let WaitingVm {
            vm,
            mut report,
            within,
        } = self;
        report.started_unix_ms = unix_ms_now();
        let acked = answer(&vm.sock, within, job, &mut report);
        report.peak_rss_kib = peak_rss_kib(vm.pid);
        (report, Ending { vm, acked })
    }

    /// Removes a member that was never used.
    pub fn discard(self) -> Result<(), TeardownError> {
        self.vm.stop(false).cleanup
    }
}

/// A session's VM (docs/sessions.md): booted, its agent's wall judged, its interpreter
/// ready for calls; the agent's standard input and output relayed over the channel
/// ([`channel::INPUT`] frames in, [`channel::STDOUT`] frames out). QEMU is killed at the
/// session's maximum lifetime even if nobody closes it (and with its forking thread, which
/// lives as long as this value, if the daemon dies); [`SessionVm::stop`] removes everything.
#[derive(Debug)]
pub struct SessionVm {
    vm: Vm,
    wall: plimsoll_wire::Wall,
    /// The lifetime's timer: a thread that kills QEMU's process group unless told first.
    lifetime: Option<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
    /// Held while input frames are written: a call's, or a cancel from another thread.
    sending: std::sync::Arc<std::sync::Mutex<()>>,
}

/// Boots a session's VM for `plan` (whose `job` is not used): `limits` (with `session` set)
/// go to the guest, the agent's wall is judged against `wall`, and this returns once the
/// agent says its interpreter is ready (within `ready_within`). `Ok(Err(report))`: the VM
/// was booted and is gone again, and the report says why.
pub fn open_session(
    plan: &BootPlan<'_>,
    limits: &GuestLimits,
    wall: &Expectations,
    lifetime: Duration,
    ready_within: Duration,
) -> Result<Result<SessionVm, BootReport>, StartVmError> {
    let vm = Vm::start(plan, true)?;
    let mut report = BootReport::new(vm.started_unix_ms);
    let opened = hello(plan, &vm.sock, None, vm.t0, &mut report)
        && limits_and_wall(&vm.sock, plan.boot_timeout, limits, wall, &mut report)
        && ready(
            &vm.sock,
            ready_within,
            plimsoll_wire::SESSION_READY_LINE,
            &mut report,
        );
    match report.wall.take() {
        Some(wall) if opened => {
            let pid = vm.pid;
            let (tell, told) = std::sync::mpsc::channel::<()>();
            let timer = std::thread::Builder::new()
                .name("qemu-session-lifetime".into())
                .spawn(move || {
                    if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                        told.recv_timeout(lifetime)
                        && let Some(p) = rustix::process::Pid::from_raw(pid as i32)
                    {
                        // Not reaped before this thread is joined: the pid is still QEMU's.
                        let _ =
                            rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
                    }
                });
            match timer {
                Ok(timer) => Ok(Ok(SessionVm {
                    vm,
                    wall,
                    lifetime: Some((tell, timer)),
                    sending: std::sync::Arc::default(),
                })),
                Err(e) => {
                    report.answer = Answer::NotWaiting(format!("cannot start its timer: {e}"));
                    vm.stop(false).into_report(&mut report);
                    Ok(Err(report))
                }
            }
        }
        taken => {
            report.wall = taken;
            report.peak_rss_kib = peak_rss_kib(vm.pid);
            vm.stop(false).into_report(&mut report);
            Ok(Err(report))
        }
    }
}

/// Hands bytes to a session agent's standard input from any thread ([`SessionVm::input_writer`]).
pub type InputWriter = Box<dyn Fn(&[u8]) + Send + Sync>;

impl SessionVm {
    /// QEMU's pid.
    pub fn pid(&self) -> u32 {
        self.vm.pid
    }

    /// The agent's wall, judged when the VM was opened.
    pub fn wall(&self) -> &plimsoll_wire::Wall {
        &self.wall
    }

    /// Hands `bytes` to the agent's standard input, in frames of at most
    /// [`channel::INPUT_MAX`], each written within `within`.
    pub fn send(&self, bytes: &[u8], within: Duration) -> io::Result<()> {
        let _sending = self.sending.lock().unwrap_or_else(|p| p.into_inner());
        for piece in bytes.chunks(channel::INPUT_MAX) {
            send(&self.vm.sock, within, channel::INPUT, piece)?;
        }
        Ok(())
    }

    /// What hands `bytes` to the agent's standard input from another thread, as
    /// [`SessionVm::send`] does, never in the middle of another's frames.
    pub fn input_writer(&self) -> io::Result<InputWriter> {
        let sock = self.vm.sock.try_clone()?;
        let sending = std::sync::Arc::clone(&self.sending);
        Ok(Box::new(move |bytes: &[u8]| {
            let _sending = sending.lock().unwrap_or_else(|p| p.into_inner());
            let _ = send(&sock, Duration::from_secs(5), channel::INPUT, bytes);
        }))
    }

    /// The guest's next frame (payload at most `max` bytes), waiting until `until`.
    /// `Ok(None)`: the channel ended (QEMU exited).
    pub fn next_frame(&self, until: Instant, max: usize) -> io::Result<Option<(u8, Vec<u8>)>> {
        let mut reader = DeadlineReader::new(&self.vm.sock, until);
        channel::read_frame(&mut reader, max)
    }

    /// Whether the guest has sent something not yet read (between calls, only an agent that
    /// ended, or a guest out of step, does).
    pub fn has_output(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            &self.vm.sock,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        rustix::event::poll(&mut fds, Some(&zero)).is_ok_and(|n| n > 0)
    }

    /// Whether QEMU is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.vm.child.try_wait(), Ok(None))
    }

    /// Kills QEMU and removes everything of the VM: no process of its uid, no run directory.
    pub fn stop(mut self) -> Result<(), TeardownError> {
        if let Some((tell, timer)) = self.lifetime.take() {
            drop(tell);
            let _ = timer.join();
        }
        self.vm.stop(false).cleanup
    }
}

/// Asks QEMU's monitor which accelerator runs the guest.
fn query_kvm(
    sock: &UnixStream,
    requested: crate::tier::Accelerator,
    deadline: Instant,
) -> Result<AccelEvidence, QmpError> {
    let mut reader = io::BufReader::new(DeadlineReader::new(sock, deadline));
    // One JSON object per line; events (`{"event": ...}`) may come in between.
    let mut next = |what: &'static str| -> Result<serde_json::Value, QmpError> {
        loop {
            let mut line = String::new();
            let n = reader
                .read_line(&mut line)
                .map_err(|source| QmpError::Io { what, source })?;
            if n == 0 {
                return Err(QmpError::Closed(what));
            }
            let v: serde_json::Value =
                serde_json::from_str(&line).map_err(|e| QmpError::NotJson {
                    what,
                    error: e.to_string(),
                })?;
            if v.get("event").is_none() {
                return Ok(v);
            }
        }
    };
    let unexpected = |what, answer: &serde_json::Value| QmpError::Unexpected {
        what,
        answer: answer.to_string(),
    };
    let greeting = next("the greeting")?;
    if greeting.get("QMP").is_none() {
        return Err(unexpected("greeting", &greeting));
    }
    let mut w = sock;
    let write = |w: &mut &UnixStream, what, line: &[u8]| {
        w.write_all(line)
            .map_err(|source| QmpError::Io { what, source })
    };
    write(
        &mut w,
        "sending qmp_capabilities",
        b"{\"execute\":\"qmp_capabilities\"}\n",
    )?;
    let caps = next("the capabilities answer")?;
    if caps.get("return").is_none() {
        return Err(unexpected("qmp_capabilities answer", &caps));
    }
    write(
        &mut w,
        "sending query-kvm",
        b"{\"execute\":\"query-kvm\"}\n",
    )?;
    let answer = next("the query-kvm answer")?;
    Ok(AccelEvidence::from_query_kvm(
        requested,
        &answer.to_string(),
    )?)
}

/// Serves the egress port's streams on a thread of its own: each stream the guest opens
/// becomes one connection to the run's broker, opened with the egress hello. Ends when QEMU
/// closes its end.
fn serve_egress(channel: BrokerChannel, port: UnixStream) -> std::io::Result<()> {
    use plimsoll_sandbox::mux::{Mux, Socket};
    let mux = Mux::new(Box::new(port.try_clone()?));
    std::thread::Builder::new()
        .name("vm-egress".into())
        .spawn(move || {
            let accept = || -> Option<std::sync::Arc<dyn Socket>> {
                let (ours, broker) = UnixStream::pair().ok()?;
                let hello = plimsoll_sandbox::broker::EGRESS_HELLO;
                let mut frame = (hello.len() as u32).to_be_bytes().to_vec();
                frame.extend_from_slice(hello);
                std::io::Write::write_all(&mut &ours, &frame).ok()?;
                channel.serve_stream(broker).ok()?;
                Some(std::sync::Arc::new(ours))
            };
            if let Err(e) = mux.serve(&port, accept) {
                tracing::warn!(error = %e, "a guest's egress port ended");
            }
        })?;
    Ok(())
}
