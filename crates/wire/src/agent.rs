//! The job a provider hands the in-sandbox agent (`plimsoll-agent`) and what it answers.
//! The agent reads one [`AgentJob`] as JSON on stdin and writes one
//! [`RunResult`](crate::RunResult) as JSON on stdout.

use serde::{Deserialize, Serialize};

use crate::RunSpec;

/// One run, as the agent inside a sandbox receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentJob {
    /// What to run. Project files are written under `work_dir`.
    pub spec: RunSpec,
    /// The directory files are written to and steps run in (`/work` in containers and VMs).
    pub work_dir: String,
    /// Bytes kept per output stream per step.
    pub output_bytes: u64,
    /// Bytes kept per artifact.
    pub artifact_bytes: u64,
    /// Milliseconds the agent has, from its start, before it must stop the step in progress
    /// (mark it timed out) and answer. The host kills the sandbox a little later regardless.
    pub deadline_ms: u64,
    /// Present when a step is a trial step (see [`crate::trial_step`]): the agent then starts
    /// as uid 0 with exactly CAP_SETUID and CAP_SETGID, works as `uid`, runs every ordinary
    /// step as `uid` with no capability, and only the runner with the two capabilities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trial: Option<crate::TrialIds>,
}

/// One call to a session's agent (`plimsoll-agent --session LANGUAGE`): one JSON line on its
/// standard input. The agent answers each with [`SessionLine`]s on its standard output:
/// output chunks as they come, then one answer (docs/agent.md, "Sessions").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SessionCall {
    /// Run code in the session's interpreter, whose state (variables, imports, functions,
    /// open files) stays for the next cell.
    Cell(SessionCell),
    /// A project in the session's work directory: files written, steps run in order in the
    /// shell, artifacts read (a step, an upload, a download). Never a trial.
    Job(SessionJob),
    /// Say the agent's own wall again, as `--wall-first` does at its start.
    Wall,
}

/// Bytes of an agent's line beyond what its call's caps let its content be: JSON framing,
/// member names, a wall, an error message.
pub const ANSWER_FRAMING: u64 = 1024 * 1024;

impl SessionCall {
    /// The longest line a session's agent may write for this call (an output chunk or its
    /// answer): every byte the call's caps let its answer keep (both streams of the cell, or
    /// of every step and the job, and every artifact), six times over since JSON may spell
    /// one byte as six (`\u0000`), plus [`ANSWER_FRAMING`]. What the host reads from a
    /// session's sandbox for one call is bounded by it, never by what the agent says.
    pub fn line_max(&self) -> usize {
        let content = match self {
            SessionCall::Cell(cell) => cell.output_bytes.saturating_mul(2),
            SessionCall::Job(SessionJob { job, .. }) => {
                let (steps, artifacts, names) = match &job.spec {
                    RunSpec::Project(p) => (
                        p.steps.len() as u64,
                        p.artifacts.len() as u64,
                        // Paths and step names come back in the answer too.
                        p.artifacts.iter().map(String::len).sum::<usize>() as u64
                            + p.steps
                                .iter()
                                .filter_map(|s| s.name.as_ref())
                                .map(String::len)
                                .sum::<usize>() as u64,
                    ),
                    RunSpec::Snippet(_) => (1, 0, 0),
                };
                job.output_bytes
                    .saturating_mul(2)
                    .saturating_mul(steps.saturating_add(1))
                    .saturating_add(job.artifact_bytes.saturating_mul(artifacts))
                    .saturating_add(names)
            }
            SessionCall::Wall => 0,
        };
        usize::try_from(content.saturating_mul(6).saturating_add(ANSWER_FRAMING))
            .unwrap_or(usize::MAX)
    }
}

/// A project job for a session's agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionJob {
    /// The job; its spec is a project without trial steps, `trial` is absent.
    pub job: AgentJob,
    /// Send its steps' output chunks as they come, before the answer.
    pub stream: bool,
}

/// What a session's agent writes, as one line on its standard output, once its interpreter
/// has started and it reads calls (after its wall, with `--wall-first`).
pub const SESSION_READY_LINE: &[u8] = b"plimsoll-session: ready\n";

/// A cell for a session's interpreter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionCell {
    /// The code, in the session's language.
    pub code: String,
    /// Start a fresh interpreter first (the old one, alive or not, is ended): the cell then
    /// runs with no state, and says `state_kept: false`.
    pub restart: bool,
    /// Milliseconds the cell may run; past it the interpreter is killed (`cell_timeout`).
    pub deadline_ms: u64,
    /// Bytes kept per stream.
    pub output_bytes: u64,
    /// Send output chunks as they come, before the answer.
    pub stream: bool,
}

/// One line a session's agent writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SessionLine {
    /// Output as it came (a preview: the answer's result is what counts).
    Chunk(crate::OutputChunk),
    /// The call's answer.
    Answer(Box<SessionAnswer>),
}

/// A session agent's answer to one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionAnswer {
    /// What a cell or job did (for a cell, with `state_kept` and `interpreter_end`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<crate::RunResult>,
    /// The agent's wall, for [`SessionCall::Wall`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall: Option<crate::Wall>,
    /// Why the call could not be done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With `error`: nothing of the call ran (it was refused before any of it started).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nothing_ran: bool,
    /// With `error`, for a cell refused because the interpreter had already ended (between
    /// calls): why it ended, as far as the agent can tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interpreter_ended: Option<crate::EndReason>,
}
