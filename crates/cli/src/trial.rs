//! `plimsoll trial`: a controller against a simulator its image carries, on scenario files
//! sent with the run and deleted by the trial runner before the controller starts
//! (docs/simulators.md). The run is an ordinary project of one trial step, sent through
//! `plimsoll run`'s path, so the result, the record and the artifacts are handled as there.

use std::path::Path;

use anyhow::{anyhow, bail};
use plimsoll_wire::trial_step::TRIAL_RUNNER;

use crate::Failure;
use crate::args::{RunArgs, TrialArgs};

/// Runs `plimsoll trial`.
pub fn trial(config: Option<&Path>, a: &TrialArgs) -> Result<u8, Failure> {
    let run = run_args(a).map_err(Failure::usage)?;
    crate::run::run(config, &run)
}

/// The word a file's name gives the trial step, or why it cannot be one: the runner's words
/// are plain (letters, digits and `-_.,/:=+@%`; docs/trials.md), so a name with anything
/// else is refused here rather than by the daemon.
fn plain_name(what: &str, path: &Path) -> anyhow::Result<String> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{what} {}: not a file name", path.display()))?;
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.,:=+@%".contains(&b))
    {
        bail!(
            "{what} {}: its name may hold only letters, digits and -_.,:=+@% (rename the file)",
            path.display()
        );
    }
    Ok(name.to_owned())
}

/// The interpreter that runs a controller, from its extension.
fn interpreter(controller: &Path) -> anyhow::Result<&'static str> {
    match crate::run::language_of(controller) {
        Some(plimsoll_wire::Language::Javascript) => Ok("node"),
        Some(plimsoll_wire::Language::Python) => Ok("python3"),
        None => bail!(
            "--controller {}: name a .js file (run by node) or a .py file (run by python3)",
            controller.display()
        ),
    }
}

/// The `plimsoll run` arguments of the trial: the controller, the scenarios and any other
/// file, one trial step, and one trajectory artifact per scenario.
fn run_args(a: &TrialArgs) -> anyhow::Result<RunArgs> {
    if !plimsoll_wire::simulators::simulator_name_ok(&a.simulator) {
        bail!(
            "--simulator {:?}: a simulator name matches [a-z0-9][a-z0-9._-]{{0,63}}",
            a.simulator
        );
    }
    let controller = plain_name("--controller", &a.controller)?;
    let mut step = format!("{TRIAL_RUNNER} --simulator {}", a.simulator);
    if let Some(sha) = &a.simulator_sha256 {
        if !plimsoll_wire::simulators::is_sha256_hex(sha) {
            bail!("--simulator-sha256 must be 64 lowercase hex digits, not {sha:?}");
        }
        step.push_str(&format!(" --simulator-sha256 {sha}"));
    }
    let mut files = vec![format!("{}={controller}", a.controller.display())];
    let mut artifacts = Vec::new();
    let mut names = std::collections::BTreeSet::from([controller.clone()]);
    for scenario in &a.scenarios {
        let name = plain_name("--scenario", scenario)?;
        if !names.insert(name.clone()) {
            bail!(
                "--scenario {}: another file is already named {name} in the run; rename one",
                scenario.display()
            );
        }
        let trajectory = format!("{}.bin", name.strip_suffix(".json").unwrap_or(&name));
        if !names.insert(trajectory.clone()) {
            bail!(
                "--scenario {}: its trajectory {trajectory} would overwrite another file of the run; rename one",
                scenario.display()
            );
        }
        step.push_str(&format!(" --scenario {name} --trajectory {trajectory}"));
        files.push(format!("{}={name}", scenario.display()));
        artifacts.push(trajectory);
    }
    for (flag, value) in [
        ("--first-deadline-ms", a.first_deadline_ms),
        ("--tick-deadline-ms", a.tick_deadline_ms),
    ] {
        if let Some(ms) = value {
            step.push_str(&format!(" {flag} {ms}"));
        }
    }
    if a.reproducible {
        step.push_str(" --reproducible");
    }
    step.push_str(&format!(" -- {} {controller}", interpreter(&a.controller)?));
    for f in &a.files {
        files.push(f.clone());
    }
    Ok(RunArgs {
        code: None,
        file: None,
        lang: None,
        steps: vec![step],
        project_files: files,
        artifacts,
        out: a.out.clone(),
        request: None,
        min_isolation: a.min_isolation,
        provider: a.provider.clone(),
        image: a.image.clone(),
        timeout_ms: a.timeout_ms,
        daemon: a.daemon.clone(),
        json: a.json,
        stream: false,
        grant: None,
        grants: None,
        trial: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn args(scenarios: &[&str], controller: &str) -> TrialArgs {
        TrialArgs {
            simulator: "tank".into(),
            simulator_sha256: None,
            scenarios: scenarios.iter().map(PathBuf::from).collect(),
            controller: controller.into(),
            files: Vec::new(),
            out: None,
            first_deadline_ms: Some(5000),
            tick_deadline_ms: None,
            reproducible: true,
            min_isolation: None,
            provider: None,
            image: Some("exam".into()),
            timeout_ms: None,
            daemon: None,
            json: false,
        }
    }

    #[test]
    fn a_trial_is_one_trial_step_with_its_scenarios_and_trajectories() {
        let run = run_args(&args(&["/x/hidden-1.json", "h2.json"], "a/c.py")).unwrap();
        assert_eq!(
            run.steps,
            [
                "plimsoll-trial-runner --simulator tank --scenario hidden-1.json --trajectory hidden-1.bin \
              --scenario h2.json --trajectory h2.bin --first-deadline-ms 5000 --reproducible -- python3 c.py"
            ]
        );
        assert_eq!(
            run.project_files,
            [
                "a/c.py=c.py",
                "/x/hidden-1.json=hidden-1.json",
                "h2.json=h2.json"
            ]
        );
        assert_eq!(run.artifacts, ["hidden-1.bin", "h2.bin"]);
        assert_eq!(run.image.as_deref(), Some("exam"));
        // The step is a well-formed trial step naming the simulator.
        let step = plimsoll_wire::Step {
            name: None,
            run: run.steps[0].clone(),
        };
        let words = plimsoll_wire::trial_step::trial_step(&step)
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
    }

    #[test]
    fn what_the_runner_could_not_take_is_a_usage_error() {
        for (scenarios, controller, want) in [
            (vec!["a b.json"], "c.py", "may hold only"),
            (vec!["s.json", "x/s.json"], "c.py", "already named s.json"),
            (vec!["s.json"], "c.rb", "a .js file"),
            (vec!["c.py"], "c.py", "already named"),
            (vec!["s.bin.json", "s.bin"], "c.js", "would overwrite"),
        ] {
            let e = run_args(&args(&scenarios, controller))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{scenarios:?}: {e}");
        }
        let mut bad = args(&["s.json"], "c.js");
        bad.simulator = "Tank".into();
        assert!(run_args(&bad).unwrap_err().to_string().contains("[a-z0-9]"));
        bad.simulator = "tank".into();
        bad.simulator_sha256 = Some("xyz".into());
        assert!(
            run_args(&bad)
                .unwrap_err()
                .to_string()
                .contains("64 lowercase hex")
        );
    }
}
