//! A run of the trial runner, in the order that keeps scenarios secret: check everything,
//! start the launcher, drop privileges, load the simulator, read and delete every scenario
//! file, and only then start a controller for each trial in turn.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::controller::{ControllerCommand, ResolveProgramError, resolve_program};
use crate::creds::{DropPrivilegesError, Identities, IdentitiesError, drop_privileges};
use crate::index::{self, IndexError};
use crate::launcher::{Launcher, LauncherError, StartLauncherError, processes_of_uid};
use crate::scenario::{self, TakeScenarioError};
use crate::sim::{LoadSimulatorError, SimulatorError, SimulatorModule};
use crate::trajectory::{TrajectoryError, TrajectoryWriter};
use crate::trial::{Deadlines, RunTrialError, run_trial};
use crate::verdict::{SimulatorJson, VERDICT_FORMAT, Verdict};

/// Where the simulator comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimSource {
    /// A simulator an image declares, by name (and optionally digest), in a simulator index
    /// (docs/simulators.md, "Simulators in images"): in a sandbox, the image's own.
    Named {
        /// Its name.
        name: String,
        /// The SHA-256 the step requires it to have, if any.
        sha256: Option<String>,
        /// The index: the image's ([`index::IMAGE_INDEX`], which must be on a read-only
        /// filesystem), or one given on the command line outside a sandbox.
        index: PathBuf,
        /// `index` is the image's own (checked read-only).
        image: bool,
    },
    /// A module file, outside a sandbox (an exam author trying a simulator).
    File(PathBuf),
}

/// Everything a run needs, as parsed from the command line.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The simulator.
    pub sim: SimSource,
    /// The scenario files, in order.
    pub scenarios: Vec<PathBuf>,
    /// One trajectory path per scenario; may be empty for a single scenario
    /// (then `trajectory.bin`).
    pub trajectories: Vec<PathBuf>,
    /// The runner's and the controller's ids.
    pub ids: Identities,
    /// The controller command (program first).
    pub controller: Vec<OsString>,
    /// The answer deadlines.
    pub deadlines: Deadlines,
}

/// The default trajectory path for a single scenario.
pub const DEFAULT_TRAJECTORY: &str = "trajectory.bin";

/// A run failed without a verdict.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The command line does not make sense.
    #[error("{0}")]
    Usage(String),
    /// Bad ids.
    #[error(transparent)]
    Identities(#[from] IdentitiesError),
    /// The controller program is not there.
    #[error(transparent)]
    Program(#[from] ResolveProgramError),
    /// Processes of the controller uid exist before the run.
    #[error(
        "processes of the controller uid {uid} already exist ({pids:?}); the controller uid must be used by nothing else"
    )]
    ControllerUidBusy {
        /// The uid.
        uid: u32,
        /// Its processes.
        pids: Vec<i32>,
    },
    /// A trajectory file could not be created.
    #[error(transparent)]
    Trajectory(#[from] TrajectoryError),
    /// The launcher did not start.
    #[error(transparent)]
    StartLauncher(#[from] StartLauncherError),
    /// The launcher failed at the end of the run.
    #[error("at the end of the run")]
    Launcher(#[source] LauncherError),
    /// Dropping privileges failed.
    #[error(transparent)]
    Privileges(#[from] DropPrivilegesError),
    /// The simulator is not in the index, or the index is unusable.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// The simulator does not load.
    #[error(transparent)]
    LoadSimulator(#[from] LoadSimulatorError),
    /// A scenario could not be taken (every scenario file was deleted anyway).
    #[error("{0} (every scenario file given was deleted; no controller was started)")]
    Scenario(#[from] TakeScenarioError),
    /// A scenario does not fit the simulator (every scenario file was deleted anyway).
    #[error(
        "scenario {path}: {detail} (every scenario file given was deleted; no controller was started)"
    )]
    ScenarioCheck {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The simulator failed while checking a scenario.
    #[error("scenario {path}")]
    ScenarioSimulator {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: SimulatorError,
    },
    /// A trial could not be carried out.
    #[error(transparent)]
    Trial(#[from] RunTrialError),
}

impl RunError {
    /// The exit status: 2 when nothing of the controller ran, 3 when a trial was under way.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Trial(_) | RunError::Launcher(_) => 3,
            _ => 2,
        }
    }
}

/// Checks the parts that need no privilege and no file: usage, ids, the controller program.
pub fn validate(config: &RunConfig) -> Result<ControllerCommand, RunError> {
    if config.scenarios.is_empty() {
        return Err(RunError::Usage("give at least one --scenario FILE".into()));
    }
    if config.scenarios.len() > 1 && config.trajectories.len() != config.scenarios.len() {
        return Err(RunError::Usage(format!(
            "{} scenarios need {} --trajectory paths (one per scenario, in order), not {}",
            config.scenarios.len(),
            config.scenarios.len(),
            config.trajectories.len()
        )));
    }
    if config.scenarios.len() == 1 && config.trajectories.len() > 1 {
        return Err(RunError::Usage(
            "one scenario takes at most one --trajectory".into(),
        ));
    }
    config.ids.validate()?;
    let (program, args) = config
        .controller
        .split_first()
        .ok_or(ResolveProgramError::Missing)?;
    Ok(ControllerCommand {
        program: resolve_program(program)?,
        args: args.to_vec(),
        uid: config.ids.controller_uid,
        gid: config.ids.controller_gid,
    })
}

/// Runs every trial and returns the verdict. Must be called while the process has one thread.
pub fn run(config: &RunConfig) -> Result<Verdict, RunError> {
    let command = validate(config)?;
    let trajectories: Vec<PathBuf> = if config.trajectories.is_empty() {
        vec![PathBuf::from(DEFAULT_TRAJECTORY)]
    } else {
        config.trajectories.clone()
    };
    let busy = processes_of_uid(config.ids.controller_uid, std::process::id() as i32);
    if !busy.is_empty() {
        return Err(RunError::ControllerUidBusy {
            uid: config.ids.controller_uid,
            pids: busy,
        });
    }
    let mut launcher = Launcher::start(&config.ids, &command)?;
    drop_privileges(&config.ids)?;
    // The simulator before the scenarios are read: a module that does not load fails the run
    // with the scenario files still unread (and, in a sandbox, the agent removes them).
    let module = load(&config.sim);
    // Read, delete, and only then check: the files are gone before anything else can fail.
    let scenarios = scenario::take_all(&config.scenarios);
    let module = module?;
    let scenarios = scenarios?;
    let mut initials = Vec::with_capacity(scenarios.len());
    for (scenario, path) in scenarios.iter().zip(&config.scenarios) {
        let initial = scenario
            .check_against(module.metadata())
            .map_err(|detail| RunError::ScenarioCheck {
                path: path.clone(),
                detail,
            })?;
        let check_err = |source| RunError::ScenarioSimulator {
            path: path.clone(),
            source,
        };
        let mut sim = module.instantiate().map_err(check_err)?;
        if let Err(reason) = sim.init(&initial).map_err(check_err)? {
            return Err(RunError::ScenarioCheck {
                path: path.clone(),
                detail: format!(
                    "the simulator {} refused it: {reason}",
                    module.metadata().name
                ),
            });
        }
        initials.push(initial);
    }
    // Every file the run writes is created before the first controller starts.
    let writers = trajectories
        .iter()
        .map(|p| TrajectoryWriter::create(p))
        .collect::<Result<Vec<_>, _>>()?;

    let mut trials = Vec::with_capacity(scenarios.len());
    for ((((scenario, initial), path), trajectory), writer) in scenarios
        .iter()
        .zip(&initials)
        .zip(&config.scenarios)
        .zip(&trajectories)
        .zip(writers)
    {
        trials.push(run_trial(
            &module,
            scenario,
            initial,
            path,
            &mut launcher,
            config.deadlines,
            trajectory,
            writer,
        )?);
    }
    launcher.shutdown().map_err(RunError::Launcher)?;
    let metadata = module.metadata();
    Ok(Verdict {
        format: VERDICT_FORMAT,
        simulator: SimulatorJson {
            name: metadata.name.clone(),
            version: metadata.version.clone(),
            sha256: module.sha256().to_owned(),
            metadata: metadata.clone(),
        },
        controller: config
            .controller
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        pass: trials.iter().all(|t| t.pass),
        trials,
    })
}

/// Loads the simulator from where the command line said.
pub fn load(source: &SimSource) -> Result<SimulatorModule, RunError> {
    match source {
        SimSource::File(path) => Ok(SimulatorModule::from_file(path)?),
        SimSource::Named {
            name,
            sha256,
            index,
            image,
        } => {
            let (entry, bytes) = index::load(index, *image, name, sha256.as_deref())?;
            let module = SimulatorModule::from_bytes(&bytes)?;
            if module.metadata().name != entry.name {
                return Err(IndexError::NameMismatch {
                    declared: entry.name,
                    said: module.metadata().name.clone(),
                }
                .into());
            }
            Ok(module)
        }
    }
}
