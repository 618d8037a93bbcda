//! Sessions at qemu: one VM kept across calls, booted as a run's (the same kernel, image,
//! jail, limits and guest set-up), whose guest runs `plimsoll-agent --wall-first --session
//! LANGUAGE` as the sandbox user instead of one job. Each call is one JSON line handed to
//! the agent's standard input over the channel, answered by chunk lines and one answer line
//! from its standard output (docs/sessions.md). The wall is said by the agent from inside the
//! guest (the host's /proc sees only QEMU): at open, and again before every call
//! (`SessionCall::Wall`), judged as a run's wall is. QEMU is killed at the session's maximum
//! lifetime by a timer of its own, and with the daemon (its parent-death signal).

use std::time::{Duration, Instant};

use plimsoll_sandbox::judge::Expectations;
use plimsoll_sandbox::{LaunchError, LaunchPlan, SessionSandbox};
use plimsoll_wire::{OutputChunk, SessionAnswer, SessionCall, Wall};

use crate::boot::SessionVm;
use crate::channel;
use crate::provider::error_chain;

/// The longest line the agent may write between calls (it writes none: one is read only to
/// say what broke the session). During a call the bound is the call's own
/// [`SessionCall::line_max`].
const BETWEEN_CALLS_LINE_MAX: usize = 64 * 1024;

/// How long the agent may take, after its wall, to start its interpreter and say it is
/// ready (or to answer a wall call).
pub const READY_WITHIN: Duration = Duration::from_secs(60);

/// Stderr kept of an agent that ended.
const STDERR_KEPT: usize = 16 * 1024;

/// An open session's VM.
#[derive(Debug)]
pub struct VmSession {
    vm: Option<SessionVm>,
    plan: LaunchPlan,
    /// What the agent's wall must show (the run's expectations).
    expected: Expectations,
    wall: Wall,
    /// Output of the agent read but not yet a whole line.
    pending: Vec<u8>,
    /// Why the agent can serve no more calls (it ended, or a call broke the channel).
    broken: Option<String>,
}

impl VmSession {
    pub(crate) fn new(vm: SessionVm, plan: LaunchPlan, expected: Expectations) -> Self {
        let wall = vm.wall().clone();
        VmSession {
            vm: Some(vm),
            plan,
            expected,
            wall,
            pending: Vec::new(),
            broken: None,
        }
    }

    /// QEMU's pid, while the VM is there.
    pub fn pid(&self) -> Option<u32> {
        self.vm.as_ref().map(SessionVm::pid)
    }

    /// The next whole line of the agent's output, at most `line_max` bytes, read until
    /// `until`.
    fn next_line(&mut self, until: Instant, line_max: usize) -> Result<Vec<u8>, String> {
        let mut stderr = Vec::new();
        loop {
            if let Some(i) = self.pending.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.pending.drain(..=i).collect();
                line.pop();
                return Ok(line);
            }
            if self.pending.len() > line_max {
                return Err(format!(
                    "the agent wrote a line over {line_max} bytes, more than the call allows"
                ));
            }
            let vm = self.vm.as_ref().ok_or("the session's VM is gone")?;
            let frame = vm
                .next_frame(until, channel::CHUNK.max(channel::RECORD_MAX))
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::TimedOut => "the agent did not answer in time".to_owned(),
                    _ => format!("reading the agent's output: {e}"),
                })?;
            match frame {
                Some((channel::STDOUT, bytes)) => self.pending.extend_from_slice(&bytes),
                Some((channel::STDERR, bytes)) => {
                    let room = STDERR_KEPT.saturating_sub(stderr.len());
                    stderr.extend_from_slice(&bytes[..bytes.len().min(room)]);
                }
                Some((channel::EXIT, record)) => {
                    let record = channel::decode_record(&record).unwrap_or_default();
                    let how = record
                        .get("code")
                        .map(|c| format!("exit {c}"))
                        .or_else(|| record.get("signal").map(|s| format!("signal {s}")))
                        .unwrap_or_else(|| "no status".into());
                    let said = String::from_utf8_lossy(&stderr);
                    return Err(format!(
                        "the session's agent ended ({how}): {}",
                        said.lines().last().unwrap_or("").trim()
                    ));
                }
                Some((channel::FATAL, line)) => {
                    return Err(format!(
                        "the guest init failed: {}",
                        String::from_utf8_lossy(&line)
                    ));
                }
                Some((tag, _)) => {
                    return Err(format!(
                        "the guest sent an unexpected frame `{}`",
                        tag.escape_ascii()
                    ));
                }
                None => return Err("the session's VM ended".into()),
            }
        }
    }

    /// The agent's chunk lines (each to `on_chunk`) up to its answer line, until `until`.
    fn answer(
        &mut self,
        until: Instant,
        line_max: usize,
        on_chunk: &mut dyn FnMut(OutputChunk),
    ) -> Result<SessionAnswer, String> {
        plimsoll_sandbox::session::read_answer(|| self.next_line(until, line_max), on_chunk)
    }

    /// Kills QEMU and removes everything of the VM. Once.
    fn remove(&mut self) -> Result<(), String> {
        match self.vm.take() {
            Some(vm) => vm.stop().map_err(|e| error_chain(&e)),
            None => Ok(()),
        }
    }
}

impl SessionSandbox for VmSession {
    /// The host uid QEMU runs as (the code runs as the guest's `sandbox` user).
    fn uid(&self) -> u32 {
        self.plan.uid
    }

    fn wall_at_open(&self) -> &Wall {
        &self.wall
    }

    fn wall_now(&mut self) -> Result<Wall, LaunchError> {
        let wall = plimsoll_sandbox::session::said_wall_now(self, READY_WITHIN)?;
        crate::boot::judge_wall(wall, &self.expected)
            .map_err(|e| LaunchError::not_started(plimsoll_wire::Reason::Environment, e))
    }

    fn call(
        &mut self,
        call: &SessionCall,
        within: Duration,
        on_chunk: &mut dyn FnMut(OutputChunk),
    ) -> Result<SessionAnswer, LaunchError> {
        if let Some(why) = &self.broken {
            return Err(LaunchError::may_have_run(format!(
                "the session's sandbox failed before: {why}"
            )));
        }
        let mut line = serde_json::to_vec(call)
            .map_err(|e| LaunchError::may_have_run(format!("cannot encode the call: {e}")))?;
        line.push(b'\n');
        let until = Instant::now() + within;
        let sent = match self.vm.as_ref() {
            Some(vm) => vm
                .send(&line, within)
                .map_err(|e| format!("cannot hand the session's agent a call: {e}")),
            None => Err("the session's VM is gone".into()),
        };
        let answered = sent.and_then(|()| self.answer(until, call.line_max(), on_chunk));
        answered.map_err(|why| {
            // The channel may be out of step (a frame cut by the deadline): no more calls.
            self.broken = Some(why.clone());
            LaunchError::may_have_run(why)
        })
    }

    fn canceller(&self) -> Option<plimsoll_sandbox::session::Canceller> {
        let write = self.vm.as_ref()?.input_writer().ok()?;
        Some(Box::new(move || {
            write(plimsoll_sandbox::session::CANCEL_LINE);
        }))
    }

    /// QEMU runs and the agent has said nothing since its last answer (an agent that ended
    /// has: its stderr and exit record, read here).
    fn checkpoint(&mut self, image: &std::path::Path, go_on: bool) -> Result<(), LaunchError> {
        let _ = (image, go_on);
        // Measured (docs/sessions.md, "Snapshots and forks"): QEMU saves and restores the
        // guest (QMP `migrate` to an fd), but every copy then shares its parent's guest
        // kernel random state, and this guest kernel has no VMGENID driver to renew it.
        Err(LaunchError::not_started(
            plimsoll_wire::Reason::Unsupported,
            "qemu sessions cannot be snapshotted yet: a restored guest repeats its parent's kernel random numbers (the guest kernel has no VMGENID driver, and re-seeding it from the host is not built), so copies would share them; open the session at runsc to snapshot it",
        ))
    }

    fn alive(&mut self) -> bool {
        if self.broken.is_some() || !self.vm.as_mut().is_some_and(SessionVm::running) {
            return false;
        }
        if self.vm.as_ref().is_some_and(SessionVm::has_output) {
            let why = match self.next_line(
                Instant::now() + Duration::from_secs(2),
                BETWEEN_CALLS_LINE_MAX,
            ) {
                Ok(line) => format!(
                    "the agent wrote between calls: {}",
                    String::from_utf8_lossy(&line[..line.len().min(200)])
                ),
                Err(why) => why,
            };
            self.broken = Some(why);
            return false;
        }
        true
    }

    fn close(mut self: Box<Self>) -> Result<(), plimsoll_sandbox::CloseSessionError> {
        match self.vm.take() {
            Some(vm) => vm
                .stop()
                .map_err(|e| plimsoll_sandbox::CloseSessionError::Remove {
                    run_id: self.plan.run_id.clone(),
                    cause: Box::new(e),
                }),
            None => Ok(()),
        }
    }
}

impl Drop for VmSession {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            tracing::error!(run_id = %self.plan.run_id, error = %e, "a session's VM was not fully removed");
        }
    }
}
