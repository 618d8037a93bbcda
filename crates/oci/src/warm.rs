//! Warm members at crun and runc: a container created and started exactly as a cold run's
//! (the same bundle, limits, uid, mounts and cgroups), its process the interpreter, blocked
//! reading its standard input (a pipe this process holds). A claim writes the code into the
//! run's tools directory (read-only inside, at `/opt/plimsoll/bin`), sends `go`, and follows
//! the container to its end as a cold run is followed; the container is then removed, off
//! the answer's path. At runsc, whose Sentry hides the interpreter from this host's /proc,
//! the container's process is first `plimsoll-agent --wall-then-exec`: it says its wall and
//! becomes the interpreter, which says [`warm::READY_LINE`] when it waits.

use std::io::Write as _;
use std::time::Duration;

use plimsoll_sandbox::warm::{self, GO, READY_LINE, WarmMember, WarmPlan, WarmShape};
use plimsoll_sandbox::{Cause, LaunchError, LaunchPlan, Outcome, Teardown, unix_ms_now};
use plimsoll_wire::{Bytes, Language, Reason, RunResult};

use crate::phases::Phase;
use crate::provider::{Container, LaunchSpec, OciProvider, status_of};
use crate::runtime::{Begin, RuntimeKind};
use crate::spec::TOOLS_DIR;

/// How much of the runtime's standard error a failed `create` of a member keeps.
const CREATE_ERROR_BYTES: u64 = 4096;

/// How long a new member's interpreter may take to start and reach its read.
pub(crate) const READY_WITHIN: Duration = Duration::from_secs(30);

/// One idle member: its container, started, and the plan it was made under.
#[derive(Debug)]
pub struct OciMember {
    provider: OciProvider,
    plan: LaunchPlan,
    container: Container,
    shape: WarmShape,
    max_timeout: Duration,
    main: &'static str,
    /// At runsc: the wall its process said from inside, judged, before it became the
    /// interpreter (nothing ran in the sandbox since: the interpreter only waits).
    said: Option<plimsoll_wire::Wall>,
    /// The run's watchdog outside the daemon, started with the member and given its
    /// deadline at the claim (`None` only while the member is being made).
    watchdog: Option<plimsoll_sandbox::watchdog::Armed>,
    /// Made for one cold run, which logs its phases (a pooled member's idle time is not a
    /// phase of anything).
    cold: bool,
}

/// Makes a member: creates and starts its container, and returns once its interpreter waits.
pub fn make(provider: &OciProvider, plan: &WarmPlan) -> Result<OciMember, LaunchError> {
    make_member(provider, plan, None, false)
}

/// [`make`], for one cold run, with its broker channel when it has one: its socket in the
/// tools directory, served, and the in-sandbox client preloaded (JavaScript) or on
/// `sys.path` (Python), as a cold run without a member has them. The run logs its phases.
pub fn make_cold(
    provider: &OciProvider,
    plan: &WarmPlan,
    broker: Option<&plimsoll_sandbox::BrokerChannel>,
) -> Result<OciMember, LaunchError> {
    make_member(provider, plan, broker, true)
}

fn make_member(
    provider: &OciProvider,
    plan: &WarmPlan,
    broker: Option<&plimsoll_sandbox::BrokerChannel>,
    cold: bool,
) -> Result<OciMember, LaunchError> {
    use plimsoll_sandbox::broker::{JS_CLIENT, JS_CLIENT_FILE, PYTHON_CLIENT, PYTHON_CLIENT_FILE};
    let mut launch_plan = warm::member_plan(plan);
    launch_plan.broker = broker.cloned();
    let tool = |name: &str| format!("{TOOLS_DIR}/{name}");
    // Where the host cannot see the interpreter wait, it says so, and its wall is said first.
    let inside = provider.config().kind == RuntimeKind::Runsc;
    let mut files = Vec::new();
    let mut binds = Vec::new();
    let mut args = Vec::new();
    if inside {
        binds.push(("plimsoll-agent".to_owned(), provider.config().agent.clone()));
        args.extend([tool("plimsoll-agent"), "--wall-then-exec".to_owned()]);
    }
    let language = plan.shape.language;
    match language {
        Language::Javascript => {
            args.push("/usr/bin/node".to_owned());
            if broker.is_some() {
                files.push((JS_CLIENT_FILE.to_owned(), JS_CLIENT.as_bytes().to_vec()));
                args.extend(["--require".to_owned(), tool(JS_CLIENT_FILE)]);
            }
        }
        Language::Python => {
            if broker.is_some() {
                files.push((
                    PYTHON_CLIENT_FILE.to_owned(),
                    PYTHON_CLIENT.as_bytes().to_vec(),
                ));
            }
            args.push("/usr/bin/python3".to_owned());
        }
    }
    let main = plimsoll_sandbox::snippet_file(language);
    let wait = warm::wait_command(
        language,
        std::path::Path::new(&tool(main)),
        broker.is_some(),
        inside,
    );
    files.extend(
        wait.files
            .into_iter()
            .map(|(name, text)| (name.to_owned(), text.into_bytes())),
    );
    args.extend(wait.args);
    let launch = LaunchSpec {
        args,
        files,
        binds,
        // Room for what the runtime says when `create` fails; the claim sets the run's cap
        // (the waiting interpreter writes nothing before, or only its wall and ready line).
        output_bytes: CREATE_ERROR_BYTES,
        deadline: plan.max_timeout,
        env: crate::provider::broker_env(&launch_plan, false),
        handed_over: None,
        wall_inside: false,
    };
    // Created and started at once: its process is the wait program, which runs nothing of a
    // run's until a claim's `go`.
    let mut container = provider.create(&launch_plan, &launch, true, Begin::Run)?;
    // Armed while the interpreter starts, not after.
    let armed = provider.armed_watchdog(&launch_plan);
    container.phases.mark(Phase::Watchdog);
    let started = armed.and_then(|w| {
        let said = if inside {
            said_and_ready(provider, &mut container, &launch_plan).map(Some)
        } else {
            let pid = container.created.pid().as_raw_nonzero().get() as u32;
            warm::wait_until_reading(pid, READY_WITHIN)
                .map(|()| None)
                .map_err(|e| not_waiting(&e))
        };
        said.map(|said| (said, w))
    });
    container.phases.mark(Phase::Ready);
    let member = OciMember {
        provider: provider.clone(),
        plan: launch_plan,
        container,
        shape: plan.shape,
        max_timeout: plan.max_timeout,
        main,
        said: None,
        watchdog: None,
        cold,
    };
    match started {
        Ok((said, w)) => Ok(OciMember {
            said,
            watchdog: Some(w),
            ..member
        }),
        Err(e) => Err(e.after_cleanup(member.remove(false))),
    }
}

/// Where the host cannot see the interpreter wait (runsc): the wall its process said, judged
/// for the member's plan, then the interpreter's ready line.
fn said_and_ready(
    provider: &OciProvider,
    container: &mut Container,
    plan: &LaunchPlan,
) -> Result<plimsoll_wire::Wall, LaunchError> {
    let wall = provider.said_wall(&mut container.created, plan)?;
    container
        .created
        .first_line(std::time::Instant::now() + READY_WITHIN, READY_LINE.len())
        .map_err(|e| not_waiting(&e))
        .and_then(|line| is_ready_line(&line).map_err(|e| not_waiting(&e)))?;
    Ok(wall)
}

/// `line` is [`READY_LINE`], or what it said instead.
fn is_ready_line(line: &[u8]) -> Result<(), String> {
    if line == READY_LINE {
        Ok(())
    } else {
        Err(format!(
            "it said {:?}, not that it waits",
            String::from_utf8_lossy(line)
        ))
    }
}

fn not_waiting(e: &dyn std::fmt::Display) -> LaunchError {
    LaunchError::environment(format!(
        "the member's interpreter did not come to wait for its code: {e}"
    ))
}

impl OciMember {
    /// Kills what is left of the container and removes it, its cgroups and its directory.
    fn remove(self, backstop: bool) -> Result<(), String> {
        let OciMember {
            provider,
            plan,
            container,
            ..
        } = self;
        let Container {
            id,
            run_dir,
            created,
            input,
            ..
        } = container;
        drop(input);
        // Kills and reaps the container's process.
        drop(created);
        provider.clean(&plan, &id, run_dir, backstop)
    }
}

impl OciMember {
    /// The member's wall, read from its waiting interpreter, if it matches what the
    /// provider's probe was judged on for this member's uid and limits; at runsc, the one its
    /// process said (and that was judged) when it was made.
    fn wall(&self) -> Result<plimsoll_wire::Wall, LaunchError> {
        if let Some(said) = &self.said {
            return Ok(said.clone());
        }
        let pid = self.container.created.pid().as_raw_nonzero().get() as u32;
        self.provider.checked_wall(pid, &self.plan)
    }
}

impl WarmMember for OciMember {
    fn uid(&self) -> u32 {
        self.plan.uid
    }

    fn run(mut self: Box<Self>, plan: &LaunchPlan) -> Result<(Outcome, Teardown), LaunchError> {
        let mut wall = None;
        let brokered = self.plan.broker.is_some();
        let claimed = warm::check_claim(
            plan,
            &self.shape,
            self.plan.uid,
            self.max_timeout,
            brokered,
            self.plan.image.as_ref().map(|i| i.identity.as_str()),
        )
        .map_err(|e| LaunchError::not_started(Reason::Environment, e))
        .and_then(|code| {
            wall = Some(self.wall()?);
            Ok(code)
        })
        .and_then(|code| {
            let path = self.container.run_dir.path().join("bin").join(self.main);
            std::fs::write(&path, code.as_bytes())
                .and_then(|()| {
                    use std::os::unix::fs::PermissionsExt as _;
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
                })
                .map_err(|e| {
                    LaunchError::environment(format!("cannot write {}: {e}", path.display()))
                })
        });
        if let Err(e) = claimed {
            return Err(e.after_cleanup(self.remove(false)));
        }
        let outside = self
            .watchdog
            .take()
            .ok_or_else(|| std::io::Error::other("the member has no watchdog"))
            .and_then(|w| w.start(plan.limits.timeout + crate::provider::WATCHDOG_GRACE));
        let outside = match outside {
            Ok(w) => w,
            Err(e) => {
                let e = LaunchError::environment(format!(
                    "cannot give the run's watchdog its deadline: {e}"
                ));
                return Err(e.after_cleanup(self.remove(false)));
            }
        };
        let OciMember {
            provider,
            plan: member_plan,
            container,
            cold,
            shape,
            ..
        } = *self;
        let Container {
            id,
            run_dir,
            mut created,
            input,
            namespaces,
            mut phases,
        } = container;
        created.set_output(plan.limits.output_bytes, plan.tap.clone());
        let started_unix_ms = unix_ms_now();
        let sent = input
            .ok_or_else(|| std::io::Error::other("the member has no input pipe"))
            .and_then(|mut input| input.write_all(GO));
        if let Err(e) = sent {
            drop(created);
            let e = LaunchError::may_have_run(format!("cannot hand the member its code: {e}"));
            return Err(e.after_cleanup(provider.clean(&member_plan, &id, run_dir, false)));
        }
        phases.mark(Phase::Claim);
        let followed = provider.follow_to_end(
            &member_plan,
            &id,
            created,
            plan.limits.timeout,
            plan.limits.output_bytes,
        );
        let ended_unix_ms = unix_ms_now();
        if let Some(at) = followed.exited_at {
            phases.mark_at(Phase::Exit, at);
        }
        phases.mark_at(Phase::Drain, followed.drained_at);
        let backstop = followed.backstop;
        let timed_out = followed.timed_out;
        let memory = followed.memory;
        let captured = match followed.captured {
            Ok(c) => c,
            Err(e) => {
                let e = LaunchError::may_have_run(format!("lost the container's output: {e}"));
                return Err(e.after_cleanup(provider.clean(&member_plan, &id, run_dir, backstop)));
            }
        };
        let (exit_code, signal) = status_of(&captured);
        let killed = signal == Some(libc::SIGKILL);
        let result = RunResult {
            exit_code,
            signal,
            timed_out,
            oom_killed: !timed_out && memory.oom_killed(plan.limits.memory_bytes, killed),
            stdout: Bytes(captured.stdout),
            stdout_truncated: captured.stdout_truncated,
            stderr: Bytes(captured.stderr),
            stderr_truncated: captured.stderr_truncated,
            wall,
            ..RunResult::default()
        };
        phases.mark(Phase::Memory);
        phases.answered();
        let kind = shape.language.as_str();
        let teardown = Teardown::new(move || {
            drop(namespaces);
            drop(outside);
            phases.mark(Phase::WatchdogEnd);
            let cleaned = provider.clean_timed(&member_plan, &id, run_dir, backstop, &mut phases);
            if cold {
                phases.log(provider.config().kind.name(), &member_plan.run_id, kind);
            }
            cleaned.map_err(Cause::from)
        });
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
        self.remove(false).map_err(Cause::from)
    }
}

#[cfg(test)]
mod tests {
    /// Only the exact ready line makes a member warm; anything else its process says first
    /// (output of its own, a truncated line) is refused, and the member is not pooled.
    #[test]
    fn only_the_ready_line_says_a_member_waits() {
        assert_eq!(super::is_ready_line(super::READY_LINE), Ok(()));
        for other in [
            &b"plimsoll-member: waiting"[..],
            b"plimsoll-member: waiting \n",
            b"1\n",
            b"",
        ] {
            let e = super::is_ready_line(other).unwrap_err();
            assert!(e.contains("not that it waits"), "{e}");
        }
    }
}
