//! The process-tier provider: JavaScript and Python snippets as a hardened child process.
//! No wall for hostile code (docs/isolation-tiers.md).

use std::path::PathBuf;

use plimsoll_sandbox::{LaunchError, LaunchPlan, Outcome, Probed, Provider};
use plimsoll_wire::{RunSpec, Tier};

/// Where the process provider finds what it runs.
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    /// The node binary.
    pub node: PathBuf,
    /// The python3 binary.
    pub python: PathBuf,
    /// The probe program (`plimsoll-probe`).
    pub probe: PathBuf,
}

/// The process-tier provider.
#[derive(Debug)]
pub struct ProcessProvider {
    config: ProcessConfig,
}

impl ProcessProvider {
    /// A provider with this configuration. Nothing is checked until [`Provider::probe`].
    pub fn new(config: ProcessConfig) -> Self {
        ProcessProvider { config }
    }
}

impl Provider for ProcessProvider {
    fn name(&self) -> &str {
        "process"
    }
    fn nominal_tier(&self) -> Tier {
        Tier::Process
    }
    fn cost(&self) -> u32 {
        2
    }
    fn supports(&self, spec: &RunSpec) -> Result<(), String> {
        match spec {
            RunSpec::Snippet(_) => Ok(()),
            RunSpec::Project(_) => Err(
                "the process tier runs snippets only; projects need the container tier or above"
                    .into(),
            ),
        }
    }
    fn probe(&self) -> Probed {
        let _ = &self.config;
        unimplemented!("process probe")
    }
    fn run(&self, _plan: &LaunchPlan) -> Result<Outcome, LaunchError> {
        unimplemented!("process run")
    }
}
