//! The startup probe of an OCI provider: reap what a previous daemon left, identify the
//! binaries and the image, run `plimsoll-probe` inside a real container, and judge its
//! report against what the tier claims. The provider is offered only when every check is
//! `ok`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use plimsoll_sandbox::evidence::{self, sha256_file};
use plimsoll_sandbox::judge::{
    self, Capabilities, Expectations, Filesystem, HostView, Identity, Kernel, Limits, Namespaces,
    NoNewPrivs, Seccomp,
};
use plimsoll_sandbox::{LaunchPlan, Probed, unix_ms_now};
use plimsoll_wire::{BinaryIdentity, Evidence, Language, ProbeReport, RunSpec, Snippet};

use crate::provider::{LaunchSpec, OciProvider};
use crate::runtime::RuntimeKind;
use crate::spec;

/// The namespaces a container must not share with the host.
pub const SEPARATE_NAMESPACES: [&str; 5] = ["pid", "net", "mnt", "ipc", "uts"];
/// The only places a container may write.
pub const WRITABLE: [&str; 3] = ["/work", "/tmp", "/dev/shm"];
/// Mount points that may be mounted read-write (kernel file systems and root-owned
/// tmpfs besides the writable ones; what the sandbox uid can write is checked by trying).
/// Masked paths (`/dev/null` bound over them, shown read-write) and runc's root-owned tmpfs
/// at /sys/fs/cgroup are among them.
pub const RW_MOUNTS: [&str; 8] = [
    "/work",
    "/tmp",
    "/dev/shm",
    "/dev",
    "/dev/pts",
    "/dev/mqueue",
    "/proc",
    "/sys/fs/cgroup",
];
/// Directories the probe tries to write in, besides its own list.
pub const TRY_WRITE: [&str; 7] = [
    "/work",
    "/opt/plimsoll/bin",
    "/sys/fs/cgroup",
    "/dev",
    "/home",
    "/root",
    "/var/tmp",
];
pub use plimsoll_sandbox::evidence::{PROBE_MEMORY, PROBE_PIDS, probe_limits};

/// Runs the whole probe.
pub fn probe(p: &OciProvider) -> Probed {
    let kind = p.config().kind;
    let mut checks: BTreeMap<String, String> = BTreeMap::new();
    let mut config: BTreeMap<String, String> = BTreeMap::new();
    let mut binaries = Vec::new();

    let reaped = p.reap();
    checks.insert(
        "reap".into(),
        if reaped.errors.is_empty() {
            "ok".into()
        } else {
            reaped.summary()
        },
    );
    config.insert("reap_at_probe".into(), reaped.summary());

    config.insert("runtime".into(), kind.name().into());
    config.insert(
        "runtime_root".into(),
        p.runtime().root().display().to_string(),
    );
    config.insert("state_dir".into(), p.state().base().display().to_string());
    config.insert("image".into(), p.config().image.display().to_string());
    config.insert("cgroup_parent".into(), p.cgroup_parent().to_owned());
    config.insert(
        "cgroup_path".into(),
        format!("{}/<run_id>/{}", p.cgroup_parent(), spec::CONTAINER_CGROUP),
    );
    config.insert("cpu".into(), format!("{} ms per s", p.config().cpu_millis));
    config.insert(
        "namespaces".into(),
        match kind {
            RuntimeKind::Runsc => "pid net ipc uts mnt (gVisor sandbox, --network=none)".into(),
            _ => "pid net ipc uts mnt cgroup (net: loopback only)".into(),
        },
    );
    config.insert(
        "tmpfs".into(),
        "/work 3/4, /tmp 1/8, /dev/shm 1/8 of disk_bytes".into(),
    );
    config.insert(
        "pids".into(),
        match kind {
            RuntimeKind::Runsc => "64 + 8 x pids (Sentry threads count)".into(),
            _ => "pids".into(),
        },
    );
    config.insert("seccomp".into(), match kind {
        RuntimeKind::Runsc => format!(
            "data/seccomp-runsc.json sha256:{} inside gVisor (--oci-seccomp): namespace creation denied, the Sentry is the syscall boundary (docs/container-tier.md)",
            crate::seccomp::runsc_profile_sha256()
        ),
        _ => format!("data/seccomp.json sha256:{}", crate::seccomp::profile_sha256()),
    });
    if kind == RuntimeKind::Runsc {
        config.insert("platform".into(), p.config().platform.clone());
        config.insert("network".into(), "none".into());
    }
    match p.layout() {
        Ok(l) => {
            config.insert("cgroup_mode".into(), l.mode().as_str().into());
            config.insert(
                "crun_hides_cgroup2".into(),
                p.runtime().hides_unified().to_string(),
            );
            checks.insert(
                "cgroups".into(),
                if l.has_memory() {
                    "ok".into()
                } else {
                    format!(
                        "no memory cgroup controller is mounted ({} layout): mount cgroups",
                        l.mode().as_str()
                    )
                },
            );
        }
        Err(e) => {
            checks.insert("cgroups".into(), e.to_owned());
        }
    }

    let version = p.runtime().version();
    match (&version, sha256_file(p.runtime().binary())) {
        (Ok(v), Ok(sha)) => {
            binaries.push(BinaryIdentity {
                name: kind.name().into(),
                path: p.runtime().binary().display().to_string(),
                version: v.clone(),
                sha256: sha,
            });
            checks.insert("runtime".into(), "ok".into());
        }
        (Err(e), _) => {
            checks.insert(
                "runtime".into(),
                format!("{e}: install {} or configure its path", kind.name()),
            );
        }
        (_, Err(e)) => {
            checks.insert("runtime".into(), e.to_string());
        }
    }
    for (name, path) in [
        ("plimsoll-probe", &p.config().probe),
        ("plimsoll-agent", &p.config().agent),
    ] {
        match sha256_file(path) {
            Ok(sha) => binaries.push(BinaryIdentity {
                name: name.into(),
                path: path.display().to_string(),
                version: env!("CARGO_PKG_VERSION").into(),
                sha256: sha,
            }),
            Err(e) => {
                checks.insert(
                    format!("{name}_binary"),
                    format!("{e}: build it (cargo build) or configure its path"),
                );
            }
        }
    }
    // The trial runner runs inside trial runs only, so a missing one is not a check (a trial
    // run is refused then); when it is there, the evidence names the binary trials run.
    let runner = &p.config().trial_runner;
    if runner.is_file()
        && let Ok(sha) = sha256_file(runner)
    {
        binaries.push(BinaryIdentity {
            name: "plimsoll-trial-runner".into(),
            path: runner.display().to_string(),
            version: env!("CARGO_PKG_VERSION").into(),
            sha256: sha,
        });
    }
    let environment = match p.image_identity() {
        Ok(id) => id,
        Err(e) => {
            checks.insert("image".into(), e.to_string());
            String::new()
        }
    };
    match p.rootfs() {
        Ok(r) => {
            config.insert("rootfs".into(), r.display().to_string());
            checks.entry("image".into()).or_insert_with(|| "ok".into());
        }
        Err(e) => {
            checks.insert("image".into(), e.to_string());
        }
    }

    let mut report = None;
    let ready = checks.values().all(|v| v == "ok");
    if ready {
        match run_probe(p) {
            Ok(mut r) => {
                judge(kind, p.config().probe_uid, &mut r, &mut checks);
                report = Some(r);
            }
            Err(e) => {
                checks.insert("probe_ran".into(), e);
            }
        }
        let leftovers = p.reap();
        let left = leftovers.containers.len() + leftovers.cgroups.len() + leftovers.run_dirs.len();
        checks.insert(
            "cleanup".into(),
            if left == 0 && leftovers.errors.is_empty() {
                "ok".into()
            } else {
                format!(
                    "the probe run left something behind: {}",
                    leftovers.summary()
                )
            },
        );
    }

    let available = evidence::availability(kind.name(), &checks);
    Probed {
        tier: kind.tier(),
        evidence: Evidence {
            provider: kind.name().into(),
            isolation: kind.tier(),
            config,
            binaries,
            probe: report,
            checks,
            environment,
            checked_unix_ms: unix_ms_now(),
        },
        available,
    }
}

/// A host file the container must not be able to read.
fn canary(p: &OciProvider) -> Result<std::path::PathBuf, String> {
    p.state()
        .ensure()
        .map_err(|e| format!("cannot create {}: {e}", p.state().base().display()))?;
    let path = p.state().base().join("canary");
    std::fs::write(
        &path,
        "plimsoll host file: a sandbox must never read this\n",
    )
    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

fn run_probe(p: &OciProvider) -> Result<ProbeReport, String> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let canary = canary(p)?;
    let run_id = format!(
        "probe{:x}{:x}{}",
        unix_ms_now(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let uid = p.config().probe_uid;
    let plan = LaunchPlan {
        image: None,
        run_id: run_id.clone(),
        request_id: "probe".into(),
        privileges: plimsoll_sandbox::Privileges::Unprivileged,
        spec: RunSpec::Snippet(Snippet {
            language: Language::Python,
            code: "probe".into(),
        }),
        limits: probe_limits(),
        uid,
        gid: uid,
        // A probe has no trial step, so no controller: no second uid, which would be
        // another provider's probe uid (probes run at once) or a run slot's controller uid.
        controller_uid: uid,
        controller_gid: uid,
        run_dir: p.state().runs().join(&run_id),
        broker: None,
        tap: None,
    };
    let launch = LaunchSpec {
        args: [
            format!("{}/plimsoll-probe", spec::TOOLS_DIR),
            "--try-read".into(),
            canary.display().to_string(),
        ]
        .into_iter()
        .chain(
            TRY_WRITE
                .iter()
                .flat_map(|p| ["--try-write".to_owned(), (*p).to_owned()]),
        )
        .collect(),
        files: Vec::new(),
        binds: vec![("plimsoll-probe".into(), p.config().probe.clone())],
        output_bytes: 1 << 20,
        deadline: plan.limits.timeout,
        env: Vec::new(),
        handed_over: None,
        wall_inside: false,
    };
    let l = p
        .launch(&plan, &launch)
        .map_err(|e| format!("the probe container did not run: {e}"))?;
    let c = &l.captured;
    if l.timed_out || c.exit_code != Some(0) {
        return Err(format!(
            "the probe exited with {:?} (timed out: {}): {}",
            c.exit_code,
            l.timed_out,
            String::from_utf8_lossy(&c.stderr)
                .lines()
                .take(3)
                .collect::<Vec<_>>()
                .join(" / ")
        ));
    }
    serde_json::from_slice(&c.stdout)
        .map_err(|e| format!("the probe's report is not a ProbeReport: {e}"))
}

/// Judges the report by [`expectations`] against this host (the one judging table,
/// `plimsoll_sandbox::judge`); fills in `same_as_host`.
pub fn judge(
    kind: RuntimeKind,
    probe_uid: u32,
    r: &mut ProbeReport,
    checks: &mut BTreeMap<String, String>,
) {
    let expected = expectations(kind, probe_uid);
    checks.extend(judge::mark_and_judge(r, &expected, &HostView::read()));
}

/// What the probe's report must show for `kind`, run as `probe_uid`.
/// What a run's wall must show at `kind`: the probe's expectations, for the run's uid and the
/// run's memory and pids limits.
pub fn run_expectations(kind: RuntimeKind, uid: u32, memory: u64, pids: u64) -> Expectations {
    let mut e = expectations(kind, uid);
    if let Some(Limits::Cgroup {
        memory: m, pids: p, ..
    }) = &mut e.limits
    {
        (*m, *p) = (memory, pids);
    }
    e
}

pub fn expectations(kind: RuntimeKind, probe_uid: u32) -> Expectations {
    let gvisor = kind == RuntimeKind::Runsc;
    let strings = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
    Expectations {
        identity: Identity::Uid(probe_uid),
        capabilities: Capabilities {
            empty: strings(&["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]),
            // gVisor's /proc/self/status has no CapAmb line.
            may_be_absent: if gvisor { strings(&["CapAmb"]) } else { vec![] },
            held: Vec::new(),
        },
        // gVisor's /proc/self/status has no NoNewPrivs line (the attack tests ask prctl).
        no_new_privs: if gvisor {
            NoNewPrivs::LineMayBeAbsent
        } else {
            NoNewPrivs::Set
        },
        seccomp: Some(if gvisor {
            Seccomp::NotRequired
        } else {
            Seccomp::Filter
        }),
        namespaces: Namespaces::Separate {
            names: strings(&SEPARATE_NAMESPACES),
            // gVisor's /proc may not list every namespace; the Sentry is the boundary there.
            unreported_ok: gvisor,
        },
        filesystem: Some(Filesystem {
            rw_mounts: strings(&RW_MOUNTS)
                .into_iter()
                .chain(strings(&spec::MASKED_PATHS))
                .collect(),
            writable: strings(&WRITABLE),
            must_be_writable: strings(&["/work", "/tmp"]),
        }),
        work_dir: None,
        host_files: true,
        shadow_unreadable: false,
        loopback_only: true,
        environment: spec::ENVIRONMENT
            .iter()
            .map(|e| e.split('=').next().unwrap_or("").to_owned())
            .collect(),
        sockets_denied: false,
        limits: Some(if gvisor {
            Limits::NotVisible
        } else {
            Limits::Cgroup {
                memory_keys: strings(&["cgroup_v1.memory.limit_in_bytes", "cgroup_v2.memory.max"]),
                memory: PROBE_MEMORY,
                pids_keys: strings(&["cgroup_v1.pids.max", "cgroup_v2.pids.max"]),
                pids: PROBE_PIDS,
            }
        }),
        kernel: Some(if gvisor {
            Kernel::NotTheHosts
        } else {
            Kernel::TheHosts
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report meeting crun's expectations on this host (the breach table is
    /// `plimsoll_sandbox`'s `tests/judge.rs`).
    fn good_report(uid: u32) -> ProbeReport {
        plimsoll_testing::report::meeting(&expectations(RuntimeKind::Crun, uid), &HostView::read())
    }

    #[test]
    fn a_good_report_passes_every_check() {
        let mut checks = BTreeMap::new();
        let mut r = good_report(2_000_008);
        judge(RuntimeKind::Crun, 2_000_008, &mut r, &mut checks);
        let bad: Vec<_> = checks.iter().filter(|(_, v)| *v != "ok").collect();
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(r.namespaces["pid"].same_as_host, Some(false));
    }

    #[test]
    fn gvisor_must_show_its_own_kernel() {
        let uid = 7;
        let mut checks = BTreeMap::new();
        let mut r = good_report(uid);
        judge(RuntimeKind::Runsc, uid, &mut r, &mut checks);
        assert_ne!(checks["kernel"], "ok");
        r.kernel_release = "4.4.0".into();
        r.seccomp_mode = 0;
        r.limits.clear();
        judge(RuntimeKind::Runsc, uid, &mut r, &mut checks);
        let bad: Vec<_> = checks.iter().filter(|(_, v)| *v != "ok").collect();
        assert!(bad.is_empty(), "{bad:?}");
    }
}
