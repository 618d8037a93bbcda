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
