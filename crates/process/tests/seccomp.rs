//! Seccomp validation at the process tier, run for real (as root): a Python probe makes raw
//! system calls inside a real run (tests/seccomp/probe.py). Every call the container
//! allowlist names that this tier's deny list does not must reach the kernel; every call of
//! the deny list (docs/isolation-tiers.md, "seccomp") must fail with the errno the page
//! gives: EPERM, ENOSYS for `clone3` and x32 calls.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use plimsoll_process::{ProcessConfig, ProcessProvider};
use plimsoll_sandbox::reap::processes_of_uid;
use plimsoll_sandbox::{LaunchPlan, Provider as _, ResolvedLimits};
use plimsoll_testing::{is_root, probe_binary, skip_or_fail};
use plimsoll_wire::{Language, RunSpec, Snippet};

#[path = "../../../tests/seccomp/common.rs"]
mod common;
use common::{ENOSYS, EPERM, Expect};

/// uids of this file's runs (provider.rs uses 2,310,000 and up, engine tests 2,320,000).
const UID_BASE: u32 = 2_330_000;

/// The process tier's deny list (docs/isolation-tiers.md), but sockets and namespaces, which
/// are checked with arguments of their own.
const DENIED: &[&str] = &[
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "shmget",
    "semget",
    "msgget",
    "mq_open",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
];

#[test]
fn every_allowed_call_works_and_every_denied_one_fails_as_documented() {
    let test = "every_allowed_call_works_and_every_denied_one_fails_as_documented";
    if !is_root() {
        skip_or_fail(test, "needs root to switch uids");
        return;
    }
    let numbers = match common::numbers() {
        Ok(n) => n,
        Err(e) => {
            skip_or_fail(test, &e);
            return;
        }
    };
    let mut checks = common::allowed(
        &numbers,
        &["socket", "shmget", "semget", "msgget", "mq_open"],
    );
    checks.extend(common::denied(&numbers, DENIED, EPERM));
    checks.extend(common::namespaces(
        &numbers,
        Expect::Errno(EPERM),
        Expect::Errno(EPERM),
    ));
    let nr = |n: &str| numbers[n];
    for (label, args) in [
        ("AF_INET", [2, 1, 0]),
        ("AF_INET6", [10, 1, 0]),
        ("AF_UNIX", [1, 1, 0]),
    ] {
        checks.push(common::Check {
            label: format!("deny socket({label})"),
            nr: nr("socket"),
            args: common::ints(&args),
            child: false,
            expect: Expect::Errno(EPERM),
        });
    }
    checks.push(common::Check {
        label: "allow socketpair(AF_UNIX)".into(),
        nr: nr("socketpair"),
        args: common::ints(&[1, 1, 0, -1]),
        child: false,
        expect: Expect::Reaches,
    });
    checks.push(common::Check {
        label: "deny clone3".into(),
        nr: nr("clone3"),
        args: common::ints(&[0, 0]),
        child: false,
        expect: Expect::Errno(ENOSYS),
    });
    checks.push(common::Check {
        label: "deny x32 getpid".into(),
        nr: 0x4000_0000 | nr("getpid"),
        args: vec![],
        child: false,
        expect: Expect::Errno(ENOSYS),
    });

    let tmp = tempfile::Builder::new()
        .prefix("plimsoll-seccomp-test-")
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
        probe_uid: UID_BASE + 9,
    });
    let run_id = format!("seccomp-{}", std::process::id());
    let plan = LaunchPlan {
        image: None,
        run_dir: state.join("runs").join(&run_id),
        run_id,
        request_id: "seccomp".into(),
        privileges: plimsoll_sandbox::Privileges::Unprivileged,
        spec: RunSpec::Snippet(Snippet {
            language: Language::Python,
            code: common::script(&checks),
        }),
        limits: ResolvedLimits {
            timeout: Duration::from_secs(30),
            memory_bytes: 1 << 30,
            output_bytes: 1 << 20,
            pids: 64,
            disk_bytes: 64 << 20,
            artifact_bytes: 1 << 20,
        },
        uid: UID_BASE,
        gid: UID_BASE,
        controller_uid: UID_BASE + 1,
        controller_gid: UID_BASE + 1,
        broker: None,
        tap: None,
    };
    let r = provider
        .run(&plan)
        .unwrap_or_else(|e| panic!("run failed: {e}"))
        .result;
    assert!(!plan.run_dir.exists(), "run dir left behind");
    assert_eq!(
        processes_of_uid(UID_BASE),
        Vec::<i32>::new(),
        "processes left"
    );
    common::assert_all_held("the process tier", &checks, &r);
}
