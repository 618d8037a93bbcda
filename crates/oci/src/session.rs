//! Sessions at crun, runc and runsc: one container kept across calls, its process
//! `plimsoll-agent --session LANGUAGE`, created from the same bundle, limits, uid, mounts and
//! cgroups as a run's. The agent starts the interpreter and says it is ready; each call is
//! one JSON line on the container's standard input (a pipe this process holds), answered by
//! chunk lines and one answer line on its standard output. The wall is read before the
//! session is offered and again before every call: from the host's /proc at crun and runc,
//! said by the agent from inside at runsc (whose Sentry the host's /proc cannot see into).
//! The watchdog outside the daemon ends the container at its maximum lifetime even if the
//! daemon is killed; `reap()` removes what such a daemon left.

use std::io::Write as _;
use std::process::ChildStdin;
use std::time::{Duration, Instant};

use plimsoll_sandbox::{LaunchError, LaunchPlan, SessionSandbox};
use plimsoll_wire::{Language, OutputChunk, SESSION_READY_LINE, SessionAnswer, SessionCall, Wall};

use crate::provider::{Container, LaunchSpec, OciProvider};
use crate::runtime::{Begin, RuntimeKind};
use crate::spec::TOOLS_DIR;

/// The cap of the pipe buffer that holds the session agent's output: above any call's
/// [`SessionCall::line_max`] under the server's maximums. What one call may have buffered is
/// its own `line_max` (plus one pipe's worth read at once), never this.
const STREAM_CAP: usize = 1 << 40;

/// The longest ready line (`plimsoll-session: ready`) the host reads at open.
const READY_LINE_MAX: usize = 4096;

/// How long the agent may take to start its interpreter and say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// An open session's container.
#[derive(Debug)]
pub struct OciSession {
    provider: OciProvider,
    plan: LaunchPlan,
    container: Option<Container>,
    /// The agent's standard input: calls, and a cancel from another thread, never at once.
    input: Option<std::sync::Arc<std::sync::Mutex<std::process::ChildStdin>>>,
    wall: Wall,
    /// Its maximum lifetime's end.
    until: Instant,
    /// The watchdog outside the daemon, ending the container at the maximum lifetime.
    _watchdog: plimsoll_sandbox::watchdog::Watchdog,
}

/// What a session's container is started with: its plan (at runsc, the agent's dropping one)
/// and the agent's arguments.
fn launch_of(provider: &OciProvider, plan: &LaunchPlan) -> (LaunchPlan, Vec<String>, bool) {
    let language = match &plan.spec {
        plimsoll_wire::RunSpec::Snippet(s) => s.language,
        plimsoll_wire::RunSpec::Project(_) => Language::Python,
    };
    let inside = provider.config().kind == RuntimeKind::Runsc;
    let mut args = vec![format!("{TOOLS_DIR}/plimsoll-agent")];
    // At runsc the agent starts as uid 0 and drops to the run's uid first: its standard
    // input and output then stay uid 0's, out of reach of the code through gVisor's /proc,
    // which does not honour the not-dumpable flag (docs/sessions.md, "The agent's channel").
    // At crun and runc the Linux /proc of a process that is not dumpable is enough.
    let mut plan = plan.clone();
    if inside {
        plan.privileges = plimsoll_sandbox::Privileges::DropsToRunUid;
        args.extend(["--drop-to".into(), format!("{}:{}", plan.uid, plan.gid)]);
        args.push("--wall-first".into());
    }
    args.extend(["--session".into(), language.as_str().into()]);
    (plan, args, inside)
}

/// A session's container created (`run --detach`, or `restore` from a checkpoint's image)
/// with its input pipe and the watchdog outside the daemon; removed again on an error.
fn start(
    provider: &OciProvider,
    plan: &LaunchPlan,
    args: Vec<String>,
    lifetime: Duration,
    begin: Begin<'_>,
) -> Result<
    (
        Container,
        Option<ChildStdin>,
        plimsoll_sandbox::watchdog::Watchdog,
    ),
    LaunchError,
> {
    let launch = LaunchSpec {
        args,
        files: crate::provider::broker_files(plan),
        binds: vec![("plimsoll-agent".to_owned(), provider.config().agent.clone())],
        output_bytes: STREAM_CAP as u64,
        deadline: lifetime,
        env: crate::provider::broker_env(plan, true),
        handed_over: None,
        wall_inside: false,
    };
    let mut container = provider.create(plan, &launch, true, begin)?;
    let input = container.input.take();
    match provider.outside_watchdog(plan, lifetime) {
        Ok(w) => Ok((container, input, w)),
        Err(e) => Err(gone(provider, plan, container, e)),
    }
}

/// `e`, after everything of `container` is removed.
fn gone(
    provider: &OciProvider,
    plan: &LaunchPlan,
    container: Container,
    e: LaunchError,
) -> LaunchError {
    let Container {
        id,
        run_dir,
        created,
        ..
    } = container;
    drop(created);
    e.after_cleanup(provider.clean(plan, &id, run_dir, false))
}

/// Opens a session's container for `plan`, bounded by `lifetime`.
pub fn open(
    provider: &OciProvider,
    plan: &LaunchPlan,
    lifetime: Duration,
) -> Result<OciSession, LaunchError> {
    let (plan, args, inside) = launch_of(provider, plan);
    let plan = &plan;
    let (mut container, input, watchdog) = start(provider, plan, args, lifetime, Begin::Run)?;
    let said = if inside {
        provider.said_wall(&mut container.created, plan).map(Some)
    } else {
        Ok(None)
    };
    let ready = said.and_then(|said| {
        let line = container
            .created
            .first_line(Instant::now() + READY_WITHIN, READY_LINE_MAX)
            .map_err(|e| {
                LaunchError::environment(format!(
                    "the session's agent did not say it is ready: {e}"
                ))
            })?;
        if line != SESSION_READY_LINE {
            return Err(LaunchError::environment(format!(
                "the session's agent said {:?}, not that it is ready",
                String::from_utf8_lossy(&line)
            )));
        }
        match said {
            Some(wall) => Ok(wall),
            None => {
                let pid = container.created.pid().as_raw_nonzero().get() as u32;
                provider.checked_wall(pid, plan)
            }
        }
    });
    match ready {
        Ok(wall) => Ok(OciSession {
            provider: provider.clone(),
            plan: plan.clone(),
            container: Some(container),
            input: input.map(|i| std::sync::Arc::new(std::sync::Mutex::new(i))),
            wall,
            until: Instant::now() + lifetime,
            _watchdog: watchdog,
        }),
        Err(e) => {
            drop(input);
            // What the agent said before it ended, if it did.
            let said = container.created.said_on_stderr();
            let e = if said.is_empty() {
                e
            } else {
                LaunchError::environment(format!("{}{said}", e.message()))
            };
            Err(gone(provider, plan, container, e))
        }
    }
}

/// Why sessions at this runtime cannot be snapshotted (docs/sessions.md, "Snapshots and
/// forks"); `None` at runsc, where they can.
pub fn no_snapshots(kind: RuntimeKind) -> Option<&'static str> {
    match kind {
        RuntimeKind::Runsc => None,
        RuntimeKind::Runc => Some(
            "runc checkpoints through CRIU, and Debian 12's CRIU (3.17) cannot dump a process on this kernel (`vdso: Unexpected rt vDSO area bounds`: kernels from 6.13 split [vvar]; CRIU 4.1 reads it): open the session at runsc to snapshot it",
        ),
        RuntimeKind::Crun => Some(
            "Debian's crun is built without CRIU (`unknown command checkpoint`): open the session at runsc to snapshot it",
        ),
    }
}

/// Opens a session's container for `plan` from the checkpoint `image` (runsc only), bounded
/// by `lifetime`: the agent restored as it was, waiting for a call; its wall said again
/// from inside and judged for `plan`, whose uid must be the snapshot's.
pub fn restore(
    provider: &OciProvider,
    plan: &LaunchPlan,
    lifetime: Duration,
    image: &std::path::Path,
) -> Result<OciSession, LaunchError> {
    if let Some(why) = no_snapshots(provider.config().kind) {
        return Err(LaunchError::not_started(
            plimsoll_wire::Reason::Unsupported,
            why,
        ));
    }
    let (plan, args, _) = launch_of(provider, plan);
    let (container, input, watchdog) =
        start(provider, &plan, args, lifetime, Begin::Restore(image))?;
    let mut session = OciSession {
        provider: provider.clone(),
        plan,
        container: Some(container),
        input: input.map(|i| std::sync::Arc::new(std::sync::Mutex::new(i))),
        wall: Wall::default(),
        until: Instant::now() + lifetime,
        _watchdog: watchdog,
    };
    // The session is removed on drop if this fails.
    session.wall = session.wall_now()?;
    Ok(session)
}

impl OciSession {
    fn container(&mut self) -> Result<&mut Container, LaunchError> {
        self.container
            .as_mut()
            .ok_or_else(|| LaunchError::may_have_run("the session's container is gone"))
    }

    fn send(&mut self, call: &SessionCall) -> Result<(), LaunchError> {
        let mut line = serde_json::to_vec(call)
            .map_err(|e| LaunchError::may_have_run(format!("cannot encode the call: {e}")))?;
        line.push(b'\n');
        let input = self
            .input
            .as_ref()
            .ok_or_else(|| LaunchError::may_have_run("the session's input is closed"))?;
        let mut input = input.lock().unwrap_or_else(|p| p.into_inner());
        input
            .write_all(&line)
            .and_then(|()| input.flush())
            .map_err(|e| {
                LaunchError::may_have_run(format!("cannot hand the session's agent a call: {e}"))
            })
    }
}

impl SessionSandbox for OciSession {
    fn uid(&self) -> u32 {
        self.plan.uid
    }

    fn wall_at_open(&self) -> &Wall {
        &self.wall
    }

    fn wall_now(&mut self) -> Result<Wall, LaunchError> {
        if self.provider.config().kind == RuntimeKind::Runsc {
            let wall = plimsoll_sandbox::session::said_wall_now(self, READY_WITHIN)?;
            return self.provider.judged_wall(wall, &self.plan);
        }
        let pid = self.container()?.created.pid().as_raw_nonzero().get() as u32;
        self.provider.checked_wall(pid, &self.plan)
    }

    fn call(
        &mut self,
        call: &SessionCall,
        within: Duration,
        on_chunk: &mut dyn FnMut(OutputChunk),
    ) -> Result<SessionAnswer, LaunchError> {
        self.send(call)?;
        let until = Instant::now() + within;
        let line_max = call.line_max();
        let container = self.container()?;
        plimsoll_sandbox::session::read_answer(
            || {
                container
                    .created
                    .first_line(until, line_max)
                    .map_err(|e| format!("the session's agent did not answer: {e}"))
            },
            on_chunk,
        )
        .map_err(LaunchError::may_have_run)
    }

    fn canceller(&self) -> Option<plimsoll_sandbox::session::Canceller> {
        let input = std::sync::Arc::clone(self.input.as_ref()?);
        Some(Box::new(move || {
            let mut input = input.lock().unwrap_or_else(|p| p.into_inner());
            let _ = input
                .write_all(plimsoll_sandbox::session::CANCEL_LINE)
                .and_then(|()| input.flush());
        }))
    }

    fn checkpoint(&mut self, image: &std::path::Path, go_on: bool) -> Result<(), LaunchError> {
        let kind = self.provider.config().kind;
        if let Some(why) = no_snapshots(kind) {
            return Err(LaunchError::not_started(
                plimsoll_wire::Reason::Unsupported,
                why,
            ));
        }
        let id = self.container()?.id.clone();
        // Saved and stopped; a failure here leaves the container running as it was.
        self.provider
            .runtime()
            .checkpoint(&id, image)
            .map_err(|e| {
                LaunchError::environment(format!(
                    "cannot checkpoint the session's container: {}",
                    plimsoll_sandbox::error_chain(&e)
                ))
            })?;
        // The stopped container removed, then the same plan restored from the image: a
        // new container (same id, cgroups, uid) with new pipes and its own watchdog.
        self.remove().map_err(LaunchError::may_have_run)?;
        if !go_on {
            return Ok(());
        }
        let left = self.until.saturating_duration_since(Instant::now());
        let restored = restore(&self.provider, &self.plan, left, image).map_err(|e| {
            LaunchError::may_have_run(format!(
                "the session was checkpointed but could not be restored: {}",
                e.message()
            ))
        })?;
        *self = restored;
        Ok(())
    }

    fn alive(&mut self) -> bool {
        let Some(c) = self.container.as_ref() else {
            return false;
        };
        let pid = c.created.pid().as_raw_nonzero().get();
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                !s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(false)
    }

    fn close(mut self: Box<Self>) -> Result<(), plimsoll_sandbox::CloseSessionError> {
        self.remove()
            .map_err(|e| plimsoll_sandbox::CloseSessionError::Remove {
                run_id: self.plan.run_id.clone(),
                cause: e.into(),
            })
    }
}

impl OciSession {
    /// Closes its input (the agent reads end of file, ends its interpreter and exits), kills
    /// and reaps the container's process, and removes everything of it. Once.
    fn remove(&mut self) -> Result<(), String> {
        drop(self.input.take());
        let Some(Container {
            id,
            run_dir,
            created,
            ..
        }) = self.container.take()
        else {
            return Ok(());
        };
        drop(created);
        self.provider.clean(&self.plan, &id, run_dir, false)
    }
}

impl Drop for OciSession {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            tracing::error!(run_id = %self.plan.run_id, error = %e, "a session's container was not fully removed");
        }
    }
}
