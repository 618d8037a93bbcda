//! The controller as the runner sees it: three pipes. The launcher (crate::launcher) starts
//! it as the controller uid; the runner feeds it one state line per tick and reads one answer
//! line back within a deadline, drains and caps its stderr, and has the launcher end it.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
use rustix::pipe::{PipeFlags, pipe_with};

use crate::launcher::{Launcher, LauncherError};
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
    /// The launcher could not start it (fork, the uid switch or exec failed).
    #[error("cannot start the controller")]
    Launcher(#[source] LauncherError),
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

/// A running controller.
#[derive(Debug)]
pub struct Controller {
    pid: i32,
    stdin: Option<File>,
    stdout: File,
    stderr: File,
    out: Vec<u8>,
    out_eof: bool,
    err_kept: Vec<u8>,
    err_total: u64,
    err_eof: bool,
}

impl Controller {
    /// Has the launcher start the controller with three fresh pipes as its stdin, stdout
    /// and stderr; keeps the other ends, non-blocking.
    pub fn start(launcher: &mut Launcher) -> Result<Controller, SpawnControllerError> {
        let pipe =
            || pipe_with(PipeFlags::CLOEXEC).map_err(|e| SpawnControllerError::Pipes(e.into()));
        let (in_r, in_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        for fd in [in_w.as_fd(), out_r.as_fd(), err_r.as_fd()] {
            set_nonblocking(fd).map_err(SpawnControllerError::Pipes)?;
        }
        let pid = launcher
            .spawn(in_r, out_w, err_w)
            .map_err(SpawnControllerError::Launcher)?;
        Ok(Controller {
            pid,
            stdin: Some(File::from(in_w)),
            stdout: File::from(out_r),
            stderr: File::from(err_r),
            out: Vec::new(),
            out_eof: false,
            err_kept: Vec::new(),
            err_total: 0,
            err_eof: false,
        })
    }

    /// The controller's pid.
    pub fn pid(&self) -> i32 {
        self.pid
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

    /// Ends the controller: has the launcher kill and reap every process of the controller
    /// uid, then closes its stdin, and collects what is left of its stderr. No grace period:
    /// a trial's end is decided by the runner. The kill comes before the end of input, so a
    /// controller waiting for its next state line always ends by SIGKILL, never by exiting
    /// at end of input first: identical trials give identical verdicts.
    pub fn finish(mut self, launcher: &mut Launcher) -> Result<Ended, LauncherError> {
        let exit = launcher.end();
        self.stdin = None;
        let exit = exit?;
        // Every writer is gone: read stderr to its end (bounded by the flood cap).
        self.drain_stderr();
        Ok(Ended {
            exit,
            stderr_truncated: self.err_total > self.err_kept.len() as u64,
            stderr: self.err_kept,
        })
    }
}

fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = fcntl_getfl(fd)?;
    fcntl_setfl(fd, flags | OFlags::NONBLOCK)?;
    Ok(())
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
