//! The hostile trial controller (hostile.py beside this file) and what it may see, shared by
//! the trial tests of every provider that runs trials (`#[path]`-included).
//!
//! hostile.py plays like examples/controllers/accepted.py, so its fingerprint is the accepted
//! one, after trying, as the controller uid, to learn the scenario and to reach the runner,
//! the launcher and the agent: their memory, environment, descriptors (docs/trials.md: the
//! controller sees their numbers, never what they hold) and signals, and every regular file
//! it can open. It reports on stderr, which the verdict carries. The scenario's name is a
//! fresh marker, in hostile.py's source only reversed, so finding it anywhere is a leak.

use plimsoll_wire::ProjectFile;

/// The controller's source, with `@MARKER_REVERSED@` for the marker and `@SCENARIO@` for
/// the scenario file its runner is given.
const SOURCE: &str = include_str!("hostile.py");

/// One hostile trial: a fresh marker, the controller and the scenario that carries it.
pub struct Hostile {
    /// The scenario's name, which the controller must never find.
    pub marker: String,
}

impl Hostile {
    pub fn new() -> Self {
        Hostile {
            marker: format!("hidden-{}", plimsoll_testing::fresh_id("m")),
        }
    }

    /// `hostile.py` and a scenario named after the marker at `scenario` (the standard start,
    /// played for 2000 ticks), which the controller tries to read first.
    pub fn files(&self, scenario: &str) -> Vec<ProjectFile> {
        let reversed: String = self.marker.chars().rev().collect();
        let marker = &self.marker;
        let json = format!(
            r#"{{"name": "{marker}", "initial": {{"x": 0.3, "x_dot": -0.1, "theta": 0.08, "theta_dot": 0.05}}, "ticks": 2000, "pass_ticks": 2000}}"#
        );
        let source = SOURCE
            .replace("@MARKER_REVERSED@", &reversed)
            .replace("@SCENARIO@", scenario);
        assert!(!source.contains("@MARKER_REVERSED@") && !source.contains("@SCENARIO@"));
        vec![file("hostile.py", &source), file(scenario, &json)]
    }
}

fn file(path: &str, content: &str) -> ProjectFile {
    ProjectFile {
        path: path.into(),
        content: content.into(),
        executable: false,
    }
}

/// What the controller reported (`controller_stderr`) shows it learnt nothing: the scenario
/// file gone, the job unreadable (`job`: its errno line, e.g. `"errno 13"`), the marker in no
/// file it could read, no descriptor of the runner, the launcher or the agent giving a byte,
/// their memory unreadable and signals refused, and the controller's own ids all
/// `controller_uid`. Environments and descriptor 0 are denied, or (`gvisor`, whose procfs
/// lets the same euid open them) readable and empty.
pub fn assert_saw_nothing(seen: &str, controller_uid: u32, job: &str, gvisor: bool) {
    let c = controller_uid;
    let mut wants = vec![
        "scenario: errno 2".to_owned(),
        format!("job: {job}"),
        "marker found in [], ".to_owned(),
        "descriptors read: []".to_owned(),
        format!("ids ({c}, {c}, {c}) ({c}, {c}, {c}) []"),
    ];
    for who in ["runner", "launcher", "agent"] {
        wants.push(format!("{who} mem: errno 13"));
        wants.push(format!("{who} kill: errno 1"));
    }
    for want in &wants {
        assert!(seen.contains(want.as_str()), "want {want:?} in:\n{seen}");
    }
    for l in seen.lines() {
        assert!(!l.contains("MARKER"), "{l}\n{seen}");
        if l.contains(" environ: ") && !l.ends_with("errno 13") {
            assert!(gvisor, "{l}\n{seen}");
        }
        if l.contains(" fd0: ") {
            assert!(
                l.ends_with("errno 13") || l.ends_with("errno 2") || l.ends_with("read 0 bytes"),
                "{l}\n{seen}"
            );
        }
    }
}
