//! The oracle's three trial requests (ordinary project runs with one trial step), and what
//! each answer must show: a verdict on the step's stdout, and a trajectory artifact whose
//! SHA-256 is the fingerprint the runner reported.

use plimsoll_client::RunOptions;
use plimsoll_wire::trial_step::TRIAL_RUNNER;
use plimsoll_wire::{Bytes, Project, ProjectFile, RunRequest, RunResponse, RunSpec, Step, Tier};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// The simulator the image declares for the oracle's exam (docs/simulators.md).
pub const SIMULATOR: &str = "cartpole";
/// The scenario, as the sandbox's `/work` holds it (the runner deletes it before the
/// controller starts).
pub const SCENARIO_FILE: &str = "standard.json";
/// The scenario's content: sims/cartpole/scenarios/standard.json, embedded.
pub const STANDARD_JSON: &str = include_str!("../../../sims/cartpole/scenarios/standard.json");
/// The trajectory the runner writes in `/work` and the run returns as an artifact.
pub const TRAJECTORY_FILE: &str = "trajectory.bin";
/// The verdict line's format (docs/trials.md).
pub const VERDICT_FORMAT: &str = "plimsoll-trial-verdict/2";
/// The first answer's deadline. The runner's default (1 s) covers node's start-up on a host
/// or in a container; under gVisor it takes a second or two, and in a QEMU guest under TCG
/// (no KVM) several seconds. The deadline is outside the fingerprint, so raising it changes
/// nothing a trial records.
pub const FIRST_DEADLINE_MS: u64 = 30_000;
/// Every later answer's deadline. The runner's default (100 ms) holds on a host, in a
/// container and under gVisor (under 1 ms a tick), but under TCG node now and then stalls
/// for longer (a collection or a compilation: seen at tick 428 of 2,000). Outside the
/// fingerprint too.
pub const TICK_DEADLINE_MS: u64 = 2_000;
/// Each run's wall timeout: a guest booting under TCG and a trial in it fit well inside it.
pub const DEFAULT_TIMEOUT_MS: u64 = 120_000;
/// The floor of every run: the controllers are untrusted code.
pub const FLOOR: Tier = Tier::Container;

/// The fingerprint docs/trials.md gives for the accepted controller on the standard scenario.
pub const DOCUMENTED_ACCEPTED: &str =
    "93585277088f4cfbd7683a2db52ab4a44906d74c74468ab9a49d4ddc8e959d41";
/// The fingerprint docs/trials.md gives for the draft (it falls at tick 188).
pub const DOCUMENTED_DRAFT: &str =
    "d64835dcd6da2f8ee31dfeefcb1a07e2ded5b3e8c54b1b997402c250e463a587";

/// A controller program sent as a project file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Controller {
    /// Its file name in `/work`.
    pub file: &'static str,
    /// Its source.
    pub source: &'static str,
}

/// examples/controllers/accepted.js, embedded: balances the pole for all 2,000 ticks.
pub const ACCEPTED: Controller = Controller {
    file: "accepted.js",
    source: include_str!("../../controllers/accepted.js"),
};

/// examples/controllers/draft.js, embedded: the two cart gains have the wrong sign.
pub const DRAFT: Controller = Controller {
    file: "draft.js",
    source: include_str!("../../controllers/draft.js"),
};

/// What a run of a controller is expected to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The pole stays up for every tick: runner exit 0, `completed`, pass.
    Pass,
    /// The pole falls: runner exit 1, `failed` (the cart-pole's reason), no pass.
    Fall,
}

/// The step: the image's trial runner with the image's cart-pole on the scenario, the
/// controller run by node. With
/// `--reproducible` the verdict leaves out its wall time, the one field that differs between
/// identical trials, so the whole result (the verdict is the step's stdout) is the same on
/// every run, and `plimsoll-attest replay` of a bundle finds no difference.
pub fn step_command(controller: &Controller) -> String {
    format!(
        "{TRIAL_RUNNER} --simulator {SIMULATOR} --scenario {SCENARIO_FILE} \
         --first-deadline-ms {FIRST_DEADLINE_MS} \
         --tick-deadline-ms {TICK_DEADLINE_MS} --reproducible -- node {}",
        controller.file
    )
}

/// The run of one controller: its source and the scenario as files, one trial step, the
/// trajectory as artifact, the floor, and (when given) the provider that must run it.
pub fn options(controller: &Controller, provider: Option<&str>, timeout_ms: u64) -> RunOptions {
    let file = |path: &str, content: &str| ProjectFile {
        path: path.to_owned(),
        content: Bytes(content.as_bytes().to_vec()),
        executable: false,
    };
    let mut options = RunOptions::new(RunSpec::Project(Project {
        files: vec![
            file(controller.file, controller.source),
            file(SCENARIO_FILE, STANDARD_JSON),
        ],
        steps: vec![Step {
            name: Some("trial".to_owned()),
            run: step_command(controller),
        }],
        artifacts: vec![TRAJECTORY_FILE.to_owned()],
    }))
    .min_isolation(FLOOR)
    .timeout_ms(timeout_ms);
    if let Some(p) = provider {
        options = options.provider(p);
    }
    options
}

/// One run, checked: the exchange and what its verdict and trajectory say.
#[derive(Debug, Clone)]
pub struct TrialRun {
    /// A short name (`accepted_1`, `accepted_2`, `draft`).
    pub label: &'static str,
    /// The controller it ran.
    pub controller: Controller,
    /// The request as sent.
    pub request: RunRequest,
    /// The response, as the client verified it.
    pub response: RunResponse,
    /// The verdict's fingerprint, equal to the SHA-256 of the trajectory artifact the
    /// response holds.
    pub fingerprint: String,
    /// Ticks run.
    pub ticks: u64,
    /// The tick after which the pole was down, if it fell.
    pub fell_at_tick: Option<u64>,
    /// The same in simulated seconds.
    pub fell_at_seconds: Option<f64>,
    /// The verdict's `end_reason`.
    pub end_reason: String,
}

/// A run's answer does not show what the oracle expects.
#[derive(Debug, thiserror::Error)]
pub enum CheckTrialError {
    /// The result has no step result.
    #[error("{label}: the result holds no step result (request {request_id})")]
    NoStep {
        /// The run.
        label: &'static str,
        /// Its request id.
        request_id: String,
    },
    /// The step ended otherwise than expected.
    #[error(
        "{label}: the trial step ended with {got}, expected exit {expected}{timed_out}; its stdout ends: {stdout}; its stderr: {stderr}"
    )]
    Exit {
        /// The run.
        label: &'static str,
        /// The exit code expected.
        expected: i32,
        /// How it ended.
        got: String,
        /// ", timed out" when the run's timeout ended it.
        timed_out: &'static str,
        /// The step's stdout (its last line: the verdict, if the runner wrote one).
        stdout: String,
        /// The step's stderr (start).
        stderr: String,
    },
    /// The step's stdout does not end in a verdict.
    #[error("{label}: the step's last stdout line is not a trial verdict ({why}): {line}")]
    BadVerdict {
        /// The run.
        label: &'static str,
        /// What is wrong.
        why: String,
        /// The line (start).
        line: String,
    },
    /// The verdict says something else than expected.
    #[error("{label}: the verdict says {got}, expected {expected}")]
    Verdict {
        /// The run.
        label: &'static str,
        /// What it says.
        got: String,
        /// What was expected.
        expected: &'static str,
    },
    /// No trajectory came back.
    #[error(
        "{label}: no {TRAJECTORY_FILE} artifact came back whole ({why}): check the run's artifact_bytes limit"
    )]
    NoTrajectory {
        /// The run.
        label: &'static str,
        /// Missing, not found or truncated.
        why: &'static str,
    },
    /// The trajectory's SHA-256 is not the fingerprint the runner reported.
    #[error(
        "{label}: SHA-256 of the returned trajectory is {computed}, but the runner reported fingerprint {reported}"
    )]
    Fingerprint {
        /// The run.
        label: &'static str,
        /// Recomputed here.
        computed: String,
        /// From the verdict.
        reported: String,
    },
    /// The trajectory's length is not what the verdict says.
    #[error("{label}: the trajectory holds {bytes} bytes, the verdict says {stated}")]
    Length {
        /// The run.
        label: &'static str,
        /// Returned.
        bytes: usize,
        /// From the verdict.
        stated: u64,
    },
}

/// Cut text for a message.
fn start(text: &str) -> String {
    let t = text.trim_end();
    if t.len() <= 600 {
        return t.to_owned();
    }
    let mut end = 600;
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &t[..end])
}

/// A verdict line in short (end reason, detail, the controller's stderr), or the line's start.
fn verdict_summary(line: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(line) else {
        return start(line);
    };
    let t = &v["trials"][0];
    format!(
        "a verdict: {}{}, controller stderr: {:?}",
        t["end_reason"].as_str().unwrap_or("?"),
        t["detail"]
            .as_str()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default(),
        start(t["controller_stderr"].as_str().unwrap_or(""))
    )
}

/// The last line of `text` that is not blank.
fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Checks one answer against what its controller must show, and returns what it showed.
pub fn check_run(
    label: &'static str,
    controller: Controller,
    expect: Expect,
    request: RunRequest,
    response: RunResponse,
) -> Result<TrialRun, CheckTrialError> {
    let result = &response.result;
    let step = result
        .steps
        .first()
        .ok_or_else(|| CheckTrialError::NoStep {
            label,
            request_id: response.request_id.clone(),
        })?;
    let expected_exit = match expect {
        Expect::Pass => 0,
        Expect::Fall => 1,
    };
    if step.exit_code != Some(expected_exit) {
        let got = match (step.exit_code, step.signal) {
            (Some(c), _) => format!("exit {c}"),
            (None, Some(s)) => format!("signal {s}"),
            (None, None) => "no exit status".to_owned(),
        };
        return Err(CheckTrialError::Exit {
            label,
            expected: expected_exit,
            got,
            timed_out: if step.timed_out || result.timed_out {
                ", timed out"
            } else {
                ""
            },
            stdout: verdict_summary(last_line(&step.stdout.to_string_lossy())),
            stderr: start(&step.stderr.to_string_lossy()),
        });
    }

    let stdout = step.stdout.to_string_lossy();
    let line = last_line(&stdout);
    let bad = |why: String| CheckTrialError::BadVerdict {
        label,
        why,
        line: start(line),
    };
    let verdict: Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
    if verdict["format"] != VERDICT_FORMAT {
        return Err(bad(format!("format is not {VERDICT_FORMAT}")));
    }
    let trials = verdict["trials"]
        .as_array()
        .ok_or_else(|| bad("no `trials` array".into()))?;
    let [trial] = trials.as_slice() else {
        return Err(bad(format!("{} trials, expected 1", trials.len())));
    };
    let fingerprint = trial["fingerprint"]
        .as_str()
        .filter(|f| f.len() == 64 && f.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| bad("no 64-digit hex `fingerprint`".into()))?
        .to_owned();
    let end_reason = trial["end_reason"]
        .as_str()
        .ok_or_else(|| bad("no `end_reason`".into()))?
        .to_owned();
    let ticks = trial["ticks"]
        .as_u64()
        .ok_or_else(|| bad("no `ticks`".into()))?;
    let stated_bytes = trial["trajectory_bytes"]
        .as_u64()
        .ok_or_else(|| bad("no `trajectory_bytes`".into()))?;
    let fell_at_tick = trial["failed_at_tick"].as_u64();
    let fell_at_seconds = trial["failed_at_seconds"].as_f64();
    let pass = verdict["pass"].as_bool();

    let (wanted_reason, wanted_pass, expected) = match expect {
        Expect::Pass => ("completed", true, "completed, pass"),
        Expect::Fall => ("failed", false, "failed, no pass"),
    };
    if end_reason != wanted_reason
        || pass != Some(wanted_pass)
        || (expect == Expect::Fall) != fell_at_tick.is_some()
        || fell_at_tick.is_some() != fell_at_seconds.is_some()
    {
        return Err(CheckTrialError::Verdict {
            label,
            got: format!(
                "{end_reason}, pass {}, failed_at_tick {}{}",
                pass.map_or("?".into(), |p| p.to_string()),
                fell_at_tick.map_or("null".into(), |t| t.to_string()),
                match trial["detail"].as_str() {
                    Some(d) => format!(" ({d})"),
                    None => String::new(),
                }
            ),
            expected,
        });
    }

    let artifact = result
        .artifacts
        .iter()
        .find(|a| a.path == TRAJECTORY_FILE)
        .ok_or(CheckTrialError::NoTrajectory {
            label,
            why: "missing from the result",
        })?;
    if !artifact.found {
        return Err(CheckTrialError::NoTrajectory {
            label,
            why: "not found in /work",
        });
    }
    if artifact.truncated || artifact.size != artifact.content.len() as u64 {
        return Err(CheckTrialError::NoTrajectory {
            label,
            why: "truncated",
        });
    }
    let trajectory = artifact.content.0.clone();
    let computed = sha256_hex(&trajectory);
    if computed != fingerprint {
        return Err(CheckTrialError::Fingerprint {
            label,
            computed,
            reported: fingerprint,
        });
    }
    if trajectory.len() as u64 != stated_bytes {
        return Err(CheckTrialError::Length {
            label,
            bytes: trajectory.len(),
            stated: stated_bytes,
        });
    }
    Ok(TrialRun {
        label,
        controller,
        request,
        response,
        fingerprint,
        ticks,
        fell_at_tick,
        fell_at_seconds,
        end_reason,
    })
}

/// The three runs together do not show what the oracle expects.
#[derive(Debug, thiserror::Error)]
pub enum CompareRunsError {
    /// The accepted controller gave two fingerprints.
    #[error(
        "the accepted controller gave two fingerprints, {first} then {second}: the same controller, scenario and simulator must give the same trajectory"
    )]
    AcceptedDiffer {
        /// The first run's.
        first: String,
        /// The second run's.
        second: String,
    },
    /// The draft gave the accepted controller's fingerprint.
    #[error("the draft gave the accepted controller's fingerprint {0}: they must differ")]
    DraftSame(String),
    /// The runs did not all run at the same provider and tier.
    #[error("the runs ran at different providers or tiers: {0}")]
    Mixed(String),
}

/// Checks the invariants across the three runs.
pub fn compare_runs(
    accepted_1: &TrialRun,
    accepted_2: &TrialRun,
    draft: &TrialRun,
) -> Result<(), CompareRunsError> {
    let runs = [accepted_1, accepted_2, draft];
    let at = |r: &TrialRun| format!("{} ({})", r.response.provider, r.response.isolation);
    if runs.iter().any(|r| at(r) != at(accepted_1)) {
        return Err(CompareRunsError::Mixed(
            runs.iter()
                .map(|r| format!("{} at {}", r.label, at(r)))
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    if accepted_1.fingerprint != accepted_2.fingerprint {
        return Err(CompareRunsError::AcceptedDiffer {
            first: accepted_1.fingerprint.clone(),
            second: accepted_2.fingerprint.clone(),
        });
    }
    if draft.fingerprint == accepted_1.fingerprint {
        return Err(CompareRunsError::DraftSame(draft.fingerprint.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use plimsoll_wire::trial_step::trial_step;
    use plimsoll_wire::{Artifact, PROTOCOL, RunRecord, RunResult, StepResult};

    fn request() -> RunRequest {
        options(&ACCEPTED, Some("crun"), DEFAULT_TIMEOUT_MS).into_request("t-1".into())
    }

    /// A response as a real run of `trajectory` with this verdict line and exit code gives.
    fn response(exit: i32, stdout: &str, trajectory: &[u8]) -> RunResponse {
        let step = StepResult {
            name: Some("trial".into()),
            exit_code: Some(exit),
            signal: None,
            timed_out: false,
            oom_killed: false,
            stdout: Bytes(stdout.as_bytes().to_vec()),
            stdout_truncated: false,
            stderr: Bytes(Vec::new()),
            stderr_truncated: false,
            duration_ms: 5,
        };
        RunResponse {
            protocol: PROTOCOL,
            request_id: "t-1".into(),
            provider: "crun".into(),
            isolation: Tier::Container,
            duration_ms: 5,
            request_sha256: String::new(),
            result_sha256: String::new(),
            result: RunResult {
                exit_code: Some(exit),
                signal: None,
                timed_out: false,
                oom_killed: false,
                stdout: step.stdout.clone(),
                stdout_truncated: false,
                stderr: Bytes(Vec::new()),
                stderr_truncated: false,
                steps: vec![step],
                artifacts: vec![Artifact {
                    path: TRAJECTORY_FILE.into(),
                    found: true,
                    size: trajectory.len() as u64,
                    content: Bytes(trajectory.to_vec()),
                    truncated: false,
                }],
                calls: Vec::new(),
                egress: Vec::new(),
                start: None,
                member_age_ms: None,
                wall: None,
                state_kept: None,
                interpreter_end: None,
            },
            record: RunRecord {
                image: None,
                trials: Vec::new(),
                request_id: "t-1".into(),
                request_sha256: String::new(),
                result_sha256: String::new(),
                provider: "crun".into(),
                isolation: Tier::Container,
                minimum_isolation: Some(Tier::Container),
                evidence_sha256: String::new(),
                environment: String::new(),
                started_unix_ms: 0,
                ended_unix_ms: 0,
                record_sha256: String::new(),
                session: None,
            },
        }
    }

    fn verdict(
        fingerprint: &str,
        end: &str,
        pass: bool,
        fell: Option<u64>,
        bytes: usize,
    ) -> String {
        let fell_s = fell.map_or("null".into(), |t| format!("{}", t as f64 / 100.0));
        let fell_t = fell.map_or("null".into(), |t| t.to_string());
        format!(
            "{{\"format\":\"{VERDICT_FORMAT}\",\"pass\":{pass},\"trials\":[{{\"end_reason\":\"{end}\",\
             \"detail\":null,\"pass\":{pass},\"ticks\":{},\"failed_at_tick\":{fell_t},\
             \"failed_at_seconds\":{fell_s},\"fingerprint\":\"{fingerprint}\",\"trajectory_bytes\":{bytes}}}]}}\n",
            bytes / 40
        )
    }

    #[test]
    fn the_request_is_a_well_formed_trial_run() {
        let req = request();
        req.validate().unwrap();
        let RunSpec::Project(p) = &req.run else {
            panic!("not a project")
        };
        assert_eq!(p.steps.len(), 1);
        let args = trial_step(&p.steps[0]).expect("a trial step").unwrap();
        assert_eq!(
            args,
            [
                "--simulator",
                "cartpole",
                "--scenario",
                "standard.json",
                "--first-deadline-ms",
                "30000",
                "--tick-deadline-ms",
                "2000",
                "--reproducible",
                "--",
                "node",
                "accepted.js"
            ]
        );
        assert_eq!(req.minimum_isolation, Some(Tier::Container));
        assert_eq!(req.provider.as_deref(), Some("crun"));
        assert_eq!(req.limits.unwrap().timeout_ms, Some(DEFAULT_TIMEOUT_MS));
        assert_eq!(p.artifacts, [TRAJECTORY_FILE]);
        assert_eq!(p.files[1].content.as_slice(), STANDARD_JSON.as_bytes());
        assert!(ACCEPTED.source.contains("K_X"));
        assert!(DRAFT.source.contains("wrong sign"));
    }

    #[test]
    fn a_run_whose_trajectory_matches_its_fingerprint_passes() {
        let traj = vec![7u8; 80];
        let fp = sha256_hex(&traj);
        let out = format!("some line\n{}", verdict(&fp, "completed", true, None, 80));
        let run = check_run(
            "a",
            ACCEPTED,
            Expect::Pass,
            request(),
            response(0, &out, &traj),
        )
        .unwrap();
        assert_eq!(run.fingerprint, fp);
        assert_eq!(run.ticks, 2);
        let fell = verdict(&sha256_hex(&traj), "failed", false, Some(188), 80);
        let run = check_run(
            "d",
            DRAFT,
            Expect::Fall,
            request(),
            response(1, &fell, &traj),
        )
        .unwrap();
        assert_eq!(run.fell_at_tick, Some(188));
        assert_eq!(run.fell_at_seconds, Some(1.88));
    }

    #[test]
    fn every_mismatch_is_refused() {
        let traj = vec![7u8; 80];
        let fp = sha256_hex(&traj);
        let good = verdict(&fp, "completed", true, None, 80);
        let check = |expect, exit, out: &str, traj: &[u8]| {
            check_run("x", ACCEPTED, expect, request(), response(exit, out, traj)).unwrap_err()
        };
        // The trajectory is not what the fingerprint says.
        let e = check(Expect::Pass, 0, &good, &[8u8; 80]);
        assert!(matches!(e, CheckTrialError::Fingerprint { .. }), "{e}");
        // Exit code.
        let e = check(Expect::Pass, 1, &good, &traj);
        assert!(matches!(e, CheckTrialError::Exit { .. }), "{e}");
        // Not a verdict.
        let e = check(Expect::Pass, 0, "hello\n", &traj);
        assert!(matches!(e, CheckTrialError::BadVerdict { .. }), "{e}");
        // A pass where a fall was expected.
        let e = check(Expect::Fall, 1, &good, &traj);
        assert!(matches!(e, CheckTrialError::Verdict { .. }), "{e}");
        // Length.
        let e = check(
            Expect::Pass,
            0,
            &verdict(&fp, "completed", true, None, 40),
            &traj,
        );
        assert!(matches!(e, CheckTrialError::Length { .. }), "{e}");
        // A truncated artifact.
        let mut resp = response(0, &good, &traj);
        resp.result.artifacts[0].truncated = true;
        let e = check_run("x", ACCEPTED, Expect::Pass, request(), resp).unwrap_err();
        assert!(matches!(e, CheckTrialError::NoTrajectory { .. }), "{e}");
    }

    #[test]
    fn the_three_runs_must_agree_and_differ() {
        let run = |fp: &str| TrialRun {
            label: "x",
            controller: ACCEPTED,
            request: request(),
            response: response(0, "", b""),
            fingerprint: fp.into(),
            ticks: 0,
            fell_at_tick: None,
            fell_at_seconds: None,
            end_reason: "completed".into(),
        };
        compare_runs(&run("a"), &run("a"), &run("d")).unwrap();
        assert!(matches!(
            compare_runs(&run("a"), &run("b"), &run("d")),
            Err(CompareRunsError::AcceptedDiffer { .. })
        ));
        assert!(matches!(
            compare_runs(&run("a"), &run("a"), &run("a")),
            Err(CompareRunsError::DraftSame(_))
        ));
        let mut other = run("d");
        other.response.provider = "runc".into();
        assert!(matches!(
            compare_runs(&run("a"), &run("a"), &other),
            Err(CompareRunsError::Mixed(_))
        ));
    }
}
