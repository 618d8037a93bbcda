//! `plimsoll trial`: a controller against a simulator its image carries, on scenario files
//! sent with the run and deleted by the trial runner before the controller starts
//! (docs/simulators.md). The request is the client's (`plimsoll_client::TrialOptions`, so
//! every client and the CLI send the same bytes for one trial), sent through `plimsoll run`'s
//! path, so the result, the record and the artifacts are handled as there.

use std::path::Path;

use anyhow::{Context as _, anyhow, bail};
use plimsoll_client::TrialOptions;

use crate::Failure;
use crate::args::{RunArgs, TrialArgs};
use crate::run::project_file;

/// Runs `plimsoll trial`.
pub fn trial(config: Option<&Path>, a: &TrialArgs) -> Result<u8, Failure> {
    let run = run_args(a).map_err(Failure::usage)?;
    crate::run::run(config, &run)
}

/// A local file's name and content.
fn named(what: &str, path: &Path) -> anyhow::Result<(String, Vec<u8>)> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{what} {}: not a file name", path.display()))?;
    let content =
        std::fs::read(path).with_context(|| format!("{what}: cannot read {}", path.display()))?;
    Ok((name.to_owned(), content))
}

/// The `plimsoll run` arguments of the trial: the client's trial project (the controller and
/// the scenarios under their file names, one trial step, one trajectory artifact per
/// scenario), any other `--file`, and the run's options.
fn run_args(a: &TrialArgs) -> anyhow::Result<RunArgs> {
    let (name, content) = named("--controller", &a.controller)?;
    let mut trial = TrialOptions::new(a.simulator.clone(), name, content);
    trial.simulator_sha256 = a.simulator_sha256.clone();
    trial.first_deadline_ms = a.first_deadline_ms;
    trial.tick_deadline_ms = a.tick_deadline_ms;
    trial.reproducible = a.reproducible;
    for s in &a.scenarios {
        let (name, content) = named("--scenario", s)?;
        trial = trial.scenario(name, content);
    }
    let mut project = trial.project()?;
    for f in &a.files {
        let file = project_file(f)?;
        if project
            .files
            .iter()
            .map(|f| f.path.as_str())
            .chain(project.artifacts.iter().map(String::as_str))
            .any(|taken| taken == file.path)
        {
            bail!(
                "--file {f}: the trial already has a file named {}",
                file.path
            );
        }
        project.files.push(file);
    }
    Ok(RunArgs {
        code: None,
        file: None,
        lang: None,
        steps: Vec::new(),
        project_files: Vec::new(),
        artifacts: Vec::new(),
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
        project: Some(project),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn args(dir: &Path, scenarios: &[&str], controller: &str) -> TrialArgs {
        let write = |name: &str| {
            let p = dir.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, name).unwrap();
            p
        };
        TrialArgs {
            simulator: "tank".into(),
            simulator_sha256: None,
            scenarios: scenarios.iter().map(|s| write(s)).collect(),
            controller: write(controller),
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
    fn a_trial_is_the_clients_trial_project() {
        let dir = tempfile::tempdir().unwrap();
        let run = run_args(&args(dir.path(), &["x/hidden-1.json", "h2.json"], "a/c.py")).unwrap();
        let p = run.project.as_ref().unwrap();
        assert_eq!(
            p.steps[0].run,
            "plimsoll-trial-runner --simulator tank --scenario hidden-1.json --trajectory hidden-1.bin \
             --scenario h2.json --trajectory h2.bin --first-deadline-ms 5000 --reproducible -- python3 c.py"
        );
        let names: Vec<&str> = p.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["c.py", "hidden-1.json", "h2.json"]);
        assert_eq!(p.files[1].content.as_slice(), b"x/hidden-1.json");
        assert_eq!(p.artifacts, ["hidden-1.bin", "h2.bin"]);
        assert_eq!(run.image.as_deref(), Some("exam"));
        assert!(run.trial);
    }

    #[test]
    fn what_the_runner_could_not_take_is_a_usage_error() {
        let dir = tempfile::tempdir().unwrap();
        for (scenarios, controller, want) in [
            (vec!["a b.json"], "c.py", "may hold only"),
            (
                vec!["s.json", "x/s.json"],
                "c.py",
                "another file of the trial is named s.json",
            ),
            (vec!["s.json"], "c.rb", "a .js file"),
            (vec!["s.bin.json", "s.bin"], "c.js", "would overwrite"),
        ] {
            let e = run_args(&args(dir.path(), &scenarios, controller))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{scenarios:?}: {e}");
        }
        let mut taken = args(dir.path(), &["s.json"], "c.js");
        taken.files = vec![format!("{}=s.bin", dir.path().join("c.js").display())];
        let e = run_args(&taken).unwrap_err().to_string();
        assert!(e.contains("already has a file named s.bin"), "{e}");
        let mut missing = args(dir.path(), &["s.json"], "c.js");
        missing.scenarios.push(PathBuf::from("/nonexistent/t.json"));
        let e = run_args(&missing).unwrap_err().to_string();
        assert!(e.contains("cannot read /nonexistent/t.json"), "{e}");
    }
}
