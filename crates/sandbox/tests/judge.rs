//! The one breach table of `plimsoll_sandbox::judge`, run with every provider's own
//! [`Expectations`] (process, crun, runc, runsc, qemu): each breach fails exactly the check
//! it names, or nothing where the provider allows it or does not judge it, and every check a
//! provider records is failed by some breach.
//!
//! The providers are dev-dependencies of this integration test only (they depend on the
//! sandbox crate; an integration test links the same library they do, so the types agree).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use plimsoll_oci::RuntimeKind;
use plimsoll_sandbox::judge::{Expectations, HostView, Namespaces, judge, mark_host_namespaces};
use plimsoll_testing::report::meeting;
use plimsoll_wire::{NamespaceSeen, ProbeReport};

const UID: u32 = 2_000_008;
const GUEST_KERNEL: &str = "6.1.0-57-cloud-amd64";

/// A provider's expectations, the breaches (by label) it allows, and the checks no breach
/// can fail for it.
struct Case {
    provider: &'static str,
    expected: Expectations,
    allows: &'static [&'static str],
    never_fails: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            provider: "process",
            expected: plimsoll_process::probe::expectations(UID, Path::new("/run/plimsoll/p")),
            // The process tier judges every set, the bounding set too (its child empties it).
            allows: &[],
            never_fails: &[],
        },
        Case {
            provider: "crun",
            expected: plimsoll_oci::probe::expectations(RuntimeKind::Crun, UID),
            allows: &["the host's kernel"],
            never_fails: &[],
        },
        Case {
            provider: "runc",
            expected: plimsoll_oci::probe::expectations(RuntimeKind::Runc, UID),
            allows: &["the host's kernel"],
            never_fails: &[],
        },
        Case {
            provider: "runsc",
            expected: plimsoll_oci::probe::expectations(RuntimeKind::Runsc, UID),
            allows: &[
                "CapAmb line absent",
                "NoNewPrivs off",
                "seccomp off",
                "a namespace unreported",
                "no memory limit",
                "no pids limit",
                "another kernel",
            ],
            never_fails: &["limits", "no_new_privs", "seccomp"],
        },
        Case {
            provider: "qemu",
            expected: plimsoll_vm::probe::expectations(GUEST_KERNEL),
            allows: &[],
            never_fails: &[],
        },
    ]
}

/// The host, as data: no I/O.
fn host() -> HostView {
    HostView {
        namespaces: ["cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts"]
            .iter()
            .map(|n| ((*n).to_owned(), format!("{n}:[4026531840]")))
            .collect(),
        kernel_release: "6.99.0-host".into(),
    }
}

type Breach = fn(&mut ProbeReport, &HostView);

/// Label, the checks that may catch it (the first one a provider records must, alone), and
/// the breach.
fn breaches() -> Vec<(&'static str, &'static [&'static str], Breach)> {
    vec![
        ("runs as root", &["uid"], |r, _| r.uid = 0),
        ("another euid", &["uid"], |r, _| r.euid += 1),
        ("another gid", &["gid", "uid"], |r, _| r.gid += 1),
        ("a supplementary group", &["gid", "uid"], |r, _| {
            r.groups.push(0)
        }),
        ("CapEff held", &["capabilities"], |r, _| {
            r.capabilities
                .insert("CapEff".into(), "00000000a80425fb".into());
        }),
        ("CapBnd held", &["capabilities"], |r, _| {
            r.capabilities
                .insert("CapBnd".into(), "000001ffffffffff".into());
        }),
        ("CapAmb line absent", &["capabilities"], |r, _| {
            r.capabilities
                .insert("CapAmb".into(), "error: not in /proc/self/status".into());
        }),
        ("CapPrm line absent", &["capabilities"], |r, _| {
            r.capabilities
                .insert("CapPrm".into(), "error: not in /proc/self/status".into());
        }),
        ("NoNewPrivs off", &["no_new_privs"], |r, _| {
            r.no_new_privs = false
        }),
        ("seccomp off", &["seccomp"], |r, _| r.seccomp_mode = 0),
        ("a namespace is the host's", &["namespaces"], |r, host| {
            r.namespaces.insert(
                "net".into(),
                NamespaceSeen {
                    id: host.namespaces["net"].clone(),
                    same_as_host: None,
                },
            );
        }),
        ("a namespace unreported", &["namespaces"], |r, _| {
            r.namespaces.remove("pid");
        }),
        ("/ read-write", &["filesystem"], |r, _| {
            r.mounts.insert("/".into(), "rw".into());
        }),
        ("an unexpected read-write mount", &["filesystem"], |r, _| {
            r.mounts.insert("/sys/fs/cgroup/memory".into(), "rw".into());
        }),
        (
            "/etc writable",
            &["filesystem", "writes_outside_work_denied"],
            |r, _| {
                r.write_attempts.insert("/etc".into(), "writable".into());
            },
        ),
        ("/tmp not writable", &["filesystem"], |r, _| {
            r.write_attempts
                .insert("/tmp".into(), "error: Read-only file system".into());
        }),
        (
            "the work dir not writable",
            &["filesystem", "work_dir_writable"],
            |r, _| {
                r.write_attempts
                    .insert(r.cwd.clone(), "error: Permission denied".into());
            },
        ),
        (
            "the working directory elsewhere",
            &["work_dir_writable", "filesystem"],
            |r, _| {
                r.write_attempts.remove(&r.cwd);
                r.cwd = "/var/tmp/elsewhere".into();
                r.write_attempts.insert(r.cwd.clone(), "writable".into());
            },
        ),
        ("/ not tried", &["writes_outside_work_denied"], |r, _| {
            r.write_attempts.remove("/");
        }),
        ("a host file readable", &["host_files"], |r, _| {
            r.read_attempts
                .insert("/run/plimsoll/canary".into(), "readable".into());
        }),
        (
            "/etc/shadow readable",
            &["shadow_unreadable", "host_files"],
            |r, _| {
                r.read_attempts
                    .insert("/etc/shadow".into(), "readable".into());
            },
        ),
        ("/etc/shadow not tried", &["shadow_unreadable"], |r, _| {
            r.read_attempts.remove("/etc/shadow");
        }),
        ("a network interface", &["network"], |r, _| {
            r.network_interfaces.push("eth0".into())
        }),
        ("an extra variable", &["environment"], |r, _| {
            r.environment.push("NODE_EXTRA_CA_CERTS".into())
        }),
        ("a socket opened", &["sockets_denied"], |r, _| {
            r.socket_attempts.insert("AF_INET".into(), "allowed".into());
        }),
        ("two socket families tried", &["sockets_denied"], |r, _| {
            r.socket_attempts.remove("AF_UNIX");
        }),
        ("no memory limit", &["limits"], |r, _| {
            for k in ["cgroup_v1.memory.limit_in_bytes", "cgroup_v2.memory.max"] {
                r.limits.insert(k.into(), "max".into());
            }
        }),
        ("no pids limit", &["limits"], |r, _| {
            for k in ["cgroup_v1.pids.max", "cgroup_v2.pids.max"] {
                r.limits.insert(k.into(), "max".into());
            }
        }),
        ("another kernel", &["kernel"], |r, _| {
            r.kernel_release = "5.10.0-other".into()
        }),
        ("the host's kernel", &["kernel"], |r, host| {
            r.kernel_release = host.kernel_release.clone()
        }),
    ]
}

fn failed(checks: &BTreeMap<String, String>) -> Vec<&str> {
    checks
        .iter()
        .filter(|(_, v)| *v != "ok")
        .map(|(k, _)| k.as_str())
        .collect()
}

#[test]
fn each_breach_fails_exactly_its_check_for_every_provider() {
    let host = host();
    for case in cases() {
        let p = case.provider;
        let good = meeting(&case.expected, &host);
        let recorded = judge(&good, &case.expected, &host);
        assert!(failed(&recorded).is_empty(), "{p}: {recorded:?}");
        let mut caught = BTreeSet::new();
        for (label, catchers, breach) in breaches() {
            let mut r = good.clone();
            breach(&mut r, &host);
            let checks = judge(&r, &case.expected, &host);
            assert_eq!(
                checks.keys().collect::<Vec<_>>(),
                recorded.keys().collect::<Vec<_>>(),
                "{p}, {label}: the same checks are recorded"
            );
            let catcher = catchers.iter().find(|c| recorded.contains_key(**c));
            match catcher {
                Some(name) if !case.allows.contains(&label) => {
                    assert_eq!(failed(&checks), [*name], "{p}, {label}: {checks:?}");
                    caught.insert(*name);
                }
                _ => assert!(failed(&checks).is_empty(), "{p}, {label}: {checks:?}"),
            }
        }
        for label in case.allows {
            assert!(
                breaches().iter().any(|(l, _, _)| l == label),
                "{p}: no breach {label}"
            );
        }
        let never: BTreeSet<&str> = recorded
            .keys()
            .map(String::as_str)
            .filter(|k| !caught.contains(k))
            .collect();
        assert_eq!(
            never,
            case.never_fails.iter().copied().collect(),
            "{p}: checks no breach failed"
        );
    }
}

/// Each provider's checks map keeps the names it had before the one table.
#[test]
fn each_provider_records_its_own_check_names() {
    let host = host();
    let names = |e: &Expectations| -> Vec<String> {
        judge(&meeting(e, &host), e, &host).into_keys().collect()
    };
    let container = [
        "capabilities",
        "environment",
        "filesystem",
        "host_files",
        "kernel",
        "limits",
        "namespaces",
        "network",
        "no_new_privs",
        "seccomp",
        "uid",
    ];
    for case in cases() {
        let want: &[&str] = match case.provider {
            "process" => &[
                "capabilities",
                "environment",
                "gid",
                "no_new_privs",
                "seccomp",
                "shadow_unreadable",
                "sockets_denied",
                "uid",
                "work_dir_writable",
                "writes_outside_work_denied",
            ],
            "qemu" => &[
                "capabilities",
                "environment",
                "filesystem",
                "host_files",
                "kernel",
                "limits",
                "network",
                "no_new_privs",
                "uid",
            ],
            _ => &container,
        };
        assert_eq!(names(&case.expected), want, "{}", case.provider);
    }
}

/// Namespaces are marked against the host's where the provider compares them, and cleared
/// where they are a guest kernel's own, whatever the report claimed.
#[test]
fn namespaces_are_marked_or_cleared_as_the_provider_expects() {
    let host = host();
    for case in cases() {
        let mut r = meeting(&case.expected, &host);
        r.namespaces.insert(
            "net".into(),
            NamespaceSeen {
                id: host.namespaces["net"].clone(),
                same_as_host: Some(false),
            },
        );
        r.namespaces.insert(
            "pid_for_children".into(),
            NamespaceSeen {
                id: "pid:[1]".into(),
                same_as_host: Some(false),
            },
        );
        mark_host_namespaces(&mut r, &case.expected, &host);
        let seen = |n: &str| r.namespaces[n].same_as_host;
        match case.expected.namespaces {
            Namespaces::GuestKernel => {
                assert!(r.namespaces.values().all(|n| n.same_as_host.is_none()));
            }
            Namespaces::Compared | Namespaces::Separate { .. } => {
                assert_eq!(seen("net"), Some(true), "{}", case.provider);
                assert_eq!(seen("pid"), Some(false), "{}", case.provider);
                assert_eq!(seen("pid_for_children"), None, "{}", case.provider);
            }
        }
    }
}

/// The judgement reads the host only through the view it is given, so the same report
/// judged against another host changes with it.
#[test]
fn the_host_view_is_what_the_report_is_compared_with() {
    let host = host();
    let e = plimsoll_oci::probe::expectations(RuntimeKind::Crun, UID);
    let r = meeting(&e, &host);
    let mut other = host.clone();
    other.kernel_release = "6.98.0-elsewhere".into();
    other
        .namespaces
        .insert("pid".into(), r.namespaces["pid"].id.clone());
    let checks = judge(&r, &e, &other);
    assert_eq!(failed(&checks), ["kernel", "namespaces"], "{checks:?}");
}
