use std::time::Duration;

use plimsoll_wire::launch::{LaunchRequest, Plan, PlanPrivileges};
use plimsoll_wire::{Language, RunSpec, Snippet};

use super::*;

/// One field of a plan made wrong.
type Spoil = Box<dyn Fn(&mut Plan)>;

fn bounds(store: &Path) -> Bounds {
    Bounds {
        uids: 200_000..200_010,
        runs_dir: "/state/runs".into(),
        image_root: store.canonicalize().unwrap(),
        maximums: ResolvedLimits {
            timeout: Duration::from_secs(60),
            memory_bytes: 1 << 30,
            output_bytes: 1 << 20,
            pids: 128,
            disk_bytes: 1 << 30,
            artifact_bytes: 1 << 20,
        },
    }
}

fn plan(store: &Path) -> Plan {
    Plan {
        run_id: "r-1".into(),
        request_id: "q".into(),
        spec: RunSpec::Snippet(Snippet {
            language: Language::Python,
            code: "print(1)".into(),
        }),
        limits: PlanLimits {
            timeout_ms: 1_000,
            memory_bytes: 1 << 28,
            output_bytes: 1 << 10,
            pids: 64,
            disk_bytes: 1 << 20,
            artifact_bytes: 1 << 10,
        },
        uid: 200_000,
        gid: 200_000,
        controller_uid: 200_004,
        controller_gid: 200_004,
        run_dir: "/state/runs/r-1".into(),
        broker: None,
        privileges: PlanPrivileges::Unprivileged,
        tap: false,
        image: Some(PlanImage {
            name: "sandbox".into(),
            identity: "sha256:00".into(),
            rootfs: store.join("sandbox/rootfs"),
            disk: None,
            named: false,
        }),
    }
}

fn store() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("sandbox/rootfs")).unwrap();
    dir
}

#[test]
fn a_plan_within_the_settings_passes() {
    let store = store();
    bounds(store.path()).check(&plan(store.path())).unwrap();
}

#[test]
fn every_field_outside_the_settings_is_refused() {
    let store = store();
    let b = bounds(store.path());
    let outside = tempfile::tempdir().unwrap();
    let spoilt: Vec<(&str, Spoil)> = vec![
        ("uid", Box::new(|p| p.uid = 0)),
        ("gid", Box::new(|p| p.gid = 199_999)),
        ("controller uid", Box::new(|p| p.controller_uid = 200_010)),
        ("controller gid", Box::new(|p| p.controller_gid = 65_534)),
        ("run directory", Box::new(|p| p.run_dir = "/etc".into())),
        (
            "run directory",
            Box::new(|p| p.run_dir = "/state/runs/r-1/../../etc".into()),
        ),
        ("run id", Box::new(|p| p.run_id = "../etc".into())),
        ("timeout_ms", Box::new(|p| p.limits.timeout_ms = 60_001)),
        (
            "memory_bytes",
            Box::new(|p| p.limits.memory_bytes = (1 << 30) + 1),
        ),
        ("pids", Box::new(|p| p.limits.pids = 129)),
        (
            "privileges",
            Box::new(|p| p.privileges = PlanPrivileges::TrialRunner),
        ),
        (
            "privileges",
            Box::new(|p| p.privileges = PlanPrivileges::DropsToRunUid),
        ),
        (
            "outside the image store",
            Box::new(|p| p.image.as_mut().unwrap().rootfs = "/".into()),
        ),
        (
            "outside the image store",
            Box::new(move |p| p.image.as_mut().unwrap().rootfs = outside.path().to_owned()),
        ),
        (
            "cannot be read",
            Box::new(|p| p.image.as_mut().unwrap().disk = Some("/nonexistent/disk".into())),
        ),
    ];
    for (what, spoil) in spoilt {
        let mut p = plan(store.path());
        spoil(&mut p);
        let why = b.check(&p).expect_err(what);
        assert!(why.contains(what), "{what}: {why}");
    }
}

#[test]
fn a_symlink_out_of_the_store_is_outside_it() {
    let store = store();
    std::os::unix::fs::symlink("/", store.path().join("escape")).unwrap();
    let mut p = plan(store.path());
    p.image.as_mut().unwrap().rootfs = store.path().join("escape");
    let why = bounds(store.path()).check(&p).unwrap_err();
    assert!(why.contains("outside the image store"), "{why}");
}

#[test]
fn a_plan_cannot_say_what_its_type_does_not_hold() {
    let store = store();
    let request = LaunchRequest::Run {
        provider: "crun".into(),
        plan: plan(store.path()),
    };
    let mut value = serde_json::to_value(&request).unwrap();
    // It reads back as it was written...
    serde_json::from_value::<LaunchRequest>(value.clone()).unwrap();
    // ...but a mount, or any other field the plan type has not, is refused.
    value["run"]["plan"]["mounts"] = serde_json::json!([{"source": "/", "target": "/host"}]);
    let err = serde_json::from_value::<LaunchRequest>(value).unwrap_err();
    assert!(err.to_string().contains("unknown field `mounts`"), "{err}");
}

#[test]
fn a_cancel_outside_the_settings_is_refused() {
    let store = store();
    let b = bounds(store.path());
    b.check_sandbox("warm-00ff", 200_001).unwrap();
    assert!(b.check_sandbox("warm-00ff", 0).is_err());
    assert!(b.check_sandbox("a/b", 200_001).is_err());
    assert!(b.check_sandbox("", 200_001).is_err());
}

#[test]
fn a_failure_crosses_the_socket_whole() {
    let e = LaunchError::not_started(plimsoll_wire::Reason::Environment, "no room")
        .with_cleanup("and the cgroup stayed");
    let back = failure_from_wire(failure_to_wire(&e));
    assert_eq!(
        back.not_dispatched(),
        Some(plimsoll_wire::Reason::Environment)
    );
    assert_eq!(back.message(), e.message());
    let e = LaunchError::may_have_run("killed");
    let back = failure_from_wire(failure_to_wire(&e));
    assert_eq!(back.not_dispatched(), None);
    assert_eq!(back.message(), "killed");
}

#[test]
fn a_launcher_without_a_grants_file_refuses_the_grants_questions() {
    use plimsoll_broker::apart::ControlSource as _;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("launcher.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let me = rustix::process::getuid().as_raw();
    let launcher = std::sync::Arc::new(Launcher::new(Vec::new(), bounds(dir.path()), me));
    std::thread::spawn(move || launcher.serve(listener));
    let brokers = LauncherBrokers::new(&socket);
    let e = brokers.grants(false).unwrap_err().to_string();
    assert!(e.contains("the launcher has no grants file"), "{e}");
    let e = brokers.control().unwrap_err().to_string();
    assert!(e.contains("the launcher has no grants file"), "{e}");
    let e = brokers.load(1).unwrap_err().to_string();
    assert!(e.contains("the launcher has no grants file"), "{e}");
}

/// A launcher's `admit` answers, for every provider it hosts and in one round trip, what
/// `supports`, `takes_image` and `memory_floor` answer asked one by one; the engine's
/// admissions through it match the providers' own.
#[test]
fn one_admit_answers_what_the_three_questions_answer() {
    use crate::providers::{AnyProvider, admissions};
    let process = || {
        AnyProvider::Process(plimsoll_process::ProcessProvider::new(
            plimsoll_process::ProcessConfig {
                node: "/usr/bin/node".into(),
                python: "/usr/bin/python3".into(),
                probe: "/nonexistent/plimsoll-probe".into(),
                state_dir: "/nonexistent/state".into(),
                probe_uid: 200_009,
            },
        ))
    };
    let dir = store();
    let socket = dir.path().join("launcher.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let me = rustix::process::getuid().as_raw();
    let launcher = std::sync::Arc::new(Launcher::new(vec![process()], bounds(dir.path()), me));
    std::thread::spawn(move || launcher.serve(listener));
    let remote: Vec<AnyProvider> = Remote::all(&socket)
        .unwrap()
        .into_iter()
        .map(|r| AnyProvider::Remote(Box::new(r)))
        .collect();
    let here = [process()];
    // An image the request named (the process tier takes only the default one, unnamed).
    let image = image_from_wire(PlanImage {
        named: true,
        ..plan(dir.path()).image.unwrap()
    });
    let js = RunSpec::Snippet(Snippet {
        language: Language::Javascript,
        code: "1".into(),
    });
    let project: RunSpec = serde_json::from_value(serde_json::json!({
        "kind": "project", "files": [], "steps": [{"run": "true"}]
    }))
    .unwrap();
    for (spec, image) in [(&js, None), (&js, Some(&image)), (&project, None)] {
        let there = admissions(remote.iter().map(|p| (p, None)), spec, image);
        let local = admissions(here.iter().map(|p| (p, None)), spec, image);
        assert_eq!((there.len(), local.len()), (1, 1));
        let text = |r: &Result<(), plimsoll_sandbox::Unsupported>| {
            r.as_ref().map_err(ToString::to_string).err()
        };
        assert_eq!(
            text(&there[0].supports),
            text(&local[0].supports),
            "{spec:?}"
        );
        assert_eq!(
            text(&there[0].takes_image),
            text(&local[0].takes_image),
            "{spec:?}"
        );
        assert_eq!(there[0].memory_floor, local[0].memory_floor, "{spec:?}");
        assert!(there[0].holds.is_none() && local[0].holds.is_none());
    }
    // Evidence the launcher was given to adopt is named by its digest: whether its
    // environment holds comes back with the rest; evidence it never saw is left to ask.
    let evidence = plimsoll_wire::Evidence {
        provider: "process".into(),
        isolation: plimsoll_wire::Tier::Process,
        config: Default::default(),
        binaries: Vec::new(),
        probe: None,
        checks: Default::default(),
        environment: "host".into(),
        checked_unix_ms: 1,
    };
    plimsoll_sandbox::Provider::adopt(&remote[0], &evidence).unwrap();
    let sha = plimsoll_wire::digest::evidence_sha256(&evidence);
    let known = admissions(remote.iter().map(|p| (p, Some(sha.as_str()))), &js, None);
    assert_eq!(known[0].holds, Some(Ok(())));
    let unknown = admissions(remote.iter().map(|p| (p, Some("00"))), &js, None);
    assert_eq!(unknown[0].holds, None);
    // What each says, so the comparison above cannot pass on two empty answers.
    let js_at_process = &admissions(remote.iter().map(|p| (p, None)), &js, Some(&image))[0];
    assert!(js_at_process.memory_floor.is_some());
    assert!(
        text_of(&js_at_process.takes_image).contains("the process tier has no image"),
        "{:?}",
        js_at_process.takes_image
    );
    let project_at_process = &admissions(remote.iter().map(|p| (p, None)), &project, None)[0];
    assert!(
        text_of(&project_at_process.supports).contains("runs snippets only"),
        "{:?}",
        project_at_process.supports
    );
}

fn text_of(r: &Result<(), plimsoll_sandbox::Unsupported>) -> String {
    r.as_ref()
        .map_err(ToString::to_string)
        .err()
        .unwrap_or_default()
}
