//! Sessions (`plimsoll-agent --session LANGUAGE`): one sandbox serving many calls. One
//! interpreter runs cells and keeps its state (variables, imports, functions, open files)
//! from one cell to the next; project jobs (shell steps, uploads, downloads) run in the same
//! work directory; calls come as JSON lines on stdin, and output chunks and one answer per
//! call go out as JSON lines on stdout (docs/agent.md, "Sessions").
//!
//! The interpreter runs a small driver (`session/driver.py`, `session/driver.js`) that reads
//! each cell from descriptor 3 (`LENGTH\n`, then that many bytes of code) and writes one byte
//! per event on descriptor 4 (`R` ready, `0` the cell completed, `1` it raised); a cell's own
//! output is the interpreter's stdout and stderr, pipes the agent reads. All of it is watched
//! from the agent's one thread, by poll over those pipes, stdin and SIGCHLD's signalfd, as
//! the supervisor watches steps (which is why it stays single-threaded: see `supervise`).

use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plimsoll_sys::exec::{PreExec, Step};
use plimsoll_wire::trial_step::{TRIAL_RUNNER, trial_step};
use plimsoll_wire::{
    Bytes, EndReason, Language, OutputChunk, OutputStream, RunResult, RunSpec, SessionAnswer,
    SessionCall, SessionCell, SessionJob, SessionLine,
};
use rustix::event::{PollFd, PollFlags, poll};
use rustix::io::Errno;

use crate::oom::OomCounter;
use crate::privilege::{Privileges, TakePrivilegesError};
use crate::run::{interpreter, mark_inherited_descriptors_cloexec, run_project};
use crate::supervise::{
    DRAIN_GRACE, Ended, KILL_WAIT, POLL_CAP, RunChildError, Sink, StartSupervisorError, Supervisor,
    Tap, command, drain, kill_group, poll_timeout, set_nonblocking,
};

/// The Python driver, run as `python3 -I -B -c DRIVER`.
const PYTHON_DRIVER: &str = include_str!("session/driver.py");
/// The JavaScript driver, run as `node -e DRIVER`.
const JAVASCRIPT_DRIVER: &str = include_str!("session/driver.js");

/// Where the interpreter reads its cells.
const CELLS_FD: i32 = 3;
/// Where the interpreter says it is ready and that a cell is done.
const EVENTS_FD: i32 = 4;

/// The longest call line the agent holds (64 MiB): a cell's code or a job's files, in JSON
/// (base64 for bytes that are not UTF-8 adds a third), well above the daemon's default
/// request body (8 MiB). A longer line is read through and answered with an error, so the
/// agent's memory stays bounded whatever the host sends.
pub const MAX_CALL_BYTES: usize = 64 * 1024 * 1024;

/// How long an interpreter may take to say it is ready for cells.
const READY_WAIT: Duration = Duration::from_secs(30);

/// How much of stdin is read at once.
const READ_BYTES: usize = 256 * 1024;

/// A session could not start; nothing ran.
#[derive(Debug, thiserror::Error)]
pub enum StartSessionError {
    /// The agent runs as root.
    #[error(transparent)]
    Privileges(#[from] TakePrivilegesError),
    /// The agent could not make itself not dumpable.
    #[error("cannot make the session's agent not dumpable")]
    NotDumpable(#[source] io::Error),
    /// The agent's current directory (the session's work directory) cannot be known.
    #[error("the session has no work directory (the agent's current directory)")]
    WorkDir(#[source] io::Error),
    /// The agent cannot watch children.
    #[error(transparent)]
    Supervisor(#[from] StartSupervisorError),
    /// The interpreter did not come to take cells.
    #[error(transparent)]
    Interpreter(#[from] StartInterpreterError),
}

/// The session's interpreter could not be started, or did not say it was ready; it has been
/// killed.
#[derive(Debug, thiserror::Error)]
pub enum StartInterpreterError {
    /// Its pipes could not be made.
    #[error("cannot make the interpreter's pipes")]
    Pipe(#[source] io::Error),
    /// Fork or exec failed.
    #[error("cannot start the interpreter")]
    Spawn(#[source] RunChildError),
    /// It ended before it said it was ready.
    #[error("the interpreter `{program}` {how} before it was ready to take cells{said}")]
    Ended {
        /// The interpreter.
        program: &'static str,
        /// How it ended.
        how: String,
        /// What it wrote on stderr, if anything (`: ...`).
        said: String,
    },
    /// It did not say it was ready in time.
    #[error("the interpreter `{program}` did not say it was ready within {} s", READY_WAIT.as_secs())]
    NotReady {
        /// The interpreter.
        program: &'static str,
    },
    /// Waiting on its pipes failed.
    #[error("cannot watch the interpreter")]
    Watch(#[source] Errno),
}

/// The session could not go on: its own stdin or stdout failed. Everything it started has
/// been killed.
#[derive(Debug, thiserror::Error)]
pub enum ServeSessionError {
    /// Reading calls failed.
    #[error("cannot read calls from stdin")]
    Read(#[source] Errno),
    /// Writing a line failed (the host closed stdout).
    #[error("cannot write to stdout")]
    Write(#[source] io::Error),
    /// Waiting on the pipes failed.
    #[error("cannot watch stdin and the interpreter")]
    Watch(#[source] Errno),
}

/// The session's interpreter, alive as far as the agent knows.
#[derive(Debug)]
struct Interpreter {
    /// Its pid, which is also its process group's id.
    pid: i32,
    /// Our end of its cells pipe (its descriptor 3); `None` once it cannot be written.
    cells: Option<OwnedFd>,
    /// Our end of its events pipe (its descriptor 4); `None` at end of file.
    events: Option<OwnedFd>,
    /// Its stdout; `None` at end of file.
    out: Option<OwnedFd>,
    /// Its stderr.
    err: Option<OwnedFd>,
}

/// A session's agent: its interpreter, its work directory, and the one supervisor that
/// watches every child it starts. [`start_session`] makes one; [`Session::serve`] serves
/// calls until stdin ends.
#[derive(Debug)]
pub struct Session {
    language: Language,
    work_dir: PathBuf,
    sup: Supervisor,
    oom: OomCounter,
    interpreter: Option<Interpreter>,
    /// How the last interpreter ended, once it has (for a cell sent without restart).
    ended: Option<String>,
    scratch: Vec<u8>,
}

/// A deadline far enough to be none (the host bounds a session's life itself).
fn far() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 86_400)
}

/// `ms` milliseconds from `now`, or none when too far to represent.
fn deadline_after(now: Instant, ms: u64) -> Instant {
    now.checked_add(Duration::from_millis(ms))
        .unwrap_or_else(far)
}

/// How a child ended, in words.
fn describe(ended: Option<Ended>) -> String {
    match ended {
        Some(Ended {
            exit_code: Some(code),
            ..
        }) => format!("exited with status {code}"),
        Some(Ended {
            signal: Some(signal),
            ..
        }) => format!("was killed by signal {signal}"),
        _ => "ended".to_owned(),
    }
}

/// A refusal: nothing of the call ran.
fn error_answer(message: String) -> SessionAnswer {
    SessionAnswer {
        result: None,
        wall: None,
        error: Some(message),
        nothing_ran: true,
        interpreter_ended: None,
    }
}

/// A call that failed after some of it may have run.
fn failed_answer(message: String) -> SessionAnswer {
    SessionAnswer {
        nothing_ran: false,
        ..error_answer(message)
    }
}

fn result_answer(result: RunResult) -> SessionAnswer {
    SessionAnswer {
        result: Some(result),
        wall: None,
        error: None,
        nothing_ran: false,
        interpreter_ended: None,
    }
}

/// Writes one line and flushes it: the host reads each as it comes.
fn say(out: &mut dyn Write, line: &SessionLine) -> io::Result<()> {
    let mut bytes = serde_json::to_vec(line).map_err(io::Error::from)?;
    bytes.push(b'\n');
    out.write_all(&bytes)?;
    out.flush()
}

fn chunk(stream: OutputStream, offset: usize, bytes: &[u8]) -> SessionLine {
    SessionLine::Chunk(OutputChunk {
        stream,
        offset: offset as u64,
        bytes: Bytes(bytes.to_vec()),
    })
}

/// Starts a session's agent: refuses root, makes itself not dumpable, marks inherited
/// descriptors close-on-exec, and starts `language`'s interpreter in the agent's current
/// directory (the session's work directory), returning once the interpreter has said it is
/// ready for cells.
pub fn start_session(language: Language) -> Result<Session, StartSessionError> {
    crate::privilege::not_root()?;
    // The cells run as the agent's uid: not dumpable, the agent's stdin and stdout (the
    // host's calls and the answers it trusts) and its memory are out of their reach through
    // /proc/<agent>/{fd,mem}. Before the interpreter exists, so no cell ever sees otherwise.
    crate::privilege::not_dumpable().map_err(|e| StartSessionError::NotDumpable(e.into()))?;
    mark_inherited_descriptors_cloexec();
    let work_dir = std::env::current_dir().map_err(StartSessionError::WorkDir)?;
    let sup = Supervisor::for_session(far())?;
    let mut session = Session {
        language,
        work_dir,
        sup,
        oom: OomCounter::find(),
        interpreter: None,
        ended: None,
        scratch: vec![0; 64 * 1024],
    };
    session.start_interpreter()?;
    Ok(session)
}

/// Calls as they come on stdin: lines, each at most [`MAX_CALL_BYTES`].
#[derive(Debug, Default)]
struct Lines {
    buf: Vec<u8>,
    /// How much of `buf` is known to hold no newline.
    scanned: usize,
    /// The line being read is over the limit: it is dropped up to its end.
    overlong: bool,
    eof: bool,
}

/// One line of stdin.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A line within the limit (its newline included, if it had one).
    Call(Vec<u8>),
    /// A line over the limit, dropped.
    TooLong,
}

impl Lines {
    /// The next whole line, if one has come (at end of file, what is left).
    fn next(&mut self) -> Option<Line> {
        if let Some(at) = self.buf[self.scanned..].iter().position(|b| *b == b'\n') {
            let end = self.scanned + at + 1;
            let line: Vec<u8> = self.buf.drain(..end).collect();
            self.scanned = 0;
            // Over the limit, whether its start was dropped already or it came at once.
            let overlong = std::mem::take(&mut self.overlong) || end > MAX_CALL_BYTES + 1;
            return Some(if overlong {
                Line::TooLong
            } else {
                Line::Call(line)
            });
        }
        self.scanned = self.buf.len();
        if self.buf.len() > MAX_CALL_BYTES {
            self.buf.clear();
            self.scanned = 0;
            self.overlong = true;
        }
        if self.eof && (!self.buf.is_empty() || self.overlong) {
            self.scanned = 0;
            let rest = std::mem::take(&mut self.buf);
            return Some(if std::mem::take(&mut self.overlong) {
                Line::TooLong
            } else {
                Line::Call(rest)
            });
        }
        None
    }
}

impl Session {
    /// Serves calls from `input` until it ends, writing chunks and answers to `out`; then
    /// kills everything the session started. `Err` when its own pipes fail (everything is
    /// killed all the same).
    pub fn serve(
        mut self,
        input: BorrowedFd<'_>,
        out: &mut dyn Write,
    ) -> Result<(), ServeSessionError> {
        let mut lines = Lines::default();
        let mut buf = vec![0u8; READ_BYTES];
        let served = loop {
            let line = match self.next_line(input, &mut lines, &mut buf) {
                Ok(Some(line)) => line,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            let answer = match line {
                Line::TooLong => error_answer(format!(
                    "the call is longer than {MAX_CALL_BYTES} bytes: send large files in \
                     several jobs"
                )),
                // An empty line is the host's cancel of a call that was answered first (it
                // is sent while a call runs, never answered).
                Line::Call(bytes) if bytes.trim_ascii().is_empty() => continue,
                Line::Call(bytes) => match serde_json::from_slice::<SessionCall>(&bytes) {
                    Err(e) => error_answer(format!("the line is not a SessionCall in JSON: {e}")),
                    Ok(call) => match self.call(&call, input, out) {
                        Ok(answer) => answer,
                        Err(e) => break Err(e),
                    },
                },
            };
            if let Err(e) = say(out, &SessionLine::Answer(Box::new(answer))) {
                break Err(ServeSessionError::Write(e));
            }
        };
        self.sup.end_all();
        served
    }

    fn call(
        &mut self,
        call: &SessionCall,
        input: BorrowedFd<'_>,
        out: &mut dyn Write,
    ) -> Result<SessionAnswer, ServeSessionError> {
        match call {
            SessionCall::Cell(cell) => self.cell(cell, input, out),
            SessionCall::Job(job) => self.job(job, out),
            SessionCall::Wall => Ok(match crate::wall::own_wall() {
                Ok(wall) => SessionAnswer {
                    result: None,
                    wall: Some(wall),
                    error: None,
                    nothing_ran: false,
                    interpreter_ended: None,
                },
                Err(e) => error_answer(crate::one_line(&e)),
            }),
        }
    }

    /// Waits for the next line of `input`, meanwhile reading and dropping what the
    /// interpreter writes between calls (so it never blocks on a full pipe) and noting its
    /// end. `None` at end of input.
    fn next_line(
        &mut self,
        input: BorrowedFd<'_>,
        lines: &mut Lines,
        buf: &mut [u8],
    ) -> Result<Option<Line>, ServeSessionError> {
        loop {
            if let Some(line) = lines.next() {
                return Ok(Some(line));
            }
            if lines.eof {
                return Ok(None);
            }
            let readable = {
                let signals = self.sup.child_signals();
                let mut fds = vec![
                    PollFd::new(&input, PollFlags::IN),
                    PollFd::new(&signals, PollFlags::IN),
                ];
                if let Some(it) = &self.interpreter {
                    for fd in it.out.iter().chain(it.err.iter()) {
                        fds.push(PollFd::new(fd, PollFlags::IN));
                    }
                }
                // Capped: an exit whose SIGCHLD was missed is still noticed.
                let now = Instant::now();
                match poll(&mut fds, Some(&poll_timeout(now, now + POLL_CAP))) {
                    Ok(_) | Err(Errno::INTR) => {}
                    Err(e) => return Err(ServeSessionError::Watch(e)),
                }
                !fds[0].revents().is_empty()
            };
            if readable {
                match rustix::io::read(input, &mut *buf) {
                    Ok(0) => lines.eof = true,
                    Ok(n) => lines.buf.extend_from_slice(&buf[..n]),
                    Err(Errno::INTR | Errno::AGAIN) => {}
                    Err(e) => return Err(ServeSessionError::Read(e)),
                }
            }
            self.drop_output();
            self.notice_end();
        }
    }

    /// Reads and drops what the interpreter's stdout and stderr hold now: output written
    /// while no cell runs belongs to no cell.
    fn drop_output(&mut self) {
        if let Some(it) = &mut self.interpreter {
            for fd in [&mut it.out, &mut it.err] {
                if let Some(f) = fd.as_ref()
                    && drain(f.as_fd(), &mut self.scratch, None)
                {
                    *fd = None;
                }
            }
        }
    }

    /// Notes that the interpreter ended outside a cell (between calls, or killed by a job's
    /// step), if it has (reaped by now).
    fn notice_end(&mut self) {
        self.sup.reap_now();
        if let Some(it) = &self.interpreter
            && let Some(ended) = self.sup.status_of(it.pid)
        {
            self.end_interpreter(format!("it {} outside a cell", describe(Some(ended))));
        }
    }

    /// Ends the interpreter, if there is one: its process group, and every process the
    /// session started (no job runs now, so that is what it left), are killed. `how` is
    /// what a cell without restart is told.
    fn end_interpreter(&mut self, how: String) {
        if let Some(it) = self.interpreter.take() {
            // Its group id is surely its own only until it is reaped; after that, what is
            // left of its group is found below as the agent's descendants.
            if self.sup.status_of(it.pid).is_none() {
                kill_group(it.pid);
            }
            self.sup.end_started(None);
            self.sup.forget(it.pid);
            self.ended = Some(how);
        }
    }

    /// Starts the interpreter with its driver, its cells pipe at descriptor 3 and its
    /// events pipe at 4, in the work directory and a process group of its own, and waits
    /// until it says it is ready. What it prints before that is dropped (stderr is kept for
    /// the error when it does not come).
    fn start_interpreter(&mut self) -> Result<(), StartInterpreterError> {
        let (cells_r, cells_w) = io::pipe().map_err(StartInterpreterError::Pipe)?;
        let (events_r, events_w) = io::pipe().map_err(StartInterpreterError::Pipe)?;
        let (program, _, _) = interpreter(self.language);
        let mut cmd = command(program);
        match self.language {
            Language::Python => cmd
                .args(plimsoll_sandbox::PYTHON_FLAGS)
                .arg("-c")
                .arg(PYTHON_DRIVER),
            Language::Javascript => cmd.arg("-e").arg(JAVASCRIPT_DRIVER),
        };
        cmd.current_dir(&self.work_dir);
        // The child ends of both pipes at fixed numbers, without close-on-exec; the parent's
        // copies go with `cmd` once it has started.
        PreExec::new()
            .unnamed(Step::PlaceFds(vec![
                (OwnedFd::from(cells_r), CELLS_FD),
                (OwnedFd::from(events_w), EVENTS_FD),
            ]))
            .install_untracked(&mut cmd);
        let started = self.sup.start(cmd).map_err(StartInterpreterError::Spawn)?;
        let pid = started.pid;
        self.sup.track(pid);
        // A cell that reads its stdin reads end of file.
        drop(started.stdin);
        let it = Interpreter {
            pid,
            cells: Some(OwnedFd::from(cells_w)),
            events: Some(OwnedFd::from(events_r)),
            out: started.out,
            err: started.err,
        };
        for fd in [&it.cells, &it.events, &it.out, &it.err]
            .into_iter()
            .flatten()
        {
            // A blocking pipe would only make a read or write wait; keep going.
            let _ = set_nonblocking(fd);
        }
        self.interpreter = Some(it);
        self.ended = None;
        let ready = self.wait_ready(program);
        if let Err(e) = &ready {
            self.end_interpreter(crate::one_line(e));
        }
        ready
    }

    /// Waits for the interpreter's `R`, for at most [`READY_WAIT`].
    fn wait_ready(&mut self, program: &'static str) -> Result<(), StartInterpreterError> {
        let until = Instant::now() + READY_WAIT;
        let mut said = Sink::new(2048);
        let Session {
            sup,
            interpreter,
            scratch,
            ..
        } = self;
        let Some(it) = interpreter.as_mut() else {
            return Err(StartInterpreterError::NotReady { program });
        };
        loop {
            let now = Instant::now();
            if now >= until {
                return Err(StartInterpreterError::NotReady { program });
            }
            {
                let signals = sup.child_signals();
                let mut fds = vec![PollFd::new(&signals, PollFlags::IN)];
                for fd in [&it.events, &it.out, &it.err].into_iter().flatten() {
                    fds.push(PollFd::new(fd, PollFlags::IN));
                }
                match poll(&mut fds, Some(&poll_timeout(now, until))) {
                    Ok(_) | Err(Errno::INTR) => {}
                    Err(e) => return Err(StartInterpreterError::Watch(e)),
                }
            }
            if let Some(fd) = &it.events {
                let mut byte = [0u8; 1];
                match rustix::io::read(fd, &mut byte) {
                    Ok(1) if byte[0] == b'R' => return Ok(()),
                    Ok(0) => it.events = None,
                    Ok(_) | Err(Errno::AGAIN | Errno::INTR) => {}
                    Err(_) => it.events = None,
                }
            }
            if let Some(fd) = &it.out
                && drain(fd.as_fd(), scratch, None)
            {
                it.out = None;
            }
            if let Some(fd) = &it.err
                && drain(fd.as_fd(), scratch, Some(&mut said))
            {
                it.err = None;
            }
            sup.reap_now();
            if let Some(ended) = sup.status_of(it.pid) {
                // What it wrote before it ended is in the pipe now.
                if let Some(fd) = &it.err {
                    drain(fd.as_fd(), scratch, Some(&mut said));
                }
                let text = String::from_utf8_lossy(&said.buf);
                let text = text.trim();
                return Err(StartInterpreterError::Ended {
                    program,
                    how: describe(Some(ended)),
                    said: if text.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", text.replace(['\n', '\r'], " "))
                    },
                });
            }
        }
    }

    /// Runs one cell (after a fresh start when it asks for one) and answers what it did.
    fn cell(
        &mut self,
        cell: &SessionCell,
        input: BorrowedFd<'_>,
        out: &mut dyn Write,
    ) -> Result<SessionAnswer, ServeSessionError> {
        let fresh = cell.restart;
        if fresh {
            self.end_interpreter("it was ended for a restart".to_owned());
            if let Err(e) = self.start_interpreter() {
                return Ok(error_answer(format!(
                    "cannot start a fresh interpreter; nothing ran: {}",
                    crate::one_line(&e)
                )));
            }
        } else {
            self.notice_end();
            if self.interpreter.is_none() {
                let how = self.ended.as_deref().unwrap_or("it ended");
                return Ok(SessionAnswer {
                    interpreter_ended: Some(EndReason::InterpreterCrash),
                    ..error_answer(format!(
                        "the interpreter ended ({how}) and its state is lost; nothing ran: \
                         send the cell with restart to start a fresh one"
                    ))
                });
            }
        }
        // Output written before the cell is handed over is not the cell's.
        self.drop_output();
        if cell.deadline_ms == 0 {
            // Nothing can run in no time; the interpreter is left as it is.
            return Ok(result_answer(RunResult {
                timed_out: true,
                state_kept: Some(!fresh),
                ..RunResult::default()
            }));
        }
        let mut message = format!("{}\n", cell.code.len()).into_bytes();
        message.extend_from_slice(cell.code.as_bytes());
        let oom_before = self.oom.read();
        let ran = self.run_cell(&message, cell, input, out)?;
        let oom_rose = matches!((oom_before, self.oom.read()), (Some(b), Some(a)) if a > b);
        let alive = ran.alive();
        let end = if alive {
            None
        } else if ran.timed_out {
            Some(EndReason::CellTimeout)
        } else if oom_rose {
            Some(EndReason::OutOfMemory)
        } else {
            Some(EndReason::InterpreterCrash)
        };
        let (exit_code, signal) = match (ran.reported, ran.exited) {
            (Some(ok), _) => (Some(i32::from(!ok)), None),
            (None, Some(ended)) => (ended.exit_code, ended.signal),
            (None, None) => (None, None),
        };
        if let Some(reason) = end {
            let how = match reason {
                EndReason::CellTimeout => "a cell ran past its deadline and it was killed".into(),
                EndReason::OutOfMemory => "the memory limit killed it in a cell".into(),
                _ => format!("it {} in a cell", describe(ran.exited)),
            };
            self.end_interpreter(how);
        }
        Ok(result_answer(RunResult {
            exit_code,
            signal,
            timed_out: ran.timed_out,
            oom_killed: oom_rose,
            stdout: Bytes(ran.stdout.buf),
            stdout_truncated: ran.stdout.truncated,
            stderr: Bytes(ran.stderr.buf),
            stderr_truncated: ran.stderr.truncated,
            state_kept: Some(alive && !fresh),
            interpreter_end: end,
            ..RunResult::default()
        }))
    }

    /// Hands `message` (a cell) to the interpreter and follows it until the driver reports
    /// it done, the interpreter ends, or the deadline passes (its process group is then
    /// killed). Output goes to the cell's sinks and, when it streams, out as chunks.
    fn run_cell(
        &mut self,
        message: &[u8],
        cell: &SessionCell,
        input: BorrowedFd<'_>,
        out: &mut dyn Write,
    ) -> Result<CellRun, ServeSessionError> {
        let Session {
            sup,
            interpreter,
            scratch,
            ..
        } = self;
        let mut ran = CellRun {
            reported: None,
            exited: None,
            timed_out: false,
            stdout: Sink::new(cell.output_bytes),
            stderr: Sink::new(cell.output_bytes),
        };
        let Some(it) = interpreter.as_mut() else {
            return Ok(ran);
        };
        let deadline = deadline_after(Instant::now(), cell.deadline_ms);
        let mut sent = 0;
        let mut killed_at: Option<Instant> = None;
        let mut drain_until: Option<Instant> = None;
        // The host writes nothing while a call runs but a cancel (an empty line: its client
        // went away), or closes stdin (the session ends): either ends the cell as its
        // deadline would, without `timed_out`.
        let mut input_open = true;
        let mut cancelled = false;
        loop {
            let now = Instant::now();
            if let Some(until) = drain_until
                && (now >= until || (it.out.is_none() && it.err.is_none()))
            {
                break;
            }
            if ran.reported.is_some() {
                break;
            }
            if ran.exited.is_none() {
                match killed_at {
                    None if cancelled => {
                        kill_group(it.pid);
                        killed_at = Some(now);
                    }
                    None if now >= deadline => {
                        kill_group(it.pid);
                        ran.timed_out = true;
                        killed_at = Some(now);
                    }
                    Some(at) if now >= at + KILL_WAIT => break,
                    _ => {}
                }
            }
            let wake = match (drain_until, killed_at) {
                (Some(until), _) => until,
                (None, Some(at)) => at + KILL_WAIT,
                (None, None) => deadline,
            };
            let input_ready = {
                let signals = sup.child_signals();
                let mut fds = vec![PollFd::new(&signals, PollFlags::IN)];
                let watch_input = input_open && !cancelled;
                if watch_input {
                    fds.push(PollFd::new(&input, PollFlags::IN));
                }
                for fd in it.out.iter().chain(it.err.iter()) {
                    fds.push(PollFd::new(fd, PollFlags::IN));
                }
                if drain_until.is_none() {
                    if let Some(fd) = &it.events {
                        fds.push(PollFd::new(fd, PollFlags::IN));
                    }
                    if let Some(fd) = &it.cells
                        && sent < message.len()
                    {
                        fds.push(PollFd::new(fd, PollFlags::OUT));
                    }
                }
                match poll(&mut fds, Some(&poll_timeout(now, wake))) {
                    Ok(_) | Err(Errno::INTR) => {}
                    Err(e) => return Err(ServeSessionError::Watch(e)),
                }
                watch_input && !fds[1].revents().is_empty()
            };
            if input_ready {
                match rustix::io::read(input, &mut scratch[..]) {
                    Ok(0) => {
                        input_open = false;
                        cancelled = true;
                    }
                    Ok(_) => cancelled = true,
                    Err(Errno::AGAIN | Errno::INTR) => {}
                    Err(_) => input_open = false,
                }
            }
            read_output(it, scratch, &mut ran, cell.stream, out)?;
            if sent < message.len()
                && let Some(fd) = &it.cells
            {
                match rustix::io::write(fd, &message[sent..]) {
                    Ok(n) => sent += n,
                    Err(Errno::AGAIN | Errno::INTR) => {}
                    // Its end is gone: it has ended or is ending.
                    Err(_) => it.cells = None,
                }
            }
            if ran.reported.is_none()
                && drain_until.is_none()
                && let Some(fd) = &it.events
            {
                let mut byte = [0u8; 1];
                match rustix::io::read(fd, &mut byte) {
                    Ok(1) if matches!(byte[0], b'0' | b'1') => {
                        ran.reported = Some(byte[0] == b'0');
                        // The driver flushed the cell's output before it said so: what the
                        // cell wrote is in the pipes now.
                        read_output(it, scratch, &mut ran, cell.stream, out)?;
                    }
                    Ok(0) => it.events = None,
                    Ok(_) | Err(Errno::AGAIN | Errno::INTR) => {}
                    Err(_) => it.events = None,
                }
            }
            sup.reap_now();
            if ran.exited.is_none()
                && let Some(ended) = sup.status_of(it.pid)
            {
                ran.exited = Some(ended);
                // Output its background processes print in this window still counts.
                drain_until = Some(Instant::now() + DRAIN_GRACE);
            }
        }
        Ok(ran)
    }

    /// Runs a project job in the session's work directory, sparing the interpreter.
    fn job(
        &mut self,
        call: &SessionJob,
        out: &mut dyn Write,
    ) -> Result<SessionAnswer, ServeSessionError> {
        let job = &call.job;
        if job.trial.is_some() {
            return Ok(error_answer(
                "the job has trial ids: a session runs no trial; nothing ran".into(),
            ));
        }
        let RunSpec::Project(project) = &job.spec else {
            return Ok(error_answer(
                "the job is a snippet: a session's job is a project (files, steps, \
                 artifacts), and code runs as a cell; nothing ran"
                    .into(),
            ));
        };
        if let Some(index) = project.steps.iter().position(|s| trial_step(s).is_some()) {
            return Ok(error_answer(format!(
                "step #{index} runs {TRIAL_RUNNER}: a session runs no trial; nothing ran"
            )));
        }
        let same_dir = Path::new(&job.work_dir) == self.work_dir
            || std::fs::canonicalize(&job.work_dir).is_ok_and(|d| d == self.work_dir);
        if !same_dir {
            return Ok(error_answer(format!(
                "the job's work directory {} is not the session's ({}); nothing ran",
                job.work_dir,
                self.work_dir.display()
            )));
        }
        self.notice_end();
        let spare = self.interpreter.as_ref().map(|it| it.pid);
        self.sup.spare(spare);
        self.sup
            .set_deadline(deadline_after(Instant::now(), job.deadline_ms));
        // Offsets count each stream's kept bytes across the job's steps.
        let mut offsets = [0usize; 2];
        let mut failed: Option<io::Error> = None;
        let mut send = |stream: OutputStream, bytes: &[u8]| {
            let i = usize::from(stream == OutputStream::Stderr);
            let offset = offsets[i];
            offsets[i] += bytes.len();
            if failed.is_none()
                && let Err(e) = say(out, &chunk(stream, offset, bytes))
            {
                failed = Some(e);
            }
        };
        let tap: Tap<'_> = if call.stream { Some(&mut send) } else { None };
        let ran = run_project(&mut self.sup, job, project, Privileges::Plain, tap);
        if ran.is_err() {
            // A job that failed half-way did not clean up after its steps.
            self.sup.end_started(spare);
        }
        self.sup.set_deadline(far());
        if let Some(e) = failed {
            return Err(ServeSessionError::Write(e));
        }
        Ok(match ran {
            Ok(result) => result_answer(result),
            Err(e) => {
                let ran_before = match &e {
                    crate::RunJobError::Step { index, .. } if *index > 0 => {
                        format!(" (steps #0 to #{} ran)", index - 1)
                    }
                    _ => String::new(),
                };
                let message = format!("{}{ran_before}", crate::one_line(&e));
                // A step that could not start or be watched: earlier ones, or it, ran.
                if matches!(e, crate::RunJobError::Step { .. }) {
                    failed_answer(message)
                } else {
                    error_answer(message)
                }
            }
        })
    }
}

/// What following one cell found.
#[derive(Debug)]
struct CellRun {
    /// The driver's report: `Some(true)` completed, `Some(false)` raised.
    reported: Option<bool>,
    /// The interpreter's exit status, when it ended during the cell.
    exited: Option<Ended>,
    /// The deadline passed and its process group was killed.
    timed_out: bool,
    stdout: Sink,
    stderr: Sink,
}

impl CellRun {
    /// Whether the interpreter is alive, with its state, after the cell.
    fn alive(&self) -> bool {
        self.exited.is_none() && !self.timed_out
    }
}

/// Reads what the interpreter's stdout and stderr hold now into the cell's sinks, and with
/// `stream` writes the newly kept bytes out as chunks (never more than the result keeps).
fn read_output(
    it: &mut Interpreter,
    scratch: &mut [u8],
    ran: &mut CellRun,
    stream: bool,
    out: &mut dyn Write,
) -> Result<(), ServeSessionError> {
    for (fd, sink, which) in [
        (&mut it.out, &mut ran.stdout, OutputStream::Stdout),
        (&mut it.err, &mut ran.stderr, OutputStream::Stderr),
    ] {
        let kept = sink.buf.len();
        if let Some(f) = fd.as_ref()
            && drain(f.as_fd(), scratch, Some(&mut *sink))
        {
            *fd = None;
        }
        if stream && sink.buf.len() > kept {
            say(out, &chunk(which, kept, &sink.buf[kept..])).map_err(ServeSessionError::Write)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(chunks: &[&[u8]], eof: bool) -> Vec<Line> {
        let mut l = Lines::default();
        let mut got = Vec::new();
        for c in chunks {
            l.buf.extend_from_slice(c);
            while let Some(line) = l.next() {
                got.push(line);
            }
        }
        if eof {
            l.eof = true;
            while let Some(line) = l.next() {
                got.push(line);
            }
        }
        got
    }

    #[test]
    fn calls_are_lines_and_an_overlong_one_is_dropped_to_its_end() {
        assert_eq!(
            lines(&[b"a\nb", b"c\n\n", b"d"], true),
            [
                Line::Call(b"a\n".to_vec()),
                Line::Call(b"bc\n".to_vec()),
                Line::Call(b"\n".to_vec()),
                Line::Call(b"d".to_vec()),
            ]
        );
        let big = vec![b'x'; MAX_CALL_BYTES / 2 + 1];
        assert_eq!(
            lines(&[b"a\n", &big, &big, &big, b"x\nnext\n"], false),
            [
                Line::Call(b"a\n".to_vec()),
                Line::TooLong,
                Line::Call(b"next\n".to_vec()),
            ]
        );
        assert_eq!(lines(&[&big, &big, &big], true), [Line::TooLong]);
        let exact = vec![b'y'; MAX_CALL_BYTES];
        let got = lines(&[&exact, b"\n"], false);
        assert!(matches!(&got[..], [Line::Call(l)] if l.len() == MAX_CALL_BYTES + 1));
        // One byte more, with its newline in the same read.
        assert_eq!(
            lines(&[&exact, b"y\nok\n"], false),
            [Line::TooLong, Line::Call(b"ok\n".to_vec())]
        );
    }

    #[test]
    fn both_drivers_use_descriptors_3_and_4() {
        for driver in [PYTHON_DRIVER, JAVASCRIPT_DRIVER] {
            assert!(
                driver.contains("descriptors 3 (cells in) and 4"),
                "{driver}"
            );
        }
        assert!(PYTHON_DRIVER.contains("cells, done = 3, 4"));
        assert!(JAVASCRIPT_DRIVER.contains("fd: 3,") && JAVASCRIPT_DRIVER.contains("writeSync(4,"));
    }
}
