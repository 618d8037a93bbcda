//! Trial steps in the run record: what each trial step's verdict said (the simulator it ran,
//! how each trial ended, its score and fingerprint), read from the verdict the trial runner
//! prints as the last line of the step's stdout (docs/trials.md, "Verdict"), so that the
//! record, and a signature over it, states the outcome of the exam and not only its bytes.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The verdict format [`TrialStepRecord::from_verdict`] reads.
pub const VERDICT_FORMAT: &str = "plimsoll-trial-verdict/2";
/// The most trials one trial step's record holds.
pub const TRIALS_MAX: usize = 1000;
/// The longest scenario name, in bytes (docs/simulators.md, "Scenarios").
pub const SCENARIO_NAME_MAX: usize = 200;
/// The longest reason, in bytes. A verdict's longer `detail` is cut to this (at a character
/// boundary); a record with a longer one is malformed.
pub const REASON_MAX: usize = 1000;
/// The longest simulator name, in bytes.
pub const SIMULATOR_NAME_MAX: usize = 64;
/// The longest simulator version, in bytes.
pub const SIMULATOR_VERSION_MAX: usize = 32;

/// One trial step of a project, as its verdict reported it: the simulator, whether every
/// trial passed, and each trial's outcome. A run's record lists one per trial step that
/// printed a verdict, in step order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrialStepRecord {
    /// The step's index among the project's steps, from 0.
    pub step: u32,
    /// The simulator the runner loaded.
    pub simulator: SimulatorRef,
    /// Every trial passed.
    pub pass: bool,
    /// One outcome per scenario, in the order the step named them (1 to [`TRIALS_MAX`]).
    pub trials: Vec<TrialOutcome>,
}

/// The simulator a trial step ran: its name and version from its metadata, and the SHA-256
/// of its module.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulatorRef {
    /// `[a-z0-9][a-z0-9._-]{0,63}`.
    pub name: String,
    /// 1 to 32 printable ASCII characters.
    pub version: String,
    /// Lowercase hex SHA-256 of the WebAssembly module.
    pub sha256: String,
}

/// How one trial (one scenario) ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrialOutcome {
    /// The scenario's `name`, if it had one (never its file's path, which the runner deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    /// How the trial ended.
    pub end: TrialEnd,
    /// Why, in words: the simulator's reason for a failure or an early completion, or the
    /// controller's fault and its tick (the verdict's `detail`). At most [`REASON_MAX`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Ticks run (records in the trajectory).
    pub ticks: u64,
    /// The simulator's score of the trial, for a simulator that scores (higher is better).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<Score>,
    /// The trial passed: no controller fault, the pass mark held, the minimum score reached.
    pub pass: bool,
    /// Lowercase hex SHA-256 of the trial's trajectory.
    pub fingerprint: String,
}

/// How a trial ended (the verdict's `end_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrialEnd {
    /// The simulator completed it: every tick ran, or it ended the trial early as done.
    Completed,
    /// The simulator ended it as failed (the pole fell, the tank overflowed).
    Failed,
    /// The controller gave no full answer before a tick's deadline.
    ControllerTimeout,
    /// The controller answered something that is not an action.
    ControllerGarbage,
    /// The controller exited, or closed its input or output, before the trial ended.
    ControllerExited,
    /// The controller wrote too much (an answer line or its stderr).
    ControllerFlood,
}

impl TrialEnd {
    /// The snake_case wire name, as the digest encodes it.
    pub fn as_str(self) -> &'static str {
        match self {
            TrialEnd::Completed => "completed",
            TrialEnd::Failed => "failed",
            TrialEnd::ControllerTimeout => "controller_timeout",
            TrialEnd::ControllerGarbage => "controller_garbage",
            TrialEnd::ControllerExited => "controller_exited",
            TrialEnd::ControllerFlood => "controller_flood",
        }
    }

    /// The controller's fault: a trial that ends so never passes.
    pub fn is_controller_fault(self) -> bool {
        !matches!(self, TrialEnd::Completed | TrialEnd::Failed)
    }
}

impl fmt::Display for TrialEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A trial's score: a finite binary64, a JSON number on the wire, its IEEE bits in the
/// digest. Two scores are equal when their bits are (so `0.0` and `-0.0` differ, as their
/// digests do).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Score(f64);

impl Score {
    /// The score, if `value` is finite (NaN and the infinities are no score).
    pub fn new(value: f64) -> Option<Score> {
        value.is_finite().then_some(Score(value))
    }

    /// The number.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Score {}

impl TryFrom<f64> for Score {
    type Error = String;

    fn try_from(value: f64) -> Result<Self, Self::Error> {
        Score::new(value).ok_or_else(|| format!("a score is a finite number, not {value}"))
    }
}

impl From<Score> for f64 {
    fn from(s: Score) -> f64 {
        s.0
    }
}

impl fmt::Display for Score {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Why a trial step's record is malformed: what [`TrialStepRecord::validate`] refuses, in a
/// record read from a verdict or from the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MalformedTrials {
    /// The simulator's name is not `[a-z0-9][a-z0-9._-]{0,63}`.
    #[error(
        "trial step {step}: the simulator's name `{}` is not 1 to 64 characters of a-z 0-9 . _ - starting with a letter or digit",
        name.escape_debug()
    )]
    SimulatorName {
        /// The step's index.
        step: u32,
        /// The name given.
        name: String,
    },
    /// The simulator's version is not 1 to 32 printable ASCII characters.
    #[error(
        "trial step {step}: the simulator's version `{}` is not 1 to 32 printable ASCII characters",
        version.escape_debug()
    )]
    SimulatorVersion {
        /// The step's index.
        step: u32,
        /// The version given.
        version: String,
    },
    /// The simulator's SHA-256 is not 64 lowercase hex characters.
    #[error(
        "trial step {step}: the simulator's sha256 `{}` is not 64 lowercase hex characters",
        sha256.escape_debug()
    )]
    SimulatorSha256 {
        /// The step's index.
        step: u32,
        /// The digest given.
        sha256: String,
    },
    /// No trial at all (the runner refuses to run without a scenario).
    #[error("trial step {step} lists no trial: a trial step runs at least one scenario")]
    NoTrials {
        /// The step's index.
        step: u32,
    },
    /// More than [`TRIALS_MAX`] trials.
    #[error("trial step {step} lists {count} trials, more than {TRIALS_MAX}")]
    TooManyTrials {
        /// The step's index.
        step: u32,
        /// How many it lists.
        count: usize,
    },
    /// A scenario name over [`SCENARIO_NAME_MAX`] bytes.
    #[error(
        "trial step {step}, trial {trial}: the scenario's name is {bytes} bytes, more than {SCENARIO_NAME_MAX}"
    )]
    ScenarioName {
        /// The step's index.
        step: u32,
        /// The trial's index in the step, from 0.
        trial: usize,
        /// The name's length.
        bytes: usize,
    },
    /// A reason over [`REASON_MAX`] bytes.
    #[error(
        "trial step {step}, trial {trial}: the reason is {bytes} bytes, more than {REASON_MAX}"
    )]
    Reason {
        /// The step's index.
        step: u32,
        /// The trial's index in the step, from 0.
        trial: usize,
        /// The reason's length.
        bytes: usize,
    },
    /// A fingerprint that is not 64 lowercase hex characters.
    #[error(
        "trial step {step}, trial {trial}: the fingerprint `{}` is not 64 lowercase hex characters",
        fingerprint.escape_debug()
    )]
    Fingerprint {
        /// The step's index.
        step: u32,
        /// The trial's index in the step, from 0.
        trial: usize,
        /// The fingerprint given.
        fingerprint: String,
    },
    /// A trial that ended by the controller's fault is said to pass.
    #[error(
        "trial step {step}, trial {trial}: ended `{end}`, a controller fault, yet is said to pass"
    )]
    FaultPassed {
        /// The step's index.
        step: u32,
        /// The trial's index in the step, from 0.
        trial: usize,
        /// How it ended.
        end: TrialEnd,
    },
    /// The step's `pass` is not "every trial passed".
    #[error(
        "trial step {step}: `pass` is {pass}, but {} of its trials passed",
        if *pass { "not every one" } else { "every one" }
    )]
    Pass {
        /// The step's index.
        step: u32,
        /// The `pass` stated.
        pass: bool,
    },
    /// The record's trial steps are not in strictly increasing step order.
    #[error(
        "the record lists trial step {step} after trial step {previous}: one entry per trial step, in step order"
    )]
    StepOrder {
        /// The step listed.
        step: u32,
        /// The step listed before it.
        previous: u32,
    },
}

/// Why a trial step's stdout does not end in a verdict this crate reads.
#[derive(Debug, thiserror::Error)]
pub enum BadVerdict {
    /// Not JSON, or not the shape of a `plimsoll-trial-verdict/2` verdict.
    #[error(
        "trial step {step}: its last stdout line is not a {VERDICT_FORMAT} verdict (docs/trials.md, \"Verdict\")"
    )]
    Json {
        /// The step's index.
        step: u32,
        /// What serde found wrong.
        #[source]
        source: serde_json::Error,
    },
    /// Another format.
    #[error(
        "trial step {step}: its verdict's format is `{}`, not {VERDICT_FORMAT}: the image's trial runner does not match this daemon; update one of them",
        found.escape_debug()
    )]
    Format {
        /// The step's index.
        step: u32,
        /// The format given (at most 64 bytes of it).
        found: String,
    },
    /// A verdict of the right shape whose content is out of bounds.
    #[error(transparent)]
    Malformed(#[from] MalformedTrials),
}

/// The members of a verdict/2 the record keeps; the rest are ignored (the verdict is the
/// runner's own output, and may grow members the record does not carry). The format is
/// read first, by [`VerdictFormat`].
#[derive(Deserialize)]
struct Verdict {
    simulator: VerdictSimulator,
    pass: bool,
    trials: Vec<VerdictTrial>,
}

#[derive(Deserialize)]
struct VerdictSimulator {
    name: String,
    version: String,
    sha256: String,
}

#[derive(Deserialize)]
struct VerdictTrial {
    #[serde(default)]
    name: Option<String>,
    end_reason: TrialEnd,
    #[serde(default)]
    detail: Option<String>,
    pass: bool,
    ticks: u64,
    #[serde(default)]
    score: Option<Score>,
    fingerprint: String,
}

/// Only the format, read first so a verdict of another format is named as such.
#[derive(Deserialize)]
struct VerdictFormat {
    format: String,
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Whether `s` is 64 lowercase hex characters (a SHA-256 as the protocol writes it).
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `name` is a simulator name: `[a-z0-9][a-z0-9._-]{0,63}` (docs/simulators.md).
pub fn is_simulator_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.len() <= SIMULATOR_NAME_MAX
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b".-_".contains(&b))
}

fn is_simulator_version(version: &str) -> bool {
    (1..=SIMULATOR_VERSION_MAX).contains(&version.len())
        && version.bytes().all(|b| (b' '..=b'~').contains(&b))
}

impl TrialStepRecord {
    /// What it says, for people: a line naming the simulator and whether the step passed,
    /// then one line per trial (scenario, end, reason, score, pass, fingerprint); digests are
    /// cut to 12 digits.
    pub fn describe(&self) -> Vec<String> {
        let short = |d: &str| d.get(..12).unwrap_or(d).to_owned();
        let mut lines = vec![format!(
            "trial step {}: simulator {} {} (sha256 {}): {}",
            self.step + 1,
            self.simulator.name,
            self.simulator.version,
            short(&self.simulator.sha256),
            if self.pass { "passed" } else { "FAILED" }
        )];
        for o in &self.trials {
            let mut line = format!(
                "  {}: {} after {} ticks",
                o.scenario.as_deref().unwrap_or("(unnamed scenario)"),
                o.end.as_str(),
                o.ticks
            );
            if let Some(reason) = &o.reason {
                line.push_str(&format!(" ({reason})"));
            }
            if let Some(score) = o.score {
                line.push_str(&format!(", score {}", score.get()));
            }
            line.push_str(&format!(
                ", {}, fingerprint {}",
                if o.pass { "pass" } else { "no pass" },
                short(&o.fingerprint)
            ));
            lines.push(line);
        }
        lines
    }

    /// Reads the verdict a trial step's runner printed (its stdout's last line) into the
    /// record of step `step`. The verdict's `format` must be exactly [`VERDICT_FORMAT`];
    /// members the record does not keep are ignored. Each trial's `scenario` is the
    /// scenario's `name` (not its file), its `reason` the verdict's `detail`, cut to
    /// [`REASON_MAX`] bytes at a character boundary (a long message is not worth losing the
    /// trial's outcome over); everything else out of bounds is refused
    /// ([`TrialStepRecord::validate`]).
    pub fn from_verdict(step: u32, verdict_line: &[u8]) -> Result<TrialStepRecord, BadVerdict> {
        let json = |source| BadVerdict::Json { step, source };
        let format: VerdictFormat = serde_json::from_slice(verdict_line).map_err(json)?;
        if format.format != VERDICT_FORMAT {
            return Err(BadVerdict::Format {
                step,
                found: cut(format.format, 64),
            });
        }
        let v: Verdict = serde_json::from_slice(verdict_line).map_err(json)?;
        let record = TrialStepRecord {
            step,
            simulator: SimulatorRef {
                name: v.simulator.name,
                version: v.simulator.version,
                sha256: v.simulator.sha256,
            },
            pass: v.pass,
            trials: v
                .trials
                .into_iter()
                .map(|t| TrialOutcome {
                    scenario: t.name,
                    end: t.end_reason,
                    reason: t.detail.map(|d| cut(d, REASON_MAX)),
                    ticks: t.ticks,
                    score: t.score,
                    pass: t.pass,
                    fingerprint: t.fingerprint,
                })
                .collect(),
        };
        record.validate()?;
        Ok(record)
    }

    /// Checks what serde cannot: the simulator's name, version and digest, 1 to
    /// [`TRIALS_MAX`] trials, each scenario name and reason within bounds, each fingerprint a
    /// digest, no controller fault said to pass, and `pass` exactly when every trial passed.
    pub fn validate(&self) -> Result<(), MalformedTrials> {
        let step = self.step;
        let sim = &self.simulator;
        if !is_simulator_name(&sim.name) {
            return Err(MalformedTrials::SimulatorName {
                step,
                name: sim.name.clone(),
            });
        }
        if !is_simulator_version(&sim.version) {
            return Err(MalformedTrials::SimulatorVersion {
                step,
                version: sim.version.clone(),
            });
        }
        if !is_sha256_hex(&sim.sha256) {
            return Err(MalformedTrials::SimulatorSha256 {
                step,
                sha256: sim.sha256.clone(),
            });
        }
        match self.trials.len() {
            0 => return Err(MalformedTrials::NoTrials { step }),
            count if count > TRIALS_MAX => {
                return Err(MalformedTrials::TooManyTrials { step, count });
            }
            _ => {}
        }
        for (trial, t) in self.trials.iter().enumerate() {
            if let Some(bytes) = t.scenario.as_ref().map(String::len)
                && bytes > SCENARIO_NAME_MAX
            {
                return Err(MalformedTrials::ScenarioName { step, trial, bytes });
            }
            if let Some(bytes) = t.reason.as_ref().map(String::len)
                && bytes > REASON_MAX
            {
                return Err(MalformedTrials::Reason { step, trial, bytes });
            }
            if !is_sha256_hex(&t.fingerprint) {
                return Err(MalformedTrials::Fingerprint {
                    step,
                    trial,
                    fingerprint: t.fingerprint.clone(),
                });
            }
            if t.pass && t.end.is_controller_fault() {
                return Err(MalformedTrials::FaultPassed {
                    step,
                    trial,
                    end: t.end,
                });
            }
        }
        if self.pass != self.trials.iter().all(|t| t.pass) {
            return Err(MalformedTrials::Pass {
                step,
                pass: self.pass,
            });
        }
        Ok(())
    }
}

/// Checks a record's trial steps: each one valid, and their steps strictly increasing.
pub(crate) fn validate_trial_steps(steps: &[TrialStepRecord]) -> Result<(), MalformedTrials> {
    let mut previous: Option<u32> = None;
    for s in steps {
        if let Some(previous) = previous
            && s.step <= previous
        {
            return Err(MalformedTrials::StepOrder {
                step: s.step,
                previous,
            });
        }
        s.validate()?;
        previous = Some(s.step);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIM: &str = "d7156572f87f3c557127a511301424f5c8cc718a269bf4274b5e0258d5b6656e";
    const FP: &str = "93585277088f4cfbd7683a2db52ab4a44906d74c74468ab9a49d4ddc8e959d41";

    /// A verdict/2 line as the brief shows it: one passing trial with every member the
    /// runner writes, one failing trial with a score.
    fn verdict() -> serde_json::Value {
        serde_json::json!({
            "format": "plimsoll-trial-verdict/2",
            "simulator": {"name": "cartpole", "version": "1.0.0", "sha256": SIM},
            "controller": ["node", "accepted.js"],
            "pass": false,
            "trials": [
                {"scenario": "standard.json", "name": "standard", "end_reason": "completed",
                 "detail": null, "pass": true, "ticks": 2000, "scenario_ticks": 2000,
                 "pass_ticks": 2000, "min_score": null, "failed_at_tick": null,
                 "failed_at_seconds": null, "score": null,
                 "final_state": {"x": 0.1, "x_dot": 0.0, "theta": 0.0, "theta_dot": 0.0},
                 "fingerprint": FP, "trajectory": "trajectory.bin", "trajectory_bytes": 80000,
                 "controller_exit": {"signal": 9}, "controller_stderr": "",
                 "controller_stderr_truncated": false, "wall_ms": 105},
                {"scenario": "hidden/b.json", "name": null, "end_reason": "failed",
                 "detail": "the pole fell past 12 degrees", "pass": false, "ticks": 188,
                 "scenario_ticks": 2000, "pass_ticks": 2000, "min_score": 0.5,
                 "failed_at_tick": 188, "failed_at_seconds": 1.88, "score": 0.094,
                 "final_state": {"x": 0.1}, "fingerprint": FP,
                 "trajectory": "b.bin", "trajectory_bytes": 7520,
                 "controller_exit": null, "controller_stderr": "x",
                 "controller_stderr_truncated": false, "wall_ms": null}
            ]
        })
    }

    #[test]
    fn a_trial_step_describes_itself_for_people() {
        let lines = read(&verdict()).unwrap().describe();
        assert_eq!(
            lines,
            [
                "trial step 4: simulator cartpole 1.0.0 (sha256 d7156572f87f): FAILED",
                "  standard: completed after 2000 ticks, pass, fingerprint 93585277088f",
                "  (unnamed scenario): failed after 188 ticks (the pole fell past 12 degrees), \
                 score 0.094, no pass, fingerprint 93585277088f",
            ]
        );
    }

    fn read(v: &serde_json::Value) -> Result<TrialStepRecord, BadVerdict> {
        let mut line = serde_json::to_vec(v).unwrap();
        line.push(b'\n');
        TrialStepRecord::from_verdict(3, &line)
    }

    fn malformed(v: &serde_json::Value) -> MalformedTrials {
        match read(v) {
            Err(BadVerdict::Malformed(m)) => m,
            other => panic!("expected a malformed verdict, got {other:?}"),
        }
    }

    #[test]
    fn a_verdict_becomes_the_steps_record() {
        let r = read(&verdict()).unwrap();
        assert_eq!(
            r,
            TrialStepRecord {
                step: 3,
                simulator: SimulatorRef {
                    name: "cartpole".into(),
                    version: "1.0.0".into(),
                    sha256: SIM.into(),
                },
                pass: false,
                trials: vec![
                    TrialOutcome {
                        scenario: Some("standard".into()),
                        end: TrialEnd::Completed,
                        reason: None,
                        ticks: 2000,
                        score: None,
                        pass: true,
                        fingerprint: FP.into(),
                    },
                    TrialOutcome {
                        scenario: None,
                        end: TrialEnd::Failed,
                        reason: Some("the pole fell past 12 degrees".into()),
                        ticks: 188,
                        score: Score::new(0.094),
                        pass: false,
                        fingerprint: FP.into(),
                    },
                ],
            }
        );
        // The record's JSON: the members in order, absent ones left out; it reads back.
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            json.starts_with(&format!(
                r#"{{"step":3,"simulator":{{"name":"cartpole","version":"1.0.0","sha256":"{SIM}"}},"pass":false,"trials":[{{"scenario":"standard","end":"completed","ticks":2000,"pass":true,"#
            )),
            "{json}"
        );
        assert!(
            json.contains(r#"{"end":"failed","reason":"the pole fell past 12 degrees","ticks":188,"score":0.094,"pass":false,"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<TrialStepRecord>(&json).unwrap(), r);
    }

    #[test]
    fn every_end_reads_by_its_snake_case_name() {
        for (name, end) in [
            ("completed", TrialEnd::Completed),
            ("failed", TrialEnd::Failed),
            ("controller_timeout", TrialEnd::ControllerTimeout),
            ("controller_garbage", TrialEnd::ControllerGarbage),
            ("controller_exited", TrialEnd::ControllerExited),
            ("controller_flood", TrialEnd::ControllerFlood),
        ] {
            let mut v = verdict();
            v["trials"][1]["end_reason"] = name.into();
            assert_eq!(read(&v).unwrap().trials[1].end, end);
            assert_eq!(end.as_str(), name);
            assert_eq!(serde_json::to_value(end).unwrap(), name);
        }
        // verdict/1's `fell` is not an end of verdict/2.
        let mut v = verdict();
        v["trials"][1]["end_reason"] = "fell".into();
        assert!(matches!(read(&v), Err(BadVerdict::Json { step: 3, .. })));
    }

    #[test]
    fn only_format_2_is_read() {
        for format in ["plimsoll-trial-verdict/1", "plimsoll-trial-verdict/2 ", ""] {
            let mut v = verdict();
            v["format"] = format.into();
            match read(&v) {
                Err(e @ BadVerdict::Format { step: 3, .. }) => {
                    assert!(e.to_string().contains("update one of them"), "{e}");
                }
                other => panic!("{format}: {other:?}"),
            }
        }
        let long = "x".repeat(5000);
        let mut v = verdict();
        v["format"] = long.into();
        assert!(matches!(read(&v), Err(BadVerdict::Format { found, .. }) if found.len() == 64));
        for bad in [&b""[..], b"not json", b"[]", b"{\"format\":2}", b"{}"] {
            assert!(
                matches!(
                    TrialStepRecord::from_verdict(0, bad),
                    Err(BadVerdict::Json { .. })
                ),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // A verdict/2 missing a member the record keeps.
        let mut v = verdict();
        v["trials"][0]
            .as_object_mut()
            .unwrap()
            .remove("fingerprint");
        assert!(matches!(read(&v), Err(BadVerdict::Json { .. })));
    }

    #[test]
    fn the_simulator_is_checked() {
        for (name, ok) in [
            ("cartpole", true),
            ("0.sim_x-y", true),
            (&"a".repeat(64), true),
            (&"a".repeat(65), false),
            ("", false),
            ("Cartpole", false),
            ("-x", false),
            ("a/b", false),
        ] {
            let mut v = verdict();
            v["simulator"]["name"] = name.into();
            assert_eq!(read(&v).is_ok(), ok, "{name}");
            if !ok {
                assert!(matches!(
                    malformed(&v),
                    MalformedTrials::SimulatorName { .. }
                ));
            }
        }
        for (version, ok) in [
            ("1.0.0", true),
            ("2 beta~", true),
            (&"9".repeat(32), true),
            (&"9".repeat(33), false),
            ("", false),
            ("1.0\n", false),
            ("1.0é", false),
        ] {
            let mut v = verdict();
            v["simulator"]["version"] = version.into();
            assert_eq!(read(&v).is_ok(), ok, "{version:?}");
        }
        for sha in [
            SIM.to_uppercase(),
            SIM[1..].to_owned(),
            format!("{SIM}0"),
            "x".into(),
        ] {
            let mut v = verdict();
            v["simulator"]["sha256"] = sha.into();
            assert!(matches!(
                malformed(&v),
                MalformedTrials::SimulatorSha256 { step: 3, .. }
            ));
        }
    }

    #[test]
    fn the_trials_are_checked() {
        let mut v = verdict();
        v["trials"] = serde_json::json!([]);
        assert_eq!(malformed(&v), MalformedTrials::NoTrials { step: 3 });

        let mut v = verdict();
        let one = v["trials"][0].clone();
        v["pass"] = true.into();
        v["trials"] = serde_json::Value::Array(vec![one; TRIALS_MAX]);
        assert_eq!(read(&v).unwrap().trials.len(), TRIALS_MAX);
        let first = v["trials"][0].clone();
        v["trials"].as_array_mut().unwrap().push(first);
        assert_eq!(
            malformed(&v),
            MalformedTrials::TooManyTrials {
                step: 3,
                count: TRIALS_MAX + 1
            }
        );

        let mut v = verdict();
        v["trials"][1]["name"] = "n".repeat(SCENARIO_NAME_MAX).into();
        assert!(read(&v).is_ok());
        v["trials"][1]["name"] = "n".repeat(SCENARIO_NAME_MAX + 1).into();
        assert_eq!(
            malformed(&v),
            MalformedTrials::ScenarioName {
                step: 3,
                trial: 1,
                bytes: 201
            }
        );

        let mut v = verdict();
        v["trials"][1]["fingerprint"] = FP.to_uppercase().into();
        assert!(matches!(
            malformed(&v),
            MalformedTrials::Fingerprint {
                step: 3,
                trial: 1,
                ..
            }
        ));

        let mut v = verdict();
        v["trials"][1]["end_reason"] = "controller_timeout".into();
        v["trials"][1]["pass"] = true.into();
        v["pass"] = true.into();
        let e = malformed(&v);
        assert_eq!(
            e,
            MalformedTrials::FaultPassed {
                step: 3,
                trial: 1,
                end: TrialEnd::ControllerTimeout
            }
        );
        assert!(e.to_string().contains("controller_timeout"), "{e}");

        // `pass` is every trial's, both ways.
        let mut v = verdict();
        v["pass"] = true.into();
        assert_eq!(
            malformed(&v),
            MalformedTrials::Pass {
                step: 3,
                pass: true
            }
        );
        v["trials"][1]["pass"] = true.into();
        assert!(read(&v).unwrap().pass);
        v["pass"] = false.into();
        assert!(malformed(&v).to_string().contains("every one"));
    }

    #[test]
    fn a_long_reason_is_cut_at_a_character_boundary() {
        let mut v = verdict();
        // 999 bytes, then a 2-byte character across the limit.
        let long = format!("{}é{}", "a".repeat(REASON_MAX - 1), "b".repeat(50));
        v["trials"][1]["detail"] = long.into();
        let reason = read(&v).unwrap().trials[1].reason.clone().unwrap();
        assert_eq!(reason, "a".repeat(REASON_MAX - 1));
        let exact = "é".repeat(REASON_MAX / 2);
        v["trials"][1]["detail"] = exact.clone().into();
        assert_eq!(read(&v).unwrap().trials[1].reason, Some(exact));
        // A record (not a verdict) with a longer one is malformed.
        let mut r = read(&verdict()).unwrap();
        r.trials[0].reason = Some("r".repeat(REASON_MAX + 1));
        assert_eq!(
            r.validate(),
            Err(MalformedTrials::Reason {
                step: 3,
                trial: 0,
                bytes: REASON_MAX + 1
            })
        );
    }

    #[test]
    fn scores_are_finite_numbers_equal_by_their_bits() {
        for n in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(Score::new(n).is_none());
            assert!(Score::try_from(n).is_err());
        }
        assert_eq!(Score::new(0.5), Score::new(0.5));
        assert_ne!(Score::new(0.0), Score::new(-0.0));
        assert_eq!(serde_json::to_string(&Score::new(-0.0)).unwrap(), "-0.0");
        assert_eq!(serde_json::from_str::<Score>("3").unwrap().get(), 3.0);
        assert_eq!(
            serde_json::from_str::<Score>("1e-300").unwrap().get(),
            1e-300
        );
        // JSON has no non-finite number; an overflowing one is refused, not made infinite.
        assert!(serde_json::from_str::<Score>("1e999").is_err());
        assert!(serde_json::from_str::<Score>("\"1\"").is_err());
        let mut v = verdict();
        v["trials"][0]["score"] = serde_json::json!(-12.25);
        assert_eq!(read(&v).unwrap().trials[0].score, Score::new(-12.25));
    }

    #[test]
    fn a_score_reads_back_from_its_text_to_the_bit() {
        // Each of these read back one bit off with serde_json's default parse; every other
        // client's parser reads the binary64 nearest the text, and so must this crate, or a
        // record digest recomputed from the daemon's JSON would not be the daemon's.
        for n in [
            0.9856906946328695,
            0.21291890726713458,
            227.92582772255219,
            378614.58032486675,
            -1.603964615428183e143,
            3.0261999441573203e-52,
            1.1547975125429853e-240,
            3.909076791246025e-46,
        ] {
            let text = serde_json::to_string(&Score::new(n).unwrap()).unwrap();
            let back: Score = serde_json::from_str(&text).unwrap();
            assert_eq!(back.get().to_bits(), n.to_bits(), "{text}");
            assert_eq!(
                text.parse::<f64>().unwrap().to_bits(),
                n.to_bits(),
                "{text}"
            );
        }
        // A verdict's long decimal is the nearest binary64, as `str::parse` reads it.
        let long = "1.865281517519135030e-240";
        let mut line = serde_json::to_string(&verdict()).unwrap();
        line = line.replacen("\"score\":0.094", &format!("\"score\":{long}"), 1);
        let r = TrialStepRecord::from_verdict(0, line.as_bytes()).unwrap();
        assert_eq!(r.trials[1].score, Score::new(long.parse().unwrap()));
    }

    #[test]
    fn a_record_refuses_unknown_members_unlike_a_verdict() {
        let r = read(&verdict()).unwrap();
        let mut v = serde_json::to_value(&r).unwrap();
        v["trials"][0]["detail"] = "x".into();
        assert!(serde_json::from_value::<TrialStepRecord>(v).is_err());
        let mut v = serde_json::to_value(&r).unwrap();
        v["simulator"]["abi"] = 1.into();
        assert!(serde_json::from_value::<TrialStepRecord>(v).is_err());
        // An unknown member of the verdict's simulator is the runner's business too.
        let mut v = verdict();
        v["simulator"]["abi"] = 1.into();
        v["extra"] = serde_json::json!({"anything": [1, 2]});
        assert!(read(&v).is_ok());
    }

    #[test]
    fn trial_steps_are_listed_once_each_in_step_order() {
        let a = read(&verdict()).unwrap();
        let b = TrialStepRecord {
            step: 5,
            ..a.clone()
        };
        assert_eq!(validate_trial_steps(&[]), Ok(()));
        assert_eq!(validate_trial_steps(&[a.clone(), b.clone()]), Ok(()));
        assert_eq!(
            validate_trial_steps(&[b.clone(), a.clone()]),
            Err(MalformedTrials::StepOrder {
                step: 3,
                previous: 5
            })
        );
        assert_eq!(
            validate_trial_steps(&[a.clone(), a.clone()]),
            Err(MalformedTrials::StepOrder {
                step: 3,
                previous: 3
            })
        );
        let mut bad = b;
        bad.trials.clear();
        assert_eq!(
            validate_trial_steps(&[a, bad]),
            Err(MalformedTrials::NoTrials { step: 5 })
        );
    }
}
