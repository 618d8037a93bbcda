//! The one judging table for a [`ProbeReport`]: what a provider expects of its wall
//! ([`Expectations`], plain data each provider builds), what was read from the host
//! ([`HostView`]), and [`judge`], a pure function giving each check's verdict by name.
//!
//! No I/O happens here (only [`HostView::read`] reads the host), so every check is tested
//! from data, and the same function can judge any report of a wall: the startup probe's
//! today, a run's own report of its sandbox later. A provider adds only what no other has
//! (the VM's snippet steps, cleanup, its accelerator).

use std::collections::BTreeMap;

use plimsoll_wire::ProbeReport;

use crate::evidence::{self, record};

/// Who the code runs as, and which checks say so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// One check, `uid`: uid, euid and gid are `id`, and no supplementary group is another
    /// (containers, VMs).
    Uid(u32),
    /// Two checks: `uid` (uid and euid are `uid`, which is not root) and `gid` (gid is
    /// `gid`, no supplementary group at all): the process tier.
    UidAndGid {
        /// The expected uid and euid.
        uid: u32,
        /// The expected gid.
        gid: u32,
    },
}

/// The `capabilities` check: every named set is present and empty, and every held set is
/// present and holds exactly its mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// The sets (`CapEff` …, as /proc/self/status names them) that must be 0.
    pub empty: Vec<String>,
    /// Sets whose line may be missing from /proc/self/status (the probe then reports
    /// `error: not in …`): gVisor has no `CapAmb` line.
    pub may_be_absent: Vec<String>,
    /// Sets that must hold exactly this mask (a trial runner's agent: CAP_SETUID and
    /// CAP_SETGID in its permitted, effective and bounding sets), by name.
    pub held: Vec<(String, u64)>,
}

/// The `no_new_privs` check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoNewPrivs {
    /// `NoNewPrivs: 1` in /proc/self/status.
    Set,
    /// The `NoNewPrivs` line may be absent, so the report cannot say (gVisor's
    /// /proc/self/status has none; the attack tests ask prctl instead): recorded `ok`.
    LineMayBeAbsent,
}

/// The `seccomp` check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seccomp {
    /// Mode 2 (filter).
    Filter,
    /// Not required: gVisor's Sentry is the syscall boundary. Recorded `ok`.
    NotRequired,
}

/// How the report's namespaces are compared with the host's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespaces {
    /// Compared (and marked in the report), with no check: the process tier creates none.
    Compared,
    /// Compared, and the `namespaces` check: each of `names` is reported and differs from
    /// the host's.
    Separate {
        /// The namespaces that must not be the host's.
        names: Vec<String>,
        /// A name may be missing from the report (gVisor's /proc may not list every one;
        /// the Sentry is the boundary there).
        unreported_ok: bool,
    },
    /// Neither compared nor judged: a guest kernel's own (a VM's initial namespaces carry
    /// the same fixed numbers as the host's, so comparing says nothing). Any mark the
    /// report carries is cleared.
    GuestKernel,
}

/// The `filesystem` check: `/` read-only, no unexpected read-write mount, writes only where
/// allowed and there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filesystem {
    /// Mount points that may be read-write (what the sandbox uid can write is checked by
    /// trying).
    pub rw_mounts: Vec<String>,
    /// The only paths a write may succeed in.
    pub writable: Vec<String>,
    /// Paths a write must succeed in.
    pub must_be_writable: Vec<String>,
}

/// The `work_dir_writable` and `writes_outside_work_denied` checks (the process tier, whose
/// work dir is a per-run path): the working directory ends in `suffix` and is writable;
/// nothing else tried is, and every path in `must_try` was tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkDir {
    /// How the working directory's path ends.
    pub suffix: String,
    /// Paths the probe must have tried to write in.
    pub must_try: Vec<String>,
    /// Said after a write outside the work dir: what may be missing.
    pub hint: String,
}

/// The `limits` check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limits {
    /// One of `memory_keys` in the report's limits is `memory`, and one of `pids_keys` is
    /// `pids`.
    Cgroup {
        /// Where the memory limit may be read (`cgroup_v2.memory.max` …).
        memory_keys: Vec<String>,
        /// The memory limit, in bytes.
        memory: u64,
        /// Where the pids limit may be read.
        pids_keys: Vec<String>,
        /// The pids limit.
        pids: u64,
    },
    /// The cgroup limits are not visible from inside (gVisor): recorded `ok`.
    NotVisible,
}

/// The `kernel` check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kernel {
    /// The host's release: a container runs on the host kernel.
    TheHosts,
    /// Not the host's release: a kernel in user space (gVisor's Sentry) is in the way.
    NotTheHosts,
    /// Exactly `release`, and not the host's: a guest kernel.
    Guest {
        /// The release the guest must run.
        release: String,
    },
}

/// What a provider expects its wall to show. Plain data: a provider builds one, and can
/// hand it out to judge any later report of the same wall. `None` means the check is not
/// in the provider's checks map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectations {
    /// `uid` (and for the process tier `gid`).
    pub identity: Identity,
    /// `capabilities`.
    pub capabilities: Capabilities,
    /// `no_new_privs`.
    pub no_new_privs: NoNewPrivs,
    /// `seccomp`.
    pub seccomp: Option<Seccomp>,
    /// How namespaces are compared; `Separate` is the `namespaces` check.
    pub namespaces: Namespaces,
    /// `filesystem`.
    pub filesystem: Option<Filesystem>,
    /// `work_dir_writable` and `writes_outside_work_denied`.
    pub work_dir: Option<WorkDir>,
    /// `host_files`: nothing the probe tried to read was readable.
    pub host_files: bool,
    /// `shadow_unreadable`: /etc/shadow was tried and was not readable.
    pub shadow_unreadable: bool,
    /// `network`: the only interface is `lo`.
    pub loopback_only: bool,
    /// `environment`: the only variable names allowed (none: an empty environment).
    pub environment: Vec<String>,
    /// `sockets_denied`: every socket the probe tried (at least three families) was refused.
    pub sockets_denied: bool,
    /// `limits`.
    pub limits: Option<Limits>,
    /// `kernel`.
    pub kernel: Option<Kernel>,
}

/// What was read from the host, for the checks that compare with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostView {
    /// The host's namespace identities (`/proc/self/ns/<name>` link targets), by name.
    pub namespaces: BTreeMap<String, String>,
    /// The host's kernel release (`uname -r`).
    pub kernel_release: String,
}

impl HostView {
    /// Reads this process's namespaces (every entry of /proc/self/ns) and kernel release.
    pub fn read() -> HostView {
        let mut namespaces = BTreeMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc/self/ns") {
            for entry in dir.flatten() {
                if let Ok(t) = std::fs::read_link(entry.path()) {
                    namespaces.insert(
                        entry.file_name().to_string_lossy().into_owned(),
                        t.display().to_string(),
                    );
                }
            }
        }
        HostView {
            namespaces,
            kernel_release: evidence::host_kernel_release(),
        }
    }
}

/// Fills each namespace's `same_as_host` as `expected` says: compared with `host`'s (`None`
/// where the host has no such namespace), or cleared for a guest kernel.
pub fn mark_host_namespaces(r: &mut ProbeReport, expected: &Expectations, host: &HostView) {
    for (name, seen) in r.namespaces.iter_mut() {
        seen.same_as_host = match expected.namespaces {
            Namespaces::GuestKernel => None,
            Namespaces::Compared | Namespaces::Separate { .. } => {
                host.namespaces.get(name).map(|h| *h == seen.id)
            }
        };
    }
}

/// A probe's report as a provider publishes it: namespaces marked
/// ([`mark_host_namespaces`]), then judged ([`judge`]).
pub fn mark_and_judge(
    r: &mut ProbeReport,
    expected: &Expectations,
    host: &HostView,
) -> BTreeMap<String, String> {
    mark_host_namespaces(r, expected, host);
    judge(r, expected, host)
}

/// Every check `expected` names, judged on `r`: `ok`, or what was wrong (names the checks
/// map of the provider's evidence).
pub fn judge(
    r: &ProbeReport,
    expected: &Expectations,
    host: &HostView,
) -> BTreeMap<String, String> {
    let mut checks = BTreeMap::new();
    let mut check = |name: &str, problems: Vec<String>| record(&mut checks, name, problems);

    match expected.identity {
        Identity::Uid(id) => check("uid", evidence::uid_problems(r, id)),
        Identity::UidAndGid { uid, gid } => {
            check(
                "uid",
                problem_unless(r.uid == uid && r.euid == uid && uid != 0, || {
                    format!("runs as uid {} euid {}, expected {uid}", r.uid, r.euid)
                }),
            );
            check(
                "gid",
                problem_unless(r.gid == gid && r.groups.is_empty(), || {
                    format!(
                        "runs as gid {} with groups {:?}, expected {gid} and none",
                        r.gid, r.groups
                    )
                }),
            );
        }
    }

    check(
        "capabilities",
        capability_problems(r, &expected.capabilities),
    );
    check(
        "no_new_privs",
        problem_unless(
            r.no_new_privs || expected.no_new_privs == NoNewPrivs::LineMayBeAbsent,
            || "NoNewPrivs is off".into(),
        ),
    );
    if let Some(rule) = expected.seccomp {
        check(
            "seccomp",
            problem_unless(r.seccomp_mode == 2 || rule == Seccomp::NotRequired, || {
                format!("seccomp mode {}, expected 2 (filter)", r.seccomp_mode)
            }),
        );
    }
    if let Namespaces::Separate {
        names,
        unreported_ok,
    } = &expected.namespaces
    {
        check(
            "namespaces",
            namespace_problems(r, names, *unreported_ok, host),
        );
    }
    if let Some(fs) = &expected.filesystem {
        check("filesystem", filesystem_problems(r, fs));
    }
    if let Some(w) = &expected.work_dir {
        check(
            "work_dir_writable",
            problem_unless(
                r.write_attempts.get(&r.cwd).map(String::as_str) == Some("writable")
                    && r.cwd.ends_with(&w.suffix),
                || {
                    format!(
                        "the working directory {} is not its writable work dir",
                        r.cwd
                    )
                },
            ),
        );
        check("writes_outside_work_denied", writes_outside_work(r, w));
    }
    if expected.host_files {
        check("host_files", evidence::readable_host_files(r));
    }
    if expected.shadow_unreadable {
        let shadow = r.read_attempts.get("/etc/shadow").map(String::as_str);
        check(
            "shadow_unreadable",
            problem_unless(shadow.is_some_and(|s| s != "readable"), || {
                format!("/etc/shadow: {shadow:?}")
            }),
        );
    }
    if expected.loopback_only {
        check(
            "network",
            problem_unless(r.network_interfaces == ["lo"], || {
                format!("interfaces {:?}, expected only lo", r.network_interfaces)
            }),
        );
    }
    let allowed: Vec<&str> = expected.environment.iter().map(String::as_str).collect();
    check("environment", evidence::environment_problems(r, &allowed));
    if expected.sockets_denied {
        let open: Vec<&str> = r
            .socket_attempts
            .iter()
            .filter(|(_, v)| v.as_str() == "allowed")
            .map(|(k, _)| k.as_str())
            .collect();
        check(
            "sockets_denied",
            if !open.is_empty() {
                vec![format!("sockets could be opened: {open:?}")]
            } else if r.socket_attempts.len() < 3 {
                vec![format!(
                    "only {} socket families were tried: {:?}",
                    r.socket_attempts.len(),
                    r.socket_attempts
                )]
            } else {
                vec![]
            },
        );
    }
    if let Some(l) = &expected.limits {
        check("limits", limit_problems(r, l));
    }
    if let Some(k) = &expected.kernel {
        check("kernel", kernel_problems(r, k, &host.kernel_release));
    }
    checks
}

fn problem_unless(ok: bool, why: impl FnOnce() -> String) -> Vec<String> {
    if ok { vec![] } else { vec![why()] }
}

fn capability_problems(r: &ProbeReport, rule: &Capabilities) -> Vec<String> {
    let mut p = Vec::new();
    for set in &rule.empty {
        match r.capabilities.get(set) {
            Some(v) if v.trim_start_matches('0').is_empty() => {}
            Some(v) if rule.may_be_absent.contains(set) && v.starts_with("error: not in") => {}
            other => p.push(format!(
                "{set} = {}",
                other.map_or("missing", String::as_str)
            )),
        }
    }
    for (set, mask) in &rule.held {
        match r.capabilities.get(set) {
            Some(v) if u64::from_str_radix(v, 16) == Ok(*mask) => {}
            other => p.push(format!(
                "{set} = {}, expected {mask:016x}",
                other.map_or("missing", String::as_str)
            )),
        }
    }
    p
}

fn namespace_problems(
    r: &ProbeReport,
    names: &[String],
    unreported_ok: bool,
    host: &HostView,
) -> Vec<String> {
    let mut p = Vec::new();
    for name in names {
        match (r.namespaces.get(name), host.namespaces.get(name)) {
            (Some(seen), Some(h)) if *h != seen.id => {}
            (Some(seen), Some(_)) => {
                p.push(format!("{name} namespace is the host's ({})", seen.id))
            }
            (None, _) if unreported_ok => {}
            _ => p.push(format!("{name} namespace not reported")),
        }
    }
    p
}

fn filesystem_problems(r: &ProbeReport, rule: &Filesystem) -> Vec<String> {
    let mut p: Vec<String> = evidence::root_read_only_problem(r).into_iter().collect();
    for (point, mode) in &r.mounts {
        if mode == "rw" && !rule.rw_mounts.contains(point) {
            p.push(format!("{point} is mounted read-write"));
        }
    }
    for (path, outcome) in &r.write_attempts {
        if outcome == "writable" && !rule.writable.contains(path) {
            p.push(format!("{path} is writable"));
        }
    }
    for need in &rule.must_be_writable {
        if r.write_attempts.get(need).map(String::as_str) != Some("writable") {
            p.push(format!(
                "{need} is not writable: {:?}",
                r.write_attempts.get(need)
            ));
        }
    }
    p
}

fn writes_outside_work(r: &ProbeReport, rule: &WorkDir) -> Vec<String> {
    let missing: Vec<&str> = rule
        .must_try
        .iter()
        .map(String::as_str)
        .filter(|p| !r.write_attempts.contains_key(*p))
        .collect();
    if !missing.is_empty() {
        return vec![format!("the probe did not try {missing:?}")];
    }
    let outside: Vec<&str> = r
        .write_attempts
        .iter()
        .filter(|(path, v)| **path != r.cwd && v.as_str() == "writable")
        .map(|(k, _)| k.as_str())
        .collect();
    problem_unless(outside.is_empty(), || {
        format!(
            "writes succeed outside the work dir: {outside:?}; {}",
            rule.hint
        )
    })
}

fn limit_problems(r: &ProbeReport, rule: &Limits) -> Vec<String> {
    let Limits::Cgroup {
        memory_keys,
        memory,
        pids_keys,
        pids,
    } = rule
    else {
        return vec![];
    };
    let mut p = Vec::new();
    for (what, keys, want) in [("memory", memory_keys, memory), ("pids", pids_keys, pids)] {
        let seen: Vec<Option<&String>> = keys.iter().map(|k| r.limits.get(k)).collect();
        if !seen.iter().flatten().any(|v| v.trim() == want.to_string()) {
            p.push(format!("{what} limit {keys:?} = {seen:?}, expected {want}"));
        }
    }
    p
}

fn kernel_problems(r: &ProbeReport, rule: &Kernel, host_release: &str) -> Vec<String> {
    let seen = &r.kernel_release;
    let mut p = Vec::new();
    match rule {
        Kernel::TheHosts if seen != host_release => p.push(format!(
            "kernel {seen} differs from the host's {host_release}: not a container?"
        )),
        Kernel::NotTheHosts if seen == host_release => p.push(format!(
            "kernel {seen} is the host's: gVisor's Sentry is not in the way"
        )),
        Kernel::Guest { release } => {
            if seen != release {
                p.push(format!("the guest runs kernel {seen}, expected {release}"));
            }
            if seen == host_release {
                p.push(format!("the guest kernel {seen} is the host's: not a VM?"));
            }
        }
        _ => {}
    }
    p
}
