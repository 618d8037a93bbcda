//! [`VmProvider`], the `qemu` provider: every run (snippet or project) is one fresh microVM
//! whose guest runs `plimsoll-agent`; the VM is destroyed when the run ends. A warm member
//! ([`VmMember`]) is such a VM booted ahead, its interpreter waiting for one snippet.

use std::fs;
use std::path::Path;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use plimsoll_sandbox::warm::{self, WarmMember, WarmPlan, WarmShape};
use plimsoll_sandbox::{
    Cause, LaunchError, LaunchPlan, Outcome, Probed, Provider, RunImage, Teardown, unix_ms_now,
};
use plimsoll_wire::{AgentJob, RunResult, RunSpec, Tier, TrialIds};

use crate::assets::{self, Assets, RunInitrd};
use crate::boot::{self, Answer, BootPlan, BootReport, Job, LOCK_FILE};
use crate::channel::GuestLimits;
use crate::config::{AccelChoice, VmConfig};
use crate::qemu::{self, QemuShape};
use crate::tier::{Accelerator, tier_for};

/// Guest RAM beyond the run's memory limit: the guest kernel, its init and the tools (the
/// run's cgroup inside the guest holds the limit itself).
pub const GUEST_OVERHEAD_MIB: u64 = 128;
/// QEMU's address space beyond guest RAM and the TCG cache: its code, libraries, thread
/// stacks and allocator arenas. Measured: VmPeak = guest RAM + TCG cache + about 650 MiB
/// (Debian's QEMU 7.2, 2 vCPUs).
pub const QEMU_ADDRESS_SLACK_MIB: u64 = 1024;
/// The agent's deadline is the run's timeout; the host waits this much longer for its
/// answer (the agent's own kill and clean-up take up to 4 s) before it kills the VM.
pub const AGENT_GRACE: Duration = Duration::from_secs(6);
/// Assumed worst channel throughput under TCG, bytes per second, for the answer's budget.
pub const CHANNEL_BYTES_PER_SEC: u64 = 8 << 20;
/// Bytes of the agent's answer beyond its content (JSON framing, names).
const ANSWER_SLACK: u64 = 1 << 20;
/// The ids of a trial inside the guest: the image's `sandbox` (1000, the run's uid, as for
/// every run) and `controller` (1001). A guest holds one run, so the host's leased pair
/// (`LaunchPlan::controller_uid`) is not needed inside it.
pub const GUEST_TRIAL_IDS: TrialIds = TrialIds {
    uid: crate::guest::SANDBOX_UID,
    gid: crate::guest::SANDBOX_UID,
    controller_uid: crate::guest::CONTROLLER_UID,
    controller_gid: crate::guest::CONTROLLER_UID,
};
/// Guest RAM a trial run gets beyond the runner's own size: the runner lives in the guest's
/// root overlay (a tmpfs, outside the run's cgroup) once the initramfs is gone; measured
/// (docs/vm-tier.md, "Trial runs").
pub const TRIAL_MARGIN_MIB: u64 = 32;

/// The files a run needs, made once (and again at each probe).
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub assets: Assets,
    pub initrd: RunInitrd,
    pub tsc_khz: Option<u64>,
    /// Guest RAM beyond [`GUEST_OVERHEAD_MIB`] and the run's memory limit (a trial run's
    /// initramfs carries the runner).
    pub extra_mib: u64,
}

/// The run initramfs of trial runs, made from a base run initramfs.
#[derive(Debug, Clone)]
struct TrialInitrd {
    /// What it was made from: the SHA-256 of the base run initramfs, and the runner file's
    /// size, modification time and inode (a rebuilt runner makes a new one).
    made_from: (String, u64, i64, u64),
    initrd: RunInitrd,
    extra_mib: u64,
}

/// What [`VmProvider::reap`] removed, and what it could not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// QEMU processes killed (pid, uid).
    pub killed: Vec<(i32, u32)>,
    /// Run directories removed.
    pub run_dirs: Vec<String>,
    /// What failed.
    pub errors: Vec<String>,
}

impl ReapReport {
    /// One line for evidence and logs.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "killed {} QEMU processes, removed {} run directories",
            self.killed.len(),
            self.run_dirs.len()
        );
        if !self.errors.is_empty() {
            s.push_str(&format!("; failed: {}", self.errors.join("; ")));
        }
        s
    }
}

/// Timings and memory of one run, for benchmarks.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunStats {
    /// QEMU start to the guest's hello, ms.
    pub boot_ms: u64,
    /// The guest's own uptime when its init started, ms.
    pub guest_uptime_at_init_ms: u64,
    /// The agent's run inside the guest, ms.
    pub agent_ms: u64,
    /// QEMU start to the answer, ms.
    pub total_ms: u64,
    /// QEMU's peak resident set, KiB.
    pub peak_rss_kib: u64,
}

/// The `qemu` provider.
#[derive(Debug)]
pub struct VmProvider {
    config: VmConfig,
    prepared: Mutex<Option<Prepared>>,
    trial: Mutex<Option<TrialInitrd>>,
    /// The accelerator the last successful probe found (or the configured one).
    accelerator: RwLock<Option<Accelerator>>,
    probing: Mutex<()>,
    reaped_at_start: ReapReport,
}

impl VmProvider {
    /// A provider with this configuration. Reaps first: kills QEMU processes of the
    /// provider's uids and removes run directories that a daemon killed mid-run left (see
    /// [`VmProvider::reap`]). Boots nothing.
    pub fn new(config: VmConfig) -> Self {
        let fixed = match config.accelerator {
            AccelChoice::Tcg => Some(Accelerator::Tcg),
            AccelChoice::Kvm => Some(Accelerator::Kvm),
            AccelChoice::Auto => None,
        };
        let mut p = VmProvider {
            config,
            prepared: Mutex::new(None),
            trial: Mutex::new(None),
            accelerator: RwLock::new(fixed),
            probing: Mutex::new(()),
            reaped_at_start: ReapReport::default(),
        };
        p.reaped_at_start = p.reap();
        p
    }

    /// The configuration.
    pub fn config(&self) -> &VmConfig {
        &self.config
    }

    /// What the reap at construction removed.
    pub fn reaped_at_start(&self) -> &ReapReport {
        &self.reaped_at_start
    }

    /// The accelerator runs use now: the configured one, or under `auto` the one the last
    /// probe booted a guest with (`None` before any probe).
    pub fn accelerator(&self) -> Option<Accelerator> {
        *self.accelerator.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_accelerator(&self, a: Option<Accelerator>) {
        *self.accelerator.write().unwrap_or_else(|p| p.into_inner()) = a;
    }

    pub(crate) fn probing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.probing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Kills every QEMU process (this provider's binary) of the provider's uids that no other
    /// engine holds (host-wide uid leases), then [`VmProvider::reap_run_dirs`], then removes
    /// old run initramfs files. Only for start-up, when no run of this daemon is in flight: a
    /// live run's QEMU has one of these uids too.
    pub fn reap(&self) -> ReapReport {
        let mut report = ReapReport::default();
        let qemu = fs::canonicalize(&self.config.qemu).unwrap_or_else(|_| self.config.qemu.clone());
        // A uid another engine on this host holds (its host-wide lease) may be running that
        // engine's VM: only uids whose lease we can take are ours to clear.
        let lease_dir = plimsoll_sandbox::lease_dir(&self.config.state_dir);
        let mut leases = std::collections::BTreeMap::new();
        let mut ours = |uid: u32| {
            if !(self.config.run_uids.contains(&uid) || uid == self.config.probe_uid) {
                return false;
            }
            leases
                .entry(uid)
                .or_insert_with(|| plimsoll_sandbox::try_lease(&lease_dir, uid).ok().flatten())
                .is_some()
        };
        let mut victims = Vec::new();
        if let Ok(dir) = fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                    continue;
                };
                let Ok(exe) = fs::read_link(format!("/proc/{pid}/exe")) else {
                    continue;
                };
                if exe != qemu {
                    continue;
                }
                let uid = fs::read_to_string(format!("/proc/{pid}/status"))
                    .ok()
                    .and_then(|s| {
                        s.lines()
                            .find_map(|l| l.strip_prefix("Uid:"))
                            .and_then(|v| v.split_whitespace().next()?.parse::<u32>().ok())
                    });
                if let Some(uid) = uid.filter(|u| ours(*u)) {
                    victims.push((pid, uid));
                }
            }
        }
        for (pid, uid) in victims {
            if let Some(p) = rustix::process::Pid::from_raw(pid) {
                match rustix::process::kill_process(p, rustix::process::Signal::KILL) {
                    Ok(()) => report.killed.push((pid, uid)),
                    Err(rustix::io::Errno::SRCH) => {}
                    Err(e) => report.errors.push(format!("cannot kill QEMU {pid}: {e}")),
                }
            }
        }
        drop(leases);
        // Wait (briefly) until they are gone, so their jails release the run directories.
        for (pid, _) in &report.killed {
            for _ in 0..200 {
                let alive = fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                    !s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                });
                if !alive {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let dirs = self.reap_run_dirs();
        report.run_dirs = dirs.run_dirs;
        report.errors.extend(dirs.errors);
        // Run initramfs files of earlier binaries (no run is in flight yet to use one).
        if let Ok(dir) = fs::read_dir(self.config.own_dir()) {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if (name.starts_with("initrd-") || name.starts_with(".initrd-"))
                    && let Err(err) = fs::remove_file(e.path())
                {
                    report
                        .errors
                        .push(format!("cannot remove {}: {err}", e.path().display()));
                }
            }
        }
        report
    }

    /// Removes every run directory under `<state_dir>/runs` that holds a `qemu.lock` no live
    /// run holds (a run holds its lock from before QEMU starts until its directory is gone,
    /// and the lock dies with the daemon). Safe while runs are in flight.
    pub fn reap_run_dirs(&self) -> ReapReport {
        let mut report = ReapReport::default();
        let runs = self.config.runs_root();
        if let Ok(dir) = fs::read_dir(&runs) {
            for e in dir.flatten() {
                let path = e.path();
                let lock = path.join(LOCK_FILE);
                let Ok(f) = fs::OpenOptions::new().read(true).open(&lock) else {
                    continue;
                };
                match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                    Ok(()) => {}
                    // Held: a live run.
                    Err(_) => continue,
                }
                drop(f);
                match boot::remove_run_dir(&path) {
                    Ok(()) => report
                        .run_dirs
                        .push(e.file_name().to_string_lossy().into_owned()),
                    Err(err) => report
                        .errors
                        .push(format!("cannot remove {}: {err}", path.display())),
                }
            }
        }
        report
    }

    /// Makes the run initramfs and reads the host facts, or returns what was made before.
    pub(crate) fn prepared(&self, fresh: bool) -> Result<Prepared, String> {
        let mut slot = self.prepared.lock().unwrap_or_else(|p| p.into_inner());
        if !fresh && let Some(p) = slot.as_ref() {
            return Ok(p.clone());
        }
        let assets = Assets::open(&self.config.assets).map_err(|e| error_chain(&e))?;
        let initrd =
            assets::build_run_initrd(&assets.initramfs, &self.tools(), &self.config.own_dir())
                .map_err(|e| error_chain(&e))?;
        // Only TCG guests need it; a KVM-only host without the line is fine.
        let tsc_khz = qemu::host_tsc_khz().ok();
        let p = Prepared {
            assets,
            initrd,
            tsc_khz,
            extra_mib: 0,
        };
        *slot = Some(p.clone());
        Ok(p)
    }

    /// The tools of every run initramfs, as configured.
    fn tools(&self) -> [(&'static str, &std::path::Path); 3] {
        [
            ("plimsoll-guest-init", &self.config.guest_init),
            ("plimsoll-agent", &self.config.agent),
            ("plimsoll-probe", &self.config.probe),
        ]
    }

    /// `prepared` for a run with a trial step: a second run initramfs, the tools and
    /// `plimsoll-trial-runner` (stripped like the others; ~34 MB of a ~180 MB debug build),
    /// made on first use (a trial run, or a probe) and kept while the base initramfs and the
    /// runner file are unchanged; and the guest RAM the runner needs. A missing runner
    /// refuses the run (`environment`) before anything starts.
    pub(crate) fn for_trial(&self, prepared: &Prepared) -> Result<Prepared, LaunchError> {
        use std::os::unix::fs::MetadataExt as _;
        let runner = &self.config.trial_runner;
        let meta = fs::metadata(runner).map_err(|e| {
            LaunchError::environment(format!(
                "the trial runner {} is unreadable ({e}): build it with `cargo build -p plimsoll-trial`, or set [qemu] trial_runner to its path",
                runner.display()
            ))
        })?;
        let made_from = (
            prepared.initrd.sha256.clone(),
            meta.len(),
            meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
            meta.ino(),
        );
        let mut slot = self.trial.lock().unwrap_or_else(|p| p.into_inner());
        let t = match slot.as_ref() {
            Some(t) if t.made_from == made_from => t.clone(),
            _ => {
                let [a, b, c] = self.tools();
                let initrd = assets::build_run_initrd(
                    &prepared.assets.initramfs,
                    &[a, b, c, (plimsoll_wire::trial_step::TRIAL_RUNNER, runner)],
                    &self.config.own_dir(),
                )
                .map_err(|e| LaunchError::environment(error_chain(&e)))?;
                let size = |p: &std::path::Path| fs::metadata(p).map_or(0, |m| m.len());
                let runner_bytes = size(&initrd.path).saturating_sub(size(&prepared.initrd.path));
                let t = TrialInitrd {
                    made_from,
                    initrd,
                    extra_mib: runner_bytes.div_ceil(1 << 20) + TRIAL_MARGIN_MIB,
                };
                *slot = Some(t.clone());
                t
            }
        };
        Ok(Prepared {
            initrd: t.initrd,
            extra_mib: t.extra_mib,
            ..prepared.clone()
        })
    }

    /// `/dev/kvm`'s device number.
    pub(crate) fn kvm_device() -> Result<u64, String> {
        use std::os::unix::fs::FileTypeExt as _;
        use std::os::unix::fs::MetadataExt as _;
        let m = fs::metadata("/dev/kvm").map_err(|e| format!("/dev/kvm: {e}"))?;
        if !m.file_type().is_char_device() {
            return Err("/dev/kvm is not a character device".into());
        }
        Ok(m.rdev())
    }

    /// Boots one VM for `plan` with `accelerator`; `qmp` adds QEMU's monitor (probes).
    pub(crate) fn boot_plan(
        &self,
        plan: &LaunchPlan,
        prepared: &Prepared,
        accelerator: Accelerator,
        qmp: bool,
        job: Option<Job>,
        boot_timeout: Duration,
    ) -> Result<BootReport, LaunchError> {
        let spec = self.boot_spec(plan, prepared, accelerator, qmp, job, boot_timeout)?;
        boot::boot(spec).map_err(|e| LaunchError::environment(error_chain(&e)))
    }

    /// What [`VmProvider::boot_plan`] boots.
    fn boot_spec<'a>(
        &'a self,
        plan: &'a LaunchPlan,
        prepared: &'a Prepared,
        accelerator: Accelerator,
        qmp: bool,
        job: Option<Job>,
        boot_timeout: Duration,
    ) -> Result<BootPlan<'a>, LaunchError> {
        let runs = self.config.runs_root();
        if plan.run_dir.parent() != Some(runs.as_path()) {
            return Err(LaunchError::environment(format!(
                "run directory {} is not under {}: the qemu provider's state_dir must be the engine's",
                plan.run_dir.display(),
                runs.display()
            )));
        }
        let kvm_device = match accelerator {
            Accelerator::Kvm => Some(Self::kvm_device().map_err(LaunchError::environment)?),
            Accelerator::Tcg => None,
        };
        if accelerator == Accelerator::Tcg && prepared.tsc_khz.is_none() {
            return Err(LaunchError::environment(
                qemu::host_tsc_khz()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
            ));
        }
        let memory_mib =
            plan.limits.memory_bytes.div_ceil(1 << 20) + GUEST_OVERHEAD_MIB + prepared.extra_mib;
        let shape = QemuShape {
            accelerator,
            cpus: self.config.cpus.max(1),
            memory_mib,
            tsc_khz: prepared.tsc_khz,
            qmp,
            broker: plan.broker.is_some(),
            egress: plan.broker.as_ref().is_some_and(|b| b.egress()),
        };
        let tb = match accelerator {
            Accelerator::Tcg => qemu::TCG_TB_MIB,
            Accelerator::Kvm => 0,
        };
        Ok(BootPlan {
            qemu: &self.config.qemu,
            kernel: &prepared.assets.kernel,
            initrd: &prepared.initrd.path,
            disk: disk_for(plan.image.as_ref(), &prepared.assets)?,
            run_dir: &plan.run_dir,
            uid: plan.uid,
            gid: plan.gid,
            shape,
            kvm_device,
            address_space: (memory_mib + tb + QEMU_ADDRESS_SLACK_MIB) << 20,
            boot_timeout,
            job,
            broker: plan.broker.as_ref(),
        })
    }

    /// Boots a guest for `plan`'s job. A guest that said no hello within the boot budget, or
    /// whose agent said no wall within it after the limits, is booted once more: nothing of
    /// the job was sent to it, so nothing of the run happened. (A TCG guest here boots in
    /// 2.5–9.5 s even on a loaded host, yet about one boot in a few hundred hangs before its
    /// hello, silently, and once in CI one hung after it, before its wall, which normally
    /// comes within 200 ms: the retry turns that into a slower run, not a refusal.) Any other
    /// failure to boot, and a wall that came and does not pass, is not retried: it would
    /// fail again.
    pub(crate) fn boot_job(
        &self,
        plan: &LaunchPlan,
        prepared: &Prepared,
        accelerator: Accelerator,
        qmp: bool,
    ) -> Result<BootReport, LaunchError> {
        let budget = self.config.boot_timeout;
        let boot = || {
            let job = job_for(plan)?;
            self.boot_plan(plan, prepared, accelerator, qmp, Some(job), budget)
        };
        let first = boot()?;
        if !hung_before_the_job(&first.answer) || first.cleanup.is_err() {
            return Ok(first);
        }
        tracing::warn!(
            run_id = %plan.run_id,
            budget_s = budget.as_secs_f64(),
            answer = ?first.answer,
            diagnostics = %first.diagnostics(),
            "the guest hung before its hello or its agent's wall; booting it once more (nothing of the job was sent)"
        );
        boot()
    }

    /// What every boot of a run needs first: root, the run initramfs (a trial's with the
    /// runner), and the accelerator the probe chose.
    fn ready_to_boot(&self, trial: bool) -> Result<(Prepared, Accelerator), LaunchError> {
        if !rustix::process::geteuid().is_root() {
            return Err(LaunchError::environment(
                "the qemu provider must run as root (it jails QEMU in a mount namespace under the run's uid): start the daemon as root",
            ));
        }
        let mut prepared = self.prepared(false).map_err(LaunchError::environment)?;
        if trial {
            prepared = self.for_trial(&prepared)?;
        }
        let accelerator = self.accelerator().ok_or_else(|| {
            LaunchError::environment(
                "the qemu provider has not been probed yet: its accelerator is not known",
            )
        })?;
        Ok((prepared, accelerator))
    }

    /// Makes one warm member: a VM booted for `plan`'s shape whose agent has said its wall
    /// (judged as a run's would be) and whose interpreter waits for the code.
    pub fn make_member(&self, plan: &WarmPlan) -> Result<VmMember, LaunchError> {
        self.make_member_expecting(plan, |_| {})
    }

    /// [`VmProvider::make_member`], with the wall the member must show changed by `adjust`
    /// first: a wall the guest does not show is refused as a wrong one is (the tests prove
    /// the judge with a real guest so).
    pub fn make_member_expecting(
        &self,
        plan: &WarmPlan,
        adjust: impl FnOnce(&mut plimsoll_sandbox::judge::Expectations),
    ) -> Result<VmMember, LaunchError> {
        let (prepared, accelerator) = self.ready_to_boot(false)?;
        let member = plimsoll_sandbox::warm::member_plan(plan);
        let mut job = job_for(&member)?;
        job.limits.warm = Some(plan.shape.language);
        adjust(&mut job.wall);
        let spec = self.boot_spec(
            &member,
            &prepared,
            accelerator,
            false,
            None,
            self.config.boot_timeout,
        )?;
        let made = boot::make_member(&spec, &job.limits, &job.wall)
            .map_err(|e| LaunchError::environment(error_chain(&e)))?;
        match made {
            Ok(waiting) => Ok(VmMember {
                waiting,
                uid: member.uid,
                shape: plan.shape,
                max_timeout: plan.max_timeout,
                image: plan.image.clone(),
            }),
            Err(report) => {
                let why = match &report.answer {
                    Answer::BootTimedOut(budget) => LaunchError::environment(format!(
                        "the member's VM did not boot within {} s ({})",
                        budget.as_secs_f64(),
                        report.diagnostics()
                    )),
                    _ => match result_of(&report) {
                        Err(e) => e,
                        Ok(_) => LaunchError::environment(format!(
                            "the member's VM answered before it was given a job ({})",
                            report.diagnostics()
                        )),
                    },
                };
                Err(why.after_cleanup(report.cleanup))
            }
        }
    }

    /// Opens a session's VM for `plan` (docs/sessions.md): booted as a run's, its agent
    /// (`plimsoll-agent --wall-first --session LANGUAGE`) says its wall (judged as a run's
    /// is) and that its interpreter is ready; QEMU is killed at `lifetime` at the latest.
    pub fn open_session_vm(
        &self,
        plan: &LaunchPlan,
        lifetime: Duration,
    ) -> Result<crate::session::VmSession, LaunchError> {
        if plan.privileges.is_trial() {
            return Err(LaunchError::not_started(
                plimsoll_wire::Reason::Unsupported,
                "a session takes no trial step",
            ));
        }
        let (prepared, accelerator) = self.ready_to_boot(false)?;
        let language = match &plan.spec {
            RunSpec::Snippet(s) => s.language,
            RunSpec::Project(_) => plimsoll_wire::Language::Python,
        };
        let mut job = job_for(plan)?;
        job.limits.session = Some(language);
        let spec = self.boot_spec(
            plan,
            &prepared,
            accelerator,
            false,
            None,
            self.config.boot_timeout,
        )?;
        let opened = boot::open_session(
            &spec,
            &job.limits,
            &job.wall,
            lifetime,
            crate::session::READY_WITHIN,
        )
        .map_err(|e| LaunchError::environment(error_chain(&e)))?;
        match opened {
            Ok(vm) => Ok(crate::session::VmSession::new(vm, plan.clone(), job.wall)),
            Err(report) => {
                let why = match &report.answer {
                    Answer::NotWaiting(why) => LaunchError::environment(format!(
                        "the session's agent did not say it is ready: {why} ({})",
                        report.diagnostics()
                    )),
                    Answer::WallRefused(why) | Answer::WallTimedOut(why) => {
                        LaunchError::not_started(
                            plimsoll_wire::Reason::Environment,
                            format!(
                                "the session's wall was refused: {why} ({})",
                                report.diagnostics()
                            ),
                        )
                    }
                    Answer::BootTimedOut(budget) => LaunchError::environment(format!(
                        "the session's VM did not boot within {} s ({})",
                        budget.as_secs_f64(),
                        report.diagnostics()
                    )),
                    Answer::NotBooted(why) | Answer::Lost(why) => {
                        LaunchError::environment(format!(
                            "the session's VM did not open: {why} ({})",
                            report.diagnostics()
                        ))
                    }
                    other => LaunchError::environment(format!(
                        "the session's VM did not open: {other:?} ({})",
                        report.diagnostics()
                    )),
                };
                Err(why.after_cleanup(report.cleanup))
            }
        }
    }

    /// Runs `plan` and also returns its timings and QEMU's peak memory.
    pub fn run_measured(&self, plan: &LaunchPlan) -> Result<(Outcome, RunStats), LaunchError> {
        let (prepared, accelerator) = self.ready_to_boot(plan.privileges.is_trial())?;
        let report = self.boot_job(plan, &prepared, accelerator, false)?;
        let ended = unix_ms_now();
        let stats = stats_of(&report, ended);
        let result = result_of(&report)?;
        if let Err(c) = &report.cleanup {
            return Err(LaunchError::may_have_run(format!(
                "the run ended but its VM was not fully removed: {}",
                error_chain(c)
            )));
        }
        Ok((
            Outcome {
                result,
                started_unix_ms: report.started_unix_ms,
                ended_unix_ms: ended,
            },
            stats,
        ))
    }
}

fn stats_of(r: &BootReport, ended_unix_ms: u64) -> RunStats {
    let secs = |m: Option<&std::collections::BTreeMap<String, String>>, k: &str| {
        m.and_then(|m| m.get(k))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0, |s| (s * 1000.0) as u64)
    };
    let (record, agent_ms) = match &r.answer {
        Answer::Exited { record, .. } => (
            Some(record),
            record
                .get("agent_ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        ),
        _ => (None, 0),
    };
    RunStats {
        boot_ms: r.boot_ms.unwrap_or(0),
        guest_uptime_at_init_ms: secs(r.hello.as_ref(), "uptime_s")
            .max(secs(record, "uptime_init_s")),
        agent_ms,
        total_ms: ended_unix_ms.saturating_sub(r.started_unix_ms),
        peak_rss_kib: r.peak_rss_kib.unwrap_or(0),
    }
}

/// The agent's job and the guest's limits for a plan.
/// The disk a plan's guest boots: the assets' own when the plan's image is the one they were
/// made from (or the plan names none: an operator tool's), else the image's own disk. A plan
/// whose image has neither is refused before anything starts (the engine routes it
/// elsewhere first: [`Provider::takes_image`]).
fn disk_for<'a>(image: Option<&'a RunImage>, assets: &'a Assets) -> Result<&'a Path, LaunchError> {
    match image {
        None => Ok(&assets.disk),
        Some(i) if i.identity == assets.image_identity => Ok(&assets.disk),
        Some(i) => i.disk.as_deref().ok_or_else(|| {
            LaunchError::not_started(
                plimsoll_wire::Reason::Unsupported,
                plimsoll_sandbox::Unsupported::NoDisk(i.name.clone()),
            )
        }),
    }
}

/// Whether the guest hung before anything of the job was sent to it (no hello, or no wall
/// after the limits), so that booting it once more cannot run any of the job twice.
fn hung_before_the_job(answer: &Answer) -> bool {
    matches!(answer, Answer::BootTimedOut(_) | Answer::WallTimedOut(_))
}

pub(crate) fn job_for(plan: &LaunchPlan) -> Result<Job, LaunchError> {
    let l = &plan.limits;
    let trial = plan.privileges.is_trial();
    let job = AgentJob {
        spec: plan.spec.clone(),
        work_dir: "/work".into(),
        output_bytes: l.output_bytes,
        artifact_bytes: l.artifact_bytes,
        deadline_ms: l.timeout.as_millis() as u64,
        trial: trial.then_some(GUEST_TRIAL_IDS),
    };
    let json = serde_json::to_vec(&job)
        .map_err(|e| LaunchError::environment(format!("cannot encode the agent job: {e}")))?;
    let (steps, artifacts) = match &plan.spec {
        RunSpec::Snippet(_) => (1u64, 0u64),
        RunSpec::Project(p) => (p.steps.len() as u64, p.artifacts.len() as u64),
    };
    // JSON may spell one byte as six (`\u0000`).
    let content = 2 * l.output_bytes * (steps + 1) + l.artifact_bytes * artifacts;
    let answer_max = content.saturating_mul(6).saturating_add(ANSWER_SLACK);
    let transfer = Duration::from_millis(answer_max.saturating_mul(1000) / CHANNEL_BYTES_PER_SEC);
    Ok(Job {
        limits: GuestLimits {
            memory_bytes: l.memory_bytes,
            pids: l.pids,
            work_bytes: l.disk_bytes / 4 * 3,
            tmp_bytes: l.disk_bytes / 4,
            trial,
            warm: None,
            session: None,
        },
        json,
        answer_timeout: l.timeout + AGENT_GRACE + transfer,
        answer_max: usize::try_from(answer_max).unwrap_or(usize::MAX),
        // A trial's agent starts as uid 0 holding exactly CAP_SETUID and CAP_SETGID.
        wall: {
            let run = crate::probe::run_expectations(l.memory_bytes, l.pids);
            if trial {
                plimsoll_sandbox::wall::for_trial(&run)
            } else {
                run
            }
        },
    })
}

/// The run's result from what the VM said, or why there is none.
pub(crate) fn result_of(r: &BootReport) -> Result<RunResult, LaunchError> {
    match &r.answer {
        Answer::NotBooted(why) => Err(LaunchError::environment(format!(
            "the VM did not boot: {why} ({})",
            r.diagnostics()
        ))),
        Answer::BootTimedOut(budget) => Err(LaunchError::environment(format!(
            "the VM did not boot: the guest did not boot within {} s, twice ({})",
            budget.as_secs_f64(),
            r.diagnostics()
        ))),
        Answer::BootedOnly => Err(LaunchError::may_have_run("the VM was given no job")),
        Answer::WallRefused(why) | Answer::WallTimedOut(why) => Err(LaunchError::not_started(
            plimsoll_wire::Reason::Environment,
            format!(
                "the guest's agent was not handed its job: {why} ({})",
                r.diagnostics()
            ),
        )),
        Answer::NotWaiting(why) => Err(LaunchError::environment(format!(
            "the member's interpreter did not come to wait for its code: {why} ({})",
            r.diagnostics()
        ))),
        Answer::Exited {
            code: Some(0),
            stdout,
            ..
        } => RunResult::from_agent(stdout)
            .map(|result| RunResult {
                wall: r.wall.clone(),
                ..result
            })
            .map_err(|e| {
                LaunchError::may_have_run(format!(
                    "the agent's answer is not a result ({e}; {} bytes): check plimsoll-agent",
                    stdout.len()
                ))
            }),
        Answer::Exited {
            code: Some(code),
            stderr,
            ..
        } => {
            let text = String::from_utf8_lossy(stderr);
            let line = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim();
            Err(LaunchError::may_have_run(format!(
                "the agent could not do the job (exit {code}): {line}"
            )))
        }
        Answer::Exited { signal, .. } => Ok(RunResult {
            signal: *signal,
            start: None,
            member_age_ms: None,
            ..RunResult::default()
        }),
        Answer::TimedOut => Ok(RunResult {
            timed_out: true,
            signal: Some(libc::SIGKILL),
            start: None,
            member_age_ms: None,
            ..RunResult::default()
        }),
        Answer::Lost(why) => Err(LaunchError::may_have_run(format!(
            "{why} ({})",
            r.diagnostics()
        ))),
    }
}

pub(crate) use plimsoll_sandbox::error_chain;

/// A warm member at qemu (docs/warm-pools.md): a VM booted ahead, its agent's wall judged,
/// its interpreter started in the guest and waiting. A claim sends the one job; the VM is
/// powered off and removed after the answer, off the answer's path.
#[derive(Debug)]
pub struct VmMember {
    waiting: boot::WaitingVm,
    uid: u32,
    shape: WarmShape,
    max_timeout: Duration,
    image: Option<RunImage>,
}

impl WarmMember for VmMember {
    fn uid(&self) -> u32 {
        self.uid
    }

    fn run(self: Box<Self>, plan: &LaunchPlan) -> Result<(Outcome, Teardown), LaunchError> {
        let VmMember {
            waiting,
            uid,
            shape,
            max_timeout,
            image,
        } = *self;
        let job = warm::check_claim(
            plan,
            &shape,
            uid,
            max_timeout,
            false,
            image.as_ref().map(|i| i.identity.as_str()),
        )
        .map_err(|e| LaunchError::not_started(plimsoll_wire::Reason::Environment, e))
        .and_then(|_| job_for(plan));
        let job = match job {
            Ok(j) => j,
            Err(e) => return Err(e.after_cleanup(waiting.discard())),
        };
        let (mut report, ending) = waiting.run(&job);
        let ended_unix_ms = unix_ms_now();
        let started_unix_ms = report.started_unix_ms;
        let outcome = |result| Outcome {
            result,
            started_unix_ms,
            ended_unix_ms,
        };
        // The answer came whole: the power-off and removal are off the answer's path.
        if matches!(report.answer, Answer::Exited { code: Some(0), .. })
            && let Ok(result) = result_of(&report)
        {
            let teardown = Teardown::new(move || ending.finish().map_err(Cause::from));
            return Ok((outcome(result), teardown));
        }
        ending.finish_into(&mut report);
        let result = result_of(&report)?;
        if let Err(c) = &report.cleanup {
            return Err(LaunchError::may_have_run(format!(
                "the run ended but its VM was not fully removed: {}",
                error_chain(c)
            )));
        }
        Ok((outcome(result), Teardown::new(|| Ok(()))))
    }

    fn discard(self: Box<Self>) -> Result<(), Cause> {
        self.waiting.discard().map_err(Cause::from)
    }
}

impl Provider for VmProvider {
    fn name(&self) -> &str {
        "qemu"
    }

    fn nominal_tier(&self) -> Tier {
        match self.config.accelerator {
            AccelChoice::Tcg => tier_for(Accelerator::Tcg),
            AccelChoice::Kvm | AccelChoice::Auto => tier_for(Accelerator::Kvm),
        }
    }

    fn cost(&self) -> u32 {
        match self.accelerator() {
            Some(Accelerator::Kvm) => 400,
            _ => 4000,
        }
    }

    fn supports(&self, _spec: &RunSpec) -> Result<(), plimsoll_sandbox::Unsupported> {
        Ok(())
    }

    /// The VM boots a disk: the assets' own (made from the image they name), or one made
    /// from the image itself.
    fn takes_image(&self, image: &RunImage) -> Result<(), plimsoll_sandbox::Unsupported> {
        // Until the first probe prepared the assets, the disk they hold is not known; the
        // provider is not offered then anyway.
        let assets_image = self
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|p| p.assets.image_identity.clone());
        if image.disk.is_some() || assets_image.is_none_or(|a| a == image.identity) {
            return Ok(());
        }
        Err(plimsoll_sandbox::Unsupported::NoDisk(image.name.clone()))
    }

    fn probe(&self) -> Probed {
        crate::probe::probe(self)
    }

    fn run(&self, plan: &LaunchPlan) -> Result<Outcome, LaunchError> {
        self.run_measured(plan).map(|(o, _)| o)
    }

    /// A run with a grant gets a second virtio-serial port, `plimsoll.broker`, whose host
    /// end the broker serves; the guest init relays it to `/run/plimsoll/broker.sock`.
    /// A run with an egress grant gets a third port, `plimsoll.egress`: the guest init listens
    /// on the proxy endpoint and carries each connection as a stream of it; the host hands
    /// each stream to the broker.
    fn supports_egress(&self) -> bool {
        true
    }

    fn supports_broker(&self) -> bool {
        true
    }

    fn warms(&self) -> bool {
        true
    }

    /// A session is one VM booted as a run's, its agent serving calls relayed over the
    /// channel; its wall is said by the agent inside the guest, at open and per call.
    fn opens_sessions(&self) -> bool {
        true
    }

    fn open_session(
        &self,
        plan: &LaunchPlan,
        lifetime: Duration,
    ) -> Result<Box<dyn plimsoll_sandbox::SessionSandbox>, LaunchError> {
        Ok(Box::new(self.open_session_vm(plan, lifetime)?))
    }

    fn warm(&self, plan: &WarmPlan) -> Result<Box<dyn WarmMember>, LaunchError> {
        Ok(Box::new(self.make_member(plan)?))
    }

    /// The accelerator the probe chose is known only from a probe: cached evidence names it.
    fn adopt(&self, evidence: &plimsoll_wire::Evidence) -> Result<(), plimsoll_sandbox::Stale> {
        let a = match evidence.config.get("accelerator").map(String::as_str) {
            Some("kvm") => Accelerator::Kvm,
            Some("tcg") => Accelerator::Tcg,
            other => {
                return Err(plimsoll_sandbox::Stale::NoAccelerator(
                    other.map(str::to_owned),
                ));
            }
        };
        self.set_accelerator(Some(a));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plimsoll_sandbox::ResolvedLimits;
    use plimsoll_wire::{Language, Snippet};

    #[test]
    fn only_a_guest_that_hung_before_the_job_is_booted_again() {
        assert!(hung_before_the_job(&Answer::BootTimedOut(
            Duration::from_secs(1)
        )));
        assert!(hung_before_the_job(&Answer::WallTimedOut("no wall".into())));
        for other in [
            Answer::WallRefused("a wall that does not pass".into()),
            Answer::NotBooted("no kernel".into()),
            Answer::TimedOut,
            Answer::Lost("the guest died after the job".into()),
            Answer::BootedOnly,
        ] {
            assert!(!hung_before_the_job(&other), "{other:?}");
        }
    }

    fn plan() -> LaunchPlan {
        LaunchPlan {
            image: None,
            run_id: "r".into(),
            request_id: "q".into(),
            privileges: plimsoll_sandbox::Privileges::Unprivileged,
            spec: RunSpec::Snippet(Snippet {
                language: Language::Python,
                code: "print(1)".into(),
            }),
            limits: ResolvedLimits {
                timeout: Duration::from_secs(10),
                memory_bytes: 256 << 20,
                output_bytes: 1 << 20,
                pids: 64,
                disk_bytes: 64 << 20,
                artifact_bytes: 1 << 20,
            },
            uid: 5,
            gid: 5,
            controller_uid: 5 + 1,
            controller_gid: 5 + 1,
            run_dir: "/x/runs/r".into(),
            broker: None,
            tap: None,
        }
    }

    #[test]
    fn the_job_carries_the_limits() {
        let j = job_for(&plan()).unwrap();
        assert_eq!(j.limits.memory_bytes, 256 << 20);
        assert_eq!(j.limits.pids, 64);
        assert_eq!(j.limits.work_bytes + j.limits.tmp_bytes, 64 << 20);
        let job: AgentJob = serde_json::from_slice(&j.json).unwrap();
        assert_eq!(job.deadline_ms, 10_000);
        assert_eq!(job.work_dir, "/work");
        assert!(j.answer_timeout > Duration::from_secs(16));
    }

    fn trial_spec() -> RunSpec {
        RunSpec::Project(plimsoll_wire::Project {
            files: vec![],
            steps: vec![
                plimsoll_wire::Step {
                    name: None,
                    run: "id -u".into(),
                },
                plimsoll_wire::Step {
                    name: None,
                    run: "plimsoll-trial-runner --scenario s.json -- node a.js".into(),
                },
            ],
            artifacts: vec![],
        })
    }

    #[test]
    fn a_trial_job_carries_the_guest_ids_and_says_so_in_the_limits() {
        let j = job_for(&plan()).unwrap();
        assert!(!j.limits.trial);
        let job: AgentJob = serde_json::from_slice(&j.json).unwrap();
        assert_eq!(job.trial, None);
        let mut p = plan();
        p.spec = trial_spec();
        // The steps alone decide nothing here: the plan's privileges do (the engine's plan()).
        let j = job_for(&p).unwrap();
        assert!(!j.limits.trial);
        p.privileges = plimsoll_sandbox::Privileges::for_spec(&p.spec);
        let j = job_for(&p).unwrap();
        assert!(j.limits.trial);
        let job: AgentJob = serde_json::from_slice(&j.json).unwrap();
        assert_eq!(
            job.trial,
            Some(TrialIds {
                uid: 1000,
                gid: 1000,
                controller_uid: 1001,
                controller_gid: 1001
            })
        );
    }

    /// Cached evidence sets the accelerator a probe would have chosen (with `auto`, nothing
    /// else knows it, and a run is refused until it is set); evidence naming none is not
    /// taken.
    #[test]
    fn cached_evidence_sets_the_accelerator() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let p = VmProvider::new(VmConfig::new(
            d.join("assets"),
            d.join("plimsoll-agent"),
            d.join("plimsoll-probe"),
            d.join("plimsoll-guest-init"),
            d.join("state"),
            2_401_999,
            2_401_990..2_401_991,
        ));
        assert_eq!(p.accelerator(), None);
        let mut evidence = plimsoll_wire::Evidence {
            provider: "qemu".into(),
            isolation: Tier::Kernel,
            config: [("accelerator".to_string(), "tcg".to_string())].into(),
            binaries: vec![],
            probe: None,
            checks: Default::default(),
            environment: "sha256:abc".into(),
            checked_unix_ms: 1,
        };
        p.adopt(&evidence).unwrap();
        assert_eq!(p.accelerator(), Some(Accelerator::Tcg));
        evidence.config.clear();
        assert!(p.adopt(&evidence).is_err());
    }

    /// A provider over fake assets (nothing boots): the base run initramfs and the trial one.
    #[test]
    fn a_trial_run_gets_its_own_initrd_and_more_memory_or_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let assets = d.join("assets");
        fs::create_dir(&assets).unwrap();
        for f in ["vmlinux", "initramfs.cpio.gz", "disk.ext4"] {
            fs::write(assets.join(f), b"x").unwrap();
        }
        fs::write(assets.join("kernel-release"), "6.1.0-57-cloud-amd64\n").unwrap();
        fs::write(assets.join("image-identity"), "sha256:abc\n").unwrap();
        fs::write(assets.join("manifest"), "# plimsoll-vm-assets/v1\n").unwrap();
        let tool = |name: &str, bytes: &[u8]| {
            let p = d.join(name);
            fs::write(&p, bytes).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let mut c = VmConfig::new(
            assets,
            tool("plimsoll-agent", b"agent"),
            tool("plimsoll-probe", b"probe"),
            tool("plimsoll-guest-init", b"init"),
            d.join("state"),
            2_401_999,
            2_401_990..2_401_991,
        );
        c.accelerator = crate::AccelChoice::Tcg;
        let p = VmProvider::new(c);
        let base = p.prepared(false).unwrap();
        assert_eq!(base.extra_mib, 0);

        // No runner: refused before anything starts, with the fix.
        match p.for_trial(&base) {
            Err(e @ LaunchError::NotStarted { .. }) => {
                let (reason, message) = (e.not_dispatched().expect("not started"), e.message());
                assert_eq!(reason, plimsoll_wire::Reason::Environment);
                assert!(
                    message.contains("cargo build -p plimsoll-trial"),
                    "{message}"
                );
                assert!(message.contains("[qemu] trial_runner"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let mut plan = plan();
        plan.spec = trial_spec();
        plan.run_dir = d.join("state/runs/r");
        assert!(matches!(p.run(&plan), Err(LaunchError::NotStarted { .. })));
        assert!(!plan.run_dir.exists());

        // A 3 MiB runner: a second initrd with it, 3 + margin MiB more guest RAM, cached.
        tool("plimsoll-trial-runner", &vec![7u8; (3 << 20) - 4096]);
        let t = p.for_trial(&base).unwrap();
        assert_ne!(t.initrd.path, base.initrd.path);
        assert_eq!(t.extra_mib, 3 + TRIAL_MARGIN_MIB);
        let bytes = fs::read(&t.initrd.path).unwrap();
        let name = b"tools/plimsoll-trial-runner";
        assert!(bytes.windows(name.len()).any(|w| w == name));
        assert!(
            !fs::read(&base.initrd.path)
                .unwrap()
                .windows(name.len())
                .any(|w| w == name)
        );
        assert_eq!(
            t.initrd
                .tools
                .iter()
                .map(|b| b.name.as_str())
                .collect::<Vec<_>>(),
            [
                "plimsoll-guest-init",
                "plimsoll-agent",
                "plimsoll-probe",
                "plimsoll-trial-runner"
            ]
        );
        assert_eq!(p.for_trial(&base).unwrap().initrd.path, t.initrd.path);
        // A rebuilt runner gives a new one.
        std::thread::sleep(Duration::from_millis(20));
        tool("plimsoll-trial-runner", &vec![8u8; (1 << 20) - 4096]);
        let t2 = p.for_trial(&base).unwrap();
        assert_ne!(t2.initrd.sha256, t.initrd.sha256);
        assert_eq!(t2.extra_mib, 1 + TRIAL_MARGIN_MIB);
    }

    fn report(answer: Answer) -> BootReport {
        BootReport {
            started_unix_ms: 0,
            hello: None,
            boot_ms: None,
            accel: None,
            answer,
            console: b"[    0.1] hello\nKernel panic - not syncing\n".to_vec(),
            qemu_stderr: Vec::new(),
            peak_rss_kib: None,
            cleanup: Ok(()),
            wall: None,
        }
    }

    #[test]
    fn answers_map_to_results_and_errors() {
        let ok = RunResult {
            exit_code: Some(0),
            stdout: b"hi\n".to_vec().into(),
            start: None,
            member_age_ms: None,
            ..RunResult::default()
        };
        let r = result_of(&report(Answer::Exited {
            code: Some(0),
            signal: None,
            stdout: serde_json::to_vec(&ok).unwrap(),
            stderr: Vec::new(),
            record: Default::default(),
        }))
        .unwrap();
        assert_eq!(r, ok);
        let t = result_of(&report(Answer::TimedOut)).unwrap();
        assert!(t.timed_out && t.signal == Some(9));
        match result_of(&report(Answer::NotBooted("slow".into()))) {
            Err(e @ LaunchError::NotStarted { .. }) => {
                let message = e.message();
                assert!(message.contains("Kernel panic"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            result_of(&report(Answer::Lost("gone".into()))),
            Err(LaunchError::MayHaveRun { .. })
        ));
        assert!(matches!(
            result_of(&report(Answer::Exited {
                code: Some(2),
                signal: None,
                stdout: Vec::new(),
                stderr: b"plimsoll-agent: bad job\n".to_vec(),
                record: Default::default(),
            })),
            Err(e @ LaunchError::MayHaveRun { .. }) if e.message().contains("bad job")
        ));
        // A lie from the guest is an error, never a result.
        assert!(matches!(
            result_of(&report(Answer::Exited {
                code: Some(0),
                signal: None,
                stdout: b"{\"exit_code\": \"zero\"}".to_vec(),
                stderr: Vec::new(),
                record: Default::default(),
            })),
            Err(LaunchError::MayHaveRun { .. })
        ));
    }
}
