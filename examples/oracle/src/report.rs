//! The report page of the three runs (plimsoll_trial::report), with the provider, tier and
//! digests the daemon answered and the client recomputed, and the simulator, ends and scores
//! the runs' verdicts state.

use std::path::Path;

use anyhow::Context as _;
use plimsoll_trial::report::{ReportInput, RunInput, from_response, render};
use plimsoll_trial::verdict::SimulatorJson;

use crate::trial::{SCENARIO_FILE, TrialRun};

/// One run as the page shows it, and the simulator its verdict names.
fn run_input(run: &TrialRun) -> anyhow::Result<(SimulatorJson, RunInput)> {
    from_response(
        run.controller.file,
        run.controller.source,
        &run.response,
        0,
        0,
    )
    .map_err(anyhow::Error::msg)
}

/// The page's input: the first accepted run, the draft, and the repeat's fingerprint.
pub fn input(
    accepted_1: &TrialRun,
    accepted_2: &TrialRun,
    draft: &TrialRun,
) -> anyhow::Result<ReportInput> {
    let (sim, accepted) = run_input(accepted_1)?;
    let (draft_sim, draft_run) = run_input(draft)?;
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
        accepted,
        draft: draft_run,
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
