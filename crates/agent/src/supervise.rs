//! Running the job's children: each in a process group of its own with fresh pipes, both
//! streams read at once into capped buffers while the deadline is watched, every child reaped
//! (the agent is a child subreaper, so orphans come back to it), and at the end every process
//! the job started is killed. A session's agent keeps one supervisor for its whole life: its
//! interpreter is spared by each job's clean-up (`spare`) and its exit status is kept when
//! any wait reaps it (`track`).
//!
//! Needs a single-threaded process (the agent binary): SIGCHLD is blocked in the calling
//! thread and read from a signalfd, which another thread with SIGCHLD unblocked would take.
//! A capped poll timeout re-checks for exited children anyway, so a lost signal only delays.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use plimsoll_sys::signals::ChildSignals;
use plimsoll_wire::{OutputStream, TrialIds};
use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitOptions};

use crate::oom::OomCounter;
use crate::privilege::{RestoreUidError, end_controller_processes};

/// How long the pipes are still read after a step's first process has exited: output its
/// background processes print in that time is kept; after it, pipes they hold are drained
/// and dropped while later steps run.
pub(crate) const DRAIN_GRACE: Duration = Duration::from_millis(100);
/// How long to wait for a killed step's first process to be reaped before giving up on it.
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(2);
/// How long the final clean-up keeps killing what is left.
const END_WAIT: Duration = Duration::from_secs(2);
/// The longest single poll: exited children are looked for at least this often.
pub(crate) const POLL_CAP: Duration = Duration::from_millis(250);
/// Reads per stream per wake-up, so one busy stream cannot starve the deadline.
const READS_PER_WAKE: usize = 16;

/// Where the bytes a child's streams keep go as they are read, besides its result (a
/// session's streamed output): called with each stream's newly kept bytes, never more than
/// the result keeps.
pub(crate) type Tap<'a> = Option<&'a mut dyn FnMut(OutputStream, &[u8])>;

/// Bytes kept from one stream: the first `cap`, the rest counted as dropped.
#[derive(Debug, Default)]
pub(crate) struct Sink {
    pub(crate) buf: Vec<u8>,
    cap: usize,
    pub(crate) truncated: bool,
}

impl Sink {
    pub(crate) fn new(cap: u64) -> Self {
        Sink {
            buf: Vec::new(),
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            truncated: false,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        let keep = data.len().min(self.cap.saturating_sub(self.buf.len()));
        self.buf.extend_from_slice(&data[..keep]);
        if keep < data.len() {
            self.truncated = true;
        }
    }
}

/// How one child ended and what it printed.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub stdout: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr: Vec<u8>,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
}

impl Outcome {
    /// Exit status 0, no signal, no timeout.
    pub(crate) fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && self.signal.is_none() && !self.timed_out
    }
}

/// The agent cannot watch its children; nothing has run.
#[derive(Debug, thiserror::Error)]
#[error("cannot watch for exiting children (blocking SIGCHLD or creating a signalfd failed)")]
pub struct StartSupervisorError(#[source] io::Error);

/// A child could not be started, or watching it failed (it has then been killed).
#[derive(Debug, thiserror::Error)]
pub enum RunChildError {
    /// Fork or exec failed: nothing of this child ran.
    #[error("cannot start `{program}`")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Waiting on the child's pipes failed.
    #[error("cannot watch child {pid}")]
    Watch {
        /// The child's pid.
        pid: i32,
        /// Why.
        #[source]
        source: Errno,
    },
}

/// A command for a child of the agent: a step's shell or a snippet's interpreter. The rest of
/// its setup (process group, pipes) is [`Supervisor::run`]'s.
#[expect(
    clippy::disallowed_methods,
    reason = "the agent's own spawn, inside the sandbox: children keep the environment the provider gave the agent, get an empty stdin pipe (no /dev/null needed), and inherit no descriptor because the agent marked them all close-on-exec at its start"
)]
pub(crate) fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    Command::new(program)
}

/// Runs children one at a time and cleans up after all of them.
#[derive(Debug)]
pub(crate) struct Supervisor {
    sigchld: ChildSignals,
    deadline: Instant,
    /// Read ends of earlier steps' pipes, still held open by their background processes:
    /// drained and dropped so those processes never block on a full pipe.
    leftovers: Vec<OwnedFd>,
    /// Process group ids of every child started (each child leads its own group).
    groups: Vec<i32>,
    oom: OomCounter,
    scratch: Vec<u8>,
    ended: bool,
    /// A trial job's ids: the controller uid's processes are ended too.
    trial: Option<TrialIds>,
    /// Becoming the run's uid again failed after ending the controller's processes.
    restore_error: Option<RestoreUidError>,
    /// Children whose exit status is kept whichever wait reaps them (a session's
    /// interpreter, which may end while a job's steps are being waited for), with it once
    /// known.
    tracked: HashMap<i32, Option<Ended>>,
    /// A session's supervisor: [`Supervisor::end_job`] is not the end.
    session: bool,
    /// A process (with its process group and descendants) that [`Supervisor::end_job`]
    /// leaves alive in a session: its interpreter.
    spare: Option<i32>,
}

/// A child [`Supervisor::start`] started and nothing has followed yet.
#[derive(Debug)]
pub(crate) struct Started {
    /// Its pid, which is also its process group's id.
    pub pid: i32,
    /// Our end of its stdin (closed when it is followed).
    pub stdin: Option<std::process::ChildStdin>,
    /// Its stdout, blocking until it is followed.
    pub out: Option<OwnedFd>,
    /// Its stderr.
    pub err: Option<OwnedFd>,
    /// Where its duration counts from.
    pub at: Instant,
}

/// A status from waitpid, decoded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ended {
    pub(crate) exit_code: Option<i32>,
    pub(crate) signal: Option<i32>,
}

fn decode(status: libc::c_int) -> Ended {
    if libc::WIFEXITED(status) {
        Ended {
            exit_code: Some(libc::WEXITSTATUS(status)),
            signal: None,
        }
    } else if libc::WIFSIGNALED(status) {
        Ended {
            exit_code: None,
            signal: Some(libc::WTERMSIG(status)),
        }
    } else {
        Ended {
            exit_code: None,
            signal: None,
        }
    }
}

/// Reads what a non-blocking pipe holds now, into `sink` (or nowhere). True at end of file
/// or on an error (the stream is then given up).
pub(crate) fn drain(fd: BorrowedFd<'_>, scratch: &mut [u8], mut sink: Option<&mut Sink>) -> bool {
    let mut reads = 0;
    while reads < READS_PER_WAKE {
        match rustix::io::read(fd, &mut *scratch) {
            Ok(0) => return true,
            Ok(n) => {
                reads += 1;
                if let Some(s) = sink.as_deref_mut() {
                    s.push(&scratch[..n]);
                }
            }
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => return false,
            Err(_) => return true,
        }
    }
    false
}

pub(crate) fn set_nonblocking(fd: &OwnedFd) -> Result<(), Errno> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)
}

/// The time until `wake`, rounded up to a millisecond, at most [`POLL_CAP`].
pub(crate) fn poll_timeout(now: Instant, wake: Instant) -> Timespec {
    let wait = wake.saturating_duration_since(now).min(POLL_CAP);
    let ms = i64::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(i64::MAX);
    Timespec {
        tv_sec: ms / 1000,
        tv_nsec: (ms % 1000) * 1_000_000,
    }
}

/// SIGKILL to the process group `pgid`; gone already is fine.
pub(crate) fn kill_group(pgid: i32) {
    if let Some(pid) = Pid::from_raw(pgid) {
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
    }
}

/// SIGKILL to process `pid`; gone already is fine.
fn kill_one(pid: i32) {
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, Signal::KILL);
    }
}

impl Supervisor {
    /// Blocks SIGCHLD into a signalfd and makes the agent a child subreaper (best effort:
    /// without it, orphans go to the sandbox's init and only the host ends them).
    pub(crate) fn new(deadline: Instant) -> Result<Self, StartSupervisorError> {
        let sigchld = ChildSignals::new().map_err(StartSupervisorError)?;
        let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
        Ok(Supervisor {
            sigchld,
            deadline,
            leftovers: Vec::new(),
            groups: Vec::new(),
            oom: OomCounter::find(),
            scratch: vec![0; 64 * 1024],
            ended: false,
            trial: None,
            restore_error: None,
            tracked: HashMap::new(),
            session: false,
            spare: None,
        })
    }

    /// A supervisor for a session's agent: it serves call after call, and a job's clean-up
    /// ([`Supervisor::end_job`]) spares the process named by [`Supervisor::spare`].
    pub(crate) fn for_session(deadline: Instant) -> Result<Self, StartSupervisorError> {
        let mut sup = Supervisor::new(deadline)?;
        sup.session = true;
        Ok(sup)
    }

    /// Keeps `pid`'s exit status when any wait reaps it, for [`Supervisor::status_of`].
    pub(crate) fn track(&mut self, pid: i32) {
        self.tracked.insert(pid, None);
    }

    /// The exit status of a tracked child, once it has been reaped.
    pub(crate) fn status_of(&self, pid: i32) -> Option<Ended> {
        self.tracked.get(&pid).copied().flatten()
    }

    /// Stops tracking `pid`.
    pub(crate) fn forget(&mut self, pid: i32) {
        self.tracked.remove(&pid);
    }

    /// Makes [`Supervisor::end_job`] of a session's supervisor leave `pid` alive, with its
    /// process group and its descendants (`None`: end everything the jobs started).
    pub(crate) fn spare(&mut self, pid: Option<i32>) {
        self.spare = pid;
    }

    /// The signalfd that becomes readable when a child exits, for a caller's own poll.
    pub(crate) fn child_signals(&self) -> BorrowedFd<'_> {
        self.sigchld.as_fd()
    }

    /// Reaps every child that has ended now (tracked ones keep their status).
    pub(crate) fn reap_now(&mut self) {
        let mut none = None;
        self.reap(None, &mut none);
    }

    /// Makes [`Supervisor::end_all`] also end every process of the trial's controller uid.
    pub(crate) fn end_controller_too(&mut self, ids: TrialIds) {
        self.trial = Some(ids);
    }

    /// The failure to become the run's uid again, if ending the controller's processes had
    /// one: the job must stop.
    pub(crate) fn take_restore_error(&mut self) -> Option<RestoreUidError> {
        self.restore_error.take()
    }

    /// Kills every process of the controller uid (a trial job only).
    fn end_controller(&mut self) {
        if let Some(ids) = self.trial
            && self.restore_error.is_none()
            && let Err(e) = end_controller_processes(&ids)
        {
            self.restore_error = Some(e);
        }
    }

    /// True once the job's deadline has passed.
    pub(crate) fn past_deadline(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Reaps every child that has ended, noting `leader`'s status. Returns whether any
    /// child is left.
    fn reap(&mut self, leader: Option<i32>, found: &mut Option<Ended>) -> bool {
        self.sigchld.drain();
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(None) => return true,
                Ok(Some((p, status))) => {
                    let p = p.as_raw_nonzero().get();
                    let ended = decode(status.as_raw());
                    if Some(p) == leader {
                        *found = Some(ended);
                    }
                    if let Some(slot) = self.tracked.get_mut(&p) {
                        *slot = Some(ended);
                    }
                }
                Err(Errno::INTR) => {}
                Err(_) => return false,
            }
        }
    }

    /// Drains the pipes left over from earlier steps, dropping what they hold.
    fn drain_leftovers(&mut self) {
        let scratch = &mut self.scratch;
        self.leftovers
            .retain(|fd| !drain(fd.as_fd(), scratch, None));
    }

    /// Runs one child to its end (or the deadline): stdin empty, stdout and stderr to fresh
    /// pipes, in a process group of its own. At the deadline the whole group is killed.
    /// Background processes it leaves outlive it (a later step may use them) until
    /// [`Supervisor::end_all`].
    pub(crate) fn run(
        &mut self,
        cmd: Command,
        output_bytes: u64,
        tap: Tap<'_>,
    ) -> Result<Outcome, RunChildError> {
        let mut started = self.start(cmd)?;
        // Closing our end of stdin at once: the child reads end of file.
        drop(started.stdin.take());
        self.finish(started, output_bytes, tap)
    }

    /// Starts one child as [`Supervisor::run`] does, and returns with it running: its stdin
    /// still open (a warm member's interpreter waits on it), nothing of its output read yet.
    pub(crate) fn start(&mut self, mut cmd: Command) -> Result<Started, RunChildError> {
        let program = cmd.get_program().to_string_lossy().into_owned();
        cmd.process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let at = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|source| RunChildError::Spawn { program, source })?;
        let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        self.groups.push(pid);
        let stdin = child.stdin.take();
        let out = child.stdout.take().map(OwnedFd::from);
        let err = child.stderr.take().map(OwnedFd::from);
        // The child is reaped through waitpid(-1), never through `child`.
        drop(child);
        Ok(Started {
            pid,
            stdin,
            out,
            err,
            at,
        })
    }

    /// Moves the deadline (a warm member's: its job's, known only once the job comes).
    pub(crate) fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    /// Follows a child [`Supervisor::start`] started to its end (or the deadline), reading
    /// both its streams from here on; its duration counts from `started.at`.
    pub(crate) fn finish(
        &mut self,
        started: Started,
        output_bytes: u64,
        tap: Tap<'_>,
    ) -> Result<Outcome, RunChildError> {
        let Started {
            pid,
            stdin,
            mut out,
            mut err,
            at,
        } = started;
        drop(stdin);
        let oom_before = self.oom.read();
        for fd in out.iter().chain(err.iter()) {
            // A blocking pipe would only make a read wait; keep going.
            let _ = set_nonblocking(fd);
        }
        let watched = self.watch(pid, &mut out, &mut err, output_bytes, tap);
        // Pipes still held open by background processes: keep draining them.
        self.leftovers.extend(out.into_iter().chain(err));
        let (ended, timed_out, stdout, stderr) = match watched {
            Ok(w) => w,
            Err(source) => {
                kill_group(pid);
                return Err(RunChildError::Watch { pid, source });
            }
        };
        let ended = ended.unwrap_or(Ended {
            exit_code: None,
            signal: None,
        });
        // Any process of the step killed for memory counts, the leader or one it started
        // (the process tier reports the same from the run's cgroup).
        let oom_killed = matches!((oom_before, self.oom.read()), (Some(b), Some(a)) if a > b);
        Ok(Outcome {
            exit_code: ended.exit_code,
            signal: ended.signal,
            timed_out,
            oom_killed,
            stdout: stdout.buf,
            stdout_truncated: stdout.truncated,
            stderr: stderr.buf,
            stderr_truncated: stderr.truncated,
            duration_ms: u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// The capture loop of [`Supervisor::run`]. Returns the leader's status (`None` when it
    /// could not be reaped in time after the kill), whether the deadline fired, and both
    /// streams. Streams still open at the end are left in `out`/`err`.
    fn watch(
        &mut self,
        pid: i32,
        out: &mut Option<OwnedFd>,
        err: &mut Option<OwnedFd>,
        output_bytes: u64,
        mut tap: Tap<'_>,
    ) -> Result<(Option<Ended>, bool, Sink, Sink), Errno> {
        let mut stdout = Sink::new(output_bytes);
        let mut stderr = Sink::new(output_bytes);
        let mut ended: Option<Ended> = None;
        let mut timed_out = false;
        let mut killed_at: Option<Instant> = None;
        let mut drain_until: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if let Some(until) = drain_until
                && (now >= until || (out.is_none() && err.is_none()))
            {
                break;
            }
            if ended.is_none() {
                match killed_at {
                    None if now >= self.deadline => {
                        // The leader is not reaped yet, so its group id is still ours.
                        kill_group(pid);
                        timed_out = true;
                        killed_at = Some(now);
                    }
                    Some(at) if now >= at + KILL_WAIT => break,
                    _ => {}
                }
            }
            let wake = match (drain_until, killed_at) {
                (Some(until), _) => until,
                (None, Some(at)) => at + KILL_WAIT,
                (None, None) => self.deadline,
            };
            {
                let mut fds = Vec::with_capacity(3 + self.leftovers.len());
                fds.push(PollFd::new(&self.sigchld, PollFlags::IN));
                for fd in out.iter().chain(err.iter()).chain(self.leftovers.iter()) {
                    fds.push(PollFd::new(fd, PollFlags::IN));
                }
                match poll(&mut fds, Some(&poll_timeout(now, wake))) {
                    Ok(_) | Err(Errno::INTR) => {}
                    Err(e) => return Err(e),
                }
            }
            for (fd, sink, stream) in [
                (&mut *out, &mut stdout, OutputStream::Stdout),
                (&mut *err, &mut stderr, OutputStream::Stderr),
            ] {
                let kept = sink.buf.len();
                if let Some(f) = fd.as_ref()
                    && drain(f.as_fd(), &mut self.scratch, Some(&mut *sink))
                {
                    *fd = None;
                }
                if let Some(t) = tap.as_mut()
                    && sink.buf.len() > kept
                {
                    t(stream, &sink.buf[kept..]);
                }
            }
            self.drain_leftovers();
            if ended.is_none() {
                self.reap(Some(pid), &mut ended);
                if ended.is_some() {
                    let mut until = Instant::now() + DRAIN_GRACE;
                    if !timed_out {
                        // A step that finished in time is not held past the deadline.
                        until = until.min(self.deadline.max(now));
                    }
                    drain_until = Some(until);
                }
            }
        }
        Ok((ended, timed_out, stdout, stderr))
    }

    /// Kills every process the job started that is still alive (its descendants, found in
    /// /proc; or, without /proc, the process groups of its steps) and, for a trial job, every
    /// process of the controller uid, reaps them, and drops the leftover pipes. Best effort
    /// for at most [`END_WAIT`]: the host destroys the sandbox anyway. Idempotent.
    pub(crate) fn end_all(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.kill_started(None);
        // Those that are not the agent's descendants (orphans given to the sandbox's init).
        self.end_controller();
        self.leftovers.clear();
    }

    /// The clean-up after a job's last step: [`Supervisor::end_all`], or in a session's
    /// supervisor [`Supervisor::end_started`] sparing its interpreter, so that the
    /// supervisor serves the next call.
    pub(crate) fn end_job(&mut self) {
        if self.session {
            self.end_started(self.spare);
        } else {
            self.end_all();
        }
    }

    /// Kills every process started so far that is still alive, except `spare` with its
    /// process group and descendants, reaps them and drops the leftover pipes, as
    /// [`Supervisor::end_all`] does; then goes on serving (a session's next call).
    pub(crate) fn end_started(&mut self, spare: Option<i32>) {
        self.kill_started(spare);
        self.leftovers.clear();
        self.groups.retain(|g| Some(*g) == spare);
    }

    /// The killing loop of [`Supervisor::end_all`] and [`Supervisor::end_started`].
    fn kill_started(&mut self, spare: Option<i32>) {
        let until = Instant::now() + END_WAIT;
        let me = std::process::id() as i32;
        loop {
            let mut none = None;
            if !self.reap(None, &mut none) || Instant::now() >= until {
                break;
            }
            let tree = process_tree();
            match &tree {
                Some(tree) => {
                    // The spared process, what it started, and its group's members it left
                    // as orphans (they came back to the agent).
                    let spared: HashSet<i32> = spare
                        .into_iter()
                        .chain(spare.iter().flat_map(|s| below(tree, *s)).map(|(p, _)| p))
                        .collect();
                    let targets: Vec<(i32, i32)> = below(tree, me)
                        .into_iter()
                        .filter(|(pid, pgid)| !spared.contains(pid) && Some(*pgid) != spare)
                        .collect();
                    // With a spared process alive, a child is always left: stop when
                    // nothing else is.
                    if spare.is_some() && targets.is_empty() {
                        break;
                    }
                    for (pid, pgid) in targets {
                        // Killing the whole group at once stops a member forking away.
                        if self.groups.contains(&pgid) {
                            kill_group(pgid);
                        }
                        kill_one(pid);
                    }
                }
                None => {
                    for g in self.groups.iter().filter(|g| Some(**g) != spare) {
                        kill_group(*g);
                    }
                }
            }
            // The agent (uid R) cannot signal the controller's processes as a descendant.
            self.end_controller();
            self.drain_leftovers();
            let mut fds = [PollFd::new(&self.sigchld, PollFlags::IN)];
            let ten_ms = Timespec {
                tv_sec: 0,
                tv_nsec: 10_000_000,
            };
            let _ = poll(&mut fds, Some(&ten_ms));
            // Without /proc nothing tells when all but the spared process are gone: one
            // round of kills, then what has ended is reaped.
            if spare.is_some() && tree.is_none() {
                let mut none = None;
                self.reap(None, &mut none);
                break;
            }
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.end_all();
    }
}

/// Parses `/proc/PID/stat`: the pid, parent pid and process group. The command name (field
/// 2) may hold spaces and parentheses, so fields are counted from its last `)`.
pub(crate) fn parse_stat(stat: &str) -> Option<(i32, i32, i32)> {
    let open = stat.find(" (")?;
    let close = stat.rfind(')')?;
    let pid = stat[..open].trim().parse().ok()?;
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    let _state = rest.next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgrp = rest.next()?.parse().ok()?;
    Some((pid, ppid, pgrp))
}

/// Every process now alive (or a zombie) by its parent, with its process group, from /proc.
/// `None` when /proc cannot be read.
fn process_tree() -> Option<HashMap<i32, Vec<(i32, i32)>>> {
    let mut children: HashMap<i32, Vec<(i32, i32)>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{name}/stat")) else {
            continue;
        };
        if let Some((pid, ppid, pgrp)) = parse_stat(&stat) {
            children.entry(ppid).or_default().push((pid, pgrp));
        }
    }
    Some(children)
}

/// Every descendant of `root` in `tree` ([`process_tree`]), with its process group.
fn below(tree: &HashMap<i32, Vec<(i32, i32)>>, root: i32) -> Vec<(i32, i32)> {
    let mut found = Vec::new();
    let mut seen = HashSet::from([root]);
    let mut queue = VecDeque::from([root]);
    while let Some(parent) = queue.pop_front() {
        for &(pid, pgrp) in tree.get(&parent).map_or(&[][..], Vec::as_slice) {
            if seen.insert(pid) {
                found.push((pid, pgrp));
                queue.push_back(pid);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_keeps_the_first_cap_bytes_and_flags_the_rest() {
        let mut s = Sink::new(5);
        s.push(b"abc");
        assert!(!s.truncated);
        s.push(b"defg");
        s.push(b"h");
        assert_eq!(s.buf, b"abcde");
        assert!(s.truncated);
        let mut exact = Sink::new(3);
        exact.push(b"abc");
        exact.push(b"");
        assert!(!exact.truncated);
    }

    #[test]
    fn stat_lines_with_odd_command_names() {
        assert_eq!(
            parse_stat("42 (a) b) (c) S 7 42 42 0 -1 4194560"),
            Some((42, 7, 42))
        );
        assert_eq!(parse_stat("9 (sleep) Z 1 9 9"), Some((9, 1, 9)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x"), None);
    }

    #[test]
    fn exit_statuses_decode() {
        let exited = decode(3 << 8);
        assert_eq!((exited.exit_code, exited.signal), (Some(3), None));
        let killed = decode(9);
        assert_eq!((killed.exit_code, killed.signal), (None, Some(9)));
    }
}
