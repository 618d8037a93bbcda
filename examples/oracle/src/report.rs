//! The report page of the three runs (plimsoll_trial::report), with the provider, tier and
//! digests the daemon answered and the client recomputed, and the simulator, ends and scores
//! the runs' verdicts state.

use std::path::Path;

use anyhow::Context as _;
use plimsoll_trial::report::{ReportInput, RunInput, render};
use plimsoll_trial::sim::Metadata;
use plimsoll_trial::verdict::SimulatorJson;
use serde_json::Value;

use crate::trial::{SCENARIO_FILE, TrialRun};

/// The verdict the run's trial step printed: the last line of its stdout, as the daemon
/// returned it (trial::check_run has checked it).
fn verdict(run: &TrialRun) -> anyhow::Result<Value> {
    let step = run
        .response
        .result
        .steps
        .first()
        .with_context(|| format!("{}: no step result", run.label))?;
    let stdout = step.stdout.to_string_lossy();
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    serde_json::from_str(line).with_context(|| format!("{}: the verdict is not JSON", run.label))
}

/// The simulator the verdict names, its metadata checked as the runner checks it.
fn simulator(run: &TrialRun, verdict: &Value) -> anyhow::Result<SimulatorJson> {
    let s = &verdict["simulator"];
    let text = |key: &str| {
        s[key]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("{}: the verdict's simulator has no {key}", run.label))
    };
    let metadata = Metadata::parse(s["metadata"].to_string().as_bytes()).map_err(|e| {
        anyhow::anyhow!(
            "{}: the verdict's simulator metadata is not valid: {e}",
            run.label
        )
    })?;
    Ok(SimulatorJson {
        name: text("name")?,
        version: text("version")?,
        sha256: text("sha256")?,
        metadata,
    })
}

/// What the page shows of one run.
fn run_input(run: &TrialRun, verdict: &Value, metadata: &Metadata) -> RunInput {
    let t = &verdict["trials"][0];
    RunInput {
        label: run.controller.file.to_owned(),
        controller_source: run.controller.source.to_owned(),
        trajectory: run.trajectory.clone(),
        fingerprint: run.fingerprint.clone(),
        ticks: run.ticks,
        pass: t["pass"].as_bool().unwrap_or(false),
        end_reason: run.end_reason.clone(),
        detail: t["detail"].as_str().map(str::to_owned),
        failed_at_tick: t["failed_at_tick"].as_u64(),
        score: t["score"].as_f64(),
        min_score: t["min_score"].as_f64(),
        // The page leaves out a final state it is not given whole.
        final_state: metadata
            .state
            .iter()
            .map_while(|v| t["final_state"][&v.name].as_f64())
            .collect(),
        provider: run.response.provider.clone(),
        tier: run.response.isolation.to_string(),
        // The client checked that both equal its own recomputation.
        request_sha256: run.response.request_sha256.clone(),
        result_sha256: run.response.result_sha256.clone(),
    }
}

/// The page's input: the first accepted run, the draft, and the repeat's fingerprint.
pub fn input(
    accepted_1: &TrialRun,
    accepted_2: &TrialRun,
    draft: &TrialRun,
) -> anyhow::Result<ReportInput> {
    let (accepted_verdict, draft_verdict) = (verdict(accepted_1)?, verdict(draft)?);
    let sim = simulator(accepted_1, &accepted_verdict)?;
    let draft_sim = simulator(draft, &draft_verdict)?;
    anyhow::ensure!(
        (&draft_sim.name, &draft_sim.sha256) == (&sim.name, &sim.sha256),
        "{} ran simulator {} ({}), {} ran {} ({}): one report shows one simulator",
        accepted_1.label,
        sim.name,
        sim.sha256,
        draft.label,
        draft_sim.name,
        draft_sim.sha256
    );
    Ok(ReportInput {
        title: format!(
            "Trial report: {} and {} on {}'s {SCENARIO_FILE}, through plimsolld at {} ({})",
            accepted_1.controller.file,
            draft.controller.file,
            sim.name,
            accepted_1.response.provider,
            accepted_1.response.isolation
        ),
        accepted: run_input(accepted_1, &accepted_verdict, &sim.metadata),
        draft: run_input(draft, &draft_verdict, &sim.metadata),
        accepted_repeat_fingerprint: Some(accepted_2.fingerprint.clone()),
        simulator: sim,
    })
}

/// Renders the page and writes it to `path`.
pub fn write(
    path: &Path,
    accepted_1: &TrialRun,
    accepted_2: &TrialRun,
    draft: &TrialRun,
) -> anyhow::Result<()> {
    let page = render(&input(accepted_1, accepted_2, draft)?);
    std::fs::write(path, page).with_context(|| format!("cannot write {}", path.display()))
}
