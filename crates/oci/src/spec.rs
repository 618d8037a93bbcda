//! The OCI runtime configuration (`config.json`) of one run: a pure function of the launch
//! plan and the provider's settings. Every choice of the wall is made here, once, and
//! docs/container-tier.md describes it.

use std::path::Path;

use plimsoll_sandbox::{LaunchPlan, tmpfs_inodes};
use serde_json::{Value, json};

use crate::runtime::RuntimeKind;

/// Where the per-run tool directory appears inside the container.
pub const TOOLS_DIR: &str = "/opt/plimsoll/bin";
/// The container's working directory and the project's files.
pub const WORK_DIR: &str = "/work";
/// The container's hostname.
pub const HOSTNAME: &str = "sandbox";
/// The environment every process in the container starts with.
pub const ENVIRONMENT: [&str; 3] = [
    "PATH=/usr/local/bin:/usr/bin:/bin",
    "HOME=/tmp",
    "LANG=C.UTF-8",
];
/// The leaf cgroup of the container below the run's cgroup.
pub const CONTAINER_CGROUP: &str = "ctr";
/// The capabilities a run with a trial step starts with (bounding, effective and permitted;
/// inheritable and ambient stay empty): what the agent needs to start the trial runner as
/// uid 0 and what the runner needs to give the controller a uid of its own. Every other run
/// has none.
pub const TRIAL_CAPABILITIES: [&str; 2] = ["CAP_SETUID", "CAP_SETGID"];
/// `RLIMIT_NOFILE` in the container.
pub const NOFILE: u64 = 1024;

/// /proc and /sys paths hidden from the container (runc's default spec).
pub const MASKED_PATHS: [&str; 10] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
];
/// /proc paths made read-only (runc's default spec).
pub const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Everything besides the plan that shapes a container, decided by the provider.
#[derive(Debug, Clone)]
pub struct SpecInputs<'a> {
    /// The runtime that will read the config.
    pub kind: RuntimeKind,
    /// The image's root file system: absolute, a real directory (never a symlink).
    pub rootfs: &'a Path,
    /// The provider's cgroup parent, e.g. `/plimsoll/crun`.
    pub cgroup_parent: &'a str,
    /// CPU time per wall second, in thousandths of a CPU (1000 = one CPU).
    pub cpu_millis: u32,
    /// The per-run host directory shown read-only at [`TOOLS_DIR`].
    pub tools_dir: &'a Path,
    /// Host files bound read-only at `TOOLS_DIR/<name>` (over empty files in `tools_dir`).
    pub tool_binds: &'a [(&'a str, &'a Path)],
    /// The container's process: program and arguments.
    pub args: &'a [String],
    /// Environment variables added to [`ENVIRONMENT`] (`NAME=value`), e.g. the broker socket.
    pub extra_env: &'a [String],
    /// The host's cgroup v1 hierarchies under /sys/fs/cgroup (`/sys/fs/cgroup/memory`, ...),
    /// which crun mirrors into the container; empty on a cgroup v2 host.
    pub cgroup_v1_mounts: &'a [String],
}

/// The run's cgroup (`<parent>/<run_id>`), which outlives the container's own.
pub fn run_cgroup(cgroup_parent: &str, run_id: &str) -> String {
    format!("{}/{run_id}", cgroup_parent.trim_end_matches('/'))
}

/// The container's cgroup, as `linux.cgroupsPath`.
pub fn container_cgroup(cgroup_parent: &str, run_id: &str) -> String {
    format!("{}/{CONTAINER_CGROUP}", run_cgroup(cgroup_parent, run_id))
}

/// The pids limit the runtime sets. runsc runs the Sentry's own threads and one stub per
/// guest task in the container's cgroup: about 40 host tasks idle and 7 more per guest
/// process (measured), so it gets `64 + 8 × pids`.
pub fn pids_limit(kind: RuntimeKind, pids: u64) -> u64 {
    match kind {
        RuntimeKind::Runsc => 64 + 8 * pids,
        _ => pids,
    }
}

/// The writable tmpfs sizes: `/work` gets 3/4 of the disk limit, `/tmp` and `/dev/shm`
/// 1/8 each, each rounded up to whole pages (at least one).
pub fn tmpfs_sizes(disk_bytes: u64) -> TmpfsSizes {
    let page = |b: u64| b.div_ceil(4096).max(1) * 4096;
    TmpfsSizes {
        work: page(disk_bytes / 4 * 3),
        tmp: page(disk_bytes / 8),
        shm: page(disk_bytes / 8),
    }
}

/// Sizes of the writable mounts, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmpfsSizes {
    /// `/work`.
    pub work: u64,
    /// `/tmp`.
    pub tmp: u64,
    /// `/dev/shm`.
    pub shm: u64,
}

/// The OCI `config.json` of one run.
pub fn container_config(plan: &LaunchPlan, inputs: &SpecInputs<'_>) -> Value {
    let limits = &plan.limits;
    let sizes = tmpfs_sizes(limits.disk_bytes);
    let (uid, gid) = (plan.uid, plan.gid);
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", format!("size={}", sizes.shm),
                           format!("nr_inodes={}", tmpfs_inodes(sizes.shm))]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", "ro"]}),
        json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
               "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}),
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "mode=1777", format!("size={}", sizes.tmp),
                           format!("nr_inodes={}", tmpfs_inodes(sizes.tmp))]}),
        json!({"destination": WORK_DIR, "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "mode=0755", format!("uid={uid}"), format!("gid={gid}"),
                           format!("size={}", sizes.work), format!("nr_inodes={}", tmpfs_inodes(sizes.work))]}),
        json!({"destination": TOOLS_DIR, "type": "bind", "source": inputs.tools_dir,
               "options": ["bind", "ro", "nosuid", "nodev"]}),
    ];
    for (name, host) in inputs.tool_binds {
        mounts.push(
            json!({"destination": format!("{TOOLS_DIR}/{name}"), "type": "bind",
                           "source": host, "options": ["bind", "ro", "nosuid", "nodev"]}),
        );
    }

    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "network"}),
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
    ];
    // The cgroup namespace shows the container its own cgroup as the root (so the probe and
    // the agent read their limits at /sys/fs/cgroup/...). gVisor has its own view anyway.
    if inputs.kind != RuntimeKind::Runsc {
        namespaces.push(json!({"type": "cgroup"}));
    }

    const PERIOD: u64 = 100_000;
    let quota = u64::from(inputs.cpu_millis.max(1)) * PERIOD / 1000;
    let mut linux = json!({
        "namespaces": namespaces,
        "cgroupsPath": container_cgroup(inputs.cgroup_parent, &plan.run_id),
        "resources": {
            "devices": [{"allow": false, "access": "rwm"}],
            "memory": {"limit": limits.memory_bytes, "swap": limits.memory_bytes},
            "pids": {"limit": pids_limit(inputs.kind, limits.pids)},
            "cpu": {"quota": quota, "period": PERIOD},
        },
        "maskedPaths": MASKED_PATHS,
        "readonlyPaths": READONLY_PATHS,
    });
    if inputs.kind == RuntimeKind::Crun && !inputs.cgroup_v1_mounts.is_empty() {
        // crun 1.8 mounts the tmpfs that holds the v1 hierarchies writable by everyone
        // (mode 1777, 1 MiB). Make it read-only, then each hierarchy again: crun's
        // read-only bind of /sys/fs/cgroup copies the hierarchies below it read-write.
        let ro = linux["readonlyPaths"].as_array_mut().expect("an array");
        ro.push(json!("/sys/fs/cgroup"));
        ro.extend(inputs.cgroup_v1_mounts.iter().map(|m| json!(m)));
    }
    // runsc 20221219 applies OCI seccomp only with --oci-seccomp, and then returns EINVAL
    // from statx and ignores errnoRet (clone3 gets EPERM, so threads cannot start): the
    // allowlist cannot be used there, and the Sentry itself is the syscall boundary
    // (docs/container-tier.md). What the Sentry would allow but we do not is new
    // namespaces (a user namespace gives uid 0 with every capability inside it): a deny
    // list of those alone, applied by the Sentry to the code (`--oci-seccomp`).
    linux["seccomp"] = if inputs.kind == RuntimeKind::Runsc {
        crate::seccomp::runsc_profile().clone()
    } else {
        crate::seccomp::profile().clone()
    };

    // A run with a trial step starts as uid 0 with CAP_SETUID and CAP_SETGID; the agent
    // works as the run's uid from its first instruction on and gives every ordinary step
    // neither (docs/container-tier.md, "Trial runs"). Every other run starts as its own uid
    // with no capability at all.
    // A session's agent at runsc starts so too, and drops to the run's uid before anything
    // else (`--drop-to`, Privileges::DropsToRunUid).
    let (user, capabilities) = if plan.privileges.starts_as_root() {
        (
            json!({"uid": 0, "gid": 0, "additionalGids": []}),
            json!({"bounding": TRIAL_CAPABILITIES, "effective": TRIAL_CAPABILITIES,
                   "inheritable": [], "permitted": TRIAL_CAPABILITIES, "ambient": []}),
        )
    } else {
        (
            json!({"uid": uid, "gid": gid, "additionalGids": []}),
            json!({"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []}),
        )
    };
    let env: Vec<String> = ENVIRONMENT
        .iter()
        .map(|e| (*e).to_owned())
        .chain(inputs.extra_env.iter().cloned())
        .collect();
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": user,
            "args": inputs.args,
            "env": env,
            "cwd": WORK_DIR,
            "capabilities": capabilities,
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": NOFILE, "soft": NOFILE},
                {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},
            ],
            "noNewPrivileges": true,
            "oomScoreAdj": 1000,
        },
        "root": {"path": inputs.rootfs, "readonly": true},
        "hostname": HOSTNAME,
        "mounts": mounts,
        "linux": linux,
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use plimsoll_sandbox::ResolvedLimits;
    use plimsoll_wire::{Language, RunSpec, Snippet};

    use super::*;

    fn plan() -> LaunchPlan {
        LaunchPlan {
            image: None,
            run_id: "0123abcd".into(),
            request_id: "r".into(),
            privileges: plimsoll_sandbox::Privileges::Unprivileged,
            spec: RunSpec::Snippet(Snippet {
                language: Language::Python,
                code: "print(1)".into(),
            }),
            limits: ResolvedLimits {
                timeout: Duration::from_secs(5),
                memory_bytes: 256 << 20,
                output_bytes: 1 << 20,
                pids: 64,
                disk_bytes: 64 << 20,
                artifact_bytes: 1 << 20,
            },
            uid: 2_000_003,
            gid: 2_000_003,
            controller_uid: 2_000_003 + 1,
            controller_gid: 2_000_003 + 1,
            run_dir: PathBuf::from("/unused"),
            broker: None,
            tap: None,
        }
    }

    fn config(kind: RuntimeKind) -> Value {
        config_for(&plan(), kind, &[("plimsoll-agent", Path::new(AGENT))])
    }

    const AGENT: &str = "/host/plimsoll-agent";
    const RUNNER: &str = "/host/plimsoll-trial-runner";

    fn config_for(plan: &LaunchPlan, kind: RuntimeKind, binds: &[(&str, &Path)]) -> Value {
        let args = vec![
            "/usr/bin/python3".to_owned(),
            "/opt/plimsoll/bin/main.py".to_owned(),
        ];
        container_config(
            plan,
            &SpecInputs {
                kind,
                rootfs: Path::new("/images/sandbox/rootfs"),
                cgroup_parent: "/plimsoll/crun",
                cpu_millis: 1500,
                tools_dir: Path::new("/run/plimsoll/crun/runs/plimsoll-0123abcd/bin"),
                tool_binds: binds,
                args: &args,
                extra_env: &[],
                cgroup_v1_mounts: &[
                    "/sys/fs/cgroup/memory".to_owned(),
                    "/sys/fs/cgroup/pids".to_owned(),
                ],
            },
        )
    }

    /// A project plan with these steps.
    fn project_plan(steps: &[&str]) -> LaunchPlan {
        let spec = plimsoll_testing::project(vec![], steps, &[]);
        LaunchPlan {
            privileges: plimsoll_sandbox::Privileges::for_spec(&spec),
            spec,
            ..plan()
        }
    }

    /// SHA-256 of a config's JSON without its seccomp profile (data, checked on its own) and
    /// without the tmpfs inode counts (added later for every run alike, checked on their own
    /// in `writable_mounts_are_small_tmpfs_owned_by_the_run`), so the pinned digests still say that nothing
    /// else changed.
    fn digest_without_seccomp(mut c: Value) -> String {
        use sha2::Digest as _;
        if let Some(linux) = c["linux"].as_object_mut() {
            linux.remove("seccomp");
        }
        for m in c["mounts"].as_array_mut().into_iter().flatten() {
            if let Some(opts) = m["options"].as_array_mut() {
                opts.retain(|o| !o.as_str().is_some_and(|o| o.starts_with("nr_inodes=")));
            }
        }
        hex::encode(sha2::Sha256::digest(serde_json::to_vec(&c).unwrap()))
    }

    #[test]
    fn runs_without_a_trial_step_are_what_they_were() {
        // Computed from this module before trial runs existed: a run without a trial step
        // must keep exactly that config (the run uid, no capability, no runner).
        const CRUN: &str = "cfeaace90e2d622c058edabfe1949de7231939829c71bb36c42d08f5a58fd83c";
        const RUNC: &str = "c37483a020c3273a003ef647d5d96f845b4a35414d44c49b25a4d3a7acd1bb8d";
        const RUNSC: &str = "cf875716b1c764c47a5fa4e003326a1f5edd35d384cf686528fcee5a0669c18c";
        let agent: &[(&str, &Path)] = &[("plimsoll-agent", Path::new(AGENT))];
        let project = project_plan(&["echo plimsoll-trial-runner", "node main.js"]);
        for (kind, plan, want) in [
            (RuntimeKind::Crun, plan(), CRUN),
            (RuntimeKind::Runc, plan(), RUNC),
            (RuntimeKind::Runsc, plan(), RUNSC),
            (RuntimeKind::Crun, project.clone(), CRUN),
            (RuntimeKind::Runc, project.clone(), RUNC),
            (RuntimeKind::Runsc, project.clone(), RUNSC),
        ] {
            let got = digest_without_seccomp(config_for(&plan, kind, agent));
            assert_eq!(got, want, "{kind:?}, {:?}", plan.spec);
        }
    }

    fn mount<'a>(c: &'a Value, dest: &str) -> &'a Value {
        c["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == dest)
            .unwrap_or_else(|| panic!("no {dest}"))
    }

    #[test]
    fn the_wall_of_a_container() {
        let c = config(RuntimeKind::Crun);
        let p = &c["process"];
        assert_eq!(p["user"]["uid"], 2_000_003);
        assert_eq!(p["user"]["gid"], 2_000_003);
        assert_eq!(p["noNewPrivileges"], true);
        for set in [
            "bounding",
            "effective",
            "inheritable",
            "permitted",
            "ambient",
        ] {
            assert_eq!(p["capabilities"][set], json!([]), "{set}");
        }
        assert_eq!(p["env"], json!(ENVIRONMENT));
        assert_eq!(p["terminal"], false);
        assert_eq!(
            c["root"],
            json!({"path": "/images/sandbox/rootfs", "readonly": true})
        );
        let ns: Vec<&str> = c["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        assert_eq!(ns, ["pid", "network", "ipc", "uts", "mount", "cgroup"]);
        assert!(
            c["linux"]["namespaces"]
                .as_array()
                .unwrap()
                .iter()
                .all(|n| n.get("path").is_none()),
            "fresh namespaces only"
        );
        assert_eq!(c["linux"]["cgroupsPath"], "/plimsoll/crun/0123abcd/ctr");
        let r = &c["linux"]["resources"];
        assert_eq!(
            r["memory"],
            json!({"limit": 256u64 << 20, "swap": 256u64 << 20})
        );
        assert_eq!(r["pids"]["limit"], 64);
        assert_eq!(r["cpu"], json!({"quota": 150_000, "period": 100_000}));
        assert_eq!(r["devices"], json!([{"allow": false, "access": "rwm"}]));
        assert_eq!(c["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(c["linux"]["maskedPaths"], json!(MASKED_PATHS));
        let mut ro = READONLY_PATHS.to_vec();
        ro.extend([
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup/pids",
        ]);
        assert_eq!(c["linux"]["readonlyPaths"], json!(ro));
        let runc = config(RuntimeKind::Runc);
        assert_eq!(runc["linux"]["readonlyPaths"], json!(READONLY_PATHS));
    }

    #[test]
    fn writable_mounts_are_small_tmpfs_owned_by_the_run() {
        let c = config(RuntimeKind::Runc);
        let work = mount(&c, "/work");
        assert_eq!(work["type"], "tmpfs");
        let opts: Vec<&str> = work["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap())
            .collect();
        assert!(
            opts.contains(&"uid=2000003") && opts.contains(&"gid=2000003"),
            "{opts:?}"
        );
        assert!(opts.contains(&"size=50331648"), "3/4 of 64 MiB: {opts:?}");
        // One inode per KiB of each writable tmpfs.
        assert!(opts.contains(&"nr_inodes=49152"), "{opts:?}");
        let tmp = mount(&c, "/tmp")["options"].to_string();
        assert!(
            tmp.contains("size=8388608")
                && tmp.contains("mode=1777")
                && tmp.contains("nr_inodes=8192"),
            "{tmp}"
        );
        assert!(
            mount(&c, "/dev/shm")["options"]
                .to_string()
                .contains("nr_inodes=8192")
        );
        let tools = mount(&c, TOOLS_DIR);
        assert_eq!(tools["type"], "bind");
        assert!(tools["options"].to_string().contains("\"ro\""));
        let agent = mount(&c, "/opt/plimsoll/bin/plimsoll-agent");
        assert_eq!(agent["source"], "/host/plimsoll-agent");
        assert!(agent["options"].to_string().contains("\"ro\""));
        // Every other mount is read-only or a kernel file system.
        for m in c["mounts"].as_array().unwrap() {
            let d = m["destination"].as_str().unwrap();
            let ro = m["options"].as_array().unwrap().iter().any(|o| o == "ro");
            let writable_ok = matches!(
                d,
                "/work" | "/tmp" | "/dev/shm" | "/dev" | "/dev/pts" | "/proc"
            );
            assert!(ro || writable_ok, "{d} is writable");
        }
    }

    #[test]
    fn a_trial_run_starts_as_root_with_exactly_setuid_and_setgid() {
        use plimsoll_wire::trial_step::{TRIAL_RUNNER, TRIAL_RUNNER_PATH};
        assert_eq!(format!("{TOOLS_DIR}/{TRIAL_RUNNER}"), TRIAL_RUNNER_PATH);
        let plan = project_plan(&[
            "id -u",
            "plimsoll-trial-runner --scenario standard.json -- node accepted.js",
        ]);
        let binds: &[(&str, &Path)] = &[
            ("plimsoll-agent", Path::new(AGENT)),
            (TRIAL_RUNNER, Path::new(RUNNER)),
        ];
        for kind in RuntimeKind::ALL {
            let c = config_for(&plan, kind, binds);
            let p = &c["process"];
            assert_eq!(
                p["user"],
                json!({"uid": 0, "gid": 0, "additionalGids": []}),
                "{kind:?}"
            );
            let two = json!(["CAP_SETUID", "CAP_SETGID"]);
            for set in ["bounding", "effective", "permitted"] {
                assert_eq!(p["capabilities"][set], two, "{kind:?} {set}");
            }
            for set in ["inheritable", "ambient"] {
                assert_eq!(p["capabilities"][set], json!([]), "{kind:?} {set}");
            }
            assert_eq!(p["noNewPrivileges"], true);
            // /work stays the run uid's, mode 0755; /proc has no hidepid.
            let work = mount(&c, WORK_DIR)["options"].to_string();
            assert!(
                work.contains("\"uid=2000003\"")
                    && work.contains("\"gid=2000003\"")
                    && work.contains("\"mode=0755\""),
                "{work}"
            );
            assert!(
                !mount(&c, "/proc")["options"]
                    .to_string()
                    .contains("hidepid")
            );
            let runner = mount(&c, TRIAL_RUNNER_PATH);
            assert_eq!(runner["type"], "bind");
            assert_eq!(runner["source"], RUNNER);
            assert_eq!(runner["options"], json!(["bind", "ro", "nosuid", "nodev"]));
            // Nothing else differs from the same run without its trial step.
            let mut plain = config_for(&project_plan(&["id -u"]), kind, binds);
            plain["process"]["user"] = p["user"].clone();
            plain["process"]["capabilities"] = p["capabilities"].clone();
            assert_eq!(plain, c, "{kind:?}");
        }
        // The runner named by its path is a trial step too; a mention of it is not.
        let by_path =
            project_plan(&["/opt/plimsoll/bin/plimsoll-trial-runner --scenario s.json -- x"]);
        assert_eq!(
            config_for(&by_path, RuntimeKind::Runc, binds)["process"]["user"]["uid"],
            0
        );
        let mention = project_plan(&["echo plimsoll-trial-runner"]);
        let c = config_for(&mention, RuntimeKind::Runc, binds);
        assert_eq!(c["process"]["user"]["uid"], 2_000_003);
        assert_eq!(c["process"]["capabilities"]["bounding"], json!([]));
    }

    #[test]
    fn runsc_gets_room_for_its_threads_and_the_namespace_deny_list() {
        let c = config(RuntimeKind::Runsc);
        assert_eq!(c["linux"]["resources"]["pids"]["limit"], 64 + 8 * 64);
        assert_eq!(c["linux"]["seccomp"], *crate::seccomp::runsc_profile());
        let ns = c["linux"]["namespaces"].to_string();
        assert!(!ns.contains("cgroup"), "{ns}");
        assert!(ns.contains("network"), "{ns}");
    }

    #[test]
    fn sizes_round_to_pages() {
        assert_eq!(
            tmpfs_sizes(0),
            TmpfsSizes {
                work: 4096,
                tmp: 4096,
                shm: 4096
            }
        );
        let s = tmpfs_sizes(1_000_000);
        assert_eq!(s.work % 4096, 0);
        assert!(s.work >= 750_000 && s.tmp >= 125_000);
        assert_eq!(run_cgroup("/plimsoll/runc/", "x"), "/plimsoll/runc/x");
    }
}
