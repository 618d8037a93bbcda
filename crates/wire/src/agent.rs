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
