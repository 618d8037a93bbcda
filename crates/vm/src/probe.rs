//! The `qemu` provider's startup probe: identify QEMU and the assets, find the accelerator
//! that really runs a guest (KVM tried first under `auto`, with a short boot budget; QEMU's
//! monitor says which one ran), then boot one guest through the ordinary run path running
//! `plimsoll-probe`, a JavaScript and a Python step, and judge what it saw. The tier comes
//! from [`crate::tier::tier_for`] applied to the accelerator QEMU reported.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use plimsoll_sandbox::evidence;
use plimsoll_sandbox::judge::{
    self, Capabilities, Expectations, Filesystem, HostView, Identity, Kernel, Limits, Namespaces,
    NoNewPrivs,
};
use plimsoll_sandbox::reap::processes_of_uid;
use plimsoll_sandbox::{
    CaptureLimits, LaunchPlan, Probed, Provider as _, Spawn, capture, unix_ms_now,
};
use plimsoll_wire::{BinaryIdentity, Evidence, ProbeReport, Project, RunResult, RunSpec, Step};

use crate::assets::sha256_file;
use crate::boot::{Answer, BootReport, QmpError};
use crate::config::AccelChoice;
use crate::guest::{ENVIRONMENT, SANDBOX_UID};
use crate::provider::{Prepared, VmProvider, error_chain, result_of};
use crate::qemu;
use crate::tier::{AccelEvidence, Accelerator, tier_for};

pub use plimsoll_sandbox::evidence::{PROBE_MEMORY, PROBE_PIDS, probe_limits};
/// Mount points that may be read-write in the guest (what the sandbox user can actually
/// write is checked by trying): the two tmpfs, and root-owned kernel file systems.
pub const RW_MOUNTS: [&str; 5] = ["/work", "/tmp", "/dev", "/proc", "/sys/fs/cgroup"];
/// The only places the code may write.
pub const WRITABLE: [&str; 2] = ["/work", "/tmp"];
/// Directories the probe tries to write in, besides its own list.
pub const TRY_WRITE: [&str; 8] = [
    "/work",
    "/opt/plimsoll/bin",
    "/sys/fs/cgroup",
    "/sys/fs/cgroup/run",
    "/dev",
    "/home",
    "/root",
    "/var/tmp",
];

fn fresh_run_id(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "probe-qemu-{what}-{:x}-{}-{}",
        unix_ms_now(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn probe_plan(p: &VmProvider, what: &str, spec: RunSpec) -> LaunchPlan {
    let run_id = fresh_run_id(what);
    let uid = p.config().probe_uid;
    LaunchPlan {
        image: None,
        run_dir: p.config().runs_root().join(&run_id),
        run_id,
        request_id: "probe".into(),
        privileges: plimsoll_sandbox::Privileges::for_spec(&spec),
        spec,
        limits: probe_limits(),
        uid,
        gid: uid,
        // A probe has no trial step, so no controller: no second uid, which would be
        // another provider's probe uid (probes run at once) or a run slot's controller uid.
        controller_uid: uid,
        controller_gid: uid,
        broker: None,
        tap: None,
    }
}

/// Runs the whole probe.
pub fn probe(p: &VmProvider) -> Probed {
    let _one_at_a_time = p.probing();
    let cfg = p.config();
    let mut checks: BTreeMap<String, String> = BTreeMap::new();
    let mut config: BTreeMap<String, String> = BTreeMap::new();
    let mut binaries = Vec::new();
    let put = |m: &mut BTreeMap<String, String>, k: &str, v: String| {
        m.insert(k.to_owned(), v);
    };
    let ok = |m: &mut BTreeMap<String, String>, k: &str, r: Result<(), String>| {
        m.insert(k.to_owned(), r.err().unwrap_or_else(|| "ok".into()));
    };

    put(&mut config, "reap_at_start", p.reaped_at_start().summary());
    let dirs = p.reap_run_dirs();
    ok(
        &mut checks,
        "reap",
        if dirs.errors.is_empty() {
            Ok(())
        } else {
            Err(dirs.summary())
        },
    );
    put(&mut config, "reap_at_probe", dirs.summary());
    put(&mut config, "qemu", cfg.qemu.display().to_string());
    put(
        &mut config,
        "accelerator_choice",
        cfg.accelerator.as_str().into(),
    );
    put(&mut config, "machine", qemu::MACHINE.into());
    put(&mut config, "cpus", cfg.cpus.to_string());
    put(&mut config, "sandbox", qemu::SANDBOX.into());
    put(
        &mut config,
        "devices",
        "virtio-blk (image disk, read-only), virtio-serial (one port on a socket pair), serial console; no network device (-nic none)".into(),
    );
    put(
        &mut config,
        "memory",
        format!(
            "-m limits.memory_bytes + {} MiB; the run's cgroup in the guest has memory.max = limits.memory_bytes",
            crate::provider::GUEST_OVERHEAD_MIB
        ),
    );
    put(
        &mut config,
        "address_space",
        format!(
            "RLIMIT_AS = guest RAM + TCG cache ({} MiB) + {} MiB",
            qemu::TCG_TB_MIB,
            crate::provider::QEMU_ADDRESS_SLACK_MIB
        ),
    );
    put(
        &mut config,
        "jail",
        "own mount namespace; tmpfs root (read-only) with read-only binds of /usr, /dev/{null,zero,urandom}, kernel, initramfs, disk; private /tmp; pivot_root; run uid and gid, no groups; PR_SET_PDEATHSIG; no_new_privs".into(),
    );
    put(
        &mut config,
        "guest",
        format!(
            "image disk read-only under a tmpfs overlay, remounted read-only; /work (3/4 of disk_bytes) and /tmp (1/4) tmpfs; cgroup v2 memory.max and pids.max; uid {SANDBOX_UID}; no capabilities; no_new_privs"
        ),
    );
    put(
        &mut config,
        "timeout",
        format!(
            "the agent's deadline is limits.timeout from its start; boot has its own budget ({} s TCG, {} s KVM); the VM is killed {} s after the deadline",
            cfg.boot_timeout.as_secs(),
            cfg.kvm_boot_timeout.as_secs(),
            crate::provider::AGENT_GRACE.as_secs()
        ),
    );

    ok(
        &mut checks,
        "daemon_is_root",
        if rustix::process::geteuid().is_root() {
            Ok(())
        } else {
            Err("the qemu provider must run as root (mount namespace, uid switch): start the daemon as root".into())
        },
    );
    match identify_qemu(&cfg.qemu) {
        Ok(id) => {
            binaries.push(id);
            ok(&mut checks, "qemu", Ok(()));
        }
        Err(e) => ok(&mut checks, "qemu", Err(e)),
    }
    let prepared = match p.prepared(true) {
        Ok(pr) => {
            ok(
                &mut checks,
                "assets",
                check_assets(&pr, &mut binaries, &mut config),
            );
            trial_evidence(p, &pr, &mut binaries, &mut config);
            Some(pr)
        }
        Err(e) => {
            ok(&mut checks, "assets", Err(e));
            None
        }
    };
    let environment = prepared
        .as_ref()
        .map(|pr| pr.assets.image_identity.clone())
        .unwrap_or_default();

    let mut tier = p.nominal_tier();
    let mut report = None;
    if let (Some(pr), true) = (&prepared, checks.values().all(|v| v == "ok")) {
        let accelerator = choose_accelerator(p, pr, &mut checks, &mut config);
        match accelerator {
            None => {
                p.set_accelerator(None);
            }
            Some(a) => {
                put(&mut config, "accelerator", a.as_str().into());
                if a == Accelerator::Tcg
                    && let Some(khz) = pr.tsc_khz
                {
                    put(&mut config, "tsc_early_khz", khz.to_string());
                }
                put(
                    &mut config,
                    "kernel_cmdline",
                    qemu::kernel_cmdline(&qemu::QemuShape {
                        accelerator: a,
                        cpus: cfg.cpus,
                        memory_mib: 0,
                        tsc_khz: pr.tsc_khz,
                        qmp: false,
                        broker: false,
                        egress: false,
                    }),
                );
                match probe_run(p, pr, a) {
                    Ok((mut r, result, boot, evidence)) => {
                        judge(&mut r, &pr.assets.kernel_release, &mut checks);
                        judge_steps(&result, &mut checks);
                        if let Some(ms) = boot {
                            put(&mut config, "probe_boot_ms", ms.to_string());
                        }
                        match evidence {
                            Ok(ev) => {
                                put(
                                    &mut config,
                                    "query_kvm",
                                    format!(
                                        "enabled={} present={}",
                                        ev.kvm_enabled, ev.kvm_present
                                    ),
                                );
                                ok(
                                    &mut checks,
                                    "accelerator",
                                    ev.consistent().map_err(|e| e.to_string()),
                                );
                                tier = tier_for(ev.ran());
                                put(&mut config, "accelerator_ran", ev.ran().as_str().into());
                            }
                            Err(e) => ok(&mut checks, "accelerator", Err(error_chain(&e))),
                        }
                        report = Some(r);
                    }
                    Err(e) => ok(&mut checks, "probe_run", Err(e)),
                }
                let uid = cfg.probe_uid;
                let left = processes_of_uid(uid);
                let dirs_left = p.reap_run_dirs();
                ok(
                    &mut checks,
                    "cleanup",
                    if left.is_empty() && dirs_left.run_dirs.is_empty() {
                        Ok(())
                    } else {
                        Err(format!(
                            "the probe run left processes of uid {uid} {left:?} or run directories {:?}",
                            dirs_left.run_dirs
                        ))
                    },
                );
                let passed = checks.values().all(|v| v == "ok");
                p.set_accelerator(if passed {
                    Some(a)
                } else {
                    fixed(cfg.accelerator)
                });
            }
        }
    }

    let available = evidence::availability("qemu", &checks);
    Probed {
        tier,
        evidence: Evidence {
            provider: "qemu".into(),
            isolation: tier,
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

fn fixed(c: AccelChoice) -> Option<Accelerator> {
    match c {
        AccelChoice::Tcg => Some(Accelerator::Tcg),
        AccelChoice::Kvm => Some(Accelerator::Kvm),
        AccelChoice::Auto => None,
    }
}

fn identify_qemu(path: &PathBuf) -> Result<BinaryIdentity, String> {
    let sha256 = sha256_file(path).map_err(|e| {
        format!("{e}: install qemu-system-x86 (scripts/install-deps) or set its path")
    })?;
    let running = Spawn::new(path, "/")
        .arg("-version")
        .as_nobody()
        .spawn()
        .map_err(|e| {
            format!(
                "cannot run {} -version: {}",
                path.display(),
                error_chain(&e)
            )
        })?;
    let out =
        capture(running, &CaptureLimits::new(4096, Duration::from_secs(10))).map_err(|e| {
            format!(
                "cannot run {} -version: {}",
                path.display(),
                error_chain(&e)
            )
        })?;
    if out.exit_code != Some(0) {
        return Err(format!(
            "{} -version failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let version = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_owned();
    Ok(BinaryIdentity {
        name: "qemu-system-x86_64".into(),
        path: path.display().to_string(),
        version,
        sha256,
    })
}

/// Hashes the kernel, initramfs and disk, checks them against the manifest, and lists them
/// (and the tools inside the run initramfs) as binaries.
fn check_assets(
    pr: &Prepared,
    binaries: &mut Vec<BinaryIdentity>,
    config: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    let a = &pr.assets;
    config.insert("assets".into(), a.dir.display().to_string());
    config.insert("kernel_release".into(), a.kernel_release.clone());
    if let Some(pkg) = a
        .manifest
        .lines()
        .find_map(|l| l.strip_prefix("kernel_package "))
    {
        config.insert("kernel_package".into(), pkg.to_owned());
    }
    config.insert("run_initrd".into(), pr.initrd.path.display().to_string());
    let mut problems = Vec::new();
    for (name, key, path, version) in [
        ("vmlinux", "vmlinux", &a.kernel, a.kernel_release.clone()),
        ("initramfs", "initramfs", &a.initramfs, "base".to_owned()),
        ("disk", "disk", &a.disk, a.image_identity.clone()),
    ] {
        match sha256_file(path) {
            Ok(sha) => {
                if a.manifest_sha256(key) != Some(sha.as_str()) {
                    problems.push(format!(
                        "{} does not match build/vm/manifest: rebuild with scripts/build-vm-assets --force",
                        path.display()
                    ));
                }
                binaries.push(BinaryIdentity {
                    name: name.into(),
                    path: path.display().to_string(),
                    version,
                    sha256: sha,
                });
            }
            Err(e) => problems.push(format!("cannot read {}: {e}", path.display())),
        }
    }
    binaries.push(BinaryIdentity {
        name: "run-initrd".into(),
        path: pr.initrd.path.display().to_string(),
        version: "base + tools".into(),
        sha256: pr.initrd.sha256.clone(),
    });
    binaries.extend(pr.initrd.tools.iter().cloned());
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// The run initramfs of trial runs and the runner in it, named in the evidence when the
/// runner is there. Not a check: runs without a trial step do not need it, and a trial run
/// without it is refused (`environment`) with the fix.
fn trial_evidence(
    p: &VmProvider,
    pr: &Prepared,
    binaries: &mut Vec<BinaryIdentity>,
    config: &mut BTreeMap<String, String>,
) {
    match p.for_trial(pr) {
        Ok(t) => {
            config.insert(
                "trial_run_initrd".into(),
                t.initrd.path.display().to_string(),
            );
            config.insert("trial_extra_memory_mib".into(), t.extra_mib.to_string());
            binaries.push(BinaryIdentity {
                name: "run-initrd-trial".into(),
                path: t.initrd.path.display().to_string(),
                version: "base + tools + plimsoll-trial-runner".into(),
                sha256: t.initrd.sha256.clone(),
            });
            binaries.extend(
                t.initrd
                    .tools
                    .iter()
                    .filter(|b| b.name == plimsoll_wire::trial_step::TRIAL_RUNNER)
                    .cloned(),
            );
        }
        Err(e) => {
            config.insert("trial_run_initrd".into(), format!("unavailable: {e}"));
        }
    }
}

/// Under `auto`, boots a bare guest with KVM (short budget) and keeps KVM only when QEMU says
/// KVM ran it; otherwise TCG. Records what happened.
fn choose_accelerator(
    p: &VmProvider,
    pr: &Prepared,
    checks: &mut BTreeMap<String, String>,
    config: &mut BTreeMap<String, String>,
) -> Option<Accelerator> {
    let cfg = p.config();
    match cfg.accelerator {
        AccelChoice::Tcg => {
            config.insert("kvm_attempt".into(), "not tried (accelerator = tcg)".into());
            Some(Accelerator::Tcg)
        }
        AccelChoice::Kvm | AccelChoice::Auto => {
            let attempt = try_kvm(p, pr);
            let outcome = match &attempt {
                Ok(()) => "booted under KVM (query-kvm: enabled)".to_owned(),
                Err(e) => format!("unusable: {e}"),
            };
            config.insert("kvm_attempt".into(), outcome);
            match (attempt, cfg.accelerator) {
                (Ok(()), _) => Some(Accelerator::Kvm),
                (Err(_), AccelChoice::Auto) => Some(Accelerator::Tcg),
                (Err(e), _) => {
                    checks.insert(
                        "kvm".into(),
                        format!("{e}: set the accelerator to auto or tcg to run under emulation (tier kernel)"),
                    );
                    None
                }
            }
        }
    }
}

fn try_kvm(p: &VmProvider, pr: &Prepared) -> Result<(), String> {
    VmProvider::kvm_device()?;
    let plan = probe_plan(
        p,
        "kvm",
        RunSpec::Project(Project {
            files: vec![],
            steps: vec![Step {
                name: None,
                run: "true".into(),
            }],
            artifacts: vec![],
        }),
    );
    let report = p
        .boot_plan(
            &plan,
            pr,
            Accelerator::Kvm,
            true,
            None,
            p.config().kvm_boot_timeout,
        )
        .map_err(|e| e.to_string())?;
    if let Err(c) = &report.cleanup {
        return Err(format!("cleanup failed: {}", error_chain(c)));
    }
    match (&report.answer, &report.accel) {
        (Answer::BootedOnly, Some(Ok(ev))) if ev.ran() == Accelerator::Kvm => Ok(()),
        (Answer::BootedOnly, Some(Ok(ev))) => Err(format!("QEMU ran the guest with {}", ev.ran())),
        (Answer::BootedOnly, Some(Err(e))) => Err(error_chain(e)),
        (Answer::NotBooted(why), _) => Err(format!("{why} ({})", report.diagnostics())),
        (Answer::BootTimedOut(budget), _) => Err(format!(
            "the guest did not boot within {} s ({})",
            budget.as_secs_f64(),
            report.diagnostics()
        )),
        (other, _) => Err(format!("unexpected: {other:?}")),
    }
}

type ProbeRun = (
    ProbeReport,
    RunResult,
    Option<u64>,
    Result<AccelEvidence, QmpError>,
);

/// One guest through the ordinary run path, with QEMU's monitor on: the probe, then a
/// JavaScript and a Python step.
fn probe_run(p: &VmProvider, pr: &Prepared, a: Accelerator) -> Result<ProbeRun, String> {
    let canary = canary(p)?;
    let mut probe_cmd = format!(
        "/opt/plimsoll/bin/plimsoll-probe --try-read {}",
        canary.display()
    );
    for w in TRY_WRITE {
        probe_cmd.push_str(&format!(" --try-write {w}"));
    }
    let spec = RunSpec::Project(Project {
        files: vec![],
        steps: vec![
            Step {
                name: Some("probe".into()),
                run: probe_cmd,
            },
            Step {
                name: Some("javascript".into()),
                run: "node -e 'console.log(\"ok\")'".into(),
            },
            Step {
                name: Some("python".into()),
                run: "python3 -I -c 'print(\"ok\")'".into(),
            },
        ],
        artifacts: vec![],
    });
    let plan = probe_plan(p, "run", spec);
    let mut report: BootReport = p.boot_job(&plan, pr, a, true).map_err(|e| e.to_string())?;
    if let Err(c) = &report.cleanup {
        return Err(format!(
            "the probe VM was not fully removed: {}",
            error_chain(c)
        ));
    }
    let accel = report.accel.take().unwrap_or(Err(QmpError::NoAnswer));
    let result = result_of(&report).map_err(|e| e.message())?;
    let first = result
        .steps
        .first()
        .ok_or_else(|| format!("the probe step did not run: {result:?}"))?;
    if first.exit_code != Some(0) {
        return Err(format!(
            "plimsoll-probe in the guest ended with {:?} (signal {:?}): {}",
            first.exit_code,
            first.signal,
            first.stderr.to_string_lossy().trim()
        ));
    }
    let r: ProbeReport = serde_json::from_slice(first.stdout.as_slice())
        .map_err(|e| format!("plimsoll-probe printed no report ({e})"))?;
    Ok((r, result, report.boot_ms, accel))
}

/// A host file the guest must not be able to read (it has no way to the host's files).
fn canary(p: &VmProvider) -> Result<PathBuf, String> {
    let dir = p.config().own_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join("canary");
    std::fs::write(&path, "plimsoll host file: a VM must never read this\n")
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// The JavaScript and Python steps printed `ok`.
fn judge_steps(r: &RunResult, checks: &mut BTreeMap<String, String>) {
    for (i, name) in [(1, "snippet.javascript"), (2, "snippet.python")] {
        let outcome = match r.steps.get(i) {
            Some(s) if s.exit_code == Some(0) && s.stdout.as_slice() == b"ok\n" => "ok".into(),
            Some(s) => format!(
                "gave exit {:?} signal {:?}, stdout {:?}, stderr {:?}",
                s.exit_code,
                s.signal,
                s.stdout.to_string_lossy(),
                s.stderr.to_string_lossy()
            ),
            None => "did not run".into(),
        };
        checks.insert(name.into(), outcome);
    }
}

/// What the guest's report must show when it runs `kernel_release`.
pub fn expectations(kernel_release: &str) -> Expectations {
    let strings = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
    Expectations {
        identity: Identity::Uid(SANDBOX_UID),
        capabilities: Capabilities {
            empty: strings(&["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]),
            may_be_absent: vec![],
            held: Vec::new(),
        },
        no_new_privs: NoNewPrivs::Set,
        seccomp: None,
        // Namespace identities inside a VM are the guest kernel's own; the initial namespaces
        // of every kernel have the same fixed numbers, so comparing them with the host's says
        // nothing. They are reported, not judged.
        namespaces: Namespaces::GuestKernel,
        filesystem: Some(Filesystem {
            rw_mounts: strings(&RW_MOUNTS),
            writable: strings(&WRITABLE),
            must_be_writable: strings(&WRITABLE),
        }),
        work_dir: None,
        host_files: true,
        shadow_unreadable: false,
        // QEMU gives the VM no network device.
        loopback_only: true,
        // The provider's three, and PWD, which the step's shell sets itself.
        environment: ENVIRONMENT
            .iter()
            .map(|(k, _)| (*k).to_owned())
            .chain(["PWD".to_owned()])
            .collect(),
        sockets_denied: false,
        limits: Some(Limits::Cgroup {
            memory_keys: strings(&["cgroup_v2.memory.max"]),
            memory: PROBE_MEMORY,
            pids_keys: strings(&["cgroup_v2.pids.max"]),
            pids: PROBE_PIDS,
        }),
        kernel: Some(Kernel::Guest {
            release: kernel_release.to_owned(),
        }),
    }
}

/// What a run's wall must show in the guest: [`expectations`] with the run's memory and
/// pids limits (the kernel check is the probe's alone: a wall does not carry it).
pub fn run_expectations(memory: u64, pids: u64) -> Expectations {
    let mut e = expectations("");
    if let Some(Limits::Cgroup {
        memory: m, pids: p, ..
    }) = &mut e.limits
    {
        (*m, *p) = (memory, pids);
    }
    e
}

/// Judges the guest's report by [`expectations`] (the one judging table,
/// `plimsoll_sandbox::judge`); clears `same_as_host`.
pub fn judge(r: &mut ProbeReport, kernel_release: &str, checks: &mut BTreeMap<String, String>) {
    let expected = expectations(kernel_release);
    checks.extend(judge::mark_and_judge(r, &expected, &HostView::read()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> ProbeReport {
        plimsoll_testing::report::meeting(&expectations("6.1.0-57-cloud-amd64"), &HostView::read())
    }

    /// The breach table is `plimsoll_sandbox::judge`'s; here, what only the VM expects: a
    /// good guest report passes, and namespace marks are cleared, never compared.
    #[test]
    fn a_good_report_passes_and_namespaces_are_not_compared() {
        let kernel = "6.1.0-57-cloud-amd64";
        let mut r = good();
        r.namespaces.insert(
            "net".into(),
            plimsoll_wire::NamespaceSeen {
                id: "net:[4026531840]".into(),
                same_as_host: Some(false),
            },
        );
        let mut checks = BTreeMap::new();
        judge(&mut r, kernel, &mut checks);
        let bad: Vec<_> = checks.iter().filter(|(_, v)| *v != "ok").collect();
        assert!(bad.is_empty(), "{bad:?}");
        assert!(!checks.contains_key("namespaces"), "{checks:?}");
        assert!(!checks.contains_key("seccomp"), "{checks:?}");
        assert_eq!(r.namespaces["net"].same_as_host, None);

        r.kernel_release = "6.18.44-other".into();
        judge(&mut r, kernel, &mut checks);
        assert_ne!(checks["kernel"], "ok");
    }
}
