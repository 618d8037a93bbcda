//! The OCI providers (`crun`, `runc`, `runsc`): one type parameterised by the runtime kind.
//! A run is one bundle, `<runtime> create` then `start`, and a cleanup that leaves no container, cgroup,
//! process or directory behind.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plimsoll_sandbox::{
    CaptureLimits, Captured, LaunchError, LaunchPlan, Outcome, Probed, Provider, unix_ms_now,
};
use plimsoll_wire::trial_step::{TRIAL_RUNNER, trial_step};
use plimsoll_wire::{AgentJob, Bytes, Language, RunResult, RunSpec, Tier};

use crate::cgroup::{CgroupLayout, MemorySeen};
use crate::follow;
use crate::phases::{Phase, Phases};
use crate::runtime::{Begin, Runtime, RuntimeKind};
use crate::spec::{self, SpecInputs};
use crate::state::{RunDir, StateDir};
use crate::warm::READY_WITHIN;
use plimsoll_sandbox::warm;

/// Where a provider finds what it runs with, and where it keeps its state.
#[derive(Debug, Clone)]
pub struct OciConfig {
    /// Which runtime.
    pub kind: RuntimeKind,
    /// The runtime binary.
    pub binary: PathBuf,
    /// The image directory (`build/images/sandbox`): `rootfs/` and `identity`.
    pub image: PathBuf,
    /// The state root; this provider keeps its state in `<state_root>/<name>`.
    pub state_root: PathBuf,
    /// The cgroup parent; this provider's runs live in `<cgroup_parent>/<name>/<run_id>`.
    pub cgroup_parent: String,
    /// The in-sandbox agent (`plimsoll-agent`), for projects.
    pub agent: PathBuf,
    /// The probe program (`plimsoll-probe`).
    pub probe: PathBuf,
    /// The trial runner (`plimsoll-trial-runner`), shown at
    /// [`plimsoll_wire::trial_step::TRIAL_RUNNER_PATH`] in runs with a trial step (default:
    /// beside the agent).
    pub trial_runner: PathBuf,
    /// The uid (and gid) the startup probe runs as; never one a run holds.
    pub probe_uid: u32,
    /// runsc's `--platform` (`ptrace` works on these hosts; `kvm` hangs on PVM).
    pub platform: String,
    /// CPU time per wall second for a run, in thousandths of a CPU.
    pub cpu_millis: u32,
}

impl OciConfig {
    /// Defaults for a runtime kind: the Debian binary, state under `/run/plimsoll`, cgroups
    /// under `/plimsoll`, ptrace for runsc, one CPU per run. Image, agent and probe paths
    /// and the probe uid must be given.
    pub fn new(
        kind: RuntimeKind,
        image: PathBuf,
        agent: PathBuf,
        probe: PathBuf,
        probe_uid: u32,
    ) -> Self {
        OciConfig {
            kind,
            binary: PathBuf::from(kind.default_binary()),
            image,
            state_root: PathBuf::from("/run/plimsoll"),
            cgroup_parent: "/plimsoll".into(),
            trial_runner: agent.with_file_name("plimsoll-trial-runner"),
            agent,
            probe,
            probe_uid,
            platform: "ptrace".into(),
            cpu_millis: 1000,
        }
    }
}

/// An OCI provider. Cloned into each warm member, which runs and removes its container
/// after the call that made it has returned.
#[derive(Debug, Clone)]
pub struct OciProvider {
    config: OciConfig,
    state: StateDir,
    runtime: Runtime,
    layout: Result<CgroupLayout, String>,
    /// This process's namespaces, read once: every run's wall is compared with them.
    host: plimsoll_sandbox::judge::HostView,
    cgroup_parent: String,
}

/// What `reap` removed, and what it could not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Containers deleted.
    pub containers: Vec<String>,
    /// Run cgroups removed (by run id).
    pub cgroups: Vec<String>,
    /// Run directories removed.
    pub run_dirs: Vec<String>,
    /// The pids of the watchdogs a dead daemon left for these runs, ended.
    pub watchdogs: Vec<i32>,
    /// What failed.
    pub errors: Vec<String>,
}

impl ReapReport {
    /// One line for evidence and logs.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "removed {} containers, {} cgroups, {} run directories",
            self.containers.len(),
            self.cgroups.len(),
            self.run_dirs.len()
        );
        if !self.watchdogs.is_empty() {
            s.push_str(&format!(", ended {} watchdogs", self.watchdogs.len()));
        }
        if !self.errors.is_empty() {
            s.push_str(&format!("; failed: {}", self.errors.join("; ")));
        }
        s
    }
}

/// What one container run gave, before it is turned into a result.
#[derive(Debug)]
pub(crate) struct Launched {
    pub captured: Captured,
    /// The watchdog killed the container at the deadline.
    pub timed_out: bool,
    pub memory: MemorySeen,
    pub started_unix_ms: u64,
    /// The wall read before the process was handed its input (`LaunchSpec::handed_over`).
    pub wall: Option<plimsoll_wire::Wall>,
}

/// A created container of one run, its process waiting in the runtime's init.
#[derive(Debug)]
pub(crate) struct Container {
    pub id: String,
    pub run_dir: RunDir,
    pub created: follow::Created,
    /// The write end of the container's standard input, when it was asked for.
    pub input: Option<std::process::ChildStdin>,
    /// The phases so far (a cold run logs them once it is over).
    pub phases: Phases,
    /// The container's namespaces, held from its creation until its removal.
    pub namespaces: HeldNamespaces,
}

/// References to a container's namespaces (`/proc/<pid>/ns/*` opened), held until the
/// container is removed. While they are held, the end of the container's last process does
/// not tear its namespaces down: in particular the kernel does not unmount the container's
/// mount table, and wait for a grace period, before the process counts as exited. That
/// teardown then happens when these are dropped, in the removal, off the answer's path
/// where the removal is.
#[derive(Debug, Default)]
pub(crate) struct HeldNamespaces {
    _held: Vec<fs::File>,
}

impl HeldNamespaces {
    /// Opens what of process `pid`'s namespaces can be opened (none, if it is gone).
    pub(crate) fn of(pid: rustix::process::Pid) -> Self {
        let pid = pid.as_raw_nonzero().get();
        HeldNamespaces {
            _held: ["mnt", "net", "ipc", "uts", "pid", "cgroup"]
                .iter()
                .filter_map(|n| fs::File::open(format!("/proc/{pid}/ns/{n}")).ok())
                .collect(),
        }
    }
}

/// What following a container to its end gave.
#[derive(Debug)]
pub(crate) struct Followed {
    pub captured: std::io::Result<Captured>,
    /// The watchdog killed the container at the deadline.
    pub timed_out: bool,
    /// The follow's own (later) deadline fired: the runtime may have left processes.
    pub backstop: bool,
    pub memory: MemorySeen,
    /// When the container's process was first seen to have exited, and when its pipes were
    /// drained and it was reaped (for the run's phases).
    pub exited_at: Option<Instant>,
    pub drained_at: Instant,
}

impl Followed {
    /// The launch's outcome once the cleanup ran (`cleaned`).
    pub(crate) fn launched(
        self,
        started_unix_ms: u64,
        cleaned: Result<(), String>,
    ) -> Result<Launched, LaunchError> {
        let captured = match self.captured {
            Ok(c) => c,
            Err(e) => {
                let message = format!("lost the container's output: {}", error_chain(&e));
                return Err(LaunchError::may_have_run(message).after_cleanup(cleaned));
            }
        };
        if let Err(c) = cleaned {
            return Err(LaunchError::may_have_run(format!(
                "the run ended but its sandbox was not fully removed: {c}"
            )));
        }
        Ok(Launched {
            captured,
            timed_out: self.timed_out,
            memory: self.memory,
            started_unix_ms,
            wall: None,
        })
    }
}

/// One run's container process and the files it is handed.
#[derive(Debug)]
pub(crate) struct LaunchSpec {
    pub args: Vec<String>,
    /// Files written into the tools directory (name, content).
    pub files: Vec<(String, Vec<u8>)>,
    /// Host files bound read-only into the tools directory (name, host path).
    pub binds: Vec<(String, PathBuf)>,
    pub output_bytes: u64,
    /// When the watchdog kills the container.
    pub deadline: Duration,
    /// Environment added to the container's fixed one (`NAME=value`).
    pub env: Vec<String>,
    /// What the container's process is handed on its standard input once it started, waits
    /// reading it, and showed a wall matching the provider's evidence (the agent's job); the
    /// pipe is closed after it. `None`: the process has everything in its files from the start.
    pub handed_over: Option<Vec<u8>>,
    /// With `handed_over`: the wall is the one the process says first, one JSON line on its
    /// standard output (`plimsoll-agent --wall-first`: runsc, whose sandbox the host's /proc
    /// does not show), not the one the host's /proc shows.
    pub wall_inside: bool,
}

/// The longest wall line an agent may say first (`plimsoll-agent --wall-first`).
const WALL_LINE_MAX: usize = 64 * 1024;

/// The broker socket's file name in the tools directory.
pub const BROKER_SOCKET: &str = "broker.sock";

/// With a broker, Python starts here: `-I` keeps every directory off `sys.path`, so this puts
/// the tools directory (holding `plimsoll_host.py`) there and runs the snippet as
/// `__main__`, its line numbers unchanged (as the process tier does).
pub const PYTHON_BOOT: &str = "import sys, runpy; p = sys.argv.pop(1); sys.argv[0] = p; \
sys.path.insert(0, p.rpartition('/')[0]); runpy.run_path(p, run_name='__main__')";

/// Bytes of the agent's answer beyond what its content can need (JSON framing, names).
const AGENT_ANSWER_SLACK: u64 = 1024 * 1024;
/// How long after the deadline the runtime process itself is killed if the container
/// still has not ended.
const BACKSTOP: Duration = Duration::from_secs(10);
/// The agent gets the plan's timeout; the host waits this much longer for its answer.
const AGENT_GRACE: Duration = Duration::from_secs(2);
/// How long after the deadline the watchdog outside the daemon kills the container's
/// processes, should the daemon be gone (a live daemon has ended the run by then: its own
/// kill fires at the deadline, and it waits [`AGENT_GRACE`] for the agent's answer).
pub const WATCHDOG_GRACE: Duration = Duration::from_secs(5);
/// How long `<runtime> create` may take (runsc starts its sandbox there).
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);

impl OciProvider {
    /// A provider with this configuration. Reads the cgroup layout; creates nothing and
    /// starts nothing (see [`OciProvider::reap`] and [`Provider::probe`]).
    pub fn new(config: OciConfig) -> Self {
        let name = config.kind.name();
        let state = StateDir::new(config.state_root.join(name));
        let layout =
            CgroupLayout::detect().map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"));
        let hide = layout
            .as_ref()
            .ok()
            .and_then(CgroupLayout::crun_must_hide)
            .map(Path::to_path_buf);
        let runtime = Runtime::new(
            config.kind,
            config.binary.clone(),
            state.runtime_root(),
            config.platform.clone(),
            hide.as_deref(),
        );
        let cgroup_parent = format!("{}/{name}", config.cgroup_parent.trim_end_matches('/'));
        OciProvider {
            config,
            state,
            runtime,
            layout,
            host: plimsoll_sandbox::judge::HostView::read(),
            cgroup_parent,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &OciConfig {
        &self.config
    }

    /// The runtime driver (for tests and tools: `list`, `delete`).
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The state directory.
    pub fn state(&self) -> &StateDir {
        &self.state
    }

    /// The cgroup layout, as detected.
    pub fn layout(&self) -> Result<&CgroupLayout, &str> {
        self.layout.as_ref().map_err(String::as_str)
    }

    /// This provider's cgroup parent (`<cgroup_parent>/<name>`).
    pub fn cgroup_parent(&self) -> &str {
        &self.cgroup_parent
    }

    /// The configured image's root file system (the default image, which the probe runs
    /// in), checked as [`checked_rootfs`] says.
    pub fn rootfs(&self) -> Result<PathBuf, ImageError> {
        checked_rootfs(self.config.image.join("rootfs"))
    }

    /// The root file system a plan runs in: its image's, or the configured one's when the
    /// plan names none (an operator tool's, a probe's).
    fn rootfs_for(&self, plan: &LaunchPlan) -> Result<PathBuf, ImageError> {
        match &plan.image {
            Some(image) => checked_rootfs(image.rootfs.clone()),
            None => self.rootfs(),
        }
    }
}

/// A root file system checked: absolute, a real directory, not reached through a symlink
/// (runc refuses those).
pub fn checked_rootfs(rootfs: PathBuf) -> Result<PathBuf, ImageError> {
    if !rootfs.is_absolute() {
        return Err(ImageError::NotAbsolute(rootfs));
    }
    let meta = match fs::symlink_metadata(&rootfs) {
        Ok(m) => m,
        Err(io) => return Err(ImageError::Missing { path: rootfs, io }),
    };
    if !meta.is_dir() {
        return Err(ImageError::NotADirectory(rootfs));
    }
    let real = match fs::canonicalize(&rootfs) {
        Ok(r) => r,
        Err(io) => return Err(ImageError::Unresolvable { path: rootfs, io }),
    };
    if real != rootfs {
        return Err(ImageError::ThroughSymlink { path: rootfs, real });
    }
    Ok(rootfs)
}

impl OciProvider {
    /// The image identity (`sha256:...`), the environment results report.
    pub fn image_identity(&self) -> Result<String, ImageError> {
        let path = self.config.image.join("identity");
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(io) => return Err(ImageError::IdentityUnreadable { path, io }),
        };
        let id = text.trim();
        if !id.starts_with("sha256:") || id.len() != 71 {
            return Err(ImageError::IdentityMalformed(path));
        }
        Ok(id.to_owned())
    }

    /// Deletes every container, run cgroup and run directory of this provider that no live
    /// run holds (a run's lock dies with its process, so after a daemon was SIGKILLed all of
    /// its runs are leftovers), and ends the watchdogs such a daemon left for them. Safe while
    /// other runs are in flight.
    ///
    /// Only what this provider's own state names is touched: the containers its runtime
    /// root lists and the runs its state directory holds (a run's directory is made before
    /// its cgroup and removed only once the cgroup is gone). Never every cgroup under the
    /// cgroup parent: another daemon on the host with another state root and the same
    /// parent runs its containers there.
    pub fn reap(&self) -> ReapReport {
        let mut report = ReapReport::default();
        let _exclusive = match self.state.global_lock(true) {
            Ok(l) => l,
            Err(e) => {
                report
                    .errors
                    .push(format!("cannot lock {}: {e}", self.state.base().display()));
                return report;
            }
        };
        let listed: Vec<String> = match self.runtime.list() {
            Ok(list) => list
                .into_iter()
                .filter(|i| i.starts_with("plimsoll-"))
                .collect(),
            Err(e) => {
                report.errors.push(e.to_string());
                Vec::new()
            }
        };
        let mut ids = listed.clone();
        ids.extend(self.state.run_ids());
        ids.sort();
        ids.dedup();
        let left: Vec<String> = ids
            .into_iter()
            .filter(|id| !self.state.is_live(id))
            .collect();
        // The dead daemon's watchdogs first: each would otherwise sleep on to its run's
        // deadline (up to the longest timeout, a session's lifetime).
        if let Ok(layout) = &self.layout {
            let cgroups: Vec<PathBuf> = left
                .iter()
                .flat_map(|id| {
                    layout.dirs(&spec::run_cgroup(
                        &self.cgroup_parent,
                        id.trim_start_matches("plimsoll-"),
                    ))
                })
                .collect();
            report.watchdogs = plimsoll_sandbox::watchdog::end_left_behind(&cgroups);
        }
        for id in left {
            // The dead daemon's runtime process (`<runtime> create`) first, so that it does not
            // race the deletion below.
            if let Some(pid) = self.orphaned_runtime(&id) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            if listed.contains(&id) || self.runtime.has_state(&id) {
                match self.runtime.delete_force(&id) {
                    Ok(()) => report.containers.push(id.clone()),
                    // Gone anyway (the runtime's own teardown got there first).
                    Err(_) if !self.runtime.has_state(&id) => report.containers.push(id.clone()),
                    Err(e) => report.errors.push(e.to_string()),
                }
            }
            let run_id = id.trim_start_matches("plimsoll-");
            if let Ok(layout) = &self.layout {
                match layout.remove(&spec::run_cgroup(&self.cgroup_parent, run_id)) {
                    Ok(0) => {}
                    Ok(_) => report.cgroups.push(run_id.to_owned()),
                    Err(e) => report.errors.push(e.to_string()),
                }
            }
            if self.state.runs().join(&id).exists() {
                match self.state.remove_run(&id) {
                    Ok(()) => report.run_dirs.push(id.clone()),
                    Err(e) => report
                        .errors
                        .push(format!("cannot remove run directory of {id}: {e}")),
                }
            }
        }
        report
    }

    /// The runtime process a dead daemon left for container `id`, if it is still there
    /// (its pid as recorded, and its command line still naming this runtime and `id`).
    fn orphaned_runtime(&self, id: &str) -> Option<rustix::process::Pid> {
        let text = fs::read_to_string(self.state.runs().join(id).join("runtime.pid")).ok()?;
        let pid: i32 = text.trim().parse().ok()?;
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let binary = self.runtime.binary().as_os_str().as_encoded_bytes();
        let ours = args.first() == Some(&binary) && args.contains(&id.as_bytes());
        if ours {
            rustix::process::Pid::from_raw(pid)
        } else {
            None
        }
    }

    /// Runs one container for `plan` and cleans everything up. `Err` is
    /// [`LaunchError::NotStarted`] only up to and including `create` (nothing of the request
    /// ran); from `start` on, a failure is [`LaunchError::MayHaveRun`].
    pub(crate) fn launch(
        &self,
        plan: &LaunchPlan,
        launch: &LaunchSpec,
    ) -> Result<Launched, LaunchError> {
        let Container {
            id,
            run_dir,
            mut created,
            mut phases,
            input,
            ..
        } = self.create(plan, launch, launch.handed_over.is_some(), Begin::Create)?;
        // The deadline outside the daemon: a daemon killed mid-run leaves this watchdog,
        // which ends the container's processes (by its cgroup) at the deadline plus a grace.
        let outside = match self.outside_watchdog(plan, launch.deadline) {
            Ok(w) => w,
            Err(e) => {
                drop(created);
                return Err(e.after_cleanup(self.clean(plan, &id, run_dir, false)));
            }
        };
        phases.mark(Phase::Watchdog);
        // From `start` on the code may have run: every failure is `Failed`, never "not
        // dispatched".
        let started_unix_ms = unix_ms_now();
        let started = self.runtime.start(&id);
        phases.mark(Phase::Start);
        if let Err(e) = started {
            // Kill and reap the container's process before the cleanup.
            drop(created);
            let message = format!(
                "{} may have started the container, then failed: {}",
                self.config.kind.name(),
                error_chain(&e)
            );
            return Err(LaunchError::may_have_run(message)
                .after_cleanup(self.clean(plan, &id, run_dir, false)));
        }
        let mut wall = None;
        if let Some(bytes) = &launch.handed_over {
            // Nothing of the request is inside yet: until the input is written, a failure
            // (the wall does not match, the process did not come to read) is not dispatched.
            let pid = created.pid().as_raw_nonzero().get() as u32;
            let gated = if launch.wall_inside {
                self.said_wall(&mut created, plan)
            } else {
                warm::wait_until_reading(pid, READY_WITHIN)
                    .map_err(|e| {
                        LaunchError::environment(format!(
                            "the container's process did not come to read its job: {e}"
                        ))
                    })
                    .and_then(|()| self.checked_wall(pid, plan))
            };
            match gated {
                Ok(w) => wall = Some(w),
                Err(e) => {
                    drop(input);
                    drop(created);
                    return Err(e.after_cleanup(self.clean(plan, &id, run_dir, false)));
                }
            }
            let sent = input
                .ok_or_else(|| std::io::Error::other("the container has no input pipe"))
                .and_then(|mut input| input.write_all(bytes));
            if let Err(e) = sent {
                drop(created);
                let e =
                    LaunchError::may_have_run(format!("cannot hand the container its job: {e}"));
                return Err(e.after_cleanup(self.clean(plan, &id, run_dir, false)));
            }
        }
        let followed = self.follow_to_end(plan, &id, created, launch.deadline, launch.output_bytes);
        if let Some(at) = followed.exited_at {
            phases.mark_at(Phase::Exit, at);
        }
        phases.mark_at(Phase::Drain, followed.drained_at);
        phases.mark(Phase::Memory);
        drop(outside);
        phases.mark(Phase::WatchdogEnd);
        let cleaned = self.clean_timed(plan, &id, run_dir, followed.backstop, &mut phases);
        let kind = match plan.spec {
            RunSpec::Snippet(ref s) => s.language.as_str(),
            RunSpec::Project(_) => "project",
        };
        phases.log(self.config.kind.name(), &plan.run_id, kind);
        let mut launched = followed.launched(started_unix_ms, cleaned)?;
        launched.wall = wall;
        Ok(launched)
    }

    /// The wall of the container process `pid`, read from the host, if it matches what this
    /// provider's probe was judged on for `plan`'s uid and memory and pids limits (for a
    /// trial, what its agent starts with: [`plimsoll_sandbox::wall::for_trial`]); otherwise a
    /// refusal (not dispatched, `environment`) saying which checks failed.
    pub(crate) fn checked_wall(
        &self,
        pid: u32,
        plan: &LaunchPlan,
    ) -> Result<plimsoll_wire::Wall, LaunchError> {
        let layout = self.layout().map_err(LaunchError::environment)?;
        let wall = plimsoll_sandbox::wall::read_unmarked(pid, layout).map_err(|e| {
            LaunchError::environment(format!("cannot read the sandbox's wall: {e}"))
        })?;
        self.judged_wall(wall, plan)
    }

    /// The wall the container's process said of itself from inside (`plimsoll-agent
    /// --wall-first` or `--wall-then-exec`: runsc, whose sandbox the host's /proc cannot
    /// see), its first line on standard output, if it matches what this provider's probe was
    /// judged on for `plan`; otherwise a refusal.
    pub(crate) fn said_wall(
        &self,
        created: &mut follow::Created,
        plan: &LaunchPlan,
    ) -> Result<plimsoll_wire::Wall, LaunchError> {
        let line = created
            .first_line(Instant::now() + READY_WITHIN, WALL_LINE_MAX)
            .map_err(|e| {
                LaunchError::environment(format!("the agent did not say its wall: {e}"))
            })?;
        let wall = serde_json::from_slice(&line).map_err(|e| {
            LaunchError::environment(format!(
                "the agent's wall is not a wall ({e}): check plimsoll-agent"
            ))
        })?;
        self.judged_wall(wall, plan)
    }

    /// `wall`, its namespaces compared with the host's, if it matches what this provider's
    /// probe was judged on for `uid` and the run's limits; otherwise a refusal.
    pub(crate) fn judged_wall(
        &self,
        mut wall: plimsoll_wire::Wall,
        plan: &LaunchPlan,
    ) -> Result<plimsoll_wire::Wall, LaunchError> {
        let (memory, pids) = (plan.limits.memory_bytes, plan.limits.pids);
        let mut expected = crate::probe::run_expectations(self.config.kind, plan.uid, memory, pids);
        match plan.privileges {
            plimsoll_sandbox::Privileges::TrialRunner => {
                expected = plimsoll_sandbox::wall::for_trial(&expected);
            }
            plimsoll_sandbox::Privileges::DropsToRunUid => {
                expected = plimsoll_sandbox::wall::for_dropped(&expected);
            }
            plimsoll_sandbox::Privileges::Unprivileged => {}
        }
        plimsoll_sandbox::wall::mark(&mut wall, &expected, &self.host);
        plimsoll_sandbox::wall::check(&wall, &expected, &self.host)
            .map_err(|e| LaunchError::not_started(plimsoll_wire::Reason::Environment, e))?;
        Ok(wall)
    }

    /// Everything of a run up to its container created (its process waiting in the runtime's
    /// init until `start`), the runtime's helpers followed; with `stdin`, the container's
    /// standard input is a pipe whose write end is returned. Nothing of the request ran: a
    /// failure is not dispatched (`environment`), and what was made is removed.
    pub(crate) fn create(
        &self,
        plan: &LaunchPlan,
        launch: &LaunchSpec,
        stdin: bool,
        begin: Begin<'_>,
    ) -> Result<Container, LaunchError> {
        let mut phases = Phases::new();
        if let Err(e) = &self.layout {
            return Err(LaunchError::environment(e.clone()));
        }
        if plan.run_id.is_empty()
            || !plan
                .run_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(LaunchError::environment(format!(
                "run id `{}` is not usable as a container id",
                plan.run_id.escape_debug()
            )));
        }
        let rootfs = self.rootfs_for(plan).map_err(LaunchError::environment)?;
        let id = format!("plimsoll-{}", plan.run_id);
        let run_dir = self.state.create_run(&id).map_err(|e| {
            LaunchError::environment(format!(
                "cannot create the run directory {}: {e}",
                self.state.runs().join(&id).display()
            ))
        })?;
        phases.mark(Phase::Prepare);
        let prepared = self
            .write_bundle(plan, launch, &run_dir, &rootfs)
            .and_then(|bundle| self.open_broker(plan, &run_dir).map(|()| bundle));
        phases.mark(Phase::Bundle);
        let pid_file = run_dir.path().join("pid");
        let spawned = prepared.and_then(|bundle| {
            self.runtime
                .spawn_create(&bundle, &id, &pid_file, plan.broker.is_some(), stdin, begin)
                .map_err(|e| {
                    format!(
                        "cannot start {}: {}",
                        self.runtime.binary().display(),
                        error_chain(&e)
                    )
                })
        });
        let mut input = None;
        let created = spawned.and_then(|mut r| {
            input = r.stdin.take();
            // For `reap`: the runtime process outlives a daemon that is killed.
            let _ = fs::write(run_dir.path().join("runtime.pid"), r.child.id().to_string());
            follow::created(
                self.config.kind.name(),
                r,
                &pid_file,
                launch.output_bytes,
                CREATE_TIMEOUT,
            )
            .map_err(|e| e.to_string())
        });
        let mut created = match created {
            Ok(c) => c,
            Err(message) => {
                return Err(LaunchError::environment(message)
                    .after_cleanup(self.clean(plan, &id, run_dir, false)));
            }
        };
        created.also_reap(self.runtime.helper_pids(&id));
        let namespaces = HeldNamespaces::of(created.pid());
        phases.mark(Phase::Create);
        Ok(Container {
            id,
            run_dir,
            created,
            input,
            phases,
            namespaces,
        })
    }

    /// The watchdog outside the daemon for a run of `deadline` from now: the container's
    /// cgroups' processes are killed at the deadline plus [`WATCHDOG_GRACE`].
    pub(crate) fn outside_watchdog(
        &self,
        plan: &LaunchPlan,
        deadline: Duration,
    ) -> Result<plimsoll_sandbox::watchdog::Watchdog, LaunchError> {
        plimsoll_sandbox::watchdog::start(&self.container_procs(plan)?, deadline + WATCHDOG_GRACE)
            .map_err(|e| {
                LaunchError::environment(format!(
                    "cannot start the run's watchdog: {}",
                    error_chain(&e)
                ))
            })
    }

    /// [`OciProvider::outside_watchdog`] started ahead, waiting for its deadline (a warm
    /// member's).
    pub(crate) fn armed_watchdog(
        &self,
        plan: &LaunchPlan,
    ) -> Result<plimsoll_sandbox::watchdog::Armed, LaunchError> {
        plimsoll_sandbox::watchdog::arm(&self.container_procs(plan)?).map_err(|e| {
            LaunchError::environment(format!(
                "cannot start the member's watchdog: {}",
                error_chain(&e)
            ))
        })
    }

    /// The `cgroup.procs` files of the container's cgroups, in every hierarchy.
    fn container_procs(&self, plan: &LaunchPlan) -> Result<Vec<PathBuf>, LaunchError> {
        self.container_procs_of(&plan.run_id)
    }

    /// The `cgroup.procs` files of the container named `id` (a run's id, a member's).
    fn container_procs_of(&self, id: &str) -> Result<Vec<PathBuf>, LaunchError> {
        let layout = self
            .layout
            .as_ref()
            .map_err(|e| LaunchError::environment(e.clone()))?;
        Ok(layout
            .dirs(&spec::container_cgroup(&self.cgroup_parent, id))
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect())
    }

    /// After `start` (or a warm member's `go`): captures the container's output until its
    /// process has ended, killing the container at `deadline` from now, and reads what its
    /// memory cgroup saw.
    pub(crate) fn follow_to_end(
        &self,
        plan: &LaunchPlan,
        id: &str,
        created: follow::Created,
        deadline: Duration,
        output_bytes: u64,
    ) -> Followed {
        // The watchdog kills the container at the deadline, so its process ends and the
        // runtime tears the container down; the follow's own deadline (later) kills the
        // container's process directly only if that does not work.
        let done = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let fired = Arc::new(AtomicBool::new(false));
        let watchdog = {
            let done = Arc::clone(&done);
            let fired = Arc::clone(&fired);
            let runtime = self.runtime.clone();
            let id = id.to_owned();
            let deadline = Instant::now() + deadline;
            std::thread::spawn(move || {
                let (lock, cv) = &*done;
                let mut finished = lock.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if *finished {
                        return;
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    finished = cv
                        .wait_timeout(finished, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                fired.store(true, Ordering::SeqCst);
                // Retry until the container has ended.
                loop {
                    drop(finished);
                    let _ = runtime.kill(&id);
                    finished = lock.lock().unwrap_or_else(|p| p.into_inner());
                    if *finished {
                        return;
                    }
                    finished = cv
                        .wait_timeout(finished, Duration::from_millis(200))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    if *finished {
                        return;
                    }
                }
            })
        };
        let limits = CaptureLimits::new(output_bytes, deadline + BACKSTOP);
        let (captured, exited_at) = match created.follow(&limits) {
            Ok((c, exited_at)) => (Ok(c), exited_at),
            Err(e) => (Err(e), None),
        };
        let drained_at = Instant::now();
        {
            let (lock, cv) = &*done;
            *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
            cv.notify_all();
        }
        let _ = watchdog.join();
        let timed_out = fired.load(Ordering::SeqCst);
        let backstop = captured.as_ref().map_or(true, |c| c.timed_out);
        let memory = match &self.layout {
            Ok(layout) => {
                let mut memory =
                    layout.memory_seen(&spec::run_cgroup(&self.cgroup_parent, &plan.run_id));
                // v1 counts kills only in the container's own cgroup, there until the delete.
                if memory.oom_kills.is_none() {
                    memory.oom_kills = layout
                        .oom_kills(&spec::container_cgroup(&self.cgroup_parent, &plan.run_id));
                }
                memory
            }
            Err(_) => MemorySeen::default(),
        };
        Followed {
            captured,
            timed_out,
            backstop,
            memory,
            exited_at,
            drained_at,
        }
    }

    /// With a broker: a Unix socket in the run's tools directory (so inside the container
    /// at `/opt/plimsoll/bin/broker.sock`, and on the host only under the run's 0700
    /// directory), handed to the broker to serve.
    fn open_broker(&self, plan: &LaunchPlan, run_dir: &RunDir) -> Result<(), String> {
        let Some(broker) = &plan.broker else {
            return Ok(());
        };
        let dir = run_dir.path().join("bin");
        let path = dir.join(BROKER_SOCKET);
        // A socket path must fit in 108 bytes; bind through the directory's descriptor,
        // whatever the length of the state root.
        let dir_fd = rustix::fs::open(
            &dir,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
        let short = format!(
            "/proc/self/fd/{}/{BROKER_SOCKET}",
            std::os::fd::AsRawFd::as_raw_fd(&dir_fd)
        );
        let listener = std::os::unix::net::UnixListener::bind(&short)
            .map_err(|e| format!("cannot create the broker socket {}: {e}", path.display()))?;
        drop(dir_fd);
        // The run's uid connects; nothing else can reach the path.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666))
            .map_err(|e| format!("cannot open up {}: {e}", path.display()))?;
        broker
            .serve_listener(listener)
            .map_err(|e| format!("cannot start serving the broker socket: {e}"))
    }

    fn write_bundle(
        &self,
        plan: &LaunchPlan,
        launch: &LaunchSpec,
        run_dir: &RunDir,
        rootfs: &Path,
    ) -> Result<PathBuf, String> {
        let err = |what: &Path, e: std::io::Error| format!("cannot write {}: {e}", what.display());
        let bundle = run_dir.path().join("bundle");
        let tools = run_dir.path().join("bin");
        for d in [&bundle, &tools] {
            fs::DirBuilder::new()
                .mode(0o755)
                .create(d)
                .map_err(|e| err(d, e))?;
            // The mode given to mkdir is filtered by the umask.
            fs::set_permissions(d, fs::Permissions::from_mode(0o755)).map_err(|e| err(d, e))?;
        }
        let write = |path: &Path, content: &[u8]| -> Result<(), String> {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(path)
                .map_err(|e| err(path, e))?;
            f.write_all(content).map_err(|e| err(path, e))?;
            fs::set_permissions(path, fs::Permissions::from_mode(0o644)).map_err(|e| err(path, e))
        };
        for (name, content) in &launch.files {
            write(&tools.join(name), content)?;
        }
        for (name, host) in &launch.binds {
            if !host.is_file() {
                return Err(format!(
                    "{} is missing: build it (cargo build) or configure its path",
                    host.display()
                ));
            }
            // The mount point, inside the per-run directory, never in the shared image.
            write(&tools.join(name), b"")?;
        }
        let binds: Vec<(&str, &Path)> = launch
            .binds
            .iter()
            .map(|(n, p)| (n.as_str(), p.as_path()))
            .collect();
        let cgroup_v1_mounts: Vec<String> = self
            .layout
            .as_ref()
            .map(|l| {
                l.hierarchies
                    .iter()
                    .filter(|h| !h.v2 && h.mount.starts_with("/sys/fs/cgroup/"))
                    .map(|h| h.mount.display().to_string())
                    .collect()
            })
            .unwrap_or_default();
        let config = spec::container_config(
            plan,
            &SpecInputs {
                kind: self.config.kind,
                rootfs,
                cgroup_parent: &self.cgroup_parent,
                cpu_millis: self.config.cpu_millis,
                tools_dir: &tools,
                tool_binds: &binds,
                args: &launch.args,
                extra_env: &launch.env,
                cgroup_v1_mounts: &cgroup_v1_mounts,
            },
        );
        let text = serde_json::to_vec_pretty(&config)
            .map_err(|e| format!("cannot encode config.json: {e}"))?;
        write(&bundle.join("config.json"), &text)?;
        Ok(bundle)
    }

    /// Removes everything of one run: the container (if the runtime left it), its cgroups,
    /// stray processes (only after the backstop killed the runtime), the run directory.
    pub(crate) fn clean(
        &self,
        plan: &LaunchPlan,
        id: &str,
        run_dir: RunDir,
        backstop: bool,
    ) -> Result<(), String> {
        self.clean_timed(plan, id, run_dir, backstop, &mut Phases::new())
    }

    /// [`OciProvider::clean`], marking its phases in `phases`.
    pub(crate) fn clean_timed(
        &self,
        plan: &LaunchPlan,
        id: &str,
        run_dir: RunDir,
        backstop: bool,
        phases: &mut Phases,
    ) -> Result<(), String> {
        let mut errors = Vec::new();
        if (backstop || self.runtime.has_state(id))
            && let Err(e) = self.runtime.delete_force(id)
            && self.runtime.has_state(id)
        {
            errors.push(e.to_string());
        }
        phases.mark(Phase::Delete);
        if let Ok(layout) = &self.layout
            && let Err(e) = layout.remove(&spec::run_cgroup(&self.cgroup_parent, &plan.run_id))
        {
            errors.push(e.to_string());
        }
        phases.mark(Phase::Cgroup);
        // The controller uid too: leased to this run alone, a trial's controllers run as it.
        if backstop {
            for uid in [plan.uid, plan.controller_uid] {
                if let Err(e) = plimsoll_sandbox::end_processes_of_uid(uid, Duration::from_secs(5))
                {
                    errors.push(e.to_string());
                }
            }
        }
        // The run's directory is the record `reap` goes by: kept while its container or
        // cgroup is left, so that a later reap removes them.
        if errors.is_empty()
            && let Err(e) = self.state.remove_own_run(&run_dir)
        {
            errors.push(format!("cannot remove {}: {e}", run_dir.path().display()));
        }
        drop(run_dir);
        phases.mark(Phase::Dir);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    fn snippet_launch(&self, plan: &LaunchPlan, language: Language, code: &str) -> LaunchSpec {
        use plimsoll_sandbox::broker::{
            JS_CLIENT, JS_CLIENT_FILE, PYTHON_CLIENT, PYTHON_CLIENT_FILE,
        };
        let tool = |name: &str| format!("{}/{name}", spec::TOOLS_DIR);
        let broker = plan.broker.is_some();
        let mut files = Vec::new();
        let (file, mut args) = match language {
            Language::Javascript => {
                let mut args = vec!["/usr/bin/node".to_owned()];
                if broker {
                    files.push((JS_CLIENT_FILE.to_owned(), JS_CLIENT.as_bytes().to_vec()));
                    args.extend(["--require".to_owned(), tool(JS_CLIENT_FILE)]);
                }
                ("main.js", args)
            }
            Language::Python => {
                let mut args = vec!["/usr/bin/python3".to_owned()];
                args.extend(
                    plimsoll_sandbox::PYTHON_FLAGS
                        .iter()
                        .map(|f| (*f).to_owned()),
                );
                if broker {
                    files.push((
                        PYTHON_CLIENT_FILE.to_owned(),
                        PYTHON_CLIENT.as_bytes().to_vec(),
                    ));
                    args.extend(["-c".to_owned(), PYTHON_BOOT.to_owned()]);
                }
                ("main.py", args)
            }
        };
        args.push(tool(file));
        files.push((file.to_owned(), code.as_bytes().to_vec()));
        LaunchSpec {
            args,
            files,
            binds: Vec::new(),
            output_bytes: plan.limits.output_bytes,
            deadline: plan.limits.timeout,
            env: broker_env(plan, false),
            handed_over: None,
            wall_inside: false,
        }
    }

    fn project_launch(&self, plan: &LaunchPlan) -> Result<LaunchSpec, LaunchError> {
        let RunSpec::Project(project) = &plan.spec else {
            return Err(LaunchError::environment("not a project"));
        };
        // A run with a trial step: the agent starts as uid 0 with CAP_SETUID and CAP_SETGID
        // (spec.rs) and is told the run's two uids; the runner is bound read-only at
        // TRIAL_RUNNER_PATH. Nothing of this in any other run.
        let trial = plan.trial_ids();
        // RunRequest::validate refuses these first; a plan that still holds one never gets
        // the privileges (the agent would refuse it too, but only after starting as root).
        if let Some((i, Some(Err(e)))) = project
            .steps
            .iter()
            .map(trial_step)
            .enumerate()
            .find(|(_, t)| matches!(t, Some(Err(_))))
        {
            return Err(LaunchError::not_started(
                plimsoll_wire::Reason::Request,
                format!("step {} {e}", i + 1),
            ));
        }
        let mut binds = vec![("plimsoll-agent".to_owned(), self.config.agent.clone())];
        if trial.is_some() {
            let runner = &self.config.trial_runner;
            if !runner.is_file() {
                return Err(LaunchError::environment(format!(
                    "the run has a {TRIAL_RUNNER} step but the runner {} is missing: build it \
                     (`cargo build -p plimsoll-trial`, beside plimsoll-agent) or set [oci] \
                     trial_runner",
                    runner.display()
                )));
            }
            binds.push((TRIAL_RUNNER.to_owned(), runner.clone()));
        }
        let job = AgentJob {
            spec: plan.spec.clone(),
            work_dir: spec::WORK_DIR.to_owned(),
            output_bytes: plan.limits.output_bytes,
            artifact_bytes: plan.limits.artifact_bytes,
            deadline_ms: plan.limits.timeout.as_millis() as u64,
            trial,
        };
        let text = serde_json::to_vec(&job)
            .map_err(|e| LaunchError::environment(format!("cannot encode the agent job: {e}")))?;
        // JSON may spell one byte as six (`\u0000`).
        let content = 2 * plan.limits.output_bytes * (project.steps.len() as u64 + 1)
            + plan.limits.artifact_bytes * project.artifacts.len() as u64;
        // The agent reads its job from its standard input, handed over only once it waits
        // for it and its wall matches (a trial's: uid 0 holding exactly the two
        // capabilities). The job is in no file: a trial's controller, another uid, has
        // nothing to read the scenarios from.
        // At runsc the daemon cannot see inside gVisor: the agent says its wall first.
        let wall_inside = self.config.kind == RuntimeKind::Runsc;
        let files = broker_files(plan);
        let mut args = vec![format!("{}/plimsoll-agent", spec::TOOLS_DIR)];
        if wall_inside {
            args.push("--wall-first".into());
        }
        Ok(LaunchSpec {
            args,
            files,
            env: broker_env(plan, true),
            binds,
            output_bytes: content.saturating_mul(6).saturating_add(AGENT_ANSWER_SLACK),
            deadline: plan.limits.timeout + AGENT_GRACE,
            handed_over: Some(text),
            wall_inside,
        })
    }
}

/// The in-sandbox clients a project or session with a broker gets in its tools directory.
pub(crate) fn broker_files(plan: &LaunchPlan) -> Vec<(String, Vec<u8>)> {
    use plimsoll_sandbox::broker::{JS_CLIENT, JS_CLIENT_FILE, PYTHON_CLIENT, PYTHON_CLIENT_FILE};
    if plan.broker.is_none() {
        return Vec::new();
    }
    vec![
        (JS_CLIENT_FILE.to_owned(), JS_CLIENT.as_bytes().to_vec()),
        (
            PYTHON_CLIENT_FILE.to_owned(),
            PYTHON_CLIENT.as_bytes().to_vec(),
        ),
    ]
}

/// The environment a run with a broker gets: where the socket is and, for a project's
/// steps, the clients preloaded (`NODE_OPTIONS`) or importable (`PYTHONPATH`).
pub(crate) fn broker_env(plan: &LaunchPlan, project: bool) -> Vec<String> {
    use plimsoll_sandbox::broker::JS_CLIENT_FILE;
    if plan.broker.is_none() {
        return Vec::new();
    }
    let mut env = vec![format!(
        "PLIMSOLL_BROKER_SOCKET={}/{BROKER_SOCKET}",
        spec::TOOLS_DIR
    )];
    if project {
        env.push(format!(
            "NODE_OPTIONS=--require {}/{JS_CLIENT_FILE}",
            spec::TOOLS_DIR
        ));
        env.push(format!("PYTHONPATH={}", spec::TOOLS_DIR));
        if plan.broker.as_ref().is_some_and(|b| b.egress()) {
            // The agent's relay listens where the proxy variables point.
            env.push(format!("{}=1", plimsoll_sandbox::broker::EGRESS_RELAY_VAR));
            env.extend(plimsoll_sandbox::broker::egress_env());
        }
    }
    env
}

/// The exit status of the container's process as the runtime reports it: `128 + N` is
/// death by signal N (an exit status of 129 to 192 chosen by the program itself reads the
/// same way; documented).
pub(crate) fn status_of(c: &Captured) -> (Option<i32>, Option<i32>) {
    match (c.exit_code, c.signal) {
        (Some(code), _) if (129..=192).contains(&code) => (None, Some(code - 128)),
        (Some(code), _) => (Some(code), None),
        (None, signal) => (None, signal),
    }
}

use plimsoll_sandbox::error_chain;

/// The sandbox image cannot be used: what is wrong, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The configured path is relative.
    #[error("the image path {} is not absolute: configure an absolute [oci] image", .0.display())]
    NotAbsolute(PathBuf),
    /// No root file system there.
    #[error("no image root file system at {} ({io}): run scripts/build-image", path.display())]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
        /// What looking gave.
        io: std::io::Error,
    },
    /// The root file system is not a directory.
    #[error("{} is not a directory (a symlink?): runc refuses those; point [oci] image at the real directory", .0.display())]
    NotADirectory(PathBuf),
    /// Its real path cannot be resolved.
    #[error("cannot resolve {} ({io})", path.display())]
    Unresolvable {
        /// The root file system.
        path: PathBuf,
        /// What resolving gave.
        io: std::io::Error,
    },
    /// It is reached through a symlink.
    #[error("{} goes through a symlink (it is {}): configure the real path", path.display(), real.display())]
    ThroughSymlink {
        /// The configured path.
        path: PathBuf,
        /// Where it leads.
        real: PathBuf,
    },
    /// The identity file cannot be read.
    #[error("cannot read the image identity {} ({io}): run scripts/build-image", path.display())]
    IdentityUnreadable {
        /// The identity file.
        path: PathBuf,
        /// What reading gave.
        io: std::io::Error,
    },
    /// The identity file holds no `sha256:<hex>`.
    #[error("{} does not hold a sha256:<hex> identity: rebuild the image", .0.display())]
    IdentityMalformed(PathBuf),
}

impl Provider for OciProvider {
    fn name(&self) -> &str {
        self.config.kind.name()
    }

    fn nominal_tier(&self) -> Tier {
        self.config.kind.tier()
    }

    fn cost(&self) -> u32 {
        self.config.kind.cost()
    }

    fn supports(&self, _spec: &RunSpec) -> Result<(), plimsoll_sandbox::Unsupported> {
        Ok(())
    }

    fn supports_egress(&self) -> bool {
        true
    }

    fn supports_broker(&self) -> bool {
        true
    }

    /// A rebuilt image (its identity file, read at every run) is a new probe.
    fn environment_holds(
        &self,
        evidence: &plimsoll_wire::Evidence,
    ) -> Result<(), plimsoll_sandbox::Stale> {
        self.adopt(evidence)
    }

    /// The image is not among the evidence's binaries: a rebuilt image is a new probe.
    fn adopt(&self, evidence: &plimsoll_wire::Evidence) -> Result<(), plimsoll_sandbox::Stale> {
        let now = self
            .image_identity()
            .map_err(|e| plimsoll_sandbox::Stale::ImageUnreadable(e.to_string()))?;
        if now != evidence.environment {
            return Err(plimsoll_sandbox::Stale::ImageChanged {
                now,
                then: evidence.environment.clone(),
            });
        }
        Ok(())
    }

    fn probe(&self) -> Probed {
        crate::probe::probe(self)
    }

    fn warms(&self) -> bool {
        true
    }

    fn warm(
        &self,
        plan: &plimsoll_sandbox::WarmPlan,
    ) -> Result<Box<dyn plimsoll_sandbox::WarmMember>, LaunchError> {
        Ok(Box::new(crate::warm::make(self, plan)?))
    }

    fn opens_sessions(&self) -> bool {
        true
    }

    /// By the container's cgroups, not its uid: at runsc the sandbox's processes are
    /// gVisor's, which run as other users. A warm member's container is named by the
    /// member's id, not the run's.
    fn cancel(
        &self,
        sandbox: &plimsoll_sandbox::RunningIn,
    ) -> Result<(), plimsoll_sandbox::CancelRunError> {
        let procs = self.container_procs_of(&sandbox.id).map_err(|e| {
            plimsoll_sandbox::CancelRunError::Find {
                sandbox: sandbox.id.clone(),
                cause: Box::new(e),
            }
        })?;
        plimsoll_sandbox::reap::kill_cgroup_processes(&procs, Duration::from_secs(5)).map_err(|e| {
            plimsoll_sandbox::CancelRunError::End {
                sandbox: sandbox.id.clone(),
                uid: sandbox.uid,
                cause: e.into(),
            }
        })
    }

    fn open_session(
        &self,
        plan: &LaunchPlan,
        lifetime: Duration,
    ) -> Result<Box<dyn plimsoll_sandbox::SessionSandbox>, LaunchError> {
        Ok(Box::new(crate::session::open(self, plan, lifetime)?))
    }

    fn restore_session(
        &self,
        plan: &LaunchPlan,
        lifetime: Duration,
        image: &std::path::Path,
    ) -> Result<Box<dyn plimsoll_sandbox::SessionSandbox>, LaunchError> {
        Ok(Box::new(crate::session::restore(
            self, plan, lifetime, image,
        )?))
    }

    fn run(&self, plan: &LaunchPlan) -> Result<Outcome, LaunchError> {
        plimsoll_sandbox::warm::tear_down_now(self.run_then_tear_down(plan))
    }

    fn run_then_tear_down(
        &self,
        plan: &LaunchPlan,
    ) -> Result<(Outcome, Option<plimsoll_sandbox::Teardown>), LaunchError> {
        // A snippet runs in a member made for it (with the run's broker channel, if it has
        // one): its wall is read (at runsc, said from inside) and checked before its code is
        // handed over.
        if let Some(member) = plimsoll_sandbox::warm::cold_member_plan(plan, true) {
            let member = Box::new(crate::warm::make_cold(self, &member, plan.broker.as_ref())?);
            return plimsoll_sandbox::warm::run_made(member, plan);
        }
        match &plan.spec {
            RunSpec::Snippet(s) => {
                let launch = self.snippet_launch(plan, s.language, &s.code);
                let l = self.launch(plan, &launch)?;
                let (exit_code, signal) = status_of(&l.captured);
                let killed = signal == Some(libc::SIGKILL);
                let c = l.captured;
                Ok((
                    Outcome {
                        result: RunResult {
                            exit_code,
                            signal,
                            timed_out: l.timed_out,
                            oom_killed: !l.timed_out
                                && l.memory.oom_killed(plan.limits.memory_bytes, killed),
                            stdout: Bytes(c.stdout),
                            stdout_truncated: c.stdout_truncated,
                            stderr: Bytes(c.stderr),
                            stderr_truncated: c.stderr_truncated,
                            start: None,
                            member_age_ms: None,
                            ..RunResult::default()
                        },
                        started_unix_ms: l.started_unix_ms,
                        ended_unix_ms: unix_ms_now(),
                    },
                    None,
                ))
            }
            RunSpec::Project(_) => {
                let launch = self.project_launch(plan)?;
                let l = self.launch(plan, &launch)?;
                let mut result = agent_result(plan, &l)?;
                result.wall = l.wall;
                Ok((
                    Outcome {
                        result,
                        started_unix_ms: l.started_unix_ms,
                        ended_unix_ms: unix_ms_now(),
                    },
                    None,
                ))
            }
        }
    }
}

/// The agent's answer, or the result of an agent that never answered (killed at the
/// deadline or by the memory limit).
fn agent_result(plan: &LaunchPlan, l: &Launched) -> Result<RunResult, LaunchError> {
    let c = &l.captured;
    let (exit_code, signal) = status_of(c);
    if exit_code == Some(0) {
        return RunResult::from_agent(&c.stdout).map_err(|e| {
            LaunchError::may_have_run(format!(
                "the agent's answer is not a result ({e}; {} bytes{}): check plimsoll-agent",
                c.stdout.len(),
                if c.stdout_truncated {
                    ", truncated"
                } else {
                    ""
                }
            ))
        });
    }
    if exit_code.is_some() && !l.timed_out {
        let stderr = String::from_utf8_lossy(&c.stderr);
        let line = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        return Err(LaunchError::may_have_run(format!(
            "the agent could not do the job (exit {}): {line}",
            exit_code.unwrap_or(-1)
        )));
    }
    Ok(RunResult {
        exit_code,
        signal,
        timed_out: l.timed_out,
        oom_killed: !l.timed_out
            && l.memory
                .oom_killed(plan.limits.memory_bytes, signal == Some(libc::SIGKILL)),
        start: None,
        member_age_ms: None,
        ..RunResult::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(code: Option<i32>, signal: Option<i32>) -> Captured {
        Captured {
            exit_code: code,
            signal,
            ..Captured::default()
        }
    }

    #[test]
    fn runtime_statuses_map_to_exit_codes_and_signals() {
        assert_eq!(status_of(&captured(Some(0), None)), (Some(0), None));
        assert_eq!(status_of(&captured(Some(3), None)), (Some(3), None));
        assert_eq!(status_of(&captured(Some(128), None)), (Some(128), None));
        assert_eq!(status_of(&captured(Some(137), None)), (None, Some(9)));
        assert_eq!(status_of(&captured(Some(143), None)), (None, Some(15)));
        assert_eq!(status_of(&captured(Some(255), None)), (Some(255), None));
        assert_eq!(status_of(&captured(None, Some(9))), (None, Some(9)));
    }

    fn project_plan(steps: &[&str]) -> LaunchPlan {
        let spec = plimsoll_testing::project(vec![], steps, &[]);
        LaunchPlan {
            image: None,
            run_id: "trial0".into(),
            request_id: "r".into(),
            privileges: plimsoll_sandbox::Privileges::for_spec(&spec),
            spec,
            limits: plimsoll_testing::limits(),
            uid: 2_000_010,
            gid: 2_000_011,
            controller_uid: 2_000_020,
            controller_gid: 2_000_021,
            run_dir: PathBuf::from("/unused"),
            broker: None,
            tap: None,
        }
    }

    /// The job, from the file or from what is handed over (never both).
    fn job_of(launch: &LaunchSpec) -> AgentJob {
        serde_json::from_slice(launch.handed_over.as_ref().expect("the job")).unwrap()
    }

    /// The wall an agent says inside gVisor is judged on the host like any other: one that
    /// is not the run's is refused before the job is handed over.
    #[test]
    fn a_wall_said_inside_is_judged_and_a_wrong_one_refused() {
        let c = OciConfig::new(
            RuntimeKind::Runsc,
            "/img".into(),
            "/a".into(),
            "/p".into(),
            1,
        );
        let p = OciProvider::new(c);
        // A run's plan (uid 2_000_010, 256 MiB, 64 pids), and a trial's.
        let run = project_plan(&["echo ok"]);
        let trial_plan = project_plan(&["plimsoll-trial-runner --scenario s.json -- node c.js"]);
        assert!(trial_plan.privileges.is_trial() && !run.privileges.is_trial());
        let zero = || Some("0000000000000000".to_owned());
        let wall = plimsoll_wire::Wall {
            uid: 2_000_010,
            euid: 2_000_010,
            gid: 2_000_010,
            cap_inh: zero(),
            cap_prm: zero(),
            cap_eff: zero(),
            cap_bnd: zero(),
            namespaces: ["net:[110]", "pid:[111]"]
                .iter()
                .map(|id| plimsoll_wire::WallNamespace {
                    name: id[..3].to_owned(),
                    id: (*id).to_owned(),
                    same_as_host: None,
                })
                .collect(),
            root_read_only: true,
            network_interfaces: vec!["lo".into()],
            ..plimsoll_wire::Wall::default()
        };
        let judged = p.judged_wall(wall.clone(), &run).unwrap();
        // Marked on the host: gVisor's namespaces are not the daemon's.
        assert!(
            judged
                .namespaces
                .iter()
                .all(|n| n.same_as_host == Some(false))
        );
        for (what, breach) in [
            (
                "uid",
                plimsoll_wire::Wall {
                    uid: 0,
                    ..wall.clone()
                },
            ),
            (
                "capabilities",
                plimsoll_wire::Wall {
                    cap_eff: Some("0000000000000400".into()),
                    ..wall.clone()
                },
            ),
            (
                "network",
                plimsoll_wire::Wall {
                    network_interfaces: vec!["eth0".into(), "lo".into()],
                    ..wall.clone()
                },
            ),
        ] {
            match p.judged_wall(breach, &run) {
                Err(e @ LaunchError::NotStarted { .. }) => {
                    assert_eq!(e.not_dispatched(), Some(plimsoll_wire::Reason::Environment));
                    assert!(
                        e.message().contains(&format!("{what}: ")),
                        "{}",
                        e.message()
                    );
                }
                other => panic!("{what}: {other:?}"),
            }
        }
        // A trial's agent: root holding exactly CAP_SETUID and CAP_SETGID, and only in a
        // trial; the run's own wall is refused there.
        let two = Some("00000000000000c0".to_owned());
        let trial = plimsoll_wire::Wall {
            uid: 0,
            euid: 0,
            gid: 0,
            cap_prm: two.clone(),
            cap_eff: two.clone(),
            cap_bnd: two,
            ..wall.clone()
        };
        assert!(p.judged_wall(trial.clone(), &trial_plan).is_ok());
        for (wall, is_trial) in [(trial, false), (wall, true)] {
            let e = p
                .judged_wall(wall, if is_trial { &trial_plan } else { &run })
                .unwrap_err();
            assert_eq!(e.not_dispatched(), Some(plimsoll_wire::Reason::Environment));
        }
    }

    #[test]
    fn a_trial_run_gets_the_runner_and_both_uids() {
        let tmp = tempfile::tempdir().unwrap();
        let agent = tmp.path().join("plimsoll-agent");
        fs::write(&agent, b"").unwrap();
        let c = OciConfig::new(
            RuntimeKind::Runc,
            "/img".into(),
            agent.clone(),
            "/p".into(),
            1,
        );
        assert_eq!(c.trial_runner, tmp.path().join("plimsoll-trial-runner"));
        let p = OciProvider::new(c.clone());
        let trial = project_plan(&["plimsoll-trial-runner --scenario s.json -- node c.js"]);

        // No runner: refused before anything is written or started.
        match p.project_launch(&trial) {
            Err(e @ LaunchError::NotStarted { .. }) => {
                let (reason, message) = (e.not_dispatched().expect("not started"), e.message());
                assert_eq!(reason, plimsoll_wire::Reason::Environment);
                assert!(
                    message.contains("cargo build -p plimsoll-trial")
                        && message.contains("[oci] trial_runner")
                        && message.contains(&c.trial_runner.display().to_string()),
                    "{message}"
                );
            }
            other => panic!("a missing runner was not refused: {other:?}"),
        }

        fs::write(&c.trial_runner, b"").unwrap();
        let launch = p.project_launch(&trial).unwrap();
        assert_eq!(
            launch.binds,
            [
                ("plimsoll-agent".to_owned(), agent.clone()),
                (TRIAL_RUNNER.to_owned(), c.trial_runner.clone()),
            ]
        );
        assert_eq!(
            job_of(&launch).trial,
            Some(plimsoll_wire::trial_step::TrialIds {
                uid: 2_000_010,
                gid: 2_000_011,
                controller_uid: 2_000_020,
                controller_gid: 2_000_021,
            })
        );
        // The job holds the scenarios: in no file, handed over on the agent's input once
        // its wall (uid 0 holding exactly the two capabilities) matched.
        assert!(launch.files.iter().all(|(n, _)| n != "job.json"));
        assert!(launch.handed_over.is_some());
        assert_eq!(launch.args, [format!("{}/plimsoll-agent", spec::TOOLS_DIR)]);

        // Without a trial step: no runner, no ids, whether or not the runner exists.
        let plain = project_plan(&["echo plimsoll-trial-runner"]);
        let launch = p.project_launch(&plain).unwrap();
        assert_eq!(launch.binds, [("plimsoll-agent".to_owned(), agent)]);
        assert_eq!(job_of(&launch).trial, None);
        // Any other project's job is handed over on the agent's input once its wall matched.
        assert!(launch.handed_over.is_some());
        assert_eq!(launch.args, [format!("{}/plimsoll-agent", spec::TOOLS_DIR)]);
        fs::remove_file(&c.trial_runner).unwrap();
        assert!(p.project_launch(&plain).is_ok());

        // A trial step smuggling shell: refused as the request's fault, runner or not.
        let bad = project_plan(&[
            "echo ok",
            "plimsoll-trial-runner --scenario s.json -- node c.js; id",
        ]);
        match p.project_launch(&bad) {
            Err(e @ LaunchError::NotStarted { .. }) => {
                let (reason, message) = (e.not_dispatched().expect("not started"), e.message());
                assert_eq!(reason, plimsoll_wire::Reason::Request);
                assert!(message.starts_with("step 2 holds `;`"), "{message}");
            }
            other => panic!("a smuggling trial step was not refused: {other:?}"),
        }
    }

    #[test]
    fn a_relative_or_missing_image_is_refused() {
        let mut c = OciConfig::new(
            RuntimeKind::Crun,
            "relative/img".into(),
            "/a".into(),
            "/p".into(),
            1,
        );
        let p = OciProvider::new(c.clone());
        assert!(p.rootfs().unwrap_err().to_string().contains("not absolute"));
        c.image = "/nonexistent/plimsoll-image".into();
        let p = OciProvider::new(c);
        assert!(p.rootfs().unwrap_err().to_string().contains("build-image"));
        assert!(
            p.image_identity()
                .unwrap_err()
                .to_string()
                .contains("build-image")
        );
    }

    /// Cached evidence is taken only while the image is the one it was taken on.
    #[test]
    fn cached_evidence_of_another_image_is_not_adopted() {
        let tmp = tempfile::tempdir().unwrap();
        let old = format!("sha256:{}", "a".repeat(64));
        let new = format!("sha256:{}", "b".repeat(64));
        fs::write(tmp.path().join("identity"), format!("{old}\n")).unwrap();
        let p = OciProvider::new(OciConfig::new(
            RuntimeKind::Crun,
            tmp.path().to_path_buf(),
            "/a".into(),
            "/p".into(),
            1,
        ));
        let evidence = plimsoll_wire::Evidence {
            provider: "crun".into(),
            isolation: Tier::Container,
            config: Default::default(),
            binaries: vec![],
            probe: None,
            checks: Default::default(),
            environment: old.clone(),
            checked_unix_ms: 1,
        };
        p.adopt(&evidence).unwrap();
        // `make images` rebuilt it.
        fs::write(tmp.path().join("identity"), format!("{new}\n")).unwrap();
        let e = p.adopt(&evidence).unwrap_err();
        assert_eq!(
            e,
            plimsoll_sandbox::Stale::ImageChanged {
                now: new.clone(),
                then: old.clone()
            }
        );
        let e = e.to_string();
        assert!(e.contains(&new) && e.contains(&old), "{e}");
    }

    #[test]
    fn a_symlinked_rootfs_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        fs::create_dir_all(real.join("rootfs")).unwrap();
        let link = tmp.path().join("link");
        fs::create_dir(&link).unwrap();
        std::os::unix::fs::symlink(real.join("rootfs"), link.join("rootfs")).unwrap();
        let mk = |image: PathBuf| {
            OciProvider::new(OciConfig::new(
                RuntimeKind::Runc,
                image,
                "/a".into(),
                "/p".into(),
                1,
            ))
        };
        assert!(
            mk(link)
                .rootfs()
                .unwrap_err()
                .to_string()
                .contains("not a directory")
        );
        let ok = mk(fs::canonicalize(&real).unwrap()).rootfs().unwrap();
        assert!(ok.ends_with("rootfs"));
    }
}
