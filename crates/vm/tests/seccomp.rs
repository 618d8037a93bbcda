//! Seccomp validation at the `qemu` provider, booting a real VM (TCG on hosts without usable
//! KVM): a Python probe makes raw system calls inside the guest (tests/seccomp/probe.py). The
//! guest has no OCI filter (the wall is the emulator, and QEMU itself runs under `-sandbox
//! on`): every call the container allowlist names must still reach the guest kernel, and no
//! namespace may be made and nothing mounted.
//!
//! Needs root, QEMU, the VM assets and the probe and agent binaries; without them `SKIP`,
//! which fails under `CI=true`.

use std::path::{Path, PathBuf};

use plimsoll_sandbox::reap::processes_of_uid;
use plimsoll_sandbox::{LaunchPlan, Provider as _};
use plimsoll_testing::{
    fresh_id, is_root, limits, probe_and_agent, py, skip_or_fail, workspace_root,
};
use plimsoll_vm::{AccelChoice, VmConfig, VmProvider};

#[path = "../../../tests/seccomp/common.rs"]
mod seccomp;
use seccomp::{Check, Expect};

const QEMU: &str = "/usr/bin/qemu-system-x86_64";

/// This file's uids (vm.rs uses 2,400,000 + 10 × scenario).
const UID: u32 = 2_450_000;

#[test]
fn every_allowed_call_works_and_no_namespace_or_mount_is_made() {
    let test = "every_allowed_call_works_and_no_namespace_or_mount_is_made";
    if !is_root() {
        skip_or_fail(test, "needs root (mount namespace and uid switch for QEMU)");
        return;
    }
    let assets = workspace_root().join("build/vm");
    if !Path::new(QEMU).exists() || !assets.join("recipe.sha256").exists() {
        skip_or_fail(
            test,
            "QEMU or the VM assets are missing (scripts/install-deps, scripts/build-vm-assets)",
        );
        return;
    }
    let (probe, agent) = match probe_and_agent() {
        Ok(pa) => pa,
        Err(e) => {
            skip_or_fail(test, &e);
            return;
        }
    };
    let numbers = match seccomp::numbers() {
        Ok(n) => n,
        Err(e) => {
            skip_or_fail(test, &e);
            return;
        }
    };
    let mut checks = seccomp::allowed(&numbers, &[]);
    checks.extend(seccomp::namespaces(&numbers, Expect::Fails, Expect::Fails));
    checks.push(Check {
        label: "deny mount".into(),
        nr: numbers["mount"],
        args: seccomp::ints(&[-1; 5]),
        child: false,
        expect: Expect::Fails,
    });

    let state_dir =
        PathBuf::from("/run/plimsoll-vm-test").join(format!("{test}-{}", std::process::id()));
    let mut c = VmConfig::new(
        assets,
        agent,
        probe,
        guest_init_binary(),
        state_dir.clone(),
        UID + 9,
        UID..UID + 1,
    );
    c.accelerator = AccelChoice::Tcg;
    let p = VmProvider::new(c);
    let run_id = fresh_id("t");
    let plan = LaunchPlan {
        image: None,
        run_dir: p.config().runs_root().join(&run_id),
        run_id,
        request_id: "vm-seccomp".into(),
        privileges: plimsoll_sandbox::Privileges::Unprivileged,
        spec: py(&seccomp::script(&checks)),
        limits: limits(),
        uid: UID,
        gid: UID,
        controller_uid: UID + 1,
        controller_gid: UID + 1,
        broker: None,
        tap: None,
    };
    let outcome = p.run(&plan);
    let left = processes_of_uid(UID);
    let _ = p.reap_run_dirs();
    let _ = std::fs::remove_dir_all(&state_dir);
    assert!(left.is_empty(), "processes of uid {UID} remain: {left:?}");
    assert!(!plan.run_dir.exists(), "run directory remains");
    let r = outcome
        .unwrap_or_else(|e| panic!("qemu run failed: {e}"))
        .result;
    seccomp::assert_all_held("qemu", &checks, &r);
}

/// The guest's PID 1, a binary of its own crate (plimsoll-guest-init), from this build.
fn guest_init_binary() -> PathBuf {
    plimsoll_testing::tool_binary("plimsoll-guest-init", "plimsoll-guest-init")
        .unwrap_or_else(|e| panic!("{e}"))
}
