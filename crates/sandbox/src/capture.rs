//! Output capture: reads a child's stdout and stderr at once into capped buffers, enforces
//! the wall deadline, and reports how the child ended.
//!
//! Past the cap, output is still drained (so the child never blocks on a full pipe) and
//! dropped, and the stream is flagged truncated. At the deadline the child's whole process
//! group is killed with SIGKILL. When the child exits, what is left of its group is killed
//! too, and the pipes are drained for a short grace only: a process that escaped the group
//! (setsid) may hold them open, and it is the provider's job to end it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::process::ExitStatusExt as _;
use std::process::Child;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
use rustix::process::{Pid, PidfdFlags, pidfd_open};

use crate::spawn::{Running, kill_group};

/// How long to wait and how much to keep.
#[derive(Debug, Clone)]
pub struct CaptureLimits {
    /// Bytes kept per stream; the rest is read and dropped.
    pub output_bytes: u64,
    /// Where kept bytes also go as they are read (a streamed answer); `None`: nowhere.
    pub tap: Option<OutputTap>,
    /// When the child is killed if it has not exited.
    pub deadline: Instant,
    /// How long to keep draining the pipes after the child has exited.
    pub drain_grace: Duration,
}

impl CaptureLimits {
    /// A deadline `timeout` from now and the default grace (100 ms).
    pub fn new(output_bytes: u64, timeout: Duration) -> Self {
        CaptureLimits {
            output_bytes,
            tap: None,
            deadline: Instant::now() + timeout,
            drain_grace: Duration::from_millis(100),
        }
    }

    /// These limits, kept bytes also handed to `tap` as they are read.
    pub fn with_tap(self, tap: Option<OutputTap>) -> Self {
        CaptureLimits { tap, ..self }
    }
}

/// How a child ended and what it printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// Exit status, `None` when a signal ended it.
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
    /// The deadline passed and the group was killed.
    pub timed_out: bool,
    /// Standard output, at most the cap.
    pub stdout: Vec<u8>,
    /// Standard output went past the cap.
    pub stdout_truncated: bool,
    /// Standard error, at most the cap.
    pub stderr: Vec<u8>,
    /// Standard error went past the cap.
    pub stderr_truncated: bool,
}

/// Capture failed; the child's group has been killed and the child reaped (or tried).
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Waiting on or reading from the child's pipes failed.
    #[error("cannot read the output of child {pid}")]
    Io {
        /// The child's pid.
        pid: u32,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Waiting for the child to end failed.
    #[error("cannot wait for child {pid}")]
    Wait {
        /// The child's pid.
        pid: u32,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Where a run's output also goes as it is read, besides its capped buffer: a streamed
/// answer's chunks (docs/sessions.md, "Streaming"). It is given exactly the bytes the buffer
/// keeps, with their offset in the stream, so no chunk goes past what the result holds.
#[derive(Clone)]
pub struct OutputTap(std::sync::Arc<TapFn>);

/// What a tap calls: `(stream, offset, bytes)`.
type TapFn = dyn Fn(OutputStream, u64, &[u8]) + Send + Sync;

impl OutputTap {
    /// A tap calling `f(stream, offset, bytes)`.
    pub fn new(f: impl Fn(OutputStream, u64, &[u8]) + Send + Sync + 'static) -> Self {
        OutputTap(std::sync::Arc::new(f))
    }

    /// Hands it `bytes` of `stream`, starting at `offset`.
    pub fn send(&self, stream: OutputStream, offset: u64, bytes: &[u8]) {
        (self.0)(stream, offset, bytes);
    }
}

impl std::fmt::Debug for OutputTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutputTap")
    }
}

pub use plimsoll_wire::OutputStream;

/// One output stream being drained into a capped buffer: what providers that follow a
/// sandbox's pipes themselves (rather than through [`capture`]) share with it.
#[derive(Debug)]
pub struct Stream {
    /// What was kept, at most the cap.
    pub buf: Vec<u8>,
    cap: usize,
    /// More arrived than the cap; the rest was read and dropped.
    pub truncated: bool,
    /// The writer closed its end.
    pub eof: bool,
    /// Where kept bytes also go, and as which stream.
    tap: Option<(OutputTap, OutputStream)>,
    /// Bytes kept so far (the buffer may have been drained by a reader of lines).
    kept: u64,
}

/// The most [`Stream::drain`] reads in one call: more than a pipe holds (at most 1 MiB), so
/// what a writer left before it ended is read in one call.
pub const DRAIN_MAX: usize = 4 * 1024 * 1024;

impl Stream {
    /// An empty stream keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Stream {
            buf: Vec::new(),
            cap,
            truncated: false,
            eof: false,
            tap: None,
            kept: 0,
        }
    }

    /// [`Stream::new`], its kept bytes also handed to `tap` as `stream` as they are read.
    pub fn tapped(cap: usize, tap: Option<OutputTap>, stream: OutputStream) -> Self {
        Stream {
            tap: tap.map(|t| (t, stream)),
            ..Stream::new(cap)
        }
    }

    /// Reads what is available now (the descriptor must be non-blocking), keeping at most
    /// `cap` bytes in all, and reading at most [`DRAIN_MAX`] bytes in one call: a writer
    /// that keeps its pipe full cannot hold its reader here, whose poll loop comes back (to
    /// its deadline, to a line it waits for) between calls.
    pub fn drain(&mut self, fd: BorrowedFd<'_>, scratch: &mut [u8]) -> io::Result<()> {
        let mut read = 0;
        while !self.eof && read < DRAIN_MAX {
            match rustix::io::read(fd, &mut *scratch) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    read += n;
                    let keep = n.min(self.cap.saturating_sub(self.buf.len()));
                    self.buf.extend_from_slice(&scratch[..keep]);
                    self.truncated |= keep < n;
                    if let Some((tap, stream)) = &self.tap
                        && keep > 0
                    {
                        tap.send(*stream, self.kept, &scratch[..keep]);
                    }
                    self.kept += keep as u64;
                }
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// What the pump read before the child ended.
struct Pumped {
    timed_out: bool,
    stdout: Stream,
    stderr: Stream,
}

/// Captures a running child's output until it exits (or the deadline kills it), then reaps
/// it. The child must lead its own process group (as [`crate::spawn::Spawn`] makes it).
pub fn capture(running: Running, limits: &CaptureLimits) -> Result<Captured, CaptureError> {
    let Running {
        mut child,
        stdout,
        stderr,
        stdin,
    } = running;
    // An input still open here is closed: the child reads end of file, as from /dev/null.
    drop(stdin);
    let pid = child.id();
    let pumped = pump(&child, stdout.as_fd(), stderr.as_fd(), limits);
    if pumped.is_err() {
        kill_group(&child);
    }
    let status = child
        .wait()
        .map_err(|source| CaptureError::Wait { pid, source })?;
    let p = pumped.map_err(|source| CaptureError::Io { pid, source })?;
    Ok(Captured {
        exit_code: status.code(),
        signal: status.signal(),
        timed_out: p.timed_out,
        stdout: p.stdout.buf,
        stdout_truncated: p.stdout.truncated,
        stderr: p.stderr.buf,
        stderr_truncated: p.stderr.truncated,
    })
}

/// Reads both pipes until the child has exited and they are drained (or the grace is over).
fn pump(
    child: &Child,
    stdout: BorrowedFd<'_>,
    stderr: BorrowedFd<'_>,
    limits: &CaptureLimits,
) -> io::Result<Pumped> {
    for fd in [stdout, stderr] {
        let flags = fcntl_getfl(fd)?;
        fcntl_setfl(fd, flags | OFlags::NONBLOCK)?;
    }
    let pid = Pid::from_raw(child.id() as i32).ok_or_else(|| io::Error::other("pid 0"))?;
    let pidfd = pidfd_open(pid, PidfdFlags::empty())?;
    let cap = usize::try_from(limits.output_bytes).unwrap_or(usize::MAX);
    let mut out = Stream::tapped(cap, limits.tap.clone(), OutputStream::Stdout);
    let mut err = Stream::tapped(cap, limits.tap.clone(), OutputStream::Stderr);
    let mut scratch = vec![0u8; 64 * 1024];
    let mut timed_out = false;
    // Set once the child has exited: stop draining at this instant.
    let mut drain_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if let Some(until) = drain_until
            && (now >= until || (out.eof && err.eof))
        {
            break;
        }
        if drain_until.is_none() && !timed_out && now >= limits.deadline {
            kill_group(child);
            timed_out = true;
        }
        let wake = match drain_until {
            Some(until) => until,
            // Killed: SIGKILL ends it promptly; poll again soon in case the pidfd is slow.
            None if timed_out => now + Duration::from_millis(50),
            None => limits.deadline,
        };
        let wait = wake.saturating_duration_since(now);
        let timeout = Timespec {
            tv_sec: wait.as_secs() as i64,
            tv_nsec: i64::from(wait.subsec_nanos()),
        };
        let mut fds = Vec::with_capacity(3);
        fds.push(PollFd::new(&pidfd, PollFlags::IN));
        if !out.eof {
            fds.push(PollFd::new(&stdout, PollFlags::IN));
        }
        if !err.eof {
            fds.push(PollFd::new(&stderr, PollFlags::IN));
        }
        let exited = match poll(&mut fds, Some(&timeout)) {
            Ok(_) => fds[0].revents().contains(PollFlags::IN),
            Err(rustix::io::Errno::INTR) => false,
            Err(e) => return Err(e.into()),
        };
        drop(fds);
        out.drain(stdout, &mut scratch)?;
        err.drain(stderr, &mut scratch)?;
        if exited && drain_until.is_none() {
            // The leader is gone: end what it left in its group, then drain briefly.
            kill_group(child);
            drain_until = Some(Instant::now() + limits.drain_grace);
        }
    }
    Ok(Pumped {
        timed_out,
        stdout: out,
        stderr: err,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spawn::Spawn;

    fn sh(script: &str, limits: &CaptureLimits) -> Captured {
        let r = Spawn::new("/bin/sh", "/")
            .args(["-c", script])
            .spawn()
            .unwrap();
        capture(r, limits).unwrap()
    }

    #[test]
    fn exit_code_and_both_streams() {
        let c = sh(
            "printf out; printf err >&2; exit 3",
            &CaptureLimits::new(1024, Duration::from_secs(10)),
        );
        assert_eq!(c.exit_code, Some(3));
        assert_eq!(c.signal, None);
        assert_eq!(c.stdout, b"out");
        assert_eq!(c.stderr, b"err");
        assert!(!c.timed_out && !c.stdout_truncated && !c.stderr_truncated);
    }

    /// A writer that never leaves the pipe empty (here a file, which never says EAGAIN)
    /// does not keep one drain reading: it returns after DRAIN_MAX, and the next goes on.
    #[test]
    fn one_drain_reads_at_most_drain_max() {
        use std::os::fd::AsFd as _;
        let path = std::env::temp_dir().join(format!("plimsoll-drain-{}", std::process::id()));
        std::fs::write(&path, vec![b'x'; 3 * DRAIN_MAX]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut s = Stream::new(usize::MAX);
        let mut scratch = vec![0u8; 64 * 1024];
        s.drain(file.as_fd(), &mut scratch).unwrap();
        assert!(!s.eof);
        assert!(s.buf.len() <= DRAIN_MAX + scratch.len(), "{}", s.buf.len());
        let mut calls = 1;
        while !s.eof {
            s.drain(file.as_fd(), &mut scratch).unwrap();
            calls += 1;
        }
        assert_eq!(s.buf.len(), 3 * DRAIN_MAX);
        assert!(calls >= 3, "{calls}");
    }

    #[test]
    fn output_past_the_cap_is_drained_and_flagged() {
        // 4 MiB on stdout: far more than the pipe holds, so the child would block if we
        // stopped reading at the cap.
        let c = sh(
            "head -c 4194304 /dev/zero; echo done >&2",
            &CaptureLimits::new(1000, Duration::from_secs(30)),
        );
        assert_eq!(c.exit_code, Some(0));
        assert_eq!(c.stdout.len(), 1000);
        assert!(c.stdout_truncated);
        assert_eq!(c.stderr, b"done\n");
        assert!(!c.stderr_truncated);
    }

    #[test]
    fn the_deadline_kills_the_whole_group() {
        let c = sh(
            "sleep 30 & sleep 30; echo never",
            &CaptureLimits::new(1024, Duration::from_millis(300)),
        );
        assert!(c.timed_out);
        assert_eq!(c.signal, Some(libc::SIGKILL));
        assert_eq!(c.exit_code, None);
        assert!(c.stdout.is_empty());
    }

    #[test]
    fn an_escaped_process_holding_the_pipe_does_not_hold_the_result() {
        // The background process leaves the group (setsid) and keeps stdout open.
        let c = sh(
            // Wait until the background process leads its own session, then exit.
            "setsid sleep 30 & while [ \"$(cut -d' ' -f6 /proc/$!/stat)\" != $! ]; do :; done; echo $!",
            &CaptureLimits::new(1024, Duration::from_secs(20)),
        );
        assert!(!c.timed_out);
        assert_eq!(c.exit_code, Some(0));
        let escapee: i32 = String::from_utf8(c.stdout).unwrap().trim().parse().unwrap();
        // It is still there (holding the pipe); end it.
        let pid = Pid::from_raw(escapee).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
        // Orphans come back to us (subreaper): reap it.
        rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()).unwrap();
    }
}
