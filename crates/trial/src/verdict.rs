//! The verdict: one JSON object on the runner's stdout (docs/trials.md, "Verdict"). It is the
//! runner's own output format, consumed by whoever reads the trial's result.

use serde::Serialize;

use crate::controller::ExitInfo;
use crate::sim::State;

/// The verdict's format name.
pub const VERDICT_FORMAT: &str = "plimsoll-trial-verdict/1";

/// Every trial of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// [`VERDICT_FORMAT`].
    pub format: &'static str,
    /// Lowercase hex SHA-256 of the simulator module.
    pub simulator_sha256: String,
    /// The controller command as given (lossy UTF-8).
    pub controller: Vec<String>,
    /// Every trial passed.
    pub pass: bool,
    /// One entry per scenario, in order.
    pub trials: Vec<TrialVerdict>,
}

/// How a trial ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// All the scenario's ticks ran and the pole never fell.
    Completed,
    /// The state became fallen.
    Fell,
    /// No full answer line before the tick's deadline.
    ControllerTimeout,
    /// An answer line that is not a finite number.
    ControllerGarbage,
    /// The controller closed its output or its input (exited) before answering.
    ControllerExited,
    /// An answer line over 4096 bytes, or over 1 MiB on stderr.
    ControllerFlood,
}

impl EndReason {
    /// True for the ends that are the controller's fault.
    pub fn is_controller_fault(self) -> bool {
        !matches!(self, EndReason::Completed | EndReason::Fell)
    }
}

/// A state in the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StateJson {
    /// Cart position, m.
    pub x: f64,
    /// Cart velocity, m/s.
    pub x_dot: f64,
    /// Pole angle, rad.
    pub theta: f64,
    /// Pole angular velocity, rad/s.
    pub theta_dot: f64,
}

impl From<State> for StateJson {
    fn from(s: State) -> Self {
        StateJson {
            x: s.x,
            x_dot: s.x_dot,
            theta: s.theta,
            theta_dot: s.theta_dot,
        }
    }
}

/// How the controller's first process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitJson {
    /// Exit status.
    Code(i32),
    /// Signal number (9: the runner ended it).
    Signal(i32),
}

impl From<ExitInfo> for ExitJson {
    fn from(e: ExitInfo) -> Self {
        match e {
            ExitInfo::Code(c) => ExitJson::Code(c),
            ExitInfo::Signal(s) => ExitJson::Signal(s),
        }
    }
}

/// One trial.
#[derive(Debug, Clone, Serialize)]
pub struct TrialVerdict {
    /// The scenario file as given (it no longer exists).
    pub scenario: String,
    /// The scenario's `name`, if any.
    pub name: Option<String>,
    /// How it ended.
    pub end_reason: EndReason,
    /// For a controller fault: what happened, at which tick.
    pub detail: Option<String>,
    /// The pole stayed up for `pass_ticks` ticks and the controller made no fault.
    pub pass: bool,
    /// Ticks run: records in the trajectory, steps taken.
    pub ticks: u64,
    /// The scenario's `ticks`.
    pub scenario_ticks: u64,
    /// The scenario's `pass_ticks`.
    pub pass_ticks: u64,
    /// The step after which the state was first fallen (1-based), or null.
    pub fell_at_tick: Option<u64>,
    /// `fell_at_tick` in simulated seconds, or null.
    pub fell_at_seconds: Option<f64>,
    /// The state after the last step.
    pub final_state: StateJson,
    /// Lowercase hex SHA-256 of the trajectory file.
    pub fingerprint: String,
    /// Where the trajectory was written.
    pub trajectory: String,
    /// Its size: 40 × `ticks`.
    pub trajectory_bytes: u64,
    /// How the controller's first process ended (usually killed, signal 9, by the runner at the
    /// end of the trial), or null if it could not be reaped.
    pub controller_exit: Option<ExitJson>,
    /// The first 4096 bytes of its stderr (invalid UTF-8 replaced).
    pub controller_stderr: String,
    /// It wrote more stderr than that.
    pub controller_stderr_truncated: bool,
    /// Wall time of the trial, controller start to end, in milliseconds (not fingerprinted);
    /// None (null) under `--reproducible`.
    pub wall_ms: Option<u64>,
}

impl Verdict {
    /// One line of JSON.
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("a verdict always serialises")
    }
}
