//! The trial runner end to end, on the host as root: the runner drops itself to one test uid
//! and the controller to another, exactly as it does in the sandbox image with 1000 and 1001.
//! Each test has its own pair of uids, so parallel tests never see each other's processes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use plimsoll_testing::skip_or_fail;
use plimsoll_trial::launcher::processes_of_uid;
use plimsoll_trial::trajectory::decode;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

const RUNNER: &str = env!("CARGO_BIN_EXE_plimsoll-trial-runner");
const NODE: &str = "/usr/bin/node";
const PYTHON: &str = "/usr/bin/python3";
const STANDARD: &str = include_str!("../../../sims/cartpole/scenarios/standard.json");

fn controllers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/controllers")
}

/// True when the test can run; otherwise prints SKIP (or panics under CI=true).
fn can_run(test: &str, needs: &[&str]) -> bool {
    let mut missing = Vec::new();
    if !plimsoll_testing::is_root() {
        missing.push("root (the runner switches uids)".to_owned());
    }
    for n in needs {
        if !Path::new(n).exists() {
            missing.push(n.to_string());
        }
    }
    if missing.is_empty() {
        return true;
    }
    let reason = format!("needs {}", missing.join(", "));
    skip_or_fail(test, &reason);
    false
}

/// The cart-pole's four state values.
type State = [f64; 4];

/// A working directory owned by the test's runner uid, the uid pair, and a simulator index
/// holding the shipped cart-pole (root's, readable by all).
struct Fixture {
    dir: tempfile::TempDir,
    uid: u32,
    cuid: u32,
    sims: tempfile::TempDir,
}

/// Writes `sims` (name and module) and their index into `dir`, readable by all.
fn write_index(dir: &Path, sims: &[(&str, &[u8])]) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut entries = Vec::new();
    for (name, wasm) in sims {
        let path = dir.join(format!("{name}.wasm"));
        std::fs::write(&path, wasm).unwrap();
        entries.push(serde_json::json!({
            "name": name,
            "path": path,
            "sha256": hex::encode(Sha256::digest(wasm)),
        }));
    }
    let index = dir.join("index.json");
    std::fs::write(
        &index,
        serde_json::json!({"format": "plimsoll-simulators/1", "simulators": entries}).to_string(),
    )
    .unwrap();
    index
}

fn cartpole() -> &'static [u8] {
    plimsoll_sims::get("cartpole").unwrap().wasm
}

impl Fixture {
    /// `slot` picks a uid pair no other test uses.
    fn new(slot: u32) -> Fixture {
        let uid = 2_170_000 + 2 * slot;
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let sims = tempfile::tempdir().unwrap();
        write_index(sims.path(), &[("cartpole", cartpole())]);
        Fixture {
            dir,
            uid,
            cuid: uid + 1,
            sims,
        }
    }

    /// `--simulator cartpole` from the fixture's index.
    fn cartpole(&self) -> Vec<String> {
        vec![
            "--simulator".into(),
            "cartpole".into(),
            "--simulators-index".into(),
            self.sims.path().join("index.json").display().to_string(),
        ]
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes a file owned by the runner uid (readable by all).
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        std::os::unix::fs::chown(&p, Some(self.uid), Some(self.uid)).unwrap();
        p
    }

    fn scenario(&self, name: &str, ticks: u64, pass_ticks: u64) -> PathBuf {
        self.file(
            name,
            &format!(
                r#"{{"initial": {{"x": 0.3, "x_dot": -0.1, "theta": 0.08, "theta_dot": 0.05}}, "ticks": {ticks}, "pass_ticks": {pass_ticks}}}"#
            ),
        )
    }

    /// Runs the runner in the fixture directory with `args` before `--` and `controller`
    /// after, then checks that no process of the controller uid is left.
    fn run(&self, args: &[&str], controller: &[&str]) -> Output {
        self.run_with_ids([self.uid, self.uid, self.cuid, self.cuid], args, controller)
    }

    /// [`Fixture::run`] with other ids: runner uid and gid, controller uid and gid.
    fn run_with_ids(&self, ids: [u32; 4], args: &[&str], controller: &[&str]) -> Output {
        let ids = [
            "--uid".to_owned(),
            ids[0].to_string(),
            "--gid".into(),
            ids[1].to_string(),
            "--controller-uid".into(),
            ids[2].to_string(),
            "--controller-gid".into(),
            ids[3].to_string(),
        ];
        let names_one = args.iter().any(|a| *a == "--sim" || *a == "--simulator");
        #[allow(clippy::disallowed_methods, reason = "the test runs the runner binary")]
        let out = Command::new(RUNNER)
            .current_dir(self.dir.path())
            .env("TRIAL_TEST_SECRET", "s3cr3t-in-the-runner-environment")
            .args(ids)
            .args(if names_one {
                Vec::new()
            } else {
                self.cartpole()
            })
            .args(args)
            .arg("--")
            .args(controller)
            .output()
            .unwrap();
        let left = processes_of_uid(self.cuid, std::process::id() as i32);
        assert!(
            left.is_empty(),
            "processes of the controller uid left behind: {left:?}"
        );
        out
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The verdict's only trial, after checking the verdict's shape.
fn trial(out: &Output) -> Value {
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(text.lines().count(), 1, "one line of JSON: {text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["format"], "plimsoll-trial-verdict/2");
    assert_eq!(v["simulator"]["name"], "cartpole");
    assert_eq!(
        v["simulator"]["sha256"],
        hex::encode(Sha256::digest(cartpole()))
    );
    assert_eq!(v["simulator"]["metadata"]["ticks_per_second"], 100);
    let trials = v["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 1);
    assert_eq!(v["pass"], trials[0]["pass"]);
    trials[0].clone()
}

fn file_sha256(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

fn python(code: &str) -> Vec<String> {
    vec![PYTHON.to_owned(), "-c".to_owned(), code.to_owned()]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Generous deadlines for the tests that are not about deadlines (no timing assertions).
const RELAXED: [&str; 4] = [
    "--first-deadline-ms",
    "20000",
    "--tick-deadline-ms",
    "10000",
];

/// The documented dynamics, written again here from docs/trials.md with the host's sin/cos.
fn rk4_step(s: &State, force: f64) -> State {
    let (g, mc, mp, l, tau) = (9.8, 1.0, 0.1, 0.5, 0.01);
    let f = force.clamp(-10.0, 10.0);
    let total = mc + mp;
    let d = |q: [f64; 4]| -> [f64; 4] {
        let (st, ct) = (q[2].sin(), q[2].cos());
        let temp = (f + mp * l * q[3] * q[3] * st) / total;
        let th_acc = (g * st - ct * temp) / (l * (4.0 / 3.0 - mp * ct * ct / total));
        let x_acc = temp - mp * l * th_acc * ct / total;
        [q[1], x_acc, q[3], th_acc]
    };
    let add = |q: [f64; 4], k: [f64; 4], h: f64| {
        [
            q[0] + h * k[0],
            q[1] + h * k[1],
            q[2] + h * k[2],
            q[3] + h * k[3],
        ]
    };
    let q = *s;
    let k1 = d(q);
    let k2 = d(add(q, k1, tau / 2.0));
    let k3 = d(add(q, k2, tau / 2.0));
    let k4 = d(add(q, k3, tau));
    std::array::from_fn(|i| q[i] + tau / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i]))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

#[test]
fn accepted_javascript_passes_with_the_same_fingerprint_twice() {
    if !can_run(
        "accepted_javascript_passes_with_the_same_fingerprint_twice",
        &[NODE],
    ) {
        return;
    }
    let fx = Fixture::new(0);
    let accepted = controllers_dir().join("accepted.js");
    let mut prints = Vec::new();
    for _ in 0..2 {
        let scenario = fx.file("standard.json", STANDARD);
        let mut args = vec!["--scenario", "standard.json"];
        args.extend(RELAXED);
        let out = fx.run(&args, &[NODE, accepted.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let t = trial(&out);
        assert_eq!(t["end_reason"], "completed", "{t}");
        assert_eq!(t["pass"], true);
        assert_eq!(t["ticks"], 2000);
        assert_eq!(t["failed_at_tick"], Value::Null);
        assert_eq!(t["failed_at_seconds"], Value::Null);
        assert_eq!(t["detail"], Value::Null);
        assert_eq!(t["score"], Value::Null);
        assert_eq!(t["name"], "standard");
        assert_eq!(t["trajectory_bytes"], 80_000);
        assert!(!scenario.exists(), "the scenario file was deleted");
        let traj = fx.path("trajectory.bin");
        assert_eq!(
            t["fingerprint"],
            file_sha256(&traj),
            "fingerprint = SHA-256 of the file"
        );

        // The trajectory: the documented record layout, the documented scenario as the first
        // state, the controller's law as the forces, and the documented dynamics between
        // records (to 1e-12: the module's sin/cos are wasi-libc's, these are the host's).
        let records: Vec<(State, f64)> = decode(&std::fs::read(&traj).unwrap(), 4, 1)
            .unwrap()
            .into_iter()
            .map(|(s, a)| (s.try_into().unwrap(), a[0]))
            .collect();
        assert_eq!(records.len(), 2000);
        let (s0, _) = records[0];
        assert_eq!(s0, [0.3, -0.1, 0.08, 0.05]);
        for (k, (s, f)) in records.iter().enumerate() {
            let law = 1.0 * s[0] + 2.0 * s[1] + 25.0 * s[2] + 5.0 * s[3];
            assert_eq!(f.to_bits(), law.to_bits(), "force at tick {k}");
            let next = records.get(k + 1).map(|(n, _)| *n).unwrap_or_else(|| {
                let fs = &t["final_state"];
                ["x", "x_dot", "theta", "theta_dot"].map(|n| fs[n].as_f64().unwrap())
            });
            let want = rk4_step(s, *f);
            for (a, b) in next.iter().zip(want) {
                assert!(close(*a, b), "tick {k}: module {a} vs documented {b}");
            }
        }
        prints.push(t["fingerprint"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        prints[0], prints[1],
        "same controller, same scenario, same fingerprint"
    );
}

#[test]
fn accepted_python_passes_with_the_same_fingerprint_twice() {
    if !can_run(
        "accepted_python_passes_with_the_same_fingerprint_twice",
        &[PYTHON],
    ) {
        return;
    }
    let fx = Fixture::new(1);
    let accepted = controllers_dir().join("accepted.py");
    let mut prints = Vec::new();
    for _ in 0..2 {
        fx.file("standard.json", STANDARD);
        let mut args = vec!["--scenario", "standard.json"];
        args.extend(RELAXED);
        let out = fx.run(&args, &[PYTHON, accepted.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let t = trial(&out);
        assert_eq!(t["end_reason"], "completed", "{t}");
        assert_eq!(t["fingerprint"], file_sha256(&fx.path("trajectory.bin")));
        prints.push(t["fingerprint"].as_str().unwrap().to_owned());
    }
    assert_eq!(prints[0], prints[1]);
}

#[test]
fn the_draft_falls_with_another_fingerprint() {
    if !can_run("the_draft_falls_with_another_fingerprint", &[NODE]) {
        return;
    }
    let fx = Fixture::new(2);
    let mut args = vec!["--scenario", "standard.json"];
    args.extend(RELAXED);
    let mut prints = Vec::new();
    for name in ["draft.js", "draft.js", "accepted.js"] {
        fx.file("standard.json", STANDARD);
        let c = controllers_dir().join(name);
        let out = fx.run(&args, &[NODE, c.to_str().unwrap()]);
        let t = trial(&out);
        if name == "draft.js" {
            assert_eq!(out.status.code(), Some(1), "a failed trial exits 1");
            assert_eq!(t["end_reason"], "failed", "{t}");
            assert!(t["detail"].as_str().unwrap().contains("pole"), "{t}");
            assert_eq!(t["pass"], false);
            let k = t["failed_at_tick"].as_u64().unwrap();
            assert_eq!(k, 188, "the documented fall: {t}");
            assert_eq!(t["ticks"], k);
            assert_eq!(t["trajectory_bytes"], 40 * k);
            assert_eq!(t["failed_at_seconds"].as_f64().unwrap(), k as f64 / 100.0);
            let fs = &t["final_state"];
            let (x, theta) = (fs["x"].as_f64().unwrap(), fs["theta"].as_f64().unwrap());
            assert!(x.abs() > 2.4 || theta.abs() > 12f64.to_radians(), "{t}");
        }
        assert_eq!(t["fingerprint"], file_sha256(&fx.path("trajectory.bin")));
        prints.push(t["fingerprint"].as_str().unwrap().to_owned());
    }
    assert_eq!(prints[0], prints[1], "the draft is deterministic too");
    assert_ne!(
        prints[0], prints[2],
        "the draft and the accepted controller differ"
    );
}

#[test]
fn the_controller_sees_neither_the_scenario_nor_the_runner() {
    if !can_run(
        "the_controller_sees_neither_the_scenario_nor_the_runner",
        &[PYTHON],
    ) {
        return;
    }
    let fx = Fixture::new(3);
    let scenario = fx.scenario("secret-scenario.json", 3, 3);
    let code = format!(
        r#"
import os, sys
def attempt(what, f):
    try:
        print(f"{{what}}: read {{f()!r}}", file=sys.stderr)
    except OSError as e:
        print(f"{{what}}: {{type(e).__name__}} errno {{e.errno}}", file=sys.stderr)
launcher = os.getppid()
with open(f"/proc/{{launcher}}/status") as f:
    runner = int([l.split()[1] for l in f if l.startswith("PPid:")][0])
attempt("scenario", lambda: open({scenario:?}, "rb").read())
for who, pid in (("runner", runner), ("launcher", launcher)):
    attempt(f"{{who}} mem", lambda pid=pid: open(f"/proc/{{pid}}/mem", "rb").read(16))
    attempt(f"{{who}} environ", lambda pid=pid: open(f"/proc/{{pid}}/environ", "rb").read())
    attempt(f"{{who}} cmdline", lambda pid=pid: open(f"/proc/{{pid}}/cmdline", "rb").read())
    attempt(f"{{who}} signal", lambda pid=pid: os.kill(pid, 0))
    attempt(f"{{who}} renice", lambda pid=pid: os.setpriority(os.PRIO_PROCESS, pid, 19))
print("ids:", os.getresuid(), os.getresgid(), os.getgroups(), file=sys.stderr)
print("env:", sorted(os.environ), file=sys.stderr)
sys.stderr.flush()
for line in sys.stdin:
    print(0, flush=True)
"#,
        scenario = scenario.to_str().unwrap()
    );
    let mut args = vec!["--scenario", "secret-scenario.json"];
    args.extend(RELAXED);
    let out = fx.run(&args, &strs(&python(&code)));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let t = trial(&out);
    assert_eq!(t["end_reason"], "completed", "{t}");
    let seen = t["controller_stderr"].as_str().unwrap();
    let (c, u) = (fx.cuid, fx.uid);
    let mut wants = vec![
        "scenario: FileNotFoundError errno 2".to_owned(),
        format!("ids: ({c}, {c}, {c}) ({c}, {c}, {c}) []"),
        "env: ['HOME', 'LANG', 'PATH']".to_owned(),
        // The runner holds nothing of the controller uid: not even a renice.
        "runner renice: PermissionError errno 1".to_owned(),
    ];
    for who in ["runner", "launcher"] {
        wants.push(format!("{who} mem: PermissionError errno 13"));
        wants.push(format!("{who} environ: PermissionError errno 13"));
        wants.push(format!("{who} signal: PermissionError errno 1"));
    }
    for want in wants {
        assert!(seen.contains(&want), "want {want:?} in:\n{seen}");
    }
    // /proc/<pid>/cmdline is readable by every process; the runner re-executed itself so that
    // it shows only the descriptor its arguments came through (the launcher is its fork).
    let line = |prefix: &str| {
        seen.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("{seen}"))
            .to_owned()
    };
    let runner_cmdline = line("runner cmdline:");
    assert!(runner_cmdline.contains("--args-fd"), "{runner_cmdline}");
    let launcher_cmdline = line("launcher cmdline:");
    assert!(launcher_cmdline.contains("--args-fd"), "{launcher_cmdline}");
    for cmdline in [&runner_cmdline, &launcher_cmdline] {
        for hidden in ["scenario", "uid", "python", &u.to_string()] {
            assert!(!cmdline.contains(hidden), "{hidden} in {cmdline}");
        }
    }
    assert!(!seen.contains("s3cr3t"), "{seen}");
}

#[test]
fn a_controller_that_never_answers_times_out() {
    if !can_run("a_controller_that_never_answers_times_out", &["/bin/sh"]) {
        return;
    }
    let fx = Fixture::new(4);
    fx.scenario("s.json", 100, 100);
    // It also leaves a process in a session of its own, which the runner must end too.
    let out = fx.run(
        &["--scenario", "s.json", "--first-deadline-ms", "300"],
        &["/bin/sh", "-c", "setsid sleep 60 & sleep 60"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let t = trial(&out);
    assert_eq!(t["end_reason"], "controller_timeout", "{t}");
    assert_eq!(t["pass"], false);
    assert_eq!(t["ticks"], 0);
    assert!(t["detail"].as_str().unwrap().contains("tick 0"), "{t}");
    assert_eq!(t["controller_exit"]["signal"], 9, "{t}");
    assert_eq!(t["trajectory_bytes"], 0);
    assert_eq!(t["fingerprint"], hex::encode(Sha256::digest(b"")));
}

#[test]
fn a_late_answer_after_the_first_tick_times_out() {
    if !can_run("a_late_answer_after_the_first_tick_times_out", &[PYTHON]) {
        return;
    }
    let fx = Fixture::new(5);
    fx.scenario("s.json", 100, 100);
    let code = r#"
import sys, time
n = 0
for line in sys.stdin:
    n += 1
    if n == 5:
        time.sleep(30)
    print(0, flush=True)
"#;
    let out = fx.run(
        &[
            "--scenario",
            "s.json",
            "--first-deadline-ms",
            "20000",
            "--tick-deadline-ms",
            "200",
        ],
        &strs(&python(code)),
    );
    let t = trial(&out);
    assert_eq!(t["end_reason"], "controller_timeout", "{t}");
    assert_eq!(t["ticks"], 4);
    assert!(
        t["detail"].as_str().unwrap().contains("200 ms at tick 4"),
        "{t}"
    );
}

#[test]
fn floods_end_the_trial() {
    if !can_run("floods_end_the_trial", &[PYTHON]) {
        return;
    }
    let fx = Fixture::new(6);
    let mut args = vec!["--scenario", "s.json"];
    args.extend(RELAXED);
    // A line that never ends.
    fx.scenario("s.json", 100, 100);
    let long_line =
        "import sys, time\nsys.stdout.write('1' * 100000); sys.stdout.flush(); time.sleep(60)";
    let out = fx.run(&args, &strs(&python(long_line)));
    let t = trial(&out);
    assert_eq!(t["end_reason"], "controller_flood", "{t}");
    assert!(
        t["detail"].as_str().unwrap().contains("longer than 4096"),
        "{t}"
    );

    // A flood on stderr.
    fx.scenario("s.json", 100, 100);
    let out = fx.run(&args, &["/bin/sh", "-c", "cat /dev/zero >&2"]);
    let t = trial(&out);
    assert_eq!(t["end_reason"], "controller_flood", "{t}");
    assert!(t["detail"].as_str().unwrap().contains("stderr"), "{t}");
    assert_eq!(t["controller_stderr_truncated"], true);
    assert_eq!(t["controller_stderr"].as_str().unwrap().len(), 4096);

    // A line of exactly 4096 bytes with its newline is still an answer (here garbage).
    fx.scenario("s.json", 100, 100);
    let max_line = "import sys, time\nsys.stdout.write('1' * 4095 + '\\n'); sys.stdout.flush(); time.sleep(60)";
    let out = fx.run(&args, &strs(&python(max_line)));
    let t = trial(&out);
    assert_eq!(t["end_reason"], "controller_garbage", "{t}");
}

#[test]
fn a_controller_that_exits_early_ends_the_trial() {
    if !can_run("a_controller_that_exits_early_ends_the_trial", &[PYTHON]) {
        return;
    }
    let fx = Fixture::new(7);
    fx.scenario("s.json", 100, 100);
    let code = "import sys\nsys.stdin.readline()\nprint(0, flush=True)\nsys.exit(3)";
    let mut args = vec!["--scenario", "s.json"];
    args.extend(RELAXED);
    let out = fx.run(&args, &strs(&python(code)));
    assert_eq!(out.status.code(), Some(1));
    let t = trial(&out);
    assert_eq!(t["end_reason"], "controller_exited", "{t}");
    assert_eq!(t["ticks"], 1);
    assert_eq!(t["controller_exit"]["code"], 3, "{t}");
    assert_eq!(t["trajectory_bytes"], 40);
}

#[test]
fn garbage_answers_end_the_trial() {
    if !can_run("garbage_answers_end_the_trial", &[PYTHON]) {
        return;
    }
    let fx = Fixture::new(8);
    let mut args = vec!["--scenario", "s.json"];
    args.extend(RELAXED);
    for (answer, want) in [
        ("hello", "not a number"),
        ("nan", "not a number"),
        ("1e999", "not finite"),
        ("", "empty"),
    ] {
        fx.scenario("s.json", 100, 100);
        let code = format!(
            "import sys\nfor i, line in enumerate(sys.stdin):\n    print(0 if i < 2 else {answer:?}, flush=True)"
        );
        let out = fx.run(&args, &strs(&python(&code)));
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let t = trial(&out);
        assert_eq!(t["end_reason"], "controller_garbage", "{answer}: {t}");
        assert_eq!(t["ticks"], 2);
        let detail = t["detail"].as_str().unwrap();
        assert!(
            detail.contains(want) && detail.contains("tick 2"),
            "{detail}"
        );
    }
}

#[test]
fn several_scenarios_run_in_turn() {
    if !can_run("several_scenarios_run_in_turn", &[NODE]) {
        return;
    }
    let fx = Fixture::new(9);
    let a = fx.scenario("a.json", 50, 50);
    let b = fx.file(
        "b.json",
        r#"{"name": "tilted", "initial": {"x": 0, "x_dot": 0, "theta": -0.15, "theta_dot": 0}, "ticks": 300, "pass_ticks": 200}"#,
    );
    let c = controllers_dir().join("accepted.js");
    let mut args = vec![
        "--scenario",
        "a.json",
        "--scenario",
        "b.json",
        "--trajectory",
        "a.bin",
        "--trajectory",
        "b.bin",
    ];
    args.extend(RELAXED);
    let out = fx.run(&args, &[NODE, c.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let trials = v["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2);
    assert_eq!(trials[0]["ticks"], 50);
    assert_eq!(trials[1]["ticks"], 300);
    assert_eq!(trials[1]["name"], "tilted");
    assert_eq!(trials[0]["fingerprint"], file_sha256(&fx.path("a.bin")));
    assert_eq!(trials[1]["fingerprint"], file_sha256(&fx.path("b.bin")));
    assert!(!a.exists() && !b.exists());
    assert_eq!(v["pass"], true);
}

fn wasm_module(fx: &Fixture, name: &str, wat: &str) -> PathBuf {
    let p = fx.path(name);
    std::fs::write(&p, wat::parse_str(wat).unwrap()).unwrap();
    p
}

/// A one-variable simulator of plimsoll-sim/1 in the text format, with `step`'s body given.
fn sim_wat(step: &str, head: &str) -> String {
    let meta = r#"{"abi": 1, "name": "probe", "version": "1", "ticks_per_second": 100, "state": [{"name": "x", "unit": ""}], "action": [{"name": "u", "unit": "", "min": -1, "max": 1}], "initial": [{"name": "x", "unit": ""}]}"#
        .replace('"', "\\\"");
    format!(
        r#"(module {head}
          (memory (export "memory") 1)
          (data (i32.const 1024) "{meta}\00")
          (func (export "plimsoll_sim_abi") (result i32) i32.const 1)
          (func (export "metadata") (result i32) i32.const 1024)
          (func (export "buffer") (result i32) i32.const 8192)
          (func (export "init") (result i32) i32.const 0)
          (func (export "state") (param i32) (result f64) f64.const 0)
          (func (export "reason") (result i32) i32.const 1024)
          (func (export "step") (result i32) {step}))"#
    )
}

#[test]
fn a_simulator_out_of_fuel_or_memory_is_a_clean_error() {
    if !can_run(
        "a_simulator_out_of_fuel_or_memory_is_a_clean_error",
        &["/bin/sh"],
    ) {
        return;
    }
    let fx = Fixture::new(10);
    let answer_zero = ["/bin/sh", "-c", "while read l; do echo 0; done"];
    let scenario = r#"{"initial": {"x": 0}, "ticks": 100, "pass_ticks": 100}"#;
    let looping = wasm_module(
        &fx,
        "loop.wasm",
        &sim_wat("(loop $l (br $l)) i32.const 0", ""),
    );
    let greedy = wasm_module(
        &fx,
        "greedy.wasm",
        &sim_wat("(drop (memory.grow (i32.const 1000))) i32.const 0", ""),
    );
    let trapping = wasm_module(&fx, "trap.wasm", &sim_wat("unreachable", ""));
    let wrong = wasm_module(&fx, "wrong.wasm", &sim_wat("i32.const 9", ""));
    for (sim, want) in [
        (&looping, "ran out of fuel in `step`"),
        (&greedy, "trapped in `step`"),
        (&trapping, "trapped in `step`"),
        (&wrong, "step() returned 9"),
    ] {
        fx.file("s.json", scenario);
        let out = fx.run(
            &["--scenario", "s.json", "--sim", sim.to_str().unwrap()],
            &answer_zero,
        );
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        assert!(out.stdout.is_empty(), "no verdict");
        assert!(stderr(&out).contains(want), "{}", stderr(&out));
    }

    // A module that imports its maths, or lacks an export, never starts a controller; the
    // scenario files are deleted all the same.
    let importing = wasm_module(
        &fx,
        "importing.wasm",
        &sim_wat(
            "i32.const 0",
            r#"(import "env" "sin" (func (param f64) (result f64)))"#,
        ),
    );
    let incomplete = wasm_module(
        &fx,
        "incomplete.wasm",
        &sim_wat("i32.const 0", "").replace(r#"(export "reason")"#, ""),
    );
    for (sim, want) in [
        (&importing, "imports `env.sin`"),
        (&incomplete, "does not export `reason`"),
    ] {
        let s = fx.file("s.json", scenario);
        let out = fx.run(
            &["--scenario", "s.json", "--sim", sim.to_str().unwrap()],
            &answer_zero,
        );
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains(want), "{}", stderr(&out));
        assert!(!s.exists(), "the scenario was deleted");
    }
}

/// The simulator comes from the index, by name, with the digest the index declares: another
/// name, another digest asked for, or a module whose bytes changed under the index, is
/// refused before any controller starts.
#[test]
fn the_simulator_is_the_one_the_index_declares() {
    if !can_run("the_simulator_is_the_one_the_index_declares", &["/bin/sh"]) {
        return;
    }
    let fx = Fixture::new(17);
    let marker = fx.path("controller-ran");
    let controller = format!("touch {}", marker.display());
    let index = fx.sims.path().join("index.json");
    let index = index.to_str().unwrap();
    let sha = hex::encode(Sha256::digest(cartpole()));
    let other = "0".repeat(64);
    for (args, want) in [
        (
            vec!["--simulator", "tank", "--simulators-index", index],
            "has no simulator named tank (it has: cartpole)",
        ),
        (
            vec![
                "--simulator",
                "cartpole",
                "--simulator-sha256",
                &other,
                "--simulators-index",
                index,
            ],
            "with SHA-256 0000",
        ),
        (
            vec!["--simulator", "cartpole"],
            "/opt/plimsoll/simulators/index.json",
        ),
        (
            vec![
                "--simulator",
                "cartpole",
                "--simulator-sha256",
                "ABC",
                "--simulators-index",
                index,
            ],
            "64 lowercase hex",
        ),
    ] {
        let s = fx.scenario("s.json", 10, 10);
        let mut all = args.clone();
        all.extend(["--scenario", "s.json"]);
        let out = fx.run(&all, &["/bin/sh", "-c", &controller]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
        assert!(!marker.exists(), "no controller started");
        let _ = std::fs::remove_file(s);
    }
    // The right digest is taken.
    fx.scenario("s.json", 10, 10);
    let out = fx.run(
        &[
            "--simulator",
            "cartpole",
            "--simulator-sha256",
            &sha,
            "--simulators-index",
            index,
            "--scenario",
            "s.json",
        ],
        &["/bin/sh", "-c", "while read l; do echo 0; done"],
    );
    assert_eq!(trial(&out)["ticks"], 10, "{}", stderr(&out));
    // A module changed after the index was written.
    let module = fx.sims.path().join("cartpole.wasm");
    let mut bytes = cartpole().to_vec();
    bytes.push(0);
    std::fs::write(&module, bytes).unwrap();
    fx.scenario("s.json", 10, 10);
    let out = fx.run(&["--scenario", "s.json"], &["/bin/sh", "-c", &controller]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("not the {sha} its image declares")),
        "{}",
        stderr(&out)
    );
    assert!(!marker.exists());
}

#[test]
fn bad_scenarios_are_deleted_and_nothing_starts() {
    if !can_run("bad_scenarios_are_deleted_and_nothing_starts", &["/bin/sh"]) {
        return;
    }
    let fx = Fixture::new(11);
    let marker = fx.path("controller-ran");
    let controller = format!("touch {}", marker.display());
    for (text, want) in [
        ("{not json", "not a valid scenario"),
        (
            r#"{"initial": {"x": 0, "x_dot": 0, "theta": 0.5, "theta_dot": 0}, "ticks": 10, "pass_ticks": 10}"#,
            "the simulator cartpole refused it: the initial state is already fallen",
        ),
        (
            r#"{"initial": {"x": 0, "x_dot": 0, "theta": 0}, "ticks": 10, "pass_ticks": 10}"#,
            "initial value `theta_dot` is missing",
        ),
        (
            r#"{"initial": {"x": 0, "x_dot": 0, "theta": 0, "theta_dot": 0}, "ticks": 10, "pass_ticks": 10, "min_score": 1}"#,
            "does not score",
        ),
    ] {
        let good = fx.scenario("good.json", 10, 10);
        let bad = fx.file("bad.json", text);
        let out = fx.run(
            &[
                "--scenario",
                "good.json",
                "--scenario",
                "bad.json",
                "--trajectory",
                "1.bin",
                "--trajectory",
                "2.bin",
            ],
            &["/bin/sh", "-c", &controller],
        );
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains(want), "{}", stderr(&out));
        assert!(!good.exists() && !bad.exists(), "both deleted");
        assert!(!marker.exists(), "no controller started");
    }
}

#[test]
fn without_privileges_the_runner_refuses_and_reads_nothing() {
    if !can_run(
        "without_privileges_the_runner_refuses_and_reads_nothing",
        &["/bin/sh"],
    ) {
        return;
    }
    let fx = Fixture::new(12);
    let s = fx.scenario("s.json", 10, 10);
    #[allow(clippy::disallowed_methods, reason = "the test runs the runner binary")]
    let out = std::os::unix::process::CommandExt::uid(
        Command::new(RUNNER).current_dir(fx.dir.path()),
        fx.uid,
    )
    .args(fx.cartpole())
    .args(["--uid", &fx.uid.to_string(), "--gid", &fx.uid.to_string()])
    .args([
        "--controller-uid",
        &fx.cuid.to_string(),
        "--controller-gid",
        &fx.cuid.to_string(),
    ])
    .args(["--scenario", "s.json", "--", "/bin/true"])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("CAP_SETUID and CAP_SETGID"),
        "{}",
        stderr(&out)
    );
    assert!(s.exists(), "nothing was read or deleted");

    // The same uid for both sides is refused before anything.
    let out = fx.run_with_ids(
        [fx.uid, fx.uid, fx.uid, fx.cuid],
        &["--scenario", "s.json"],
        &["/bin/true"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("another uid"), "{}", stderr(&out));
    assert!(s.exists());
}

#[test]
fn a_busy_controller_uid_is_refused() {
    if !can_run("a_busy_controller_uid_is_refused", &["/bin/sleep"]) {
        return;
    }
    let fx = Fixture::new(13);
    let s = fx.scenario("s.json", 10, 10);
    // A process of the controller uid that is not the runner's: the launcher would kill it,
    // so the runner refuses to start.
    #[allow(clippy::disallowed_methods, reason = "the test starts a stray process")]
    let mut stray =
        std::os::unix::process::CommandExt::uid(&mut Command::new("/bin/sleep"), fx.cuid)
            .arg("30")
            .spawn()
            .unwrap();
    #[allow(clippy::disallowed_methods, reason = "the test runs the runner binary")]
    let out = Command::new(RUNNER)
        .current_dir(fx.dir.path())
        .args(fx.cartpole())
        .args(["--uid", &fx.uid.to_string(), "--gid", &fx.uid.to_string()])
        .args([
            "--controller-uid",
            &fx.cuid.to_string(),
            "--controller-gid",
            &fx.cuid.to_string(),
        ])
        .args(["--scenario", "s.json", "--", "/bin/true"])
        .output()
        .unwrap();
    stray.kill().unwrap();
    stray.wait().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("already exist"), "{}", stderr(&out));
    assert!(s.exists(), "nothing was read");
}

#[test]
fn a_killed_runner_leaves_no_controller_behind() {
    if !can_run("a_killed_runner_leaves_no_controller_behind", &["/bin/sh"]) {
        return;
    }
    let fx = Fixture::new(14);
    fx.scenario("s.json", 10, 10);
    #[allow(clippy::disallowed_methods, reason = "the test runs the runner binary")]
    let mut runner = Command::new(RUNNER)
        .current_dir(fx.dir.path())
        .args(fx.cartpole())
        .args(["--uid", &fx.uid.to_string(), "--gid", &fx.uid.to_string()])
        .args([
            "--controller-uid",
            &fx.cuid.to_string(),
            "--controller-gid",
            &fx.cuid.to_string(),
        ])
        .args(["--scenario", "s.json", "--first-deadline-ms", "60000"])
        .args(["--", "/bin/sh", "-c", "setsid sleep 60 & sleep 60"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the controller runs (the launcher plus at least one more process of the uid).
    let me = std::process::id() as i32;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while processes_of_uid(fx.cuid, me).len() < 3 {
        assert!(
            std::time::Instant::now() < until,
            "the controller never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    runner.kill().unwrap();
    runner.wait().unwrap();
    // The launcher sees its socket close, ends every process of the uid and exits; its
    // zombie goes to init. Wait for that to happen (a bound, not a timing assertion).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let left: Vec<i32> = processes_of_uid(fx.cuid, me)
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                    !s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                })
            })
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < until, "left behind: {left:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// `--reproducible` leaves the one timing field out, and the controller is always ended by
/// the runner (SIGKILL before the end of its input), so two runs of a deterministic
/// controller print the same verdict, byte for byte: what a replay compares.
#[test]
fn reproducible_verdicts_are_identical_byte_for_byte() {
    if !can_run(
        "reproducible_verdicts_are_identical_byte_for_byte",
        &[NODE, PYTHON],
    ) {
        return;
    }
    let fx = Fixture::new(15);
    let mut args = vec!["--scenario", "standard.json", "--reproducible"];
    args.extend(RELAXED);
    for (interpreter, name) in [
        (NODE, "accepted.js"),
        (PYTHON, "accepted.py"),
        (NODE, "draft.js"),
    ] {
        let c = controllers_dir().join(name);
        let mut verdicts = Vec::new();
        for _ in 0..3 {
            fx.file("standard.json", STANDARD);
            let out = fx.run(&args, &[interpreter, c.to_str().unwrap()]);
            let t = trial(&out);
            assert_eq!(t["wall_ms"], Value::Null, "{t}");
            assert_eq!(t["controller_exit"]["signal"], 9, "{t}");
            verdicts.push(out.stdout);
        }
        assert_eq!(verdicts[0], verdicts[1], "{name}");
        assert_eq!(verdicts[1], verdicts[2], "{name}");
    }
    // Without the flag the verdict carries the wall time.
    fx.file("standard.json", STANDARD);
    let c = controllers_dir().join("accepted.py");
    let out = fx.run(&args[..2], &[PYTHON, c.to_str().unwrap()]);
    assert!(trial(&out)["wall_ms"].is_u64());
}

/// `--bench-sim` acts before the runner gives anything up (it reads the scenario it is given
/// and the module), so a runner holding a capability (as root here, or as a sandbox's trial
/// step) refuses it and reads nothing.
#[test]
fn the_benchmark_is_refused_with_capabilities() {
    if !can_run("the_benchmark_is_refused_with_capabilities", &[]) {
        return;
    }
    let fx = Fixture::new(16);
    let s = fx.scenario("s.json", 10, 10);
    #[allow(clippy::disallowed_methods, reason = "the test runs the runner binary")]
    let out = Command::new(RUNNER)
        .current_dir(fx.dir.path())
        .args(fx.cartpole())
        .args(["--bench-sim", "10", "--scenario", "s.json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("runs only without capabilities"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());
    assert!(s.exists());
}
