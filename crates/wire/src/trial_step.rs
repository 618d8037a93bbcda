//! Trial steps: a project step whose command is the image's trial runner. Such a step is not
//! given to the shell. The agent runs the runner itself, as the one step of the run that
//! starts with CAP_SETUID and CAP_SETGID, and supplies the run's two uids (docs/trials.md,
//! "Trials through the sandbox"). Every other step keeps no capability at all.
//!
//! The host and the agent read a step with the same function, [`trial_step`], so the host
//! knows before it starts anything whether a run needs the trial privileges, and a malformed
//! trial step is refused as a request error before anything runs.

use crate::{RunSpec, Step};

/// The runner's name, as the first word of a step's `run`.
pub const TRIAL_RUNNER: &str = "plimsoll-trial-runner";
/// Where the runner is inside a sandbox (read-only, put there by the provider).
pub const TRIAL_RUNNER_PATH: &str = "/opt/plimsoll/bin/plimsoll-trial-runner";

/// Options the sandbox supplies, that only the runner itself may use, that act before the
/// runner gives up its privileges (`--bench-sim`), or that would take the simulator from
/// elsewhere than the image (`--sim`, `--simulators-index`: a trial's simulator is always one
/// its image declares, docs/simulators.md).
const RESERVED: [&str; 8] = [
    "--uid",
    "--gid",
    "--controller-uid",
    "--controller-gid",
    "--args-fd",
    "--bench-sim",
    "--sim",
    "--simulators-index",
];

/// The two uids and gids of a run with a trial step: the run's own (the runner's, `R`) and
/// the controller's (`C`). Both are unique to the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrialIds {
    /// The run's uid: the agent, every ordinary step and the runner after it drops.
    pub uid: u32,
    /// The run's gid.
    pub gid: u32,
    /// The controller's uid.
    pub controller_uid: u32,
    /// The controller's gid.
    pub controller_gid: u32,
}

impl TrialIds {
    /// The options the agent puts after the runner's name.
    pub fn runner_options(&self) -> [String; 8] {
        [
            "--uid".into(),
            self.uid.to_string(),
            "--gid".into(),
            self.gid.to_string(),
            "--controller-uid".into(),
            self.controller_uid.to_string(),
            "--controller-gid".into(),
            self.controller_gid.to_string(),
        ]
    }
}

/// Why a trial step is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadTrialStep {
    /// A character the runner's words may not hold.
    #[error(
        "holds `{0}`: a {TRIAL_RUNNER} step is not run by a shell, so it takes plain words \
         (letters, digits and `-_.,/:=+@%`) separated by spaces; put shell work in a step of its own"
    )]
    Character(char),
    /// An option the sandbox supplies.
    #[error("passes `{0}`: the sandbox supplies the runner's uids and gids itself; remove it")]
    Reserved(String),
}

/// Reads a step: `None` if it is an ordinary shell step, else the runner's arguments (the
/// words after its name), or why the step is refused.
///
/// A step is a trial step when its first word is [`TRIAL_RUNNER`] or [`TRIAL_RUNNER_PATH`].
/// Its words are split on ASCII whitespace with no quoting, and may hold only letters,
/// digits and `-_.,/:=+@%`: a trial step cannot smuggle shell syntax into the one process
/// of the run that holds a capability.
pub fn trial_step(step: &Step) -> Option<Result<Vec<String>, BadTrialStep>> {
    let mut words = step.run.split_ascii_whitespace();
    let first = words.next()?;
    if first != TRIAL_RUNNER && first != TRIAL_RUNNER_PATH {
        return None;
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.,/:=+@%".contains(c);
    if let Some(c) = step
        .run
        .chars()
        .find(|&c| !allowed(c) && !c.is_ascii_whitespace())
    {
        return Some(Err(BadTrialStep::Character(c)));
    }
    let args: Vec<String> = words.map(str::to_owned).collect();
    // Only the runner's own options count, not the controller's (after `--`).
    let own = args.iter().take_while(|a| *a != "--");
    if let Some(bad) = own
        .map(|a| a.split('=').next().unwrap_or(a))
        .find(|a| RESERVED.contains(a))
    {
        return Some(Err(BadTrialStep::Reserved(bad.to_owned())));
    }
    Some(Ok(args))
}

/// The values of one of the runner's own options (`--name V` or `--name=V`, before `--`).
fn option_values<'a>(args: &'a [String], name: &str) -> Vec<&'a str> {
    let own: Vec<&String> = args.iter().take_while(|a| *a != "--").collect();
    let eq = format!("{name}=");
    own.iter()
        .enumerate()
        .filter_map(|(i, a)| {
            if *a == name {
                own.get(i + 1).map(|s| s.as_str())
            } else {
                a.strip_prefix(eq.as_str())
            }
        })
        .collect()
}

/// The simulator a trial step names: `--simulator NAME` and, if given,
/// `--simulator-sha256 HEX` (the last of each, as the runner reads them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedSimulator<'a> {
    /// Its name.
    pub name: &'a str,
    /// The SHA-256 the step requires.
    pub sha256: Option<&'a str>,
}

/// The simulator a trial step's words name, if they name one.
pub fn simulator_of(args: &[String]) -> Option<NamedSimulator<'_>> {
    let name = option_values(args, "--simulator").pop()?;
    Some(NamedSimulator {
        name,
        sha256: option_values(args, "--simulator-sha256").pop(),
    })
}

/// The files a trial step's runner reads as scenarios (`--scenario F`, `--scenario=F`,
/// before `--`), as project paths: a leading `./` or `/work/` is taken off. The agent writes
/// these files readable by the run's uid only, so no controller of an earlier trial step
/// of the run can read a later one's scenario.
pub fn scenario_paths(args: &[String]) -> Vec<String> {
    option_values(args, "--scenario")
        .into_iter()
        .map(|mut p| {
            loop {
                if let Some(rest) = p.strip_prefix("./") {
                    p = rest;
                } else if let Some(rest) = p.strip_prefix("/work/") {
                    p = rest;
                } else {
                    break p.to_owned();
                }
            }
        })
        .collect()
}

/// Whether any step of `spec` is a trial step (well-formed or not).
pub fn has_trial_step(spec: &RunSpec) -> bool {
    match spec {
        RunSpec::Snippet(_) => false,
        RunSpec::Project(p) => p.steps.iter().any(|s| trial_step(s).is_some()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(run: &str) -> Step {
        Step {
            name: None,
            run: run.into(),
        }
    }

    #[test]
    fn the_simulator_a_step_names() {
        let words = |run: &str| trial_step(&step(run)).unwrap().unwrap();
        let args = words(
            "plimsoll-trial-runner --simulator tank --simulator-sha256=abc --scenario s.json -- node --simulator x",
        );
        assert_eq!(
            simulator_of(&args),
            Some(NamedSimulator {
                name: "tank",
                sha256: Some("abc")
            })
        );
        let args = words("plimsoll-trial-runner --simulator=motor -- python3 c.py");
        assert_eq!(simulator_of(&args).unwrap().name, "motor");
        assert_eq!(simulator_of(&args).unwrap().sha256, None);
        let args = words("plimsoll-trial-runner --scenario s.json -- node --simulator x");
        assert_eq!(
            simulator_of(&args),
            None,
            "the controller's words do not count"
        );
    }

    #[test]
    fn ordinary_steps_are_not_trial_steps() {
        for run in [
            "node main.js",
            "echo plimsoll-trial-runner",
            "plimsoll-trial-runner2 --x",
            "./plimsoll-trial-runner",
        ] {
            assert_eq!(trial_step(&step(run)), None, "{run}");
        }
    }

    #[test]
    fn a_trial_step_gives_its_words() {
        let args = trial_step(&step(
            "  plimsoll-trial-runner --scenario s.json\t--first-deadline-ms 5000 -- node a.js ",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            args,
            [
                "--scenario",
                "s.json",
                "--first-deadline-ms",
                "5000",
                "--",
                "node",
                "a.js"
            ]
        );
        let by_path = trial_step(&step(
            "/opt/plimsoll/bin/plimsoll-trial-runner -- python3 c.py",
        ));
        assert_eq!(by_path.unwrap().unwrap(), ["--", "python3", "c.py"]);
    }

    #[test]
    fn shell_syntax_and_reserved_options_are_refused() {
        for (run, c) in [
            ("plimsoll-trial-runner -- node a.js; cat /etc/shadow", ';'),
            ("plimsoll-trial-runner -- node a.js && id", '&'),
            ("plimsoll-trial-runner -- node $(id)", '$'),
            ("plimsoll-trial-runner -- node 'a.js'", '\''),
            ("plimsoll-trial-runner -- node a.js > x", '>'),
            ("plimsoll-trial-runner -- node a.js\nid", '\n'),
        ] {
            let got = trial_step(&step(run)).unwrap();
            if c == '\n' {
                // A newline is whitespace to the splitter, but a second command to a shell:
                // the words are plain, so the runner gets `id` as the controller's argument.
                assert!(got.is_ok(), "{run}");
            } else {
                assert_eq!(got, Err(BadTrialStep::Character(c)), "{run}");
            }
        }
        for opt in [
            "--uid",
            "--controller-gid",
            "--args-fd",
            "--bench-sim",
            "--sim",
            "--simulators-index",
        ] {
            let run = format!("plimsoll-trial-runner {opt} 7 -- node a.js");
            let got = trial_step(&step(&run)).unwrap().unwrap_err();
            assert_eq!(got, BadTrialStep::Reserved(opt.into()));
            assert!(got.to_string().contains("remove it"), "{got}");
        }
        let eq = trial_step(&step("plimsoll-trial-runner --uid=0 -- node a.js")).unwrap();
        assert_eq!(eq, Err(BadTrialStep::Reserved("--uid".into())));
        // The controller's own arguments are its business.
        let ctl = trial_step(&step("plimsoll-trial-runner -- node a.js --uid 3")).unwrap();
        assert!(ctl.is_ok());
    }

    #[test]
    fn scenario_paths_are_read_from_the_runners_own_options() {
        let args: Vec<String> = [
            "--scenario",
            "a.json",
            "--scenario=./b.json",
            "--scenario",
            "/work/sub/c.json",
            "--",
            "node",
            "--scenario",
            "x.json",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(scenario_paths(&args), ["a.json", "b.json", "sub/c.json"]);
        assert!(scenario_paths(&["--".to_owned()]).is_empty());
    }

    #[test]
    fn the_runner_options_carry_both_uids() {
        let ids = TrialIds {
            uid: 10,
            gid: 11,
            controller_uid: 12,
            controller_gid: 13,
        };
        assert_eq!(
            ids.runner_options().join(" "),
            "--uid 10 --gid 11 --controller-uid 12 --controller-gid 13"
        );
    }
}
