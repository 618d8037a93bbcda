//! What every provider shares: the [`Provider`] trait, the fully resolved [`LaunchPlan`] the
//! engine hands it, and the errors a launch can end in.
//!
//! Policy is decided before a plan exists (by the engine); code here and in the providers
//! applies a plan and never re-decides it.

pub mod broker;
pub mod caps;
pub mod capture;
pub mod cgroup;
pub mod deadline;
pub mod error;
pub mod evidence;
pub mod fds;
pub mod judge;
pub mod mux;
pub mod reap;
pub mod session;
pub mod spawn;
pub mod uidlease;
pub mod wall;
pub mod warm;
pub mod watchdog;

use std::path::PathBuf;
use std::time::Duration;

pub use broker::{BROKER_FD, BrokerChannel, BrokerPort};
pub use capture::{CaptureError, CaptureLimits, Captured, OutputTap, capture};
pub use error::{
    CancelRunError, Cause, CloseSessionError, LaunchError, ReadFileError, Stale, Unsupported,
    Withdrawn, error_chain,
};
pub use plimsoll_sys::exec::{PreExec, Step};
use plimsoll_wire::{Evidence, RunResult, RunSpec, Tier};
pub use reap::{EndProcessesError, end_processes_of_uid};
pub use session::SessionSandbox;
pub use spawn::{Running, Spawn, SpawnError, spawned_total};
pub use uidlease::{UidLease, lease_dir, try_lease};
pub use warm::{Teardown, WarmMember, WarmPlan, WarmShape};

/// Python's flags for a snippet, cold or warm, at every provider: isolated mode (no
/// environment, no user site, script directory not on the path) and no bytecode written.
pub const PYTHON_FLAGS: &[&str] = &["-I", "-B"];

/// The file a snippet of `language` is written to, beside whatever its interpreter preloads.
pub fn snippet_file(language: plimsoll_wire::Language) -> &'static str {
    match language {
        plimsoll_wire::Language::Javascript => "main.js",
        plimsoll_wire::Language::Python => "main.py",
    }
}

/// The inodes a writable tmpfs of `bytes` may hold: one per KiB, at least 64. A file that
/// holds no bytes takes no space but still costs the kernel an inode and a dentry, so without
/// this a run could make millions under any disk limit (the kernel's default is half the
/// host's pages). Every provider's work directory, `/tmp` and `/dev/shm` carry it.
pub fn tmpfs_inodes(bytes: u64) -> u64 {
    (bytes / 1024).max(64)
}

/// Limits with every value decided: the request's ask, bounded by the operator's maximums,
/// or the operator's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedLimits {
    /// Wall-clock budget of the whole run.
    pub timeout: Duration,
    /// Memory, in bytes.
    pub memory_bytes: u64,
    /// Bytes kept per output stream per step.
    pub output_bytes: u64,
    /// Processes and threads at once.
    pub pids: u64,
    /// Writable disk, in bytes.
    pub disk_bytes: u64,
    /// Bytes kept per artifact.
    pub artifact_bytes: u64,
}

/// The image a run, a warm member or a session runs in, as the engine resolved it from the
/// image store: the provider mounts `rootfs` read-only (crun, runc, runsc) or boots `disk`
/// (qemu) and never looks the image up itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunImage {
    /// Its name.
    pub name: String,
    /// `sha256:` over its manifest: what the record states.
    pub identity: String,
    /// Its root file system: an absolute, real directory.
    pub rootfs: PathBuf,
    /// Its VM disk, made from this identity, when it has one.
    pub disk: Option<PathBuf>,
    /// Whether the request named it (by name or identity) rather than getting the default.
    pub named: bool,
}

impl RunImage {
    /// Its name and identity, as a record states them.
    pub fn reference(&self) -> plimsoll_wire::ImageRef {
        plimsoll_wire::ImageRef {
            name: self.name.clone(),
            identity: self.identity.clone(),
        }
    }
}

/// Everything a provider needs to run one request, fully decided.
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    /// A fresh id for this sandbox, unique on this host; names its directory, container,
    /// cgroup. Never the caller's request id, which the caller chooses.
    pub run_id: String,
    /// The caller's request id, for logs only.
    pub request_id: String,
    /// What to run.
    pub spec: RunSpec,
    /// Limits.
    pub limits: ResolvedLimits,
    /// The unprivileged uid the code runs as; no other run holds it at the same time.
    pub uid: u32,
    /// The gid the code runs as.
    pub gid: u32,
    /// The run's second uid, also unique to it: a trial's controller runs as this uid
    /// (docs/trials.md). Unused by runs without a trial step.
    pub controller_uid: u32,
    /// The controller's gid.
    pub controller_gid: u32,
    /// Where the provider may keep this run's files; created by the provider, removed after.
    pub run_dir: PathBuf,
    /// The run's broker, when the request named a grant the caller may use: the provider
    /// hands it a stream connected to the sandbox (see [`broker`]) and preloads the
    /// in-sandbox client. `None`: the run has no channel out at all.
    pub broker: Option<BrokerChannel>,
    /// What the sandbox's first process holds, decided where the plan is made (the engine's
    /// `plan()`); a provider applies it and never looks at the steps to decide it.
    pub privileges: Privileges,
    /// Where the run's output also goes as it is read (a streamed answer), where the
    /// provider reads the code's output itself as it comes; `None`: only into the result.
    pub tap: Option<capture::OutputTap>,
    /// The image to run in, resolved by the engine. `None` where the provider has no image
    /// (the process tier) and in operator tools' and tests' plans, where a provider with
    /// images uses the image it was configured with.
    pub image: Option<RunImage>,
}

/// What a run's first process may hold inside its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privileges {
    /// Starts as the run's uid with no capability at all: every run without a trial step.
    Unprivileged,
    /// A run with a trial step: the agent starts as uid 0 holding exactly CAP_SETUID and
    /// CAP_SETGID, works as the run's uid, and hands the two only to the trial runner, which
    /// runs the controller as the run's controller uid (docs/trials.md). The trial runner is
    /// bound into the sandbox for this run alone.
    TrialRunner,
    /// A session's agent at runsc (`plimsoll-agent --drop-to UID:GID --session`): starts as
    /// uid 0 holding exactly CAP_SETUID and CAP_SETGID and drops to the run's uid and gid,
    /// every id and both capabilities, before it reads or says anything; only its bounding
    /// set keeps the two, which no process of the session can use (no_new_privs). What the
    /// code gets is what [`Privileges::Unprivileged`] gives; what differs is that the
    /// agent's standard input and output, made while it was uid 0, stay uid 0's, so the code
    /// cannot reopen them through gVisor's /proc (docs/sessions.md, "The agent's channel").
    /// The provider chooses it for its session's agent: how the agent starts, not what the
    /// code may do.
    DropsToRunUid,
}

impl Privileges {
    /// The one rule: a run gets the trial runner's privileges exactly when a step of it is a
    /// trial step (well-formed or not: a malformed one is refused before it gets them, by
    /// request validation and again by the provider).
    pub fn for_spec(spec: &RunSpec) -> Self {
        if plimsoll_wire::trial_step::has_trial_step(spec) {
            Privileges::TrialRunner
        } else {
            Privileges::Unprivileged
        }
    }

    /// True for [`Privileges::TrialRunner`].
    pub fn is_trial(self) -> bool {
        self == Privileges::TrialRunner
    }

    /// True when the sandbox's first process starts as uid 0 with CAP_SETUID and CAP_SETGID
    /// ([`Privileges::TrialRunner`], [`Privileges::DropsToRunUid`]).
    pub fn starts_as_root(self) -> bool {
        self != Privileges::Unprivileged
    }
}

impl LaunchPlan {
    /// The run's two uids as the agent is told them, in a run with the trial runner's
    /// privileges; `None` in every other run.
    pub fn trial_ids(&self) -> Option<plimsoll_wire::trial_step::TrialIds> {
        self.privileges
            .is_trial()
            .then_some(plimsoll_wire::trial_step::TrialIds {
                uid: self.uid,
                gid: self.gid,
                controller_uid: self.controller_uid,
                controller_gid: self.controller_gid,
            })
    }
}

/// What a provider returns for a run that happened.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The result.
    pub result: RunResult,
    /// When the sandbox was started, Unix milliseconds.
    pub started_unix_ms: u64,
    /// When the result was complete, Unix milliseconds.
    pub ended_unix_ms: u64,
}

/// The outcome of a provider's startup probe.
#[derive(Debug, Clone)]
pub struct Probed {
    /// The tier the evidence supports (a VM under TCG says `kernel`).
    pub tier: Tier,
    /// What was checked.
    pub evidence: Evidence,
    /// `Ok` when every check passed; otherwise why the provider is not offered and what to do.
    pub available: Result<(), Withdrawn>,
}

/// The sandbox a dispatched run is running in, as [`Provider::cancel`] finds it: a cold
/// run's own (named by its run id), or the warm member's that took it (`warm-<hex>`, its
/// own uid); a session's, for a call in it. Whoever dispatches a run knows which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningIn {
    /// The id that names its directory, container and cgroups.
    pub id: String,
    /// The uid its code runs as.
    pub uid: u32,
}

impl RunningIn {
    /// The sandbox made for `plan` alone (a cold run, a session): named by its run id, as
    /// its uid.
    pub fn made_for(plan: &LaunchPlan) -> Self {
        RunningIn {
            id: plan.run_id.clone(),
            uid: plan.uid,
        }
    }
}

/// A provider family: one kind of wall.
pub trait Provider: Send + Sync {
    /// The name requests and results use.
    fn name(&self) -> &str;
    /// The tier this provider is built to give; the probe's evidence may say less.
    fn nominal_tier(&self) -> Tier;
    /// A rough start-up cost, used to prefer the cheapest provider among those that meet a
    /// floor (lower is cheaper; about a trivial run's milliseconds).
    fn cost(&self) -> u32;
    /// `Err(why)` when this provider cannot do this kind of run at all.
    fn supports(&self, spec: &RunSpec) -> Result<(), Unsupported>;
    /// `Err(why)` when this provider cannot run in `image` (the process tier has no image;
    /// the VM provider needs a disk made from it). By default every image.
    fn takes_image(&self, image: &RunImage) -> Result<(), Unsupported> {
        let _ = image;
        Ok(())
    }
    /// Whether a run here runs in an image at all; `false` at the process tier, whose plans
    /// carry none and whose records name none.
    fn uses_image(&self) -> bool {
        true
    }
    /// The least `memory_bytes` a run of `spec` can start under here, when it is more than
    /// the protocol's own minimum (`plimsoll_wire::Limits::MIN_MEMORY_BYTES`): the engine
    /// routes a run asking for less elsewhere, or refuses it (`unsupported`), rather than let
    /// it fail while its sandbox is set up. By default none.
    fn memory_floor(&self, spec: &RunSpec) -> Option<u64> {
        let _ = spec;
        None
    }
    /// Runs the probe inside the wall and judges what it saw. Slow; called at start-up and
    /// when evidence is re-checked.
    fn probe(&self) -> Probed;
    /// Runs one plan. Blocks until the run is over and its sandbox is gone.
    fn run(&self, plan: &LaunchPlan) -> Result<Outcome, LaunchError>;
    /// Runs one plan as [`Provider::run`] does, except that the removal of what is left of
    /// its sandbox once its processes are dead (directories, mounts, cgroups, the runtime's
    /// state) may be returned as a [`Teardown`] instead of done. The caller answers first and
    /// runs the teardown off the answer's path, keeping the plan's uids out of use until it
    /// has ended. By default nothing is deferred.
    fn run_then_tear_down(
        &self,
        plan: &LaunchPlan,
    ) -> Result<(Outcome, Option<Teardown>), LaunchError> {
        self.run(plan).map(|o| (o, None))
    }
    /// True when [`Provider::run`] carries a plan's [`LaunchPlan::broker`] into the sandbox.
    /// The engine never gives a run with a grant to a provider that says no.
    fn supports_broker(&self) -> bool {
        false
    }
    /// True when, for a plan whose broker carries an egress grant
    /// ([`BrokerChannel::egress`]), the sandbox's projects and sessions get the proxy
    /// endpoint: `HTTPS_PROXY` and its kin pointing at a loopback port inside whose
    /// connections reach the broker (docs/capability-grants.md, "Egress").
    fn supports_egress(&self) -> bool {
        false
    }
    /// Whether what `evidence` names as a run's environment is still what a run here would
    /// get, checked cheaply before every run (at crun, runc and runsc: the image's identity,
    /// which a rebuild changes). The engine refuses a run on a provider whose environment
    /// moved (not dispatched, `environment`) and probes it again.
    fn environment_holds(&self, _evidence: &plimsoll_wire::Evidence) -> Result<(), Stale> {
        Ok(())
    }
    /// Takes `evidence` from an earlier probe of this host (the engine's evidence cache)
    /// instead of probing: sets what the provider learns only from a probe, or says why this
    /// evidence no longer describes it (then it is probed again). The cache has already
    /// checked every binary the evidence names.
    fn adopt(&self, evidence: &plimsoll_wire::Evidence) -> Result<(), Stale> {
        let _ = evidence;
        Ok(())
    }
    /// True when [`Provider::warm`] makes members.
    fn warms(&self) -> bool {
        false
    }
    /// Makes one warm member for `plan`: a fresh sandbox, started, its interpreter waiting
    /// for one run's code ([`warm`]). Blocks until it waits.
    fn warm(&self, plan: &WarmPlan) -> Result<Box<dyn WarmMember>, LaunchError> {
        let _ = plan;
        Err(LaunchError::not_started(
            plimsoll_wire::Reason::Unsupported,
            Unsupported::NoWarmPool,
        ))
    }
    /// Ends a dispatched run early (its client went away): kills the processes of the
    /// sandbox it runs in, `sandbox` (its own, or the warm member's that took it), by this
    /// provider's means. Called from another thread while [`Provider::run`] (or a member's
    /// run) is under way, perhaps more than once, perhaps before the sandbox's processes
    /// exist; the run then ends as a killed run does. By default, every process of the
    /// sandbox's uid (the process tier's child, a jailed QEMU).
    fn cancel(&self, sandbox: &RunningIn) -> Result<(), CancelRunError> {
        end_processes_of_uid(sandbox.uid, Duration::from_secs(5)).map_err(|e| CancelRunError::End {
            sandbox: sandbox.id.clone(),
            uid: sandbox.uid,
            cause: Box::new(e),
        })
    }
    /// True when [`Provider::open_session`] keeps sessions.
    fn opens_sessions(&self) -> bool {
        false
    }
    /// Opens a session's sandbox for `plan` ([`session`]): started, its wall judged and
    /// read, its interpreter waiting for cells. `lifetime` bounds it even if the daemon dies
    /// (the watchdog outside the daemon ends it then). Blocks until it is ready.
    fn open_session(
        &self,
        plan: &LaunchPlan,
        lifetime: Duration,
    ) -> Result<Box<dyn SessionSandbox>, LaunchError> {
        let _ = (plan, lifetime);
        Err(LaunchError::not_started(
            plimsoll_wire::Reason::Unsupported,
            Unsupported::NoSessions,
        ))
    }
    /// Opens a session's sandbox for `plan` from a snapshot's `image` (written by
    /// [`SessionSandbox::checkpoint`] at this provider): its processes as they were, its
    /// wall read and judged for `plan` (whose uid is the snapshot's), bounded by `lifetime`.
    /// Nothing in it is re-seeded here: the engine does that before the session is served.
    fn restore_session(
        &self,
        plan: &LaunchPlan,
        lifetime: Duration,
        image: &std::path::Path,
    ) -> Result<Box<dyn SessionSandbox>, LaunchError> {
        let _ = (plan, lifetime, image);
        Err(LaunchError::not_started(
            plimsoll_wire::Reason::Unsupported,
            "this provider's sessions cannot be restored from a snapshot",
        ))
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
