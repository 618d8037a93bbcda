//! Warm members at the process tier: a run directory, memory cgroup and hardened child made
//! as for a cold run, its interpreter started and blocked reading its standard input. A claim
//! writes the code into the code directory, sends `go`, and captures the run as a cold one
//! is captured; the member is then killed and removed. Grants and trial steps never claim a
//! member (it has no broker channel and no privileges): they run cold.

use std::ffi::OsString;
use std::io::Write as _;
use std::time::Duration;

use plimsoll_sandbox::judge::{Expectations, HostView};
use plimsoll_sandbox::warm::{self, GO, WarmMember, WarmPlan, WarmShape};
use plimsoll_sandbox::{
    CaptureLimits, Cause, LaunchError, LaunchPlan, Outcome, ResolvedLimits, Running, Spawn,
    Teardown, capture, unix_ms_now,
};
use plimsoll_wire::{Language, Reason};

use crate::ProcessConfig;
use crate::bounds::MemoryCgroup;
use crate::harden::Hardening;
use crate::launch::{RunDir, WATCHDOG_GRACE, clean, error_chain};

/// How long a new member's interpreter may take to start and reach its read.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// One idle member.
#[derive(Debug)]
pub struct ProcessMember {
    dir: RunDir,
    cgroup: MemoryCgroup,
    running: Running,
    shape: WarmShape,
    max_timeout: Duration,
    uid: u32,
    main: &'static str,
    /// What its wall must show when claimed: the provider's probe expectations for its uid.
    expected: Expectations,
    /// The host's namespaces, to compare the wall's with.
    host: HostView,
    /// Made for one cold run with that run's broker channel (and its client preloaded).
    brokered: bool,
    /// The run's watchdog outside the daemon, started with the member and given its deadline
    /// at the claim.
    watchdog: plimsoll_sandbox::watchdog::Armed,
}

/// Removes what a member had: every process of its uid, its directory and mount, its cgroup.
fn remove(uid: u32, dir: &RunDir, cgroup: MemoryCgroup) -> Result<(), Cause> {
    let cleaned = clean(uid, dir);
    let removed = cgroup
        .remove()
        .map_err(|e| format!("cannot remove the member's memory cgroup: {e}"));
    match (cleaned, removed) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e.into()),
        (Err(a), Err(b)) => Err(format!("{a}; {b}").into()),
    }
}

/// Makes a member for `plan`: everything a cold run of its shape gets, the interpreter
/// started, and returns once it waits on its input.
pub fn make(config: &ProcessConfig, plan: &WarmPlan) -> Result<ProcessMember, LaunchError> {
    make_for(config, plan, None)
}

/// [`make`], with a cold run's broker channel when it has one: the channel served and handed
/// to the sandbox as a cold run's is, and the in-sandbox client preloaded (JavaScript) or
/// importable from the code directory (Python).
pub fn make_for(
    config: &ProcessConfig,
    plan: &WarmPlan,
    broker: Option<&plimsoll_sandbox::BrokerChannel>,
) -> Result<ProcessMember, LaunchError> {
    let shape = plan.shape;
    let dir = RunDir::create(&plan.run_dir, plan.uid, plan.gid, shape.disk_bytes)
        .map_err(|e| LaunchError::environment(error_chain(&e)))?;
    let cgroup = match MemoryCgroup::create(&dir.name(), shape.memory_bytes) {
        Ok(cg) => cg,
        Err(e) => {
            let e = LaunchError::environment(error_chain(&e));
            return Err(e.after_cleanup(clean(plan.uid, &dir)));
        }
    };
    let started = start(config, plan, &dir, &cgroup, broker).and_then(|(running, main)| {
        match plimsoll_sandbox::watchdog::arm(&[cgroup.procs_path()]) {
            Ok(w) => Ok((running, main, w)),
            Err(e) => {
                running.end();
                Err(LaunchError::environment(format!(
                    "cannot start the member's watchdog: {}",
                    error_chain(&e)
                )))
            }
        }
    });
    match started {
        Ok((running, main, watchdog)) => Ok(ProcessMember {
            dir,
            cgroup,
            running,
            shape,
            max_timeout: plan.max_timeout,
            uid: plan.uid,
            main,
            expected: crate::probe::expectations(plan.uid, &config.state_dir),
            host: HostView::read(),
            brokered: broker.is_some(),
            watchdog,
        }),
        Err(e) => Err(e.after_cleanup(remove(plan.uid, &dir, cgroup))),
    }
}

fn start(
    config: &ProcessConfig,
    plan: &WarmPlan,
    dir: &RunDir,
    cgroup: &MemoryCgroup,
    broker: Option<&plimsoll_sandbox::BrokerChannel>,
) -> Result<(Running, &'static str), LaunchError> {
    let shape = plan.shape;
    let env = |e: &dyn std::error::Error| LaunchError::environment(error_chain(e));
    let procs = cgroup
        .procs_file()
        .map_err(|e| LaunchError::environment(format!("cannot use the memory cgroup: {e}")))?;
    // The limits a cold run of this shape gets; RLIMIT_CPU is set for the longest timeout a
    // run may ask (the run's own is the deadline applied at the claim).
    let limits = ResolvedLimits {
        timeout: plan.max_timeout,
        memory_bytes: shape.memory_bytes,
        output_bytes: 0,
        pids: shape.pids,
        disk_bytes: shape.disk_bytes,
        artifact_bytes: 0,
    };
    // A cold run's broker channel: served from here, its other end the sandbox's, and the
    // client beside the code, as a cold run without a member has them.
    let channel = match broker {
        None => None,
        Some(b) => {
            use plimsoll_sandbox::broker::{
                JS_CLIENT, JS_CLIENT_FILE, PYTHON_CLIENT, PYTHON_CLIENT_FILE,
            };
            let (file, client) = match shape.language {
                Language::Javascript => (JS_CLIENT_FILE, JS_CLIENT),
                Language::Python => (PYTHON_CLIENT_FILE, PYTHON_CLIENT),
            };
            dir.add_code(file, client.as_bytes(), 0o640)
                .map_err(|e| LaunchError::environment(error_chain(&e)))?;
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(|e| {
                LaunchError::environment(format!("cannot make the broker channel: {e}"))
            })?;
            b.serve_stream(ours).map_err(|e| {
                LaunchError::environment(format!("cannot start serving the broker channel: {e}"))
            })?;
            Some(std::os::fd::OwnedFd::from(theirs))
        }
    };
    let hardening = Hardening::prepare(
        &limits,
        plan.uid,
        plan.gid,
        &dir.code,
        &dir.work,
        channel,
        procs.into(),
    )
    .map_err(|e| env(&e))?;
    plimsoll_sandbox::reap::signal_all_as(plan.uid)
        .map_err(|e| LaunchError::environment(format!("cannot clear uid {}: {e}", plan.uid)))?;
    let program = match shape.language {
        Language::Javascript => &config.node,
        Language::Python => &config.python,
    };
    let main = plimsoll_sandbox::snippet_file(shape.language);
    let mut args: Vec<OsString> = Vec::new();
    if broker.is_some() && shape.language == Language::Javascript {
        let client = dir.code.join(plimsoll_sandbox::broker::JS_CLIENT_FILE);
        args.extend(["--require".into(), client.into_os_string()]);
    }
    // `-I` keeps the code directory off sys.path: with a broker, the wait program puts it
    // there (for the client) before it runs the code, as a cold run does.
    let wait = warm::wait_command(
        shape.language,
        &dir.code.join(main),
        broker.is_some(),
        false,
    );
    for (name, text) in &wait.files {
        dir.add_code(name, text.as_bytes(), 0o640)
            .map_err(|e| LaunchError::environment(error_chain(&e)))?;
    }
    args.extend(wait.args.into_iter().map(OsString::from));
    let running = Spawn::new(program, &dir.work)
        .args(&args)
        .stdin_pipe()
        .before_exec(hardening.into_pre_exec())
        .spawn()
        .map_err(|e| env(&e))?;
    if let Err(e) = warm::wait_until_reading(running.child.id(), READY_WITHIN) {
        running.end();
        return Err(LaunchError::environment(format!(
            "the member's interpreter did not come to wait for its code: {e}"
        )));
    }
    Ok((running, main))
}

impl WarmMember for ProcessMember {
    fn uid(&self) -> u32 {
        self.uid
    }

    fn run(self: Box<Self>, plan: &LaunchPlan) -> Result<(Outcome, Teardown), LaunchError> {
        let ProcessMember {
            dir,
            cgroup,
            mut running,
            shape,
            max_timeout,
            uid,
            main,
            expected,
            host,
            brokered,
            watchdog,
        } = *self;
        let claimed = (|| {
            let code = warm::check_claim(plan, &shape, uid, max_timeout, brokered, None)
                .map_err(|e| LaunchError::not_started(Reason::Environment, e))?;
            let wall = plimsoll_sandbox::wall::read(
                running.child.id(),
                &expected,
                &host,
                crate::bounds::layout(),
            )
            .map_err(|e| LaunchError::environment(format!("cannot read the member's wall: {e}")))?;
            plimsoll_sandbox::wall::check(&wall, &expected, &host)
                .map_err(|e| LaunchError::not_started(Reason::Environment, e))?;
            dir.add_code(main, code.as_bytes(), 0o640)
                .map_err(|e| LaunchError::environment(error_chain(&e)))?;
            Ok::<_, LaunchError>(wall)
        })();
        let wall = match claimed {
            Ok(wall) => wall,
            Err(e) => {
                running.end();
                return Err(e.after_cleanup(remove(uid, &dir, cgroup)));
            }
        };
        let limits = CaptureLimits::new(plan.limits.output_bytes, plan.limits.timeout)
            .with_tap(plan.tap.clone());
        let outside = match watchdog.start(plan.limits.timeout + WATCHDOG_GRACE) {
            Ok(w) => w,
            Err(e) => {
                running.end();
                let e = LaunchError::environment(format!(
                    "cannot give the run's watchdog its deadline: {e}"
                ));
                return Err(e.after_cleanup(remove(uid, &dir, cgroup)));
            }
        };
        let started_unix_ms = unix_ms_now();
        let sent = running
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("the member has no input pipe"))
            .and_then(|mut input| input.write_all(GO));
        if let Err(e) = sent {
            running.end();
            let e = LaunchError::may_have_run(format!("cannot hand the member its code: {e}"));
            return Err(e.after_cleanup(remove(uid, &dir, cgroup)));
        }
        let captured = capture(running, &limits);
        let ended_unix_ms = unix_ms_now();
        let oom_killed = cgroup.oom_killed();
        // Whatever the code left running dies now (nothing to do, and no process to fork
        // for it, when its cgroup is empty); the rest of the removal (the watchdog's end too)
        // is off the answer's path.
        if !cgroup.is_empty() {
            let _ = plimsoll_sandbox::reap::signal_all_as(uid);
        }
        let teardown = Teardown::new(move || {
            drop(outside);
            remove(uid, &dir, cgroup)
        });
        let c = match captured {
            Ok(c) => c,
            Err(e) => {
                let e = LaunchError::may_have_run(error_chain(&e));
                return Err(e.after_cleanup(teardown.run()));
            }
        };
        let mut result = crate::snippet_result(c, oom_killed);
        result.wall = Some(wall);
        Ok((
            Outcome {
                result,
                started_unix_ms,
                ended_unix_ms,
            },
            teardown,
        ))
    }

    fn discard(self: Box<Self>) -> Result<(), Cause> {
        let ProcessMember {
            dir,
            cgroup,
            running,
            uid,
            ..
        } = *self;
        running.end();
        remove(uid, &dir, cgroup)
    }
}
