//! The verdict: one JSON object on the runner's stdout (docs/trials.md, "Verdict"). It is the
//! runner's own output format, consumed by whoever reads the trial's result.

use serde::Serialize;

use crate::controller::ExitInfo;
use crate::sim::Metadata;

/// The verdict's format name.
pub const VERDICT_FORMAT: &str = "plimsoll-trial-verdict/2";

/// Every trial of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// [`VERDICT_FORMAT`].
    pub format: &'static str,
    /// The simulator that examined the controller.
    pub simulator: SimulatorJson,
    /// The controller command as given (lossy UTF-8).
    pub controller: Vec<String>,
    /// Every trial passed.
    pub pass: bool,
    /// One entry per scenario, in order.
    pub trials: Vec<TrialVerdict>,
}

/// The simulator, as the verdict names it.
#[derive(Debug, Clone, Serialize)]
pub struct SimulatorJson {
    /// Its name (the image declared it under this name, and its metadata says the same).
    pub name: String,
    /// Its version, from its metadata.
    pub version: String,
    /// Lowercase hex SHA-256 of the module's bytes.
    pub sha256: String,
    /// Its whole metadata: what the report needs to chart a trajectory.
    pub metadata: Metadata,
}

/// How a trial ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// All the scenario's ticks ran, or the simulator completed the trial early.
    Completed,
    /// The simulator failed the trial (the pole fell, the tank overflowed): `detail` says why.
    Failed,
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
        !matches!(self, EndReason::Completed | EndReason::Failed)
    }
}

/// Named values in the metadata's order (a state), as one JSON object.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedValues(pub Vec<(String, f64)>);

impl Serialize for NamedValues {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
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
    /// For a failure, or a completion the simulator decided: its reason; for a controller
    /// fault: what happened, at which tick.
    pub detail: Option<String>,
    /// The controller made no fault, the trial held `pass_ticks` ticks without a failure (or
    /// the simulator completed it), and the score is at least `min_score` where one is given.
    pub pass: bool,
    /// Ticks run: records in the trajectory, steps taken.
    pub ticks: u64,
    /// The scenario's `ticks`.
    pub scenario_ticks: u64,
    /// The scenario's `pass_ticks`.
    pub pass_ticks: u64,
    /// The scenario's `min_score`, or null.
    pub min_score: Option<f64>,
    /// The step after which the simulator failed the trial (1-based), or null.
    pub failed_at_tick: Option<u64>,
    /// `failed_at_tick` in simulated seconds, or null.
    pub failed_at_seconds: Option<f64>,
    /// The simulator's score at the end, or null for a simulator that does not score.
    pub score: Option<f64>,
    /// The state after the last step, by variable name.
    pub final_state: NamedValues,
    /// Lowercase hex SHA-256 of the trajectory file.
    pub fingerprint: String,
    /// Where the trajectory was written.
    pub trajectory: String,
    /// Its size: 8 × (state values + action values) × `ticks`.
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
