//! Trial runs in containers, each at crun, runc and runsc: a project whose step is the trial
//! runner (docs/trials.md) starts as uid 0 with exactly CAP_SETUID and CAP_SETGID, the agent
//! runs every ordinary step as the run's uid with nothing, and the runner plays the controller
//! as the run's second uid. Checked here: the example controllers give their fingerprints,
//! the draft falls, an ordinary step of a trial run holds no privilege, a hostile controller
//! learns nothing of the scenario and cannot touch the runner, malformed or runner-less trial
//! runs are refused before anything starts, and nothing of either uid is left after a run.
//!
//! Needs what provider.rs needs, and `plimsoll-trial-runner` (built on demand). Without them a
//! test prints `SKIP` and returns, unless `CI=true`, where it fails.

#[macro_use]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use plimsoll_oci::{OciProvider, RuntimeKind};
use plimsoll_sandbox::{LaunchError, LaunchPlan, Provider, ResolvedLimits};
use plimsoll_testing::{limits, skip_or_fail, text, tool_binary, workspace_root};
use plimsoll_wire::{Project, ProjectFile, Reason, RunResult, RunSpec, Step};
use serde_json::Value;
use sha2::Digest as _;

use common::{CONTROLLER_OFFSET, Rig, kind_index, rig};

#[path = "../../../tests/trials/hostile.rs"]
mod hostile;

#[path = "../../../tests/trials/exams.rs"]
mod exams;

/// `accepted.js` and `accepted.py` on the standard scenario.
const ACCEPTED: &str = "93585277088f4cfbd7683a2db52ab4a44906d74c74468ab9a49d4ddc8e959d41";
/// `draft.js` on the standard scenario (falls at tick 188).
const DRAFT: &str = "d64835dcd6da2f8ee31dfeefcb1a07e2ded5b3e8c54b1b997402c250e463a587";

/// The runner's deadlines, relaxed: these tests share two cores with the attack tests, and
/// a missed deadline is the runner's business (crates/trial), not the sandbox's.
const RELAXED: &str = "--first-deadline-ms 20000 --tick-deadline-ms 5000";

/// A uid of its own for each scenario and runtime (common/mod.rs: the ranges); the
/// controller's is this + [`CONTROLLER_OFFSET`].
fn uid(scenario: u32, kind: RuntimeKind) -> u32 {
    2_120_000 + scenario * 10 + kind_index(kind)
}

/// The rig of provider.rs, with this build's trial runner.
fn trial_rig(kind: RuntimeKind, test: &str) -> Option<Rig> {
    let runner = match tool_binary("plimsoll-trial-runner", "plimsoll-trial") {
        Ok(r) => r,
        Err(e) => {
            skip_or_fail(test, &e);
            return None;
        }
    };
    let mut rig = rig(kind, test)?;
    let mut c = rig.p.config().clone();
    c.trial_runner = runner;
    rig.p = OciProvider::new(c);
    Some(rig)
}

/// Room for node, the runner (wasmtime) and the agent; a minute for gVisor.
fn trial_limits() -> ResolvedLimits {
    ResolvedLimits {
        timeout: Duration::from_secs(90),
        memory_bytes: 512 << 20,
        ..limits()
    }
}

fn repo_file(path: &str) -> ProjectFile {
    let p: PathBuf = workspace_root().join(path);
    let name = p.file_name().unwrap().to_string_lossy().into_owned();
    ProjectFile {
        path: name,
        content: std::fs::read(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .into(),
        executable: false,
    }
}

fn step(run: &str) -> Step {
    Step {
        name: None,
        run: run.into(),
    }
}

/// The standard scenario and a controller, played by the runner as the one step.
fn trial_project(controller: ProjectFile, command: &str, steps_before: &[&str]) -> RunSpec {
    let mut steps: Vec<Step> = steps_before.iter().map(|s| step(s)).collect();
    steps.push(step(&format!(
        "plimsoll-trial-runner --simulator cartpole --scenario standard.json {RELAXED} -- {command}"
    )));
    RunSpec::Project(Project {
        files: vec![
            controller,
            repo_file("sims/cartpole/scenarios/standard.json"),
        ],
        steps,
        artifacts: vec!["trajectory.bin".into()],
    })
}

/// The verdict the last step printed, and its one trial.
fn verdict(r: &RunResult) -> (Value, Value) {
    let last = r
        .steps
        .last()
        .unwrap_or_else(|| panic!("no step ran: {r:?}"));
    let v: Value = serde_json::from_slice(last.stdout.as_slice()).unwrap_or_else(|e| {
        panic!(
            "the trial step printed no verdict ({e}): exit {:?}\nstdout {}\nstderr {}",
            last.exit_code,
            text(&last.stdout),
            text(&last.stderr)
        )
    });
    let t = v["trials"][0].clone();
    (v, t)
}

/// The trajectory artifact's SHA-256.
fn trajectory_sha256(r: &RunResult) -> String {
    let a = &r.artifacts[0];
    assert!(a.found && !a.truncated, "{a:?}");
    hex::encode(sha2::Sha256::digest(a.content.as_slice()))
}

fn plan_of(rig: &Rig, spec: RunSpec, uid: u32) -> LaunchPlan {
    let plan = rig.plan(spec, trial_limits(), uid);
    assert_eq!(plan.controller_uid, uid + CONTROLLER_OFFSET);
    plan
}

on_every_runtime!(
    the_accepted_controllers_give_their_fingerprint,
    the_draft_falls,
    ordinary_steps_of_a_trial_run_hold_no_privilege,
    the_controller_sees_neither_the_scenario_nor_the_runner,
    bad_trial_runs_are_refused_before_anything_starts,
    the_shipped_exams_examine_their_controllers,
);

/// The water tank and the DC motor from the image (docs/simulators.md), each examining its
/// accepted controllers (JavaScript and Python) on the hidden scenarios and its failing
/// drafts: one run with the accepted ones and a failing one last, one with the other draft.
fn the_shipped_exams_examine_their_controllers(kind: RuntimeKind, test: &str) {
    use exams::Controller::{AcceptedJs, AcceptedPy, FailingJs, FailingPy};
    let Some(rig) = trial_rig(kind, test) else {
        return;
    };
    let mut n = 20;
    for sim in ["tank", "motor"] {
        for controllers in [&[AcceptedJs, AcceptedPy, FailingPy][..], &[FailingJs]] {
            let plan = plan_of(
                &rig,
                exams::project(sim, controllers, &exams::HIDDEN, RELAXED),
                uid(n, kind),
            );
            n += 1;
            let start = Instant::now();
            let r = rig.run_plan(&plan);
            let verdicts = exams::check(sim, controllers, &exams::HIDDEN, &r);
            eprintln!(
                "TIMING {} {sim} {controllers:?}: run {} ms, verdict wall_ms {:?}",
                kind.name(),
                start.elapsed().as_millis(),
                verdicts
                    .iter()
                    .map(|v| v["trials"][0]["wall_ms"].clone())
                    .collect::<Vec<_>>()
            );
        }
    }
}

fn the_accepted_controllers_give_their_fingerprint(kind: RuntimeKind, test: &str) {
    let Some(rig) = trial_rig(kind, test) else {
        return;
    };
    for (n, controller, command) in [
        (1, "examples/controllers/accepted.js", "node accepted.js"),
        (2, "examples/controllers/accepted.py", "python3 accepted.py"),
    ] {
        let plan = plan_of(
            &rig,
            trial_project(repo_file(controller), command, &[]),
            uid(n, kind),
        );
        let start = Instant::now();
        let r = rig.run_plan(&plan);
        let run_ms = start.elapsed().as_millis();
        let (v, t) = verdict(&r);
        assert_eq!(r.exit_code, Some(0), "{v}\n{r:?}");
        assert_eq!(v["pass"], true, "{v}");
        assert_eq!(t["end_reason"], "completed", "{t}");
        assert_eq!(t["ticks"], 2000);
        assert_eq!(t["fingerprint"], ACCEPTED, "{t}");
        assert_eq!(trajectory_sha256(&r), ACCEPTED);
        assert_eq!(r.artifacts[0].size, 80_000);
        // Its wall, read (at runsc, said) before the job went in: the agent as uid 0
        // holding exactly CAP_SETUID and CAP_SETGID.
        let w = r.wall.as_ref().expect("a trial's result has its wall");
        let two = Some("00000000000000c0");
        assert_eq!((w.uid, w.euid, w.gid), (0, 0, 0), "{w:?}");
        assert_eq!(
            (w.cap_prm.as_deref(), w.cap_eff.as_deref()),
            (two, two),
            "{w:?}"
        );
        assert_eq!(w.cap_bnd.as_deref(), two, "{w:?}");
        // Timings are reported, never asserted.
        eprintln!(
            "TIMING {} {command}: run {run_ms} ms, verdict wall_ms {}",
            kind.name(),
            t["wall_ms"]
        );
    }
}

fn the_draft_falls(kind: RuntimeKind, test: &str) {
    let Some(rig) = trial_rig(kind, test) else {
        return;
    };
    let plan = plan_of(
        &rig,
        trial_project(
            repo_file("examples/controllers/draft.js"),
            "node draft.js",
            &[],
        ),
        uid(3, kind),
    );
    let r = rig.run_plan(&plan);
    let (v, t) = verdict(&r);
    assert_eq!(r.steps[0].exit_code, Some(1), "{v}");
    assert_eq!(v["pass"], false);
    assert_eq!(t["end_reason"], "failed", "{t}");
    assert_eq!(t["failed_at_tick"], 188, "{t}");
    assert!(t["detail"].as_str().unwrap().contains("pole"), "{t}");
    assert_eq!(t["fingerprint"], DRAFT, "{t}");
    assert_eq!(trajectory_sha256(&r), DRAFT);
}

/// `id -u`, the capability sets, no_new_privs (through prctl: gVisor's status has no
/// NoNewPrivs line) and an attempt to become root.
const PRIVILEGES: &str = "id -u; grep -E '^(Cap|NoNewPrivs)' /proc/self/status; \
python3 -c 'import ctypes; print(\"nnp\", ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'; \
python3 -c 'import os; os.setuid(0)' || echo \"setuid refused: $?\"";

fn cap(out: &str, name: &str) -> u64 {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in {out}"));
    u64::from_str_radix(line.trim(), 16).unwrap()
}

fn ordinary_steps_of_a_trial_run_hold_no_privilege(kind: RuntimeKind, test: &str) {
    let Some(rig) = trial_rig(kind, test) else {
        return;
    };
    let uid_trial = uid(4, kind);
    let trial = plan_of(
        &rig,
        trial_project(
            repo_file("examples/controllers/accepted.py"),
            "python3 accepted.py",
            &[PRIVILEGES],
        ),
        uid_trial,
    );
    let r = rig.run_plan(&trial);
    let first = &r.steps[0];
    let out = text(&first.stdout);
    let err = text(&first.stderr);
    eprintln!(
        "{}: an ordinary step of a trial run:\n{out}{err}",
        kind.name()
    );
    assert_eq!(first.exit_code, Some(0), "{out}{err}");
    assert_eq!(out.lines().next(), Some(uid_trial.to_string().as_str()));
    for set in ["CapInh", "CapPrm", "CapEff"] {
        assert_eq!(cap(&out, set), 0, "{set}: {out}");
    }
    if out.contains("CapAmb:") {
        assert_eq!(cap(&out, "CapAmb"), 0, "{out}");
    }
    // The bounding set keeps the two (CAP_SETGID 6, CAP_SETUID 7): nothing can raise them
    // into a set that counts, under no_new_privs and with no setuid or file-cap binary.
    assert_eq!(cap(&out, "CapBnd"), 0xc0, "{out}");
    assert!(out.contains("nnp 1\n"), "{out}");
    assert!(out.contains("setuid refused: 1"), "{out}{err}");
    assert!(err.contains("PermissionError"), "{err}");
    // The trial step after it, in the same run, still plays.
    let (_, t) = verdict(&r);
    assert_eq!(t["fingerprint"], ACCEPTED, "{t}");

    // The same step in a run without a trial step: the run's uid, no bounding set either.
    let uid_plain = uid(5, kind);
    let plain = plan_of(
        &rig,
        RunSpec::Project(Project {
            files: vec![],
            steps: vec![step(PRIVILEGES)],
            artifacts: vec![],
        }),
        uid_plain,
    );
    let r = rig.run_plan(&plain);
    let out = text(&r.steps[0].stdout);
    assert_eq!(out.lines().next(), Some(uid_plain.to_string().as_str()));
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd"] {
        assert_eq!(cap(&out, set), 0, "{set}: {out}");
    }
    assert!(out.contains("setuid refused: 1"), "{out}");
}

fn the_controller_sees_neither_the_scenario_nor_the_runner(kind: RuntimeKind, test: &str) {
    let Some(rig) = trial_rig(kind, test) else {
        return;
    };
    let hostile = hostile::Hostile::new();
    let spec = RunSpec::Project(Project {
        files: hostile.files("standard.json"),
        steps: vec![step(&format!(
            "plimsoll-trial-runner --simulator cartpole --scenario standard.json {RELAXED} -- python3 hostile.py"
        ))],
        artifacts: vec!["trajectory.bin".into()],
    });
    let u = uid(6, kind);
    let plan = plan_of(&rig, spec, u);
    let r = rig.run_plan(&plan);
    let (v, t) = verdict(&r);
    // The runner survived the attempts and the play is the accepted controller's.
    assert_eq!(t["end_reason"], "completed", "{v}");
    assert_eq!(t["name"], hostile.marker.as_str());
    assert_eq!(t["fingerprint"], ACCEPTED, "{t}");
    let seen = t["controller_stderr"].as_str().unwrap().to_owned();
    assert!(!t["controller_stderr_truncated"].as_bool().unwrap(), "{t}");
    eprintln!("{}: the hostile controller saw:\n{seen}", kind.name());
    hostile::assert_saw_nothing(
        &seen,
        u + CONTROLLER_OFFSET,
        // The job is in no file: it came on the agent's input.
        "errno 2",
        kind == RuntimeKind::Runsc,
    );
}

fn bad_trial_runs_are_refused_before_anything_starts(kind: RuntimeKind, test: &str) {
    let Some(mut rig) = trial_rig(kind, test) else {
        return;
    };
    let u = uid(7, kind);
    // Shell smuggled into a trial step: the request's fault (RunRequest::validate refuses it
    // first; the provider too, before it creates anything).
    let smuggling = trial_project(
        repo_file("examples/controllers/accepted.js"),
        "node accepted.js; id",
        &[],
    );
    let plan = plan_of(&rig, smuggling, u);
    let e = rig.p.run(&plan).expect_err("a smuggling trial step ran");
    rig.assert_clean(&plan.run_id, u);
    match e {
        e @ LaunchError::NotStarted { .. } => {
            let (reason, message) = (e.not_dispatched().expect("not started"), e.message());
            assert_eq!(reason, Reason::Request);
            assert!(message.contains("holds `;`"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // No runner: the operator's to fix.
    let mut c = rig.p.config().clone();
    c.trial_runner = "/nonexistent/plimsoll-trial-runner".into();
    rig.p = OciProvider::new(c);
    let plan = plan_of(
        &rig,
        trial_project(
            repo_file("examples/controllers/accepted.js"),
            "node accepted.js",
            &[],
        ),
        u,
    );
    let e = rig
        .p
        .run(&plan)
        .expect_err("a trial ran without its runner");
    rig.assert_clean(&plan.run_id, u);
    assert!(rig.p.state().run_ids().is_empty());
    match e {
        e @ LaunchError::NotStarted { .. } => {
            let (reason, message) = (e.not_dispatched().expect("not started"), e.message());
            assert_eq!(reason, Reason::Environment);
            assert!(
                message.contains("cargo build -p plimsoll-trial")
                    && message.contains("trial_runner"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
}
