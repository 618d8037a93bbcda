//! Seccomp validation at crun, runc and runsc, run for real: a Python probe makes raw system
//! calls inside a real container (tests/seccomp/probe.py). At crun and runc every call
//! `data/seccomp.json` allows must reach the kernel, and every call it does not allow must
//! fail with the profile's errno (docs/container-tier.md: EPERM by default, ENOSYS for
//! `clone3`; x32 entry points refused). runsc runs with its own profile
//! (`data/seccomp-runsc.json`, applied inside the sandbox with `--oci-seccomp`), which denies
//! namespace creation only: there the allowed calls must still work, and namespace creation
//! and mount must fail.

#[macro_use]
mod common;
#[path = "../../../tests/seccomp/common.rs"]
mod seccomp;

use plimsoll_oci::RuntimeKind;
use plimsoll_testing::{limits, py};
use seccomp::{Check, ENOSYS, EPERM, Expect};

use common::{kind_index, rig};

/// This file's run uids (common/mod.rs: provider.rs and trials.rs use 2,100,000 and 2,120,000).
fn uid(kind: RuntimeKind) -> u32 {
    2_140_000 + kind_index(kind)
}

/// Calls the profile does not allow (docs/container-tier.md: everything moby allows only
/// with a capability, and what the page removed), each made with every argument -1.
const NOT_ALLOWED: &[&str] = &[
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
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "sethostname",
    "setdomainname",
    "modify_ldt",
    "name_to_handle_at",
    "open_by_handle_at",
    "memfd_secret",
    "fanotify_init",
    "fanotify_mark",
    "remap_file_pages",
    "quotactl",
    "lookup_dcookie",
    "vhangup",
    "iopl",
    "ioperm",
    "syslog",
    "nfsservctl",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "epoll_ctl_old",
    "epoll_wait_old",
];

/// Calls gVisor's Sentry (runsc 20221219) answers with EPERM itself, even to a read-only
/// query with valid arguments (tests/seccomp/common.rs): not implemented there. No filter
/// is involved; pinned so that a runsc that starts serving them shows up here.
const SENTRY_EPERM: &[&str] = &[
    "adjtimex",
    "clock_adjtime",
    "ioprio_get",
    "ioprio_set",
    "sched_rr_get_interval",
    "sched_setparam",
];

fn checks(kind: RuntimeKind) -> Result<Vec<Check>, String> {
    let numbers = seccomp::numbers()?;
    let nr = |n: &str| numbers[n];
    let mut checks = seccomp::allowed(&numbers, &[]);
    if kind == RuntimeKind::Runsc {
        for c in &mut checks {
            if SENTRY_EPERM.iter().any(|n| c.label == format!("allow {n}")) {
                c.expect = Expect::Errno(EPERM);
            }
        }
    }
    let one = |label: &str, name: &str, args: &[i64], child: bool, expect: Expect| Check {
        label: label.into(),
        nr: nr(name),
        args: seccomp::ints(args),
        child,
        expect,
    };
    if kind == RuntimeKind::Runsc {
        // The kernel tier: the runsc profile denies namespaces only; mount fails in gVisor.
        checks.extend(seccomp::namespaces(&numbers, Expect::Fails, Expect::Fails));
        checks.push(one("deny mount", "mount", &[-1; 5], false, Expect::Fails));
        return Ok(checks);
    }
    checks.extend(seccomp::denied(&numbers, NOT_ALLOWED, EPERM));
    checks.extend(seccomp::namespaces(
        &numbers,
        Expect::Errno(EPERM),
        Expect::Errno(EPERM),
    ));
    checks.push(one(
        "deny clone3",
        "clone3",
        &[0, 0],
        false,
        Expect::Errno(ENOSYS),
    ));
    checks.push(one(
        "deny socket(AF_VSOCK)",
        "socket",
        &[40, 1, 0],
        false,
        Expect::Errno(EPERM),
    ));
    checks.push(one(
        "allow socket(AF_INET)",
        "socket",
        &[2, 1, 0],
        false,
        Expect::Reaches,
    ));
    checks.push(one(
        "allow socket(AF_UNIX)",
        "socket",
        &[1, 1, 0],
        false,
        Expect::Reaches,
    ));
    checks.push(one(
        "deny personality(READ_IMPLIES_EXEC)",
        "personality",
        &[0x0040_0000],
        false,
        Expect::Errno(EPERM),
    ));
    checks.push(Check {
        label: "deny x32 getpid".into(),
        nr: 0x4000_0000 | nr("getpid"),
        args: vec![],
        child: true,
        expect: Expect::Fails,
    });
    Ok(checks)
}

fn every_allowed_call_works_and_every_denied_one_fails_as_documented(
    kind: RuntimeKind,
    test: &str,
) {
    let Some(rig) = rig(kind, test) else {
        return;
    };
    let checks = match checks(kind) {
        Ok(c) => c,
        Err(e) => {
            plimsoll_testing::skip_or_fail(test, &e);
            return;
        }
    };
    let r = rig.run(py(&seccomp::script(&checks)), limits(), uid(kind));
    seccomp::assert_all_held(&format!("{kind:?}"), &checks, &r);
}

on_every_runtime!(every_allowed_call_works_and_every_denied_one_fails_as_documented);
