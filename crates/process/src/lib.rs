//! The process-tier provider: JavaScript and Python snippets as a hardened child process.
//! No wall for hostile code (docs/isolation-tiers.md).
//!
//! Each run gets a fresh directory (`code/` root-owned and read-only to the run, `work/` its
//! own and its working directory, a tmpfs of `disk_bytes`), its own unprivileged uid, a
//! memory cgroup of `memory_bytes` holding all its processes, an empty environment, rlimits,
//! landlock and a seccomp deny list ([`policy`]). When it ends, every process of its uid is
//! killed and the directory, its mount and the cgroup removed; [`ProcessProvider::reap`]
//! removes what a killed daemon left.
//!
//! A run with a grant also gets its broker channel: one end of a socketpair, inherited at
//! descriptor 3 and by nothing else, with the in-sandbox client preloaded (`node --require`,
//! or the code directory put on Python's path). seccomp still denies `socket()`, so the
//! channel is the run's only way out.

mod bounds;
mod harden;
mod launch;
pub mod policy;
pub mod probe;
mod warm;

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Mutex;

use plimsoll_sandbox::{LaunchError, LaunchPlan, Outcome, Probed, Provider};
use plimsoll_wire::{Bytes, Language, Reason, RunResult, RunSpec, Tier};

use crate::launch::{Launch, RunDir, error_chain, launch_and_clean};
pub use crate::launch::{ReapReport, WATCHDOG_GRACE};

/// Where the process provider finds what it runs.
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    /// The node binary.
    pub node: PathBuf,
    /// The python3 binary.
    pub python: PathBuf,
    /// The probe program (`plimsoll-probe`).
    pub probe: PathBuf,
    /// The daemon's state directory; the probe runs under `<state_dir>/runs/` and checks
    /// that it cannot write here.
    pub state_dir: PathBuf,
    /// The uid (and gid) the probe runs as. Must not be one of the run uids: the probe may
    /// run while runs are in flight, and the end of a run kills every process of its uid.
    pub probe_uid: u32,
}

/// The least `memory_bytes` a JavaScript snippet starts under at the process tier, whose
/// `RLIMIT_AS` is `memory_bytes`: node reserves about 700 MiB of address space before it runs
/// anything (measured with node 20: it does not start at 640 MiB, does at 768 MiB), 768 MiB.
pub const NODE_MEMORY_FLOOR: u64 = 768 * 1024 * 1024;

/// The process-tier provider.
#[derive(Debug)]
pub struct ProcessProvider {
    config: ProcessConfig,
    /// Probes share one uid and must not overlap.
    probing: Mutex<()>,
}

impl ProcessProvider {
    /// A provider with this configuration. Nothing is checked until [`Provider::probe`].
    pub fn new(config: ProcessConfig) -> Self {
        ProcessProvider {
            config,
            probing: Mutex::new(()),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ProcessConfig {
        &self.config
    }

    /// Removes what runs of a killed daemon left: their processes, work tmpfs, memory cgroup
    /// and run directory (holding the caller's code). Safe while runs are in flight; the
    /// probe calls it, so a daemon's start-up clears its predecessor's leftovers.
    pub fn reap(&self) -> ReapReport {
        launch::reap(
            &self.config.state_dir.join("runs"),
            &plimsoll_sandbox::lease_dir(&self.config.state_dir),
        )
    }
}

pub use plimsoll_sandbox::PYTHON_FLAGS;

/// With a broker channel, Python starts here: `-I` keeps every directory off `sys.path`, so
/// this puts the code directory (holding `plimsoll_host.py`) there and runs the snippet as
/// `__main__`, its line numbers unchanged. The snippet's path is the argument after `-c`.
pub const PYTHON_BOOT: &str = "import sys, runpy; p = sys.argv.pop(1); sys.argv[0] = p; \
sys.path.insert(0, p.rpartition('/')[0]); runpy.run_path(p, run_name='__main__')";

/// Writes the snippet (and, with a broker, its client) into the code directory; returns the
/// interpreter, its arguments, and the sandbox's end of the broker channel, already being
/// served. `Err` is a message: nothing was started.
fn prepare_code<'a>(
    dir: &RunDir,
    language: &Language,
    code: &str,
    plan: &LaunchPlan,
    config: &'a ProcessConfig,
) -> Result<(&'a std::path::Path, Vec<OsString>, Option<OwnedFd>), String> {
    use plimsoll_sandbox::broker::{JS_CLIENT, JS_CLIENT_FILE, PYTHON_CLIENT, PYTHON_CLIENT_FILE};
    let add = |name: &str, content: &str| {
        dir.add_code(name, content.as_bytes(), 0o640)
            .map(PathBuf::into_os_string)
            .map_err(|e| error_chain(&e))
    };
    let broker = plan.broker.as_ref();
    let (interpreter, args) = match language {
        Language::Javascript => {
            let mut args = Vec::new();
            if broker.is_some() {
                args.push("--require".into());
                args.push(add(JS_CLIENT_FILE, JS_CLIENT)?);
            }
            args.push(add("main.js", code)?);
            (config.node.as_path(), args)
        }
        Language::Python => {
            let mut args: Vec<OsString> = PYTHON_FLAGS.iter().map(Into::into).collect();
            if broker.is_some() {
                add(PYTHON_CLIENT_FILE, PYTHON_CLIENT)?;
                args.push("-c".into());
                args.push(PYTHON_BOOT.into());
            }
            args.push(add("main.py", code)?);
            (config.python.as_path(), args)
        }
    };
    let channel = match broker {
        None => None,
        Some(b) => {
            let (ours, theirs) =
                UnixStream::pair().map_err(|e| format!("cannot make the broker channel: {e}"))?;
            b.serve_stream(ours)
                .map_err(|e| format!("cannot start serving the broker channel: {e}"))?;
            Some(OwnedFd::from(theirs))
        }
    };
    Ok((interpreter, args, channel))
}

/// A snippet's result from its captured output (the engine adds how it started).
fn snippet_result(c: plimsoll_sandbox::Captured, oom_killed: bool) -> RunResult {
    RunResult {
        exit_code: c.exit_code,
        signal: c.signal,
        timed_out: c.timed_out,
        oom_killed,
        stdout: Bytes(c.stdout),
        stdout_truncated: c.stdout_truncated,
        stderr: Bytes(c.stderr),
        stderr_truncated: c.stderr_truncated,
        ..RunResult::default()
    }
}

impl Provider for ProcessProvider {
    fn name(&self) -> &str {
        "process"
    }
    fn nominal_tier(&self) -> Tier {
        Tier::Process
    }
    fn cost(&self) -> u32 {
        2
    }
    fn supports(&self, spec: &RunSpec) -> Result<(), plimsoll_sandbox::Unsupported> {
        match spec {
            RunSpec::Snippet(_) => Ok(()),
            RunSpec::Project(_) => Err(plimsoll_sandbox::Unsupported::SnippetsOnly),
        }
    }
    /// The host's interpreters, no image: a request that names one is not for this tier.
    fn takes_image(
        &self,
        image: &plimsoll_sandbox::RunImage,
    ) -> Result<(), plimsoll_sandbox::Unsupported> {
        if image.named {
            return Err(plimsoll_sandbox::Unsupported::NoImage(image.name.clone()));
        }
        Ok(())
    }
    fn uses_image(&self) -> bool {
        false
    }
    /// node reserves most of its address space at start, which `RLIMIT_AS` (= the run's
    /// `memory_bytes`) bounds here: below [`NODE_MEMORY_FLOOR`] it exits before it waits
    /// for its code.
    fn memory_floor(&self, spec: &RunSpec) -> Option<u64> {
        match spec {
            RunSpec::Snippet(s) if s.language == plimsoll_wire::Language::Javascript => {
                Some(NODE_MEMORY_FLOOR)
            }
            _ => None,
        }
    }
    fn probe(&self) -> Probed {
        let _one_at_a_time = self.probing.lock().unwrap_or_else(|p| p.into_inner());
        probe::probe(self)
    }
    fn supports_broker(&self) -> bool {
        true
    }
    fn warms(&self) -> bool {
        true
    }
    fn warm(
        &self,
        plan: &plimsoll_sandbox::WarmPlan,
    ) -> Result<Box<dyn plimsoll_sandbox::WarmMember>, LaunchError> {
        if !rustix::process::geteuid().is_root() {
            return Err(LaunchError::environment(
                "the process provider must run as root to give each member its own uid",
            ));
        }
        Ok(Box::new(warm::make(&self.config, plan)?))
    }
    fn run(&self, plan: &LaunchPlan) -> Result<Outcome, LaunchError> {
        plimsoll_sandbox::warm::tear_down_now(self.run_then_tear_down(plan))
    }
    fn run_then_tear_down(
        &self,
        plan: &LaunchPlan,
    ) -> Result<(Outcome, Option<plimsoll_sandbox::Teardown>), LaunchError> {
        let RunSpec::Snippet(snippet) = &plan.spec else {
            return Err(LaunchError::not_started(
                Reason::Unsupported,
                plimsoll_sandbox::Unsupported::SnippetsOnly,
            ));
        };
        if !rustix::process::geteuid().is_root() {
            return Err(LaunchError::environment(
                "the process provider must run as root to give each run its own uid: start the daemon as root, or configure another provider",
            ));
        }
        // A snippet runs in a member made for it (with the run's broker channel, if it has
        // one): its wall is read and checked before its code is handed over.
        if let Some(member) = plimsoll_sandbox::warm::cold_member_plan(plan, true) {
            let member = Box::new(warm::make_for(&self.config, &member, plan.broker.as_ref())?);
            return plimsoll_sandbox::warm::run_made(member, plan);
        }
        let dir = RunDir::create(&plan.run_dir, plan.uid, plan.gid, plan.limits.disk_bytes)
            .map_err(|e| LaunchError::environment(error_chain(&e)))?;
        let prepared = prepare_code(&dir, &snippet.language, &snippet.code, plan, &self.config);
        let (interpreter, args, channel) = match prepared {
            Ok(p) => p,
            Err(message) => {
                let e = LaunchError::environment(message);
                return Err(match launch::clean(plan.uid, &dir) {
                    Ok(()) => e,
                    Err(c) => e.with_cleanup(c),
                });
            }
        };
        let launched = launch_and_clean(
            Launch {
                program: interpreter,
                args,
                uid: plan.uid,
                gid: plan.gid,
                limits: &plan.limits,
                channel,
            },
            dir,
        )?;
        let outcome = Outcome {
            result: snippet_result(launched.captured, launched.oom_killed),
            started_unix_ms: launched.started_unix_ms,
            ended_unix_ms: launched.ended_unix_ms,
        };
        Ok((outcome, None))
    }
}
