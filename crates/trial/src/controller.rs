//! The controller process: started as the controller uid with a near-empty environment, fed one
//! state line per tick and read one answer line back within a deadline, its stderr drained and
//! capped, and at the end every process of its uid killed and reaped.
//!
//! This is the runner's own minimal spawn, not plimsoll-sandbox's helper: the runner is a
//! program of its own inside the sandbox image, and it needs the controller's stdin as a pipe
//! and the uid switch done by raw per-process calls in the child.

use std::ffi::OsString;
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
use rustix::process::{Pid, PidfdFlags, Signal, WaitOptions};

use crate::protocol::MAX_LINE_BYTES;

/// PATH in the controller's environment (also where a bare program name is looked up).
pub const CONTROLLER_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// The controller's whole environment.
pub const CONTROLLER_ENV: [(&str, &str); 3] = [
    ("PATH", CONTROLLER_PATH),
    ("HOME", "/tmp"),
    ("LANG", "C.UTF-8"),
];
/// Bytes of the controller's stderr kept for the verdict.
pub const STDERR_KEPT_BYTES: usize = 4096;
/// More stderr than this in one trial is a flood.
pub const STDERR_FLOOD_BYTES: u64 = 1 << 20;
/// How long the end of a trial waits for the controller's processes to be gone after SIGKILL.
pub const END_PATIENCE: Duration = Duration::from_secs(2);

/// What to run and as whom.
#[derive(Debug, Clone)]
pub struct ControllerCommand {
    /// The program, resolved (see [`resolve_program`]).
    pub program: PathBuf,
    /// Its arguments (argv\[1..\]).
    pub args: Vec<OsString>,
    /// The controller uid.
    pub uid: u32,
    /// The controller gid.
    pub gid: u32,
}

/// The controller program could not be found.
#[derive(Debug, thiserror::Error)]
pub enum ResolveProgramError {
    /// No command given.
    #[error("no controller command: give it after `--`, e.g. `-- node controller.js`")]
    Missing,
    /// Not found.
    #[error("controller program `{0}` not found (a bare name is looked up in {CONTROLLER_PATH})")]
    NotFound(String),
}

/// Resolves the program the way the controller's PATH would: a name with a `/` is taken as a
/// path (relative to the working directory); a bare name is looked up in [`CONTROLLER_PATH`].
pub fn resolve_program(program: &OsString) -> Result<PathBuf, ResolveProgramError> {
    if program.is_empty() {
        return Err(ResolveProgramError::Missing);
    }
    let shown = program.to_string_lossy().into_owned();
    if program.as_bytes().contains(&b'/') {
        let p = PathBuf::from(program);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(ResolveProgramError::NotFound(shown))
        };
    }
    CONTROLLER_PATH
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
        .ok_or(ResolveProgramError::NotFound(shown))
}

/// The controller could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnControllerError {
    /// fork, the uid switch or exec failed.
    #[error("cannot start the controller {program}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Setting up its pipes failed.
    #[error("cannot set up the controller's pipes")]
    Pipes(#[source] io::Error),
}

/// Why an exchange did not produce an answer line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// No full answer line before the deadline.
    Timeout,
    /// Its stdout closed (it exited) or its stdin was closed before it answered.
    Exited,
    /// An answer line longer than [`MAX_LINE_BYTES`], or more than [`STDERR_FLOOD_BYTES`] of
    /// stderr.
    Flood(String),
    /// Polling its pipes failed (a runner failure, not the controller's).
    Poll(String),
}

/// How the controller's main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitInfo {
    /// It exited with this status.
    Code(i32),
    /// A signal ended it (9 when the runner ended it).
    Signal(i32),
}

/// What is left of a controller after [`Controller::finish`].
#[derive(Debug, Clone)]
pub struct Ended {
    /// How its main process ended (`None` if it could not be reaped).
    pub exit: Option<ExitInfo>,
    /// The first [`STDERR_KEPT_BYTES`] of its stderr.
    pub stderr: Vec<u8>,
    /// More stderr was written than kept.
    pub stderr_truncated: bool,
}

/// Processes of the controller's uid survived SIGKILL.
#[derive(Debug, thiserror::Error)]
#[error(
    "processes of the controller uid {uid} survived SIGKILL for {} ms: {pids:?} (check them with ps; they may be stuck in the kernel)",
    END_PATIENCE.as_millis()
)]
pub struct SurvivorsError {
    /// The uid.
    pub uid: u32,
    /// The pids still there.
    pub pids: Vec<i32>,
}

/// A running controller.
#[derive(Debug)]
pub struct Controller {
    pid: Pid,
    uid: u32,
    // Kept so std does not consider the child gone; never waited on through std (the runner
    // reaps with waitpid itself).
    _child: Child,
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    stderr: ChildStderr,
    out: Vec<u8>,
    out_eof: bool,
    err_kept: Vec<u8>,
    err_total: u64,
    err_eof: bool,
}

impl Controller {
    /// Starts the controller: its own session, uid and gid `command.uid/gid` (all three of
    /// each), no supplementary groups (inherited from the runner), the environment
    /// [`CONTROLLER_ENV`], the runner's working directory, no core dumps, SIGKILL if the runner
    /// dies, descriptors above 2 closed.
    pub fn spawn(command: &ControllerCommand) -> Result<Controller, SpawnControllerError> {
        let (uid, gid) = (command.uid, command.gid);
        let parent = rustix::process::getpid();
        #[allow(
            clippy::disallowed_methods,
            reason = "the trial runner's own spawn: it runs inside the sandbox image and needs a stdin pipe"
        )]
        let mut cmd = std::process::Command::new(&command.program);
        cmd.args(&command.args)
            .env_clear()
            .envs(CONTROLLER_ENV)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: the closure runs in the forked child before exec and makes only system calls
        // (no allocation, no locks): the per-thread calls are per-process here because the
        // child has one thread.
        unsafe {
            cmd.pre_exec(move || child_setup(uid, gid, parent));
        }
        let mut child = cmd.spawn().map_err(|source| SpawnControllerError::Spawn {
            program: command.program.clone(),
            source,
        })?;
        let pid = Pid::from_raw(child.id() as i32).expect("a child pid is positive");
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            unreachable!("all three were requested as pipes");
        };
        let controller = Controller {
            pid,
            uid,
            _child: child,
            stdin: Some(stdin),
            stdout,
            stderr,
            out: Vec::new(),
            out_eof: false,
            err_kept: Vec::new(),
            err_total: 0,
            err_eof: false,
        };
        for fd in [
            controller.stdin.as_ref().map(|s| s.as_fd()),
            Some(controller.stdout.as_fd()),
            Some(controller.stderr.as_fd()),
        ]
        .into_iter()
        .flatten()
        {
            set_nonblocking(fd).map_err(SpawnControllerError::Pipes)?;
        }
        Ok(controller)
    }

    /// The controller's pid.
    pub fn pid(&self) -> i32 {
        self.pid.as_raw_nonzero().get()
    }

    /// Writes `line` to the controller's stdin and reads one answer line (returned without its
    /// newline), both before `deadline`. Its stderr is drained meanwhile. Lines the controller
    /// wrote ahead are kept for the next exchanges.
    pub fn exchange(&mut self, line: &[u8], deadline: Instant) -> Result<Vec<u8>, Fault> {
        let mut written = 0;
        loop {
            if self.err_total > STDERR_FLOOD_BYTES {
                return Err(Fault::Flood(format!(
                    "more than {STDERR_FLOOD_BYTES} bytes on stderr"
                )));
            }
            if written == line.len() {
                let window = &self.out[..self.out.len().min(MAX_LINE_BYTES)];
                if let Some(pos) = window.iter().position(|b| *b == b'\n') {
                    let answer = self.out[..pos].to_vec();
                    self.out.drain(..=pos);
                    return Ok(answer);
                }
                if self.out.len() >= MAX_LINE_BYTES {
                    return Err(Fault::Flood(format!(
                        "an answer line longer than {MAX_LINE_BYTES} bytes"
                    )));
                }
                if self.out_eof {
                    return Err(Fault::Exited);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Fault::Timeout);
            }
            let want_write = written < line.len();
            let want_read = written == line.len() && !self.out_eof;
            let stdin = match (&self.stdin, want_write) {
                (Some(s), true) => Some(s.as_fd()),
                (None, true) => return Err(Fault::Exited),
                _ => None,
            };
            let mut fds = Vec::with_capacity(3);
            if let Some(fd) = stdin {
                fds.push(PollFd::from_borrowed_fd(fd, PollFlags::OUT));
            }
            if want_read {
                fds.push(PollFd::from_borrowed_fd(self.stdout.as_fd(), PollFlags::IN));
            }
            if !self.err_eof {
                fds.push(PollFd::from_borrowed_fd(self.stderr.as_fd(), PollFlags::IN));
            }
            let left = deadline - now;
            let timeout = Timespec {
                tv_sec: left.as_secs() as _,
                tv_nsec: left.subsec_nanos() as _,
            };
            match poll(&mut fds, Some(&timeout)) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(Fault::Poll(e.to_string())),
            }
            drop(fds);
            if want_write {
                match self.stdin.as_mut().map(|s| s.write(&line[written..])) {
                    Some(Ok(n)) => written += n,
                    Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Some(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                    // EPIPE: it closed its stdin or exited.
                    _ => return Err(Fault::Exited),
                }
            }
            if want_read {
                let mut chunk = [0u8; 8192];
                match self.stdout.read(&mut chunk) {
                    Ok(0) => self.out_eof = true,
                    Ok(n) => self.out.extend_from_slice(&chunk[..n]),
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                        ) => {}
                    Err(_) => self.out_eof = true,
                }
            }
            self.drain_stderr();
        }
    }

    /// Reads what stderr has now, keeping the first [`STDERR_KEPT_BYTES`].
    fn drain_stderr(&mut self) {
        let mut chunk = [0u8; 16384];
        while !self.err_eof && self.err_total <= STDERR_FLOOD_BYTES {
            match self.stderr.read(&mut chunk) {
                Ok(0) => self.err_eof = true,
                Ok(n) => {
                    let room = STDERR_KEPT_BYTES.saturating_sub(self.err_kept.len());
                    self.err_kept.extend_from_slice(&chunk[..n.min(room)]);
                    self.err_total += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => self.err_eof = true,
            }
        }
    }

    /// Ends the controller: closes its stdin, kills its process group and then every process
    /// of its uid (found in /proc, signalled through a pidfd, so a recycled pid is never hit),
    /// reaps them (the runner is a child subreaper, so orphans come back to it), and collects
    /// what is left of its stderr. No grace period: a trial's end is decided by the runner.
    pub fn finish(mut self) -> Result<Ended, SurvivorsError> {
        self.stdin = None;
        let _ = rustix::process::kill_process_group(self.pid, Signal::KILL);
        let exit = end_processes_of_uid(self.uid, self.pid)?;
        // Every writer is gone: read stderr to its end (bounded by the flood cap).
        self.drain_stderr();
        Ok(Ended {
            exit,
            stderr_truncated: self.err_total > self.err_kept.len() as u64,
            stderr: self.err_kept,
        })
    }
}

/// In the child, between fork and exec: the uid switch and the rest. Only system calls.
fn child_setup(uid: u32, gid: u32, parent: Pid) -> io::Result<()> {
    use rustix::process::{Gid, Uid};
    let (u, g) = (Uid::from_raw(uid), Gid::from_raw(gid));
    // The runner holds the controller's ids as its effective ones, so an unprivileged process
    // may take them as all three. Gid first: after the uid switch it would not be allowed.
    rustix::thread::set_thread_res_gid(g, g, g)?;
    rustix::thread::set_thread_res_uid(u, u, u)?;
    rustix::process::setsid()?;
    // Set after the uid switch, which clears it.
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
    if rustix::process::getppid() != Some(parent) {
        // The runner died before the line above.
        return Err(io::Error::other("the runner is gone"));
    }
    rustix::process::setrlimit(
        rustix::process::Resource::Core,
        rustix::process::Rlimit {
            current: Some(0),
            maximum: Some(0),
        },
    )?;
    close_inherited_descriptors()
}

/// Marks every descriptor above 2 close-on-exec. Async-signal-safe.
fn close_inherited_descriptors() -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range only changes descriptor flags; the arguments are plain integers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = fcntl_getfl(fd)?;
    fcntl_setfl(fd, flags | OFlags::NONBLOCK)?;
    Ok(())
}

/// Makes this process a child subreaper: orphans of the controller (a process that called
/// setsid and whose parent exited) come back to the runner, which reaps them.
pub fn become_subreaper() -> io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
    Ok(())
}

/// Kills every process whose real, effective or saved uid is `uid` (other than this one),
/// reaps them, and returns how `main` (the controller's first process) ended.
fn end_processes_of_uid(uid: u32, main: Pid) -> Result<Option<ExitInfo>, SurvivorsError> {
    let started = Instant::now();
    let me = std::process::id() as i32;
    let mut exit = None;
    loop {
        let left = processes_of_uid(uid, me);
        for &pid in &left {
            kill_by_pidfd(pid, uid);
        }
        // Reap whatever has ended (our children, and orphans handed to us).
        while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
            if pid == main {
                let raw = std::process::ExitStatus::from_raw(status.as_raw());
                exit = raw
                    .code()
                    .map(ExitInfo::Code)
                    .or(raw.signal().map(ExitInfo::Signal));
            }
        }
        if left.is_empty() {
            return Ok(exit);
        }
        if started.elapsed() >= END_PATIENCE {
            return Err(SurvivorsError { uid, pids: left });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// SIGKILL to `pid` through a pidfd, after checking (on the process the pidfd pins) that it
/// still belongs to `uid`.
fn kill_by_pidfd(pid: i32, uid: u32) {
    let Some(p) = Pid::from_raw(pid) else {
        return;
    };
    let Ok(fd) = rustix::process::pidfd_open(p, PidfdFlags::empty()) else {
        return; // gone
    };
    if status_uids(pid).is_some_and(|uids| uids.contains(&uid)) {
        let _ = rustix::process::pidfd_send_signal(&fd, Signal::KILL);
    }
}

/// Pids (other than `me`) with `uid` as real, effective, saved or filesystem uid, zombies
/// included.
pub fn processes_of_uid(uid: u32, me: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|&pid| pid != me && status_uids(pid).is_some_and(|u| u.contains(&uid)))
        .collect()
}

fn status_uids(pid: i32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    Some(
        line.split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_bare_names_in_the_controller_path_only() {
        let sh = resolve_program(&OsString::from("sh")).unwrap();
        assert!(
            sh.starts_with("/usr/bin") || sh.starts_with("/bin"),
            "{sh:?}"
        );
        assert!(matches!(
            resolve_program(&OsString::from("no-such-program-here")),
            Err(ResolveProgramError::NotFound(_))
        ));
        assert!(matches!(
            resolve_program(&OsString::from("./missing.js")),
            Err(ResolveProgramError::NotFound(_))
        ));
        assert!(matches!(
            resolve_program(&OsString::new()),
            Err(ResolveProgramError::Missing)
        ));
    }
}
