//! The process provider's probe: identifies the binaries, runs `plimsoll-probe` through the
//! exact launch path a run takes, runs a trivial snippet in each language, and judges what
//! it saw. Any failed check withdraws the provider.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plimsoll_sandbox::judge::{
    self, Capabilities, Expectations, HostView, Identity, Namespaces, NoNewPrivs, Seccomp, WorkDir,
};
use plimsoll_sandbox::{
    CaptureLimits, LaunchPlan, Probed, Provider as _, ResolvedLimits, Spawn, capture,
    reap::processes_of_uid, unix_ms_now,
};
use plimsoll_wire::{BinaryIdentity, Evidence, Language, ProbeReport, RunSpec, Snippet, Tier};

use crate::launch::{Launch, RunDir, error_chain, launch_and_clean};
use crate::{PYTHON_FLAGS, ProcessProvider, policy};

/// The limits the probe and its snippets run with (the engine's defaults).
pub const PROBE_LIMITS: ResolvedLimits = ResolvedLimits {
    timeout: Duration::from_secs(20),
    memory_bytes: 1024 * 1024 * 1024,
    output_bytes: 1024 * 1024,
    pids: 64,
    disk_bytes: 64 * 1024 * 1024,
    artifact_bytes: 1024 * 1024,
};

/// Runs the probe and builds the evidence.
pub fn probe(provider: &ProcessProvider) -> Probed {
    let release = rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned();
    let mut evidence = Evidence {
        provider: "process".into(),
        isolation: Tier::Process,
        config: config_map(provider),
        binaries: Vec::new(),
        probe: None,
        checks: BTreeMap::new(),
        environment: format!(
            "plimsoll-engine/{} on Linux {release}",
            env!("CARGO_PKG_VERSION")
        ),
        checked_unix_ms: unix_ms_now(),
    };
    let available = judge(provider, &mut evidence);
    Probed {
        tier: Tier::Process,
        evidence,
        available,
    }
}

fn config_map(provider: &ProcessProvider) -> BTreeMap<String, String> {
    let cfg = provider.config();
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        m.insert(k.to_owned(), v);
    };
    put("state_dir", cfg.state_dir.display().to_string());
    put("probe_uid", cfg.probe_uid.to_string());
    put(
        "identity",
        "each run: its own uid and gid, no supplementary groups, no capabilities".into(),
    );
    put("environment", "empty".into());
    put("python_flags", PYTHON_FLAGS.join(" "));
    put("no_new_privs", "set".into());
    put("namespaces", "the host's (none created)".into());
    for r in policy::rlimits(&PROBE_LIMITS) {
        let rule = match r.name {
            "RLIMIT_CPU" => "ceil(timeout seconds) + 1 (hard + 1)".to_owned(),
            "RLIMIT_AS" => "limits.memory_bytes".into(),
            "RLIMIT_NPROC" => "limits.pids (per uid)".into(),
            "RLIMIT_FSIZE" => "limits.disk_bytes (per file)".into(),
            _ => r.soft.to_string(),
        };
        put(&format!("rlimit.{}", r.name), rule);
    }
    let l = &PROBE_LIMITS;
    put("probe_limits.timeout_ms", l.timeout.as_millis().to_string());
    put("probe_limits.memory_bytes", l.memory_bytes.to_string());
    put("probe_limits.output_bytes", l.output_bytes.to_string());
    put("probe_limits.pids", l.pids.to_string());
    put("probe_limits.disk_bytes", l.disk_bytes.to_string());
    let kernel_abi = policy::kernel_landlock_abi();
    put("landlock.abi_kernel", kernel_abi.to_string());
    put(
        "landlock.abi_enforced",
        match policy::enforced_landlock_abi() {
            0 => "none (the kernel has no landlock)".to_owned(),
            v => v.to_string(),
        },
    );
    put(
        "landlock.read_exec",
        format!("{} <code dir>", policy::READ_EXEC_DIRS.join(" ")),
    );
    put("landlock.read", policy::READ_ONLY_DIRS.join(" "));
    put("landlock.read_write_devices", policy::DEVICES.join(" "));
    put("landlock.full", "<work dir>".into());
    put(
        "disk",
        "the work dir is a tmpfs of limits.disk_bytes (nosuid, nodev, mode 0700)".into(),
    );
    put(
        "memory",
        format!(
            "every process of a run in the memory cgroup {}/<run> of limits.memory_bytes, no swap (tmpfs pages count)",
            crate::bounds::CGROUP_PARENT
        ),
    );
    put(
        "landlock.net",
        "TCP bind and connect denied (ABI 4+)".into(),
    );
    put(
        "landlock.scope",
        "abstract Unix sockets and signals scoped to the run (ABI 6+)".into(),
    );
    for (k, v) in policy::seccomp_summary() {
        put(&k, v);
    }
    m
}

/// Fills binaries, probe report and checks; `Err` names every failed check.
fn judge(provider: &ProcessProvider, ev: &mut Evidence) -> Result<(), plimsoll_sandbox::Withdrawn> {
    let cfg = provider.config();
    let check = |ev: &mut Evidence, name: &str, outcome: Result<(), String>| {
        ev.checks.insert(
            name.to_owned(),
            outcome.err().unwrap_or_else(|| "ok".into()),
        );
    };

    let root = rustix::process::geteuid().is_root();
    // What a killed daemon left (its runs' processes, mounts, cgroups, code) goes first.
    let reaped = provider.reap();
    check(
        ev,
        "reap",
        if reaped.errors.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "could not remove what earlier runs left: {}",
                reaped.errors.join("; ")
            ))
        },
    );
    check(
        ev,
        "memory_cgroup",
        match crate::bounds::memory_hierarchy() {
            Some(_) => Ok(()),
            None => Err(crate::bounds::BoundRunError::NoMemoryController.to_string()),
        },
    );
    check(
        ev,
        "daemon_is_root",
        if root {
            Ok(())
        } else {
            Err("the process provider must run as root to give each run its own uid: start the daemon as root, or configure another provider".into())
        },
    );
    check(
        ev,
        "probe_uid",
        if cfg.probe_uid == 0 {
            Err("probe_uid is 0: it must be an unused unprivileged uid".into())
        } else {
            Ok(())
        },
    );
    for (name, path, version_arg) in [
        ("node", &cfg.node, Some("--version")),
        ("python3", &cfg.python, Some("--version")),
        ("plimsoll-probe", &cfg.probe, None),
    ] {
        match identify(name, path, version_arg) {
            Ok(id) => {
                ev.binaries.push(id);
                check(ev, &format!("binary.{name}"), Ok(()));
            }
            Err(why) => check(ev, &format!("binary.{name}"), Err(why)),
        }
    }
    verdict(ev)?;

    match run_probe(cfg) {
        Ok(mut report) => {
            let expected = expectations(cfg.probe_uid, &cfg.state_dir);
            ev.checks.extend(judge::mark_and_judge(
                &mut report,
                &expected,
                &HostView::read(),
            ));
            ev.probe = Some(report);
        }
        Err(why) => check(ev, "probe_run", Err(why)),
    }
    for (language, code, name) in [
        (
            Language::Javascript,
            "console.log('ok')",
            "snippet.javascript",
        ),
        (Language::Python, "print('ok')", "snippet.python"),
    ] {
        check(ev, name, run_snippet(provider, language, code));
    }
    verdict(ev)
}

/// `Err` naming every check that is not `ok`: the judging every provider shares.
fn verdict(ev: &Evidence) -> Result<(), plimsoll_sandbox::Withdrawn> {
    plimsoll_sandbox::evidence::availability("process", &ev.checks)
}

/// Path, version and SHA-256 of a binary.
fn identify(name: &str, path: &Path, version_arg: Option<&str>) -> Result<BinaryIdentity, String> {
    let sha256 = plimsoll_sandbox::evidence::sha256_file(path)
        .map_err(|e| format!("{e}; install it or set its path in the [process] settings"))?;
    let version = match version_arg {
        None => env!("CARGO_PKG_VERSION").to_owned(),
        Some(arg) => {
            let running = Spawn::new(path, "/")
                .arg(arg)
                .as_nobody()
                .spawn()
                .map_err(|e| format!("cannot run {} {arg}: {}", path.display(), error_chain(&e)))?;
            let out = capture(running, &CaptureLimits::new(4096, Duration::from_secs(10)))
                .map_err(|e| format!("cannot run {} {arg}: {}", path.display(), error_chain(&e)))?;
            if out.exit_code != Some(0) {
                return Err(format!(
                    "{} {arg} failed ({:?}): {}",
                    path.display(),
                    out.exit_code,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            // Old Pythons print their version on stderr.
            let text = if out.stdout.is_empty() {
                out.stderr
            } else {
                out.stdout
            };
            String::from_utf8_lossy(&text).trim().to_owned()
        }
    };
    Ok(BinaryIdentity {
        name: name.to_owned(),
        path: path.display().to_string(),
        version,
        sha256,
    })
}

/// A fresh run directory for a probe launch.
fn probe_run_dir(cfg: &crate::ProcessConfig, what: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    cfg.state_dir
        .join("runs")
        .join(format!("probe-{what}-{}-{nanos}", std::process::id()))
}

/// Runs plimsoll-probe as a run would run, and reads its report.
fn run_probe(cfg: &crate::ProcessConfig) -> Result<ProbeReport, String> {
    let run_dir = probe_run_dir(cfg, "report");
    let dir = RunDir::create(
        &run_dir,
        cfg.probe_uid,
        cfg.probe_uid,
        PROBE_LIMITS.disk_bytes,
    )
    .map_err(|e| error_chain(&e))?;
    let program = match dir.copy_code("plimsoll-probe", &cfg.probe, 0o750) {
        Ok(p) => p,
        Err(e) => {
            let _ = crate::launch::clean(cfg.probe_uid, &dir);
            return Err(error_chain(&e));
        }
    };
    let runs_root = cfg.state_dir.join("runs");
    let launched = launch_and_clean(
        Launch {
            program: &program,
            args: vec![
                "--try-write".into(),
                cfg.state_dir.clone().into_os_string(),
                "--try-write".into(),
                runs_root.into_os_string(),
            ],
            uid: cfg.probe_uid,
            gid: cfg.probe_uid,
            limits: &PROBE_LIMITS,
            channel: None,
        },
        dir,
    )
    .map_err(|e| e.to_string())?;
    let c = &launched.captured;
    if c.exit_code != Some(0) {
        return Err(format!(
            "plimsoll-probe ended with {:?} (signal {:?}, timed out {}): {}",
            c.exit_code,
            c.signal,
            c.timed_out,
            String::from_utf8_lossy(&c.stderr).trim()
        ));
    }
    let report: ProbeReport = serde_json::from_slice(&c.stdout)
        .map_err(|e| format!("plimsoll-probe printed no report ({e})"))?;
    // Cleanup is part of the wall: nothing of the probe's uid may be left, nor its files.
    let left = processes_of_uid(cfg.probe_uid);
    if !left.is_empty() {
        return Err(format!(
            "processes of uid {} survived the probe run: {left:?}",
            cfg.probe_uid
        ));
    }
    if run_dir.exists() {
        return Err(format!(
            "the probe's run directory {} was not removed",
            run_dir.display()
        ));
    }
    Ok(report)
}

/// What the probe's report must show, run as `uid` with `state_dir` as the state directory.
pub fn expectations(uid: u32, state_dir: &Path) -> Expectations {
    let strings = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
    Expectations {
        identity: Identity::UidAndGid { uid, gid: uid },
        capabilities: Capabilities {
            empty: strings(&["CapEff", "CapPrm", "CapInh", "CapAmb", "CapBnd"]),
            may_be_absent: vec![],
            held: Vec::new(),
        },
        no_new_privs: NoNewPrivs::Set,
        seccomp: Some(Seccomp::Filter),
        // The host's: the process tier creates none; compared, to show it.
        namespaces: Namespaces::Compared,
        filesystem: None,
        work_dir: Some(WorkDir {
            suffix: "/work".into(),
            must_try: strings(&["/", "/tmp", "/etc"])
                .into_iter()
                .chain([state_dir.display().to_string()])
                .collect(),
            hint: "the kernel may lack landlock (5.13+)".into(),
        }),
        host_files: false,
        shadow_unreadable: true,
        loopback_only: false,
        environment: vec![],
        sockets_denied: true,
        limits: None,
        kernel: None,
    }
}

/// Runs a trivial snippet through the provider's own run path.
fn run_snippet(provider: &ProcessProvider, language: Language, code: &str) -> Result<(), String> {
    let cfg = provider.config();
    let run_dir = probe_run_dir(cfg, language.as_str());
    let plan = LaunchPlan {
        image: None,
        run_id: run_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        request_id: "probe".into(),
        privileges: plimsoll_sandbox::Privileges::Unprivileged,
        spec: RunSpec::Snippet(Snippet {
            language,
            code: code.into(),
        }),
        limits: PROBE_LIMITS,
        uid: cfg.probe_uid,
        gid: cfg.probe_uid,
        // A probe has no trial step, so no controller: no second uid, which would be
        // another provider's probe uid (probes run at once) or a run slot's controller uid.
        controller_uid: cfg.probe_uid,
        controller_gid: cfg.probe_uid,
        run_dir,
        broker: None,
        tap: None,
    };
    let out = provider.run(&plan).map_err(|e| e.to_string())?;
    let r = &out.result;
    if r.exit_code == Some(0) && r.stdout.as_slice() == b"ok\n" {
        Ok(())
    } else {
        Err(format!(
            "a trivial {} snippet gave exit {:?} signal {:?}, stdout {:?}, stderr {:?}",
            language.as_str(),
            r.exit_code,
            r.signal,
            String::from_utf8_lossy(r.stdout.as_slice()),
            String::from_utf8_lossy(r.stderr.as_slice()),
        ))
    }
}
