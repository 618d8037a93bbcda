//! A run's wall, read just before its code is handed over: what the kernel shows, in this
//! host's /proc, for the process that will run the code (its identity, capability sets,
//! no_new_privs, seccomp mode, namespaces, root mount, network interfaces and cgroup
//! limits), and the check that it matches what the provider's probe was judged on.
//!
//! [`read`] does the I/O; [`judge`] is pure and goes through the probe's own judging table
//! ([`crate::judge::judge`]) with the same [`Expectations`], so a run's wall is held to
//! exactly the checks its provider's evidence passed, and no second copy of them exists.

use std::collections::BTreeMap;
use std::fs;
use std::io;

use plimsoll_wire::{NamespaceSeen, ProbeReport, Wall, WallNamespace};

use crate::cgroup::CgroupLayout;
use crate::judge::{Expectations, HostView, Limits, Namespaces};

/// The checks of the probe's table a wall is judged on: what a wall shows. (The rest, writes,
/// reads, sockets, environment, kernel, are tried by the probe alone.)
pub const WALL_CHECKS: [&str; 8] = [
    "uid",
    "gid",
    "capabilities",
    "no_new_privs",
    "seccomp",
    "namespaces",
    "network",
    "limits",
];

/// Reads process `pid`'s wall from /proc (this mount namespace's), its namespaces compared
/// with `host`'s as `expected` says (not at all for a guest kernel's).
pub fn read(
    pid: u32,
    expected: &Expectations,
    host: &HostView,
    layout: &CgroupLayout,
) -> io::Result<Wall> {
    let mut wall = read_unmarked(pid, layout)?;
    mark(&mut wall, expected, host);
    Ok(wall)
}

/// Fills each namespace's `same_as_host` as `expected` says: compared with `host`'s (`None`
/// where the host has no such namespace), or cleared for a guest kernel's. A wall read from
/// inside (where the host's namespaces cannot be seen) is marked so on the host.
pub fn mark(wall: &mut Wall, expected: &Expectations, host: &HostView) {
    for n in &mut wall.namespaces {
        n.same_as_host = match expected.namespaces {
            Namespaces::GuestKernel => None,
            Namespaces::Compared | Namespaces::Separate { .. } => {
                host.namespaces.get(&n.name).map(|h| *h == n.id)
            }
        };
    }
}

/// Reads process `pid`'s wall from /proc as this process sees it, its namespaces unmarked:
/// Every entry Linux has in /proc/<pid>/ns.
const NAMESPACE_NAMES: &[&str] = &[
    "cgroup",
    "ipc",
    "mnt",
    "net",
    "pid",
    "pid_for_children",
    "time",
    "time_for_children",
    "user",
    "uts",
];

/// [`read`] without the comparison, for a program inside a sandbox reporting its own
/// (`plimsoll-agent --wall-first`). `layout` is this mount namespace's cgroup layout, read
/// once by the caller (`CgroupLayout::detect`), not per run.
pub fn read_unmarked(pid: u32, layout: &CgroupLayout) -> io::Result<Wall> {
    let proc = format!("/proc/{pid}");
    let identity = from_status(&fs::read_to_string(format!("{proc}/status"))?)?;
    let mut wall = identity.clone();
    let mut namespaces = Vec::new();
    let names: Vec<String> = match fs::read_dir(format!("{proc}/ns")) {
        Ok(dir) => dir
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<io::Result<_>>()?,
        // gVisor's /proc lets a process that is not dumpable (a session's agent) read its
        // own namespace links but not list them: every name Linux has, those there.
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            NAMESPACE_NAMES.iter().map(|n| (*n).to_owned()).collect()
        }
        Err(e) => return Err(e),
    };
    for name in names {
        let id = match fs::read_link(format!("{proc}/ns/{name}")) {
            Ok(link) => link.display().to_string(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        namespaces.push(WallNamespace {
            name,
            id,
            same_as_host: None,
        });
    }
    namespaces.sort_by(|a, b| a.name.cmp(&b.name));
    wall.namespaces = namespaces;
    wall.root_read_only = root_read_only(&fs::read_to_string(format!("{proc}/mountinfo"))?);
    wall.network_interfaces = interfaces(&fs::read_to_string(format!("{proc}/net/dev"))?);
    // Where no cgroup is visible (gVisor's /proc), the limits are absent.
    if let Ok(cgroups) = fs::read_to_string(format!("{proc}/cgroup")) {
        (wall.memory_limit_bytes, wall.pids_limit) = layout.limits_of(&cgroups);
    }
    // Read last, so a process that ended (or whose pid was reused) while being read is caught:
    // its status would no longer say the same.
    if from_status(&fs::read_to_string(format!("{proc}/status"))?)? != identity {
        return Err(io::Error::other(
            "the process changed while its wall was read",
        ));
    }
    Ok(wall)
}

/// The identity, capability, no_new_privs and seccomp lines of a /proc/PID/status text.
pub fn from_status(status: &str) -> io::Result<Wall> {
    let line = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .map(str::trim)
    };
    let ids = |key: &str| -> io::Result<Vec<u32>> {
        line(key)
            .unwrap_or("")
            .split_whitespace()
            .map(|v| {
                v.parse()
                    .map_err(|_| io::Error::other(format!("{key}: {v:?} is not an id")))
            })
            .collect()
    };
    let uids = ids("Uid")?;
    let gids = ids("Gid")?;
    let (Some(&uid), Some(&euid), Some(&gid)) = (uids.first(), uids.get(1), gids.first()) else {
        return Err(io::Error::other("the status has no Uid or Gid line"));
    };
    let cap = |key: &str| line(key).map(str::to_owned);
    Ok(Wall {
        uid,
        euid,
        gid,
        groups: ids("Groups")?,
        cap_inh: cap("CapInh"),
        cap_prm: cap("CapPrm"),
        cap_eff: cap("CapEff"),
        cap_bnd: cap("CapBnd"),
        cap_amb: cap("CapAmb"),
        no_new_privs: line("NoNewPrivs").map(|v| v == "1"),
        seccomp: line("Seccomp").and_then(|v| v.parse().ok()),
        ..Wall::default()
    })
}

/// Whether the mount at `/` (the last one mounted there: the one on top) is read-only, from a
/// /proc/PID/mountinfo text.
pub fn root_read_only(mountinfo: &str) -> bool {
    path_read_only(mountinfo, "/")
}

/// Whether the mount that holds the absolute, symlink-free `path` is read-only, from a
/// /proc/PID/mountinfo text: the mount whose mount point is the longest prefix of `path`
/// (the last one mounted there, on top, when several are). False when none is found.
pub fn path_read_only(mountinfo: &str, path: &str) -> bool {
    let mut best: Option<(usize, bool)> = None;
    for l in mountinfo.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        let (Some(point), Some(options)) = (f.get(4), f.get(5)) else {
            continue;
        };
        let holds = *point == "/"
            || path == *point
            || path
                .strip_prefix(point)
                .is_some_and(|rest| rest.starts_with('/'));
        // A later line with the same point was mounted on top of the earlier one.
        if holds && best.is_none_or(|(len, _)| point.len() >= len) {
            best = Some((point.len(), options.split(',').any(|o| o == "ro")));
        }
    }
    best.is_some_and(|(_, ro)| ro)
}

/// What the wall of a run with a trial step must show, from what a run's must show
/// (`run`): its agent starts as uid 0 (and gid 0) holding exactly CAP_SETUID and CAP_SETGID
/// ([`crate::caps::TRIAL_CAPS`]) in its permitted, effective and bounding sets, and none
/// inheritable or ambient; everything else (no_new_privs, seccomp, namespaces, root,
/// network, limits) as for any run.
pub fn for_trial(run: &Expectations) -> Expectations {
    const HELD: [&str; 3] = ["CapPrm", "CapEff", "CapBnd"];
    let mut e = run.clone();
    e.identity = crate::judge::Identity::Uid(0);
    e.capabilities
        .empty
        .retain(|set| !HELD.contains(&set.as_str()));
    e.capabilities.held = HELD
        .iter()
        .map(|set| ((*set).to_owned(), crate::caps::TRIAL_CAPS))
        .collect();
    e
}

/// What a session's agent that dropped to the run's uid must show instead of `run`'s
/// expectations ([`crate::Privileges::DropsToRunUid`]): the run's uid and every capability
/// set empty but the bounding set, which keeps exactly CAP_SETUID and CAP_SETGID.
pub fn for_dropped(run: &Expectations) -> Expectations {
    let mut e = run.clone();
    e.capabilities.empty.retain(|set| set != "CapBnd");
    e.capabilities
        .held
        .push(("CapBnd".to_owned(), crate::caps::TRIAL_CAPS));
    e
}

/// The interface names of a /proc/PID/net/dev text, sorted.
pub fn interfaces(net_dev: &str) -> Vec<String> {
    let mut names: Vec<String> = net_dev
        .lines()
        .skip(2)
        .filter_map(|l| Some(l.split_once(':')?.0.trim().to_owned()))
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    names
}

/// The wall as a probe report holding only what a wall shows, for the probe's table.
fn as_report(w: &Wall, expected: &Expectations) -> ProbeReport {
    let mut capabilities = BTreeMap::new();
    for (name, set) in [
        ("CapInh", &w.cap_inh),
        ("CapPrm", &w.cap_prm),
        ("CapEff", &w.cap_eff),
        ("CapBnd", &w.cap_bnd),
        ("CapAmb", &w.cap_amb),
    ] {
        capabilities.insert(
            name.to_owned(),
            set.clone()
                .unwrap_or_else(|| "error: not in the process's status".into()),
        );
    }
    let mut limits = BTreeMap::new();
    if let Some(Limits::Cgroup {
        memory_keys,
        pids_keys,
        ..
    }) = &expected.limits
    {
        if let (Some(k), Some(v)) = (memory_keys.first(), w.memory_limit_bytes) {
            limits.insert(k.clone(), v.to_string());
        }
        if let (Some(k), Some(v)) = (pids_keys.first(), w.pids_limit) {
            limits.insert(k.clone(), v.to_string());
        }
    }
    ProbeReport {
        uid: w.uid,
        euid: w.euid,
        gid: w.gid,
        groups: w.groups.clone(),
        capabilities,
        no_new_privs: w.no_new_privs == Some(true),
        seccomp_mode: w.seccomp.unwrap_or(0),
        namespaces: w
            .namespaces
            .iter()
            .map(|n| {
                (
                    n.name.clone(),
                    NamespaceSeen {
                        id: n.id.clone(),
                        same_as_host: n.same_as_host,
                    },
                )
            })
            .collect(),
        network_interfaces: w.network_interfaces.clone(),
        limits,
        ..ProbeReport::default()
    }
}

/// Every wall check `expected` names, judged on `w` by the probe's own table: `ok`, or what
/// was wrong. Adds `root_read_only` where the provider's filesystem check wants `/` read-only.
pub fn judge(w: &Wall, expected: &Expectations, host: &HostView) -> BTreeMap<String, String> {
    let mut checks = crate::judge::judge(&as_report(w, expected), expected, host);
    checks.retain(|name, _| WALL_CHECKS.contains(&name.as_str()));
    if let Some(fs) = &expected.filesystem
        && !fs.rw_mounts.iter().any(|m| m == "/")
    {
        checks.insert(
            "root_read_only".into(),
            if w.root_read_only {
                "ok".into()
            } else {
                "/ is mounted read-write".into()
            },
        );
    }
    checks
}

/// A wall that does not match: each failed check, `name: why`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the sandbox's wall does not match its provider's evidence, so its code was not handed over: {}",
    .failed.join("; ")
)]
pub struct WallMismatch {
    /// The failed checks, `name: why` each.
    pub failed: Vec<String>,
}

/// `Ok` when every check of [`judge`] holds; otherwise what failed.
pub fn check(w: &Wall, expected: &Expectations, host: &HostView) -> Result<(), WallMismatch> {
    let failed: Vec<String> = judge(w, expected, host)
        .into_iter()
        .filter(|(_, v)| v != "ok")
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(WallMismatch { failed })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_holding_a_path_says_whether_it_is_read_only() {
        let mi = "1 0 8:1 / / ro,relatime - ext4 /dev/sda1 ro\n\
                  2 1 0:5 / /work rw,nosuid - tmpfs tmpfs rw\n\
                  3 1 0:6 / /opt/plimsoll/bin ro - tmpfs tmpfs rw\n\
                  4 1 0:7 / /opt rw - tmpfs tmpfs rw\n\
                  5 4 0:8 / /opt/plimsoll/simulators ro - ext4 /dev/sdb ro\n";
        assert!(root_read_only(mi));
        assert!(path_read_only(mi, "/opt/plimsoll/simulators/index.json"));
        assert!(!path_read_only(mi, "/opt/plimsoll/simulatorsX/index.json"));
        assert!(!path_read_only(mi, "/opt/other"));
        assert!(!path_read_only(mi, "/work/x.wasm"));
        assert!(path_read_only(mi, "/usr/lib/x"));
        // Mounted on top of a read-only one.
        let over = format!("{mi}6 1 0:9 / /work ro - tmpfs tmpfs rw\n");
        assert!(path_read_only(&over, "/work/x"));
        assert!(!path_read_only("", "/x"));
    }
    use crate::judge::{Capabilities, Filesystem, Identity, NoNewPrivs, Seccomp};

    const STATUS: &str = "Name:\tpython3\nUid:\t2000\t2000\t2000\t2000\nGid:\t2000\t2000\t2000\t2000\n\
Groups:\t\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n\
CapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n";

    fn container() -> Expectations {
        Expectations {
            identity: Identity::Uid(2000),
            capabilities: Capabilities {
                empty: ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]
                    .map(String::from)
                    .to_vec(),
                may_be_absent: vec![],
                held: Vec::new(),
            },
            no_new_privs: NoNewPrivs::Set,
            seccomp: Some(Seccomp::Filter),
            namespaces: Namespaces::Separate {
                names: vec!["net".into(), "pid".into()],
                unreported_ok: false,
            },
            filesystem: Some(Filesystem {
                rw_mounts: vec!["/work".into()],
                writable: vec![],
                must_be_writable: vec![],
            }),
            work_dir: None,
            host_files: true,
            shadow_unreadable: false,
            loopback_only: true,
            environment: vec![],
            sockets_denied: false,
            limits: Some(Limits::Cgroup {
                memory_keys: vec!["cgroup_v1.memory.limit_in_bytes".into()],
                memory: 256 << 20,
                pids_keys: vec!["cgroup_v1.pids.max".into()],
                pids: 64,
            }),
            kernel: None,
        }
    }

    fn host() -> HostView {
        HostView {
            namespaces: [("net", "net:[1]"), ("pid", "pid:[2]")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into(),
            kernel_release: "6.1.0".into(),
        }
    }

    fn good() -> Wall {
        let mut w = from_status(STATUS).unwrap();
        w.namespaces = vec![
            WallNamespace {
                name: "net".into(),
                id: "net:[9]".into(),
                same_as_host: Some(false),
            },
            WallNamespace {
                name: "pid".into(),
                id: "pid:[8]".into(),
                same_as_host: Some(false),
            },
        ];
        w.root_read_only = true;
        w.network_interfaces = vec!["lo".into()];
        w.memory_limit_bytes = Some(256 << 20);
        w.pids_limit = Some(64);
        w
    }

    #[test]
    fn the_status_lines_are_read() {
        let w = from_status(STATUS).unwrap();
        assert_eq!((w.uid, w.euid, w.gid), (2000, 2000, 2000));
        assert!(w.groups.is_empty());
        assert_eq!(w.cap_bnd.as_deref(), Some("0000000000000000"));
        assert_eq!((w.no_new_privs, w.seccomp), (Some(true), Some(2)));
        // gVisor's status has no CapAmb, NoNewPrivs or Seccomp line: absent, not zero.
        let gvisor: String = STATUS
            .lines()
            .filter(|l| {
                !l.starts_with("CapAmb") && !l.starts_with("NoNew") && !l.starts_with("Secc")
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let w = from_status(&gvisor).unwrap();
        assert_eq!((w.cap_amb, w.no_new_privs, w.seccomp), (None, None, None));
        assert!(from_status("Name:\tx\n").is_err());
    }

    #[test]
    fn the_root_mount_on_top_and_the_interfaces_are_read() {
        let mi = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                  40 22 0:5 / /proc rw - proc proc rw\n\
                  41 22 8:1 /img / ro,nosuid - ext4 /dev/sda1 rw\n";
        assert!(root_read_only(mi));
        assert!(!root_read_only(
            &mi.lines().take(2).collect::<Vec<_>>().join("\n")
        ));
        let dev = "Inter-|   Receive\n face |bytes\n  eth0: 1 2\n    lo: 0 0\n";
        assert_eq!(interfaces(dev), ["eth0", "lo"]);
    }

    #[test]
    fn a_matching_wall_passes_every_check() {
        let checks = judge(&good(), &container(), &host());
        // Every wall check the container expectations name (a process tier's `gid` is not).
        for name in WALL_CHECKS
            .iter()
            .filter(|c| **c != "gid")
            .chain(&["root_read_only"])
        {
            assert_eq!(
                checks.get(*name).map(String::as_str),
                Some("ok"),
                "{name}: {checks:?}"
            );
        }
        assert!(
            checks
                .keys()
                .all(|k| WALL_CHECKS.contains(&k.as_str()) || k == "root_read_only")
        );
        assert_eq!(check(&good(), &container(), &host()), Ok(()));
    }

    /// Each breach a wall can show fails the check that names it.
    #[test]
    fn every_breach_fails_its_check() {
        type Breach = (&'static str, fn(&mut Wall));
        let breaches: [Breach; 11] = [
            ("uid", |w| w.uid = 0),
            ("uid", |w| w.groups = vec![0]),
            ("capabilities", |w| {
                w.cap_eff = Some("0000000000000400".into())
            }),
            ("capabilities", |w| {
                w.cap_bnd = Some("000001ffffffffff".into())
            }),
            ("capabilities", |w| w.cap_amb = None),
            ("no_new_privs", |w| w.no_new_privs = Some(false)),
            ("seccomp", |w| w.seccomp = Some(0)),
            ("namespaces", |w| w.namespaces[0].id = "net:[1]".into()),
            ("network", |w| w.network_interfaces.push("eth0".into())),
            ("limits", |w| w.memory_limit_bytes = Some(512 << 20)),
            ("root_read_only", |w| w.root_read_only = false),
        ];
        for (name, breach) in breaches {
            let mut w = good();
            breach(&mut w);
            let checks = judge(&w, &container(), &host());
            assert_ne!(
                checks.get(name).map(String::as_str),
                Some("ok"),
                "{name}: {w:?}"
            );
            let refused = check(&w, &container(), &host()).unwrap_err().to_string();
            assert!(refused.contains(&format!("{name}: ")), "{refused}");
        }
        let mut w = good();
        w.pids_limit = None;
        assert!(
            check(&w, &container(), &host())
                .unwrap_err()
                .failed
                .iter()
                .any(|f| f.starts_with("limits: "))
        );
    }

    /// A trial's wall: root holding exactly the two capabilities passes; a run's wall (no
    /// capability, its own uid), a third capability, an inheritable or ambient one, or a
    /// bounding set with more fails.
    #[test]
    fn a_trial_wall_holds_exactly_setuid_and_setgid_as_root() {
        let trial = for_trial(&container());
        let two = Some("00000000000000c0".to_owned());
        let mut w = good();
        (w.uid, w.euid, w.gid) = (0, 0, 0);
        (w.cap_prm, w.cap_eff, w.cap_bnd) = (two.clone(), two.clone(), two);
        assert_eq!(check(&w, &trial, &host()), Ok(()));
        assert!(check(&good(), &trial, &host()).is_err(), "a run's wall");
        assert!(
            check(&w, &container(), &host()).is_err(),
            "a trial's wall for a run"
        );
        type Breach = (&'static str, fn(&mut Wall));
        let breaches: [Breach; 6] = [
            ("uid", |w| w.euid = 2000),
            ("capabilities", |w| {
                w.cap_eff = Some("00000000000000c1".into())
            }),
            ("capabilities", |w| {
                w.cap_prm = Some("0000000000000040".into())
            }),
            ("capabilities", |w| {
                w.cap_bnd = Some("000001ffffffffff".into())
            }),
            ("capabilities", |w| {
                w.cap_inh = Some("00000000000000c0".into())
            }),
            ("capabilities", |w| {
                w.cap_amb = Some("0000000000000080".into())
            }),
        ];
        for (name, breach) in breaches {
            let mut b = w.clone();
            breach(&mut b);
            let refused = check(&b, &trial, &host()).unwrap_err().to_string();
            assert!(refused.contains(&format!("{name}: ")), "{refused}");
        }
    }
}
