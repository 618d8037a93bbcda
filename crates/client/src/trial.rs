//! Trials (docs/simulators.md, docs/trials.md): a controller examined against a simulator its
//! image carries, sent as a project of one trial step: the request `plimsoll trial` builds
//! (crates/cli/src/trial.rs), so every client and the CLI send the same bytes for one trial.

use std::collections::BTreeSet;

use plimsoll_wire::simulators::{is_sha256_hex, simulator_name_ok};
use plimsoll_wire::trial_step::TRIAL_RUNNER;
use plimsoll_wire::{Limits, Project, ProjectFile, RunSpec, Step, Tier};

use crate::RunOptions;

/// A trial and the options of its run (a trial takes no grant).
///
/// ```no_run
/// use plimsoll_client::{Client, Token, TrialOptions};
/// use plimsoll_wire::Tier;
///
/// let client = Client::new("http://127.0.0.1:7878", Token::new("plm_..."));
/// let trial = TrialOptions::new("tank", "accepted.py", std::fs::read("accepted.py")?)
///     .scenario("hidden-1.json", std::fs::read("hidden-1.json")?)
///     .min_isolation(Tier::Container);
/// let resp = client.trial(trial)?;
/// let verdict = &resp.record.trials[0]; // the simulator, pass, each trial's end and fingerprint
/// let trajectory = &resp.result.artifacts[0]; // hidden-1.bin
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialOptions {
    /// The simulator, by the name the image declares it under
    /// (`ImageInfo::simulators` in `GET /v1/providers`).
    pub simulator: String,
    /// The SHA-256 (64 lowercase hex digits) its module must have.
    pub simulator_sha256: Option<String>,
    /// The controller: `path` is its file name (`*.js`, `*.mjs`, `*.cjs`: run by node;
    /// `*.py`: run by python3).
    pub controller: ProjectFile,
    /// The scenarios (at least one): each a file name and the scenario's JSON.
    pub scenarios: Vec<ProjectFile>,
    /// The answer deadline of the first tick, in ms (the runner's default: 1000).
    pub first_deadline_ms: Option<u64>,
    /// The answer deadline of every later tick, in ms (the runner's default: 100).
    pub tick_deadline_ms: Option<u64>,
    /// The verdict leaves its wall time out, so identical trials give identical results.
    pub reproducible: bool,
    /// The floor, as in [`RunOptions`].
    pub minimum_isolation: Option<Tier>,
    /// The provider, as in [`RunOptions`].
    pub provider: Option<String>,
    /// Limits, as in [`RunOptions`].
    pub limits: Option<Limits>,
    /// The image, as in [`RunOptions`]: it must declare the simulator.
    pub image: Option<String>,
}

/// Why a trial cannot be sent: what its runner could not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrialRequestError {
    /// The simulator's name is not one.
    #[error(
        "simulator {0:?}: a simulator name matches [a-z0-9][a-z0-9._-]{{0,63}} (providers() lists each image's simulators)"
    )]
    SimulatorName(String),
    /// The SHA-256 required of the simulator is not one.
    #[error("simulator_sha256 must be 64 lowercase hex digits, not {0:?}")]
    SimulatorSha256(String),
    /// No scenario.
    #[error("no scenario: a trial needs at least one")]
    NoScenario,
    /// A file name the runner's words cannot carry.
    #[error(
        "{what} {name:?}: a trial's file name may hold only letters, digits and -_.,:=+@% and not start with - (rename it)"
    )]
    Name {
        /// `controller` or `scenario`.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// Two files of the trial have one name.
    #[error("scenario {0:?}: another file of the trial is named {0}; rename one")]
    Duplicate(String),
    /// A scenario's trajectory would overwrite another file of the trial.
    #[error(
        "scenario {scenario:?}: its trajectory {trajectory} would overwrite another file of the trial; rename one"
    )]
    Overwrite {
        /// The scenario.
        scenario: String,
        /// Its trajectory's name.
        trajectory: String,
    },
    /// The controller is neither JavaScript nor Python.
    #[error("controller {0:?}: name a .js file (run by node) or a .py file (run by python3)")]
    Language(String),
}

/// Whether a file name can be one of the runner's words: plain (a trial step is not run by a
/// shell), one file in `/work` (no `/`).
fn plain(name: &str) -> bool {
    // A leading `-` would make the name read as one of the runner's options.
    !name.is_empty()
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.,:=+@%".contains(&b))
}

/// The interpreter of a controller, from its extension as `Path::extension` reads it.
fn interpreter(name: &str) -> Option<&'static str> {
    match std::path::Path::new(name).extension()?.to_str()? {
        "js" | "mjs" | "cjs" => Some("node"),
        "py" => Some("python3"),
        _ => None,
    }
}

impl TrialOptions {
    /// A trial of the controller `name` (its code `content`) against `simulator`, with no
    /// scenario yet ([`TrialOptions::scenario`] adds them), floor, provider, limits or image.
    pub fn new(
        simulator: impl Into<String>,
        name: impl Into<String>,
        content: impl Into<Vec<u8>>,
    ) -> Self {
        TrialOptions {
            simulator: simulator.into(),
            simulator_sha256: None,
            controller: file(name, content),
            scenarios: Vec::new(),
            first_deadline_ms: None,
            tick_deadline_ms: None,
            reproducible: false,
            minimum_isolation: None,
            provider: None,
            limits: None,
            image: None,
        }
    }

    /// Adds the scenario file `name`, holding `content` (the scenario's JSON).
    pub fn scenario(mut self, name: impl Into<String>, content: impl Into<Vec<u8>>) -> Self {
        self.scenarios.push(file(name, content));
        self
    }

    /// Requires the simulator's module to have this SHA-256.
    pub fn simulator_sha256(mut self, hex: impl Into<String>) -> Self {
        self.simulator_sha256 = Some(hex.into());
        self
    }

    /// Sets the answer deadline of the first tick.
    pub fn first_deadline_ms(mut self, ms: u64) -> Self {
        self.first_deadline_ms = Some(ms);
        self
    }

    /// Sets the answer deadline of every later tick.
    pub fn tick_deadline_ms(mut self, ms: u64) -> Self {
        self.tick_deadline_ms = Some(ms);
        self
    }

    /// Leaves the wall time out of the verdict.
    pub fn reproducible(mut self) -> Self {
        self.reproducible = true;
        self
    }

    /// Sets the floor.
    pub fn min_isolation(mut self, floor: Tier) -> Self {
        self.minimum_isolation = Some(floor);
        self
    }

    /// Names the provider.
    pub fn provider(mut self, name: impl Into<String>) -> Self {
        self.provider = Some(name.into());
        self
    }

    /// Names the image (a name or an identity).
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.image = Some(image.into());
        self
    }

    /// Asks for a wall timeout for the whole run.
    pub fn timeout_ms(mut self, ms: u64) -> Self {
        self.limits.get_or_insert_with(Limits::default).timeout_ms = Some(ms);
        self
    }

    /// The trial's project: the controller and each scenario as files named by their
    /// `path`, one `plimsoll-trial-runner` step naming the simulator, each scenario with its
    /// trajectory (its name with `.json` replaced by `.bin`), and the trajectories as the
    /// artifacts, in the scenarios' order; or what the runner could not take.
    pub fn project(&self) -> Result<Project, TrialRequestError> {
        if !simulator_name_ok(&self.simulator) {
            return Err(TrialRequestError::SimulatorName(self.simulator.clone()));
        }
        if self.scenarios.is_empty() {
            return Err(TrialRequestError::NoScenario);
        }
        let controller = &self.controller.path;
        if !plain(controller) {
            return Err(TrialRequestError::Name {
                what: "controller",
                name: controller.clone(),
            });
        }
        let run = interpreter(controller)
            .ok_or_else(|| TrialRequestError::Language(controller.clone()))?;
        let mut words = vec![TRIAL_RUNNER, "--simulator", &self.simulator];
        if let Some(sha) = &self.simulator_sha256 {
            if !is_sha256_hex(sha) {
                return Err(TrialRequestError::SimulatorSha256(sha.clone()));
            }
            words.extend(["--simulator-sha256", sha]);
        }
        let mut names = BTreeSet::from([controller.clone()]);
        let mut trajectories = Vec::new();
        for s in &self.scenarios {
            if !plain(&s.path) {
                return Err(TrialRequestError::Name {
                    what: "scenario",
                    name: s.path.clone(),
                });
            }
            if !names.insert(s.path.clone()) {
                return Err(TrialRequestError::Duplicate(s.path.clone()));
            }
            let trajectory = format!("{}.bin", s.path.strip_suffix(".json").unwrap_or(&s.path));
            if !names.insert(trajectory.clone()) {
                return Err(TrialRequestError::Overwrite {
                    scenario: s.path.clone(),
                    trajectory,
                });
            }
            trajectories.push(trajectory);
        }
        for (s, trajectory) in self.scenarios.iter().zip(&trajectories) {
            words.extend(["--scenario", &s.path, "--trajectory", trajectory]);
        }
        let deadlines = [
            ("--first-deadline-ms", self.first_deadline_ms),
            ("--tick-deadline-ms", self.tick_deadline_ms),
        ]
        .map(|(flag, ms)| ms.map(|ms| (flag, ms.to_string())));
        for (flag, ms) in deadlines.iter().flatten() {
            words.extend([*flag, ms.as_str()]);
        }
        if self.reproducible {
            words.push("--reproducible");
        }
        words.extend(["--", run, controller]);
        Ok(Project {
            files: std::iter::once(&self.controller)
                .chain(&self.scenarios)
                .cloned()
                .collect(),
            steps: vec![Step {
                name: None,
                run: words.join(" "),
            }],
            artifacts: trajectories,
        })
    }

    /// The run these options make: [`TrialOptions::project`] with the run's options.
    pub fn into_run_options(self) -> Result<RunOptions, TrialRequestError> {
        Ok(RunOptions {
            run: RunSpec::Project(self.project()?),
            minimum_isolation: self.minimum_isolation,
            provider: self.provider,
            limits: self.limits,
            grant: None,
            image: self.image,
        })
    }
}

fn file(name: impl Into<String>, content: impl Into<Vec<u8>>) -> ProjectFile {
    ProjectFile {
        path: name.into(),
        content: content.into().into(),
        executable: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(scenarios: &[&str], controller: &str) -> TrialOptions {
        scenarios
            .iter()
            .fold(TrialOptions::new("tank", controller, "x"), |t, s| {
                t.scenario(*s, "{}")
            })
    }

    #[test]
    fn a_trial_is_one_trial_step_with_its_scenarios_and_trajectories() {
        let t = trial(&["hidden-1.json", "h2.json"], "c.py")
            .first_deadline_ms(5000)
            .reproducible();
        let p = t.project().unwrap();
        // The step crates/cli/src/trial.rs's test expects for the same trial, word for word.
        assert_eq!(
            p.steps,
            [Step {
                name: None,
                run: "plimsoll-trial-runner --simulator tank --scenario hidden-1.json --trajectory hidden-1.bin \
                      --scenario h2.json --trajectory h2.bin --first-deadline-ms 5000 --reproducible -- python3 c.py"
                    .into()
            }]
        );
        let paths: Vec<&str> = p.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["c.py", "hidden-1.json", "h2.json"]);
        assert_eq!(p.files[0].content.as_slice(), b"x");
        assert_eq!(p.artifacts, ["hidden-1.bin", "h2.bin"]);
        // The step is a well-formed trial step naming the simulator and the scenarios.
        let words = plimsoll_wire::trial_step::trial_step(&p.steps[0])
            .unwrap()
            .unwrap();
        assert_eq!(
            plimsoll_wire::trial_step::simulator_of(&words)
                .unwrap()
                .name,
            "tank"
        );
        assert_eq!(
            plimsoll_wire::trial_step::scenario_paths(&words),
            ["hidden-1.json", "h2.json"]
        );
        let every = TrialOptions::new("motor", "ctl.js", "x")
            .scenario("a,b:c=d+e@f%g_h-1.2", "{}")
            .simulator_sha256("0f".repeat(32))
            .tick_deadline_ms(250)
            .first_deadline_ms(0);
        assert_eq!(
            every.project().unwrap().steps[0].run,
            format!(
                "plimsoll-trial-runner --simulator motor --simulator-sha256 {} \
                 --scenario a,b:c=d+e@f%g_h-1.2 --trajectory a,b:c=d+e@f%g_h-1.2.bin \
                 --first-deadline-ms 0 --tick-deadline-ms 250 -- node ctl.js",
                "0f".repeat(32)
            )
        );
        for name in ["c.mjs", "c.cjs", "..js"] {
            let run = trial(&["s.json"], name).project().unwrap().steps[0]
                .run
                .clone();
            assert!(run.ends_with(&format!(" -- node {name}")), "{run}");
        }
        let opts = trial(&["s.json"], "c.py")
            .min_isolation(Tier::Container)
            .provider("crun")
            .image("sandbox")
            .timeout_ms(9000)
            .into_run_options()
            .unwrap();
        assert_eq!(
            (opts.minimum_isolation, opts.provider.as_deref()),
            (Some(Tier::Container), Some("crun"))
        );
        assert_eq!(opts.image.as_deref(), Some("sandbox"));
        assert_eq!(opts.limits.unwrap().timeout_ms, Some(9000));
        assert_eq!(opts.grant, None);
    }

    #[test]
    fn what_the_runner_could_not_take_is_refused() {
        for (scenarios, controller, want) in [
            (&["a b.json"][..], "c.py", "may hold only"),
            (&["--uid=0.json"], "c.py", "not start with -"),
            (&["s.json"], "-c.py", "not start with -"),
            (&["x/s.json"], "c.py", "may hold only"),
            (&["s.json"], "c d.py", "may hold only"),
            (&["s.json"], "", "may hold only"),
            (&["s.json"], "é.py", "may hold only"),
            (
                &["s.json", "s.json"],
                "c.py",
                "another file of the trial is named s.json",
            ),
            (&["c.py"], "c.py", "another file of the trial is named c.py"),
            (&["s.bin.json", "s.bin"], "c.js", "would overwrite"),
            (&["s.json"], "c.bin.json", "a .js file"),
            (&["s.json"], "c.rb", "a .js file"),
            (&["s.json"], ".py", "a .js file"),
            (&["s.json"], "py", "a .js file"),
            (&[], "c.py", "no scenario"),
        ] {
            let e = trial(scenarios, controller)
                .project()
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{scenarios:?} {controller}: {e}");
        }
        for (edit, want) in [
            (trial(&["s.json"], "c.py"), ""),
            (
                TrialOptions {
                    simulator: "Tank".into(),
                    ..trial(&["s.json"], "c.py")
                },
                "[a-z0-9]",
            ),
            (
                TrialOptions {
                    simulator: "t".repeat(65),
                    ..trial(&["s.json"], "c.py")
                },
                "[a-z0-9]",
            ),
            (
                TrialOptions {
                    simulator: "tank --sim x".into(),
                    ..trial(&["s.json"], "c.py")
                },
                "[a-z0-9]",
            ),
            (
                trial(&["s.json"], "c.py").simulator_sha256("xyz"),
                "64 lowercase hex",
            ),
            (
                trial(&["s.json"], "c.py").simulator_sha256("A".repeat(64)),
                "64 lowercase hex",
            ),
        ] {
            match edit.project() {
                Ok(_) => assert_eq!(want, "", "{edit:?}"),
                Err(e) => assert!(!want.is_empty() && e.to_string().contains(want), "{e}"),
            }
        }
    }
}
