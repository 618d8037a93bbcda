//! What is the process provider's own, run for real (as root): its probe and what withdraws
//! it, setup failures refused with nothing left, the reap after a killed daemon and the
//! watchdog without one. The attacks and limits every provider must hold are the conformance
//! suite's (crates/engine/tests/conformance.rs).

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::Duration;

use plimsoll_process::{ProcessConfig, ProcessProvider};
use plimsoll_sandbox::reap::processes_of_uid;
use plimsoll_sandbox::{LaunchError, LaunchPlan, Outcome, Provider as _, ResolvedLimits};
use plimsoll_testing::{cpu_seconds, is_root, probe_binary, skip_or_fail};
use plimsoll_wire::{Language, Reason, RunSpec, Snippet};

/// Each test has uids of its own (tests run in parallel, and the end of a run kills every
/// process of its uid).
const UID_BASE: u32 = 2_310_000;

struct Env {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    provider: ProcessProvider,
}

fn setup(test: &str, probe_uid: u32) -> Option<Env> {
    if !is_root() {
        skip_or_fail(test, "needs root to switch uids");
        return None;
    }
    let tmp = tempfile::Builder::new()
        .prefix("plimsoll-process-test-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o711)).unwrap();
    let provider = ProcessProvider::new(ProcessConfig {
        node: "/usr/bin/node".into(),
        python: "/usr/bin/python3".into(),
        probe: probe_binary().unwrap_or_else(|e| panic!("{e}")),
        state_dir: state.clone(),
        probe_uid: UID_BASE + probe_uid,
    });
    Some(Env {
        _tmp: tmp,
        state,
        provider,
    })
}

fn limits() -> ResolvedLimits {
    ResolvedLimits {
        timeout: Duration::from_secs(20),
        memory_bytes: 1 << 30,
        output_bytes: 1 << 20,
        pids: 64,
        disk_bytes: 64 << 20,
        artifact_bytes: 1 << 20,
    }
}

fn plan(env: &Env, uid: u32, language: Language, code: &str, limits: ResolvedLimits) -> LaunchPlan {
    let run_id = format!("t{uid}-{}", std::process::id());
    LaunchPlan {
        image: None,
        run_dir: env.state.join("runs").join(&run_id),
        run_id,
        request_id: "test".into(),
        privileges: plimsoll_sandbox::Privileges::Unprivileged,
        spec: RunSpec::Snippet(Snippet {
            language,
            code: code.into(),
        }),
        limits,
        uid: UID_BASE + uid,
        gid: UID_BASE + uid,
        controller_uid: UID_BASE + uid + 1,
        controller_gid: UID_BASE + uid + 1,
        broker: None,
        tap: None,
    }
}

/// Runs a plan and checks what must hold after every run: no process of the uid, no run dir.
fn run_plan(env: &Env, plan: &LaunchPlan) -> Result<Outcome, LaunchError> {
    let out = env.provider.run(plan);
    assert!(
        !plan.run_dir.exists(),
        "run dir {} left behind",
        plan.run_dir.display()
    );
    if plan.uid != 0 {
        assert_eq!(
            processes_of_uid(plan.uid),
            Vec::<i32>::new(),
            "processes of uid {} left",
            plan.uid
        );
    }
    out
}

use Language::{Javascript as Js, Python as Py};

#[test]
fn setup_failures_are_refusals_and_leave_nothing() {
    let Some(env) = setup("setup_failures_are_refusals_and_leave_nothing", 23) else {
        return;
    };
    // uid 0 is refused before anything starts.
    let mut p = plan(&env, 24, Py, "print(1)", limits());
    p.uid = 0;
    p.gid = 0;
    let e = run_plan(&env, &p).unwrap_err();
    assert!(
        matches!(
            e,
            LaunchError::NotStarted {
                reason: Reason::Environment,
                ..
            }
        ),
        "{e:?}"
    );
    // A missing interpreter: nothing ran, nothing left.
    let broken = ProcessProvider::new(ProcessConfig {
        node: "/nonexistent/node".into(),
        ..env.provider.config().clone()
    });
    let p = plan(&env, 24, Js, "console.log(1)", limits());
    let e = broken.run(&p).unwrap_err();
    assert!(
        matches!(
            e,
            LaunchError::NotStarted {
                reason: Reason::Environment,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!p.run_dir.exists());
    // A state dir the sandbox uid cannot traverse is named, with the fix.
    let closed = env.state.join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut p = plan(&env, 24, Py, "print(1)", limits());
    p.run_dir = closed.join("runs").join("x");
    let e = run_plan(&env, &p).unwrap_err();
    assert!(e.to_string().contains("cannot be traversed"), "{e}");
    assert!(matches!(e, LaunchError::NotStarted { .. }));
}

#[test]
fn the_probe_passes_and_reports() {
    let Some(env) = setup("the_probe_passes_and_reports", 25) else {
        return;
    };
    let probed = env.provider.probe();
    assert_eq!(probed.available, Ok(()), "{:#?}", probed.evidence.checks);
    let ev = &probed.evidence;
    assert!(ev.checks.values().all(|v| v == "ok"), "{:#?}", ev.checks);
    let report = ev.probe.as_ref().expect("a probe report");
    assert_eq!(report.uid, UID_BASE + 25);
    assert!(report.environment.is_empty());
    assert_eq!(report.seccomp_mode, 2);
    assert_eq!(report.namespaces["net"].same_as_host, Some(true));
    let names: Vec<&str> = ev.binaries.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["node", "python3", "plimsoll-probe"]);
    assert!(ev.binaries.iter().all(|b| b.sha256.len() == 64));
    assert!(
        ev.environment.starts_with("plimsoll-engine/"),
        "{}",
        ev.environment
    );
    assert!(ev.config.contains_key("landlock.abi_enforced"));
    assert_eq!(processes_of_uid(UID_BASE + 25), Vec::<i32>::new());
    // Nothing of the probe runs is left in the runs root.
    let left: Vec<_> = std::fs::read_dir(env.state.join("runs")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_missing_binary_withdraws_the_provider() {
    let Some(env) = setup("a_missing_binary_withdraws_the_provider", 26) else {
        return;
    };
    let p = ProcessProvider::new(ProcessConfig {
        python: "/nonexistent/python3".into(),
        ..env.provider.config().clone()
    });
    let probed = p.probe();
    let why = probed.available.unwrap_err().to_string();
    assert!(why.contains("/nonexistent/python3"), "{why}");
    assert_ne!(probed.evidence.checks["binary.python3"], "ok");
}

/// The "daemon" (plimsoll-process-run) is SIGKILLed mid-run: its snippet's process, work
/// tmpfs, memory cgroup, run directory (holding the code) and the run's watchdog (a root
/// shell and its `sleep`, until the deadline, 100 s on) stay behind. The next provider's
/// probe reaps them all. Before, the orphan outlived the restart and the directory was never
/// removed; the watchdog slept on to its deadline.
#[test]
fn nothing_is_left_after_the_daemon_is_killed_and_restarted() {
    let test = "nothing_is_left_after_the_daemon_is_killed_and_restarted";
    let Some(env) = setup(test, 68) else {
        return;
    };
    let uid = UID_BASE + 69;
    let run_id = format!("killed-{}", std::process::id());
    let run_dir = env.state.join("runs").join(&run_id);
    let mut child = plimsoll_sandbox::Spawn::new(env!("CARGO_BIN_EXE_plimsoll-process-run"), "/")
        .args([
            "run",
            "python",
            // No output: the daemon holds the pipes' read ends, so a write after its death
            // would end the snippet with EPIPE, and this test is about what survives. It
            // leaves a file in its work directory once it runs.
            "import time\nopen('running', 'w').close()\ntime.sleep(120)",
        ])
        .arg("--state-dir")
        .arg(&env.state)
        .args(["--uid", &uid.to_string(), "--run-id", &run_id])
        .args(["--timeout-ms", "100000"])
        .spawn()
        .expect("start plimsoll-process-run");
    let start = std::time::Instant::now();
    // The uid appears before the exec, and the interpreter before it is handed the code
    // (killed then, it would end without running anything): wait for the code itself.
    let live = || live_of_uid(uid);
    while !run_dir.join("work/running").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the run never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = rustix::process::Pid::from_raw(child.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    child.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!live().is_empty(), "the snippet should outlive the daemon");
    assert!(
        run_dir.join("code/main.py").exists(),
        "the code stays behind"
    );
    let cgroup = memory_cgroup_of(&run_id);
    assert!(cgroup.exists(), "{} stays behind", cgroup.display());
    let watchdogs = watchdog_groups(&run_id);
    assert_eq!(watchdogs.len(), 1, "the run's watchdog outlives the daemon");

    // A new daemon starts: its probe reaps.
    let again = ProcessProvider::new(env.provider.config().clone());
    let probed = again.probe();
    assert_eq!(
        probed.evidence.checks.get("reap").map(String::as_str),
        Some("ok")
    );
    let start = std::time::Instant::now();
    loop {
        let alive = live();
        if alive.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "processes of uid {uid} survived the reap: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!run_dir.exists(), "{} left behind", run_dir.display());
    assert!(!cgroup.exists(), "{} left behind", cgroup.display());
    let start = std::time::Instant::now();
    while !plimsoll_testing::live_of_group(watchdogs[0]).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the dead daemon's watchdog lives on after the reap: {:?}",
            plimsoll_testing::live_of_group(watchdogs[0])
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&run_id),
        "the work tmpfs of {run_id} is still mounted"
    );
    assert_eq!(again.reap().run_dirs, Vec::<String>::new());
}

/// The processes of `uid` that have not exited. Zombies do not count: where PID 1 reaps
/// nothing (this host's), an earlier run's orphan stays one.
fn live_of_uid(uid: u32) -> Vec<i32> {
    let mut p = processes_of_uid(uid);
    p.retain(|&p| !plimsoll_sandbox::reap::is_zombie(p));
    p
}

/// The live watchdogs (their process group ids: each leads its own) of run `run_id`.
fn watchdog_groups(run_id: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains(plimsoll_sandbox::watchdog::WATCHDOG_NAME)
            && cmd.contains(run_id)
            && !plimsoll_sandbox::reap::is_zombie(pid)
        {
            out.push(pid);
        }
    }
    out
}

/// The memory cgroup a run named `run_id` gets (cgroup v1's memory hierarchy here).
fn memory_cgroup_of(run_id: &str) -> PathBuf {
    let v1 = PathBuf::from("/sys/fs/cgroup/memory");
    let root = if v1.join("memory.limit_in_bytes").exists() {
        v1
    } else {
        PathBuf::from("/sys/fs/cgroup")
    };
    root.join("plimsoll-process").join(run_id)
}

/// The "daemon" (plimsoll-process-run) is SIGKILLed one second into a run of an endless
/// loop with a 3 s timeout, and nothing restarts it: the watchdog it left kills the run's
/// processes at the deadline plus [`plimsoll_process::WATCHDOG_GRACE`], and their CPU time
/// stops there. Before, only RLIMIT_CPU bounded the loop, and a sleeping process stayed.
#[test]
fn a_run_ends_at_its_deadline_without_the_daemon() {
    let test = "a_run_ends_at_its_deadline_without_the_daemon";
    let Some(env) = setup(test, 70) else {
        return;
    };
    let uid = UID_BASE + 71;
    let run_id = format!("deadline-{}", std::process::id());
    let timeout = Duration::from_secs(3);
    let start = std::time::Instant::now();
    // A busy loop and a sleeper beside it (RLIMIT_CPU alone would never end the sleeper).
    let code = "import os, time\nif os.fork() == 0:\n    time.sleep(300)\nwhile True:\n    pass";
    let mut child = plimsoll_sandbox::Spawn::new(env!("CARGO_BIN_EXE_plimsoll-process-run"), "/")
        .args(["run", "python", code])
        .arg("--state-dir")
        .arg(&env.state)
        .args(["--uid", &uid.to_string(), "--run-id", &run_id])
        .args(["--timeout-ms", &timeout.as_millis().to_string()])
        .spawn()
        .expect("start plimsoll-process-run");
    while live_of_uid(uid).len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the run never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(1));
    let pid = rustix::process::Pid::from_raw(child.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    child.child.wait().unwrap();
    // CPU seconds (utime + stime) of each process of the uid, as last seen alive.
    let mut cpu = std::collections::BTreeMap::new();
    let bound = timeout + plimsoll_process::WATCHDOG_GRACE;
    loop {
        let mut alive = 0;
        for p in processes_of_uid(uid) {
            if let Some(t) = cpu_seconds(p) {
                alive += 1;
                cpu.insert(p, t);
            }
        }
        if alive == 0 {
            break;
        }
        assert!(
            start.elapsed() < bound + Duration::from_secs(20),
            "the run's processes outlived the deadline by far ({:?})",
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ended = start.elapsed();
    let total: f64 = cpu.values().sum();
    eprintln!(
        "processes gone {ended:?} after start (deadline {timeout:?} + grace {:?}); CPU {total:.2} s",
        plimsoll_process::WATCHDOG_GRACE
    );
    assert!(
        total <= (bound + Duration::from_secs(2)).as_secs_f64(),
        "{total} s of CPU"
    );
    // The dead daemon's leftovers (mount, cgroup, directory) go with a reap.
    let report = env.provider.reap();
    assert!(report.errors.is_empty(), "{report:?}");
}
