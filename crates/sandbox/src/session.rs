//! A session's sandbox: one sandbox kept across calls, its agent (`plimsoll-agent
//! --session`) serving cells in an interpreter that keeps its state, shell steps and files,
//! one call at a time (docs/sessions.md). The engine decides everything (who, which floor,
//! which limits, when it ends); a provider only opens, calls, re-reads the wall and closes.

use std::time::Duration;

use plimsoll_wire::{OutputChunk, SessionAnswer, SessionCall, SessionLine, Wall};

use crate::LaunchError;

/// Cancels the cell a session's agent is running ([`SessionSandbox::canceller`]).
pub type Canceller = Box<dyn Fn() + Send + Sync>;

/// What a canceller writes to a session agent's standard input: an empty line, which the
/// agent takes as a cancel while a cell runs and drops otherwise (docs/agent.md).
pub const CANCEL_LINE: &[u8] = b"\n";

/// An open session's sandbox. Dropping it without [`SessionSandbox::close`] must still end
/// its processes; `close` also removes what is left and says whether that worked.
pub trait SessionSandbox: Send + std::fmt::Debug {
    /// The uid its code runs as.
    fn uid(&self) -> u32;
    /// Its wall when it opened, judged against the provider's evidence: what every call's
    /// re-check compares with.
    fn wall_at_open(&self) -> &Wall;
    /// Its wall now, read as it was at open (from the host's /proc, or said from inside at
    /// runsc) and judged again. `Err` when it cannot be read or no longer passes.
    fn wall_now(&mut self) -> Result<Wall, LaunchError>;
    /// One call, answered within `within` (else an error: the call may have run); each
    /// output chunk the agent sends first goes to `on_chunk`.
    fn call(
        &mut self,
        call: &SessionCall,
        within: Duration,
        on_chunk: &mut dyn FnMut(OutputChunk),
    ) -> Result<SessionAnswer, LaunchError>;
    /// What cancels a cell under way from another thread (its client went away): the
    /// agent ends the cell's interpreter as its deadline would (`interpreter_crash`, killed
    /// by a signal) and answers; the session goes on. `None` where it cannot. Sent after the
    /// cell's answer, it is dropped. A job's steps are not cancelled: they run to their
    /// deadline.
    fn canceller(&self) -> Option<Canceller> {
        None
    }
    /// Saves the sandbox whole (its processes' memory and its writable files) into the
    /// directory `image`; then, with `go_on`, goes on from that image, as every session
    /// restored from it will ([`crate::Provider::restore_session`]), and without, is gone
    /// (its processes saved, none left running). `Err` marked not started (the default:
    /// [`plimsoll_wire::Reason::Unsupported`], saying why) leaves the session as it was; any
    /// other `Err` leaves it gone.
    fn checkpoint(&mut self, image: &std::path::Path, go_on: bool) -> Result<(), LaunchError> {
        let _ = (image, go_on);
        Err(LaunchError::not_started(
            plimsoll_wire::Reason::Unsupported,
            "this provider's sessions cannot be snapshotted",
        ))
    }
    /// Whether its sandbox is still there (its agent alive).
    fn alive(&mut self) -> bool;
    /// Ends its processes and removes everything of it.
    fn close(self: Box<Self>) -> Result<(), crate::CloseSessionError>;
}

/// Reads an agent's lines (each from `next_line`) up to its answer: every chunk line goes to
/// `on_chunk`, the answer line is returned. Anything that is not a [`SessionLine`] is an
/// error: the agent is not trusted beyond what it reports.
pub fn read_answer(
    mut next_line: impl FnMut() -> Result<Vec<u8>, String>,
    on_chunk: &mut dyn FnMut(OutputChunk),
) -> Result<SessionAnswer, String> {
    loop {
        let line = next_line()?;
        let line: SessionLine = serde_json::from_slice(&line).map_err(|e| {
            format!("the session's agent answered something else ({e}): check plimsoll-agent")
        })?;
        match line {
            SessionLine::Chunk(chunk) => on_chunk(chunk),
            SessionLine::Answer(answer) => return Ok(*answer),
        }
    }
}

/// The wall the session's agent says of itself now ([`SessionCall::Wall`]), not yet judged:
/// where the host's /proc cannot see into the sandbox (gVisor, a VM's guest).
pub fn said_wall_now(
    sandbox: &mut dyn SessionSandbox,
    within: Duration,
) -> Result<Wall, LaunchError> {
    let answer = sandbox.call(&SessionCall::Wall, within, &mut |_| {})?;
    answer.wall.ok_or_else(|| {
        LaunchError::environment(format!(
            "the session's agent answered no wall ({})",
            answer.error.as_deref().unwrap_or("and said nothing of why")
        ))
    })
}
