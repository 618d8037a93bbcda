//! Create, start and follow one container, so that "not dispatched" is only ever said of
//! code that cannot have run.
//!
//! `<runtime> create` gets the capture pipes; the container's process inherits them
//! (crun's and runc's "detached pass-through", runsc's sandbox likewise) and waits in the
//! runtime's init until `<runtime> start`. `create` exits once the container exists, and its
//! init (crun, runc) or sandbox process (runsc), named by the pid file, is re-parented to
//! this process (a child subreaper, see [`plimsoll_sandbox::Spawn`]): it is followed through
//! a pidfd and reaped here, its wait status being the container's.
//!
//! - [`created`]: waits for `create`. Any failure here is [`FollowError::NotStarted`]:
//!   nothing of the request ran (its process never got past the runtime's init).
//! - [`Created::follow`]: after `start`, reads both pipes (capped per stream) until the
//!   container's process has exited, kills it at the backstop deadline, and reaps it.

use std::fs;
use std::io;
use std::os::fd::{AsFd as _, OwnedFd};
use std::path::Path;
use std::process::{ChildStderr, ChildStdout};
use std::time::{Duration, Instant};

use plimsoll_sandbox::capture::Stream;
use plimsoll_sandbox::{CaptureLimits, Captured, Running};
use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
use rustix::process::{Pid, PidfdFlags, Signal, WaitOptions, pidfd_open, pidfd_send_signal};

/// How long the container's process may take to die after SIGKILL before it is left to
/// the cleanup (`delete --force`) unreaped.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How long a runtime helper (runsc's gofer) may take to end after the container's process.
const HELPER_WAIT: Duration = Duration::from_secs(1);

/// `create` did not give a container waiting to start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CreateError {
    /// Waiting for `create` or reading its pipes failed.
    #[error("cannot follow `{runtime} create`: {source}")]
    Io {
        /// The runtime's name.
        runtime: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `create` did not finish in time and was killed.
    #[error("`{runtime} create` did not finish within {secs} s and was killed")]
    Timeout {
        /// The runtime's name.
        runtime: &'static str,
        /// The time it had.
        secs: u64,
    },
    /// `create` failed.
    #[error("{runtime} could not create the container (exit {status}): {stderr}")]
    Status {
        /// The runtime's name.
        runtime: &'static str,
        /// Exit status or `signal N`.
        status: String,
        /// The first lines of the runtime's standard error.
        stderr: String,
    },
    /// `create` succeeded but left no usable pid file.
    #[error("{runtime} created the container but its pid file {path} is unusable: {why}")]
    PidFile {
        /// The runtime's name.
        runtime: &'static str,
        /// The pid file.
        path: String,
        /// Why.
        why: String,
    },
}

/// The pipes `create` was given, which the container's process holds.
#[derive(Debug)]
struct Pipes {
    stdout: ChildStdout,
    stderr: ChildStderr,
    out: Stream,
    err: Stream,
    scratch: Vec<u8>,
}

impl Pipes {
    fn new(stdout: ChildStdout, stderr: ChildStderr, cap: u64) -> io::Result<Self> {
        for fd in [stdout.as_fd(), stderr.as_fd()] {
            let flags = fcntl_getfl(fd)?;
            fcntl_setfl(fd, flags | OFlags::NONBLOCK)?;
        }
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        Ok(Pipes {
            stdout,
            stderr,
            out: Stream::new(cap),
            err: Stream::new(cap),
            scratch: vec![0u8; 64 * 1024],
        })
    }

    fn eof(&self) -> bool {
        self.out.eof && self.err.eof
    }

    /// Waits until `pidfd`'s process exits, a pipe is readable, or `until`; drains the pipes.
    /// Returns whether the process has exited.
    fn wait(&mut self, pidfd: &OwnedFd, until: Instant) -> io::Result<bool> {
        let wait = until.saturating_duration_since(Instant::now());
        let timeout = Timespec {
            tv_sec: wait.as_secs() as i64,
            tv_nsec: i64::from(wait.subsec_nanos()),
        };
        let mut fds = Vec::with_capacity(3);
        fds.push(PollFd::new(pidfd, PollFlags::IN));
        if !self.out.eof {
            fds.push(PollFd::new(&self.stdout, PollFlags::IN));
        }
        if !self.err.eof {
            fds.push(PollFd::new(&self.stderr, PollFlags::IN));
        }
        let exited = match poll(&mut fds, Some(&timeout)) {
            Ok(_) => fds[0].revents().contains(PollFlags::IN),
            Err(rustix::io::Errno::INTR) => false,
            Err(e) => return Err(e.into()),
        };
        drop(fds);
        self.out.drain(self.stdout.as_fd(), &mut self.scratch)?;
        self.err.drain(self.stderr.as_fd(), &mut self.scratch)?;
        Ok(exited)
    }
}

/// A created container whose process waits for `start`; killed and reaped when dropped
/// unless [`Created::follow`] reaped it.
#[derive(Debug)]
pub(crate) struct Created {
    pid: Pid,
    pidfd: OwnedFd,
    pipes: Pipes,
    reaped: bool,
    /// The runtime's helper processes re-parented here (runsc's gofer), reaped after it.
    helpers: Vec<(Pid, OwnedFd)>,
}

/// Waits (at most `timeout`) for `create`, started as `running` with the capture pipes, and
/// opens the container's process named by `pid_file`. `output_bytes`: the cap per stream.
pub(crate) fn created(
    runtime: &'static str,
    running: Running,
    pid_file: &Path,
    output_bytes: u64,
    timeout: Duration,
) -> Result<Created, CreateError> {
    let io_err = |source| CreateError::Io { runtime, source };
    let Running {
        mut child,
        stdout,
        stderr,
        ..
    } = running;
    let waited = (|| {
        let mut pipes = Pipes::new(stdout, stderr, output_bytes)?;
        let pid = Pid::from_raw(child.id() as i32).ok_or_else(|| io::Error::other("pid 0"))?;
        let pidfd = pidfd_open(pid, PidfdFlags::empty())?;
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if pipes.wait(&pidfd, until)? {
                return Ok((pipes, true));
            }
        }
        Ok((pipes, false))
    })();
    if !matches!(waited, Ok((_, true))) {
        // Its group: `create` and whatever it forked that is still there.
        if let Some(pid) = Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process_group(pid, Signal::KILL);
        }
    }
    let status = child.wait().map_err(io_err)?;
    reap_ended_forks(runtime);
    let (mut pipes, exited) = waited.map_err(io_err)?;
    // Whatever of the container's process exists now is ours to end: open it first.
    let opened = open_pid_file(pid_file);
    let container = |pipes| {
        opened.as_ref().ok().and_then(|&pid| {
            let pidfd = pidfd_open(pid, PidfdFlags::empty()).ok()?;
            Some(Created {
                pid,
                pidfd,
                pipes,
                reaped: false,
                helpers: Vec::new(),
            })
        })
    };
    if !exited {
        drop(container(pipes));
        return Err(CreateError::Timeout {
            runtime,
            secs: timeout.as_secs(),
        });
    }
    if !status.success() {
        // Only the runtime has written to the pipes: its process never started.
        pipes
            .err
            .drain(pipes.stderr.as_fd(), &mut pipes.scratch)
            .map_err(io_err)?;
        let stderr = String::from_utf8_lossy(&pipes.err.buf);
        let stderr: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .take(3)
            .collect();
        let stderr = stderr.join(" / ");
        drop(container(pipes));
        return Err(CreateError::Status {
            runtime,
            status: status_text(
                status.code(),
                std::os::unix::process::ExitStatusExt::signal(&status),
            ),
            stderr,
        });
    }
    let path = pid_file.display().to_string();
    let pid = opened.map_err(|why| CreateError::PidFile {
        runtime,
        path: path.clone(),
        why,
    })?;
    let pidfd = pidfd_open(pid, PidfdFlags::empty()).map_err(|e| CreateError::PidFile {
        runtime,
        path,
        why: format!("cannot open process {}: {e}", pid.as_raw_nonzero()),
    })?;
    // crun's `create` forks twice: the container's process is the child of crun's second
    // fork, which may still be there after `create` has exited. Until it is gone the
    // container's process is not ours to reap: wait for it (it ends at once) and reap it.
    following(pid, true);
    let _ = adopt(pid, Instant::now() + ADOPT_WAIT);
    reap_ended_forks(runtime);
    Ok(Created {
        pid,
        pidfd,
        pipes,
        reaped: false,
        helpers: Vec::new(),
    })
}

/// How long the runtime's intermediate process (crun's second fork) may take to end after
/// `create` has, before the container's process is followed anyway.
const ADOPT_WAIT: Duration = Duration::from_secs(5);

/// The parent and state of process `pid`, from `/proc/<pid>/stat` (`None`: gone).
fn parent_and_state(pid: i32) -> Option<(i32, char)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(") ")?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((fields.next()?.parse().ok()?, state))
}

/// Waits, at most until `until`, for process `pid` (the container's) to be this process's
/// child, so that this process is its one reaper. The runtime's process it came from may
/// outlive `create` (crun's `create` and `run --detach` fork twice: `create` waits for the
/// first fork, the second one starts the container and exits on its own): until that one
/// is gone, the container's process is its child, and a wait for it here fails with
/// `ECHILD` (had it exited already, its status would be lost). That intermediate process,
/// once it ended, is a child of this process (a child subreaper), which reaps it here: no
/// one else waits for it. Returns whether `pid` is this process's child (false: it is gone,
/// or still another's at `until`).
fn adopt(pid: Pid, until: Instant) -> bool {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let pid = pid.as_raw_nonzero().get();
    loop {
        let Some((parent, _)) = parent_and_state(pid) else {
            return false;
        };
        if parent == me {
            return true;
        }
        let now = Instant::now();
        if now >= until {
            return false;
        }
        // A pidfd for the parent, which names that parent only if it still is `pid`'s
        // parent once opened (a pid read from /proc could have been reused in between).
        let opened = Pid::from_raw(parent)
            .and_then(|p| Some((p, pidfd_open(p, PidfdFlags::empty()).ok()?)))
            .filter(|_| parent_and_state(pid).map(|(p, _)| p) == Some(parent));
        match opened {
            Some((parent, fd)) => {
                let wait = until.saturating_duration_since(now);
                let timeout = Timespec {
                    tv_sec: wait.as_secs() as i64,
                    tv_nsec: i64::from(wait.subsec_nanos()),
                };
                let mut fds = [PollFd::new(&fd, PollFlags::IN)];
                if matches!(poll(&mut fds, Some(&timeout)), Ok(n) if n > 0) {
                    // Ended: reap it if it is ours (ECHILD: it is not, its parent reaps it).
                    let _ = rustix::process::waitpid(Some(parent), WaitOptions::NOHANG);
                }
            }
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// The containers' processes being followed here (each reaped by its [`Created`] alone).
static FOLLOWED: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Marks `pid` as a followed container's process (`true`), or no longer (`false`).
fn following(pid: Pid, yes: bool) {
    let pid = pid.as_raw_nonzero().get();
    let mut followed = FOLLOWED.lock().unwrap_or_else(|e| e.into_inner());
    followed.retain(|p| *p != pid);
    if yes {
        followed.push(pid);
    }
}

/// Reaps the runtime's second forks that ended here (crun's: see [`adopt`]), which no one
/// else waits for: children of this process, dead, running the runtime (`comm` the
/// runtime's name), as root, that do not lead a session (every child this process starts
/// does, [`plimsoll_sandbox::Spawn`], and so does a container's process at crun) and are no
/// followed container's process. Only at crun: runsc's helpers are reaped by
/// [`Created::reap_helpers`], runc forks none.
fn reap_ended_forks(runtime: &str) {
    if runtime != "crun" {
        return;
    }
    let Ok(tasks) = fs::read_dir("/proc/self/task") else {
        return;
    };
    let children: Vec<i32> = tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect();
    for child in children {
        let Ok(stat) = fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let comm = head.split_once(" (").map_or("", |(_, c)| c);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (Some(&"Z"), Some(session)) = (fields.first(), fields.get(3)) else {
            continue;
        };
        let root = fs::read_to_string(format!("/proc/{child}/status")).is_ok_and(|st| {
            st.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|u| u.split_whitespace().next())
                == Some("0")
        });
        if comm != runtime || *session == child.to_string() || !root {
            continue;
        }
        let followed = FOLLOWED.lock().unwrap_or_else(|e| e.into_inner());
        if !followed.contains(&child)
            && let Some(pid) = Pid::from_raw(child)
        {
            // Under the lock: a container's process registered meanwhile is never taken.
            let _ = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG);
        }
    }
}

fn open_pid_file(pid_file: &Path) -> Result<Pid, String> {
    let text = fs::read_to_string(pid_file).map_err(|e| e.to_string())?;
    let raw: i32 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{}` is not a pid", text.trim().escape_debug()))?;
    Pid::from_raw(raw).ok_or_else(|| format!("`{raw}` is not a pid"))
}

fn status_text(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(c), _) => c.to_string(),
        (None, Some(s)) => format!("signal {s}"),
        (None, None) => "unknown".into(),
    }
}

impl Created {
    /// Reads the container's standard output up to and including its first newline (at most
    /// `max` bytes), waiting until `until`: what a process inside says before it is handed
    /// anything (`plimsoll-agent --wall-first`). Nothing read after the newline is lost: it
    /// stays for the capture.
    pub(crate) fn first_line(&mut self, until: Instant, max: usize) -> io::Result<Vec<u8>> {
        loop {
            if let Some(i) = self.pipes.out.buf.iter().position(|b| *b == b'\n') {
                return Ok(self.pipes.out.buf.drain(..=i).collect());
            }
            if self.pipes.out.buf.len() > max || self.pipes.out.truncated {
                return Err(io::Error::other(format!(
                    "it wrote more than {max} bytes without a newline"
                )));
            }
            if self.pipes.out.eof {
                return Err(io::Error::other("its standard output closed first"));
            }
            if Instant::now() >= until {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "it said nothing in time",
                ));
            }
            if self.pipes.wait(&self.pidfd, until)? && self.pipes.eof() {
                let first = self.pipes.out.buf.iter().position(|b| *b == b'\n');
                if first.is_none() {
                    return Err(io::Error::other("it exited first"));
                }
            }
        }
    }

    /// Keeps at most `cap` bytes per stream from now on, each kept byte also handed to
    /// `tap` as it is read (a warm member learns its run's output cap at the claim; its
    /// interpreter has printed nothing before, or only its wall and ready lines, read).
    pub(crate) fn set_output(&mut self, cap: u64, tap: Option<plimsoll_sandbox::OutputTap>) {
        use plimsoll_sandbox::capture::OutputStream;
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        self.pipes.out = Stream::tapped(cap, tap.clone(), OutputStream::Stdout);
        self.pipes.err = Stream::tapped(cap, tap, OutputStream::Stderr);
    }

    /// The container's process (its pid on the host).
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// The last line its process wrote on standard error so far (read now, without
    /// waiting), for an error that says why it ended: `: LINE`, or nothing.
    pub(crate) fn said_on_stderr(&mut self) -> String {
        let _ = self
            .pipes
            .err
            .drain(self.pipes.stderr.as_fd(), &mut self.pipes.scratch);
        let text = String::from_utf8_lossy(&self.pipes.err.buf);
        match text.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(line) => format!(": {}", line.trim()),
            None => String::new(),
        }
    }

    /// Also reaps these helper processes of the runtime once the container's process is
    /// gone (runsc's gofer: a zombie left unreaped makes `runsc delete` wait 5 s for it).
    pub(crate) fn also_reap(&mut self, pids: Vec<Pid>) {
        self.helpers.extend(
            pids.into_iter()
                .filter_map(|p| Some((p, pidfd_open(p, PidfdFlags::empty()).ok()?))),
        );
    }

    /// Waits a moment for each helper to end (it does once the sandbox is gone), kills it
    /// if it does not, and reaps it if it is this process's child.
    fn reap_helpers(&mut self) {
        for (pid, pidfd) in std::mem::take(&mut self.helpers) {
            let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
            let timeout = Timespec {
                tv_sec: HELPER_WAIT.as_secs() as i64,
                tv_nsec: i64::from(HELPER_WAIT.subsec_nanos()),
            };
            let exited = matches!(poll(&mut fds, Some(&timeout)), Ok(n) if n > 0);
            if !exited {
                let _ = pidfd_send_signal(&pidfd, Signal::KILL);
                let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
                let _ = poll(&mut fds, Some(&timeout));
            }
            // ECHILD: not ours (the runtime's parent reaps it).
            let _ = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG);
        }
    }

    /// After `start`: captures the container's output until its process has exited (and the
    /// pipes are drained, for at most `limits.drain_grace` after), kills it with SIGKILL at
    /// `limits.deadline` (`timed_out`), and reaps it; its wait status is the result's. Also
    /// gives when the process was first seen to have exited (for the run's phases).
    pub(crate) fn follow(
        mut self,
        limits: &CaptureLimits,
    ) -> io::Result<(Captured, Option<Instant>)> {
        let mut timed_out = false;
        let mut drain_until: Option<Instant> = None;
        let mut exited_at = None;
        loop {
            let now = Instant::now();
            if let Some(until) = drain_until
                && (now >= until || self.pipes.eof())
            {
                break;
            }
            if drain_until.is_none() && !timed_out && now >= limits.deadline {
                let _ = pidfd_send_signal(&self.pidfd, Signal::KILL);
                timed_out = true;
            }
            let wake = match drain_until {
                Some(until) => until,
                None if timed_out => now + Duration::from_millis(50),
                None => limits.deadline,
            };
            if self.pipes.wait(&self.pidfd, wake)? && drain_until.is_none() {
                let now = Instant::now();
                exited_at = Some(now);
                drain_until = Some(now + limits.drain_grace);
            }
        }
        let status = self.reap(None)?;
        self.reap_helpers();
        let pipes = &mut self.pipes;
        let captured = Captured {
            exit_code: status.and_then(|s| s.exit_status()),
            signal: status.and_then(|s| s.terminating_signal()),
            timed_out,
            stdout: std::mem::take(&mut pipes.out.buf),
            stdout_truncated: pipes.out.truncated,
            stderr: std::mem::take(&mut pipes.err.buf),
            stderr_truncated: pipes.err.truncated,
        };
        Ok((captured, exited_at))
    }

    /// Reaps the container's process, waiting at most `within` (`None`: it has exited).
    fn reap(
        &mut self,
        within: Option<Duration>,
    ) -> io::Result<Option<rustix::process::WaitStatus>> {
        if let Some(within) = within {
            let until = Instant::now() + within;
            while Instant::now() < until {
                if self.pipes.wait(&self.pidfd, until)? {
                    break;
                }
            }
        }
        let options = if within.is_some() {
            WaitOptions::NOHANG
        } else {
            WaitOptions::empty()
        };
        let mut waited = rustix::process::waitpid(Some(self.pid), options);
        if matches!(waited, Err(rustix::io::Errno::CHILD))
            && adopt(self.pid, Instant::now() + ADOPT_WAIT)
        {
            // It was still the runtime's intermediate process's child; it is ours now.
            waited = rustix::process::waitpid(Some(self.pid), options);
        }
        match waited {
            Ok(found) => {
                self.reaped = found.is_some();
                Ok(found.map(|(_, s)| s))
            }
            Err(e) => {
                // Not (or no longer) our child: nothing to reap.
                self.reaped = true;
                Err(io::Error::other(format!(
                    "cannot reap the container's process {}: {e}",
                    self.pid.as_raw_nonzero()
                )))
            }
        }
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = pidfd_send_signal(&self.pidfd, Signal::KILL);
            let _ = self.reap(Some(KILL_WAIT));
        }
        following(self.pid, false);
        self.reap_helpers();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime that starts its container as crun does (`create` forks, that fork makes a
    /// session, forks again and exits; the second fork starts the container's process and
    /// writes the pid file), its second fork outliving `create` by a second without waiting
    /// for anything (once its parent, the first fork, is gone), and a container's process
    /// that exits 3 half a second in: the one crun left a moment longer under load.
    ///
    /// With `$3` `early`, the second fork ends at once instead, before `create` exits. `$4`:
    /// `sleep` under the name `crun`, which the second fork runs (as crun's is named); `$5`:
    /// this process, the subreaper the second fork comes to once the first one is gone.
    const CRUN_LIKE: &str = r#"exec </dev/null
(
  (
    sh -c 'sleep 0.5; exit 3' &
    echo $! > "$1.tmp" && mv "$1.tmp" "$1"
    [ "$3" = early ] && linger=0 || linger=1
    exec sh -c 'echo $$ > "$1"
      while [ "$(cut -d" " -f4 /proc/$$/stat)" != "$4" ]; do sleep 0.01; done
      exec "$3" "$2" >/dev/null 2>&1' second "$2" "$linger" "$4" "$5"
  ) &
  while [ ! -s "$2" ]; do sleep 0.01; done
)
if [ "$3" = early ]; then
  g=$(cat "$2")
  while [ -e "/proc/$g" ] && [ "$(cut -d' ' -f3 "/proc/$g/stat")" != Z ]; do sleep 0.01; done
fi
"#;

    /// The container's process is still the child of the runtime's second fork when it
    /// exits, so this process cannot wait for it yet. Its status is the run's all the same
    /// (before: "cannot reap the container's process N: No child processes", a run failed
    /// as `sandbox_failed`), and the runtime's second fork is reaped too: no zombie is left.
    /// Four at once, two of whose second forks end before `create` does (each such fork,
    /// dead, was left a zombie here before: no one reaped it).
    #[test]
    fn the_container_process_is_reaped_here_once_the_runtime_let_it_go() {
        let dir = tempfile::tempdir().unwrap();
        let named_crun = dir.path().join("crun");
        fs::copy("/bin/sleep", &named_crun).unwrap();
        let runs: Vec<_> = (0..4)
            .map(|i| {
                let pid_file = dir.path().join(format!("pid{i}"));
                let second = dir.path().join(format!("second{i}"));
                let named_crun = named_crun.clone();
                std::thread::spawn(move || {
                    let running = plimsoll_sandbox::Spawn::new("/bin/sh", "/")
                        .arg("-c")
                        .arg(CRUN_LIKE)
                        .arg("crun")
                        .arg(&pid_file)
                        .arg(&second)
                        .arg(if i % 2 == 0 { "early" } else { "late" })
                        .arg(&named_crun)
                        .arg(std::process::id().to_string())
                        .spawn()
                        .unwrap();
                    let created =
                        created("crun", running, &pid_file, 1024, Duration::from_secs(10))
                            .unwrap_or_else(|e| panic!("{e}"));
                    let followed = created
                        .follow(&CaptureLimits::new(1024, Duration::from_secs(10)))
                        .map(|(c, _)| (c.exit_code, c.signal));
                    let second: i32 = fs::read_to_string(&second).unwrap().trim().parse().unwrap();
                    (followed.map_err(|e| e.to_string()), second)
                })
            })
            .collect();
        for run in runs {
            let (followed, second) = run.join().unwrap();
            assert_eq!(followed, Ok((Some(3), None)));
            assert!(
                parent_and_state(second).is_none(),
                "the runtime's second fork {second} is left: {:?}",
                parent_and_state(second)
            );
        }
    }
}
