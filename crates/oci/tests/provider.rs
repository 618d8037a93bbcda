//! What is the container provider's own, each run against crun, runc and runsc: its probe, a
//! missing runtime, which runtime failures are refused as not dispatched, the reap after a
//! killed daemon and the watchdog without one. The attacks and limits every provider must
//! hold are the conformance suite's (crates/engine/tests/conformance.rs).
//!
//! Needs root, the runtime, the sandbox image (`scripts/build-image`) and the probe and agent
//! binaries (built on demand). Without them a test prints `SKIP` and returns, unless
//! `CI=true`, where it fails.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::time::{Duration, Instant};

#[macro_use]
mod common;

use plimsoll_oci::{OciConfig, OciProvider, RuntimeKind, spec};
use plimsoll_sandbox::reap::processes_of_uid;
use plimsoll_sandbox::{LaunchError, Provider, Spawn};
use plimsoll_testing::{fresh_id, limits, py};
use plimsoll_wire::{Reason, Tier};

use common::{image, kind_index, rig};

/// A uid of its own for each scenario and runtime (common/mod.rs: the ranges).
fn uid(scenario: u32, kind: RuntimeKind) -> u32 {
    2_100_000 + scenario * 10 + kind_index(kind)
}

/// Reaps the dead processes of `uid` whose parent is this process; fails on a live one.
fn reap_our_zombies(uid: u32) {
    let me = std::process::id().to_string();
    for pid in processes_of_uid(uid) {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
                .unwrap_or("")
                .to_owned()
        };
        assert!(
            field("State:").starts_with('Z'),
            "process {pid} of uid {uid} is alive: {}",
            field("State:")
        );
        if field("PPid:") == me {
            let p = rustix::process::Pid::from_raw(pid).unwrap();
            let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty());
        }
    }
}

on_every_runtime!(
    the_probe_passes,
    only_a_failed_create_is_not_dispatched,
    a_run_ends_at_its_deadline_without_the_daemon,
);

fn the_probe_passes(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let probed = rig.p.probe();
    let e = &probed.evidence;
    assert_eq!(probed.available, Ok(()), "checks: {:#?}", e.checks);
    assert_eq!(probed.tier, kind.tier());
    assert_eq!(e.isolation, kind.tier());
    let identity = std::fs::read_to_string(image().join("identity")).unwrap();
    assert_eq!(e.environment, identity.trim());
    let rt = &e.binaries[0];
    assert_eq!(rt.name, kind.name());
    assert!(rt.version.contains(kind.name()), "{rt:?}");
    assert_eq!(rt.sha256.len(), 64);
    // The trial runner, when built, is named with its digest (trials run it).
    let runner = &rig.p.config().trial_runner;
    if runner.is_file() {
        let named = e
            .binaries
            .iter()
            .find(|b| b.name == "plimsoll-trial-runner")
            .expect("the trial runner in the evidence");
        let bytes = std::fs::read(runner).unwrap();
        assert_eq!(
            named.sha256,
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes))
        );
    }
    let report = e.probe.as_ref().expect("a probe report");
    assert_eq!(report.uid, rig.p.config().probe_uid);
    assert_eq!(report.network_interfaces, ["lo"]);
    for (check, outcome) in &e.checks {
        assert_eq!(outcome, "ok", "{check}");
    }
    if kind == RuntimeKind::Runsc {
        assert_eq!(e.config["platform"], "ptrace");
        assert_ne!(
            report.kernel_release,
            rustix::system::uname().release().to_string_lossy()
        );
    } else {
        for ns in ["pid", "net", "mnt", "ipc", "uts"] {
            assert_eq!(report.namespaces[ns].same_as_host, Some(false), "{ns}");
        }
        assert_eq!(report.seccomp_mode, 2);
    }
    assert!(rig.p.state().run_ids().is_empty());
}

/// The daemon is SIGKILLed mid-run: the container, its cgroup, its run directory and the
/// run's watchdog (a root shell and its `sleep`, until the deadline, 100 s on) stay. The next
/// provider's `reap` removes them all and ends the watchdog (before, it slept on to its
/// deadline: one pair per run under `Restart=always`).
#[test]
fn crun_reap_after_the_daemon_was_killed() {
    let test = "crun_reap_after_the_daemon_was_killed";
    let Some(rig) = rig(RuntimeKind::Crun, test) else {
        return;
    };
    let uid = uid(14, RuntimeKind::Crun);
    let run_id = fresh_id("killed");
    let id = format!("plimsoll-{run_id}");
    let mut child = Spawn::new(env!("CARGO_BIN_EXE_plimsoll-oci-run"), "/")
        .args(["run", "crun", "python", "import time\ntime.sleep(120)"])
        .arg("--state-root")
        .arg(&rig.state_root)
        .args([
            "--cgroup-parent",
            &rig.cgroup_parent,
            "--run-id",
            &run_id,
            "--timeout-ms",
            "100000",
        ])
        .args(["--uid", &uid.to_string(), "--image"])
        .arg(image())
        .spawn()
        .expect("start plimsoll-oci-run");
    let start = Instant::now();
    let mut seen = BTreeMap::new();
    loop {
        let listed = rig.p.runtime().list().unwrap_or_default().contains(&id);
        let procs = !processes_of_uid(uid).is_empty();
        // Its watchdog given its deadline: the code was handed over.
        let watching = watchdog_groups(&run_id)
            .iter()
            .any(|g| plimsoll_testing::live_of_group(*g).len() > 1);
        seen.insert("listed", listed);
        seen.insert("processes", procs);
        seen.insert("watchdog started", watching);
        if listed && procs && watching {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the run never started: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGKILL the "daemon" alone: its runtime child and the container carry on.
    let pid = rustix::process::Pid::from_raw(child.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    child.child.wait().unwrap();
    let mut drained = Vec::new();
    let _ = child.stdout.read_to_end(&mut drained);
    assert!(
        rig.p.runtime().list().unwrap().contains(&id),
        "the container should have outlived the daemon"
    );
    // The lock goes with the last open description of its file: a child the daemon had
    // just forked (and that has not exec'd or exited yet) may hold it for a moment more.
    let killed = Instant::now();
    while rig.p.state().is_live(&id) {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "the dead daemon's lock is not released: held by {:?}",
            holders_of(&rig.p.state().runs().join(&id).join("lock"))
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let watchdogs = watchdog_groups(&run_id);
    assert_eq!(watchdogs.len(), 1, "the run's watchdog outlives the daemon");

    // A new daemon starts: a fresh provider on the same state root reaps.
    let mut c = rig.p.config().clone();
    c.state_root = rig.state_root.clone();
    let again = OciProvider::new(c);
    let report = again.reap();
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.watchdogs, watchdogs, "{report:?}");
    let ended = Instant::now();
    while !plimsoll_testing::live_of_group(watchdogs[0]).is_empty() {
        assert!(
            ended.elapsed() < Duration::from_secs(5),
            "the dead daemon's watchdog lives on after the reap: {:?}",
            plimsoll_testing::live_of_group(watchdogs[0])
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(report.containers, std::slice::from_ref(&id));
    assert_eq!(report.run_dirs, std::slice::from_ref(&id));
    assert_eq!(report.cgroups, std::slice::from_ref(&run_id));
    // The container's init lost its parent (the killed runtime) and came to this test
    // process, the nearest child subreaper: dead, it waits here to be reaped. A restarted
    // daemon is not its parent; init reaps it there.
    reap_our_zombies(uid);
    rig.assert_clean(&run_id, uid);
    assert!(
        again
            .reap()
            .summary()
            .starts_with("removed 0 containers, 0 cgroups, 0 run directories")
    );
}

/// The real runtime behind a wrapper that makes `create` and `run` fail (while `fail-create`
/// exists) or runs the real `start` or `run --detach` and then reports failure: a failed
/// `create` ran nothing and is refused as not dispatched; a failure from `start` on may have
/// run code that was in the bundle and is `MayHaveRun` (a project's, conservatively: its job
/// is handed over only after the start too). A snippet's container is created and started
/// at once (`run --detach`), its process the waiting interpreter, and is handed its code
/// only after it showed its wall (at runsc, said it), so a failed `run` ran nothing of it:
/// not dispatched.
fn only_a_failed_create_is_not_dispatched(kind: RuntimeKind, test: &str) {
    let Some(mut rig) = rig(kind, test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("fail-create");
    let wrapper = dir.path().join(kind.name());
    let real = kind.default_binary();
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do\n  if {{ [ \"$a\" = create ] || [ \"$a\" = run ]; }} && [ -e {flag} ]; then\n    echo 'wrapper: create refused' >&2\n    exit 1\n  fi\n  if [ \"$a\" = start ] || [ \"$a\" = run ]; then\n    {real} \"$@\"\n    echo 'wrapper: start failed after starting' >&2\n    exit 1\n  fi\ndone\nexec {real} \"$@\"\n",
            flag = flag.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut c = rig.p.config().clone();
    c.binary = wrapper;
    rig.p = OciProvider::new(c);
    let uid = uid(13, kind);

    let project = plimsoll_wire::RunSpec::Project(plimsoll_wire::Project {
        files: vec![],
        steps: vec![plimsoll_wire::Step {
            name: None,
            run: "echo ran".into(),
        }],
        artifacts: vec![],
    });
    let plan = rig.plan(project, limits(), uid);
    let e = rig.p.run(&plan).expect_err("start was made to fail");
    rig.assert_clean(&plan.run_id, uid);
    match e {
        e @ LaunchError::MayHaveRun { .. } => {
            let message = e.message();
            assert!(message.contains("start failed after starting"), "{message}")
        }
        other => panic!("a failure after start was refused as not dispatched: {other:?}"),
    }

    let plan = rig.plan(py("print('ran')"), limits(), uid);
    let e = rig.p.run(&plan).expect_err("start was made to fail");
    rig.assert_clean(&plan.run_id, uid);
    match e {
        e @ LaunchError::NotStarted { .. } => {
            let (reason, message) = (e.not_dispatched().expect("not started"), e.message());
            assert_eq!(reason, Reason::Environment);
            assert!(message.contains("start failed after starting"), "{message}");
        }
        other => panic!("a snippet's failed start at {kind:?}: {other:?}"),
    }

    std::fs::write(&flag, b"").unwrap();
    let plan = rig.plan(py("print('ran')"), limits(), uid);
    let e = rig.p.run(&plan).expect_err("create was made to fail");
    rig.assert_clean(&plan.run_id, uid);
    match e {
        e @ LaunchError::NotStarted { .. } => {
            let (reason, message) = (e.not_dispatched().expect("not started"), e.message());
            assert_eq!(reason, Reason::Environment);
            assert!(message.contains("create refused"), "{message}");
        }
        other => panic!("a failed create was not refused: {other:?}"),
    }
}

/// A provider whose runtime is missing is not offered, and says why.
#[test]
fn a_missing_runtime_is_not_offered() {
    let mut c = OciConfig::new(
        RuntimeKind::Crun,
        image(),
        "/nonexistent/agent".into(),
        "/nonexistent/probe".into(),
        2_199_100,
    );
    c.binary = "/nonexistent/crun".into();
    c.state_root = std::env::temp_dir().join(format!("plimsoll-missing-{}", std::process::id()));
    c.cgroup_parent = format!("/plimsoll-test/missing-{}", std::process::id());
    let p = OciProvider::new(c.clone());
    let probed = p.probe();
    let why = probed.available.unwrap_err().to_string();
    assert!(
        why.contains("runtime") && why.contains("/nonexistent/crun"),
        "{why}"
    );
    assert_eq!(probed.tier, Tier::Container);
    assert!(probed.evidence.probe.is_none(), "nothing ran");
    let _ = std::fs::remove_dir_all(&c.state_root);
}

/// The "daemon" (plimsoll-oci-run) is SIGKILLed one second into a run of an endless loop
/// with a 3 s timeout, and nothing restarts it: the watchdog it left ends the container's
/// processes at the deadline plus [`plimsoll_oci::WATCHDOG_GRACE`]. The container cgroup's
/// CPU time (cpuacct) stops there. Before, the loop went on until a daemon started again.
fn a_run_ends_at_its_deadline_without_the_daemon(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let uid = uid(18, kind);
    let run_id = fresh_id("deadline");
    let timeout = Duration::from_secs(3);
    let start = Instant::now();
    let mut child = Spawn::new(env!("CARGO_BIN_EXE_plimsoll-oci-run"), "/")
        .args(["run", kind.name(), "python", "while True:\n    pass"])
        .arg("--state-root")
        .arg(&rig.state_root)
        .args(["--cgroup-parent", &rig.cgroup_parent, "--run-id", &run_id])
        .args(["--timeout-ms", &timeout.as_millis().to_string()])
        .args(["--uid", &uid.to_string(), "--image"])
        .arg(image())
        .spawn()
        .expect("start plimsoll-oci-run");
    let layout = rig.p.layout().unwrap();
    let ctr = spec::container_cgroup(rig.p.cgroup_parent(), &run_id);
    let procs_of = |dirs: &[std::path::PathBuf]| -> usize {
        dirs.iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .map(|t| t.lines().count())
            .max()
            .unwrap_or(0)
    };
    while procs_of(&layout.dirs(&ctr)) == 0 {
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
    let mut drained = Vec::new();
    let _ = child.stdout.read_to_end(&mut drained);
    let cpu_ns = || -> Option<u64> {
        layout
            .dirs(&ctr)
            .iter()
            .find_map(|d| std::fs::read_to_string(d.join("cpuacct.usage")).ok())
            .and_then(|t| t.trim().parse().ok())
    };
    let bound = timeout + plimsoll_oci::WATCHDOG_GRACE;
    loop {
        if procs_of(&layout.dirs(&ctr)) == 0 {
            break;
        }
        assert!(
            start.elapsed() < bound + Duration::from_secs(20),
            "the container's processes outlived the deadline by far ({:?})",
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ended = start.elapsed();
    let first = cpu_ns();
    std::thread::sleep(Duration::from_secs(1));
    let cpu = cpu_ns();
    eprintln!(
        "{}: processes gone {ended:?} after start (deadline {timeout:?} + grace {:?}); cgroup CPU {:?} s",
        kind.name(),
        plimsoll_oci::WATCHDOG_GRACE,
        cpu.map(|n| n as f64 / 1e9)
    );
    assert_eq!(first, cpu, "CPU time still grows");
    if let Some(ns) = cpu {
        // One CPU per run (the cpu quota): never more CPU time than wall time.
        assert!(
            Duration::from_nanos(ns) <= bound + Duration::from_secs(2),
            "{ns} ns of CPU"
        );
    }
    // The dead daemon's leftovers (container state, cgroups, directory) go with a reap.
    let _ = rig.p.reap();
    reap_our_zombies(uid);
}

#[test]
fn crun_a_member_shows_its_wall_and_one_whose_wall_changed_gets_no_code() {
    a_member_shows_its_wall_and_one_whose_wall_changed_gets_no_code(
        RuntimeKind::Crun,
        "crun_a_member_shows_its_wall_and_one_whose_wall_changed_gets_no_code",
    );
}

#[test]
fn runc_a_member_shows_its_wall_and_one_whose_wall_changed_gets_no_code() {
    a_member_shows_its_wall_and_one_whose_wall_changed_gets_no_code(
        RuntimeKind::Runc,
        "runc_a_member_shows_its_wall_and_one_whose_wall_changed_gets_no_code",
    );
}

/// A warm member's result carries the wall its waiting interpreter showed. Then the attack:
/// while a member waits, its memory cgroup's limit is changed from outside (as anything with
/// the host's root could). Its claim reads the wall, finds the limit no longer the one the
/// provider was judged on, and refuses before the code is handed over: not dispatched,
/// `environment`, and nothing of the member is left.
fn a_member_shows_its_wall_and_one_whose_wall_changed_gets_no_code(kind: RuntimeKind, test: &str) {
    use plimsoll_sandbox::warm::{WarmPlan, WarmShape};
    let Some(rig) = rig(kind, test) else { return };
    let uid = uid(21, kind);
    let l = limits();
    let warm_plan = || {
        let member_id = fresh_id("wall");
        WarmPlan {
            image: None,
            run_dir: rig.state_root.join("runs").join(&member_id),
            member_id,
            shape: WarmShape {
                language: plimsoll_wire::Language::Python,
                memory_bytes: l.memory_bytes,
                pids: l.pids,
                disk_bytes: l.disk_bytes,
            },
            uid,
            gid: uid,
            max_timeout: l.timeout,
        }
    };
    let claim = |wp: &WarmPlan| plimsoll_sandbox::LaunchPlan {
        image: None,
        run_id: fresh_id("claim"),
        request_id: "wall-test".into(),
        privileges: plimsoll_sandbox::Privileges::Unprivileged,
        spec: py("print('ran')"),
        limits: l,
        uid,
        gid: uid,
        controller_uid: uid,
        controller_gid: uid,
        run_dir: wp.run_dir.clone(),
        broker: None,
        tap: None,
    };

    let wp = warm_plan();
    let member = rig.p.warm(&wp).unwrap_or_else(|e| panic!("{e}"));
    let (outcome, teardown) = member.run(&claim(&wp)).unwrap_or_else(|e| panic!("{e}"));
    teardown.run().unwrap();
    assert_eq!(outcome.result.stdout.0, b"ran\n", "{:?}", outcome.result);
    let w = outcome
        .result
        .wall
        .expect("a warm run's result has its wall");
    assert_eq!((w.uid, w.euid, w.gid), (uid, uid, uid), "{w:?}");
    let zero = Some("0000000000000000");
    for set in [&w.cap_inh, &w.cap_prm, &w.cap_eff, &w.cap_bnd, &w.cap_amb] {
        assert_eq!(set.as_deref(), zero, "{w:?}");
    }
    assert_eq!((w.no_new_privs, w.seccomp), (Some(true), Some(2)), "{w:?}");
    assert!(w.root_read_only, "{w:?}");
    assert_eq!(w.network_interfaces, ["lo"]);
    assert_eq!(w.memory_limit_bytes, Some(l.memory_bytes), "{w:?}");
    assert_eq!(w.pids_limit, Some(l.pids), "{w:?}");
    for ns in ["cgroup", "ipc", "mnt", "net", "pid", "uts"] {
        let seen = w.namespaces.iter().find(|n| n.name == ns);
        assert_eq!(
            seen.and_then(|n| n.same_as_host),
            Some(false),
            "{ns}: {w:?}"
        );
    }

    let wp = warm_plan();
    let member = rig.p.warm(&wp).unwrap_or_else(|e| panic!("{e}"));
    let layout = rig.p.layout().unwrap();
    let memory = layout.memory_hierarchy().expect("a memory controller");
    let ctr = spec::container_cgroup(rig.p.cgroup_parent(), &wp.member_id);
    let limit = memory.mount.join(ctr.trim_start_matches('/'));
    let limit = limit.join(if memory.v2 {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    });
    std::fs::write(&limit, (l.memory_bytes / 2).to_string())
        .unwrap_or_else(|e| panic!("{}: {e}", limit.display()));
    match member.run(&claim(&wp)) {
        Err(e @ LaunchError::NotStarted { .. }) => {
            assert_eq!(e.not_dispatched(), Some(Reason::Environment), "{e}");
            let m = e.message();
            assert!(m.contains("limits") && m.contains("memory"), "{m}");
            assert!(m.contains("not handed over"), "{m}");
        }
        Err(e) => panic!("not refused before the code was handed over: {e}"),
        Ok((o, t)) => {
            let _ = t.run();
            panic!("the code was handed over: {:?}", o.result)
        }
    }
    rig.assert_clean(&wp.member_id, uid);
}

/// Two daemons on one host, each with a state root of its own and the same (default-like)
/// cgroup parent: one's start-up reap leaves the other's runs alone. A member of the first
/// waits (its container running in its cgroup under the shared parent) while the second
/// reaps; the member then runs its code. Before, the reap removed every cgroup under the
/// parent that its own state did not name, killing the other daemon's container.
#[test]
fn crun_a_reap_leaves_the_runs_of_another_state_root_alone() {
    use plimsoll_sandbox::warm::{WarmPlan, WarmShape};
    let test = "crun_a_reap_leaves_the_runs_of_another_state_root_alone";
    let Some(rig) = rig(RuntimeKind::Crun, test) else {
        return;
    };
    let uid = uid(23, RuntimeKind::Crun);
    let l = limits();
    let member_id = fresh_id("other");
    let wp = WarmPlan {
        image: None,
        run_dir: rig.state_root.join("runs").join(&member_id),
        member_id: member_id.clone(),
        shape: WarmShape {
            language: plimsoll_wire::Language::Python,
            memory_bytes: l.memory_bytes,
            pids: l.pids,
            disk_bytes: l.disk_bytes,
        },
        uid,
        gid: uid,
        max_timeout: l.timeout,
    };
    let member = rig.p.warm(&wp).unwrap_or_else(|e| panic!("{e}"));

    // The other daemon: the same runtime and cgroup parent, another state root.
    let mut c = rig.p.config().clone();
    c.state_root = rig.state_root.join("other-daemon");
    let other = OciProvider::new(c);
    assert_eq!(other.cgroup_parent(), rig.p.cgroup_parent());
    let report = other.reap();
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(
        (
            report.containers.len(),
            report.cgroups.len(),
            report.run_dirs.len()
        ),
        (0, 0, 0),
        "the other daemon's reap took this one's member: {report:?}"
    );

    let plan = plimsoll_sandbox::LaunchPlan {
        image: None,
        run_id: fresh_id("claim"),
        request_id: "two-daemons".into(),
        privileges: plimsoll_sandbox::Privileges::Unprivileged,
        spec: py("print('ran')"),
        limits: l,
        uid,
        gid: uid,
        controller_uid: uid,
        controller_gid: uid,
        run_dir: wp.run_dir.clone(),
        broker: None,
        tap: None,
    };
    let (outcome, teardown) = member
        .run(&plan)
        .unwrap_or_else(|e| panic!("the member did not survive the other reap: {e}"));
    teardown.run().unwrap();
    assert_eq!(outcome.result.stdout.0, b"ran\n", "{:?}", outcome.result);
    rig.assert_clean(&member_id, uid);
}

/// #28 (15): a run at crun leaves no zombie in the process that ran it (a child subreaper,
/// as the daemon is). crun's `create` forks twice and its second fork, which starts the
/// container and exits on its own, comes to this process: before, no one reaped it (one
/// zombie per run), and a container's process that exited while that fork was still there
/// could not be waited for ("No child processes"). Eight runs, four at a time.
#[test]
fn crun_runs_leave_no_zombie_here() {
    let test = "crun_runs_leave_no_zombie_here";
    let Some(rig) = rig(RuntimeKind::Crun, test) else {
        return;
    };
    // Scenarios 24 to 31: a uid of its own for each of the eight runs.
    let uid = |i: u32| uid(24 + i, RuntimeKind::Crun);
    for round in 0..2 {
        std::thread::scope(|s| {
            for i in 0..4 {
                let rig = &rig;
                s.spawn(move || {
                    let r = rig.run(py("print('ran')"), limits(), uid(round * 4 + i));
                    assert_eq!(r.stdout.0, b"ran\n", "{r:?}");
                });
            }
        });
    }
    let zombies: Vec<(i32, String)> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
                .collect::<Vec<_>>()
        })
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (head, rest) = stat.rsplit_once(") ")?;
            rest.starts_with('Z').then(|| (pid, head.to_owned()))
        })
        .collect();
    assert_eq!(zombies, Vec::<(i32, String)>::new(), "zombies left here");
}

/// The processes with `path` open (their pid and command line), from /proc.
fn holders_of(path: &std::path::Path) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let holds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == path));
        if holds {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            out.push((pid, String::from_utf8_lossy(&cmd).replace('\0', " ")));
        }
    }
    out
}

/// The watchdogs (their process group ids: each leads its own) watching run `run_id`'s
/// cgroups, alive.
fn watchdog_groups(run_id: &str) -> Vec<i32> {
    let mut groups: Vec<i32> = common::processes_naming(plimsoll_sandbox::watchdog::WATCHDOG_NAME)
        .into_iter()
        .filter(|(pid, cmd)| cmd.contains(run_id) && !plimsoll_sandbox::reap::is_zombie(*pid))
        .map(|(pid, _)| pid)
        .collect();
    groups.sort();
    groups
}
