//! One trial: a fresh simulator instance, a fresh controller, the tick loop, the verdict.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::controller::{Controller, Fault, SpawnControllerError};
use crate::launcher::{Launcher, LauncherError};
use crate::protocol::{parse_action, shown, state_line};
use crate::scenario::Scenario;
use crate::sim::{SimulatorError, SimulatorModule, Step, clamp};
use crate::trajectory::{TrajectoryError, TrajectoryWriter};
use crate::verdict::{EndReason, NamedValues, TrialVerdict};

/// The answer deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// For the first tick (the controller's interpreter starts meanwhile).
    pub first: Duration,
    /// For every later tick.
    pub tick: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            first: Duration::from_millis(1000),
            tick: Duration::from_millis(100),
        }
    }
}

/// A trial could not be carried out (not a controller fault: those end the trial with a
/// verdict).
#[derive(Debug, thiserror::Error)]
pub enum RunTrialError {
    /// The simulator failed.
    #[error("trial {scenario}: simulator failure at tick {tick}")]
    Simulator {
        /// The scenario.
        scenario: String,
        /// The tick.
        tick: u64,
        /// What failed.
        #[source]
        source: SimulatorError,
    },
    /// The trajectory could not be written.
    #[error("trial {scenario}")]
    Trajectory {
        /// The scenario.
        scenario: String,
        /// What failed.
        #[source]
        source: TrajectoryError,
    },
    /// The controller could not be started.
    #[error("trial {scenario}")]
    Spawn {
        /// The scenario.
        scenario: String,
        /// What failed.
        #[source]
        source: SpawnControllerError,
    },
    /// Polling the controller's pipes failed.
    #[error("trial {scenario}: cannot poll the controller's pipes: {detail}")]
    Poll {
        /// The scenario.
        scenario: String,
        /// What failed.
        detail: String,
    },
    /// The launcher could not end the controller (processes survived, or it is gone).
    #[error("trial {scenario}: cannot end the controller")]
    End {
        /// The scenario.
        scenario: String,
        /// Why.
        #[source]
        source: LauncherError,
    },
    /// A failure, and then cleaning up the controller failed too.
    #[error("{first}; and then: {cleanup}")]
    AndCleanup {
        /// The first failure.
        first: Box<RunTrialError>,
        /// The cleanup failure.
        cleanup: Box<RunTrialError>,
    },
}

/// Where a loop stopped.
enum Stop {
    /// Every tick ran.
    Completed,
    /// The simulator completed the trial early, for this reason.
    CompletedEarly(String),
    /// The simulator failed it after this tick, for this reason.
    Failed(u64, String),
    /// The controller made a fault.
    Fault(EndReason, String),
}

/// Runs one trial from `initial` (the scenario's values, checked: `init` accepted them),
/// writing to `trajectory` (created at `trajectory_path`), the controller started by
/// `launcher`. The controller is ended (every process of its uid killed and reaped) whatever
/// happens.
#[allow(clippy::too_many_arguments)]
pub fn run_trial(
    module: &SimulatorModule,
    scenario: &Scenario,
    initial: &[f64],
    scenario_path: &Path,
    launcher: &mut Launcher,
    deadlines: Deadlines,
    trajectory_path: &Path,
    mut trajectory: TrajectoryWriter,
) -> Result<TrialVerdict, RunTrialError> {
    let label = scenario_path.display().to_string();
    let sim_err = |tick: u64| {
        let label = label.clone();
        move |source| RunTrialError::Simulator {
            scenario: label,
            tick,
            source,
        }
    };
    let metadata = module.metadata();
    let mut sim = module.instantiate().map_err(sim_err(0))?;
    if let Err(reason) = sim.init(initial).map_err(sim_err(0))? {
        // The runner checked this scenario on another instance before any controller started.
        return Err(sim_err(0)(SimulatorError::Contract(format!(
            "init refused a scenario it accepted before: {reason}"
        ))));
    }
    let tps = metadata.ticks_per_second;
    let mut state = Vec::with_capacity(metadata.state.len());
    let mut clamped = Vec::with_capacity(metadata.action.len());

    let started = Instant::now();
    let mut controller = Controller::start(launcher).map_err(|source| RunTrialError::Spawn {
        scenario: label.clone(),
        source,
    })?;
    let mut ticks = 0u64;
    let looped = (|| -> Result<Stop, RunTrialError> {
        for k in 0..scenario.ticks {
            sim.state(&mut state).map_err(sim_err(k))?;
            let line = state_line(&state);
            let deadline = Instant::now()
                + if k == 0 {
                    deadlines.first
                } else {
                    deadlines.tick
                };
            let answer = match controller.exchange(line.as_bytes(), deadline) {
                Ok(a) => a,
                Err(Fault::Timeout) => {
                    let limit = if k == 0 {
                        deadlines.first
                    } else {
                        deadlines.tick
                    };
                    return Ok(Stop::Fault(
                        EndReason::ControllerTimeout,
                        format!("no answer within {} ms at tick {k}", limit.as_millis()),
                    ));
                }
                Err(Fault::Exited) => {
                    return Ok(Stop::Fault(
                        EndReason::ControllerExited,
                        format!("the controller closed its output or input at tick {k}"),
                    ));
                }
                Err(Fault::Flood(what)) => {
                    return Ok(Stop::Fault(
                        EndReason::ControllerFlood,
                        format!("{what} at tick {k}"),
                    ));
                }
                Err(Fault::Poll(detail)) => {
                    return Err(RunTrialError::Poll {
                        scenario: label.clone(),
                        detail,
                    });
                }
            };
            let action = match parse_action(&answer, metadata.action.len()) {
                Ok(a) => a,
                Err(e) => {
                    return Ok(Stop::Fault(
                        EndReason::ControllerGarbage,
                        format!("{e} at tick {k} (answer {})", shown(&answer)),
                    ));
                }
            };
            trajectory
                .append(&state, &action)
                .map_err(|source| RunTrialError::Trajectory {
                    scenario: label.clone(),
                    source,
                })?;
            clamp(metadata, &action, &mut clamped);
            let step = sim.step(&clamped).map_err(sim_err(k))?;
            ticks = k + 1;
            match step {
                Step::Continue => {}
                Step::Failed(reason) => return Ok(Stop::Failed(ticks, reason)),
                Step::Completed(reason) => return Ok(Stop::CompletedEarly(reason)),
            }
        }
        Ok(Stop::Completed)
    })();
    let ended = controller.finish(launcher);
    let wall_ms = started.elapsed().as_millis() as u64;
    let (stop, ended) = match (looped, ended) {
        (Ok(stop), Ok(ended)) => (stop, ended),
        (Err(first), Ok(_)) => return Err(first),
        (Ok(_), Err(source)) => {
            return Err(RunTrialError::End {
                scenario: label,
                source,
            });
        }
        (Err(first), Err(source)) => {
            return Err(RunTrialError::AndCleanup {
                first: Box::new(first),
                cleanup: Box::new(RunTrialError::End {
                    scenario: label,
                    source,
                }),
            });
        }
    };
    let written = trajectory
        .finish()
        .map_err(|source| RunTrialError::Trajectory {
            scenario: label.clone(),
            source,
        })?;
    sim.state(&mut state).map_err(sim_err(ticks))?;
    let score = sim.score().map_err(sim_err(ticks))?;
    let (end_reason, detail, failed_at_tick, completed_early) = match stop {
        Stop::Completed => (EndReason::Completed, None, None, false),
        Stop::CompletedEarly(reason) => (EndReason::Completed, Some(reason), None, true),
        Stop::Failed(k, reason) => (EndReason::Failed, Some(reason), Some(k), false),
        Stop::Fault(reason, detail) => (reason, Some(detail), None, false),
    };
    let held = failed_at_tick.map_or(ticks, |k| k - 1);
    let reached = completed_early || held >= scenario.pass_ticks;
    let scored = match (scenario.min_score, score) {
        (Some(least), Some(score)) => score >= least,
        _ => true,
    };
    let pass = !end_reason.is_controller_fault() && reached && scored;
    Ok(TrialVerdict {
        scenario: label,
        name: scenario.name.clone(),
        end_reason,
        detail,
        pass,
        ticks,
        scenario_ticks: scenario.ticks,
        pass_ticks: scenario.pass_ticks,
        min_score: scenario.min_score,
        failed_at_tick,
        failed_at_seconds: failed_at_tick.map(|k| k as f64 / f64::from(tps)),
        score,
        final_state: NamedValues(
            metadata
                .state
                .iter()
                .zip(&state)
                .map(|(v, &x)| (v.name.clone(), x))
                .collect(),
        ),
        fingerprint: written.fingerprint,
        trajectory: trajectory_path.display().to_string(),
        trajectory_bytes: written.bytes,
        controller_exit: ended.exit.map(Into::into),
        controller_stderr: String::from_utf8_lossy(&ended.stderr).into_owned(),
        controller_stderr_truncated: ended.stderr_truncated,
        wall_ms: Some(wall_ms),
    })
}
