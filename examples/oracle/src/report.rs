//! The report page of the three runs (plimsoll_trial::report), with the provider, tier and
//! digests the daemon answered and the client recomputed.

use std::path::Path;

use anyhow::Context as _;
use plimsoll_trial::report::{ReportInput, RunInput, render};

use crate::trial::{SCENARIO_FILE, TrialRun};

/// What the page shows of one run.
fn run_input(run: &TrialRun) -> RunInput {
    RunInput {
        label: run.controller.file.to_owned(),
        controller_source: run.controller.source.to_owned(),
        trajectory: run.trajectory.clone(),
        fingerprint: run.fingerprint.clone(),
        ticks: run.ticks,
        fell_at_tick: run.fell_at_tick,
        end_reason: run.end_reason.clone(),
        provider: run.response.provider.clone(),
        tier: run.response.isolation.to_string(),
        // The client checked that both equal its own recomputation.
        request_sha256: run.response.request_sha256.clone(),
        result_sha256: run.response.result_sha256.clone(),
    }
}

/// The page's input: the first accepted run, the draft, and the repeat's fingerprint.
pub fn input(accepted_1: &TrialRun, accepted_2: &TrialRun, draft: &TrialRun) -> ReportInput {
    ReportInput {
        title: format!(
            "Trial report: {} and {} on {SCENARIO_FILE}, through plimsolld at {} ({})",
            accepted_1.controller.file,
            draft.controller.file,
            accepted_1.response.provider,
            accepted_1.response.isolation
        ),
        accepted: run_input(accepted_1),
        draft: run_input(draft),
        accepted_repeat_fingerprint: Some(accepted_2.fingerprint.clone()),
    }
}

/// Renders the page and writes it to `path`.
pub fn write(
    path: &Path,
    accepted_1: &TrialRun,
    accepted_2: &TrialRun,
    draft: &TrialRun,
) -> anyhow::Result<()> {
    let page = render(&input(accepted_1, accepted_2, draft));
    std::fs::write(path, page).with_context(|| format!("cannot write {}", path.display()))
}
