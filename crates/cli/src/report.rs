//! `plimsoll report`: the report page of two trials (plimsoll_trial::report), each read from
//! a run's JSON answer as `plimsoll trial --json` (or `plimsoll run --json`) printed it: the
//! request as sent (the controller's source), the verdict on the trial step's stdout, the
//! trajectory artifact, the provider, tier and digests.

use std::path::Path;

use anyhow::{Context as _, anyhow, bail};
use plimsoll_trial::report::{ReportInput, RunInput, from_response, render};
use plimsoll_trial::verdict::SimulatorJson;
use plimsoll_wire::{RunRequest, RunResponse, RunSpec, trial_step};

use crate::args::ReportArgs;
use crate::{EXIT_OK, Failure};

/// Runs `plimsoll report`.
pub fn report(a: &ReportArgs) -> Result<u8, Failure> {
    let trial = usize::try_from(a.trial - 1).unwrap_or(usize::MAX);
    let (sim, first) = run_of(&a.first, trial).map_err(Failure::usage)?;
    let (other, second) = run_of(&a.second, trial).map_err(Failure::usage)?;
    if (&other.name, &other.sha256) != (&sim.name, &sim.sha256) {
        return Err(Failure::usage(anyhow!(
            "{} ran simulator {} ({}), {} ran {} ({}): one report shows one simulator",
            a.first.display(),
            sim.name,
            sim.sha256,
            a.second.display(),
            other.name,
            other.sha256
        )));
    }
    let input = ReportInput {
        title: format!(
            "Trial report: {} and {} on {} {}",
            first.label, second.label, sim.name, sim.version
        ),
        simulator: sim,
        accepted: first,
        draft: second,
        accepted_repeat_fingerprint: None,
    };
    std::fs::write(&a.out, render(&input))
        .with_context(|| format!("cannot write {}", a.out.display()))
        .map_err(Failure::failed)?;
    println!("{}", a.out.display());
    Ok(EXIT_OK)
}

/// One trial of the run answered in `path`: its first trial step's `trial`-th trial.
fn run_of(path: &Path, trial: usize) -> anyhow::Result<(SimulatorJson, RunInput)> {
    let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut v: serde_json::Value = serde_json::from_slice(&text).with_context(|| {
        format!(
            "{} is not JSON: give a run's answer as `plimsoll trial --json` prints it",
            path.display()
        )
    })?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| anyhow!("{}: not a JSON object", path.display()))?;
    let request: RunRequest = serde_json::from_value(obj.remove("request").ok_or_else(|| {
        anyhow!(
            "{} holds no `request`: give the answer of `plimsoll trial --json` (or `plimsoll run --json`), which carries the request as sent",
            path.display()
        )
    })?)
    .with_context(|| format!("{}: its `request` is not a run request", path.display()))?;
    // What `plimsoll run --json` adds beside the answer.
    for extra in [
        "evidence",
        "evidence_sha256",
        "evidence_age_ms",
        "evidence_cached",
    ] {
        obj.remove(extra);
    }
    let resp: RunResponse = serde_json::from_value(v)
        .with_context(|| format!("{}: not a run's answer", path.display()))?;
    let RunSpec::Project(project) = &request.run else {
        bail!("{}: the run is a snippet, not a trial", path.display());
    };
    let (step, args) = project
        .steps
        .iter()
        .enumerate()
        .find_map(|(i, s)| match trial_step::trial_step(s) {
            Some(Ok(args)) => Some((i, args)),
            _ => None,
        })
        .ok_or_else(|| anyhow!("{}: the run has no trial step", path.display()))?;
    // The controller: the file its command names last.
    let controller = args.last().map(String::as_str).unwrap_or("");
    let source = project
        .files
        .iter()
        .find(|f| f.path == controller)
        .map(|f| f.content.to_string_lossy())
        .unwrap_or_default();
    from_response(controller, &source, &resp, step, trial).map_err(anyhow::Error::msg)
}
