//! The shipped exams beyond the cart-pole (docs/simulators.md): the water tank (C) and the DC
//! motor (C++), each examining its accepted controller in JavaScript and in Python on the
//! hidden scenarios, and a failing draft. Shared by the trial tests at crun, runc and runsc
//! (crates/oci/tests/trials.rs) and in the QEMU guest (crates/vm/tests/vm.rs): each builds
//! a project with [`project`], runs it, and hands the result to [`check`].

use std::path::PathBuf;

use plimsoll_wire::{Project, ProjectFile, RunResult, RunSpec, Step};
use serde_json::Value;
use sha2::Digest as _;

/// The hidden scenarios of each exam (sims/NAME/scenarios/).
pub const HIDDEN: [&str; 3] = ["hidden-1", "hidden-2", "hidden-3"];

/// The accepted controllers' fingerprint per exam and hidden scenario: the same from
/// JavaScript and Python, on the host and at every provider.
pub const ACCEPTED: &[(&str, &str, &str)] = &[
    (
        "tank",
        "hidden-1",
        "f0fe0f868cdd7b2fd62fee9132f4ec5f62ec04980aac34d0ec552f134d1e0e47",
    ),
    (
        "tank",
        "hidden-2",
        "6d7a82d9522a65eb0aaa120dabfd930e4e9de7aa05081bd8f35e498112a21c54",
    ),
    (
        "tank",
        "hidden-3",
        "76c00ad454b2a713ccb16a9d1d76ad5098824b446b365396b4564735728e3427",
    ),
    (
        "motor",
        "hidden-1",
        "3de384e068e9f34a59442dc8515794a1686e5551f0ec6e465e5e7c1ba9cea1ec",
    ),
    (
        "motor",
        "hidden-2",
        "2182c4e72e630684dcbe84f33c7c381c94176bc9ed33c09eb9ec47e6d6463db4",
    ),
    (
        "motor",
        "hidden-3",
        "2b5b70443b0e57f015ea85c583233b56962c3bf3ca0aa31606fc6f64dfafbfc0",
    ),
];

/// How each exam's failing draft ends on hidden-1 (the first hidden scenario every test
/// gives): the tick and the simulator's reason.
pub const FAILING: &[(&str, u64, &str)] = &[
    ("tank", 92, "the tank overflowed"),
    ("motor", 2, "the winding current exceeded 5 A"),
];

/// A controller of an exam.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    /// accepted.js, on every hidden scenario.
    AcceptedJs,
    /// accepted.py, on every hidden scenario.
    AcceptedPy,
    /// failing.js, on hidden-1 (it fails: only as the last step).
    FailingJs,
    /// failing.py, on hidden-1 (it fails: only as the last step).
    FailingPy,
}

impl Controller {
    fn file(self) -> &'static str {
        match self {
            Controller::AcceptedJs => "accepted.js",
            Controller::AcceptedPy => "accepted.py",
            Controller::FailingJs => "failing.js",
            Controller::FailingPy => "failing.py",
        }
    }

    fn interpreter(self) -> &'static str {
        match self {
            Controller::AcceptedJs | Controller::FailingJs => "node",
            Controller::AcceptedPy | Controller::FailingPy => "python3",
        }
    }

    fn accepted(self) -> bool {
        matches!(self, Controller::AcceptedJs | Controller::AcceptedPy)
    }

    /// The scenarios it plays, of `hidden`: every one, or the first for a failing draft.
    fn scenarios<'a>(self, hidden: &'a [&'a str]) -> &'a [&'a str] {
        if self.accepted() {
            hidden
        } else {
            &hidden[..1]
        }
    }

    /// A prefix for its copies of the scenarios and its trajectories (`accepted-js`): the
    /// runner deletes a scenario once read, so each step has its own copies.
    fn prefix(self) -> String {
        self.file().replace('.', "-")
    }
}

fn repo(path: &str) -> Vec<u8> {
    let p: PathBuf = plimsoll_testing::workspace_root().join(path);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn file(path: String, content: Vec<u8>) -> ProjectFile {
    ProjectFile {
        path,
        content: content.into(),
        executable: false,
    }
}

/// The trajectory of `controller` on `scenario`.
fn trajectory(controller: Controller, scenario: &str) -> String {
    format!("{}-{scenario}.bin", controller.prefix())
}

/// One run of the exam `sim`: one trial step per controller, in order (a failing one only
/// last: a step that fails ends the run), each on its own copies of the `hidden` scenarios
/// (a failing draft on the first only); `deadlines` are the runner's deadline options.
pub fn project(sim: &str, controllers: &[Controller], hidden: &[&str], deadlines: &str) -> RunSpec {
    let mut files = Vec::new();
    let mut steps = Vec::new();
    let mut artifacts = Vec::new();
    for (i, &c) in controllers.iter().enumerate() {
        assert!(
            c.accepted() || i + 1 == controllers.len(),
            "a failing controller only last"
        );
        files.push(file(
            c.file().into(),
            repo(&format!("examples/controllers/{sim}/{}", c.file())),
        ));
        let mut step = format!("plimsoll-trial-runner --simulator {sim}");
        for s in c.scenarios(hidden) {
            let copy = format!("{}-{s}.json", c.prefix());
            files.push(file(
                copy.clone(),
                repo(&format!("sims/{sim}/scenarios/{s}.json")),
            ));
            step.push_str(&format!(
                " --scenario {copy} --trajectory {}",
                trajectory(c, s)
            ));
            artifacts.push(trajectory(c, s));
        }
        step.push_str(&format!(
            " {deadlines} --reproducible -- {} {}",
            c.interpreter(),
            c.file()
        ));
        steps.push(Step {
            name: Some(c.file().into()),
            run: step,
        });
    }
    RunSpec::Project(Project {
        files,
        steps,
        artifacts,
    })
}

/// Checks a run of [`project`]: every step ran and printed a verdict naming the exam's
/// simulator; the accepted controllers passed every hidden scenario with the known
/// fingerprints (JavaScript's equal to Python's) and scores at least each scenario's
/// `min_score`; a failing one failed hidden-1 at the known tick with the simulator's reason;
/// every trajectory came back whole with its fingerprint. Returns the verdicts.
pub fn check(sim: &str, controllers: &[Controller], hidden: &[&str], r: &RunResult) -> Vec<Value> {
    assert_eq!(r.steps.len(), controllers.len(), "every step ran: {r:?}");
    let mut verdicts = Vec::new();
    for (c, ran) in controllers.iter().zip(&r.steps) {
        let v: Value = serde_json::from_slice(ran.stdout.as_slice()).unwrap_or_else(|e| {
            panic!(
                "{sim} {}: no verdict ({e}): exit {:?}\nstdout {}\nstderr {}",
                c.file(),
                ran.exit_code,
                String::from_utf8_lossy(ran.stdout.as_slice()),
                String::from_utf8_lossy(ran.stderr.as_slice())
            )
        });
        assert_eq!(v["simulator"]["name"], sim, "{v}");
        assert_eq!(v["simulator"]["metadata"]["name"], sim, "{v}");
        let trials = v["trials"].as_array().expect("trials");
        assert_eq!(trials.len(), c.scenarios(hidden).len(), "{v}");
        for (t, s) in trials.iter().zip(c.scenarios(hidden)) {
            assert_eq!(t["name"], *s, "{t}");
            let art = r
                .artifacts
                .iter()
                .find(|a| a.path == trajectory(*c, s))
                .expect("its trajectory");
            assert!(art.found && !art.truncated, "{art:?}");
            let print = hex::encode(sha2::Sha256::digest(art.content.as_slice()));
            assert_eq!(t["fingerprint"], print.as_str(), "{t}");
            if c.accepted() {
                assert_eq!(t["end_reason"], "completed", "{sim} {} {s}: {t}", c.file());
                assert_eq!(t["pass"], true, "{t}");
                let score = t["score"].as_f64().expect("both exams score");
                assert!(score >= t["min_score"].as_f64().unwrap(), "{t}");
                let want = ACCEPTED
                    .iter()
                    .find(|(e, n, _)| *e == sim && n == s)
                    .expect("a known fingerprint")
                    .2;
                assert_eq!(print, want, "{sim} {} {s}", c.file());
            } else {
                let (_, tick, reason) = FAILING.iter().find(|(e, ..)| *e == sim).unwrap();
                assert_eq!(t["end_reason"], "failed", "{t}");
                assert_eq!(t["pass"], false, "{t}");
                assert_eq!(t["failed_at_tick"], *tick, "{sim} {}: {t}", c.file());
                assert!(
                    t["detail"].as_str().unwrap_or("").contains(reason),
                    "{sim} {}: {t}",
                    c.file()
                );
            }
        }
        assert_eq!(
            ran.exit_code,
            Some(if c.accepted() { 0 } else { 1 }),
            "{sim} {}",
            c.file()
        );
        verdicts.push(v);
    }
    verdicts
}
